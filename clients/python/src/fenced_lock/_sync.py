"""The synchronous client: Locker, Lease, the keepalive thread and the
watchdog (clients/README.md is the contract)."""

from __future__ import annotations

import heapq
import itertools
import threading
import weakref
from datetime import timedelta
from typing import Any, Callable, Optional, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from . import _common as c
from ._common import HELD, Seconds, log, monotonic
from .errors import InvalidArgument, UsageError

T = TypeVar("T")

__all__ = ["Locker", "Lease"]


class _Source:
    """Where a locker gets connections: a connection string, a psycopg_pool
    ConnectionPool, or a factory. Connections it hands out are given back to
    it (closed, or returned to the pool as they were)."""

    def __init__(self, source: Any, transaction_pooling: bool):
        if isinstance(source, str):
            self.kind = "conninfo"
        elif c.is_pool(source):
            self.kind = "pool"
        elif callable(source):
            self.kind = "factory"
        else:
            raise InvalidArgument("source must be a connection string, a ConnectionPool or a callable returning "
                                  f"a psycopg Connection, not {type(source).__name__}", argument="source")
        self.source = source
        self.connect_kwargs = c.pooler_kwargs(transaction_pooling)
        # What the keepalive changed on a connection it did not open (its
        # autocommit, its prepare_threshold), by id(conn), to be put back
        # before it returns to the pool.
        self._saved: dict = {}

    def lease_connection(self) -> psycopg.Connection:
        if self.kind == "conninfo":
            return psycopg.connect(self.source, autocommit=True, **self.connect_kwargs)
        if self.kind == "pool":
            return self.source.getconn()
        conn = self.source()
        if not isinstance(conn, psycopg.Connection):
            raise InvalidArgument(f"the factory returned {type(conn).__name__}, not a psycopg Connection",
                                  argument="source")
        return conn

    def keepalive_connection(self, interval: float, ttl: float, remaining: float) -> psycopg.Connection:
        if self.kind == "conninfo":
            return psycopg.connect(self.source, **c.keepalive_connect_kwargs(interval, ttl, remaining),
                                   **self.connect_kwargs)
        if self.kind == "pool":
            conn = self.source.getconn(timeout=max(0.1, remaining))
        else:
            conn = self.lease_connection()
        try:
            self._saved[id(conn)] = (conn.autocommit, conn.prepare_threshold)
            conn.autocommit = True
            if self.connect_kwargs:
                conn.prepare_threshold = None
            conn.execute(c.SET_KEEPALIVE_NAME_SQL)
        except BaseException:
            self.give_back(conn, keepalive=True)
            raise
        return conn

    def give_back(self, conn: psycopg.Connection, keepalive: bool = False) -> None:
        saved = self._saved.pop(id(conn), None)
        try:
            if self.kind != "pool":
                conn.close()
                return
            if keepalive and c.usable(conn):
                try:
                    conn.execute(c.RESET_KEEPALIVE_NAME_SQL)
                    if saved is not None:
                        conn.autocommit, conn.prepare_threshold = saved
                except psycopg.Error:
                    pass  # the pool checks the connection and drops it if broken
            self.source.putconn(conn)
        except Exception as e:  # giving a connection back must never hide the caller's result
            log.warning("fenced_lock: could not give a connection back: %s", e)


class _Watchdog:
    """Signals a lease lost when its deadline passes, whatever its keepalive
    thread is doing (a renew stuck on a silent network, a reconnect). One
    thread for the process; it does no I/O and runs no user code (callbacks
    run on threads of their own), so nothing can stall it."""

    def __init__(self):
        self._cv = threading.Condition()
        self._heap: list = []
        self._seq = itertools.count()
        self._thread: Optional[threading.Thread] = None

    def watch(self, lease: "Lease", deadline: float) -> None:
        with self._cv:
            heapq.heappush(self._heap, (deadline, next(self._seq), weakref.ref(lease)))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="fenced_lock watchdog", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap:
                    self._cv.wait()
                deadline, _, ref = self._heap[0]
                now = monotonic()
                if now < deadline:
                    self._cv.wait(deadline - now)
                    continue
                heapq.heappop(self._heap)
            lease = ref()
            if lease is not None:
                lease._deadline_reached()


_watchdog = _Watchdog()


class _Keepalive:
    """One lease's renewals, on a thread and a connection of their own.

    It holds the lease weakly: a lease the program dropped without releasing
    it is not renewed forever by a thread nobody can reach; it is left to
    expire at its ttl."""

    def __init__(self, lease: "Lease", source: _Source, interval: float):
        self.lease = weakref.ref(lease)
        self.clock = lease._clock
        self.name, self.token, self.ttl = lease.name, lease.token, lease._ttl_s
        self.source = source
        self.interval = interval
        self.lock_timeout = f"{c.lock_timeout_ms(interval)}ms"
        self.cv = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name=f"fenced_lock keepalive {lease.name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float) -> bool:
        """Stop renewing; wait (at most `timeout`) for a renew in flight to
        finish and the connection to be given back. True if it finished."""
        with self.cv:
            self.stopping = True
            self.cv.notify_all()
        if self.thread is threading.current_thread():
            return True  # called from on_renewed: the loop ends when the callback returns
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def _lose(self, reason: str) -> None:
        lease = self.lease()
        if lease is not None:
            lease._lose(reason)

    def _wait_until(self, t: float) -> bool:
        """Sleep until `t`; False if the keepalive must end instead (stopped,
        lost, released, dropped, or the deadline came first, which loses the
        lease). The clock is read on every wake-up, so after a pause
        (SIGSTOP, a stopped VM) a passed deadline is seen before anything is
        sent."""
        clock = self.clock
        with self.cv:
            while True:
                if self.stopping or clock.state != HELD or self.lease() is None:
                    return False
                now = monotonic()
                if now >= clock.deadline:
                    self._lose("the deadline passed before a renew succeeded")
                    return False
                if now >= t:
                    return True
                # Bounded, so that a dropped lease is noticed.
                self.cv.wait(min(t, clock.deadline, now + 5.0) - now)

    def _run(self) -> None:
        clock = self.clock
        conn: Optional[psycopg.Connection] = None
        next_at = clock.sent + self.interval
        try:
            while True:
                if conn is None:
                    # Opened as soon as the lease is granted, and again after
                    # a connection error, until the deadline.
                    if not self._wait_until(monotonic()):
                        return
                    try:
                        conn = self.source.keepalive_connection(self.interval, self.ttl,
                                                                clock.deadline - monotonic())
                    except Exception as e:
                        log.warning("fenced_lock: keepalive of %r cannot connect, retrying: %s", self.name, e)
                        if not self._wait_until(monotonic() + c.retry_delay(self.interval)):
                            return
                        continue
                if not self._wait_until(next_at):
                    return
                try:
                    sent = monotonic()
                    row = conn.execute(c.KEEPALIVE_RENEW_SQL, (self.lock_timeout, self.name, self.token)).fetchone()
                    live = row[1]
                except Exception as e:
                    # Never stop on an error: retry (on a new connection if
                    # this one is broken) until a renew succeeds or the
                    # deadline passes. A lock timeout means an open
                    # transaction holds a change of this lease (see
                    # lock_timeout_ms): try again at once.
                    blocked = isinstance(e, psycopg.errors.LockNotAvailable)
                    if not blocked:
                        log.warning("fenced_lock: renew of %r failed, retrying: %s", self.name, e)
                    if not c.usable(conn):
                        self.source.give_back(conn, keepalive=True)
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
                self.source.give_back(conn, keepalive=True)


class Lease(c.LeaseBase):
    """A granted lease: `name`, `token`, `ttl`, the options it was taken with,
    and its connection `conn` (on which to make the guarded writes).

    `lost` is a `threading.Event`, set once the lease is lost: stop the work,
    do not write (the database refuses such writes with FL001 anyway). A lost
    lease is never released by the client. `with lease:` releases on the way
    out, unless it was lost.
    """

    conn: Optional[psycopg.Connection]

    def __init__(self, locker: "Locker", req: c.Request, token: int, conn: psycopg.Connection, owned: bool,
                 sent: float, keepalive: bool, interval: float,
                 on_lost: Optional[Callable[["Lease"], Any]], on_renewed: Optional[Callable[["Lease"], Any]]):
        super().__init__(req, token, conn, owned, sent, keepalive, interval, on_lost, on_renewed)
        self.lost = threading.Event()
        self._locker = locker
        self._release_lock = threading.Lock()
        self._keepalive: Optional[_Keepalive] = None

    # -- what the caller asks --------------------------------------------------

    def renew(self, ttl: Optional[Seconds] = None) -> bool:
        """Renew now, on the lease's connection, for `ttl` (None: the ttl it
        was granted with). False if the lease is no longer live (then it is
        lost); False without a round trip once lost or released."""
        ttl_s = self._ttl_s if ttl is None else c.seconds(ttl, "ttl")
        if self._clock.state != HELD:
            return False
        conn = self.conn
        if conn is None or not c.usable(conn) or conn.info.transaction_status != TransactionStatus.IDLE:
            raise UsageError("renew needs the lease's connection open and outside a transaction "
                               "(inside one, the renew would not count until the commit)")
        sent = monotonic()
        try:
            live = _run_alone(conn, "SELECT fenced_lock_renew(%s, %s, %s)",
                              (self.name, self.token, timedelta(seconds=ttl_s)))
        except psycopg.Error as e:
            _raise_typed(e, conn)
        if not live:
            self._lose("the lease is no longer live (renew returned false)")
            return False
        self._renewed(sent, ttl_s)
        return True

    def release(self) -> bool:
        """Release the lease; the server's answer (False: it was no longer
        live). Stops the keepalive first, and waits for a renew in flight, so
        that no renew is sent after the release; the keepalive connection is
        closed before this returns. Inside a transaction on the lease's
        connection the release is part of it (it counts at COMMIT); a failed
        transaction is rolled back first; if the connection is gone, the
        release is sent on a new one. A second call returns False without a
        round trip, as does a release of a lost lease."""
        with self._release_lock:
            if self._release_sent:
                return False
            self._release_sent = True
            self._stop_keepalive()
            why_not = self._clock.begin_release()
            if why_not is not None:
                if why_not == c.LOST_NOW:
                    self._signal_lost()
                if not c.caller_transaction_open(self.conn):
                    self._give_back_conn()
                return False
            try:
                return self._send_release()
            finally:
                self._clock.end()
                if not c.caller_transaction_open(self.conn):
                    self._give_back_conn()

    def close(self) -> None:
        """End the lease's use: release it unless it was lost or released, and
        give its connection back if the locker opened it. `with` calls this."""
        try:
            self.release()
        finally:
            self._give_back_conn()

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- keepalive and loss ------------------------------------------------------

    def _start(self) -> None:
        if self.keepalive:
            self._keepalive = _Keepalive(self, self._locker._source, self.interval)
            self._keepalive.start()
        _watchdog.watch(self, self._clock.deadline)

    def _stop_keepalive(self) -> None:
        if self._keepalive is not None:
            # A renew in flight ends by itself within the keepalive's
            # lock_timeout, or its network bounds; past the deadline the
            # watchdog declares the lease lost, and no release is sent.
            if not self._keepalive.stop(timeout=self.remaining + 1.0):
                log.warning("fenced_lock: the keepalive of %r is still in a renew past the deadline", self.name)

    def _renewed(self, sent: float, ttl: float) -> bool:
        return self._clock.renewed(sent, ttl)

    def _deadline_reached(self) -> None:
        if self._clock.state != HELD:
            return
        if self._clock.expired():
            self._lose("the deadline passed before a renew succeeded")
        else:
            _watchdog.watch(self, self._clock.deadline)

    def _lose(self, reason: str) -> None:
        if self._clock.lose(reason):
            self._signal_lost()

    def _signal_lost(self) -> None:
        self.lost.set()
        if self._keepalive is not None:
            with self._keepalive.cv:
                self._keepalive.stopping = True
                self._keepalive.cv.notify_all()
        if self._on_lost is not None:
            # On a thread of its own: a slow callback must not hold up the
            # keepalive or the watchdog.
            threading.Thread(target=self._call, args=(self._on_lost,), name="fenced_lock on_lost",
                             daemon=True).start()

    def _call(self, fn: Optional[Callable[["Lease"], Any]]) -> None:
        if fn is None:
            return
        try:
            fn(self)
        except Exception:
            log.exception("fenced_lock: callback %r raised", fn)

    def _abandon(self, reason: str) -> None:
        """Drop the lease without a release (the retry helper, after FL001)."""
        with self._release_lock:
            self._release_sent = True
        self._lose(reason)
        self._stop_keepalive()
        self._clock.end()
        conn = self.conn
        if conn is not None and c.usable(conn) and conn.info.transaction_status == TransactionStatus.INERROR:
            conn.rollback()
        self._give_back_conn()

    # -- the release itself --------------------------------------------------------

    def _send_release(self) -> bool:
        conn = self.conn
        params = (self.name, self.token)
        if conn is not None and c.usable(conn):
            status = conn.info.transaction_status
            try:
                if status == TransactionStatus.INERROR:
                    conn.rollback()  # it cannot commit anyway
                    status = TransactionStatus.IDLE
                if status == TransactionStatus.IDLE:
                    return _run_alone(conn, c.RELEASE_SQL, params)
                return conn.execute(c.RELEASE_SQL, params).fetchone()[0]
            except psycopg.Error as e:
                if c.usable(conn):
                    _raise_typed(e, conn)
                log.warning("fenced_lock: the lease's connection failed during the release of %r, "
                            "sending it on a new one: %s", self.name, e)
        source = self._locker._source
        other = source.lease_connection()
        try:
            return _run_alone(other, c.RELEASE_SQL, params)
        except psycopg.Error as e:
            _raise_typed(e, other)
        finally:
            source.give_back(other)

    def _give_back_conn(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None and self._owned:
            self._locker._source.give_back(conn)
        elif conn is not None:
            self.conn = conn  # the caller's connection stays the caller's


def _run_alone(conn: psycopg.Connection, query: str, params: tuple):
    """Run one statement in a transaction of its own on an idle connection
    and return the first column of its row."""
    if conn.autocommit:
        return conn.execute(query, params).fetchone()[0]
    with conn.transaction():
        return conn.execute(query, params).fetchone()[0]


def _raise_typed(e: BaseException, conn=None):
    t = c.typed(e, conn)
    if t is e:
        raise e
    raise t from e


class Locker:
    """Takes leases of named locks over the connections of `source`: a
    connection string (a ``postgresql://`` URL or ``key=value`` string), a
    psycopg_pool ``ConnectionPool``, or a callable returning a psycopg
    ``Connection``.

    - `keepalive_interval`: seconds (or timedelta) between renewals; default
      ttl/3 of each lease; must be shorter than the ttl.
    - `attempts`: how many times `run` tries in all (default 5).
    - `transaction_pooling`: the connections go through a pooler in
      transaction mode (PgBouncer); session-bound leases are then refused.

    Each lease keeps one connection (its own, or one it takes and keeps until
    it ends) and its keepalive another: a pool needs two connections per lease
    held at the same time.
    """

    def __init__(self, source: Any, *, keepalive_interval: Optional[Seconds] = None,
                 attempts: int = c.DEFAULT_ATTEMPTS, transaction_pooling: bool = False):
        self.transaction_pooling = c.flag(transaction_pooling, "transaction_pooling")
        self._source = _Source(source, self.transaction_pooling)
        self.keepalive_interval = None if keepalive_interval is None else \
            c.seconds(keepalive_interval, "keepalive_interval")
        self.attempts = c.positive_int(attempts, "attempts")

    def try_acquire(self, name: str, ttl: Seconds = c.DEFAULT_TTL, holder: Optional[str] = None,
                    session_bound: bool = False, shared: bool = False, permits: int = 1, *,
                    conn: Optional[psycopg.Connection] = None, keepalive: bool = True,
                    on_lost: Optional[Callable[[Lease], Any]] = None,
                    on_renewed: Optional[Callable[[Lease], Any]] = None) -> Optional[Lease]:
        """`fenced_lock_try_acquire`: a Lease now, or None if the lock cannot be
        granted without waiting."""
        req = c.request(name, ttl, None, holder, session_bound, shared, permits, waiting=False)
        return self._acquire(req, False, conn, keepalive, on_lost, on_renewed)

    def acquire(self, name: str, ttl: Seconds = c.DEFAULT_TTL, wait: Optional[Seconds] = None,
                holder: Optional[str] = None, session_bound: bool = False, shared: bool = False,
                permits: int = 1, *, conn: Optional[psycopg.Connection] = None, keepalive: bool = True,
                on_lost: Optional[Callable[[Lease], Any]] = None,
                on_renewed: Optional[Callable[[Lease], Any]] = None) -> Lease:
        """`fenced_lock_acquire`: waits in line (at most `wait`; None: until
        granted) and returns the Lease; `WaitTimeout` when `wait` runs out.
        Use it as ``with locker.acquire(name) as lease:``."""
        req = c.request(name, ttl, wait, holder, session_bound, shared, permits, waiting=True)
        return self._acquire(req, True, conn, keepalive, on_lost, on_renewed)

    def run(self, name: str, fn: Callable[[Lease], T], *, attempts: Optional[int] = None,
            ttl: Seconds = c.DEFAULT_TTL, wait: Optional[Seconds] = None, holder: Optional[str] = None,
            session_bound: bool = False, shared: bool = False, permits: int = 1,
            conn: Optional[psycopg.Connection] = None, keepalive: bool = True,
            on_lost: Optional[Callable[[Lease], Any]] = None) -> T:
        """Acquire (waiting), call ``fn(lease)``, release, return what `fn`
        returned. If `fn` raises StaleToken (FL001: the lease was lost and the
        database refused the write), the lease is dropped without a release
        and everything runs again from the acquire, up to `attempts` times in
        all; then the last StaleToken is raised. Any other error is raised at
        once, after the release."""
        if not callable(fn):
            raise InvalidArgument(f"fn must be callable, not {type(fn).__name__}", argument="fn")
        attempts = self.attempts if attempts is None else c.positive_int(attempts, "attempts")
        req = c.request(name, ttl, wait, holder, session_bound, shared, permits, waiting=True)
        c.callback(on_lost, "on_lost")
        last: Optional[BaseException] = None
        for _ in range(attempts):
            lease = self._acquire(req, True, conn, keepalive, on_lost, None)
            try:
                result = fn(lease)
            except BaseException as e:
                if not c.is_stale(e):
                    lease.close()
                    raise
                lease._abandon("a guarded write was refused (FL001)")
                last = e
                continue
            lease.close()
            return result
        assert last is not None
        raise last

    def _acquire(self, req: c.Request, waiting: bool, conn: Optional[psycopg.Connection], keepalive: bool,
                 on_lost, on_renewed) -> Optional[Lease]:
        keepalive = c.flag(keepalive, "keepalive")
        c.callback(on_lost, "on_lost")
        c.callback(on_renewed, "on_renewed")
        interval = c.interval_for(self.keepalive_interval, req.ttl)
        if conn is not None and not isinstance(conn, psycopg.Connection):
            raise InvalidArgument(f"conn must be a psycopg Connection, not {type(conn).__name__}", argument="conn")
        c.check_usage(self.transaction_pooling, req.session_bound)
        if conn is not None:
            c.check_idle(conn)
        owned = conn is None
        if owned:
            conn = self._source.lease_connection()
        query, params = req.sql(waiting)
        try:
            if owned:
                c.check_idle(conn)
            sent = monotonic()
            token = _run_alone(conn, query, params)
            lease = None if token is None else \
                Lease(self, req, token, conn, owned, sent, keepalive, interval, on_lost, on_renewed)
            if lease is not None and waiting and monotonic() - sent >= interval:
                # The grant came at some unknown instant of the wait, and
                # the deadline counts from the send: renew at once so the
                # lease does not start out (nearly) expired.
                lease.renew()
        except BaseException as e:
            if owned:
                self._source.give_back(conn)
            if isinstance(e, psycopg.Error):
                _raise_typed(e, conn)
            raise
        if lease is None:
            if owned:
                self._source.give_back(conn)
            return None
        lease._start()
        return lease
