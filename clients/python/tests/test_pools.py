"""Promises about pools (clients/README.md, "Pools"): a lease keeps the pool
connection it took until it ends and its keepalive takes another (two per
lease), both go back when the lease ends, the keepalive's session settings
are undone on the way back; connections that are not in autocommit work;
transaction_pooling leaves plain leases alone. Sync and asyncio pools."""

import asyncio
import time

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from conftest import history, keepalive_pids, wait_until
from fenced_lock import AsyncLocker, Locker


def idle(pool):
    return pool.get_stats().get("pool_available", 0)


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "transactions"])
def test_a_lease_takes_two_pool_connections_and_gives_both_back(dsn, admin, doc, autocommit):
    row, lock = doc
    before = set(keepalive_pids(admin))
    with ConnectionPool(dsn, min_size=2, max_size=2, kwargs={"autocommit": autocommit}) as pool:
        pool.wait()
        locker = Locker(pool)
        with locker.acquire(lock, ttl=1.5) as lease:
            # Visible to others at once, whatever the connection's autocommit.
            assert admin.execute("SELECT fenced_lock_validate(%s, %s)", (lock, lease.token)).fetchone()[0]
            wait_until(lambda: set(keepalive_pids(admin)) - before, 5, "the keepalive's pooled connection")
            assert idle(pool) == 0
            time.sleep(1.8)  # past the ttl: the pooled keepalive renews
            with lease.conn.transaction():
                lease.conn.execute("UPDATE docs SET fence_token = %s WHERE id = %s", (lease.token, row))
        assert not admin.execute("SELECT fenced_lock_validate(%s, %s)", (lock, lease.token)).fetchone()[0]
        wait_until(lambda: idle(pool) == 2, 5, "both connections back in the pool")
        # The keepalive's settings were undone before it went back.
        for _ in range(2):
            with pool.connection() as c:
                assert c.execute("SHOW application_name").fetchone()[0] != "fenced_lock_keepalive"
                assert c.execute("SHOW lock_timeout").fetchone()[0] == "0"
                assert c.autocommit is autocommit
    assert [h["ended_by"] for h in history(admin, lock)][-1] == "release"


def test_a_pool_too_small_for_the_keepalive_loses_the_lease_at_its_deadline(dsn, name):
    """Why the contract asks for two connections per lease: with one, the
    keepalive never gets a connection, and the lease is lost on time rather
    than silently left to expire."""
    with ConnectionPool(dsn, min_size=1, max_size=1, kwargs={"autocommit": True}, timeout=5) as pool:
        started = time.monotonic()
        with Locker(pool).acquire(name, ttl=1.0) as lease:
            assert lease.lost.wait(3)
            assert time.monotonic() - started >= 1.0
        wait_until(lambda: idle(pool) == 1, 5, "the connection back in the pool")


def test_transaction_pooling_keeps_plain_leases_alive(dsn, admin, name):
    with ConnectionPool(dsn, min_size=2, max_size=4, kwargs={"autocommit": True}) as pool:
        with Locker(pool, transaction_pooling=True).acquire(name, ttl=1.0) as lease:
            time.sleep(2.0)
            assert not lease.lost.is_set()
            assert admin.execute("SELECT fenced_lock_validate(%s, %s)", (name, lease.token)).fetchone()[0]


def test_run_with_a_pool_hands_connections_back_between_attempts(dsn, admin, name):
    with ConnectionPool(dsn, min_size=2, max_size=2, kwargs={"autocommit": True}) as pool:
        locker = Locker(pool)
        for i in range(5):
            assert locker.run(name, lambda lease: lease.token, ttl=5) > 0
        wait_until(lambda: idle(pool) == 2, 5, "both connections back")
    assert [h["ended_by"] for h in history(admin, name)] == ["release"] * 5


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "transactions"])
def test_async_pool_lease_takes_two_connections_and_gives_both_back(dsn, admin, doc, autocommit):
    row, lock = doc

    async def go():
        pool = AsyncConnectionPool(dsn, min_size=2, max_size=2, kwargs={"autocommit": autocommit}, open=False)
        await pool.open(wait=True)
        try:
            async with AsyncLocker(pool).acquire(lock, ttl=1.5) as lease:
                assert admin.execute("SELECT fenced_lock_validate(%s, %s)", (lock, lease.token)).fetchone()[0]
                await asyncio.sleep(1.8)  # past the ttl
                assert not lease.lost.is_set()
                assert idle(pool) == 0
                async with lease.conn.transaction():
                    await lease.conn.execute("UPDATE docs SET fence_token = %s WHERE id = %s", (lease.token, row))
            for _ in range(100):
                if idle(pool) == 2:
                    break
                await asyncio.sleep(0.05)
            assert idle(pool) == 2
            async with pool.connection() as c:
                cur = await c.execute("SHOW application_name")
                assert (await cur.fetchone())[0] != "fenced_lock_keepalive"
        finally:
            await pool.close()

    asyncio.run(asyncio.wait_for(go(), 30))
    assert [h["ended_by"] for h in history(admin, lock)][-1] == "release"


def test_a_factory_source_opens_and_closes_its_connections(dsn, admin, name):
    opened = []

    def factory():
        opened.append(psycopg.connect(dsn))  # not autocommit
        return opened[-1]

    with Locker(factory).acquire(name, ttl=1.2) as lease:
        time.sleep(1.5)
        assert not lease.lost.is_set()
    assert len(opened) == 2 and all(c.closed for c in opened)
