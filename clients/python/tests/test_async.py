"""The keepalive and lease promises again, for AsyncLocker (clients/README.md,
"Keepalive", "The scoped form"): a section of 3x the ttl stays alive; a
terminated keepalive connection is replaced; a session-bound lease whose
connection is terminated is lost at the next renew; lost is an
asyncio.Event, set once, with the on_lost callback (a coroutine function
too); no renew is sent after a release, also with one in flight; `async
with` releases on the way out, unless lost."""

import asyncio
import time

import psycopg
import pytest

from conftest import history, keepalive_pids, wait_until
from fenced_lock import AsyncLease, AsyncLocker, StaleToken


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 50))


def test_async_keepalive_keeps_a_section_of_three_times_the_ttl_alive(dsn, admin, doc):
    row, lock = doc
    renewed = []

    async def go():
        async with AsyncLocker(dsn).acquire(lock, ttl=1.0, on_renewed=lambda lease: renewed.append(1)) as lease:
            assert isinstance(lease, AsyncLease) and isinstance(lease.lost, asyncio.Event)
            await asyncio.sleep(3.0)  # three ttls
            await lease.conn.execute("UPDATE docs SET fence_token = %s WHERE id = %s", (lease.token, row))
            assert not lease.lost.is_set()
        return lease

    lease = run(go())
    assert len(renewed) >= 4
    assert admin.execute("SELECT fence_token FROM docs WHERE id = %s", (row,)).fetchone()[0] == lease.token
    assert [h["ended_by"] for h in history(admin, lock)][-1] == "release"


def test_async_lost_is_an_event_set_once_and_on_lost_may_be_a_coroutine(dsn, admin, doc):
    row, lock = doc
    called = []

    async def on_lost(lease):
        await asyncio.sleep(0)
        called.append(lease.token)

    async def go():
        lease = await AsyncLocker(dsn).acquire(lock, ttl=1.5, on_lost=on_lost)
        admin.execute("SELECT fenced_lock_force_release(%s)", (lock,))
        forced = time.monotonic()
        await asyncio.wait_for(lease.lost.wait(), lease.interval + 2)
        assert time.monotonic() - forced < lease.interval + 2
        await asyncio.sleep(lease.interval * 3)
        assert called == [lease.token]
        assert "renew returned false" in lease.lost_reason
        with pytest.raises(StaleToken):
            await lease.conn.execute("UPDATE docs SET fence_token = %s WHERE id = %s", (lease.token, row))
        assert await lease.release() is False
        await lease.close()

    run(go())
    assert [h["ended_by"] for h in history(admin, lock)][-1] == "force_release"


def test_async_terminated_keepalive_connection_is_replaced_and_the_lease_stays_live(dsn, admin, name):
    renewed = []
    before = set(keepalive_pids(admin))

    async def go():
        async with AsyncLocker(dsn).acquire(name, ttl=1.2, on_renewed=lambda l: renewed.append(time.monotonic())) \
                as lease:
            while not (set(keepalive_pids(admin)) - before) or not renewed:
                await asyncio.sleep(0.05)
            (old,) = set(keepalive_pids(admin)) - before
            admin.execute("SELECT pg_terminate_backend(%s)", (old,))
            killed = time.monotonic()
            await asyncio.sleep(2.4)  # two ttls
            assert not lease.lost.is_set(), lease.lost_reason
            assert admin.execute("SELECT fenced_lock_validate(%s, %s)", (name, lease.token)).fetchone()[0]
            assert len([t for t in renewed if t > killed]) >= 3
            assert old not in keepalive_pids(admin)

    run(go())


def test_async_session_bound_lease_whose_connection_is_terminated_is_lost_at_the_next_renew(dsn, admin, name):
    async def go():
        lease = await AsyncLocker(dsn).acquire(name, ttl=3, session_bound=True)
        admin.execute("SELECT pg_terminate_backend(%s)", (lease.conn.info.backend_pid,))
        killed = time.monotonic()
        await asyncio.wait_for(lease.lost.wait(), lease.interval + 3)
        assert time.monotonic() - killed < lease.interval + 2
        assert "renew returned false" in lease.lost_reason
        assert await lease.release() is False
        await lease.close()

    run(go())
    wait_until(lambda: history(admin, name)[-1]["ended_by"], 5, "the session end to be recorded")
    assert history(admin, name)[-1]["ended_by"] == "session_end"


def test_async_no_renew_is_sent_after_the_release(dsn, admin, spy, name):
    conninfo, calls = spy
    before = set(keepalive_pids(admin))

    async def go():
        lease = await AsyncLocker(conninfo(), keepalive_interval=0.05).acquire(name, ttl=3)
        while sum(c["fn"] == "renew" for c in calls(name)) < 5:
            await asyncio.sleep(0.05)
        mine = set(keepalive_pids(admin)) - before
        assert await lease.release() is True
        return mine

    mine = run(go())
    wait_until(lambda: not (set(keepalive_pids(admin)) & mine), 2, "the keepalive's backend to go")
    time.sleep(0.5)
    recorded = calls(name)
    (rel,) = [c for c in recorded if c["fn"] == "release"]
    assert all(r["ended"] <= rel["started"] for r in recorded if r["fn"] == "renew")


def test_async_renew_in_flight_when_release_is_called_finishes_before_the_release(dsn, admin, spy, name):
    conninfo, calls = spy

    async def go():
        lease = await AsyncLocker(conninfo(renew_delay=0.8), keepalive_interval=0.3).acquire(name, ttl=5)
        while not admin.execute("SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                                "AND state = 'active' AND application_name = 'fenced_lock_keepalive' "
                                "AND query LIKE '%%fenced_lock_renew%%'").fetchone():
            await asyncio.sleep(0.02)
        called = time.monotonic()
        assert await lease.release() is True
        return time.monotonic() - called

    took = run(go())
    recorded = calls(name)
    (rel,) = [c for c in recorded if c["fn"] == "release"]
    renews = [c for c in recorded if c["fn"] == "renew"]
    assert renews and renews[-1]["result"] is True
    assert all(r["ended"] <= rel["started"] for r in renews)
    assert took >= 0.2


def test_async_scoped_form_releases_on_an_exception_and_not_when_lost(dsn, admin, name):
    async def go():
        with pytest.raises(ZeroDivisionError):
            async with AsyncLocker(dsn).acquire(name, ttl=5):
                1 / 0
        lease = await AsyncLocker(dsn).try_acquire(name, ttl=1.5)
        async with lease:
            admin.execute("SELECT fenced_lock_force_release(%s)", (name,))
            await asyncio.wait_for(lease.lost.wait(), lease.interval + 2)

    run(go())
    assert [h["ended_by"] for h in history(admin, name)] == ["release", "force_release"]


def test_async_deadline_without_keepalive_signals_lost(dsn, name):
    async def go():
        started = time.monotonic()
        lease = await AsyncLocker(dsn).acquire(name, ttl=0.8, keepalive=False)
        await asyncio.wait_for(lease.lost.wait(), 3)
        assert time.monotonic() - started >= 0.8
        assert "deadline" in lease.lost_reason
        await lease.close()

    run(go())


def test_async_on_the_callers_connection(dsn, admin, name):
    async def go():
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            async with AsyncLocker(dsn).acquire(name, ttl=5, conn=conn) as lease:
                assert lease.conn is conn
                assert admin.execute("SELECT fenced_lock_validate(%s, %s)", (name, lease.token)).fetchone()[0]
            assert not conn.closed
            await conn.execute("SELECT 1")

    run(go())
    assert [h["ended_by"] for h in history(admin, name)] == ["release"]


def test_async_shared_and_permit_leases_are_kept_alive_and_released(dsn, admin, name):
    readers, sem = f"{name}:readers", f"{name}:sem"

    def live(lock):
        return {r[0]: (r[1], r[2]) for r in admin.execute(
            "SELECT token, mode, permits FROM fenced_lock_leases WHERE name = %s AND live", (lock,)).fetchall()}

    async def go():
        locker = AsyncLocker(dsn)
        async with await locker.try_acquire(readers, ttl=1, shared=True) as r1, \
                locker.acquire(readers, ttl=1, shared=True, wait=5) as r2, \
                locker.acquire(sem, ttl=1, permits=2, wait=5) as p1:
            await asyncio.sleep(2.5)  # past two ttls: only renewals keep them
            assert not any(lease.lost.is_set() for lease in (r1, r2, p1))
            assert live(readers) == {r1.token: ("shared", None), r2.token: ("shared", None)}
            assert live(sem) == {p1.token: ("permit", 2)}
            assert await locker.run(sem, lambda lease: asyncio.sleep(0, lease.permits), ttl=1, permits=2) == 2
        return r1, r2, p1

    leases = run(go())
    assert live(readers) == {} and live(sem) == {}
    ended = {h["token"]: h["ended_by"] for h in history(admin, readers) + history(admin, sem)}
    assert [ended[lease.token] for lease in leases] == ["release"] * 3
