"""Guarantee (docs/design.md, "Words" (time), "The guard", "Invariants" 4):
expiry is decided on the database server's clock alone. When that clock steps forward (an NTP step, a VM resumed), live
leases expire early — the lease is no longer valid, another client can take
the lock over, and the old holder's write is rejected with FL001. A step can
shorten a lease, but it never lets a stale write through; and a guarded
write accepted before the step still commits before the takeover is granted
(a try returns NULL at once meanwhile; fenced_lock_acquire waits for it).

The server runs under libfaketime (LD_PRELOAD, passed through sudo with
`env`), with its offset read from a file that the test rewrites; the monotonic
clock is left alone (FAKETIME_DONT_FAKE_MONOTONIC), as in a real wall-clock
step.
"""

import datetime
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from faultkit import CLOCK_PORT, connect, sqlstate_of, wait_until
from harness.cluster import BIN, as_postgres

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
LOCK = "clock:1"


def write_stock(conn, token, qty):
    conn.execute("UPDATE stock SET qty = %s, fence_token = %s WHERE item_id = 1", (qty, token))


def server_offset(conn):
    """How far the server's clock is ahead of ours, in seconds."""
    server = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    return (server - datetime.datetime.now(datetime.timezone.utc)).total_seconds()


@pytest.mark.budget(90)
def test_clock_step_forward_expires_leases_early_but_never_admits_stale_write(clusters):
    assert LIBFAKETIME.exists(), f"{LIBFAKETIME} is missing: install the Debian package libfaketime"
    c = clusters.new("f_clock", CLOCK_PORT, start=False)
    offset_file = c.dir / "faketime.rc"
    offset_file.write_text("+0\n")
    os.chmod(offset_file, 0o644)
    as_postgres(["env", f"LD_PRELOAD={LIBFAKETIME}", f"FAKETIME_TIMESTAMP_FILE={offset_file}",
                 "FAKETIME_NO_CACHE=1", "FAKETIME_DONT_FAKE_MONOTONIC=1",
                 BIN / "pg_ctl", "-D", c.data, "-l", c.log, "-w", "-t", "60", "start"],
                stdout=subprocess.DEVNULL)
    dbname = c.create_database("clock")

    def step_to(seconds):
        offset_file.write_text(f"+{seconds}\n")

    with connect(c, dbname) as a, connect(c, dbname) as b:
        a.execute("CREATE TABLE stock (item_id int PRIMARY KEY, qty int NOT NULL, fence_token bigint)")
        a.execute("INSERT INTO stock VALUES (1, 10, NULL)")
        a.execute("CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock "
                  "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('clock:{item_id}')")
        assert abs(server_offset(a)) < 5

        # A holds a 30 s lease and writes.
        token_a = a.execute("SELECT fenced_lock_try_acquire(%s, '30 seconds')", (LOCK,)).fetchone()[0]
        write_stock(a, token_a, 9)

        # The server's clock steps 45 s forward: A's lease is over at once.
        step_to(45)
        wait_until(lambda: server_offset(b) > 40, 10, what="the server's clock to step")
        assert a.execute("SELECT fenced_lock_validate(%s, %s)", (LOCK, token_a)).fetchone()[0] is False
        assert b.execute("SELECT live FROM fenced_lock_leases WHERE name = %s", (LOCK,)).fetchone()[0] is False
        assert sqlstate_of(write_stock, a, token_a, 8) == "FL001"
        assert a.execute("SELECT fenced_lock_renew(%s, %s)", (LOCK, token_a)).fetchone()[0] is False

        # B takes over and writes; A stays fenced out.
        token_b = b.execute("SELECT fenced_lock_try_acquire(%s, '30 seconds')", (LOCK,)).fetchone()[0]
        assert token_b is not None and token_b > token_a
        write_stock(b, token_b, 8)
        assert sqlstate_of(write_stock, a, token_a, 7) == "FL001"
        assert a.execute("SELECT qty, fence_token FROM stock").fetchone() == (8, token_b)

        # Even if the clock steps back, the superseded token stays stale: the
        # record now holds B's lease, not A's.
        step_to(0)
        wait_until(lambda: abs(server_offset(b)) < 5, 10, what="the server's clock to step back")
        assert sqlstate_of(write_stock, a, token_a, 7) == "FL001"
        assert a.execute("SELECT fenced_lock_validate(%s, %s)", (LOCK, token_a)).fetchone()[0] is False
        assert b.execute("SELECT fenced_lock_release(%s, %s)", (LOCK, token_b)).fetchone()[0] is True

        # A step during a guarded write: the write accepted before the step
        # commits before the next holder is granted (the takeover waits for it).
        token_c = a.execute("SELECT fenced_lock_try_acquire(%s, '30 seconds')", (LOCK,)).fetchone()[0]
        a.autocommit = False
        write_stock(a, token_c, 5)  # accepted; the transaction stays open
        step_to(90)
        wait_until(lambda: server_offset(b) > 80, 10, what="the server's clock to step again")
        # A try never waits for another transaction (docs/design.md, "Lock
        # protocol" L3): with A's guarded write in flight it returns NULL at once.
        t0 = time.monotonic()
        assert b.execute("SELECT fenced_lock_try_acquire(%s, '30 seconds')", (LOCK,)).fetchone()[0] is None
        assert time.monotonic() - t0 < 1.0
        got = {}
        b_pid = b.execute("SELECT pg_backend_pid()").fetchone()[0]
        taker = threading.Thread(target=lambda: got.update(token=b.execute(
            "SELECT fenced_lock_acquire(%s, '30 seconds', '20 seconds')", (LOCK,)).fetchone()[0]), daemon=True)
        taker.start()
        with connect(c, dbname) as watcher:
            wait_until(lambda: watcher.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                               (b_pid,)).fetchone()[0] == "Lock", 10,
                       what="the takeover to wait for A's open guarded write")
        assert "token" not in got
        a.commit()
        a.autocommit = True
        taker.join(10)
        assert not taker.is_alive()
        token_d = got["token"]
        assert token_d is not None and token_d > token_c
        assert b.execute("SELECT qty, fence_token FROM stock").fetchone() == (5, token_c)
        assert sqlstate_of(write_stock, a, token_c, 4) == "FL001"
        write_stock(b, token_d, 4)
        assert b.execute("SELECT qty, fence_token FROM stock").fetchone() == (4, token_d)
