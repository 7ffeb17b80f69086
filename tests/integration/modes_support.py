"""Helpers shared by the 0.3.0 tests (test_modes.py, test_several_names.py,
test_leader.py): the new functions by signature, what the server's history
says about how many leases of a name were live at once, and a picture of
the lease state that a refused call must leave as it was.
"""

import itertools
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
from psycopg import sql

from it_support import API_FUNCTIONS

# docs/reference.md, "Several names at once" and "Leader election".
MANY_FUNCTIONS = [
    "fenced_lock_try_acquire_all(text[], interval, text, boolean)",
    "fenced_lock_acquire_all(text[], interval, interval, text, boolean)",
    "fenced_lock_release_all(text[], bigint[])",
    "fenced_lock_renew_all(text, interval)",
]
LEADER_FUNCTIONS = [
    "fenced_lock_leader(text)",
    "fenced_lock_proclaim(text, bigint, text)",
]
NEW_FUNCTIONS = MANY_FUNCTIONS + LEADER_FUNCTIONS
# Everything an application role may be granted in 0.3.0.
ALL_FUNCTIONS = API_FUNCTIONS + NEW_FUNCTIONS

VIEWS = ["fenced_lock_leases", "fenced_lock_waiters", "fenced_lock_history", "fenced_lock_stats",
         "fenced_lock_stats_by_mode"]


def grant_new_functions(conn, *roles):
    """GRANT EXECUTE on the 0.3.0 functions to `roles` (in conn's database)."""
    for r in roles:
        for f in NEW_FUNCTIONS:
            conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(sql.SQL(f), sql.Identifier(r)))


def sqlstate(conn, query, params=None):
    """Run `query`; None if it succeeded, else the SQLSTATE it failed with."""
    try:
        conn.execute(query, params)
    except psycopg.Error as e:
        return e.sqlstate
    return None


def one(conn, query, params=None):
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


# -- what the server's history says ------------------------------------------------------


def history_of(su, names):
    """Every lease of `names` in fenced_lock_history (read as a superuser,
    so tokens and holders show), in token order, as dicts."""
    cur = su.execute(
        "SELECT name, token, holder, owner::text, session_bound, acquired_at, expires_at, ended_at, ended_by, "
        "ended_by_role::text, mode, permits FROM fenced_lock_history WHERE name = ANY(%s) ORDER BY token",
        (list(names),))
    cols = [d.name for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def lease_end(row):
    """When a history row's lease ended, on the server clock: ended_at, or
    (not ended yet) its current expires_at."""
    return row["ended_at"] if row["ended_at"] is not None else row["expires_at"]


def most_live_at_once(rows):
    """The largest number of leases among `rows` live at one instant, each
    live over [acquired_at, end). Ends sort before starts at the same
    instant: a lease granted at the instant another expired does not overlap it."""
    events = []
    for r in rows:
        events.append((r["acquired_at"], 1))
        events.append((lease_end(r), -1))
    events.sort(key=lambda e: (e[0], e[1]))
    live = best = 0
    for _, d in events:
        live += d
        best = max(best, live)
    return best


def assert_tokens_grow_in_grant_order(rows):
    """Every token distinct, and the token order is the grant (acquired_at) order."""
    tokens = [r["token"] for r in rows]
    assert len(set(tokens)) == len(tokens), tokens
    by_grant = [r["token"] for r in sorted(rows, key=lambda r: (r["acquired_at"], r["token"]))]
    assert by_grant == sorted(tokens), [(r["token"], r["acquired_at"]) for r in rows]


# -- the state a refused call must leave alone -------------------------------------------


def lease_state(su, names=None):
    """Every lease record (with its expiry) and history row, optionally of
    `names` only, read as a superuser: equal before and after a call that
    must change nothing."""
    where, params = ("", None) if names is None else (" WHERE name = ANY(%s)", (list(names),))
    records = su.execute(
        "SELECT name, token, holder, owner::text, acquired_at, expires_at, session_bound, shared, permits, value "
        "FROM fenced_lock_internal.granted_leases" + where + " ORDER BY name, token", params).fetchall()
    history = su.execute(
        "SELECT token, name, ended_at, ended_by FROM fenced_lock_internal.lease_history" + where +
        " ORDER BY token", params).fetchall()
    return records, history


# -- NOTIFY --------------------------------------------------------------------------------

MARKS = itertools.count()


class Listener:
    """LISTEN fenced_lock on `conn`; every payload, parsed, in arrival order."""

    def __init__(self, conn):
        self.conn = conn
        self.seen = []
        conn.add_notify_handler(lambda n: self.seen.append(json.loads(n.payload)))
        conn.execute("LISTEN fenced_lock")

    def until_marker(self, su, timeout=10):
        """Commit a marker (grant and release by `su`, whose session has
        fenced_lock.notify on), wait for it, return (and forget) every payload
        received before it: notifications arrive in commit order."""
        name = f"marker:{next(MARKS)}"
        token = one(su, "SELECT fenced_lock_try_acquire(%s, '1 min')", (name,))
        assert one(su, "SELECT fenced_lock_release(%s, %s)", (name, token)) is True
        deadline = time.monotonic() + timeout
        while not any(p["name"] == name and p["event"] == "release" for p in self.seen):
            assert time.monotonic() < deadline, f"the marker never arrived; seen {self.seen}"
            self.conn.execute("SELECT 1")  # lets psycopg read what has arrived
            time.sleep(0.01)
        i = next(i for i, p in enumerate(self.seen) if p["name"] == name)
        before, self.seen = self.seen[:i], [p for p in self.seen[i:] if p["name"] != name]
        return before


# -- the examples, run as processes ------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class Example:
    """examples/<script> in a process of its own, reading the JSON lines it
    prints (each with `t`, its time.monotonic(): comparable with ours)."""

    def __init__(self, script, *args):
        self.argv = [sys.executable, str(EXAMPLES / script), *map(str, args)]
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self.seen = []
        self.pending = []
        self._messages = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for line in self.proc.stdout:
                try:
                    msg = json.loads(line)
                except ValueError:
                    msg = {"event": "garbage", "line": line}
                self._messages.put(msg)
        except (ValueError, OSError):
            pass
        self._messages.put({"event": "exit"})

    def next(self, timeout, match=lambda m: True, what="a message"):
        """The first message not taken yet for which `match` is true; the
        others stay for later calls (and every message is in `seen`)."""
        for i, msg in enumerate(self.pending):
            if match(msg):
                return self.pending.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                msg = self._messages.get(timeout=max(0.001, left))
            except queue.Empty:
                raise AssertionError(f"{self.argv[1:3]}: no {what} within {timeout} s; seen {self.seen[-10:]}") \
                    from None
            self.seen.append(msg)
            if msg["event"] != "exit" and not match(msg):
                self.pending.append(msg)
                continue
            if msg["event"] == "exit":
                err = self.proc.stderr.read() if self.proc.poll() is not None else ""
                raise AssertionError(f"{self.argv[1:3]} exited ({self.proc.returncode}) waiting for {what}:\n{err}")
            if match(msg):
                return msg

    def event(self, event, timeout, **fields):
        return self.next(timeout, lambda m: m["event"] == event and all(m.get(k) == v for k, v in fields.items()),
                         what=f"{event} {fields or ''}")

    def kill(self, sig=9):
        sent = time.monotonic()
        os.kill(self.pid, sig)
        self.proc.wait(10)
        return sent

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for f in (self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except Exception:
                pass


def run_example(script, *args, timeout=120):
    """Run examples/<script> to completion; its JSON lines (fails on a non-zero exit)."""
    p = subprocess.run([sys.executable, str(EXAMPLES / script), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, f"{script} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
