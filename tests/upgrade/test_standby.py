"""On every major, a lease change sent to a hot standby fails with 25006 and
a clear message, while reads keep working (docs/reference.md, "SQLSTATEs";
docs/operations.md, "Replication and failover").

The standby is the primary's own data directory restarted in recovery
(`standby.signal`, no primary to follow): a hot standby with the primary's
lease state, which needs no client tool the smallest server builds lack.
"""

import psycopg

from harness.cluster import Cluster, as_postgres


def test_standby_refuses_lease_changes_with_25006_and_answers_reads(request):
    c = Cluster("up_standby", 5571, {"hot_standby": "on"}).init()
    c.start()
    try:
        c.create_database("app")
        with c.connect("app") as db:
            token = db.execute("SELECT fenced_lock_try_acquire('job:1', '1 hour', 'w1')").fetchone()[0]
            expired = db.execute("SELECT fenced_lock_try_acquire('job:2', '1 millisecond')").fetchone()[0]
        c.stop()
        as_postgres(["touch", str(c.data / "standby.signal")])
        c.start()
        with c.connect("app") as db:
            assert db.execute("SELECT pg_is_in_recovery()").fetchone()[0] is True
            assert db.execute("SELECT fenced_lock_validate('job:1', %s)", (token,)).fetchone()[0] is True
            assert db.execute("SELECT token, holder, live FROM fenced_lock_leases WHERE name = 'job:1'").fetchone() \
                == (token, "w1", True)
            changes = [
                ("fenced_lock_try_acquire", "SELECT fenced_lock_try_acquire('job:3')"),
                ("fenced_lock_try_acquire", "SELECT fenced_lock_try_acquire('job:2')"),
                ("fenced_lock_acquire", "SELECT fenced_lock_acquire('job:3', wait => '1 s')"),
                ("fenced_lock_renew", f"SELECT fenced_lock_renew('job:1', {token})"),
                ("fenced_lock_release", f"SELECT fenced_lock_release('job:1', {token})"),
                ("fenced_lock_release", f"SELECT fenced_lock_release('job:2', {expired})"),
                ("fenced_lock_force_release", "SELECT fenced_lock_force_release('job:1')"),
            ]
            for function, query in changes:
                try:
                    db.execute(query)
                    raise AssertionError(f"{query} succeeded on a standby")
                except psycopg.Error as e:
                    assert e.sqlstate == "25006", (query, e.sqlstate, str(e))
                    assert f"{function}: cannot change a lease on a standby server" in str(e), str(e)
                    assert "target_session_attrs=read-write" in (e.diag.message_hint or "")
            # the session and the server carry on
            assert db.execute("SELECT fenced_lock_validate('job:1', %s)", (token,)).fetchone()[0] is True
    finally:
        c.stop(mode="immediate", check=False)
