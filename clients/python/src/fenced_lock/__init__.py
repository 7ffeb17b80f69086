"""fenced_lock: leased named locks with fencing tokens, kept in PostgreSQL.

A client of the fenced_lock extension over psycopg 3 (clients/README.md is
its contract)::

    from fenced_lock import Locker

    locker = Locker("postgresql://app@db/app")
    with locker.acquire("inventory:1", ttl=30) as lease:
        lease.conn.execute("UPDATE inventory SET stock = stock - 1, fence_token = %s "
                           "WHERE item_id = 1", (lease.token,))

`AsyncLocker` is the same for asyncio.
"""

from .errors import (FencedLockError, InvalidArgument, MissingToken, ModeConflict, NotAllowed, ReadOnly,
                     StaleToken, UsageError, WaitTimeout)
from ._common import KEEPALIVE_APPLICATION_NAME
from ._sync import Lease, Locker
from ._async import AsyncLease, AsyncLocker

__version__ = "0.3.0"

__all__ = [
    "Locker", "Lease", "AsyncLocker", "AsyncLease",
    "FencedLockError", "StaleToken", "MissingToken", "ModeConflict", "WaitTimeout", "ReadOnly",
    "NotAllowed", "InvalidArgument", "UsageError",
    "KEEPALIVE_APPLICATION_NAME", "__version__",
]
