"""Promise (clients/README.md, "Errors"): every bad argument of every call is
refused by the client with the invalid-argument error (22023, naming the
argument) before anything is sent: no connection is opened, and a
connection passed in sees no message. Usage errors (an acquire inside a
transaction, session_bound with transaction pooling) likewise send nothing.
Both the sync and the asyncio client."""

import asyncio
from datetime import timedelta

import psycopg
import pytest

from conftest import sent, traced
from fenced_lock import AsyncLocker, InvalidArgument, Locker, UsageError

NAN, INF = float("nan"), float("inf")

# (argument, bad value) for the arguments try_acquire and acquire share.
LEASE_ARGUMENTS = [
    ("name", ""), ("name", None), ("name", 7), ("name", b"inventory:1"), ("name", "a\x00b"),
    ("ttl", 0), ("ttl", -1), ("ttl", 0.0), ("ttl", NAN), ("ttl", INF), ("ttl", "30"), ("ttl", True),
    ("ttl", timedelta(0)), ("ttl", timedelta(seconds=-5)), ("ttl", None), ("ttl", 1e30),
    ("holder", 7), ("holder", b"worker"), ("holder", "w\x00"),
    ("session_bound", 1), ("session_bound", "yes"), ("session_bound", None),
    ("shared", 1), ("shared", None),
    ("permits", 0), ("permits", -1), ("permits", 1.5), ("permits", True), ("permits", "2"),
    ("keepalive", 1), ("keepalive", None),
    ("on_lost", 7), ("on_lost", "print"),
    ("on_renewed", 7),
]
WAIT_ARGUMENTS = [("wait", -0.001), ("wait", -1), ("wait", timedelta(seconds=-1)), ("wait", NAN),
                  ("wait", INF), ("wait", "1"), ("wait", True), ("wait", 1e30)]


def ids(cases):
    return [f"{arg}={value!r}" for arg, value in cases]


def check(e, argument):
    assert e.sqlstate == "22023"
    assert isinstance(e, ValueError) and isinstance(e, psycopg.errors.InvalidParameterValue)
    assert e.argument == argument
    assert argument in str(e)


class Opened:
    """A locker source that counts the connections it is asked for."""

    def __init__(self, dsn, asynchronous=False):
        self.dsn, self.asynchronous, self.count = dsn, asynchronous, 0

    def __call__(self):
        self.count += 1
        if self.asynchronous:
            return psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
        return psycopg.connect(self.dsn, autocommit=True)


def acquire_kwargs(argument, value):
    kw = {"name": "arguments:1"}
    kw[argument] = value
    return kw


@pytest.fixture
def opened(dsn):
    return Opened(dsn)


@pytest.fixture
def conn(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


# run takes every argument of the acquires but on_renewed.
LEASE_CALLS = [(call, argument, value) for call in ("try_acquire", "acquire", "run")
               for argument, value in LEASE_ARGUMENTS if (call, argument) != ("run", "on_renewed")]


@pytest.mark.parametrize("call,argument,value", LEASE_CALLS,
                         ids=[f"{call}-{i}" for call, i in zip((c[0] for c in LEASE_CALLS),
                                                                ids([c[1:] for c in LEASE_CALLS]))])
def test_bad_lease_argument_is_refused_before_anything_is_sent(call, argument, value, opened, conn):
    locker = Locker(opened)
    with traced(conn) as lines:
        for extra in ({}, {"conn": conn}):
            kw = acquire_kwargs(argument, value)
            with pytest.raises(InvalidArgument) as e:
                if call == "run":
                    locker.run(kw.pop("name"), lambda lease: None, **kw, **extra)
                else:
                    getattr(locker, call)(**kw, **extra)
            check(e.value, argument)
        assert sent(lines) == []
    assert opened.count == 0


@pytest.mark.parametrize("argument,value", WAIT_ARGUMENTS, ids=ids(WAIT_ARGUMENTS))
@pytest.mark.parametrize("call", ["acquire", "run"])
def test_bad_wait_is_refused_before_anything_is_sent(call, argument, value, opened, conn):
    locker = Locker(opened)
    with traced(conn) as lines:
        with pytest.raises(InvalidArgument) as e:
            if call == "run":
                locker.run("arguments:1", lambda lease: None, wait=value, conn=conn)
            else:
                locker.acquire("arguments:1", wait=value, conn=conn)
        check(e.value, argument)
        assert sent(lines) == []
    assert opened.count == 0


def test_shared_with_more_than_one_permit_is_refused_before_anything_is_sent(opened, conn):
    locker = Locker(opened)
    with traced(conn) as lines:
        for call in (locker.try_acquire, locker.acquire):
            with pytest.raises(InvalidArgument) as e:
                call("arguments:1", shared=True, permits=2, conn=conn)
            check(e.value, "permits")
        assert sent(lines) == []
    assert opened.count == 0


@pytest.mark.parametrize("value", ["postgresql://x", object(), 7])
def test_conn_that_is_not_a_connection_is_refused(value, opened):
    locker = Locker(opened)
    for call in (locker.try_acquire, locker.acquire):
        with pytest.raises(InvalidArgument) as e:
            call("arguments:1", conn=value)
        check(e.value, "conn")
    assert opened.count == 0


def test_async_connection_given_to_the_sync_locker_is_refused(dsn, opened):
    async def go():
        async with await psycopg.AsyncConnection.connect(dsn) as ac:
            with pytest.raises(InvalidArgument) as e:
                Locker(opened).try_acquire("arguments:1", conn=ac)
            check(e.value, "conn")
    asyncio.run(go())
    assert opened.count == 0


def test_keepalive_interval_not_shorter_than_the_ttl_is_refused(opened, conn):
    with traced(conn) as lines:
        for interval in (5, 6, timedelta(seconds=5)):
            with pytest.raises(InvalidArgument) as e:
                Locker(opened, keepalive_interval=interval).try_acquire("arguments:1", ttl=5, conn=conn)
            check(e.value, "keepalive_interval")
        assert sent(lines) == []
    assert opened.count == 0


LOCKER_ARGUMENTS = [
    ("source", 7), ("source", None), ("source", b"postgresql://x"),
    ("keepalive_interval", 0), ("keepalive_interval", -1), ("keepalive_interval", "1"),
    ("keepalive_interval", NAN), ("keepalive_interval", True),
    ("attempts", 0), ("attempts", -1), ("attempts", 1.5), ("attempts", True), ("attempts", "5"),
    ("transaction_pooling", "yes"), ("transaction_pooling", 1),
]


@pytest.mark.parametrize("argument,value", LOCKER_ARGUMENTS, ids=ids(LOCKER_ARGUMENTS))
@pytest.mark.parametrize("cls", [Locker, AsyncLocker])
def test_bad_locker_argument_is_refused(cls, argument, value, dsn):
    kw = {"source": dsn, argument: value}
    with pytest.raises(InvalidArgument) as e:
        cls(kw.pop("source"), **kw)
    check(e.value, argument)


@pytest.mark.parametrize("fn,attempts,argument", [
    (None, None, "fn"), (7, None, "fn"), (lambda lease: None, 0, "attempts"),
    (lambda lease: None, -3, "attempts"), (lambda lease: None, "2", "attempts"),
], ids=["fn=None", "fn=7", "attempts=0", "attempts=-3", "attempts='2'"])
def test_bad_run_argument_is_refused_before_anything_is_sent(fn, attempts, argument, opened):
    with pytest.raises(InvalidArgument) as e:
        Locker(opened).run("arguments:1", fn, attempts=attempts)
    check(e.value, argument)
    assert opened.count == 0


@pytest.mark.parametrize("ttl", [0, -1, NAN, "10", True])
def test_bad_renew_ttl_is_refused_before_anything_is_sent(ttl, dsn, name):
    with Locker(dsn, keepalive_interval=5).acquire(name, ttl=30, keepalive=False) as lease:
        with traced(lease.conn) as lines:
            with pytest.raises(InvalidArgument) as e:
                lease.renew(ttl)
            check(e.value, "ttl")
            assert sent(lines) == []


def test_acquire_on_a_connection_inside_a_transaction_is_a_usage_error_and_sends_nothing(dsn, opened):
    with psycopg.connect(dsn) as conn:  # not autocommit: the SELECT opens a transaction
        conn.execute("SELECT 1")
        with traced(conn) as lines:
            for call in (Locker(opened).try_acquire, Locker(opened).acquire):
                with pytest.raises(UsageError, match="outside a transaction"):
                    call("arguments:1", conn=conn)
            assert sent(lines) == []
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        assert conn.info.transaction_status.name == "INERROR"
        with traced(conn) as lines:
            with pytest.raises(UsageError):
                Locker(opened).acquire("arguments:1", conn=conn)
            assert sent(lines) == []
    assert opened.count == 0


def test_acquire_on_a_closed_connection_is_a_usage_error(dsn, opened):
    conn = psycopg.connect(dsn)
    conn.close()
    with pytest.raises(UsageError, match="closed"):
        Locker(opened).acquire("arguments:1", conn=conn)


def test_session_bound_with_transaction_pooling_is_refused_and_says_why(opened, conn):
    locker = Locker(opened, transaction_pooling=True)
    with traced(conn) as lines:
        for call in (locker.try_acquire, locker.acquire):
            with pytest.raises(UsageError) as e:
                call("arguments:1", session_bound=True, conn=conn)
            assert "transaction_pooling" in str(e.value) and "other clients share" in str(e.value)
        with pytest.raises(UsageError):
            locker.run("arguments:1", lambda lease: None, session_bound=True)
        assert sent(lines) == []
    assert opened.count == 0


def test_manual_renew_inside_a_transaction_is_a_usage_error(dsn, name):
    with Locker(dsn).acquire(name, ttl=30, keepalive=False) as lease:
        with lease.conn.transaction():
            with traced(lease.conn) as lines:
                with pytest.raises(UsageError):
                    lease.renew()
                assert sent(lines) == []


# -- the asyncio client ----------------------------------------------------------


@pytest.mark.parametrize("argument,value", LEASE_ARGUMENTS + WAIT_ARGUMENTS, ids=ids(LEASE_ARGUMENTS + WAIT_ARGUMENTS))
def test_async_bad_argument_is_refused_before_anything_is_sent(argument, value, dsn):
    opened = Opened(dsn, asynchronous=True)

    async def go():
        locker = AsyncLocker(opened)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            with traced(conn) as lines:
                calls = ["acquire", "run"] if argument == "wait" else ["try_acquire", "acquire", "run"]
                for call in calls:
                    if call == "run" and argument == "on_renewed":
                        continue
                    for extra in ({}, {"conn": conn}):
                        kw = acquire_kwargs(argument, value)
                        with pytest.raises(InvalidArgument) as e:
                            if call == "run":
                                await locker.run(kw.pop("name"), lambda lease: None, **kw, **extra)
                            elif call == "acquire":
                                # refused when called, before anything is awaited
                                locker.acquire(**kw, **extra)
                            else:
                                await locker.try_acquire(**kw, **extra)
                        check(e.value, argument)
                assert sent(lines) == []

    asyncio.run(go())
    assert opened.count == 0


def test_async_usage_errors_send_nothing(dsn):
    opened = Opened(dsn, asynchronous=True)

    async def go():
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await conn.execute("SELECT 1")
            with traced(conn) as lines:
                with pytest.raises(UsageError):
                    await AsyncLocker(opened).acquire("arguments:1", conn=conn)
                with pytest.raises(UsageError):
                    await AsyncLocker(opened, transaction_pooling=True).try_acquire("arguments:1", session_bound=True)
                with psycopg.connect(dsn) as sync_conn, pytest.raises(InvalidArgument) as e:
                    await AsyncLocker(opened).try_acquire("arguments:1", conn=sync_conn)
                check(e.value, "conn")
                assert sent(lines) == []

    asyncio.run(go())
    assert opened.count == 0


@pytest.mark.parametrize("fn,attempts,argument", [
    (None, None, "fn"), (7, None, "fn"), (lambda lease: None, 0, "attempts"), (lambda lease: None, "2", "attempts"),
], ids=["fn=None", "fn=7", "attempts=0", "attempts='2'"])
def test_async_bad_run_argument_is_refused_before_anything_is_sent(fn, attempts, argument, dsn):
    opened = Opened(dsn, asynchronous=True)

    async def go():
        with pytest.raises(InvalidArgument) as e:
            await AsyncLocker(opened).run("arguments:1", fn, attempts=attempts)
        check(e.value, argument)

    asyncio.run(go())
    assert opened.count == 0


@pytest.mark.parametrize("ttl", [0, -1, NAN, "10", True])
def test_async_bad_renew_ttl_is_refused_before_anything_is_sent(ttl, dsn, name):
    async def go():
        async with AsyncLocker(dsn).acquire(name, ttl=30, keepalive=False) as lease:
            with traced(lease.conn) as lines:
                with pytest.raises(InvalidArgument) as e:
                    await lease.renew(ttl)
                check(e.value, "ttl")
                assert sent(lines) == []

    asyncio.run(go())
