"""docs/design.md, "Waiting" (a gone waiter is never served): a waiter whose
client process is killed with SIGKILL while it waits in fenced_lock_acquire
never gets a lease. The head waiter checks its client before each attempt (and
at least every 500 ms) and leaves ("connection to client lost"); a waiter
queued behind the head leaves when it reaches the head. Either way the next
live waiter is granted right after the release (asserted < 2 s, printed;
target < 1 s), and the history shows the live waiter's grant right after the
holder's lease: no lease for the dead waiter ever existed.

Negative control: a live first waiter (the same kind of client process, not
killed) is served first, FIFO.
"""

import signal
import time

import pytest

import it_support
from harness.clientproc import WAIT
from it_support import elapsed_ms, one, start, wait_until

GRANT_BOUND_S = 2.0


@pytest.fixture
def mon(cluster, db):
    with cluster.connect(db) as conn:
        yield conn


def tokens_of(mon, name):
    return [r[0] for r in mon.execute("SELECT token FROM fenced_lock_history WHERE name = %s ORDER BY token",
                                      (name,)).fetchall()]


def queued(mon, pid):
    return it_support.is_queued(mon, pid)


def live_waiter(conn, mon, name, then_release=False):
    def run():
        token = one(conn, "SELECT fenced_lock_acquire(%s, '30 s', '20 s')", (name,))
        granted = time.monotonic()
        if then_release:
            run.released = time.monotonic()
            assert one(conn, "SELECT fenced_lock_release(%s, %s)", (name, token)) is True
        return token, granted
    call = start(run, name=f"live-{conn.info.backend_pid}")
    call.run_fn = run
    wait_until(lambda: queued(mon, conn.info.backend_pid), 10, what="a live waiter to queue")
    return call


def process_waiter(children, cluster, db, mon, name, **args):
    p = children.start(cluster.dsn(db), WAIT, name=name, ttl="30 s", wait="20 s", **args)
    p.expect("waiting", 10)
    wait_until(lambda: queued(mon, p.backend_pid), 10, what="the client process to queue")
    return p


def backend_gone(mon, pid):
    return mon.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] == 0


@pytest.mark.parametrize("position", ["head", "queued"])
def test_killed_waiter_is_never_served_and_the_next_live_waiter_is(cluster, db, mon, children, position):
    name = f"gone:{position}"
    with cluster.connect(db) as holder, cluster.connect(db) as l1, cluster.connect(db) as l2:
        first = one(holder, "SELECT fenced_lock_try_acquire(%s, '60 s')", (name,))
        head = live_waiter(l1, mon, name, then_release=True) if position == "queued" else None
        dead = process_waiter(children, cluster, db, mon, name)
        live = live_waiter(l2, mon, name)
        assert it_support.queue_locks(mon, dead.backend_pid) == [(dead.backend_pid, position == "head")]
        positions = dict(mon.execute("SELECT pid, position FROM fenced_lock_waiters WHERE name = %s",
                                     (name,)).fetchall())
        assert positions[dead.backend_pid] == (1 if position == "head" else 2)

        dead.kill(signal.SIGKILL)
        # Release right away: a head waiter is woken by it and must notice
        # first that its client is gone.
        released = time.monotonic()
        assert one(holder, "SELECT fenced_lock_release(%s, %s)", (name, first)) is True
        if head is not None:
            head_token, head_granted = head.outcome(10)
            released = head.run_fn.released  # the head releases its lease; the dead one is in line before l2
        token, granted = live.outcome(GRANT_BOUND_S + 10)
        ms = elapsed_ms(released, granted)
        print(f"dead waiter {position}: next live waiter granted {ms:.1f} ms after the release")
        assert ms < GRANT_BOUND_S * 1000

        # The dead waiter got nothing: the grants are the holder's, (the live
        # head's,) then the live waiter's, in that order, and nothing else.
        expected = [first] + ([head_token] if head is not None else []) + [token]
        assert tokens_of(mon, name) == expected
        assert token > expected[-2]
        wait_until(lambda: backend_gone(mon, dead.backend_pid), 5, what="the dead waiter's backend to exit")
        assert mon.execute("SELECT pid FROM fenced_lock_waiters WHERE name = %s", (name,)).fetchall() == []
        assert one(l2, "SELECT fenced_lock_release(%s, %s)", (name, token)) is True


def test_killed_head_waiter_leaves_the_line_without_a_release(cluster, db, mon, children):
    """The head's periodic client check (at least every 500 ms): with nobody
    releasing, the killed head still leaves the line within about a second,
    and the live waiter behind it becomes the head."""
    name = "gone:periodic"
    with cluster.connect(db) as holder, cluster.connect(db) as l2:
        first = one(holder, "SELECT fenced_lock_try_acquire(%s, '60 s')", (name,))
        dead = process_waiter(children, cluster, db, mon, name)
        live = live_waiter(l2, mon, name)
        killed = dead.kill(signal.SIGKILL)
        wait_until(lambda: backend_gone(mon, dead.backend_pid), 5, interval=0.01,
                   what="the dead head waiter to leave")
        ms = elapsed_ms(killed)
        print(f"dead head waiter left the line {ms:.1f} ms after its client was killed")
        assert ms < 2500
        wait_until(lambda: it_support.queue_locks(mon, l2.info.backend_pid) == [(l2.info.backend_pid, True)], 5,
                   what="the live waiter to become the head")
        assert mon.execute("SELECT pid, position FROM fenced_lock_waiters WHERE name = %s", (name,)).fetchall() == \
            [(l2.info.backend_pid, 1)]
        assert one(holder, "SELECT fenced_lock_release(%s, %s)", (name, first)) is True
        token, _ = live.outcome(10)
        assert tokens_of(mon, name) == [first, token]
        assert one(l2, "SELECT fenced_lock_release(%s, %s)", (name, token)) is True


def test_live_first_waiter_is_served_first(cluster, db, mon, children):
    """Negative control: the same line, nobody killed: the client process at
    the head is served first, the waiter behind it only after it releases."""
    name = "gone:control"
    with cluster.connect(db) as holder, cluster.connect(db) as l2:
        first = one(holder, "SELECT fenced_lock_try_acquire(%s, '60 s')", (name,))
        proc = process_waiter(children, cluster, db, mon, name)
        live = live_waiter(l2, mon, name)
        released = time.monotonic()
        assert one(holder, "SELECT fenced_lock_release(%s, %s)", (name, first)) is True
        got = proc.expect("granted", 10)
        print(f"live head waiter (a client process) granted {elapsed_ms(released, got['t']):.1f} ms after the release")
        assert got["token"] > first
        time.sleep(0.3)
        assert live.is_alive(), "the second waiter was served while the first held the lease"
        assert tokens_of(mon, name) == [first, got["token"]]
        # the first waiter's client now goes away holding its (not session-bound)
        # lease: the second waiter waits for that lease, which is released here
        assert one(mon, "SELECT fenced_lock_force_release(%s)", (name,)) is True
        token, _ = live.outcome(10)
        assert tokens_of(mon, name) == [first, got["token"], token]
        assert one(l2, "SELECT fenced_lock_release(%s, %s)", (name, token)) is True
