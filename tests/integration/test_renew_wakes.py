"""docs/design.md, "Waiting" step 4 and "Transitions" (renew): a renew that
moves the lease's expiry earlier wakes the head waiter, which is then granted
at the new expiry instant (measured on the server's clock from the history:
the waiter's acquired_at minus the shortened lease's expires_at; asserted
< 250 ms, printed; it takes milliseconds), not at the old expiry, nor at the
head's next periodic look. Negative
control: a renew that moves the expiry later does not let the waiter in
before the new expiry.
"""

import time

import pytest

import it_support
from it_support import one, start, wait_until


@pytest.fixture
def mon(cluster, db):
    with cluster.connect(db) as conn:
        yield conn


def start_waiter(conn, mon, name):
    call = start(lambda: one(conn, "SELECT fenced_lock_acquire(%s, '30 s', '20 s')", (name,)))
    wait_until(lambda: it_support.queue_locks(mon, conn.info.backend_pid) == [(conn.info.backend_pid, True)], 10,
               what="the waiter to be the head")
    return call


def history(mon, token):
    return mon.execute("SELECT acquired_at, expires_at, ended_by FROM fenced_lock_history WHERE token = %s",
                       (token,)).fetchone()


# Without the wake, the head would see the new expiry only when it looks again,
# up to 500 ms after it went to sleep (docs/design.md, "Waiting" step 3). The
# renew comes right after the waiter became the head, so a head that was not
# woken would be granted some 400-480 ms late; a woken one is granted within a
# few ms. WOKEN_BOUND_MS lies between, generously.
WOKEN_BOUND_MS = 250


@pytest.mark.parametrize("new_ttl", ["20 ms", "100 ms"])
def test_renew_that_shortens_the_lease_hands_over_at_the_new_expiry(cluster, db, mon, new_ttl):
    name = f"renew:shorten:{new_ttl}"
    with cluster.connect(db) as holder, cluster.connect(db) as w:
        token = one(holder, "SELECT fenced_lock_try_acquire(%s, '30 s')", (name,))
        call = start_waiter(w, mon, name)
        t0 = time.monotonic()
        assert one(holder, "SELECT fenced_lock_renew(%s, %s, %s::interval)", (name, token, new_ttl)) is True
        got = call.outcome(10)
        waited = time.monotonic() - t0
        assert got > token
        _, new_expiry, ended_by = history(mon, token)
        acquired_at, _, _ = history(mon, got)
        late_ms = (acquired_at - new_expiry).total_seconds() * 1000
        print(f"renew to {new_ttl}: waiter granted {late_ms:.1f} ms after the new expiry "
              f"({waited * 1000:.0f} ms after the renew; the old expiry was 30 s away)")
        assert ended_by == "expiry"
        assert 0 <= late_ms < WOKEN_BOUND_MS, f"granted {late_ms:.0f} ms after the new expiry: the head was not woken"
        assert waited < 5
        assert one(w, "SELECT fenced_lock_release(%s, %s)", (name, got)) is True


def test_renew_that_lengthens_the_lease_keeps_the_waiter_out(cluster, db, mon):
    """Negative control: the lease had 1.5 s left and is renewed for 3 s: the
    waiter is still waiting after the old expiry, and is granted only at the
    new one."""
    name = "renew:lengthen"
    with cluster.connect(db) as holder, cluster.connect(db) as w:
        token = one(holder, "SELECT fenced_lock_try_acquire(%s, '1500 ms')", (name,))
        old_expiry = history(mon, token)[1]
        call = start_waiter(w, mon, name)
        assert one(holder, "SELECT fenced_lock_renew(%s, %s, '3 s')", (name, token)) is True
        wait_until(lambda: one(mon, "SELECT clock_timestamp() > %s + interval '300 ms'", (old_expiry,)), 5,
                   interval=0.02, what="the old expiry to pass")
        assert call.is_alive(), "the waiter was granted at the old expiry of a lengthened lease"
        assert one(mon, "SELECT token FROM fenced_lock_leases WHERE name = %s AND live", (name,)) == token
        got = call.outcome(10)
        _, new_expiry, _ = history(mon, token)
        acquired_at = history(mon, got)[0]
        assert new_expiry > old_expiry
        assert acquired_at >= new_expiry
        print(f"renew to 3 s: waiter granted {(acquired_at - new_expiry).total_seconds() * 1000:.1f} ms after "
              "the new expiry")
        assert one(w, "SELECT fenced_lock_release(%s, %s)", (name, got)) is True
