"""docs/design.md, "Waiting": fenced_lock_acquire waits asleep, FIFO, is woken
at release or expiry, responds to cancel / statement_timeout / lock_timeout
(with or without a `wait` bound) leaving no trace, works inside explicit
transactions at every isolation level, and needs no shared_preload_libraries.

Every test runs twice: on the session cluster (library loaded on first use)
and on the preload_cluster fixture (shared_preload_libraries = 'fenced_lock').

"Visibly waiting" means: the backend holds (head waiter) or awaits (queued
behind the head) the name's queue-space advisory lock in pg_locks
(classid = 0x464C0002).
"""

import time
from dataclasses import dataclass

import psycopg
import pytest

from harness.cluster import Cluster

import it_support
from it_support import start, wait_until

DB = "it_waiting"


@dataclass
class Env:
    cluster: Cluster
    db: str
    preload: bool

    def connect(self, **kw):
        return self.cluster.connect(self.db, **kw)


@pytest.fixture(scope="module", params=["no_preload", "preload"])
def env(request, cluster):
    preload = request.param == "preload"
    c = request.getfixturevalue("preload_cluster") if preload else cluster
    try:
        c.create_database(DB)
        it_support.install_history(c, DB)
        shown = c.sql("SHOW shared_preload_libraries")[0][0]
        assert ("fenced_lock" in shown) == preload
        yield Env(c, DB, preload)
    finally:
        c.sql(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


@pytest.fixture
def mon(env):
    with env.connect() as conn:
        yield conn


def acquire_sql(wait=None):
    if wait is None:
        return "SELECT fenced_lock_acquire(%s, %s::interval)"
    return f"SELECT fenced_lock_acquire(%s, %s::interval, '{wait}'::interval)"


def grab(conn, name, ttl="60 s"):
    token = conn.execute("SELECT fenced_lock_try_acquire(%s, %s::interval)", (name, ttl)).fetchone()[0]
    assert token is not None
    return token


def start_waiter(conn, mon, name, ttl="30 s", wait="30 s", then_release=False):
    """Start fenced_lock_acquire on `conn` in a thread and return once its
    backend is visibly waiting. The call returns the token (after releasing it
    when `then_release`)."""
    def run():
        token = conn.execute(acquire_sql(wait), (name, ttl)).fetchone()[0]
        if then_release:
            assert conn.execute("SELECT fenced_lock_release(%s, %s)", (name, token)).fetchone()[0] is True
        return token
    call = start(run, name=f"waiter-{conn.info.backend_pid}")
    pid = conn.info.backend_pid
    wait_until(lambda: it_support.is_queued(mon, pid) or not call.is_alive(), 10, what=f"backend {pid} to wait")
    assert call.is_alive(), f"backend {pid} did not wait: {call.error or call.result}"
    return call


def grants_of(mon, name):
    return [e for e in it_support.read_history(mon, [name]) if e.op == "grant"]


# -- FIFO -------------------------------------------------------------------------


def test_fifty_waiters_granted_once_each_in_arrival_order(env, mon):
    name = "fifo:fifty"
    holder = env.connect()
    conns = [env.connect() for _ in range(50)]
    try:
        first = grab(holder, name)
        calls = []
        for conn in conns:
            calls.append(start_waiter(conn, mon, name, ttl="30 s", wait="60 s", then_release=True))
        # one head waiter, 49 queued behind it in the lock manager
        locks = it_support.queue_locks(mon, name=name)
        pids = {c.info.backend_pid for c in conns}
        assert sorted(g for p, g in locks if p in pids) == [False] * 49 + [True]
        assert holder.execute("SELECT fenced_lock_release(%s, %s)", (name, first)).fetchone()[0] is True
        tokens = [c.outcome(60) for c in calls]
    finally:
        it_support.cancel_and_close(mon, [holder] + conns)

    # each waiter granted exactly once, in arrival order
    assert len(set(tokens)) == 50
    assert tokens == sorted(tokens) and tokens[0] > first
    grants = grants_of(mon, name)
    assert [g.token for g in sorted(grants, key=lambda g: (g.at, g.id))] == [first] + tokens
    # no two leases overlapped
    checked = it_support.check_history(it_support.read_history(mon, [name]))
    assert [lease.token for lease in checked.leases[name]] == [first] + tokens
    assert checked.releases == 51
    assert mon.execute("SELECT count(*) FROM fenced_lock_internal.granted_leases WHERE name = %s", (name,)).fetchone()[0] == 0


# -- ending a wait ------------------------------------------------------------------

POSITIONS = ["head", "queued"]


def interrupted_wait(env, mon, name, position, prepare, wait, interrupt, expected, bound):
    """A holder holds `name`; (optionally a head waiter, then) the victim, then a
    next waiter line up. `prepare(victim_conn)` runs first; `interrupt(pid)`
    ends the victim's wait. The victim must fail with `expected` within `bound`
    seconds of the interrupt and leave no trace, and the queue must go on."""
    holder, victim, nxt = env.connect(), env.connect(), env.connect()
    head = env.connect() if position == "queued" else None
    try:
        first = grab(holder, name)
        head_call = start_waiter(head, mon, name, ttl="5 s", then_release=True) if head else None
        prepare(victim)
        pid = victim.info.backend_pid
        victim_call = start_waiter(victim, mon, name, ttl="5 s", wait=wait)
        # the victim is where the test says: the head sleeps holding the queue
        # lock, a queued waiter awaits it in the lock manager
        assert it_support.queue_locks(mon, pid) == [(pid, position == "head")]
        next_call = start_waiter(nxt, mon, name, ttl="5 s", then_release=True)

        t0 = time.monotonic()
        interrupt(pid)
        with pytest.raises(psycopg.Error) as err:
            victim_call.outcome(bound + 2)
        assert err.value.sqlstate == expected, err.value
        assert victim_call.finished_at - t0 < bound, f"wait ended {victim_call.finished_at - t0:.2f} s after"

        # no trace: no lease of the victim, no fenced_lock lock held or awaited
        # by its backend, no open transaction; the connection still works
        assert it_support.fenced_locks_of(mon, pid) == []
        assert mon.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] == "idle"
        assert mon.execute("SELECT token FROM fenced_lock_internal.granted_leases WHERE name = %s",
                           (name,)).fetchall() == [(first,)]
        assert victim.execute("SELECT 1").fetchone()[0] == 1

        # the waiters behind it are still served, in order
        released = time.monotonic()
        assert holder.execute("SELECT fenced_lock_release(%s, %s)", (name, first)).fetchone()[0] is True
        tokens = []
        if head_call:
            tokens.append(head_call.outcome(10))
        tokens.append(next_call.outcome(10))
        assert next_call.finished_at - released < 5
        assert tokens == sorted(tokens) and tokens[0] > first
        assert [g.token for g in grants_of(mon, name)] == [first] + tokens
    finally:
        it_support.cancel_and_close(mon, [holder, victim, nxt, head])


AT_ONCE = 2.0  # seconds: generous bound for "ends at once" (it takes milliseconds)


@pytest.mark.parametrize("position", POSITIONS)
def test_cancel_ends_a_wait_at_once_and_leaves_no_trace(env, mon, position):
    def cancel(pid):
        assert mon.execute("SELECT pg_cancel_backend(%s)", (pid,)).fetchone()[0] is True
    interrupted_wait(env, mon, f"cancel:{position}", position, prepare=lambda c: None, wait=None,
                     interrupt=cancel, expected="57014", bound=AT_ONCE)


@pytest.mark.parametrize("position", POSITIONS)
def test_cancel_ends_a_bounded_wait_at_once_and_leaves_no_trace(env, mon, position):
    """As above, with a `wait` bound: the queued waiter then waits for the
    queue lock inside the timeout subtransaction (docs/design.md, "Waiting"),
    which a cancel must roll back too: the session is left idle and usable,
    not in a failed transaction it never began (25P02)."""
    def cancel(pid):
        assert mon.execute("SELECT pg_cancel_backend(%s)", (pid,)).fetchone()[0] is True
    interrupted_wait(env, mon, f"cancel_bounded:{position}", position, prepare=lambda c: None, wait="30 s",
                     interrupt=cancel, expected="57014", bound=AT_ONCE)


@pytest.mark.parametrize("position", POSITIONS)
def test_statement_timeout_ends_a_bounded_wait_at_once_and_leaves_no_trace(env, mon, position):
    interrupted_wait(env, mon, f"statement_timeout_bounded:{position}", position,
                     prepare=lambda c: c.execute("SET statement_timeout = '1s'"), wait="30 s",
                     interrupt=lambda pid: None, expected="57014", bound=1 + AT_ONCE)


def test_cancel_of_a_head_waiting_for_an_in_flight_transition_leaves_no_trace(env, mon):
    """The head waiter of a bounded wait blocks on the name lock (inside the
    timeout subtransaction) while the holder's renew is uncommitted. A cancel
    then ends the wait (57014) and leaves the session idle and usable; the
    holder's transaction is untouched."""
    name = "cancel_bounded:head_on_name_lock"
    with env.connect() as holder, env.connect() as victim:
        token = grab(holder, name)
        holder.execute("BEGIN")
        assert holder.execute("SELECT fenced_lock_renew(%s, %s, '1 min')", (name, token)).fetchone()[0] is True
        pid = victim.info.backend_pid
        call = start_waiter(victim, mon, name, ttl="5 s", wait="30 s")
        wait_until(lambda: mon.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                       (pid,)).fetchone()[0] == "Lock", 10, what="the head to wait for the name lock")
        t0 = time.monotonic()
        assert mon.execute("SELECT pg_cancel_backend(%s)", (pid,)).fetchone()[0] is True
        with pytest.raises(psycopg.Error) as err:
            call.outcome(AT_ONCE + 2)
        assert err.value.sqlstate == "57014", err.value
        assert call.finished_at - t0 < AT_ONCE
        assert mon.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] == "idle"
        assert it_support.fenced_locks_of(mon, pid) == []
        assert victim.execute("SELECT 1").fetchone()[0] == 1
        holder.execute("COMMIT")
        assert mon.execute("SELECT token FROM fenced_lock_internal.granted_leases WHERE name = %s",
                           (name,)).fetchall() == [(token,)]


@pytest.mark.parametrize("position", POSITIONS)
def test_statement_timeout_ends_a_wait_at_once_and_leaves_no_trace(env, mon, position):
    interrupted_wait(env, mon, f"statement_timeout:{position}", position,
                     prepare=lambda c: c.execute("SET statement_timeout = '1s'"), wait=None,
                     interrupt=lambda pid: None, expected="57014", bound=1 + AT_ONCE)


@pytest.mark.parametrize("position", POSITIONS)
def test_lock_timeout_ends_a_wait_at_once_and_leaves_no_trace(env, mon, position):
    interrupted_wait(env, mon, f"lock_timeout:{position}", position,
                     prepare=lambda c: c.execute("SET lock_timeout = '1s'"), wait=None,
                     interrupt=lambda pid: None, expected="55P03", bound=1 + AT_ONCE)


@pytest.mark.parametrize("position", POSITIONS)
def test_wait_interval_expiry_raises_55P03_and_leaves_no_trace(env, mon, position):
    interrupted_wait(env, mon, f"wait_expiry:{position}", position, prepare=lambda c: None,
                     wait="1 s", interrupt=lambda pid: None, expected="55P03", bound=1 + AT_ONCE)


def test_wait_interval_is_waited_in_full_before_55P03(env, mon):
    name = "wait_expiry:full"
    with env.connect() as holder, env.connect() as waiter:
        grab(holder, name)
        t0 = time.monotonic()
        with pytest.raises(psycopg.Error) as err:
            waiter.execute(acquire_sql("700 ms"), (name, "5 s"))
        assert err.value.sqlstate == "55P03"
        assert time.monotonic() - t0 >= 0.65
        assert name in str(err.value)  # the error names the lock


# -- expiry ------------------------------------------------------------------------


def test_waiter_is_granted_at_the_expiry_instant_of_the_holders_lease(env, mon):
    """Nobody releases: the holder's lease expires, the head waiter gets it
    right then (not at some later polling tick); the next head waits for that
    lease's expiry in turn."""
    name = "expiry:instant"
    with env.connect() as holder, env.connect() as w1, env.connect() as w2:
        first = grab(holder, name, ttl="1500 ms")
        c1 = start_waiter(w1, mon, name, ttl="1200 ms", wait="10 s")
        c2 = start_waiter(w2, mon, name, ttl="1 s", wait="10 s")
        t1, t2 = c1.outcome(10), c2.outcome(10)
    grants = sorted(grants_of(mon, name), key=lambda g: g.token)
    assert [g.token for g in grants] == [first, t1, t2]
    for prev, nxt in zip(grants, grants[1:]):
        late = (nxt.acquired_at - prev.new_expires_at).total_seconds()
        print(f"lease {nxt.token} granted {late * 1000:.1f} ms after lease {prev.token} expired")
        assert 0 <= late < 0.5, f"lease {nxt.token} granted {late:.3f} s after lease {prev.token} expired"
    it_support.check_history(it_support.read_history(mon, [name]))


# -- explicit transactions -----------------------------------------------------------


@pytest.mark.parametrize("isolation", ["read committed", "repeatable read", "serializable"])
def test_waiting_inside_explicit_transaction_never_grants_a_second_live_lease(env, mon, isolation):
    """The waiter's transaction (and snapshot) starts before the holder's grant.
    After the release it must be granted (or refuse with a clear error) at once,
    and nobody else gets a live lease before or after its commit: a rival try
    returns NULL at once (it never waits, docs/design.md, "Lock protocol" L3),
    and a rival fenced_lock_acquire waits for the waiter's transaction, then
    for its lease, and is granted only after the waiter releases."""
    name = f"txn:{isolation}"
    with env.connect() as holder, env.connect() as other, env.connect() as rival, env.connect() as waiter:
        waiter.execute(f"BEGIN ISOLATION LEVEL {isolation.upper()}")
        assert waiter.execute("SHOW transaction_isolation").fetchone()[0] == isolation
        waiter.execute("SELECT count(*) FROM pg_class")  # take the snapshot now
        first = grab(holder, name)
        call = start_waiter(waiter, mon, name, ttl="30 s", wait="20 s")
        released = time.monotonic()
        assert holder.execute("SELECT fenced_lock_release(%s, %s)", (name, first)).fetchone()[0] is True
        try:
            token = call.outcome(20)
        except psycopg.Error as e:
            # refusing is allowed, waiting until `wait` runs out is not
            assert e.sqlstate != "55P03", e
            assert call.finished_at - released < 5
            waiter.execute("ROLLBACK")
            token = None
        if token is not None:
            assert call.finished_at - released < 5
            # The grant is not committed yet (the name lock is held to commit):
            # a try returns NULL at once instead of waiting ...
            t0 = time.monotonic()
            assert other.execute("SELECT fenced_lock_try_acquire(%s, '30 s')", (name,)).fetchone()[0] is None
            print(f"{isolation}: try during the uncommitted grant returned NULL in "
                  f"{(time.monotonic() - t0) * 1000:.1f} ms")
            assert time.monotonic() - t0 < 1.0
            # ... while an acquire waits: for the transaction, then for the lease.
            rival_call = start(lambda: rival.execute(
                "SELECT fenced_lock_acquire(%s, '30 s', '20 s')", (name,)).fetchone()[0])
            wait_until(lambda: it_support.is_queued(mon, rival.info.backend_pid), 10, what="the rival to queue")
            waiter.execute("COMMIT")
            rows = mon.execute("SELECT token, live FROM fenced_lock_leases WHERE name = %s", (name,)).fetchall()
            assert rows == [(token, True)]
            assert token > first
            time.sleep(0.3)
            assert rival_call.is_alive(), "a second live lease was granted"
            assert other.execute("SELECT fenced_lock_try_acquire(%s, '30 s')", (name,)).fetchone()[0] is None
            assert waiter.execute("SELECT fenced_lock_release(%s, %s)", (name, token)).fetchone()[0] is True
            rival_token = rival_call.outcome(10)
            assert rival_token > token
            assert rival.execute("SELECT fenced_lock_release(%s, %s)", (name, rival_token)).fetchone()[0] is True
    it_support.check_history(it_support.read_history(mon, [name]))


# -- CPU -------------------------------------------------------------------------------


def test_hundred_waiters_use_almost_no_cpu(env, mon):
    """Not a benchmark: a "no busy loop" check with a generous bound."""
    name = "cpu:hundred"
    holder = env.connect()
    conns = []
    try:
        grab(holder, name)
        conns = [env.connect() for _ in range(100)]
        calls = [start(lambda c=c: c.execute(acquire_sql("60 s"), (name, "5 s")).fetchone()[0]) for c in conns]
        pids = [c.info.backend_pid for c in conns]
        wait_until(lambda: len(it_support.queue_locks(mon, name=name)) == 100, 20, interval=0.05,
                   what="100 waiters to queue")
        time.sleep(1.5)  # past deadlock_timeout: each queued waiter's one deadlock check is done
        before = sum(it_support.cpu_seconds(p) for p in pids)
        time.sleep(5)
        used = sum(it_support.cpu_seconds(p) for p in pids) - before
        print(f"100 waiters used {used:.3f} s of CPU in 5 s")
        assert len(it_support.queue_locks(mon, name=name)) == 100  # all still waiting
        assert used < 1.0, f"100 waiters used {used:.2f} s of CPU in 5 s"
        for p in pids:
            mon.execute("SELECT pg_cancel_backend(%s)", (p,))
        for c in calls:
            with pytest.raises(psycopg.Error) as err:
                c.outcome(10)
            assert err.value.sqlstate == "57014"
    finally:
        it_support.cancel_and_close(mon, [holder] + conns)
