"""One soak worker: a client process that runs the inventory job of README
("Guarding a table") until it is told to stop or is killed, and logs every
step as one JSON line, written with one write() so that a kill leaves at most
a torn last line.

    worker.py '<json args>'

The job: acquire `inv:<item>` (exclusive, a ttl of 1-4 s, sometimes
session-bound), read the stock, write stock - 1 stamped with the token (one
transaction), maybe again, renew when the client's own wall clock says a third
of the ttl is left, release; on FL001 drop the token and start over. From
0.3.0 on also: a count of the stock under a shared lease, and a permit of a
semaphore. Every log line carries the server's token and the client's
`mono` (CLOCK_MONOTONIC, system-wide, never stepped: faketime is told to leave
it alone) and `wall` (time.time(): this is what the clock-step nemesis moves,
and what the worker naively trusts for its renewals, as real clients do).

Events ("ev"): connect, acquire_sent, grant, busy, write_sent, write, fenced,
renew_sent, renew, renew_refused, release_sent, release, shared_sent,
shared_grant, shared_read, permit_sent, permit_grant, conn_error, error, stop.
A `*_sent` without its answer is an operation whose outcome the worker never
learned (killed, partitioned, server crashed): the checker treats its effect
as possible, never as promised.
"""

import itertools
import json
import os
import random
import select
import signal
import sys
import time

import psycopg

A = json.loads(sys.argv[1])
WID = A["wid"]  # worker id and incarnation, e.g. "w3.2"
rnd = random.Random(A["seed"])
log_fd = os.open(A["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
stopping = False
PARENT = os.getppid()
# Every acquire attempt gets a holder of its own and every sale an id of its
# own, also across errors: a reused holder would make the server return the
# same token (a retry-safe acquire), a reused sale id would collide.
serial = itertools.count(1)


def log(ev, **f):
    f.update(ev=ev, w=WID, mono=time.monotonic(), wall=time.time())
    os.write(log_fd, (json.dumps(f, separators=(",", ":")) + "\n").encode())


def sleep(seconds):
    """sleep() fails with EINVAL under libfaketime when the monotonic
    clock is left alone (its clock_nanosleep wrapper); select() does not."""
    select.select([], [], [], max(0.0, seconds))


def on_term(signum, frame):
    global stopping
    stopping = True


signal.signal(signal.SIGTERM, on_term)


def should_stop():
    # (and when the runner is gone: a worker must never outlive its soak)
    return stopping or os.path.exists(A["stop_file"]) or os.getppid() != A.get("parent", PARENT)


def connect():
    # Client-side keepalives and user timeout: a partitioned worker gives up on
    # its connection within seconds instead of hanging for TCP's minutes.
    # Server-side settings (A["server_opts"]) are what ends its session on the
    # server, and are given to some workers only (docs/operations.md).
    opts = "-c statement_timeout=10000 " + A.get("server_opts", "")
    c = psycopg.connect(A["dsn"], autocommit=True, connect_timeout=3, application_name=WID.split(".")[0],
                        keepalives=1, keepalives_idle=2, keepalives_interval=1, keepalives_count=3,
                        tcp_user_timeout=6000, options=opts)
    pid, port = c.execute("SELECT pg_backend_pid(), inet_client_port()").fetchone()
    log("connect", pid=pid, port=port)
    return c


def sell(conn):
    """One round of the inventory job on one item: acquire, 1-3 sales, maybe
    renewals, release."""
    item = rnd.randrange(A["items"])
    name = f"inv:{item}"
    ttl = rnd.choice([1.0, 2.0, 4.0])
    sb = rnd.random() < 0.3
    holder = f"{WID}:a{next(serial)}"
    log("acquire_sent", name=name, holder=holder, ttl=ttl, session_bound=sb)
    try:
        with conn.transaction():
            token = conn.execute("SELECT fenced_lock_acquire(%s, make_interval(secs => %s), '3 seconds', %s, %s)",
                                 (name, ttl, holder, sb)).fetchone()[0]
            expires = conn.execute("SELECT expires_at FROM fenced_lock_leases WHERE name = %s AND token = %s",
                                   (name, token)).fetchone()[0]
    except psycopg.errors.LockNotAvailable:
        log("busy", name=name, holder=holder)
        return
    log("grant", name=name, holder=holder, token=token, expires=expires.timestamp(), session_bound=sb)
    deadline = time.time() + ttl  # the client's own idea of its lease: a stepped clock fools it
    for _ in range(rnd.randint(1, 3)):
        sale = f"{WID}:s{next(serial)}"
        log("write_sent", name=name, token=token, item=item, sale=sale)
        try:
            with conn.transaction():
                stock = conn.execute("SELECT stock FROM inventory WHERE item_id = %s", (item,)).fetchone()[0]
                if rnd.random() < A.get("pause_p", 0.03):
                    sleep(rnd.uniform(0, ttl * 1.5))  # a pause of its own between read and write
                conn.execute("UPDATE inventory SET stock = %s, fence_token = %s, last_sale = %s WHERE item_id = %s",
                             (stock - 1, token, sale, item))
        except psycopg.Error as e:
            if e.sqlstate != "FL001":
                raise
            log("fenced", name=name, token=token, item=item, sale=sale)
            return
        log("write", name=name, token=token, item=item, sale=sale, new_stock=stock - 1)
        sleep(rnd.uniform(0, ttl / 3))
        if time.time() > deadline - ttl / 3:
            log("renew_sent", name=name, token=token)
            with conn.transaction():
                ok = conn.execute("SELECT fenced_lock_renew(%s, %s)", (name, token)).fetchone()[0]
                row = conn.execute("SELECT expires_at FROM fenced_lock_leases WHERE name = %s AND token = %s",
                                   (name, token)).fetchone()
            if not ok:
                log("renew_refused", name=name, token=token)
                return
            log("renew", name=name, token=token, expires=row[0].timestamp())
            deadline = time.time() + ttl
    if rnd.random() < 0.85:
        log("release_sent", name=name, token=token)
        ok = conn.execute("SELECT fenced_lock_release(%s, %s)", (name, token)).fetchone()[0]
        log("release", name=name, token=token, ok=ok)
    # otherwise left to expire (or to end with the session)


def shared_count(conn):
    """0.3.0: count an item's stock under a shared lease and record the count
    through the 'shared' guard."""
    item = rnd.randrange(A["items"])
    name = f"inv:{item}"
    holder = f"{WID}:a{next(serial)}"
    log("shared_sent", name=name, holder=holder)
    try:
        token = conn.execute("SELECT fenced_lock_acquire(%s, '2 seconds', '3 seconds', %s, false, shared => true)",
                             (name, holder)).fetchone()[0]
    except psycopg.errors.LockNotAvailable:
        log("busy", name=name, mode="shared")
        return
    log("shared_grant", name=name, holder=holder, token=token)
    try:
        with conn.transaction():
            stock = conn.execute("SELECT stock FROM inventory WHERE item_id = %s", (item,)).fetchone()[0]
            conn.execute("INSERT INTO shelf_reads (item_id, reader, observed, fence_token) VALUES (%s, %s, %s, %s)",
                         (item, WID, stock, token))
        log("shared_read", name=name, token=token, observed=stock)
    except psycopg.Error as e:
        if e.sqlstate != "FL001":
            raise
        log("fenced", name=name, token=token, mode="shared")
        return
    conn.execute("SELECT fenced_lock_release(%s, %s)", (name, token))


def permit(conn):
    """0.3.0: use one permit of a semaphore of POOL_PERMITS."""
    pool = rnd.randrange(2)
    name = f"pool:{pool}"
    holder = f"{WID}:a{next(serial)}"
    log("permit_sent", name=name, holder=holder)
    try:
        token = conn.execute("SELECT fenced_lock_acquire(%s, '2 seconds', '3 seconds', %s, false, permits => %s)",
                             (name, holder, A["pool_permits"])).fetchone()[0]
    except psycopg.errors.LockNotAvailable:
        log("busy", name=name, mode="permit")
        return
    log("permit_grant", name=name, holder=holder, token=token)
    conn.execute("INSERT INTO pool_use (pool, worker, token) VALUES (%s, %s, %s)", (pool, holder, token))
    sleep(rnd.uniform(0, 0.5))
    conn.execute("SELECT fenced_lock_release(%s, %s)", (name, token))


def main():
    conn = None
    while not should_stop():
        try:
            if conn is None:
                conn = connect()
            r = rnd.random()
            if A.get("shared") and r < 0.12:
                shared_count(conn)
            elif A.get("permits") and r < 0.24:
                permit(conn)
            else:
                sell(conn)
        except psycopg.Error as e:
            broken = conn is None or conn.broken or isinstance(e, psycopg.OperationalError)
            log("conn_error" if broken else "error", sqlstate=e.sqlstate, msg=str(e)[:200])
            if broken:
                try:
                    if conn is not None:
                        conn.close()
                except Exception:
                    pass
                conn = None
                sleep(rnd.uniform(0.1, 0.5))
            elif e.sqlstate not in ("57014", "40001", "40P01"):
                sleep(0.2)
    log("stop")
    if conn is not None:
        conn.close()


if __name__ == "__main__":
    main()
