"""Typed errors of fenced_lock (clients/README.md, "Errors").

Every error is a `psycopg.DatabaseError`, so code that already catches
psycopg's errors keeps working. Each type also derives from psycopg's own
class for its SQLSTATE where psycopg has one (`WaitTimeout` is a
`psycopg.errors.LockNotAvailable`, ...).

The extension's own codes (FL001, FL002, FL003) are registered with psycopg
when this module is imported: from then on every guarded write that fails
with FL001, on any psycopg connection of the process, raises `StaleToken`.
Nothing else uses those codes, so that changes nothing for other code. The
standard codes (22023, 25006, 42501, 55P03) are not registered, since that
would relabel every permission or lock error of the application; they are
translated only for the library's own calls.
"""

from __future__ import annotations

from typing import Optional

import psycopg
import psycopg.errors as pe

__all__ = [
    "FencedLockError",
    "StaleToken",
    "MissingToken",
    "ModeConflict",
    "WaitTimeout",
    "ReadOnly",
    "NotAllowed",
    "InvalidArgument",
    "UsageError",
]


class FencedLockError(psycopg.DatabaseError):
    """Base of every error this library raises.

    `sqlstate`, `message`, `detail` and `hint` are the server's (`None` where
    the server said nothing, or for errors raised before anything was sent).
    """

    @property
    def message(self) -> str:
        return self.diag.message_primary or (str(self.args[0]) if self.args else "")

    @property
    def detail(self) -> Optional[str]:
        return self.diag.message_detail

    @property
    def hint(self) -> Optional[str]:
        return self.diag.message_hint


class StaleToken(FencedLockError, code="FL001"):
    """FL001: a guarded write or `fenced_lock_assert` with a token that is not
    the live lease. Nothing was written; acquire again, re-read, retry."""


class MissingToken(FencedLockError, code="FL002"):
    """FL002: a guarded write without a token."""


class ModeConflict(FencedLockError, code="FL003"):
    """FL003: the request can never be granted as asked (another permit count
    or mode is live on the name, an upgrade from shared to exclusive, or a
    wait for a lease of this very session)."""


class WaitTimeout(FencedLockError, pe.LockNotAvailable):
    """55P03: `acquire` waited `wait` (or `lock_timeout`) without a grant."""


class ReadOnly(FencedLockError, pe.ReadOnlySqlTransaction):
    """25006: a lease change on a standby or in a read-only transaction."""


class NotAllowed(FencedLockError, pe.InsufficientPrivilege):
    """42501: renew or release of another role's lease, a role without
    EXECUTE on the functions, and the like."""


class InvalidArgument(FencedLockError, pe.InvalidParameterValue, ValueError):
    """22023: a bad argument value.

    Raised by the client, before anything is sent, for what it can judge (an
    empty name, a ttl <= 0, ...; `argument` names the argument), and for the
    server's 22023 (an over-long name, a ttl above `fenced_lock.max_ttl`), in
    which case `argument` is None. It is also a `ValueError`.
    """

    def __init__(self, *args, argument: Optional[str] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.argument = argument


class UsageError(FencedLockError, psycopg.ProgrammingError):
    """The call cannot be made in this state (an acquire on a connection
    inside a transaction, a session-bound lease with transaction pooling).
    Nothing was sent."""


# SQLSTATEs translated for the library's own calls; FL001-FL003 need no
# translation (psycopg builds them from the registration above).
_BY_SQLSTATE = {
    "55P03": WaitTimeout,
    "25006": ReadOnly,
    "42501": NotAllowed,
    "22023": InvalidArgument,
}


def translate(error: BaseException, encoding: str = "utf-8") -> BaseException:
    """The typed error for a psycopg error raised by one of the library's
    calls, or `error` itself when its SQLSTATE has no type of ours. The
    server's diagnostics are kept (same result object)."""
    if isinstance(error, FencedLockError) or not isinstance(error, psycopg.Error):
        return error
    cls = _BY_SQLSTATE.get(error.sqlstate or "")
    if cls is None:
        return error
    return cls(*error.args, info=error.pgresult, encoding=encoding)
