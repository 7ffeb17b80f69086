"""docs/reference.md, "Leader election" and the `pid` column of
fenced_lock_leases:

- examples/leader_election.py, one leader and two followers, each a process
  of its own: the leader is killed with kill -9; a follower leads within a
  second (printed; asserted with a generous bound), the other follower
  learns the new leader and the value it proclaimed, and a late guarded
  write with the old leader's token is refused (FL001). A follower whose
  connection is cut reads the leader again when it reconnects, and so learns
  what it missed while it was not listening.
- fenced_lock_proclaim returns false for a stale token, for a lease that is
  not exclusive and for a role that does not act for the owner; a proclaim
  rolled back sends no NOTIFY (a committed one sends one, a repeated value
  none).
- fenced_lock_leader: no row without a live exclusive lease; a role with
  nothing but EXECUTE on it sees the holder, token and value.
- pid: a live session-bound lease's backend, which joins pg_stat_activity;
  NULL for roles that may not see the lease, and for a lease that is not
  session-bound.
"""

import signal
import time

import pytest
from psycopg import sql

from it_support import elapsed_ms, wait_until
from modes_support import (
    Example,
    Listener,
    grant_new_functions,
    history_of,
    lease_state,
    one,
    run_example,
    sqlstate,
)

TAKEOVER_BOUND_S = 3.0  # the promise is "within a second"; it takes milliseconds


@pytest.fixture(scope="module")
def app(cluster, db):
    run_example("leader_election.py", "--dsn", cluster.dsn(db), "--setup")
    cluster.sql(f'ALTER DATABASE "{db}" SET fenced_lock.notify = on')
    return db


@pytest.fixture
def mon(cluster, app):
    with cluster.connect(app) as conn:
        yield conn


@pytest.fixture
def nodes():
    started = []

    def start(cluster, app, election, node, *extra):
        e = Example("leader_election.py", "--dsn", cluster.dsn(app), "--election", election, "--node", node,
                    "--address", f"{node}.example:5432", "--ttl", "6", "--campaign-wait", "5", "--beat", "0.2",
                    *extra)
        started.append(e)
        return e

    yield start
    for e in started:
        e.close()


def leader_of(mon, election):
    return mon.execute("SELECT holder, token, value FROM fenced_lock_leader(%s)", (election,)).fetchone()


@pytest.mark.budget(90)
def test_leader_killed_with_sigkill_a_follower_leads_within_a_second_and_the_other_learns_it(
        cluster, app, mon, nodes):
    election = "billing:leader"
    leader = nodes(cluster, app, election, "node-0")
    old = leader.event("elected", 15)["token"]
    leader.event("proclaimed", 5, value="node-0.example:5432")
    followers = [nodes(cluster, app, election, f"node-{i}") for i in (1, 2)]
    for f in followers:
        f.event("leader", 15, why="read", holder="node-0", token=old, value="node-0.example:5432")
    # both followers campaign (wait in line) while they follow
    wait_until(lambda: one(mon, "SELECT count(*) FROM fenced_lock_waiters WHERE name = %s", (election,)) == 2, 15,
               what="both followers to campaign")
    wait_until(lambda: mon.execute("SELECT node, fence_token FROM leader_heartbeat WHERE election = %s",
                                   (election,)).fetchone() == ("node-0", old), 10, what="the leader's heartbeat")

    killed = leader.kill(signal.SIGKILL)
    elected = {}
    deadline = time.monotonic() + TAKEOVER_BOUND_S + 10
    while not elected:
        assert time.monotonic() < deadline, "no follower was elected"
        for f in followers:
            try:
                elected[f] = f.event("elected", 0.05)
            except AssertionError:
                pass
    (new, msg), = elected.items()
    other = next(f for f in followers if f is not new)
    name_new = new.argv[new.argv.index("--node") + 1]
    takeover = elapsed_ms(killed, msg["t"])
    print(f"leader killed with SIGKILL: {name_new} led {takeover:.1f} ms later")
    assert takeover < TAKEOVER_BOUND_S * 1000
    assert msg["token"] > old
    new.event("proclaimed", 5, token=msg["token"], value=f"{name_new}.example:5432")
    learned = other.event("leader", 10, holder=name_new, token=msg["token"], value=f"{name_new}.example:5432")
    print(f"the other follower knew the new leader and its address {elapsed_ms(killed, learned['t']):.1f} ms "
          "after the kill")
    assert leader_of(mon, election) == (name_new, msg["token"], f"{name_new}.example:5432")
    assert [r["ended_by"] for r in history_of(mon, [election]) if r["token"] == old] == ["session_end"]
    # the new leader writes with its token; the old one's late write is refused, the row unchanged
    wait_until(lambda: mon.execute("SELECT node, fence_token FROM leader_heartbeat WHERE election = %s",
                                   (election,)).fetchone() == (name_new, msg["token"]), 10,
               what="the new leader's heartbeat")
    mon.execute("BEGIN")
    mon.execute("LOCK TABLE leader_heartbeat IN SHARE MODE")  # no heartbeat moves the row meanwhile
    before = mon.execute("SELECT * FROM leader_heartbeat").fetchall()
    mon.execute("SAVEPOINT late")
    code = sqlstate(mon, "UPDATE leader_heartbeat SET node = 'node-0', fence_token = %s WHERE election = %s",
                    (old, election))
    mon.execute("ROLLBACK TO SAVEPOINT late")
    after = mon.execute("SELECT * FROM leader_heartbeat").fetchall()
    mon.execute("COMMIT")
    assert code == "FL001"
    assert after == before
    with cluster.connect(app) as late:
        assert sqlstate(late, "INSERT INTO leader_heartbeat VALUES (%s, 'node-0', 'x', 1, %s) ON CONFLICT (election) "
                              "DO UPDATE SET node = EXCLUDED.node, fence_token = EXCLUDED.fence_token",
                        (election, old)) == "FL001"
        assert one(late, "SELECT fenced_lock_proclaim(%s, %s, 'node-0 is back')", (election, old)) is False
    assert leader_of(mon, election)[2] == f"{name_new}.example:5432"
    assert one(mon, "SELECT count(*) FROM fenced_lock_waiters WHERE name = %s", (election,)) == 1  # other campaigns


def test_a_follower_reads_the_leader_again_after_a_reconnect(cluster, app, mon, nodes):
    """The follower's connection is cut (pg_terminate_backend); while it is
    away the leader proclaims a new value, whose NOTIFY it cannot receive; it
    reconnects, listens, reads, and knows the new value."""
    election = "reconnect:leader"
    leader = nodes(cluster, app, election, "node-a")
    token = leader.event("elected", 15)["token"]
    leader.event("proclaimed", 5)
    follower = nodes(cluster, app, election, "node-b", "--reconnect-delay", "1.5")
    pid = follower.event("following", 15)["backend_pid"]
    follower.event("leader", 10, why="read", holder="node-a", value="node-a.example:5432")
    assert one(mon, "SELECT pg_terminate_backend(%s)", (pid,)) is True
    follower.event("disconnected", 10, connection="follow")
    assert one(mon, "SELECT fenced_lock_proclaim(%s, %s, 'node-a moved')", (election, token)) is True
    again = follower.event("following", 10)
    assert again["backend_pid"] != pid
    msg = follower.event("leader", 10, why="reconnect")
    assert (msg["holder"], msg["token"], msg["value"]) == ("node-a", token, "node-a moved")
    assert msg["t"] > again["t"]
    # it learned the value by reading: the notification was sent while it was away
    assert [m for m in follower.seen if m["event"] == "leader" and m["why"] == "notify"] == []


# -- proclaim ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def roles(cluster, db, execute_only_role):
    owner, member, stranger = (execute_only_role() for _ in range(3))
    leader_only = execute_only_role(functions=["fenced_lock_leader(text)"], view=False)
    with cluster.connect(db) as su:
        grant_new_functions(su, owner, member, stranger)
        su.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(owner), sql.Identifier(member)))
    return dict(owner=owner, member=member, stranger=stranger, leader_only=leader_only)


def test_proclaim_returns_false_for_a_stale_token_another_mode_or_a_role_that_does_not_act_for_the_owner(
        cluster, app, mon, roles):
    name = "proclaim:rules"
    with cluster.connect(app, user=roles["owner"]) as a, cluster.connect(app, user=roles["stranger"]) as b, \
            cluster.connect(app, user=roles["member"]) as m:
        stale = one(a, "SELECT fenced_lock_try_acquire(%s, '1 min', 'a')", (name,))
        assert one(a, "SELECT fenced_lock_release(%s, %s)", (name, stale)) is True
        t = one(a, "SELECT fenced_lock_try_acquire(%s, '1 min', 'a')", (name,))
        assert one(a, "SELECT fenced_lock_proclaim(%s, %s, 'first')", (name, t)) is True
        state = lease_state(mon, [name])
        assert one(a, "SELECT fenced_lock_proclaim(%s, %s, 'stale')", (name, stale)) is False
        assert one(a, "SELECT fenced_lock_proclaim(%s, %s, 'never issued')", (name, t + 1000)) is False
        assert one(b, "SELECT fenced_lock_proclaim(%s, %s, 'not mine')", (name, t)) is False
        assert one(a, "SELECT fenced_lock_proclaim(%s, %s, 'other name')", (name + ":other", t)) is False
        assert lease_state(mon, [name]) == state
        assert leader_of(mon, name) == ("a", t, "first")
        assert one(m, "SELECT fenced_lock_proclaim(%s, %s, 'by a member')", (name, t)) is True
        assert leader_of(mon, name) == ("a", t, "by a member")
        # only an exclusive lease leads
        for kw, n in (("shared => true", name + ":shared"), ("permits => 2", name + ":permit")):
            x = one(a, f"SELECT fenced_lock_try_acquire(%s, '1 min', 'a', {kw})", (n,))
            assert one(a, "SELECT fenced_lock_proclaim(%s, %s, 'v')", (n, x)) is False
            assert leader_of(mon, n) is None
            assert one(a, "SELECT fenced_lock_release(%s, %s)", (n, x)) is True
        # an expired lease is stale too
        e = one(a, "SELECT fenced_lock_try_acquire(%s, '200 ms', 'a')", (name + ":exp",))
        wait_until(lambda: not one(mon, "SELECT live FROM fenced_lock_leases WHERE token = %s", (e,)), 5,
                   interval=0.02, what="the lease to expire")
        assert one(a, "SELECT fenced_lock_proclaim(%s, %s, 'late')", (name + ":exp", e)) is False
        assert one(a, "SELECT fenced_lock_release(%s, %s)", (name, t)) is True


def test_a_proclaim_rolled_back_sends_no_notify(cluster, app, mon):
    name = "proclaim:notify"
    with cluster.connect(app) as lc, cluster.connect(app) as a:
        listener = Listener(lc)
        t = one(a, "SELECT fenced_lock_try_acquire(%s, '1 min', 'a')", (name,))
        listener.until_marker(mon)
        a.execute("BEGIN")
        assert one(a, "SELECT fenced_lock_proclaim(%s, %s, 'rolled back')", (name, t)) is True
        a.execute("ROLLBACK")
        a.execute("BEGIN")
        a.execute("SAVEPOINT s")
        assert one(a, "SELECT fenced_lock_proclaim(%s, %s, 'rolled back to a savepoint')", (name, t)) is True
        a.execute("ROLLBACK TO SAVEPOINT s")
        a.execute("COMMIT")
        assert listener.until_marker(mon) == []
        assert leader_of(mon, name) == ("a", t, None)
        # control: a committed proclaim sends exactly one; the same value again sends none
        assert one(a, "SELECT fenced_lock_proclaim(%s, %s, 'v1')", (name, t)) is True
        assert one(a, "SELECT fenced_lock_proclaim(%s, %s, 'v1')", (name, t)) is True
        assert listener.until_marker(mon) == [{"name": name, "event": "proclaim", "token": t, "mode": "exclusive"}]
        assert leader_of(mon, name) == ("a", t, "v1")
        assert one(a, "SELECT fenced_lock_release(%s, %s)", (name, t)) is True


# -- fenced_lock_leader -----------------------------------------------------------------------


def test_leader_returns_no_row_for_a_name_without_a_live_exclusive_lease(cluster, app, mon):
    base = "leader:none"
    with cluster.connect(app) as a:
        assert leader_of(mon, base + ":never") is None
        t = one(a, "SELECT fenced_lock_try_acquire(%s, '1 min', 'h')", (base + ":released",))
        assert leader_of(mon, base + ":released")[:2] == ("h", t)
        assert one(a, "SELECT fenced_lock_release(%s, %s)", (base + ":released", t)) is True
        assert leader_of(mon, base + ":released") is None
        e = one(a, "SELECT fenced_lock_try_acquire(%s, '300 ms', 'h')", (base + ":expired",))
        assert leader_of(mon, base + ":expired")[:2] == ("h", e)
        wait_until(lambda: leader_of(mon, base + ":expired") is None, 5, interval=0.02, what="the expiry")
        assert one(mon, "SELECT count(*) FROM fenced_lock_leases WHERE name = %s", (base + ":expired",)) == 1
        one(a, "SELECT fenced_lock_try_acquire(%s, '1 min', 'h', shared => true)", (base + ":shared",))
        one(a, "SELECT fenced_lock_try_acquire(%s, '1 min', 'h', permits => 3)", (base + ":permit",))
        assert leader_of(mon, base + ":shared") is None
        assert leader_of(mon, base + ":permit") is None
        s = cluster.connect(app)
        one(s, "SELECT fenced_lock_try_acquire(%s, '1 min', 'h', session_bound => true)", (base + ":session",))
        assert leader_of(mon, base + ":session") is not None
        s.close()
        wait_until(lambda: leader_of(mon, base + ":session") is None, 5, interval=0.02, what="the session end")
        for n in ("shared", "permit"):
            mon.execute("SELECT fenced_lock_force_release(%s)", (f"{base}:{n}",))


def test_a_role_with_only_execute_on_leader_sees_the_holder_token_and_value(cluster, app, mon, roles):
    name = "leader:visible"
    with cluster.connect(app, user=roles["owner"]) as a, cluster.connect(app, user=roles["leader_only"]) as f:
        t = one(a, "SELECT fenced_lock_try_acquire(%s, '1 min', 'node-7', session_bound => true)", (name,))
        assert one(a, "SELECT fenced_lock_proclaim(%s, %s, '10.0.0.7:5432')", (name, t)) is True
        row = f.execute("SELECT holder, token, acquired_at, expires_at, value FROM fenced_lock_leader(%s)",
                        (name,)).fetchone()
        rec = mon.execute("SELECT acquired_at, expires_at FROM fenced_lock_leases WHERE token = %s", (t,)).fetchone()
        assert row == ("node-7", t, rec[0], rec[1], "10.0.0.7:5432")
        # by design the only window: the views and everything else stay closed to it
        for q in ("SELECT * FROM fenced_lock_leases", "SELECT * FROM fenced_lock_history",
                  "SELECT fenced_lock_validate('leader:visible', 1)",
                  "SELECT fenced_lock_proclaim('leader:visible', 1, 'x')",
                  "SELECT fenced_lock_try_acquire('leader:visible')"):
            assert sqlstate(f, q) == "42501", q
        assert one(a, "SELECT fenced_lock_release(%s, %s)", (name, t)) is True
        assert f.execute("SELECT * FROM fenced_lock_leader(%s)", (name,)).fetchall() == []


# -- the pid column -----------------------------------------------------------------------------

IDLE_IN_TRANSACTION = '''
token = conn.execute("SELECT fenced_lock_try_acquire(%s, '1 min', 'sb', session_bound => true)",
                     (ARGS["name"],)).fetchone()[0]
conn.execute("BEGIN")
conn.execute("SELECT 'holding ' || %s", (ARGS["name"],))
say("granted", token=token)
time.sleep(600)
'''

JOIN = ("SELECT l.pid, a.client_addr::text, a.state, a.query, a.xact_start IS NOT NULL "
        "FROM fenced_lock_leases l JOIN pg_stat_activity a USING (pid) WHERE l.name = %s AND l.live")


def test_pid_of_a_live_session_bound_lease_joins_pg_stat_activity(cluster, app, mon, children):
    name = "pid:join"
    holder = children.start(cluster.dsn(app), IDLE_IN_TRANSACTION, name=name)
    holder.expect("granted", 10)
    wait_until(lambda: mon.execute(JOIN, (name,)).fetchall(), 10, what="the lease to join pg_stat_activity")
    assert mon.execute(JOIN, (name,)).fetchall() == [
        (holder.backend_pid, "127.0.0.1/32", "idle in transaction", "SELECT 'holding ' || $1", True)]
    holder.kill(signal.SIGKILL)
    wait_until(lambda: one(mon, "SELECT count(*) FROM fenced_lock_leases WHERE name = %s", (name,)) == 0, 10,
               what="the session's lease to end")
    assert mon.execute(JOIN, (name,)).fetchall() == []


def test_pid_is_hidden_from_roles_not_allowed_to_see_the_lease(cluster, app, mon, roles):
    name = "pid:hidden"
    with cluster.connect(app, user=roles["owner"]) as a:
        t = one(a, "SELECT fenced_lock_try_acquire(%s, '1 min', 'h', session_bound => true)", (name,))
        q = "SELECT token, holder, pid FROM fenced_lock_leases WHERE name = %s"
        full = (t, "h", a.info.backend_pid)
        for role, want in (("owner", full), ("member", full), ("stranger", (None, None, None))):
            with cluster.connect(app, user=roles[role]) as c:
                assert c.execute(q, (name,)).fetchone() == want, role
        assert mon.execute(q, (name,)).fetchone() == full
        with cluster.connect(app, user=roles["stranger"]) as c:
            assert c.execute(JOIN, (name,)).fetchall() == []  # nothing to join on
        assert one(a, "SELECT fenced_lock_release(%s, %s)", (name, t)) is True


def test_pid_is_null_for_a_lease_that_is_not_session_bound(cluster, app, mon):
    name = "pid:plain"
    with cluster.connect(app) as a:
        t = one(a, "SELECT fenced_lock_try_acquire(%s, '1 min', 'h')", (name,))
        assert mon.execute("SELECT token, session_bound, pid FROM fenced_lock_leases WHERE name = %s",
                           (name,)).fetchone() == (t, False, None)
        got = one(a, "SELECT fenced_lock_acquire_all(%s, '1 min', '1 s', 'h')", ([name + ":a", name + ":b"],))
        assert mon.execute("SELECT count(*) FROM fenced_lock_leases WHERE token = ANY(%s) AND pid IS NULL",
                           (got,)).fetchone()[0] == 2
        assert one(a, "SELECT fenced_lock_release_all(%s, %s)", ([name, name + ":a", name + ":b"], [t] + got)) == 3
