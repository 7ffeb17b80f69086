"""The asyncio client: AsyncLocker, AsyncLease and the keepalive task
(clients/README.md is the contract). It mirrors the sync client; what
differs is how the deadline is kept: a timer on the event loop, and a renew
still in flight at the deadline is cancelled and its connection closed."""

from __future__ import annotations

import asyncio
import inspect
import weakref
from datetime import timedelta
from typing import Any, Awaitable, Callable, Optional, Set, TypeVar, Union

import psycopg
from psycopg.pq import TransactionStatus

from . import _common as c
from ._common import HELD, Seconds, log, monotonic
from .errors import InvalidArgument, UsageError

T = TypeVar("T")

__all__ = ["AsyncLocker", "AsyncLease"]


async def _maybe_await(value):
    if inspect.isawaitable(value):
        return await value
    return value


class _AsyncSource:
    """A connection string, a psycopg_pool AsyncConnectionPool, or a callable
    returning (or returning an awaitable of) a psycopg AsyncConnection."""

    def __init__(self, source: Any, transaction_pooling: bool):
        if isinstance(source, str):
            self.kind = "conninfo"
        elif c.is_pool(source):
            self.kind = "pool"
        elif callable(source):
            self.kind = "factory"
        else:
            raise InvalidArgument("source must be a connection string, an AsyncConnectionPool or a callable "
                                  f"returning a psycopg AsyncConnection, not {type(source).__name__}",
                                  argument="source")
        self.source = source
        self.connect_kwargs = c.pooler_kwargs(transaction_pooling)
        self._saved: dict = {}

    async def lease_connection(self) -> psycopg.AsyncConnection:
        if self.kind == "conninfo":
            return await psycopg.AsyncConnection.connect(self.source, autocommit=True, **self.connect_kwargs)
        if self.kind == "pool":
            return await self.source.getconn()
        conn = await _maybe_await(self.source())
        if not isinstance(conn, psycopg.AsyncConnection):
            raise InvalidArgument(f"the factory returned {type(conn).__name__}, not a psycopg AsyncConnection",
                                  argument="source")
        return conn

    async def keepalive_connection(self, interval: float, ttl: float, remaining: float) -> psycopg.AsyncConnection:
        if self.kind == "conninfo":
            return await psycopg.AsyncConnection.connect(
                self.source, **c.keepalive_connect_kwargs(interval, ttl, remaining), **self.connect_kwargs)
        if self.kind == "pool":
            conn = await self.source.getconn(timeout=max(0.1, remaining))
        else:
            conn = await self.lease_connection()
        try:
            self._saved[id(conn)] = (conn.autocommit, conn.prepare_threshold)
            await conn.set_autocommit(True)
            if self.connect_kwargs:
                conn.prepare_threshold = None
            await conn.execute(c.SET_KEEPALIVE_NAME_SQL)
        except BaseException:
            await self.give_back(conn, keepalive=True)
            raise
        return conn

    async def give_back(self, conn: psycopg.AsyncConnection, keepalive: bool = False) -> None:
        saved = self._saved.pop(id(conn), None)
        try:
            if self.kind != "pool":
                await conn.close()
                return
            if keepalive and c.usable(conn):
                try:
                    await conn.execute(c.RESET_KEEPALIVE_NAME_SQL)
                    if saved is not None:
                        await conn.set_autocommit(saved[0])
                        conn.prepare_threshold = saved[1]
                except psycopg.Error:
                    pass  # the pool checks the connection and drops it if broken
            await self.source.putconn(conn)
        except Exception as e:  # giving a connection back must never hide the caller's result
            log.warning("fenced_lock: could not give a connection back: %s", e)


class _AsyncKeepalive:
    """One lease's renewals, in a task with a connection of its own. Holds
    the lease weakly, as the sync keepalive does."""

    def __init__(self, lease: "AsyncLease", source: _AsyncSource, interval: float):
        self.lease = weakref.ref(lease)
        self.clock = lease._clock
        self.name, self.token, self.ttl = lease.name, lease.token, lease._ttl_s
        self.source = source
        self.interval = interval
        self.lock_timeout = f"{c.lock_timeout_ms(interval)}ms"
        self.stopping = False
        self.wake = asyncio.Event()
        self.task: Optional[asyncio.Task] = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"fenced_lock keepalive {self.name}")

    def request_stop(self) -> None:
        self.stopping = True
        self.wake.set()

    async def stop(self, timeout: float) -> bool:
        """Stop renewing; wait (at most `timeout`) for a renew in flight to
        finish, then cancel it. The connection is given back either way."""
        self.request_stop()
        task = self.task
        if task is None or task is asyncio.current_task():
            return True
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return False
        return True

    def _lose(self, reason: str) -> None:
        lease = self.lease()
        if lease is not None:
            lease._lose(reason)

    async def _wait_until(self, t: float) -> bool:
        """Sleep until `t`; False if the keepalive must end instead (see the
        sync keepalive: the clock is read on every wake-up)."""
        clock = self.clock
        while True:
            if self.stopping or clock.state != HELD or self.lease() is None:
                return False
            now = monotonic()
            if now >= clock.deadline:
                self._lose("the deadline passed before a renew succeeded")
                return False
            if now >= t:
                return True
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), min(t, clock.deadline, now + 5.0) - now)
            except asyncio.TimeoutError:
                pass

    async def _run(self) -> None:
        clock = self.clock
        conn: Optional[psycopg.AsyncConnection] = None
        next_at = clock.sent + self.interval
        try:
            while True:
                if conn is None:
                    if not await self._wait_until(monotonic()):
                        return
                    try:
                        conn = await self.source.keepalive_connection(self.interval, self.ttl,
                                                                      clock.deadline - monotonic())
                    except Exception as e:
                        log.warning("fenced_lock: keepalive of %r cannot connect, retrying: %s", self.name, e)
                        if not await self._wait_until(monotonic() + c.retry_delay(self.interval)):
                            return
                        continue
                if not await self._wait_until(next_at):
                    return
                try:
                    sent = monotonic()
                    cur = await conn.execute(c.KEEPALIVE_RENEW_SQL, (self.lock_timeout, self.name, self.token))
                    live = (await cur.fetchone())[1]
                except Exception as e:
                    blocked = isinstance(e, psycopg.errors.LockNotAvailable)
                    if not blocked:
                        log.warning("fenced_lock: renew of %r failed, retrying: %s", self.name, e)
                    if not c.usable(conn):
                        await self.source.give_back(conn, keepalive=True)
                        conn = None
                    next_at = monotonic() + (0.0 if blocked else c.retry_delay(self.interval))
                    continue
                if not live:
                    self._lose("the lease is no longer live (renew returned false)")
                    return
                if clock.renewed(sent, self.ttl):
                    next_at = sent + self.interval
                    lease = self.lease()
                    if lease is not None:
                        lease._call(lease._on_renewed)
                    del lease
        finally:
            if conn is not None:
                if conn.info.transaction_status == TransactionStatus.ACTIVE:
                    # Cancelled in the middle of a renew: the connection
                    # cannot be used again.
                    await conn.close()
                await self.source.give_back(conn, keepalive=True)


class AsyncLease(c.LeaseBase):
    """A granted lease, for asyncio: as `Lease`, with `lost` an
    `asyncio.Event`, `conn` an `AsyncConnection`, and `async with lease:`."""

    conn: Optional[psycopg.AsyncConnection]

    def __init__(self, locker: "AsyncLocker", req: c.Request, token: int, conn: psycopg.AsyncConnection,
                 owned: bool, sent: float, keepalive: bool, interval: float, on_lost, on_renewed):
        super().__init__(req, token, conn, owned, sent, keepalive, interval, on_lost, on_renewed)
        self.lost = asyncio.Event()
        self._locker = locker
        self._release_lock = asyncio.Lock()
        self._keepalive: Optional[_AsyncKeepalive] = None
        self._timer: Optional[asyncio.TimerHandle] = None
        self._tasks: Set[asyncio.Task] = set()

    async def renew(self, ttl: Optional[Seconds] = None) -> bool:
        """Renew now, on the lease's connection (see `Lease.renew`)."""
        ttl_s = self._ttl_s if ttl is None else c.seconds(ttl, "ttl")
        if self._clock.state != HELD:
            return False
        conn = self.conn
        if conn is None or not c.usable(conn) or conn.info.transaction_status != TransactionStatus.IDLE:
            raise UsageError("renew needs the lease's connection open and outside a transaction "
                             "(inside one, the renew would not count until the commit)")
        sent = monotonic()
        try:
            live = await _run_alone(conn, "SELECT fenced_lock_renew(%s, %s, %s)",
                                    (self.name, self.token, timedelta(seconds=ttl_s)))
        except psycopg.Error as e:
            _raise_typed(e, conn)
        if not live:
            self._lose("the lease is no longer live (renew returned false)")
            return False
        self._clock.renewed(sent, ttl_s)
        self._arm()
        return True

    async def release(self) -> bool:
        """Release the lease (see `Lease.release`: the keepalive is stopped
        first and its connection closed before this returns)."""
        async with self._release_lock:
            if self._release_sent:
                return False
            self._release_sent = True
            await self._stop_keepalive()
            why_not = self._clock.begin_release()
            if why_not is not None:
                if why_not == c.LOST_NOW:
                    self._signal_lost()
                if not c.caller_transaction_open(self.conn):
                    await self._give_back_conn()
                return False
            try:
                return await self._send_release()
            finally:
                self._clock.end()
                self._disarm()
                if not c.caller_transaction_open(self.conn):
                    await self._give_back_conn()

    async def close(self) -> None:
        """Release unless lost or released, and give the connection back if
        the locker opened it. `async with` calls this."""
        try:
            await self.release()
        finally:
            await self._give_back_conn()

    async def __aenter__(self) -> "AsyncLease":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- keepalive and loss ------------------------------------------------------

    def _start(self) -> None:
        if self.keepalive:
            self._keepalive = _AsyncKeepalive(self, self._locker._source, self.interval)
            self._keepalive.start()
        self._arm()

    def _arm(self) -> None:
        """The deadline timer: signals lost when the deadline passes, whatever
        the keepalive task is waiting for."""
        self._disarm()
        if self._clock.state == HELD:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(0.0, self._clock.deadline - monotonic()), _deadline_reached,
                                          weakref.ref(self))

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _deadline_reached(self) -> None:
        self._timer = None
        if self._clock.state != HELD:
            return
        if self._clock.expired():
            self._lose("the deadline passed before a renew succeeded")
        else:
            self._arm()

    async def _stop_keepalive(self) -> None:
        if self._keepalive is not None:
            if not await self._keepalive.stop(timeout=self.remaining + 1.0):
                log.warning("fenced_lock: the keepalive of %r was still in a renew past the deadline", self.name)

    def _lose(self, reason: str) -> None:
        if self._clock.lose(reason):
            self._signal_lost()

    def _signal_lost(self) -> None:
        self.lost.set()
        self._disarm()
        if self._keepalive is not None:
            self._keepalive.request_stop()
        if self._on_lost is not None:
            asyncio.get_running_loop().call_soon(self._call, self._on_lost)

    def _call(self, fn: Optional[Callable]) -> None:
        """Run a callback; a coroutine it returns runs as a task of its own."""
        if fn is None:
            return
        try:
            result = fn(self)
        except Exception:
            log.exception("fenced_lock: callback %r raised", fn)
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self._tasks.add(task)
            task.add_done_callback(self._callback_done)

    def _callback_done(self, task: asyncio.Future) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("fenced_lock: callback raised", exc_info=task.exception())

    async def _abandon(self, reason: str) -> None:
        """Drop the lease without a release (the retry helper, after FL001)."""
        self._release_sent = True
        self._lose(reason)
        await self._stop_keepalive()
        self._clock.end()
        self._disarm()
        conn = self.conn
        if conn is not None and c.usable(conn) and conn.info.transaction_status == TransactionStatus.INERROR:
            await conn.rollback()
        await self._give_back_conn()

    # -- the release itself --------------------------------------------------------

    async def _send_release(self) -> bool:
        conn = self.conn
        params = (self.name, self.token)
        if conn is not None and c.usable(conn):
            status = conn.info.transaction_status
            try:
                if status == TransactionStatus.INERROR:
                    await conn.rollback()  # it cannot commit anyway
                    status = TransactionStatus.IDLE
                if status == TransactionStatus.IDLE:
                    return await _run_alone(conn, c.RELEASE_SQL, params)
                cur = await conn.execute(c.RELEASE_SQL, params)
                return (await cur.fetchone())[0]
            except psycopg.Error as e:
                if c.usable(conn):
                    _raise_typed(e, conn)
                log.warning("fenced_lock: the lease's connection failed during the release of %r, "
                            "sending it on a new one: %s", self.name, e)
        source = self._locker._source
        other = await source.lease_connection()
        try:
            return await _run_alone(other, c.RELEASE_SQL, params)
        except psycopg.Error as e:
            _raise_typed(e, other)
        finally:
            await source.give_back(other)

    async def _give_back_conn(self) -> None:
        if self._owned and self.conn is not None:
            conn, self.conn = self.conn, None
            await self._locker._source.give_back(conn)


def _deadline_reached(ref: "weakref.ref[AsyncLease]") -> None:
    """The deadline timer, holding the lease weakly (a lease dropped without
    a release is not kept by its timer)."""
    lease = ref()
    if lease is not None:
        lease._deadline_reached()


async def _run_alone(conn: psycopg.AsyncConnection, query: str, params: tuple):
    if conn.autocommit:
        cur = await conn.execute(query, params)
        return (await cur.fetchone())[0]
    async with conn.transaction():
        cur = await conn.execute(query, params)
        return (await cur.fetchone())[0]


def _raise_typed(e: BaseException, conn=None):
    t = c.typed(e, conn)
    if t is e:
        raise e
    raise t from e


class AsyncLocker:
    """`Locker` for asyncio: `source` is a connection string, a psycopg_pool
    ``AsyncConnectionPool``, or a callable returning a psycopg
    ``AsyncConnection`` (or an awaitable of one). Same options."""

    def __init__(self, source: Any, *, keepalive_interval: Optional[Seconds] = None,
                 attempts: int = c.DEFAULT_ATTEMPTS, transaction_pooling: bool = False):
        self.transaction_pooling = c.flag(transaction_pooling, "transaction_pooling")
        self._source = _AsyncSource(source, self.transaction_pooling)
        self.keepalive_interval = None if keepalive_interval is None else \
            c.seconds(keepalive_interval, "keepalive_interval")
        self.attempts = c.positive_int(attempts, "attempts")

    async def try_acquire(self, name: str, ttl: Seconds = c.DEFAULT_TTL, holder: Optional[str] = None,
                          session_bound: bool = False, shared: bool = False, permits: int = 1, *,
                          conn: Optional[psycopg.AsyncConnection] = None, keepalive: bool = True,
                          on_lost: Optional[Callable] = None,
                          on_renewed: Optional[Callable] = None) -> Optional[AsyncLease]:
        """`fenced_lock_try_acquire`: an AsyncLease now, or None."""
        req = c.request(name, ttl, None, holder, session_bound, shared, permits, waiting=False)
        return await self._acquire(req, False, conn, keepalive, on_lost, on_renewed)

    def acquire(self, name: str, ttl: Seconds = c.DEFAULT_TTL, wait: Optional[Seconds] = None,
                holder: Optional[str] = None, session_bound: bool = False, shared: bool = False,
                permits: int = 1, *, conn: Optional[psycopg.AsyncConnection] = None, keepalive: bool = True,
                on_lost: Optional[Callable] = None, on_renewed: Optional[Callable] = None) -> "_Acquiring":
        """`fenced_lock_acquire`: ``lease = await locker.acquire(name)``, or
        ``async with locker.acquire(name) as lease:``. Arguments are checked
        here, before anything is awaited."""
        req = c.request(name, ttl, wait, holder, session_bound, shared, permits, waiting=True)
        self._check(req, conn, keepalive, on_lost, on_renewed)
        return _Acquiring(self._acquire(req, True, conn, keepalive, on_lost, on_renewed))

    async def run(self, name: str, fn: Callable[[AsyncLease], Union[Awaitable[T], T]], *,
                  attempts: Optional[int] = None, ttl: Seconds = c.DEFAULT_TTL, wait: Optional[Seconds] = None,
                  holder: Optional[str] = None, session_bound: bool = False, shared: bool = False,
                  permits: int = 1, conn: Optional[psycopg.AsyncConnection] = None, keepalive: bool = True,
                  on_lost: Optional[Callable] = None) -> T:
        """The retry helper (see `Locker.run`); `fn` may be a coroutine function."""
        if not callable(fn):
            raise InvalidArgument(f"fn must be callable, not {type(fn).__name__}", argument="fn")
        attempts = self.attempts if attempts is None else c.positive_int(attempts, "attempts")
        req = c.request(name, ttl, wait, holder, session_bound, shared, permits, waiting=True)
        self._check(req, conn, keepalive, on_lost, None)
        last: Optional[BaseException] = None
        for _ in range(attempts):
            lease = await self._acquire(req, True, conn, keepalive, on_lost, None)
            try:
                result = await _maybe_await(fn(lease))
            except BaseException as e:
                if not c.is_stale(e):
                    await lease.close()
                    raise
                await lease._abandon("a guarded write was refused (FL001)")
                last = e
                continue
            await lease.close()
            return result
        assert last is not None
        raise last

    def _check(self, req: c.Request, conn, keepalive, on_lost, on_renewed) -> float:
        c.flag(keepalive, "keepalive")
        c.callback(on_lost, "on_lost")
        c.callback(on_renewed, "on_renewed")
        interval = c.interval_for(self.keepalive_interval, req.ttl)
        if conn is not None and not isinstance(conn, psycopg.AsyncConnection):
            raise InvalidArgument(f"conn must be a psycopg AsyncConnection, not {type(conn).__name__}",
                                  argument="conn")
        c.check_usage(self.transaction_pooling, req.session_bound)
        if conn is not None:
            c.check_idle(conn)
        return interval

    async def _acquire(self, req: c.Request, waiting: bool, conn, keepalive: bool, on_lost,
                       on_renewed) -> Optional[AsyncLease]:
        interval = self._check(req, conn, keepalive, on_lost, on_renewed)
        owned = conn is None
        if owned:
            conn = await self._source.lease_connection()
        query, params = req.sql(waiting)
        try:
            if owned:
                c.check_idle(conn)
            sent = monotonic()
            token = await _run_alone(conn, query, params)
            lease = None if token is None else \
                AsyncLease(self, req, token, conn, owned, sent, keepalive, interval, on_lost, on_renewed)
            if lease is not None and waiting and monotonic() - sent >= interval:
                # The grant came at an unknown instant of the wait; the
                # deadline counts from the send: renew at once.
                await lease.renew()
        except BaseException as e:
            if owned:
                if conn.info.transaction_status == TransactionStatus.ACTIVE:
                    await conn.close()  # cancelled mid-call: the waiter leaves the line
                await self._source.give_back(conn)
            if isinstance(e, psycopg.Error):
                _raise_typed(e, conn)
            raise
        if lease is None:
            if owned:
                await self._source.give_back(conn)
            return None
        lease._start()
        return lease


class _Acquiring:
    """What `AsyncLocker.acquire` returns: await it for the lease, or use it
    in ``async with`` to release on the way out."""

    def __init__(self, coro):
        self._coro = coro
        self._lease: Optional[AsyncLease] = None

    def __await__(self):
        return self._coro.__await__()

    async def __aenter__(self) -> AsyncLease:
        self._lease = await self._coro
        return self._lease

    async def __aexit__(self, *exc) -> None:
        if self._lease is not None:
            await self._lease.close()
