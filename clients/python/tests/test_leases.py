"""Promises of the model (clients/README.md, "The model", "The scoped form"):
what a lease carries, which connection it uses, how release behaves in
every state of that connection, the scoped form, and the server's defaults
(shared and permits are sent only when asked for)."""

import time
from datetime import timedelta

import psycopg
import pytest

from conftest import history, live_token, sent, statements_sent, traced, wait_until
from fenced_lock import Lease, Locker, StaleToken


def test_lease_carries_name_token_ttl_and_its_options(dsn, admin, name):
    with Locker(dsn).acquire(name, ttl=7.5, holder="worker-1") as lease:
        assert isinstance(lease, Lease)
        assert (lease.name, lease.ttl, lease.holder) == (name, timedelta(seconds=7.5), "worker-1")
        assert (lease.session_bound, lease.shared, lease.permits, lease.keepalive) == (False, False, 1, True)
        assert lease.token == live_token(admin, name)
        assert lease.interval == pytest.approx(2.5)
        assert 0 < lease.remaining <= 7.5 and lease.held
    assert not lease.held


def test_ttl_as_a_timedelta_and_the_default_ttl_of_30_seconds(dsn, admin, name):
    with Locker(dsn).acquire(name, ttl=timedelta(seconds=4)) as lease:
        assert lease.ttl == timedelta(seconds=4)
    with Locker(dsn).acquire(name) as lease:
        assert lease.ttl == timedelta(seconds=30)
        left = admin.execute("SELECT extract(epoch FROM expires_at - clock_timestamp()) FROM fenced_lock_leases "
                             "WHERE name = %s", (name,)).fetchone()[0]
        assert 25 < left <= 30


def test_try_acquire_returns_none_when_held_and_leaves_no_connection(dsn, admin, name):
    admin.execute("SELECT fenced_lock_try_acquire(%s, '30 s')", (name,))
    with psycopg.connect(dsn, autocommit=True) as conn:
        with traced(conn) as lines:
            assert Locker(dsn).try_acquire(name, conn=conn) is None
            parsed = [line for line in statements_sent(lines) if "\tParse\t" in line]
            assert len(parsed) == 1 and "fenced_lock_try_acquire" in parsed[0]
    opened = []
    assert Locker(lambda: opened.append(psycopg.connect(dsn, autocommit=True)) or opened[-1]).try_acquire(name) is None
    assert opened[0].closed


def test_only_non_default_shared_and_permits_are_sent(dsn, name):
    with psycopg.connect(dsn, autocommit=True) as conn:
        with traced(conn) as lines:
            with Locker(dsn).acquire(name, ttl=5, conn=conn, keepalive=False):
                pass
            (parsed,) = [line for line in sent(lines) if "\tParse\t" in line and "fenced_lock_acquire" in line]
    assert "shared =>" not in parsed and "permits =>" not in parsed


def test_acquire_on_the_callers_connection_leaves_it_open_and_usable(dsn, admin, doc):
    row, lock = doc
    with psycopg.connect(dsn) as conn:  # not autocommit: the grant still commits on its own
        with Locker(dsn).acquire(lock, ttl=5, conn=conn) as lease:
            assert lease.conn is conn
            assert conn.info.transaction_status.name == "IDLE"
            assert admin.execute("SELECT fenced_lock_validate(%s, %s)", (lock, lease.token)).fetchone()[0]
            with conn.transaction():
                conn.execute("UPDATE docs SET fence_token = %s WHERE id = %s", (lease.token, row))
        assert not conn.closed
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert [h["ended_by"] for h in history(admin, lock)][-1] == "release"


def test_guarded_writes_then_release_then_commit_release_counts_at_the_commit(dsn, admin, doc):
    row, lock = doc
    lease = Locker(dsn).acquire(lock, ttl=10)
    with lease.conn.transaction():
        lease.conn.execute("UPDATE docs SET fence_token = %s WHERE id = %s", (lease.token, row))
        assert lease.release() is True
        # Not committed yet: others still see the lease.
        assert admin.execute("SELECT fenced_lock_validate(%s, %s)", (lock, lease.token)).fetchone()[0]
    assert not admin.execute("SELECT fenced_lock_validate(%s, %s)", (lock, lease.token)).fetchone()[0]
    assert admin.execute("SELECT fence_token FROM docs WHERE id = %s", (row,)).fetchone()[0] == lease.token
    lease.close()
    assert lease.conn is None


def test_release_after_a_failed_transaction_rolls_it_back_first(dsn, admin, name):
    with psycopg.connect(dsn) as conn:
        lease = Locker(dsn).acquire(name, ttl=10, conn=conn)
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        assert conn.info.transaction_status.name == "INERROR"
        assert lease.release() is True
        assert conn.info.transaction_status.name == "IDLE"
    assert [h["ended_by"] for h in history(admin, name)] == ["release"]


def test_release_when_the_leases_connection_is_gone_is_sent_on_a_new_one(dsn, admin, name):
    lease = Locker(dsn).acquire(name, ttl=10)
    admin.execute("SELECT pg_terminate_backend(%s)", (lease.conn.info.backend_pid,))
    wait_until(lambda: not admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                         (lease.conn.info.backend_pid,)).fetchone(), 5, "the backend to exit")
    assert lease.release() is True  # a plain lease outlives its connection
    assert [h["ended_by"] for h in history(admin, name)] == ["release"]


def test_releasing_twice_sends_one_release(dsn, admin, name):
    with psycopg.connect(dsn, autocommit=True) as conn:
        lease = Locker(dsn).acquire(name, ttl=10, conn=conn)
        assert lease.release() is True
        with traced(conn) as lines:
            assert lease.release() is False
            lease.close()
            assert sent(lines) == []


def test_release_of_a_lease_that_ended_on_the_server_is_false(dsn, admin, name):
    lease = Locker(dsn).acquire(name, ttl=10, keepalive=False)
    admin.execute("SELECT fenced_lock_force_release(%s)", (name,))
    assert lease.release() is False
    lease.close()


def test_scoped_form_releases_on_an_exception_and_lets_it_through(dsn, admin, name):
    with pytest.raises(ZeroDivisionError):
        with Locker(dsn).acquire(name, ttl=10) as lease:
            1 / 0
    assert not lease.held
    assert [h["ended_by"] for h in history(admin, name)] == ["release"]


def test_scoped_form_does_not_release_a_lost_lease(dsn, admin, doc):
    row, lock = doc
    with pytest.raises(StaleToken):
        with Locker(dsn).acquire(lock, ttl=1.5) as lease:
            admin.execute("SELECT fenced_lock_force_release(%s)", (lock,))
            assert lease.lost.wait(lease.interval + 2)
            lease.conn.execute("UPDATE docs SET fence_token = %s WHERE id = %s", (lease.token, row))
    assert [h["ended_by"] for h in history(admin, lock)][-1] == "force_release"
    assert lease.conn is None  # the locker's connection was given back


def test_waiting_longer_than_the_ttl_still_starts_with_a_live_lease(dsn, admin, name):
    """The deadline counts from the send of the acquire; a grant that came
    after a long wait is renewed at once, so it does not start out lost."""
    admin.execute("SELECT fenced_lock_try_acquire(%s, '1.5 s')", (name,))
    started = time.monotonic()
    with Locker(dsn).acquire(name, ttl=1.0) as lease:
        assert time.monotonic() - started > 1.0
        assert not lease.lost.is_set()
        time.sleep(1.5)
        assert not lease.lost.is_set(), lease.lost_reason
        assert admin.execute("SELECT fenced_lock_validate(%s, %s)", (name, lease.token)).fetchone()[0]


def test_holder_retry_returns_the_same_token(dsn, admin, name):
    locker = Locker(dsn)
    with locker.acquire(name, ttl=10, holder="w1", keepalive=False) as first:
        again = locker.try_acquire(name, ttl=10, holder="w1", keepalive=False)
        assert again.token == first.token
        again._abandon("test: the same lease twice")  # one release is enough


def test_manual_renew_moves_the_deadline(dsn, admin, name):
    with Locker(dsn).acquire(name, ttl=1.0, keepalive=False) as lease:
        time.sleep(0.6)
        assert lease.renew(ttl=3) is True
        assert lease.remaining > 2.5
        time.sleep(0.8)
        assert not lease.lost.is_set()
        admin.execute("SELECT fenced_lock_force_release(%s)", (name,))
        assert lease.renew() is False
        assert lease.lost.is_set()


def test_session_bound_lease_ends_with_its_connection(dsn, admin, name):
    lease = Locker(dsn).acquire(name, ttl=30, session_bound=True, keepalive=False)
    assert lease.session_bound
    lease.conn.close()
    wait_until(lambda: history(admin, name) and history(admin, name)[-1]["ended_by"] == "session_end", 5,
               "the session end to be recorded")
    assert lease.release() is False


def test_shared_leases_live_together_each_with_its_own_token(dsn, admin, name):
    locker = Locker(dsn)
    with locker.acquire(name, ttl=10, shared=True) as a, locker.acquire(name, ttl=10, shared=True) as b:
        assert a.token != b.token and a.shared and b.shared
        for t in (a.token, b.token):
            assert admin.execute("SELECT fenced_lock_validate(%s, %s)", (name, t)).fetchone()[0]
    with locker.try_acquire(name, ttl=10) as exclusive:  # both released: the name is free
        assert exclusive.token > max(a.token, b.token)


def test_permits_give_a_counting_semaphore(dsn, admin, name):
    locker = Locker(dsn)
    with locker.acquire(name, ttl=10, permits=2) as a, locker.acquire(name, ttl=10, permits=2) as b:
        assert a.token != b.token and a.permits == 2
        assert locker.try_acquire(name, ttl=10, permits=2) is None


def leases_of(admin, name):
    """The server's live leases of `name`: {token: (mode, permits)}."""
    return {r[0]: (r[1], r[2]) for r in admin.execute(
        "SELECT token, mode, permits FROM fenced_lock_leases WHERE name = %s AND live", (name,)).fetchall()}


def test_shared_and_permits_through_every_call_are_kept_alive_and_each_release_ends_its_own(dsn, admin, name):
    """try_acquire, acquire and run all send shared and permits; the
    keepalive renews such leases past their ttl (a renew is per token), and a
    release ends that one lease, not the others of the name."""
    locker = Locker(dsn)
    readers, sem = f"{name}:readers", f"{name}:sem"
    with locker.try_acquire(readers, ttl=1, shared=True) as r1, \
            locker.acquire(readers, ttl=1, shared=True, wait=5) as r2, \
            locker.try_acquire(sem, ttl=1, permits=2) as p1, \
            locker.acquire(sem, ttl=1, permits=2, wait=5) as p2:
        time.sleep(2.5)  # two and a half ttls: only renewals keep them
        assert not any(lease.lost.is_set() for lease in (r1, r2, p1, p2))
        assert leases_of(admin, readers) == {r1.token: ("shared", None), r2.token: ("shared", None)}
        assert leases_of(admin, sem) == {p1.token: ("permit", 2), p2.token: ("permit", 2)}
        # A third reader beside the two; no third permit beside two.
        third = locker.run(readers, lambda lease: (lease.shared, lease.token, set(leases_of(admin, readers))),
                           ttl=1, shared=True, wait=5)
        assert third[0] is True and third[2] == {r1.token, r2.token, third[1]}
        assert locker.try_acquire(sem, ttl=1, permits=2) is None
        assert p2.release() is True
        assert set(leases_of(admin, sem)) == {p1.token}
        got = locker.run(sem, lambda lease: (lease.permits, set(leases_of(admin, sem)) - {p1.token}),
                         ttl=1, permits=2, wait=5)
        assert got[0] == 2 and len(got[1]) == 1
    ended = {h["token"]: h["ended_by"] for h in history(admin, readers) + history(admin, sem)}
    assert set(ended.values()) == {"release"} and len(ended) == 6
    assert leases_of(admin, readers) == {} and leases_of(admin, sem) == {}
