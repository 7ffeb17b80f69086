"""docs/design.md, "Observability" (and "Security" for who sees what):

- fenced_lock_waiters shows every waiting fenced_lock_acquire with its
  position (1 = the head, then arrival order); rows disappear and positions
  shift as waiters time out (55P03), are cancelled (pg_cancel_backend, 57014),
  are terminated (pg_terminate_backend) or are served;
- token and holder in fenced_lock_leases, fenced_lock_waiters and
  fenced_lock_history are shown to the owner's members, operators
  (fenced_lock.operator_role) and superusers, NULL to everyone else;
- fenced_lock_history records every ending (release, force_release, expiry,
  session_end) with ended_at and the role that ended it, and nothing for a
  grant that rolled back;
- fenced_lock.history_retention keeps the history bounded under churn of
  thousands of grants (only rows ended within about the retention remain);
  0 writes no row at all;
- fenced_lock_stats counts exactly with shared_preload_libraries: N of each
  event gives a delta of exactly N in its counter and 0 elsewhere (a
  rolled-back grant counts nothing); without preloading, preloaded = false
  and every counter is NULL.

Real roles throughout (execute_only_role): an owner, a member of the owner,
a stranger, an operator, and the superuser.
"""

import time

import psycopg
import pytest
from psycopg import sql

import it_support
from it_support import one, start, wait_until

VIEWS = ["fenced_lock_leases", "fenced_lock_waiters", "fenced_lock_history", "fenced_lock_stats"]
STATS = ["grants", "renewals", "releases", "expiries", "force_releases", "session_ends", "waits",
         "wait_timeouts", "fence_rejections", "missing_tokens"]


def grant_views(cluster, dbname, role):
    with cluster.connect(dbname) as conn:
        for v in VIEWS:
            conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(sql.Identifier(v), sql.Identifier(role)))


@pytest.fixture(scope="module")
def roles(cluster, db, execute_only_role):
    """owner, member (of owner), stranger, operator; all can read the views."""
    owner = execute_only_role()
    member = execute_only_role()
    stranger = execute_only_role()
    operator = execute_only_role()
    with cluster.connect(db) as conn:
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(owner), sql.Identifier(member)))
        conn.execute(sql.SQL("ALTER DATABASE {} SET fenced_lock.operator_role = {}").format(
            sql.Identifier(db), sql.Literal(operator)))
        conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION fenced_lock_force_release(text) TO {}").format(
            sql.Identifier(operator)))
        conn.execute("CREATE TABLE docs (id text PRIMARY KEY, body text, fence_token bigint)")
        conn.execute("CREATE TRIGGER docs_fence BEFORE INSERT OR UPDATE OR DELETE ON docs "
                     "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('obs:{id}')")
        conn.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON docs TO {}").format(sql.Identifier(owner)))
    for r in (owner, member, stranger, operator):
        grant_views(cluster, db, r)
    return dict(owner=owner, member=member, stranger=stranger, operator=operator)


@pytest.fixture
def mon(cluster, db, roles):
    with cluster.connect(db) as conn:
        yield conn


# -- fenced_lock_waiters ------------------------------------------------------------------


def waiters(mon, name):
    return mon.execute("SELECT pid, position, holder, owner::text FROM fenced_lock_waiters WHERE name = %s "
                       "ORDER BY position", (name,)).fetchall()


def line(mon, name):
    """[(pid, position)] in position order."""
    return [(pid, pos) for pid, pos, _, _ in waiters(mon, name)]


def expect_line(mon, name, pids, what):
    want = [(pid, i + 1) for i, pid in enumerate(pids)]
    wait_until(lambda: line(mon, name) == want, 5, interval=0.01, what=f"{what}: line {want}, seen {line(mon, name)}")


@pytest.mark.budget(60)
def test_waiters_view_shows_positions_that_shift_as_waiters_leave(cluster, db, roles, mon):
    name = "obs:line"
    owner = roles["owner"]
    holder = cluster.connect(db, user=owner)
    conns = [cluster.connect(db, user=owner) for _ in range(6)]
    try:
        first = one(holder, "SELECT fenced_lock_try_acquire(%s, '60 s', 'holder')", (name,))
        waits = ["60 s", "3 s", "60 s", "60 s", "60 s", "60 s"]  # w2 times out on its own
        calls = []
        for i, (c, w) in enumerate(zip(conns, waits)):
            calls.append(start(lambda c=c, w=w, i=i: one(
                c, "SELECT fenced_lock_acquire(%s, '30 s', %s::interval, %s)", (name, w, f"w{i + 1}"))))
            wait_until(lambda c=c: it_support.is_queued(mon, c.info.backend_pid), 10, what="a waiter to queue")
        pids = [c.info.backend_pid for c in conns]
        rows = waiters(mon, name)
        assert [(pid, pos) for pid, pos, _, _ in rows] == [(p, i + 1) for i, p in enumerate(pids)]
        assert [h for _, _, h, _ in rows] == [f"w{i + 1}" for i in range(6)]
        assert {o for _, _, _, o in rows} == {owner}
        since = [r[0] for r in mon.execute("SELECT waiting_since FROM fenced_lock_waiters WHERE name = %s "
                                           "ORDER BY position", (name,)).fetchall()]
        assert since == sorted(since)

        # cancelled: w3 leaves, the rest move up
        assert one(mon, "SELECT pg_cancel_backend(%s)", (pids[2],)) is True
        with pytest.raises(psycopg.Error) as err:
            calls[2].outcome(5)
        assert err.value.sqlstate == "57014"
        expect_line(mon, name, [pids[0], pids[1], pids[3], pids[4], pids[5]], "after the cancel")
        # terminated: w4
        assert one(mon, "SELECT pg_terminate_backend(%s)", (pids[3],)) is True
        with pytest.raises(psycopg.Error):
            calls[3].outcome(5)
        expect_line(mon, name, [pids[0], pids[1], pids[4], pids[5]], "after the termination")
        # timed out: w2 (wait 3 s)
        with pytest.raises(psycopg.Error) as err:
            calls[1].outcome(10)
        assert err.value.sqlstate == "55P03"
        expect_line(mon, name, [pids[0], pids[4], pids[5]], "after the timeout")
        # the head dies: the next one becomes the head
        assert one(mon, "SELECT pg_terminate_backend(%s)", (pids[0],)) is True
        with pytest.raises(psycopg.Error):
            calls[0].outcome(5)
        expect_line(mon, name, [pids[4], pids[5]], "after the head was terminated")
        assert it_support.queue_locks(mon, pids[4]) == [(pids[4], True)]
        # served: w5 gets the lease, w6 is the head
        assert one(holder, "SELECT fenced_lock_release(%s, %s)", (name, first)) is True
        t5 = calls[4].outcome(10)
        expect_line(mon, name, [pids[5]], "after w5 was served")
        assert one(conns[4], "SELECT fenced_lock_release(%s, %s)", (name, t5)) is True
        t6 = calls[5].outcome(10)
        expect_line(mon, name, [], "after w6 was served")
        assert first < t5 < t6
        assert one(conns[5], "SELECT fenced_lock_release(%s, %s)", (name, t6)) is True
    finally:
        it_support.cancel_and_close(mon, [holder] + conns)


# -- who sees token and holder --------------------------------------------------------------


def test_token_and_holder_are_visible_only_to_owner_members_operators_and_superusers(cluster, db, roles, mon):
    name = "obs:visibility"
    owner = roles["owner"]
    with cluster.connect(db, user=owner) as o, cluster.connect(db, user=owner) as w:
        token = one(o, "SELECT fenced_lock_try_acquire(%s, '60 s', 'the-holder')", (name,))
        call = start(lambda: one(w, "SELECT fenced_lock_acquire(%s, '30 s', '20 s', 'the-waiter')", (name,)))
        wait_until(lambda: it_support.is_queued(mon, w.info.backend_pid), 10, what="the waiter to queue")
        try:
            viewers = {"owner": owner, "member": roles["member"], "operator": roles["operator"],
                       "superuser": "postgres", "stranger": roles["stranger"]}
            for who, role in viewers.items():
                sees = who != "stranger"
                with cluster.connect(db, user=role) as v:
                    lease = v.execute("SELECT token, holder, owner::text, live FROM fenced_lock_leases "
                                      "WHERE name = %s", (name,)).fetchone()
                    waiter = v.execute("SELECT holder, owner::text, position FROM fenced_lock_waiters "
                                       "WHERE name = %s", (name,)).fetchone()
                    hist = v.execute("SELECT token, holder, owner FROM fenced_lock_history WHERE name = %s",
                                     (name,)).fetchone()
                if sees:
                    assert lease == (token, "the-holder", owner, True), (who, lease)
                    assert waiter == ("the-waiter", owner, 1), (who, waiter)
                    assert hist == (token, "the-holder", owner), (who, hist)
                else:
                    assert lease == (None, None, owner, True), (who, lease)
                    assert waiter == (None, owner, 1), (who, waiter)
                    assert hist == (None, None, owner), (who, hist)
            # the stranger cannot read the tables behind the views
            with cluster.connect(db, user=roles["stranger"]) as v:
                with pytest.raises(psycopg.Error) as err:
                    v.execute("SELECT * FROM fenced_lock_internal.lease_history")
                assert err.value.sqlstate == "42501"
        finally:
            assert one(o, "SELECT fenced_lock_release(%s, %s)", (name, token)) is True
            got = call.outcome(10)
            assert one(w, "SELECT fenced_lock_release(%s, %s)", (name, got)) is True


# -- fenced_lock_history: every ending -------------------------------------------------------


def hist(mon, token):
    return mon.execute("SELECT ended_by, ended_by_role, ended_at, expires_at FROM fenced_lock_history "
                       "WHERE token = %s", (token,)).fetchone()


def test_history_records_every_ending_and_who_ended_it(cluster, db, roles, mon):
    owner, member, operator = roles["owner"], roles["member"], roles["operator"]
    with cluster.connect(db, user=owner) as o, cluster.connect(db, user=member) as m, \
            cluster.connect(db, user=operator) as op:
        grant = lambda name, ttl="60 s": one(o, "SELECT fenced_lock_try_acquire(%s, %s::interval)", (name, ttl))

        t = grant("obs:end:release")
        assert one(o, "SELECT fenced_lock_release('obs:end:release', %s)", (t,)) is True
        ended_by, role, ended_at, _ = hist(mon, t)
        assert (ended_by, role) == ("release", owner) and ended_at is not None

        t = grant("obs:end:member")
        assert one(m, "SELECT fenced_lock_release('obs:end:member', %s)", (t,)) is True
        assert hist(mon, t)[:2] == ("release", member)

        t = grant("obs:end:force")
        assert one(op, "SELECT fenced_lock_force_release('obs:end:force')") is True
        assert hist(mon, t)[:2] == ("force_release", operator)

        t = grant("obs:end:force_su")
        assert one(mon, "SELECT fenced_lock_force_release('obs:end:force_su')") is True
        assert hist(mon, t)[:2] == ("force_release", "postgres")

        t = grant("obs:end:expiry", "300 ms")
        assert hist(mon, t)[:3] == (None, None, None)  # live: nothing recorded yet
        wait_until(lambda: not one(mon, "SELECT live FROM fenced_lock_leases WHERE name = 'obs:end:expiry'"), 5,
                   interval=0.02, what="the lease to expire")
        assert hist(mon, t)[:3] == (None, None, None)  # expired, but not observed yet
        t2 = one(m, "SELECT fenced_lock_try_acquire('obs:end:expiry', '60 s')")
        ended_by, role, ended_at, expires_at = hist(mon, t)
        assert (ended_by, role) == ("expiry", None) and ended_at == expires_at
        assert one(m, "SELECT fenced_lock_release('obs:end:expiry', %s)", (t2,)) is True

        s = cluster.connect(db, user=owner)
        t = one(s, "SELECT fenced_lock_try_acquire('obs:end:session', '60 s', NULL, true)")
        s.close()
        wait_until(lambda: hist(mon, t)[0] == "session_end", 5, interval=0.01, what="the session end")
        assert hist(mon, t)[1] is None and hist(mon, t)[2] is not None

        # a renewal moves the open row's expires_at; the row stays open
        t = grant("obs:end:renew", "10 s")
        before = hist(mon, t)[3]
        assert one(o, "SELECT fenced_lock_renew('obs:end:renew', %s, '1 min')", (t,)) is True
        assert hist(mon, t)[3] > before and hist(mon, t)[:3] == (None, None, None)
        assert one(o, "SELECT fenced_lock_release('obs:end:renew', %s)", (t,)) is True

        # a grant that rolls back leaves no row
        o.execute("BEGIN")
        t = grant("obs:end:rolled_back")
        o.execute("ROLLBACK")
        assert mon.execute("SELECT count(*) FROM fenced_lock_history WHERE name = 'obs:end:rolled_back' "
                           "OR token = %s", (t,)).fetchone()[0] == 0


# -- history_retention ---------------------------------------------------------------------


@pytest.mark.budget(90)
def test_history_retention_keeps_the_history_bounded_under_churn(cluster):
    dbname = cluster.create_database("it_observability_retention")
    try:
        cluster.sql("ALTER DATABASE it_observability_retention SET fenced_lock.history_retention = '1s'")
        churn = ("SELECT count(fenced_lock_release(n, fenced_lock_try_acquire(n, '1 min'))) "
                 "FROM (SELECT 'churn:' || %s::text || ':' || i AS n FROM generate_series(1, 250) i) s")
        with cluster.connect(dbname) as conn:
            assert one(conn, "SHOW fenced_lock.history_retention") == "1s"
            kept = one(conn, "SELECT fenced_lock_try_acquire('kept', '10 min')")  # a live lease: never pruned
            grants, counts = 0, []
            deadline = time.monotonic() + 5
            batch = 0
            while time.monotonic() < deadline:
                grants += one(conn, churn, (batch,))
                batch += 1
                if batch % 10 == 0:
                    counts.append(one(conn, "SELECT count(*) FROM fenced_lock_internal.lease_history"))
            rows, oldest, age = conn.execute(
                "SELECT count(*), min(ended_at), clock_timestamp() - min(ended_at) "
                "FROM fenced_lock_internal.lease_history WHERE ended_at IS NOT NULL").fetchone()
            print(f"history_retention = 1s: {grants} grants in 5 s; history rows every 10 batches: {counts}; "
                  f"at the end {rows} ended rows, the oldest ended {age.total_seconds():.2f} s ago")
            assert grants >= 2000, f"only {grants} grants: too little churn to show anything"
            assert rows < grants / 3, f"{rows} history rows after {grants} grants: not pruned"
            assert age.total_seconds() < 3.0, f"a row ended {age} ago is still there (retention 1 s)"
            # Bounded all along: at most about retention + one pruning round
            # of grants' worth, far from the run's 5 s.
            assert max(counts) < grants / 2
            assert conn.execute("SELECT ended_at FROM fenced_lock_history WHERE token = %s", (kept,)).fetchone() \
                == (None,)

        # retention 0: no ended lease is kept; a live lease still shows (from its record)
        cluster.sql("ALTER DATABASE it_observability_retention SET fenced_lock.history_retention = 0")
        with cluster.connect(dbname) as conn:
            assert one(conn, "SHOW fenced_lock.history_retention") == "0"
            before = one(conn, "SELECT max(token) FROM fenced_lock_internal.lease_history")
            assert one(conn, churn, ("zero",)) == 250
            t = one(conn, "SELECT fenced_lock_try_acquire('zero:live', '1 min')")
            assert t is not None
            assert one(conn, "SELECT count(*) FROM fenced_lock_internal.lease_history WHERE token > %s",
                       (before,)) == 0
            assert one(conn, "SELECT count(*) FROM fenced_lock_history WHERE name LIKE 'churn:zero:%%'") == 0
            assert conn.execute("SELECT token, ended_at FROM fenced_lock_history WHERE name = 'zero:live'"
                                ).fetchall() == [(t, None)]
    finally:
        cluster.sql('DROP DATABASE IF EXISTS "it_observability_retention" WITH (FORCE)')


# -- fenced_lock_stats -----------------------------------------------------------------------


def stats(conn):
    row = conn.execute(f"SELECT {', '.join(STATS)}, preloaded FROM fenced_lock_stats").fetchone()
    return dict(zip(STATS + ["preloaded"], row))


class Deltas:
    def __init__(self, conn):
        self.conn = conn
        self.last = stats(conn)
        assert self.last["preloaded"] is True

    def expect(self, what, timeout=0, **want):
        """The counters moved by exactly `want` (every other one by 0) since
        the last call. `timeout`: events committed by another backend after it
        answered (a session's end) may need a moment."""
        want = {k: want.get(k, 0) for k in STATS}

        def delta():
            now = stats(self.conn)
            return now, {k: now[k] - self.last[k] for k in STATS}
        now, got = delta()
        deadline = time.monotonic() + timeout
        while got != want and time.monotonic() < deadline:
            time.sleep(0.02)
            now, got = delta()
        assert got == want, f"{what}: counters moved by {got}, expected {want}"
        self.last = now


@pytest.mark.budget(90)
def test_stats_count_each_event_exactly_with_preload(preload_cluster):
    c = preload_cluster
    dbname = c.create_database("it_observability_stats")
    n = 5
    try:
        with c.connect(dbname) as conn:
            conn.execute("CREATE TABLE docs (id int PRIMARY KEY, fence_token bigint)")
            conn.execute("INSERT INTO docs SELECT i, NULL FROM generate_series(0, 9) i")
            conn.execute("CREATE TRIGGER docs_fence BEFORE INSERT OR UPDATE OR DELETE ON docs "
                         "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('st:doc:{id}')")
        with c.connect(dbname) as conn, c.connect(dbname) as other:
            d = Deltas(conn)
            try_acquire = lambda cn, name, ttl="60 s", holder=None, sb=False: one(
                cn, "SELECT fenced_lock_try_acquire(%s, %s::interval, %s, %s)", (name, ttl, holder, sb))

            tokens = [try_acquire(conn, f"st:g:{i}", holder="h") for i in range(n)]
            d.expect("grants", grants=n)
            for i, t in enumerate(tokens):
                assert one(conn, "SELECT fenced_lock_renew(%s, %s)", (f"st:g:{i}", t)) is True
            assert try_acquire(other, "st:g:0", holder="h") == tokens[0]  # same holder: a renewal
            d.expect("renewals", renewals=n + 1)
            for i, t in enumerate(tokens):
                assert one(conn, "SELECT fenced_lock_release(%s, %s)", (f"st:g:{i}", t)) is True
            assert one(conn, "SELECT fenced_lock_release('st:g:0', %s)", (tokens[0],)) is False  # not counted
            d.expect("releases", releases=n)

            conn.execute("BEGIN")
            assert try_acquire(conn, "st:rolled_back") is not None
            conn.execute("SAVEPOINT s")
            assert try_acquire(conn, "st:rolled_back_sub") is not None
            conn.execute("ROLLBACK TO SAVEPOINT s")
            conn.execute("ROLLBACK")
            d.expect("a rolled-back grant")
            conn.execute("BEGIN")
            assert try_acquire(conn, "st:committed") is not None
            conn.execute("SAVEPOINT s")
            assert try_acquire(conn, "st:rolled_back_sub") is not None
            conn.execute("ROLLBACK TO SAVEPOINT s")
            conn.execute("COMMIT")
            d.expect("a grant committed beside a subtransaction's rolled back", grants=1)

            short = [try_acquire(conn, f"st:e:{i}", "200 ms") for i in range(n)]
            d.expect("short grants", grants=n)
            wait_until(lambda: one(conn, "SELECT count(*) FROM fenced_lock_leases WHERE name LIKE 'st:e:%%' "
                                         "AND live") == 0, 5, interval=0.02, what="the short leases to expire")
            d.expect("expiry alone is not counted until observed")
            taken = [try_acquire(other, f"st:e:{i}") for i in range(n)]
            assert all(t > s for t, s in zip(taken, short))
            d.expect("takeovers after expiry", grants=n, expiries=n)

            for i in range(n):
                assert one(conn, "SELECT fenced_lock_force_release(%s)", (f"st:e:{i}",)) is True
            d.expect("force releases", force_releases=n)

            for i in range(n):
                s = c.connect(dbname)
                assert try_acquire(s, f"st:s:{i}", sb=True) is not None
                s.close()
            d.expect("session ends", timeout=5, grants=n, session_ends=n)

            held = try_acquire(conn, "st:w")
            for _ in range(n):
                with pytest.raises(psycopg.Error) as err:
                    other.execute("SELECT fenced_lock_acquire('st:w', '30 s', '100 ms')")
                assert err.value.sqlstate == "55P03"
            d.expect("waits that timed out", grants=1, waits=n, wait_timeouts=n)
            call = start(lambda: one(other, "SELECT fenced_lock_acquire('st:w', '30 s', '10 s')"))
            wait_until(lambda: it_support.is_queued(conn, other.info.backend_pid), 10, what="the waiter to queue")
            assert one(conn, "SELECT fenced_lock_release('st:w', %s)", (held,)) is True
            got = call.outcome(10)
            assert one(other, "SELECT fenced_lock_release('st:w', %s)", (got,)) is True
            assert one(other, "SELECT fenced_lock_acquire('st:free', '30 s', '1 s')") is not None  # no wait
            d.expect("a wait that was served", grants=2, releases=2, waits=1)

            stale = try_acquire(conn, "st:doc:1")
            assert one(conn, "SELECT fenced_lock_release('st:doc:1', %s)", (stale,)) is True
            for i in range(n):
                with pytest.raises(psycopg.Error) as err:
                    conn.execute("UPDATE docs SET fence_token = %s WHERE id = 1", (stale,))
                assert err.value.sqlstate == "FL001"
                with pytest.raises(psycopg.Error) as err:
                    conn.execute("SELECT fenced_lock_assert('st:doc:1', %s)", (stale,))
                assert err.value.sqlstate == "FL001"
            d.expect("fence rejections", grants=1, releases=1, fence_rejections=2 * n)

            for i in range(n):
                with pytest.raises(psycopg.Error) as err:
                    conn.execute("UPDATE docs SET fence_token = NULL WHERE id = 2")
                assert err.value.sqlstate == "FL002"
            d.expect("missing tokens", missing_tokens=n)
    finally:
        c.sql('DROP DATABASE IF EXISTS "it_observability_stats" WITH (FORCE)')


def test_stats_are_null_without_preload(cluster, db, roles):
    assert "fenced_lock" not in cluster.sql("SHOW shared_preload_libraries")[0][0]
    for role in ("postgres", roles["stranger"]):
        with cluster.connect(db, user=role) as conn:
            one(conn, "SELECT fenced_lock_validate('obs:load', 1)")  # the library is loaded now
            row = stats(conn)
            assert row == dict({k: None for k in STATS}, preloaded=False), row
