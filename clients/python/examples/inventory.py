"""inventory --dsn DSN --item ID --sales N --ttl SECONDS

Sell up to N units of item ID, one sale at a time through the retry helper on
lock inventory:ID: acquire, read the stock, write stock - 1 with the token,
release. A sale whose lease was lost is refused by the database (FL001) and
runs again from the acquire, so every unit is sold exactly once."""

import asyncio
import os
import sys

from psycopg_pool import AsyncConnectionPool, ConnectionPool

from fenced_lock import AsyncLocker, Locker
from _cli import DONE, Parser, emit, emit_error

READ = "SELECT stock FROM inventory WHERE item_id = %s"
WRITE = "UPDATE inventory SET stock = %s, fence_token = %s WHERE item_id = %s"


def parse(argv):
    p = Parser(prog="inventory", description=__doc__)
    p.add_argument("--dsn", required=True)
    p.add_argument("--item", type=int, required=True)
    p.add_argument("--sales", type=int, required=True)
    p.add_argument("--ttl", type=float, required=True)
    return p.parse_args(argv)


def main(argv):
    a = parse(argv)
    if os.environ.get("FENCED_LOCK_EXAMPLE_ASYNC") == "1":
        return asyncio.run(main_async(a))
    # Two connections per lease held at a time: the lease's and its keepalive's.
    with ConnectionPool(a.dsn, min_size=2, max_size=2, kwargs={"autocommit": True}) as pool:
        locker = Locker(pool)
        attempt = 0

        def sell(lease):
            nonlocal attempt
            attempt += 1
            if attempt > 1:
                print(f"inventory: retrying a sale (attempt {attempt}) after a lost lease", file=sys.stderr)
            with lease.conn.transaction():
                (stock,) = lease.conn.execute(READ, (a.item,)).fetchone()
                if stock == 0:
                    return None
                lease.conn.execute(WRITE, (stock - 1, lease.token, a.item))
            return stock - 1

        sold = 0
        try:
            for _ in range(a.sales):
                attempt = 0
                stock = locker.run(f"inventory:{a.item}", sell, ttl=a.ttl)
                if stock is None:
                    emit("sold_out")
                    break
                sold += 1
                emit("sold", stock=stock)
        except Exception as e:
            return emit_error(e)
        emit("done", sold=sold)
        return DONE


async def main_async(a):
    pool = AsyncConnectionPool(a.dsn, min_size=2, max_size=2, kwargs={"autocommit": True}, open=False)
    await pool.open(wait=True)
    try:
        locker = AsyncLocker(pool)
        attempt = 0

        async def sell(lease):
            nonlocal attempt
            attempt += 1
            if attempt > 1:
                print(f"inventory: retrying a sale (attempt {attempt}) after a lost lease", file=sys.stderr)
            async with lease.conn.transaction():
                cur = await lease.conn.execute(READ, (a.item,))
                (stock,) = await cur.fetchone()
                if stock == 0:
                    return None
                await lease.conn.execute(WRITE, (stock - 1, lease.token, a.item))
            return stock - 1

        sold = 0
        try:
            for _ in range(a.sales):
                attempt = 0
                stock = await locker.run(f"inventory:{a.item}", sell, ttl=a.ttl)
                if stock is None:
                    emit("sold_out")
                    break
                sold += 1
                emit("sold", stock=stock)
        except Exception as e:
            return emit_error(e)
        emit("done", sold=sold)
        return DONE
    finally:
        await pool.close()
