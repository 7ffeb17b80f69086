"""Guarantees under a network partition (docs/design.md, "Why", "Waiting",
"Session-bound leases"; docs/operations.md, "Keepalives and partitions").

A partition is the one threat a server sees differently from a pause or a
crash: the client's TCP connection stays open on the server until keepalives
or a user timeout fail, which by the kernel's defaults (tcp_keepalive_time
7200 s) takes hours. Each client here is a real process (harness.clientproc)
whose one connection is cut with iptables, every packet dropped both ways;
healing lets TCP's retransmissions through again.

- A holder cut off loses its lease at its ttl; the next waiter is served;
  when the link heals, the old holder's guarded write is rejected (FL001).
- A session-bound holder cut off: its lease ends at the ttl, or sooner when
  the server's tcp_keepalives_* (or tcp_user_timeout with them) end the
  session; each setting measured alone (figures printed, and quoted in
  docs/operations.md).
- A head waiter cut off keeps its place until the server's keepalives end
  its session, then leaves within the head's 500 ms check; without
  keepalives it keeps its place, is granted into the void, and the next
  waiter is served only at that lease's ttl.

Timings are printed, never asserted tightly: bounds are the ttl and the
keepalive schedule with seconds of slack for a loaded 2-core machine.
"""

import subprocess
import threading
import time

import pytest

NAME = "net:1"

# A client process: optional session settings, a lease, the stock read, then
# (when told) the guarded write of stock - 1 with its token, then (when told)
# the retry done right. Its connection has no client-side timeouts beyond
# libpq's defaults, so a write sent into the partition waits for the heal.
HOLDER = '''
import os

def wait_file(path, seconds=90):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            say("timeout", path=path)
            raise SystemExit(1)
        time.sleep(0.01)

for k, v in ARGS.get("settings", {}).items():
    conn.execute(f"SET {k} = {v}")
if ARGS.get("listen"):
    conn.execute("LISTEN net_wake")
port = conn.execute("SELECT inet_client_port()").fetchone()[0]
token = conn.execute("SELECT fenced_lock_try_acquire(%s, %s::interval, %s, %s)",
                     (ARGS["name"], ARGS["ttl"], "holder-a", ARGS.get("session_bound", False))).fetchone()[0]
qty = conn.execute("SELECT qty FROM stock WHERE item_id = 1").fetchone()[0]
say("granted", token=token, port=port, qty=qty)
wait_file(ARGS["go"])
say("writing")
try:
    conn.execute("UPDATE stock SET qty = %s, fence_token = %s WHERE item_id = 1", (qty - 1, token))
    say("wrote")
except psycopg.Error as e:
    say("refused", sqlstate=e.sqlstate, lost=conn.broken, message=str(e)[:200])
if ARGS.get("retry"):
    wait_file(ARGS["retry"])
    if conn.broken:
        conn = psycopg.connect(ARGS["dsn"], autocommit=True, connect_timeout=10)
    token = conn.execute("SELECT fenced_lock_acquire(%s, '30 seconds', '20 seconds')", (ARGS["name"],)).fetchone()[0]
    qty = conn.execute("SELECT qty FROM stock WHERE item_id = 1").fetchone()[0]
    conn.execute("UPDATE stock SET qty = %s, fence_token = %s WHERE item_id = 1", (qty - 1, token))
    ok = conn.execute("SELECT fenced_lock_release(%s, %s)", (ARGS["name"], token)).fetchone()[0]
    say("retried", token=token, qty=qty - 1, released=ok)
time.sleep(600)
'''

# A waiter process: optional session settings, then fenced_lock_acquire.
WAITER = '''
for k, v in ARGS.get("settings", {}).items():
    conn.execute(f"SET {k} = {v}")
port = conn.execute("SELECT inet_client_port()").fetchone()[0]
say("waiting", port=port)
try:
    token = conn.execute("SELECT fenced_lock_acquire(%s, %s::interval, %s::interval, %s, %s)",
                         (ARGS["name"], ARGS["ttl"], ARGS["wait"], ARGS["holder"],
                          ARGS.get("session_bound", False))).fetchone()[0]
    say("granted", token=token)
except psycopg.Error as e:
    say("error", sqlstate=e.sqlstate, message=str(e)[:200])
time.sleep(600)
'''

KEEPALIVES = {"tcp_keepalives_idle": 1, "tcp_keepalives_interval": 1, "tcp_keepalives_count": 2}
USER_TIMEOUT = {"tcp_user_timeout": 3000}
RECOMMENDED = {"tcp_keepalives_idle": 5, "tcp_keepalives_interval": 1, "tcp_keepalives_count": 5,
               "tcp_user_timeout": 10000, "client_connection_check_interval": 2000}
# What each setting does to a session whose client is cut off, measured (the
# figures the test prints are quoted in docs/operations.md). Two cases,
# because TCP runs one of two timers on a connection: keepalive probes only
# while everything sent has been acknowledged ("idle"), the retransmission
# timer while something the server sent is unacknowledged ("in_flight": a
# reply, a NOTIFY, even a delayed ACK lost to the cut). tcp_user_timeout
# bounds the second, keepalives the first.
SETTINGS = {
    "none": {},
    "keepalives": KEEPALIVES,
    "tcp_user_timeout": USER_TIMEOUT,
    # checks the socket only while a query runs, and a partition sends no
    # FIN: for an idle or a waiting-for-ACK session it changes nothing
    "client_connection_check_interval": {"client_connection_check_interval": 1000},
    # docs/operations.md's block, as it is recommended there (not shortened)
    "recommended": RECOMMENDED,
}
ENDS = {  # (setting, case) -> how the cut-off holder's lease ends
    ("none", "idle"): "expiry", ("none", "in_flight"): "expiry",
    ("keepalives", "idle"): "session_end", ("keepalives", "in_flight"): "expiry",
    ("tcp_user_timeout", "idle"): "expiry", ("tcp_user_timeout", "in_flight"): "session_end",
    ("client_connection_check_interval", "idle"): "expiry",
    ("client_connection_check_interval", "in_flight"): "expiry",
    ("recommended", "idle"): "session_end", ("recommended", "in_flight"): "session_end",
}


def unacked_bytes(server_port, client_port):
    """Bytes the server's end of a loopback connection sent and has not had
    acknowledged (ss's Send-Q), or None if there is no such connection."""
    out = subprocess.run(["ss", "-tnH", "state", "established", f"( sport = :{server_port} and dport = :{client_port} )"],
                         capture_output=True, text=True).stdout.split()
    return int(out[1]) if out else None


def lease_row(mon, token):
    """(acquired_at, expires_at, ended_at, ended_by) of one lease, as epoch seconds."""
    return mon.execute("SELECT extract(epoch FROM acquired_at)::float8, extract(epoch FROM expires_at)::float8, "
                       "extract(epoch FROM ended_at)::float8, ended_by FROM fenced_lock_history WHERE token = %s",
                       (token,)).fetchone()


def acquire_in_thread(conn, name, ttl="30 seconds", wait="60 seconds"):
    """fenced_lock_acquire on `conn` in a thread; result: token and monotonic time of the answer."""
    result = {}

    def run():
        try:
            result["token"] = conn.execute("SELECT fenced_lock_acquire(%s, %s::interval, %s::interval)",
                                           (name, ttl, wait)).fetchone()[0]
        except Exception as e:  # noqa: BLE001 - asserted by the test
            result["error"] = e
        result["at"] = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def waiting_position(mon, pid):
    row = mon.execute("SELECT position FROM fenced_lock_waiters WHERE pid = %s", (pid,)).fetchone()
    return row[0] if row else None


def wait_until(predicate, timeout, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def backend_gone(mon, pid):
    return mon.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] == 0


def test_holder_cut_off_mid_critical_section_loses_its_lease_at_the_ttl_and_its_healed_write_is_rejected(
        cluster, db, rules, children, tmp_path):
    go, retry = tmp_path / "go", tmp_path / "retry"
    a = children.start(cluster.dsn(db), HOLDER, name=NAME, ttl="2 seconds", go=str(go), retry=str(retry))
    granted = a.expect("granted", 20)
    token_a = granted["token"]
    assert token_a is not None and granted["qty"] == 10

    with cluster.connect(db) as mon, cluster.connect(db) as b:
        cut = rules.cut_connection(granted["port"], cluster.port)
        cut_at = time.monotonic()
        # B waits in line; the server hands it the name when A's lease expires.
        taker, got = acquire_in_thread(b, NAME)
        taker.join(30)
        assert "token" in got, got
        token_b = got["token"]
        assert token_b > token_a
        acq_a, exp_a, ended_a, ended_by_a = lease_row(mon, token_a)
        acq_b = lease_row(mon, token_b)[0]
        assert ended_by_a == "expiry" and acq_b >= exp_a
        print(f"\nholder cut off: taken over {got['at'] - cut_at:.2f} s after the cut, "
              f"{(acq_b - exp_a) * 1000:.0f} ms after its 2 s lease expired ({exp_a - acq_a:.2f} s after its grant)")

        # B sells one and releases, while A is still cut off.
        assert b.execute("SELECT qty FROM stock WHERE item_id = 1").fetchone()[0] == 10
        b.execute("UPDATE stock SET qty = 9, fence_token = %s WHERE item_id = 1", (token_b,))
        assert b.execute("SELECT fenced_lock_release(%s, %s)", (NAME, token_b)).fetchone()[0] is True

        # A writes what it computed before the cut; its packets are dropped.
        go.touch()
        a.expect("writing", 10)
        assert a.message(1.5) is None, "a write went through a partition"
        cut.heal()
        healed_at = time.monotonic()
        refused = a.expect("refused", 30)
        assert refused["sqlstate"] == "FL001" and not refused["lost"], refused
        print(f"holder cut off: its write, sent into the partition, refused with FL001 "
              f"{time.monotonic() - healed_at:.2f} s after the heal")
        assert mon.execute("SELECT qty, fence_token FROM stock WHERE item_id = 1").fetchone() == (9, token_b)

        # A retries the right way and the stock ends at 8: no sale lost.
        retry.touch()
        done = a.expect("retried", 30)
        assert done["qty"] == 8 and done["token"] > token_b and done["released"] is True
        assert mon.execute("SELECT qty, fence_token FROM stock WHERE item_id = 1").fetchone() == (8, done["token"])


@pytest.mark.budget(60)
@pytest.mark.parametrize("case", ["idle", "in_flight"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_session_bound_holder_cut_off_loses_its_lease_at_the_ttl_or_when_the_server_ends_its_session(
        cluster, db, rules, children, tmp_path, setting, case):
    settings, ended_by = SETTINGS[setting], ENDS[(setting, case)]
    ttl = 20.0 if setting == "recommended" else 8.0  # longer than the block's ~10 s
    if "client_connection_check_interval" in settings:
        with cluster.connect(db) as c:
            if int(c.execute("SHOW server_version_num").fetchone()[0]) < 140000:
                pytest.skip("client_connection_check_interval exists from PostgreSQL 14 on")
    go = tmp_path / "go"
    a = children.start(cluster.dsn(db), HOLDER, name=NAME, ttl=f"{ttl} seconds", session_bound=True,
                       settings=settings, listen=True, go=str(go))
    granted = a.expect("granted", 20)
    token_a, port = granted["token"], granted["port"]
    with cluster.connect(db) as mon, cluster.connect(db) as b:
        # Nothing unacknowledged before the cut (the client's delayed ACK of
        # its last reply has gone out), so that each case is what it says.
        wait_until(lambda: unacked_bytes(cluster.port, port) == 0, 5, what="the last reply to be acknowledged")
        cut = rules.cut_connection(port, cluster.port)
        cut_at = time.monotonic()
        if case == "in_flight":
            mon.execute("NOTIFY net_wake, 'into the partition'")  # the server sends; no ACK comes back
            wait_until(lambda: (unacked_bytes(cluster.port, port) or 0) > 0, 5, what="unacknowledged data")
        taker, got = acquire_in_thread(b, NAME)
        taker.join(ttl + 20)
        assert "token" in got, got
        took = got["at"] - cut_at
        acq_a, exp_a, ended_a, ended_by_a = lease_row(mon, token_a)
        acq_b = lease_row(mon, got["token"])[0]
        print(f"\nsession-bound holder cut off ({case}), {setting} {settings}: taken over after {took:.2f} s "
              f"(ttl {ttl:.0f} s), lease ended by {ended_by_a}")
        assert ended_by_a == ended_by, (setting, case, ended_by_a, took)
        assert acq_b >= ended_a
        if ended_by == "expiry":
            assert acq_b >= exp_a and took > ttl - 2.0
            assert not backend_gone(mon, a.backend_pid), "the session ended although nothing could tell"
        else:
            assert took < ttl - 2.0, f"the session did not end before the ttl: {took:.2f} s"
            assert backend_gone(mon, a.backend_pid)

        # Healed, A's late write is refused: FL001 from a session that lived
        # on, or a dead connection where the server ended the session.
        cut.heal()
        go.touch()
        a.expect("writing", 10)
        refused = a.expect("refused", 40)
        if ended_by == "expiry":
            assert refused["sqlstate"] == "FL001", refused
        else:
            assert refused["lost"], refused
        assert mon.execute("SELECT qty FROM stock WHERE item_id = 1").fetchone()[0] == 10


@pytest.mark.budget(90)
def test_cut_off_head_waiter_leaves_the_line_when_keepalives_end_its_session_and_the_next_waiter_is_served(
        cluster, db, rules, children):
    with cluster.connect(db) as mon, cluster.connect(db) as h, cluster.connect(db) as w2:
        held = h.execute("SELECT fenced_lock_try_acquire(%s, '60 seconds')", (NAME,)).fetchone()[0]
        w1 = children.start(cluster.dsn(db), WAITER, name=NAME, ttl="30 seconds", wait="60 seconds",
                            holder="head", session_bound=True, settings=KEEPALIVES)
        port = w1.expect("waiting", 10)["port"]
        wait_until(lambda: waiting_position(mon, w1.backend_pid) == 1, 10, what="the head to queue")
        taker, got = acquire_in_thread(w2, NAME, wait="60 seconds")
        wait_until(lambda: waiting_position(mon, w2.info.backend_pid) == 2, 10, what="the second waiter")

        cut = rules.cut_connection(port, cluster.port)
        cut_at = time.monotonic()
        # The head checks its client at least every 500 ms; the socket is
        # dead once keepalives fail (idle 1 s + 2 probes 1 s apart).
        wait_until(lambda: backend_gone(mon, w1.backend_pid), 20, what="the cut-off head to leave")
        left = time.monotonic() - cut_at
        assert waiting_position(mon, w2.info.backend_pid) == 1
        assert "token" not in got
        print(f"\ncut-off head waiter (keepalives 1/1/2) left the line {left:.2f} s after the cut "
              f"(keepalives fail at ~3 s, then the head's 500 ms check)")
        assert left < 10.0

        released_at = time.monotonic()
        assert h.execute("SELECT fenced_lock_release(%s, %s)", (NAME, held)).fetchone()[0] is True
        taker.join(10)
        assert "token" in got and got["token"] > held
        print(f"cut-off head waiter: the next waiter was granted {(got['at'] - released_at) * 1000:.0f} ms "
              f"after the release")
        assert got["at"] - released_at < 2.0
        holders = [r[0] for r in mon.execute("SELECT holder FROM fenced_lock_history WHERE name = %s",
                                             (NAME,)).fetchall()]
        assert "head" not in holders, "the cut-off head waiter was granted a lease"
        cut.heal()


@pytest.mark.budget(90)
def test_cut_off_head_waiter_without_keepalives_keeps_its_place_is_granted_and_holds_the_next_waiter_to_its_ttl(
        cluster, db, rules, children):
    w1_ttl = 4.0
    with cluster.connect(db) as mon, cluster.connect(db) as h, cluster.connect(db) as w2:
        held = h.execute("SELECT fenced_lock_try_acquire(%s, '60 seconds')", (NAME,)).fetchone()[0]
        w1 = children.start(cluster.dsn(db), WAITER, name=NAME, ttl=f"{w1_ttl} seconds", wait="60 seconds",
                            holder="head", session_bound=True)
        port = w1.expect("waiting", 10)["port"]
        wait_until(lambda: waiting_position(mon, w1.backend_pid) == 1, 10, what="the head to queue")
        taker, got = acquire_in_thread(w2, NAME, wait="60 seconds")
        wait_until(lambda: waiting_position(mon, w2.info.backend_pid) == 2, 10, what="the second waiter")

        rules.cut_connection(port, cluster.port)
        # Twice what keepalives 1/1/2 need (previous test): nothing tells the
        # server that the head's client is unreachable.
        time.sleep(6.0)
        assert waiting_position(mon, w1.backend_pid) == 1, "the cut-off head lost its place without keepalives"

        # The release hands the name to the unreachable head: a live session,
        # granted, its answer lost in the partition.
        assert h.execute("SELECT fenced_lock_release(%s, %s)", (NAME, held)).fetchone()[0] is True
        released_at = time.monotonic()
        row = wait_until(lambda: mon.execute("SELECT token, extract(epoch FROM expires_at)::float8 FROM "
                                             "fenced_lock_leases WHERE name = %s AND holder = 'head' AND live",
                                             (NAME,)).fetchone(), 10, what="the cut-off head to be granted")
        ghost, ghost_expires = row
        taker.join(w1_ttl + 20)
        assert "token" in got, got
        waited = got["at"] - released_at
        acq_w2 = lease_row(mon, got["token"])[0]
        _, exp_g, _, ended_by_g = lease_row(mon, ghost)
        print(f"\ncut-off head waiter without keepalives: kept its place 6 s, was granted at the release; "
              f"the next waiter was served {waited:.2f} s later, when that {w1_ttl:.0f} s lease ended by {ended_by_g}")
        assert ended_by_g == "expiry" and acq_w2 >= exp_g == ghost_expires
        assert waited > w1_ttl - 1.5 and got["token"] > ghost > held
