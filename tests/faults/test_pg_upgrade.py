"""Guarantee (docs/design.md, "Versions and upgrades", "Tokens"): leases survive
pg_upgrade. A cluster with live leases, an expired one, burnt tokens and a
guarded table is upgraded with pg_upgrade into a freshly initialised cluster
(15 to 15: the only PostgreSQL here, and the same code path as a major upgrade
for user data and sequences). There the lease records are the same, the live
token is accepted by the guard and a stale one is rejected with FL001, and the
next token exceeds every token the old cluster handed out."""

import subprocess

import pytest

from faultkit import UPGRADE_NEW_PORT, UPGRADE_OLD_PORT, connect, sqlstate_of
from harness.cluster import BIN, as_postgres

DB = "upgraded"


def lease_rows(conn):
    return conn.execute("SELECT name, token, holder, owner::text, acquired_at, expires_at, ttl "
                        "FROM fenced_lock_internal.granted_leases ORDER BY name").fetchall()


@pytest.mark.budget(180)
def test_pg_upgrade_keeps_leases_and_token_growth(clusters):
    old = clusters.new("f_upgrade_old", UPGRADE_OLD_PORT)
    old.create_database(DB)
    with connect(old, DB) as c:
        c.execute("CREATE TABLE stock (item int PRIMARY KEY, qty int, fence_token bigint)")
        c.execute("CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock "
                  "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('stock:{item}')")
        live = c.execute("SELECT fenced_lock_try_acquire('stock:1', '1 hour', 'worker-1')").fetchone()[0]
        c.execute("INSERT INTO stock VALUES (1, 10, %s)", (live,))
        c.execute("SELECT fenced_lock_try_acquire('stock:2', '1 millisecond')")  # left to expire
        for _ in range(40):  # burnt tokens: granted and released
            t = c.execute("SELECT fenced_lock_try_acquire('burn')").fetchone()[0]
            c.execute("SELECT fenced_lock_release('burn', %s)", (t,))
        max_issued = c.execute("SELECT last_value FROM fenced_lock_internal.token_seq").fetchone()[0]
        before = lease_rows(c)
    assert [r[0] for r in before] == ["stock:1", "stock:2"]
    old.stop()

    new = clusters.new("f_upgrade_new", UPGRADE_NEW_PORT, start=False)
    # pg_upgrade writes its logs into the current directory: give it one of its own.
    as_postgres([BIN / "pg_upgrade", "-b", BIN, "-B", BIN, "-d", old.data, "-D", new.data,
                 "-p", str(UPGRADE_OLD_PORT), "-P", str(UPGRADE_NEW_PORT), "-U", "postgres"],
                cwd=new.dir, stdout=subprocess.DEVNULL, timeout=150)
    new.start()

    with connect(new, DB) as c:
        assert lease_rows(c) == before
        assert c.execute("SELECT fenced_lock_validate('stock:1', %s)", (live,)).fetchone()[0] is True
        c.execute("UPDATE stock SET qty = 9, fence_token = %s WHERE item = 1", (live,))
        assert sqlstate_of(c.execute, "UPDATE stock SET qty = 8, fence_token = %s WHERE item = 1",
                           (live - 1,)) == "FL001"
        assert c.execute("SELECT qty FROM stock WHERE item = 1").fetchone()[0] == 9
        taken_over = c.execute("SELECT fenced_lock_try_acquire('stock:2', '1 minute')").fetchone()[0]
        fresh = c.execute("SELECT fenced_lock_try_acquire('after-upgrade')").fetchone()[0]
    assert taken_over > max_issued and fresh > taken_over
