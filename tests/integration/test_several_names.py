"""docs/reference.md, "Several names at once", and docs/design.md,
"Transitions" (several names) and invariant 11: fenced_lock_try_acquire_all,
fenced_lock_acquire_all, fenced_lock_release_all and fenced_lock_renew_all
against the real server.

- Two sessions taking the same two names in opposite orders, in a loop,
  never deadlock, and an observer never sees one of them holding only one
  of the names; tokens come back in the order of `names`.
- `wait` bounds the whole call; 55P03, a cancel, statement_timeout, a client
  killed with kill -9 or a closed socket leave nothing granted, no waiter
  and no lock behind. A try of several names grants all or nothing.
- Waiting is FIFO per name: a multi-name acquire never jumps anybody's line,
  and nobody jumps it.
- A same-holder retry returns the same tokens; session-bound leases taken
  together end together with their session, each with its history row.
- release_all counts what it released; renew_all renews exactly the calling
  role's live leases with that holder (holder NULL: this session's
  session-bound leases).
"""

import os
import signal
import socket
import threading
import time

import psycopg
import pytest
from psycopg import sql

import it_support
from it_support import elapsed_ms, start, wait_until
from modes_support import ALL_FUNCTIONS, VIEWS, Listener, history_of, lease_state, one, sqlstate

HANDOFF_BOUND_S = 2.0


@pytest.fixture(scope="module")
def app(cluster, db):
    return db


@pytest.fixture
def mon(cluster, app):
    with cluster.connect(app) as conn:
        yield conn


@pytest.fixture(scope="module")
def roles(cluster, db, execute_only_role):
    """owner, member (of owner), stranger: EXECUTE on every function, SELECT on the views."""
    owner, member, stranger = (execute_only_role(functions=ALL_FUNCTIONS) for _ in range(3))
    with cluster.connect(db) as su:
        su.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(owner), sql.Identifier(member)))
        for r in (owner, member, stranger):
            for v in VIEWS:
                su.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(sql.Identifier(v), sql.Identifier(r)))
    return dict(owner=owner, member=member, stranger=stranger)


ACQUIRE_ALL = "SELECT fenced_lock_acquire_all(%s, %s::interval, %s::interval, %s, %s)"
TRY_ALL = "SELECT fenced_lock_try_acquire_all(%s, %s::interval, %s, %s)"


def acquire_all(conn, names, ttl="30 s", wait="20 s", holder=None, session_bound=False):
    return one(conn, ACQUIRE_ALL, (list(names), ttl, wait, holder, session_bound))


def try_all(conn, names, ttl="30 s", holder=None, session_bound=False):
    return one(conn, TRY_ALL, (list(names), ttl, holder, session_bound))


def release_all(conn, names, tokens):
    return one(conn, "SELECT fenced_lock_release_all(%s, %s)", (list(names), list(tokens)))


def try_acquire(conn, name, ttl="30 s", holder=None, session_bound=False):
    return one(conn, "SELECT fenced_lock_try_acquire(%s, %s::interval, %s, %s)", (name, ttl, holder, session_bound))


def release(conn, name, token):
    return one(conn, "SELECT fenced_lock_release(%s, %s)", (name, token))


def waiting(mon, pid=None):
    q, params = "SELECT name, holder, position FROM fenced_lock_waiters", ()
    if pid is not None:
        q, params = q + " WHERE pid = %s", (pid,)
    return mon.execute(q + " ORDER BY name, position", params).fetchall()


def expires(mon, name):
    return one(mon, "SELECT expires_at FROM fenced_lock_leases WHERE name = %s AND live", (name,))


def start_waiter(conn, mon, fn, name, what):
    """Run `fn` in a thread; return once conn's backend waits in the line of `name`."""
    call = start(fn, name=what)
    pid = conn.info.backend_pid
    wait_until(lambda: one(mon, "SELECT count(*) FROM fenced_lock_waiters WHERE pid = %s AND name = %s",
                           (pid, name)) == 1 or not call.is_alive(), 10, what=f"{what} to wait for {name}")
    assert call.is_alive(), f"{what} did not wait: {call.error or call.result}"
    return call


# -- no deadlock, no partial set ----------------------------------------------------------------


@pytest.mark.budget(120)
def test_two_sessions_taking_two_names_in_opposite_orders_never_deadlock_or_show_a_partial_set(cluster, app, mon):
    a, b = "many:loop:a", "many:loop:b"
    iterations = 200
    calls = {"s1": [], "s2": []}
    stop = threading.Event()
    observed = {"polls": 0, "both": 0, "partial": []}

    def loop(who, names):
        with cluster.connect(app) as c:
            c.execute("SET statement_timeout = '30s'")  # bounded: a hang shows as 57014
            for _ in range(iterations):
                tokens = acquire_all(c, names, "30 s", "20 s", who)
                calls[who].append((names, tokens))
                assert release_all(c, names, tokens) == 2

    def observe():
        with cluster.connect(app) as o:
            while not stop.is_set():
                rows = o.execute("SELECT holder, count(*) FROM fenced_lock_leases WHERE name = ANY(%s) AND live "
                                 "GROUP BY holder", ([a, b],)).fetchall()
                observed["polls"] += 1
                for holder, n in rows:
                    if n == 2:
                        observed["both"] += 1
                    else:
                        observed["partial"].append((holder, n))
                assert len(rows) <= 1, rows  # one holder at a time: the leases are exclusive

    t0 = time.monotonic()
    watcher = start(observe, name="observer")
    s1 = start(lambda: loop("s1", [a, b]), name="s1")
    s2 = start(lambda: loop("s2", [b, a]), name="s2")
    try:
        s1.outcome(90)
        s2.outcome(90)
    finally:
        stop.set()
        watcher.outcome(10)
    print(f"{2 * iterations} acquire_all calls in opposite orders in {time.monotonic() - t0:.1f} s; the observer "
          f"polled {observed['polls']} times and saw a holder with both names {observed['both']} times")
    assert observed["partial"] == []
    assert observed["both"] > 0
    # the tokens came back in the order of names
    h = {r["token"]: r for r in history_of(mon, [a, b])}
    for who, made in calls.items():
        assert len(made) == iterations
        for names, tokens in made:
            assert [h[t]["name"] for t in tokens] == names, (who, names, tokens)
            assert all(h[t]["holder"] == who and h[t]["ended_by"] == "release" for t in tokens)
    assert len(h) == 4 * iterations
    # the two really contended: their grants of name a interleave
    order = [r["holder"] for r in sorted(h.values(), key=lambda r: r["acquired_at"]) if r["name"] == a]
    switches = sum(1 for x, y in zip(order, order[1:]) if x != y)
    print(f"the holder of {a} changed hands between the sessions {switches} times")
    assert switches >= 10


# -- wait, try, and what an interrupted call leaves ----------------------------------------------


def test_wait_bounds_the_whole_acquire_all_call_then_55P03_and_nothing_is_granted_or_locked(cluster, app, mon):
    """The first name frees itself (its lease expires) 1.8 s into the call,
    the third never does: with `wait` = 2 s for the whole call, 55P03 comes
    after about 2 s (a wait per name would take 1.8 + 2 s), and the grant of
    the first and second names is rolled back with it."""
    a, b, c = "many:wait:a", "many:wait:b", "many:wait:c"
    with cluster.connect(app) as h1, cluster.connect(app) as h2, cluster.connect(app) as w:
        ta = try_acquire(h1, a, "1.8 s")
        tc = try_acquire(h2, c, "60 s")
        state = lease_state(mon, [a, b, c])
        t0 = time.monotonic()
        code = sqlstate(w, ACQUIRE_ALL, ([a, b, c], "30 s", "2 s", "w", False))
        took = time.monotonic() - t0
        print(f"acquire_all with wait 2 s: {code} after {took * 1000:.0f} ms")
        assert code == "55P03"
        assert 1.9 <= took < 3.5
        assert lease_state(mon, [a, b, c]) == state  # the takeover of a and the grant of b rolled back
        assert it_support.fenced_locks_of(mon, w.info.backend_pid) == []
        assert it_support.session_locks(mon, w.info.backend_pid) == []
        assert waiting(mon, w.info.backend_pid) == []
        assert one(mon, "SELECT state FROM pg_stat_activity WHERE pid = %s", (w.info.backend_pid,)) == "idle"
        assert one(mon, "SELECT fenced_lock_validate(%s, %s)", (c, tc)) is True
        assert [r["token"] for r in history_of(mon, [a, b, c])] == [ta, tc]


def test_try_acquire_all_returns_null_and_grants_nothing_if_any_name_is_busy(cluster, app, mon):
    a, b, c = "many:try:a", "many:try:b", "many:try:c"
    with cluster.connect(app) as h, cluster.connect(app) as t:
        # busy: a live lease of the last name
        tc = try_acquire(h, c, "60 s")
        state = lease_state(mon, [a, b, c])
        t0 = time.monotonic()
        assert try_all(t, [a, b, c]) is None
        print(f"try_acquire_all of a busy set: NULL in {elapsed_ms(t0):.1f} ms")
        assert lease_state(mon, [a, b, c]) == state
        assert it_support.fenced_locks_of(mon, t.info.backend_pid) == []
        # busy: an uncommitted grant of another transaction (it may yet commit)
        assert release(h, c, tc) is True
        h.execute("BEGIN")
        assert try_acquire(h, b, "60 s") is not None
        state = lease_state(mon, [a, b, c])
        t0 = time.monotonic()
        assert try_all(t, [c, b, a]) is None
        assert elapsed_ms(t0) < 2000  # a try never waits for another transaction
        h.execute("ROLLBACK")
        assert lease_state(mon, [a, b, c]) == state
        # free: every name, tokens in the order of names
        got = try_all(t, [c, a, b], holder="t")
        assert [one(mon, "SELECT name FROM fenced_lock_leases WHERE token = %s", (x,)) for x in got] == [c, a, b]
        assert release_all(t, [c, a, b], got) == 3


def _cancel(mon, conn, call, pid):
    assert one(mon, "SELECT pg_cancel_backend(%s)", (pid,)) is True
    return "57014"


def _statement_timeout(mon, conn, call, pid):
    return "57014"  # set before the call


def _closed_socket(mon, conn, call, pid):
    s = socket.socket(fileno=os.dup(conn.fileno()))
    s.shutdown(socket.SHUT_RDWR)
    s.close()
    return None


INTERRUPTS = {"cancel": _cancel, "statement_timeout": _statement_timeout, "closed_socket": _closed_socket}

WAIT_ALL = '''
say("waiting")
try:
    tokens = conn.execute("SELECT fenced_lock_acquire_all(%s, '30 s', NULL, 'waiter')", (ARGS["names"],)).fetchone()[0]
    say("granted", tokens=tokens)
except psycopg.Error as e:
    say("error", sqlstate=e.sqlstate)
time.sleep(600)
'''


@pytest.mark.parametrize("how", list(INTERRUPTS) + ["kill9_client"])
def test_an_interrupted_acquire_all_leaves_nothing_granted_and_no_waiter(cluster, app, mon, children, how):
    """The call holds the first name (uncommitted, so it counts as held for
    everyone else) and waits for the second; then it is interrupted."""
    a, b = f"many:gone:{how}:a", f"many:gone:{how}:b"
    with cluster.connect(app) as h, cluster.connect(app) as other:
        tb = try_acquire(h, b, "60 s", "h")
        conn = None
        if how == "kill9_client":
            child = children.start(cluster.dsn(app), WAIT_ALL, names=[a, b])
            child.expect("waiting", 10)
            pid = child.backend_pid
            wait_until(lambda: waiting(mon, pid) == [(b, "waiter", 1)], 10, what="the child to wait for b")
        else:
            conn = cluster.connect(app)
            if how == "statement_timeout":
                conn.execute("SET statement_timeout = '1s'")
            pid = conn.info.backend_pid
            call = start_waiter(conn, mon, lambda: acquire_all(conn, [a, b], "30 s", None, "waiter"), b, "the waiter")
            assert waiting(mon, pid) == [(b, "waiter", 1)]
        try:
            assert try_acquire(other, a, "30 s", "other") is None  # a counts as held by the waiting call
            t0 = time.monotonic()
            if how == "kill9_client":
                t0 = child.kill(signal.SIGKILL)
                expected = None
            else:
                expected = INTERRUPTS[how](mon, conn, call, pid)
                with pytest.raises(psycopg.Error) as err:
                    call.outcome(10)
                if expected:
                    assert err.value.sqlstate == expected, err.value
            wait_until(lambda: waiting(mon, pid) == [], 10, what="the waiter to leave the line")
            gone = elapsed_ms(t0)
            if expected is None:  # the client is gone: so is its backend
                wait_until(lambda: one(mon, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)) == 0, 10,
                           what="the backend to exit")
            else:
                assert it_support.fenced_locks_of(mon, pid) == []
                assert one(mon, "SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)) == "idle"
                assert conn.execute("SELECT 1").fetchone()[0] == 1
            print(f"{how}: the waiting acquire_all left the line {gone:.0f} ms after it was interrupted")
            got = try_acquire(other, a, "30 s", "other")
            assert got is not None
            assert [(r["token"], r["holder"]) for r in history_of(mon, [a, b])] == [(tb, "h"), (got, "other")]
            assert one(mon, "SELECT fenced_lock_validate(%s, %s)", (b, tb)) is True
            assert release(other, a, got) is True and release(h, b, tb) is True
        finally:
            if conn is not None:
                it_support.cancel_and_close(mon, [conn])


# -- FIFO per name --------------------------------------------------------------------------------


def test_a_single_name_waiter_queued_before_an_acquire_all_is_served_first(cluster, app, mon):
    a, b = "many:fifo1:a", "many:fifo1:b"
    with cluster.connect(app) as x, cluster.connect(app) as w1, cluster.connect(app) as w2, \
            cluster.connect(app) as other:
        tx = try_acquire(x, b, "60 s", "x")
        c1 = start_waiter(w1, mon, lambda: one(w1, "SELECT fenced_lock_acquire(%s, '30 s', '20 s', 'w1')", (b,)), b,
                          "w1")
        c2 = start_waiter(w2, mon, lambda: acquire_all(w2, [a, b], "30 s", "20 s", "w2"), b, "w2")
        assert waiting(mon) == [(b, "w1", 1), (b, "w2", 2)]
        assert try_acquire(other, a) is None  # w2 took a (uncommitted) on its way
        assert release(x, b, tx) is True
        t1 = c1.outcome(HANDOFF_BOUND_S + 5)
        wait_until(lambda: waiting(mon) == [(b, "w2", 1)], 5, what="w2 to move to the head")
        assert c2.is_alive()
        assert release(w1, b, t1) is True
        t2 = c2.outcome(HANDOFF_BOUND_S + 5)
        assert t2[1] > t1 > tx
        h = {r["token"]: r for r in history_of(mon, [a, b])}
        assert h[t2[1]]["acquired_at"] >= h[t1]["ended_at"]
        assert release_all(w2, [a, b], t2) == 2


def test_an_acquire_all_queued_first_is_served_before_a_later_single_name_waiter(cluster, app, mon):
    a, b = "many:fifo2:a", "many:fifo2:b"
    with cluster.connect(app) as x, cluster.connect(app) as w1, cluster.connect(app) as w2:
        tx = try_acquire(x, b, "60 s", "x")
        c1 = start_waiter(w1, mon, lambda: acquire_all(w1, [a, b], "30 s", "20 s", "w1"), b, "w1")
        c2 = start_waiter(w2, mon, lambda: one(w2, "SELECT fenced_lock_acquire(%s, '30 s', '20 s', 'w2')", (b,)), b,
                          "w2")
        assert waiting(mon) == [(b, "w1", 1), (b, "w2", 2)]
        assert release(x, b, tx) is True
        t1 = c1.outcome(HANDOFF_BOUND_S + 5)
        wait_until(lambda: waiting(mon) == [(b, "w2", 1)], 5, what="w2 to move to the head")
        assert release_all(w1, [a, b], t1) == 2
        t2 = c2.outcome(HANDOFF_BOUND_S + 5)
        assert t2 > t1[1] > tx
        assert release(w2, b, t2) is True


# -- retries and session-bound sets ---------------------------------------------------------------


def test_a_same_holder_retry_of_acquire_all_returns_the_same_tokens_extended(cluster, app, mon):
    names = ["many:retry:a", "many:retry:b", "many:retry:c"]
    with cluster.connect(app) as a, cluster.connect(app) as b:
        tokens = acquire_all(a, names, "10 s", "1 s", "h")
        first = [expires(mon, n) for n in names]
        assert acquire_all(b, names, "60 s", "1 s", "h") == tokens
        assert try_all(b, list(reversed(names)), "90 s", "h") == list(reversed(tokens))
        assert all(expires(mon, n) > f for n, f in zip(names, first))
        assert try_all(b, names, "30 s", "someone else") is None
        assert [r["token"] for r in history_of(mon, names)] == tokens  # no new grant
        assert release_all(b, names, tokens) == 3


SESSION_ALL = '''
tokens = conn.execute("SELECT fenced_lock_acquire_all(%s, '60 s', '5 s', 'sb', session_bound => true)",
                      (ARGS["names"],)).fetchone()[0]
say("granted", tokens=tokens)
time.sleep(600)
'''


def test_session_bound_leases_from_acquire_all_end_with_their_session_each_with_its_own_history_row(
        cluster, app, mon, children):
    names = ["many:sb:a", "many:sb:b", "many:sb:c"]
    holder = children.start(cluster.dsn(app), SESSION_ALL, names=names)
    tokens = holder.expect("granted", 10)["tokens"]
    assert mon.execute("SELECT name, token, session_bound, pid FROM fenced_lock_leases WHERE name = ANY(%s) AND live "
                       "ORDER BY name", (names,)).fetchall() == [
        (n, t, True, holder.backend_pid) for n, t in zip(names, tokens)]
    assert it_support.session_locks(mon, holder.backend_pid) == sorted(tokens)
    with cluster.connect(app) as w:
        call = start_waiter(w, mon, lambda: acquire_all(w, [names[2], names[0]], "30 s", "20 s", "w"), names[0], "w")
        killed = holder.kill(signal.SIGKILL)
        got = call.outcome(HANDOFF_BOUND_S + 5)
        ms = elapsed_ms(killed, call.finished_at)
        print(f"acquire_all waiter served {ms:.1f} ms after the session-bound set's client was killed")
        assert ms < HANDOFF_BOUND_S * 1000
        assert min(got) > max(tokens)
        h = {r["token"]: r for r in history_of(mon, names)}
        assert [(h[t]["name"], h[t]["ended_by"], h[t]["session_bound"], h[t]["ended_at"] is not None)
                for t in tokens] == [(n, "session_end", True, True) for n in names]
        b = try_acquire(w, names[1])
        assert b is not None and b > max(tokens)
        assert release_all(w, [names[2], names[0], names[1]], got + [b]) == 3


# -- release_all and renew_all --------------------------------------------------------------------


def test_release_all_returns_how_many_it_released(cluster, app, mon, roles):
    names = [f"many:rel:{i}" for i in range(5)]
    with cluster.connect(app, user=roles["owner"]) as a, cluster.connect(app, user=roles["stranger"]) as b, \
            cluster.connect(app, user=roles["member"]) as m:
        t = acquire_all(a, names[:3], "60 s", "1 s", "h")
        assert release(a, names[1], t[1]) is True
        assert release_all(a, names[:3], t) == 2  # the one released already counts 0
        assert release_all(a, names[:3], t) == 0
        t2 = acquire_all(a, names[3:], "60 s", "1 s", "h")
        tb = try_acquire(b, "many:rel:b", "60 s", "h")
        state = lease_state(mon, names + ["many:rel:b"])
        assert sqlstate(b, "SELECT fenced_lock_release_all(%s, %s)", (["many:rel:b", names[3]], [tb, t2[0]])) == "42501"
        assert lease_state(mon, names + ["many:rel:b"]) == state  # its own lease was not released either
        assert release_all(b, [names[3]], [t2[0] + 1000]) == 0  # not the live lease: just not live
        assert release_all(m, names[3:], t2) == 2  # a member acts for the owner
        assert release_all(b, ["many:rel:b"], [tb]) == 1
        h = {r["token"]: r for r in history_of(mon, names)}
        assert [(h[x]["ended_by"], h[x]["ended_by_role"]) for x in t + t2] == [
            ("release", roles["owner"])] * 3 + [("release", roles["member"])] * 2


def test_renew_all_renews_exactly_the_calling_roles_live_leases_with_that_holder(cluster, app, mon, roles):
    n = lambda i: f"many:renew:{i}"
    ttl_left = lambda name: one(mon, "SELECT extract(epoch FROM expires_at - clock_timestamp()) FROM "
                                     "fenced_lock_leases WHERE name = %s AND live", (name,))
    with cluster.connect(app, user=roles["owner"]) as a, cluster.connect(app, user=roles["stranger"]) as b, \
            cluster.connect(app, user=roles["member"]) as m:
        t1 = try_acquire(a, n(1), "10 s", "h")
        t2 = try_acquire(a, n(2), "20 s", "h")
        try_acquire(a, n(3), "30 s", "other")
        t4 = try_acquire(a, n(4), "200 ms", "h")
        try_acquire(b, n(6), "30 s", "h")
        wait_until(lambda: one(mon, "SELECT NOT live FROM fenced_lock_leases WHERE token = %s", (t4,)), 5,
                   interval=0.02, what="the short lease to expire")
        before = {i: expires(mon, n(i)) for i in (1, 2, 3, 6)}
        assert one(a, "SELECT fenced_lock_renew_all('h', '5 min')") == 2
        after = {i: expires(mon, n(i)) for i in (1, 2, 3, 6)}
        assert after[1] > before[1] and after[2] > before[2]
        assert (after[3], after[6]) == (before[3], before[6])  # another holder; another role's
        assert 290 < ttl_left(n(1)) <= 300 and 290 < ttl_left(n(2)) <= 300
        assert one(mon, "SELECT live FROM fenced_lock_leases WHERE token = %s", (t4,)) is False  # never revived
        # ttl NULL: each lease's own ttl
        assert one(a, "SELECT fenced_lock_renew_all('h')") == 2
        assert 5 < ttl_left(n(1)) <= 10 and 15 < ttl_left(n(2)) <= 20
        assert one(b, "SELECT fenced_lock_renew_all('h', '5 min')") == 1  # its own lease only
        assert expires(mon, n(1)) < expires(mon, n(6))
        assert one(m, "SELECT fenced_lock_renew_all('h', '2 min')") == 2  # a member acts for the owner
        assert 110 < ttl_left(n(1)) <= 120 and ttl_left(n(6)) > 290  # not the other role's
        assert [r["token"] for r in history_of(mon, [n(1), n(2)])] == [t1, t2]  # renewed, not granted anew


def test_renew_all_with_holder_null_renews_every_lease_bound_to_this_session(cluster, app, mon, roles):
    n = lambda i: f"many:renew_sb:{i}"
    with cluster.connect(app, user=roles["owner"]) as a, cluster.connect(app, user=roles["owner"]) as a2:
        try_acquire(a, n(1), "10 s", "x", session_bound=True)
        try_acquire(a, n(2), "10 s", None, session_bound=True)
        try_acquire(a, n(3), "10 s", None)  # not session-bound
        try_acquire(a, n(4), "10 s", "x")   # not session-bound, holder x
        try_acquire(a2, n(5), "10 s", None, session_bound=True)  # another session of the role
        before = {i: expires(mon, n(i)) for i in range(1, 6)}
        assert one(a, "SELECT fenced_lock_renew_all(NULL, '5 min')") == 2
        after = {i: expires(mon, n(i)) for i in range(1, 6)}
        assert [after[i] > before[i] for i in range(1, 6)] == [True, True, False, False, False]
        assert one(a2, "SELECT fenced_lock_renew_all(NULL, '5 min')") == 1
        assert expires(mon, n(5)) > before[5]


BY_MODE = ["grants", "renewals", "releases", "expiries", "force_releases", "session_ends", "waits", "wait_timeouts"]


def exclusive_counts(conn):
    return dict(zip(BY_MODE, conn.execute(f"SELECT {', '.join(BY_MODE)} FROM fenced_lock_stats_by_mode "
                                          "WHERE mode = 'exclusive'").fetchone()))


def test_each_lease_of_the_several_names_calls_counts_and_notifies_like_a_single_one(preload_cluster):
    """docs/reference.md: each lease of acquire_all is an ordinary exclusive
    lease, with its own counters; release_all and renew_all count per lease;
    a grant or release sends one NOTIFY per lease, a renewal none, and a call
    that timed out (rolled back) counts its wait and sends nothing."""
    c = preload_cluster
    dbname = c.create_database("it_several_names_counts")
    c.sql(f'ALTER DATABASE "{dbname}" SET fenced_lock.notify = on')
    names = ["cnt:c", "cnt:a", "cnt:b"]
    try:
        with c.connect(dbname) as mon, c.connect(dbname) as lc, c.connect(dbname) as a, c.connect(dbname) as b:
            listener = Listener(lc)
            listener.until_marker(mon)
            before = exclusive_counts(mon)
            tokens = acquire_all(a, names, "1 min", "1 s", "h")
            assert one(a, "SELECT fenced_lock_renew_all('h', '2 min')") == 3
            assert release_all(a, names, tokens) == 3
            assert release_all(a, names, tokens) == 0
            held = try_acquire(b, "cnt:b", "1 min", "x")
            assert sqlstate(a, ACQUIRE_ALL, (names, "1 min", "200 ms", "h", False)) == "55P03"
            assert try_all(a, names, "1 min", "h") is None
            assert release(b, "cnt:b", held) is True
            after = exclusive_counts(mon)
            delta = {k: after[k] - before[k] for k in BY_MODE}
            assert delta == dict(grants=4, renewals=3, releases=4, expiries=0, force_releases=0, session_ends=0,
                                 waits=1, wait_timeouts=1), delta
            seen = [(p["name"], p["event"], p["token"], p["mode"]) for p in listener.until_marker(mon)]
            by_name = dict(zip(names, tokens))
            grants = [(n, "grant", by_name[n], "exclusive") for n in sorted(names)]  # taken in byte order
            releases = sorted((n, "release", by_name[n], "exclusive") for n in names)
            assert seen[:3] == grants, seen
            assert sorted(seen[3:6]) == releases, seen
            assert seen[6:] == [("cnt:b", "grant", held, "exclusive"), ("cnt:b", "release", held, "exclusive")], seen
    finally:
        c.sql(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
