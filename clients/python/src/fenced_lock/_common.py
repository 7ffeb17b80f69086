"""What the sync and the asyncio clients share: argument checks, the SQL they
send, the lease's clock and state, the sources of connections."""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Optional, Tuple, Union

import psycopg
from psycopg.pq import TransactionStatus

from .errors import InvalidArgument, UsageError, translate

log = logging.getLogger("fenced_lock")

Seconds = Union[int, float, timedelta]

KEEPALIVE_APPLICATION_NAME = "fenced_lock_keepalive"
DEFAULT_TTL = 30.0
DEFAULT_ATTEMPTS = 5

# The keepalive's renew. Its lock_timeout is set for this statement's own
# transaction (set_config(..., true), evaluated before the renew in the
# target list), so that nothing is left in the session: behind a transaction
# pooler the session is shared with other clients.
KEEPALIVE_RENEW_SQL = "SELECT set_config('lock_timeout', %s, true), fenced_lock_renew(%s, %s)"
RELEASE_SQL = "SELECT fenced_lock_release(%s, %s)"

# Lease states. Lost is reached only from HELD: once release has begun the
# caller has finished its work, and the release's own answer says whether the
# lease was still live.
HELD, RELEASING, ENDED, LOST = "held", "releasing", "ended", "lost"
LOST_NOW = "lost now"


def monotonic() -> float:
    return time.monotonic()


# -- arguments ---------------------------------------------------------------


def seconds(value: Any, argument: str, *, allow_zero: bool = False) -> float:
    """A duration given as seconds (int or float) or a timedelta, as float
    seconds; InvalidArgument naming `argument` for anything else, a value that
    is not finite, <= 0 (or < 0 with allow_zero)."""
    if isinstance(value, timedelta):
        s = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        s = float(value)
    else:
        raise InvalidArgument(f"{argument} must be a number of seconds or a timedelta, not {type(value).__name__}",
                              argument=argument)
    if not math.isfinite(s):
        raise InvalidArgument(f"{argument} must be finite, got {value!r}", argument=argument)
    if s < 0 or (s == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgument(f"{argument} must be {bound}, got {value!r}", argument=argument)
    if s > _LONGEST:
        raise InvalidArgument(f"{argument} is too long to send as an interval, got {value!r}", argument=argument)
    return s


# The longest duration a timedelta (and so an interval parameter) can carry;
# what the server accepts is shorter still (fenced_lock.max_ttl), for it to judge.
_LONGEST = timedelta.max.total_seconds()


def text(value: Any, argument: str, *, optional: bool) -> Optional[str]:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        kind = "a string or None" if optional else "a string"
        raise InvalidArgument(f"{argument} must be {kind}, not {type(value).__name__}", argument=argument)
    if "\x00" in value:
        raise InvalidArgument(f"{argument} must not contain NUL characters", argument=argument)
    return value


def flag(value: Any, argument: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{argument} must be True or False, not {value!r}", argument=argument)
    return value


def callback(value: Any, argument: str) -> Optional[Callable]:
    if value is not None and not callable(value):
        raise InvalidArgument(f"{argument} must be callable or None, not {type(value).__name__}", argument=argument)
    return value


def positive_int(value: Any, argument: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{argument} must be an integer, not {value!r}", argument=argument)
    if value < 1:
        raise InvalidArgument(f"{argument} must be >= 1, got {value}", argument=argument)
    return value


@dataclass(frozen=True)
class Request:
    """One acquire, checked."""

    name: str
    ttl: float
    wait: Optional[float]
    holder: Optional[str]
    session_bound: bool
    shared: bool
    permits: int

    def sql(self, waiting: bool) -> Tuple[str, tuple]:
        """The statement and its parameters. `shared` and `permits` are sent
        only when they differ from their defaults, so that exclusive leases
        also work against a 0.2.0 server, whose functions lack them."""
        args = ["name => %s", "ttl => %s"]
        params: list = [self.name, timedelta(seconds=self.ttl)]
        if waiting:
            args.append("wait => %s::interval")
            params.append(None if self.wait is None else timedelta(seconds=self.wait))
        args += ["holder => %s::text", "session_bound => %s"]
        params += [self.holder, self.session_bound]
        if self.shared:
            args.append("shared => %s")
            params.append(True)
        if self.permits != 1:
            args.append("permits => %s")
            params.append(self.permits)
        fn = "fenced_lock_acquire" if waiting else "fenced_lock_try_acquire"
        return f"SELECT {fn}({', '.join(args)})", tuple(params)


def request(name, ttl, wait, holder, session_bound, shared, permits, *, waiting: bool) -> Request:
    name = text(name, "name", optional=False)
    if name == "":
        raise InvalidArgument("name must not be empty", argument="name")
    ttl_s = seconds(ttl, "ttl")
    wait_s = None if (wait is None or not waiting) else seconds(wait, "wait", allow_zero=True)
    holder = text(holder, "holder", optional=True)
    session_bound = flag(session_bound, "session_bound")
    shared = flag(shared, "shared")
    permits = positive_int(permits, "permits")
    if shared and permits > 1:
        raise InvalidArgument("permits must be 1 for a shared lease (shared=True with permits > 1)",
                              argument="permits")
    return Request(name, ttl_s, wait_s, holder, session_bound, shared, permits)


def interval_for(locker_interval: Optional[float], ttl: float) -> float:
    """The keepalive interval of one lease: the locker's, or ttl/3."""
    interval = ttl / 3 if locker_interval is None else locker_interval
    if interval >= ttl:
        raise InvalidArgument(f"keepalive_interval ({interval:g} s) must be shorter than the ttl ({ttl:g} s)",
                              argument="keepalive_interval")
    return interval


def retry_delay(interval: float) -> float:
    """How soon a renew that failed is tried again (clients/README.md,
    "Keepalive": every min(interval, 1 s))."""
    return min(interval, 1.0)


def lock_timeout_ms(interval: float) -> int:
    """The keepalive renew's lock_timeout. A renew waits for any other change
    of the same lease in a transaction still open: another renew, a
    fenced_lock_proclaim, a release not yet committed (on a 0.2.0 server, any
    guarded write of the holder's too). That transaction may be the holder's
    own, whose release waits for the renew in flight: a renew must not sit
    behind it for long, or the keepalive could neither stop nor retry. It
    gives up after this and tries again at once."""
    return max(50, min(500, int(interval * 500)))


def check_usage(transaction_pooling: bool, session_bound: bool) -> None:
    if transaction_pooling and session_bound:
        raise UsageError(
            "session_bound=True is refused with transaction_pooling=True: behind a transaction pooler "
            "the session is a pooled server connection that other clients share, so the lease would "
            "end with their session, not yours; use a plain lease (a ttl kept alive by the keepalive)")


def check_idle(conn) -> None:
    """An acquire must run outside a transaction: the grant must be committed
    before the keepalive's renew, on another connection, can see it."""
    if conn.closed:
        raise UsageError("the connection is closed")
    status = conn.info.transaction_status
    if status != TransactionStatus.IDLE:
        raise UsageError(f"acquire needs a connection outside a transaction (this one is {status.name}): "
                         "the grant must be committed before it can be kept alive; commit or roll back first")


def usable(conn) -> bool:
    return conn is not None and not conn.closed and not conn.broken and \
        conn.info.transaction_status != TransactionStatus.UNKNOWN


def encoding_of(conn) -> str:
    try:
        return conn.info.encoding
    except Exception:
        return "utf-8"


def typed(error: BaseException, conn=None) -> BaseException:
    return translate(error, encoding_of(conn) if conn is not None else "utf-8")


def is_stale(error: BaseException) -> bool:
    return isinstance(error, psycopg.Error) and error.sqlstate == "FL001"


# -- the lease's clock and state ---------------------------------------------


class Clock:
    """The lease's state and its expiry on this process's monotonic clock:
    the instant the acquire, or the last successful renew, was sent, plus the
    ttl of that call. The server set its expiry when it ran the call, later
    than the send, so this is never later than the server's expiry."""

    def __init__(self, sent: float, ttl: float):
        self.lock = threading.Lock()
        self.state = HELD
        self.sent = sent
        self.deadline = sent + ttl
        self.lost_reason: Optional[str] = None

    def renewed(self, sent: float, ttl: float) -> bool:
        """Record a successful renew sent at `sent`; False if the lease is no
        longer held (a loss was signalled while the renew was in flight)."""
        with self.lock:
            if self.state not in (HELD, RELEASING):
                return False
            if sent >= self.sent:
                self.sent, self.deadline = sent, sent + ttl
            return True

    def lose(self, reason: str) -> bool:
        """Move to LOST; True exactly once, for the caller that must signal it."""
        with self.lock:
            if self.state != HELD:
                return False
            self.state, self.lost_reason = LOST, reason
            return True

    def expired(self) -> bool:
        return monotonic() >= self.deadline

    def begin_release(self) -> Optional[str]:
        """HELD and before the deadline: move to RELEASING and return None.
        Otherwise the reason not to send a release: LOST_NOW (the deadline
        passed: a loss the caller must signal now) or the state it is in."""
        with self.lock:
            if self.state == HELD:
                if monotonic() < self.deadline:
                    self.state = RELEASING
                    return None
                self.state, self.lost_reason = LOST, "the deadline passed before a renew succeeded"
                return LOST_NOW
            return self.state

    def end(self) -> None:
        with self.lock:
            if self.state in (HELD, RELEASING):
                self.state = ENDED


def is_pool(source: Any) -> bool:
    return hasattr(source, "getconn") and hasattr(source, "putconn")


def pooler_kwargs(transaction_pooling: bool) -> dict:
    """Options of the connections a locker opens itself, behind a
    transaction pooler: no server-side prepared statements, which live in a
    server session that the next transaction may not get (psycopg prepares a
    statement it has run 5 times, as the keepalive's renew soon is)."""
    return {"prepare_threshold": None} if transaction_pooling else {}


def keepalive_connect_kwargs(interval: float, ttl: float, remaining: float) -> dict:
    """Options of a keepalive connection opened from a connection string: its
    name in pg_stat_activity, and bounds on how long a connect or a silent
    network can hold up the keepalive (the deadline is kept by the watchdog
    either way; these let the keepalive thread itself move on)."""
    return {
        "autocommit": True,
        "application_name": KEEPALIVE_APPLICATION_NAME,
        "connect_timeout": max(2, int(math.ceil(min(max(remaining, 0.0), 10.0)))),
        "keepalives": 1,
        "keepalives_idle": max(1, int(interval)),
        "keepalives_interval": 1,
        "keepalives_count": 3,
        "tcp_user_timeout": max(1000, int(ttl * 1000)),
    }


SET_KEEPALIVE_NAME_SQL = f"SET application_name = '{KEEPALIVE_APPLICATION_NAME}'"
RESET_KEEPALIVE_NAME_SQL = "RESET application_name"


class LeaseBase:
    """What a lease is, sync or async: `name`, `token`, `ttl` (a timedelta),
    the options it was taken with, and its connection `conn`."""

    def __init__(self, req: Request, token: int, conn: Any, owned: bool, sent: float, keepalive: bool,
                 interval: float, on_lost: Optional[Callable], on_renewed: Optional[Callable]):
        self.name = req.name
        self.token = token
        self.ttl = timedelta(seconds=req.ttl)
        self.holder = req.holder
        self.session_bound = req.session_bound
        self.shared = req.shared
        self.permits = req.permits
        self.keepalive = keepalive
        self.interval = interval
        self.conn = conn
        self._ttl_s = req.ttl
        self._owned = owned
        self._clock = Clock(sent, req.ttl)
        self._on_lost = on_lost
        self._on_renewed = on_renewed
        self._release_sent = False

    def __repr__(self) -> str:
        return f"<fenced_lock.{type(self).__name__} {self.name!r} token={self.token} {self._clock.state}>"

    @property
    def lost_reason(self) -> Optional[str]:
        """Why the lease was lost (None while it is not)."""
        return self._clock.lost_reason

    @property
    def remaining(self) -> float:
        """Seconds until the lease's deadline on this process's clock (never
        later than the server's expiry); 0 once passed."""
        return max(0.0, self._clock.deadline - monotonic())

    @property
    def held(self) -> bool:
        """Neither lost nor released (nor being released)."""
        return self._clock.state == HELD


def caller_transaction_open(conn: Any) -> bool:
    """Is the caller in the middle of a transaction on `conn`, even a failed
    one, so that it cannot be given back yet (the caller's own `with
    conn.transaction()` ends it)?"""
    return usable(conn) and conn.info.transaction_status != TransactionStatus.IDLE
