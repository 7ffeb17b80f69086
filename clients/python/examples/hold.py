"""hold --dsn DSN --name NAME --ttl SECONDS --hold SECONDS [--wait SECONDS]
[--write TABLE:ID] [--session-bound] [--shared] [--permits N] [--holder TEXT]

Acquire with keepalive, hold, optionally write with the token, release; a
lost lease is reported at once, still writes (the database must refuse it),
is not released, and the exit status is 3."""

import asyncio
import os
import threading
import time

import psycopg
from psycopg import sql

from fenced_lock import AsyncLocker, Locker
from _cli import DONE, LOST, Parser, emit, emit_error, table_and_id


def parse(argv):
    p = Parser(prog="hold", description=__doc__)
    p.add_argument("--dsn", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--ttl", type=float, required=True)
    p.add_argument("--hold", type=float, required=True)
    p.add_argument("--wait", type=float)
    p.add_argument("--write", type=table_and_id, metavar="TABLE:ID")
    p.add_argument("--session-bound", action="store_true")
    p.add_argument("--shared", action="store_true")
    p.add_argument("--permits", type=int, default=1)
    p.add_argument("--holder")
    return p.parse_args(argv)


def update(table, row_id, token):
    return (sql.SQL("UPDATE {} SET fence_token = %s WHERE id = %s").format(sql.Identifier(*table.split("."))),
            (token, row_id))


class Reporter:
    """The keepalive's callbacks: print renewed and lost as they happen. The
    exit waits for the lost line, which a thread of its own prints."""

    def __init__(self):
        self.lost_printed = threading.Event()

    def renewed(self, lease):
        emit("renewed", token=lease.token)

    def lost(self, lease):
        emit("lost", token=lease.token)
        self.lost_printed.set()


def main(argv):
    a = parse(argv)
    if os.environ.get("FENCED_LOCK_EXAMPLE_ASYNC") == "1":
        return asyncio.run(main_async(a))
    report = Reporter()
    locker = Locker(a.dsn)
    try:
        lease = locker.acquire(a.name, a.ttl, a.wait, holder=a.holder, session_bound=a.session_bound,
                               shared=a.shared, permits=a.permits, on_lost=report.lost, on_renewed=report.renewed)
    except Exception as e:
        return emit_error(e)
    emit("acquired", token=lease.token)
    time.sleep(a.hold)  # not cut short by a loss: the write below must still be tried
    if a.write:
        try:
            with lease.conn.transaction():
                lease.conn.execute(*update(*a.write, lease.token))
            emit("write", ok=True)
        except psycopg.Error as e:
            emit("write", ok=False, sqlstate=e.sqlstate)
    try:
        released = False if lease.lost.is_set() else lease.release()
    except Exception as e:
        return emit_error(e)
    finally:
        lease.close()
    if lease.lost.is_set():
        report.lost_printed.wait(10)
        return LOST
    emit("released", token=lease.token, released=released)
    return DONE if released else LOST


async def main_async(a):
    report = Reporter()
    locker = AsyncLocker(a.dsn)
    try:
        lease = await locker.acquire(a.name, a.ttl, a.wait, holder=a.holder, session_bound=a.session_bound,
                                     shared=a.shared, permits=a.permits, on_lost=report.lost,
                                     on_renewed=report.renewed)
    except Exception as e:
        return emit_error(e)
    emit("acquired", token=lease.token)
    await asyncio.sleep(a.hold)
    if a.write:
        try:
            async with lease.conn.transaction():
                await lease.conn.execute(*update(*a.write, lease.token))
            emit("write", ok=True)
        except psycopg.Error as e:
            emit("write", ok=False, sqlstate=e.sqlstate)
    try:
        released = False if lease.lost.is_set() else await lease.release()
    except Exception as e:
        return emit_error(e)
    finally:
        await lease.close()
    if lease.lost.is_set():
        await asyncio.get_running_loop().run_in_executor(None, report.lost_printed.wait, 10)
        return LOST
    emit("released", token=lease.token, released=released)
    return DONE if released else LOST
