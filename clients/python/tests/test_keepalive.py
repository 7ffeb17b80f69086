"""Promises of the keepalive (clients/README.md, "Keepalive"), shown on a real
server: it keeps a lease alive through a section three times its ttl, on a
connection of its own named fenced_lock_keepalive; a terminated keepalive
connection is replaced and the lease stays live; a session-bound lease whose
own connection is terminated is lost at the next renew; a renew that says
false, or a deadline that passes, signals lost exactly once; no renew is
sent after a release, even with one in flight when release is called; a
guarded transaction three ttls long keeps its lease; a renew held up by the
holder's own transaction does not hold up its release."""

import gc
import threading
import time

import psycopg
import pytest

from conftest import history, keepalive_pids, statements_sent, traced, wait_until
from fenced_lock import Locker, StaleToken


class Events:
    """Counts the keepalive's callbacks, with when they came."""

    def __init__(self):
        self.renewed, self.lost = [], []
        self.lost_event = threading.Event()

    def on_renewed(self, lease):
        self.renewed.append(time.monotonic())

    def on_lost(self, lease):
        self.lost.append(time.monotonic())
        self.lost_event.set()


def test_keepalive_keeps_a_critical_section_of_three_times_the_ttl_alive(dsn, admin, doc):
    row, lock = doc
    ev = Events()
    ttl = 1.0
    with Locker(dsn).acquire(lock, ttl=ttl, on_renewed=ev.on_renewed, on_lost=ev.on_lost) as lease:
        started = time.monotonic()
        time.sleep(3 * ttl)
        lease.conn.execute("UPDATE docs SET fence_token = %s WHERE id = %s", (lease.token, row))
        assert time.monotonic() - started >= 3 * ttl
        assert not lease.lost.is_set() and ev.lost == []
        assert admin.execute("SELECT fenced_lock_validate(%s, %s)", (lock, lease.token)).fetchone()[0]
    print(f"renews in {3 * ttl:.1f} s at interval {ttl / 3:.2f} s: {len(ev.renewed)}")
    assert len(ev.renewed) >= 4
    assert admin.execute("SELECT fence_token FROM docs WHERE id = %s", (row,)).fetchone()[0] == lease.token
    assert [h["ended_by"] for h in history(admin, lock)][-1] == "release"


def test_without_keepalive_the_same_section_loses_the_lease_and_the_write_is_refused(dsn, admin, doc):
    """The control: the same section with keepalive=False."""
    row, lock = doc
    ev = Events()
    ttl = 1.0
    started = time.monotonic()
    with Locker(dsn).acquire(lock, ttl=ttl, keepalive=False, on_lost=ev.on_lost) as lease:
        assert ev.lost_event.wait(3 * ttl), "not lost within 3 ttls without a renew"
        assert lease.lost.is_set() and ev.lost[0] - started >= ttl and len(ev.lost) == 1
        # The client's deadline counts from the send, the server's expiry
        # from the grant, a moment later.
        wait_until(lambda: not admin.execute("SELECT fenced_lock_validate(%s, %s)", (lock, lease.token)).fetchone()[0],
                   2, "the lease to expire on the server")
        with pytest.raises(StaleToken):
            lease.conn.execute("UPDATE docs SET fence_token = %s WHERE id = %s", (lease.token, row))


def test_keepalive_runs_on_its_own_connection_named_fenced_lock_keepalive(dsn, admin, name):
    before = set(keepalive_pids(admin))
    with Locker(dsn).acquire(name, ttl=30) as lease:
        # Opened when the lease is granted, not at the first renew (10 s on).
        mine = wait_until(lambda: set(keepalive_pids(admin)) - before, 3, "the keepalive's connection")
        assert len(mine) == 1
        assert lease.conn.info.backend_pid not in mine


def test_terminated_keepalive_connection_is_replaced_and_the_lease_stays_live(dsn, admin, name):
    ev = Events()
    ttl = 1.2
    before = set(keepalive_pids(admin))
    with Locker(dsn).acquire(name, ttl=ttl, on_renewed=ev.on_renewed, on_lost=ev.on_lost) as lease:
        (old,) = wait_until(lambda: set(keepalive_pids(admin)) - before, 5, "the keepalive's connection")
        wait_until(lambda: ev.renewed, 5, "a first renew")
        assert admin.execute("SELECT pg_terminate_backend(%s)", (old,)).fetchone()[0]
        terminated = time.monotonic()
        # Past two ttls after the kill: only renewals on a new connection can
        # have kept it live.
        time.sleep(2 * ttl)
        assert not lease.lost.is_set(), lease.lost_reason
        assert admin.execute("SELECT fenced_lock_validate(%s, %s)", (name, lease.token)).fetchone()[0]
        now = set(keepalive_pids(admin)) - before
        assert len(now) == 1 and old not in now
        after_kill = [t for t in ev.renewed if t > terminated]
        print(f"renews after the kill: {len(after_kill)}, first {after_kill[0] - terminated:.2f} s after it")
        assert len(after_kill) >= 3
    assert ev.lost == []


def test_session_bound_lease_whose_connection_is_terminated_is_lost_at_the_next_renew(dsn, admin, name):
    ev = Events()
    ttl = 3.0
    lease = Locker(dsn).acquire(name, ttl=ttl, session_bound=True, on_lost=ev.on_lost)
    try:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (lease.conn.info.backend_pid,)).fetchone()[0]
        terminated = time.monotonic()
        assert ev.lost_event.wait(lease.interval + 3), "no lost signal"
        print(f"lost {ev.lost[0] - terminated:.2f} s after the session ended (interval {lease.interval:.2f} s)")
        assert ev.lost[0] - terminated < lease.interval + 2
        assert "renew returned false" in lease.lost_reason
        assert not admin.execute("SELECT fenced_lock_validate(%s, %s)", (name, lease.token)).fetchone()[0]
        # The ending session records its end; nothing else touched it.
        wait_until(lambda: history(admin, name) and history(admin, name)[-1]["ended_by"], 5, "the history row")
        assert history(admin, name)[-1]["ended_by"] == "session_end"
    finally:
        assert lease.release() is False
        lease.close()


def test_renew_saying_false_signals_lost_once_and_the_lease_is_never_released(dsn, admin, name):
    ev = Events()
    lease = Locker(dsn).acquire(name, ttl=1.5, on_lost=ev.on_lost)
    assert admin.execute("SELECT fenced_lock_force_release(%s)", (name,)).fetchone()[0]
    forced = time.monotonic()
    assert lease.lost.wait(lease.interval + 2)
    assert time.monotonic() - forced < lease.interval + 2
    time.sleep(lease.interval * 3)  # any further loop of the keepalive would show here
    assert len(ev.lost) == 1
    assert "renew returned false" in lease.lost_reason
    with traced(lease.conn) as lines:
        assert lease.release() is False
        lease.close()
        assert statements_sent(lines) == []
    assert [h["ended_by"] for h in history(admin, name)] == ["force_release"]


def test_deadline_passing_without_a_renew_signals_lost_at_the_deadline(dsn, name):
    """With keepalive off nothing renews: the watchdog signals at the
    deadline, never before (the server's lease is live until then)."""
    ev = Events()
    ttl = 0.8
    started = time.monotonic()
    lease = Locker(dsn).acquire(name, ttl=ttl, keepalive=False, on_lost=ev.on_lost)
    try:
        assert ev.lost_event.wait(ttl + 2)
        assert ev.lost[0] - started >= ttl
        print(f"lost {ev.lost[0] - started - ttl:.3f} s after the deadline")
        assert "deadline" in lease.lost_reason
    finally:
        lease.close()


def test_guarded_transaction_open_for_three_ttls_keeps_its_lease_and_its_commit_is_accepted(dsn, admin, doc):
    """A renew does not wait for the holder's guarded writes (the guard and
    a renew take the lease's lock in modes that do not conflict), so the
    keepalive renews all through a guarded transaction three ttls long, and
    the transaction's last write, and its commit, are accepted."""
    row, lock = doc
    ev = Events()
    ttl = 1.0
    with Locker(dsn).acquire(lock, ttl=ttl, on_renewed=ev.on_renewed, on_lost=ev.on_lost) as lease:
        with lease.conn.transaction():
            lease.conn.execute("UPDATE docs SET fence_token = %s WHERE id = %s", (lease.token, row))
            opened = time.monotonic()
            time.sleep(3 * ttl)
            lease.conn.execute("UPDATE docs SET fence_token = %s WHERE id = %s", (lease.token, row))
            during = [t for t in ev.renewed if t > opened]
            assert admin.execute("SELECT fenced_lock_validate(%s, %s)", (lock, lease.token)).fetchone()[0]
        assert not lease.lost.is_set() and ev.lost == [], lease.lost_reason
    print(f"renews while the guarded transaction was open ({3 * ttl:.1f} s): {len(during)}")
    assert len(during) >= 3  # at least one a ttl, or the lease would have expired
    assert admin.execute("SELECT fence_token FROM docs WHERE id = %s", (row,)).fetchone()[0] == lease.token
    assert [h["ended_by"] for h in history(admin, lock)][-1] == "release"


def test_no_renew_is_sent_after_the_release(dsn, spy, name):
    conninfo, calls = spy
    before = set(keepalive_pids_of(dsn))
    lease = Locker(conninfo(), keepalive_interval=0.05).acquire(name, ttl=3)
    wait_until(lambda: sum(c["fn"] == "renew" for c in calls(name)) >= 5, 10, "five renewals")
    mine = set(keepalive_pids_of(dsn)) - before
    assert len(mine) == 1
    assert lease.release() is True
    released = time.monotonic()
    # The backend leaves pg_stat_activity once its process has exited, a
    # moment after the client closed the connection (before release returned).
    wait_until(lambda: not (set(keepalive_pids_of(dsn)) & mine), 2, "the keepalive's backend to go")
    gone = time.monotonic() - released
    time.sleep(0.5)  # ten intervals: a keepalive still running would renew here
    recorded = calls(name)
    (rel,) = [c for c in recorded if c["fn"] == "release"]
    renews = [c for c in recorded if c["fn"] == "renew"]
    print(f"{len(renews)} renewals, the keepalive's backend gone {gone * 1000:.0f} ms after release returned")
    assert all(r["ended"] <= rel["started"] for r in renews)
    assert all(r["application_name"] == "fenced_lock_keepalive" for r in renews)
    assert rel["result"] is True


def test_a_renew_in_flight_when_release_is_called_finishes_before_the_release_is_sent(dsn, admin, spy, name):
    conninfo, calls = spy
    delay = 0.8
    lease = Locker(conninfo(renew_delay=delay), keepalive_interval=0.3).acquire(name, ttl=5)
    in_flight = wait_until(lambda: admin.execute(
        "SELECT query_start FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' "
        "AND application_name = 'fenced_lock_keepalive' AND query LIKE '%%fenced_lock_renew%%'").fetchone(),
        10, "a renew in flight")
    called = time.monotonic()
    assert lease.release() is True
    took = time.monotonic() - called
    recorded = calls(name)
    (rel,) = [c for c in recorded if c["fn"] == "release"]
    renews = [c for c in recorded if c["fn"] == "renew"]
    print(f"release waited {took:.2f} s for the renew in flight ({delay} s long)")
    assert renews, "the renew in flight was not recorded"
    assert renews[-1]["started"] >= in_flight[0] and renews[-1]["result"] is True
    assert all(r["ended"] <= rel["started"] for r in renews)
    assert took >= 0.2  # it waited for the renew (which had up to 0.8 s left)
    wait_until(lambda: renews[-1]["pid"] not in keepalive_pids(admin), 2, "the keepalive's backend to go")


def keepalive_pids_of(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        return keepalive_pids(c)


def test_a_lease_dropped_without_a_release_is_not_renewed_forever(dsn, admin, name):
    """The keepalive holds its lease weakly: once the program lets go of a
    lease it never released, renewals stop and the lease expires at its ttl
    (rather than a background thread nobody can reach keeping it forever)."""
    before = set(keepalive_pids(admin))
    lease = Locker(dsn).acquire(name, ttl=1.5)
    token = lease.token
    wait_until(lambda: set(keepalive_pids(admin)) - before, 5, "the keepalive's connection")
    del lease
    gc.collect()
    wait_until(lambda: not admin.execute("SELECT fenced_lock_validate(%s, %s)", (name, token)).fetchone()[0],
               10, "the dropped lease to expire")
    wait_until(lambda: not (set(keepalive_pids(admin)) - before), 10, "the keepalive's connection to close")


def test_a_renew_held_up_by_the_holders_own_transaction_does_not_hold_up_its_release(dsn, admin, doc):
    """What a renew does wait for is another change of the same lease in an
    open transaction, here the holder's own: a leader proclaims, writes,
    releases and then commits. The release waits for the renew in flight,
    which waits for this very transaction; the renew gives up after its
    lock_timeout (set for that statement only), so the release goes through
    at once instead of at the deadline."""
    row, lock = doc
    lease = Locker(dsn, keepalive_interval=0.2).acquire(lock, ttl=20)
    try:
        with lease.conn.transaction():
            lease.conn.execute("SELECT fenced_lock_proclaim(%s, %s, 'leader at 10.0.0.7')", (lock, lease.token))
            lease.conn.execute("UPDATE docs SET fence_token = %s WHERE id = %s", (lease.token, row))
            wait_until(lambda: admin.execute(
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
                "AND application_name = 'fenced_lock_keepalive'").fetchone(), 5, "the renew to wait for the lock")
            called = time.monotonic()
            assert lease.release() is True
            took = time.monotonic() - called
        print(f"release took {took:.2f} s with a renew held up behind its transaction")
        assert took < 1.5
        assert not lease.lost.is_set()
    finally:
        lease.close()
    assert [h["ended_by"] for h in history(admin, lock)][-1] == "release"
    assert admin.execute("SELECT fence_token FROM docs WHERE id = %s", (row,)).fetchone()[0] == lease.token
    assert admin.execute("SELECT count(*) FROM fenced_lock_leader(%s)", (lock,)).fetchone()[0] == 0
