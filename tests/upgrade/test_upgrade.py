"""Updates keep everything (docs/design.md, "Versions and upgrades").

- From the real 0.1.0 and the real 0.2.0 (each built from its release
  commit) on PostgreSQL 15: live leases keep their tokens, guard triggers
  keep working, the history is kept (or starts), privileges stay granted;
  the new library beside the old catalog refuses lease changes with 55000
  and a hint to update; a backend still running the old library fails
  cleanly after the update.
- On every major: the update scripts leave exactly the objects a fresh
  install creates, from 0.1.0 and from 0.2.0, and carry leases over (the
  old install scripts are frozen in sql/fenced_lock--0.1.0.sql and
  sql/fenced_lock--0.2.0.sql).
"""

import subprocess
import time

import psycopg
import pytest
from psycopg import sql

from upgradekit import CURRENT, MAJOR, REPO, ExtensionFiles

DB = "app"


def sqlstate_of(fn):
    try:
        fn()
    except psycopg.Error as e:
        return e.sqlstate, e.diag.message_hint or ""
    return None, ""


# Everything that makes up the extension's objects, as text, without OIDs.
CATALOG = """
WITH members AS (
  SELECT classid, objid FROM pg_depend
   WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
     AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'fenced_lock')
), rels AS (
  SELECT c.oid FROM pg_class c JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid
)
SELECT 'function ' || p.oid::regprocedure::text, pg_get_functiondef(p.oid) || ' acl=' || coalesce(p.proacl::text, '')
       || ' comment=' || coalesce(obj_description(p.oid, 'pg_proc'), '')
  FROM pg_proc p JOIN members m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
UNION ALL
SELECT 'relation ' || c.oid::regclass::text, c.relkind::text || ' opts=' || coalesce(array_to_string(c.reloptions, ','), '')
       || ' acl=' || coalesce(c.relacl::text, '') || ' comment=' || coalesce(obj_description(c.oid, 'pg_class'), '')
       || CASE WHEN c.relkind = 'v' THEN ' def=' || pg_get_viewdef(c.oid) ELSE '' END
  FROM pg_class c WHERE c.oid IN (SELECT oid FROM rels)
UNION ALL
SELECT 'column ' || a.attrelid::regclass::text || '.' || a.attname,
       format_type(a.atttypid, a.atttypmod) || ' notnull=' || a.attnotnull::text || ' num=' || a.attnum::text
       || ' default=' || coalesce(pg_get_expr(d.adbin, d.adrelid), '') || ' coll=' || coalesce(co.collname, '')
  FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
  LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 100
 WHERE a.attrelid IN (SELECT oid FROM rels) AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'index ' || i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
  FROM pg_index i WHERE i.indrelid IN (SELECT oid FROM rels)
UNION ALL
SELECT 'constraint ' || con.conrelid::regclass::text || '.' || con.conname, pg_get_constraintdef(con.oid)
  FROM pg_constraint con WHERE con.conrelid IN (SELECT oid FROM rels)
UNION ALL
SELECT 'schema ' || n.nspname, coalesce(n.nspacl::text, '') || ' comment=' || coalesce(obj_description(n.oid, 'pg_namespace'), '')
  FROM pg_namespace n JOIN members m ON m.classid = 'pg_namespace'::regclass AND m.objid = n.oid
UNION ALL
SELECT 'event trigger ' || e.evtname, e.evtevent || ' enabled=' || e.evtenabled::text || ' tags=' || coalesce(e.evttags::text, '')
       || ' function=' || e.evtfoid::regprocedure::text
  FROM pg_event_trigger e JOIN members m ON m.classid = 'pg_event_trigger'::regclass AND m.objid = e.oid
UNION ALL
SELECT 'extension', extversion || ' config=' || (SELECT string_agg(c::regclass::text, ',' ORDER BY c::regclass::text)
                                                   FROM unnest(extconfig) c)
  FROM pg_extension WHERE extname = 'fenced_lock'
ORDER BY 1
"""


def catalog(conn):
    return conn.execute(CATALOG).fetchall()


@pytest.mark.skipif(MAJOR != 15, reason="0.1.0 was released for PostgreSQL 15 only")
def test_update_from_the_real_0_1_0_keeps_leases_tokens_guards_history_and_grants(cluster, current_files):
    stage = "/tmp/fenced_lock_tests/stage-0.1.0"
    subprocess.run(["bash", str(REPO / "scripts/stage-release.sh"), "0.1.0", stage], check=True, timeout=900)
    old_files = ExtensionFiles.staged(stage)
    old_files.install()

    cluster.create_database(DB)  # CREATE EXTENSION: 0.1.0, the only version installed
    with cluster.connect(DB) as su:
        assert su.execute("SELECT extversion FROM pg_extension WHERE extname = 'fenced_lock'").fetchone()[0] == "0.1.0"
        su.execute("DROP ROLE IF EXISTS up_app")
        su.execute("CREATE ROLE up_app LOGIN")
        su.execute("GRANT EXECUTE ON FUNCTION fenced_lock_try_acquire(text, interval, text), "
                   "fenced_lock_acquire(text, interval, interval, text), fenced_lock_renew(text, bigint, interval), "
                   "fenced_lock_release(text, bigint), fenced_lock_validate(text, bigint), "
                   "fenced_lock_assert(text, bigint) TO up_app")
        su.execute("GRANT SELECT ON fenced_lock_leases TO up_app")
        su.execute("CREATE TABLE stock (item int PRIMARY KEY, qty int NOT NULL, fence_token bigint)")
        su.execute("CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock "
                   "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('stock:{item}')")
        su.execute("GRANT SELECT, INSERT, UPDATE ON stock TO up_app")

    app = psycopg.connect(cluster.dsn(DB, "up_app"), autocommit=True)
    live = app.execute("SELECT fenced_lock_try_acquire('stock:1', '1 hour', 'w1')").fetchone()[0]
    app.execute("INSERT INTO stock VALUES (1, 10, %s)", (live,))
    for _ in range(5):  # burnt tokens
        t = app.execute("SELECT fenced_lock_try_acquire('burn')").fetchone()[0]
        app.execute("SELECT fenced_lock_release('burn', %s)", (t,))
    app.execute("SELECT fenced_lock_try_acquire('stock:2', '1 millisecond')")  # left to expire
    with cluster.connect(DB) as su:
        max_issued = su.execute("SELECT last_value FROM fenced_lock_internal.token_seq").fetchone()[0]
        postmaster_started = su.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
    # `app` has loaded 0.1.0's library and keeps it: a backend the upgrade finds running.

    # The package is replaced; nobody has run the update yet.
    current_files.install()
    with cluster.connect(DB) as su:
        assert su.execute("SELECT fenced_lock_validate('stock:1', %s)", (live,)).fetchone()[0] is True
        su.execute("UPDATE stock SET qty = 9, fence_token = %s WHERE item = 1", (live,))
        assert sqlstate_of(lambda: su.execute("UPDATE stock SET fence_token = %s WHERE item = 1", (live - 1,)))[0] \
            == "FL001"
        state, hint = sqlstate_of(lambda: su.execute("SELECT fenced_lock_try_acquire('stock:3')"))
        assert state == "55000" and "ALTER EXTENSION fenced_lock UPDATE" in hint, (state, hint)
        state, hint = sqlstate_of(lambda: su.execute("SELECT fenced_lock_renew('stock:1', %s)", (live,)))
        assert state == "55000" and "ALTER EXTENSION fenced_lock UPDATE" in hint, (state, hint)

        su.execute("ALTER EXTENSION fenced_lock UPDATE")
        assert su.execute("SELECT extversion FROM pg_extension WHERE extname = 'fenced_lock'").fetchone()[0] == CURRENT
        rows = su.execute("SELECT name, token, holder, owner::text, live, session_bound FROM fenced_lock_leases "
                          "ORDER BY name").fetchall()
        assert ("stock:1", live, "w1", "up_app", True, False) in rows
        assert [r[0] for r in rows if not r[4]] == ["stock:2"], "the expired record stays, not live"
        history = su.execute("SELECT name, token, holder, owner::text, ended_by FROM fenced_lock_history "
                             "ORDER BY name").fetchall()
        assert ("stock:1", live, "w1", "up_app", None) in history

    # A new session of the application role: same privileges, same lease, same guard.
    with psycopg.connect(cluster.dsn(DB, "up_app"), autocommit=True) as app2:
        assert app2.execute("SELECT fenced_lock_renew('stock:1', %s, '2 hours')", (live,)).fetchone()[0] is True
        app2.execute("UPDATE stock SET qty = 8, fence_token = %s WHERE item = 1", (live,))
        assert sqlstate_of(lambda: app2.execute("UPDATE stock SET fence_token = %s WHERE item = 1",
                                                (live - 1,)))[0] == "FL001"
        new = app2.execute("SELECT fenced_lock_try_acquire('stock:9', session_bound => true)").fetchone()[0]
        assert new > max_issued, "tokens keep growing past everything 0.1.0 issued"
        assert app2.execute("SELECT fenced_lock_try_acquire('stock:2')").fetchone()[0] > new, "expired: taken over"
        assert app2.execute("SELECT qty FROM stock WHERE item = 1").fetchone()[0] == 8
    with cluster.connect(DB) as su:
        assert su.execute("SELECT ended_by FROM fenced_lock_history WHERE name = 'stock:2' "
                          "ORDER BY acquired_at LIMIT 1").fetchone()[0] == "expiry"

    # The backend still running 0.1.0's library fails cleanly: no crash, no restart.
    state, _ = sqlstate_of(lambda: app.execute("SELECT fenced_lock_try_acquire('stock:4')"))
    assert state == "55000", state
    assert app.execute("SELECT 1").fetchone()[0] == 1
    app.close()
    with cluster.connect(DB) as su:
        assert su.execute("SELECT pg_postmaster_start_time()").fetchone()[0] == postmaster_started
        # Updated and fresh: the same objects (privileges aside: the role granted above).
        su.execute("REVOKE ALL ON FUNCTION fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer), "
                   "fenced_lock_acquire(text, interval, interval, text, boolean, boolean, integer), "
                   "fenced_lock_renew(text, bigint, interval), fenced_lock_release(text, bigint), "
                   "fenced_lock_validate(text, bigint), fenced_lock_assert(text, bigint) FROM up_app")
        su.execute("REVOKE ALL ON fenced_lock_leases FROM up_app")
        updated = catalog(su)
    cluster.create_database("fresh")
    with cluster.connect("fresh") as su:
        assert catalog(su) == updated
    with cluster.connect(DB) as su:
        su.execute("DROP TABLE stock")
    cluster.sql("DROP DATABASE app")
    cluster.sql("DROP ROLE up_app")


@pytest.mark.skipif(MAJOR != 15, reason="the real release is built for PostgreSQL 15 (the catalog test covers every major)")
def test_update_from_the_real_0_2_0_keeps_leases_sessions_history_and_grants(cluster, current_files):
    stage = "/tmp/fenced_lock_tests/stage-0.2.0"
    subprocess.run(["bash", str(REPO / "scripts/stage-release.sh"), "0.2.0", stage], check=True, timeout=900)
    ExtensionFiles.staged(stage).install()

    cluster.create_database(DB)  # CREATE EXTENSION: 0.2.0, the only version installed
    with cluster.connect(DB) as su:
        assert su.execute("SELECT extversion FROM pg_extension WHERE extname = 'fenced_lock'").fetchone()[0] == "0.2.0"
        su.execute("DROP ROLE IF EXISTS up2_app")
        su.execute("CREATE ROLE up2_app LOGIN")
        su.execute("GRANT EXECUTE ON FUNCTION fenced_lock_try_acquire(text, interval, text, boolean), "
                   "fenced_lock_acquire(text, interval, interval, text, boolean), fenced_lock_renew(text, bigint, interval), "
                   "fenced_lock_release(text, bigint), fenced_lock_validate(text, bigint), "
                   "fenced_lock_assert(text, bigint) TO up2_app")
        su.execute("GRANT SELECT ON fenced_lock_leases, fenced_lock_history TO up2_app")
        su.execute("CREATE TABLE stock (item int PRIMARY KEY, qty int NOT NULL, fence_token bigint)")
        su.execute("CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock "
                   "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('stock:{item}')")
        su.execute("GRANT SELECT, INSERT, UPDATE ON stock TO up2_app")

    # `app` loads 0.2.0's library and keeps it: a backend the upgrade finds running.
    app = psycopg.connect(cluster.dsn(DB, "up2_app"), autocommit=True)
    live = app.execute("SELECT fenced_lock_try_acquire('stock:1', '1 hour', 'w1')").fetchone()[0]
    app.execute("INSERT INTO stock VALUES (1, 10, %s)", (live,))
    bound = app.execute("SELECT fenced_lock_try_acquire('bound:1', '1 hour', 'b1', true)").fetchone()[0]
    ended = app.execute("SELECT fenced_lock_try_acquire('hist:1', '1 hour', 'h1')").fetchone()[0]
    assert app.execute("SELECT fenced_lock_release('hist:1', %s)", (ended,)).fetchone()[0] is True
    app.execute("SELECT fenced_lock_try_acquire('stock:2', '1 millisecond')")  # left to expire
    with cluster.connect(DB) as su:
        max_issued = su.execute("SELECT last_value FROM fenced_lock_internal.token_seq").fetchone()[0]

    # The package is replaced; nobody has run the update yet.
    current_files.install()
    with cluster.connect(DB) as su:
        assert su.execute("SELECT fenced_lock_validate('stock:1', %s)", (live,)).fetchone()[0] is True
        su.execute("UPDATE stock SET qty = 9, fence_token = %s WHERE item = 1", (live,))
        assert sqlstate_of(lambda: su.execute("UPDATE stock SET fence_token = %s WHERE item = 1", (live - 1,)))[0] \
            == "FL001"
        state, hint = sqlstate_of(lambda: su.execute("SELECT fenced_lock_try_acquire('stock:3')"))
        assert state == "55000" and "ALTER EXTENSION fenced_lock UPDATE" in hint, (state, hint)

        su.execute("ALTER EXTENSION fenced_lock UPDATE")
        assert su.execute("SELECT extversion FROM pg_extension WHERE extname = 'fenced_lock'").fetchone()[0] == CURRENT
        rows = su.execute("SELECT name, token, holder, live, session_bound, mode, permits FROM fenced_lock_leases "
                          "ORDER BY name").fetchall()
        assert ("stock:1", live, "w1", True, False, "exclusive", 1) in rows
        assert ("bound:1", bound, "b1", True, True, "exclusive", 1) in rows, "the session is still there"
        assert [r[0] for r in rows if not r[3]] == ["stock:2"], "the expired record stays, not live"
        assert su.execute("SELECT ended_by, mode, permits FROM fenced_lock_history WHERE token = %s",
                          (ended,)).fetchone() == ("release", "exclusive", 1)

    with psycopg.connect(cluster.dsn(DB, "up2_app"), autocommit=True) as app2:
        # The same privileges (on the new signatures), the same leases, the same guard.
        assert app2.execute("SELECT fenced_lock_renew('stock:1', %s, '2 hours')", (live,)).fetchone()[0] is True
        app2.execute("UPDATE stock SET qty = 8, fence_token = %s WHERE item = 1", (live,))
        assert sqlstate_of(lambda: app2.execute("UPDATE stock SET fence_token = %s WHERE item = 1",
                                                (live - 1,)))[0] == "FL001"
        assert app2.execute("SELECT fenced_lock_try_acquire('bound:1', '1 hour', 'b1', true)").fetchone()[0] is None, \
            "0.2.0's session-bound lease is still bound to its session"
        new = app2.execute("SELECT fenced_lock_try_acquire('stock:9', shared => true)").fetchone()[0]
        assert new > max_issued, "tokens keep growing past everything 0.2.0 issued"
        assert app2.execute("SELECT fenced_lock_try_acquire('stock:2')").fetchone()[0] > new, "expired: taken over"

        # The backend still running 0.2.0's library fails cleanly: no crash.
        state, _ = sqlstate_of(lambda: app.execute("SELECT fenced_lock_try_acquire('stock:4')"))
        assert state == "55000", state
        assert app.execute("SELECT 1").fetchone()[0] == 1
        # Its session ends: its session-bound lease ends with it.
        app.close()
        deadline = time.monotonic() + 10
        taken = None
        while taken is None and time.monotonic() < deadline:
            taken = app2.execute("SELECT fenced_lock_try_acquire('bound:1', '1 hour', 'b2')").fetchone()[0]
            time.sleep(0.05)
        assert taken is not None and taken > bound, "the lease ended with the session that held it"
    with cluster.connect(DB) as su:
        assert su.execute("SELECT ended_by FROM fenced_lock_history WHERE token = %s", (bound,)).fetchone()[0] \
            == "session_end"
        assert su.execute("SELECT qty FROM stock WHERE item = 1").fetchone()[0] == 8
        su.execute("REVOKE ALL ON FUNCTION fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer), "
                   "fenced_lock_acquire(text, interval, interval, text, boolean, boolean, integer), "
                   "fenced_lock_renew(text, bigint, interval), fenced_lock_release(text, bigint), "
                   "fenced_lock_validate(text, bigint), fenced_lock_assert(text, bigint) FROM up2_app")
        su.execute("REVOKE ALL ON fenced_lock_leases, fenced_lock_history FROM up2_app")
        su.execute("DROP TABLE stock")
        updated = catalog(su)
    cluster.create_database("fresh")
    with cluster.connect("fresh") as su:
        assert catalog(su) == updated
    cluster.sql("DROP DATABASE app")
    cluster.sql("DROP ROLE up2_app")


# How each old version's catalog holds a lease, written as that version wrote it.
OLD_LEASE = {
    "0.1.0": "INSERT INTO fenced_lock_internal.leases VALUES "
             "('job:1', 41, 'w1', 'postgres', clock_timestamp(), clock_timestamp() + interval '1 hour', '1 hour')",
    "0.2.0": "INSERT INTO fenced_lock_internal.lease_records VALUES "
             "('job:1', 41, 'w1', 'postgres', clock_timestamp(), clock_timestamp() + interval '1 hour', '1 hour', false)",
}


@pytest.mark.parametrize("old", ["0.1.0", "0.2.0"])
def test_catalog_after_update_is_the_catalog_of_a_fresh_install_and_keeps_a_lease(cluster, current_files, old):
    """On every major: an old version's frozen install script, a lease
    written as that version wrote it, the update, then the same objects as
    a fresh install of this version."""
    current_files.install(extra_scripts=[REPO / f"sql/fenced_lock--{old}.sql"])
    cluster.create_database("updated", extension=False)
    with cluster.connect("updated") as su:
        su.execute(f"CREATE EXTENSION fenced_lock VERSION '{old}'")
        su.execute("SELECT setval('fenced_lock_internal.token_seq', 41)")
        su.execute(OLD_LEASE[old])
        # The new library reads the old catalog (the guard's check and validate)...
        assert su.execute("SELECT fenced_lock_validate('job:1', 41)").fetchone()[0] is True
        su.execute("BEGIN")
        su.execute("SELECT fenced_lock_assert('job:1', 41)")
        su.execute("ROLLBACK")
        # ...and refuses to change it.
        state, hint = sqlstate_of(lambda: su.execute("SELECT fenced_lock_try_acquire('job:2')"))
        assert state == "55000" and "ALTER EXTENSION fenced_lock UPDATE" in hint
        su.execute("ALTER EXTENSION fenced_lock UPDATE")
        assert su.execute("SELECT extversion FROM pg_extension WHERE extname = 'fenced_lock'").fetchone()[0] == CURRENT
        assert su.execute("SELECT token, holder, live, mode, permits FROM fenced_lock_leases WHERE name = 'job:1'"
                          ).fetchone() == (41, "w1", True, "exclusive", 1)
        assert su.execute("SELECT fenced_lock_renew('job:1', 41)").fetchone()[0] is True
        assert su.execute("SELECT fenced_lock_try_acquire('job:2')").fetchone()[0] == 42
        assert su.execute("SELECT count(*) FROM fenced_lock_history WHERE name = 'job:1' AND ended_at IS NULL"
                          ).fetchone()[0] == 1
        assert su.execute("SELECT fenced_lock_release('job:1', 41)").fetchone()[0] is True
        assert su.execute("SELECT ended_by, mode FROM fenced_lock_history WHERE token = 41").fetchone() \
            == ("release", "exclusive")
        su.execute("DELETE FROM fenced_lock_internal.granted_leases")
        su.execute("DELETE FROM fenced_lock_internal.lease_history")
        updated = catalog(su)
    cluster.create_database("fresh")
    with cluster.connect("fresh") as su:
        fresh = catalog(su)
    assert len(fresh) > 40
    for a, b in zip(fresh, updated):
        assert a == b, f"fresh install and update differ:\n  fresh:   {a}\n  updated: {b}"
    assert fresh == updated
