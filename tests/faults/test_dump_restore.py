"""Guarantee (docs/design.md, "Versions and upgrades", "Tokens"): leases survive
pg_dump / restore. A database with live leases (and an expired one), a
released lease and guarded tables is dumped and restored into a new database
of the same cluster (custom format, pg_restore) and into a freshly initialised
cluster (plain format, psql). There: the lease records are the same (name,
token, holder, owner, expires_at); the guard works (the live token is
accepted, a stale one is rejected with FL001); the owner can still renew; and
the next token exceeds every token the source database ever handed out."""

import subprocess
import time

import pytest

from faultkit import RESTORE_PORT, connect, sqlstate_of
from harness.cluster import BIN

APP = "fl_dump_app"

SCHEMA = """
CREATE TABLE orders (id int PRIMARY KEY, qty int NOT NULL, fence_token bigint);
INSERT INTO orders SELECT i, 0, NULL FROM generate_series(1, 4) i;
CREATE TRIGGER orders_fence BEFORE INSERT OR UPDATE OR DELETE ON orders
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('order:{id}');
CREATE TABLE settings (k text PRIMARY KEY, v text, fence_token bigint);
INSERT INTO settings VALUES ('mode', 'initial', NULL);
CREATE TRIGGER settings_fence BEFORE INSERT OR UPDATE OR DELETE ON settings
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('settings', 'fence_token');
"""

GRANTS = f"""
GRANT EXECUTE ON FUNCTION fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer), fenced_lock_renew(text, bigint, interval),
  fenced_lock_release(text, bigint), fenced_lock_validate(text, bigint) TO {APP};
GRANT SELECT ON fenced_lock_leases TO {APP};
GRANT SELECT, INSERT, UPDATE ON orders, settings TO {APP};
"""


def create_role(conn):
    conn.execute(f"DO $$ BEGIN CREATE ROLE {APP} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")


def lease_rows(conn):
    return conn.execute("SELECT name, token, holder, owner::text, acquired_at, expires_at "
                        "FROM fenced_lock_internal.granted_leases ORDER BY name").fetchall()


def update_order(conn, item, token):
    conn.execute("UPDATE orders SET qty = qty + 1, fence_token = %s WHERE id = %s", (token, item))


def run(args):
    subprocess.run([str(a) for a in args], check=True, timeout=60, capture_output=True)


def check_restored(conn, source_rows, live, stale, max_issued):
    assert lease_rows(conn) == source_rows
    assert conn.execute("SELECT name, live FROM fenced_lock_leases ORDER BY name").fetchall() == \
        [(r[0], r[0] != "expired:1") for r in source_rows]
    conn.execute(f"SET ROLE {APP}")
    try:
        # The guard is there and works: live tokens write, stale ones do not.
        update_order(conn, 1, live["order:1"])
        conn.execute("UPDATE settings SET v = 'restored', fence_token = %s WHERE k = 'mode'", (live["settings"],))
        assert sqlstate_of(update_order, conn, 3, stale) == "FL001"
        assert sqlstate_of(update_order, conn, 2, live["order:1"]) == "FL001"
        assert sqlstate_of(update_order, conn, 4, live["expired:1"]) == "FL001"
        assert conn.execute("SELECT qty, fence_token FROM orders WHERE id = 1").fetchone() == (2, live["order:1"])
        assert conn.execute("SELECT qty, fence_token FROM orders WHERE id = 3").fetchone() == (1, stale)
        # The owner role still owns its leases.
        assert conn.execute("SELECT fenced_lock_renew('order:1', %s)", (live["order:1"],)).fetchone()[0] is True
        # Tokens keep growing past everything the source handed out.
        new = conn.execute("SELECT fenced_lock_try_acquire('after-restore', '1 minute')").fetchone()[0]
        assert new > max_issued
        assert conn.execute("SELECT fenced_lock_try_acquire('order:2', '1 minute')").fetchone()[0] is None
    finally:
        conn.execute("RESET ROLE")


@pytest.mark.budget(120)
def test_dump_restore_keeps_leases_and_token_growth(main_cluster, fresh_db, clusters, tmp_path):
    with connect(main_cluster, fresh_db) as db:
        create_role(db)
        db.execute(SCHEMA)
        db.execute(GRANTS)
        db.execute(f"SET ROLE {APP}")
        acquire = "SELECT fenced_lock_try_acquire(%s, %s::interval, %s)"
        live = {}
        live["order:1"] = db.execute(acquire, ("order:1", "1 hour", "worker-1")).fetchone()[0]
        live["order:2"] = db.execute(acquire, ("order:2", "1 hour", None)).fetchone()[0]
        live["settings"] = db.execute(acquire, ("settings", "2 hours", "admin")).fetchone()[0]
        live["expired:1"] = db.execute(acquire, ("expired:1", "1 second", "gone")).fetchone()[0]
        update_order(db, 1, live["order:1"])
        update_order(db, 2, live["order:2"])
        db.execute("UPDATE settings SET v = 'x', fence_token = %s WHERE k = 'mode'", (live["settings"],))
        # A lease that was released: its token is stale from now on.
        stale = db.execute(acquire, ("order:3", "1 hour", "worker-3")).fetchone()[0]
        update_order(db, 3, stale)
        assert db.execute("SELECT fenced_lock_release('order:3', %s)", (stale,)).fetchone()[0] is True
        # Burn tokens, so that the sequence is well ahead of the tokens in the rows.
        for i in range(40):
            t = db.execute(acquire, (f"burn:{i}", "1 minute", None)).fetchone()[0]
            assert db.execute("SELECT fenced_lock_release(%s, %s)", (f"burn:{i}", t)).fetchone()[0] is True
        max_issued = t
        db.execute("RESET ROLE")
        time.sleep(1.1)  # expired:1 is now an expired record, which must travel as it is
        assert db.execute("SELECT fenced_lock_validate('expired:1', %s)", (live["expired:1"],)).fetchone()[0] is False
        source_rows = lease_rows(db)
        assert [r[0] for r in source_rows] == ["expired:1", "order:1", "order:2", "settings"]

    custom, plain = tmp_path / "dump.custom", tmp_path / "dump.sql"
    base = ["-h", "127.0.0.1", "-p", main_cluster.port, "-U", "postgres"]
    run([BIN / "pg_dump", *base, "-Fc", "-f", custom, fresh_db])
    run([BIN / "pg_dump", *base, "-Fp", "-f", plain, fresh_db])

    # 1. pg_restore into a new database of the same cluster.
    restored = main_cluster.create_database(fresh_db + "_restored", extension=False)
    run([BIN / "pg_restore", *base, "--exit-on-error", "-d", restored, custom])
    with connect(main_cluster, restored) as db:
        check_restored(db, source_rows, live, stale, max_issued)

    # 2. psql into a freshly initialised cluster (roles are not in a database dump).
    fresh = clusters.new("f_restore", RESTORE_PORT)
    with connect(fresh) as db:
        create_role(db)
    fresh.create_database("restored", extension=False)
    subprocess.run([BIN / "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(fresh.port),
                    "-U", "postgres", "-d", "restored", "-f", str(plain)],
                   check=True, timeout=60, capture_output=True)
    with connect(fresh, "restored") as db:
        check_restored(db, source_rows, live, stale, max_issued)
