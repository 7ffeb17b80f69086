"""A database client in a process of its own, so that a test can end it with a
real signal: SIGKILL of the client process makes the kernel close its socket,
exactly as when a client process or its machine dies; SIGSTOP freezes it.

The child runs `body` (Python source) after a prelude that connects with
psycopg (autocommit) and defines:

- `conn`: the connection; `ARGS`: the keyword arguments given to ClientProcess;
- `say(event, **fields)`: one JSON line to the parent, stamped with the
  child's `time.monotonic()` (`t`). CLOCK_MONOTONIC is system-wide on Linux,
  so the parent can compare it with its own `time.monotonic()`.

The prelude reports `connected` with the backend pid. Every child is killed by
`close()` (use the `children` fixture, or a `with` block), and every wait for a
message is bounded.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

PRELUDE = '''
import json, sys, time
import psycopg

ARGS = json.loads(sys.argv[1])


def say(event, **fields):
    fields["event"] = event
    fields["t"] = time.monotonic()
    sys.stdout.write(json.dumps(fields) + "\\n")
    sys.stdout.flush()


conn = psycopg.connect(ARGS["dsn"], autocommit=True, connect_timeout=10)
say("connected", pid=conn.info.backend_pid)
'''

# Bodies used by several tests.

# Take `name` with fenced_lock_try_acquire (optionally session-bound), report,
# then keep the session idle until killed.
HOLD = '''
token = conn.execute("SELECT fenced_lock_try_acquire(%s, %s::interval, %s, %s)",
                     (ARGS["name"], ARGS["ttl"], ARGS.get("holder"), ARGS.get("session_bound", False))).fetchone()[0]
say("granted", token=token)
time.sleep(600)
'''

# Wait for `name` in fenced_lock_acquire, report the outcome, then keep the
# session idle (holding whatever it got) until killed. With `then_release`,
# release right after the grant (and report that too).
WAIT = '''
say("waiting")
try:
    token = conn.execute("SELECT fenced_lock_acquire(%s, %s::interval, %s::interval, %s, %s)",
                         (ARGS["name"], ARGS["ttl"], ARGS.get("wait"), ARGS.get("holder"),
                          ARGS.get("session_bound", False))).fetchone()[0]
    say("granted", token=token)
    if ARGS.get("then_release"):
        ok = conn.execute("SELECT fenced_lock_release(%s, %s)", (ARGS["name"], token)).fetchone()[0]
        say("released", ok=ok)
except psycopg.Error as e:
    say("error", sqlstate=e.sqlstate, message=str(e))
time.sleep(600)
'''


class ClientProcess:
    def __init__(self, dsn, body, **args):
        code = PRELUDE + textwrap.dedent(body)
        self.args = args
        self.proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(dict(args, dsn=dsn))],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.pid = self.proc.pid
        self._messages = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.backend_pid = self.expect("connected", 20)["pid"]

    def _read(self):
        try:
            for line in self.proc.stdout:
                received = time.monotonic()
                try:
                    msg = json.loads(line)
                except ValueError:
                    msg = {"event": "garbage", "line": line}
                msg["received"] = received
                self._messages.put(msg)
        except (ValueError, OSError):
            pass  # closed by close()
        self._messages.put({"event": "exit", "received": time.monotonic()})

    def _stderr(self):
        if self.proc.poll() is None:
            return ""
        try:
            return self.proc.stderr.read()
        except (ValueError, OSError):
            return ""

    def expect(self, event, timeout):
        """The next message, which must be `event`; fails after `timeout` s."""
        try:
            msg = self._messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"client {self.pid}: no {event!r} within {timeout} s") from None
        if msg["event"] != event:
            raise AssertionError(f"client {self.pid}: expected {event!r}, got {msg}\n{self._stderr()}")
        return msg

    def message(self, timeout=0.0):
        """The next message, or None if none comes within `timeout` s."""
        try:
            return self._messages.get(timeout=timeout) if timeout else self._messages.get_nowait()
        except queue.Empty:
            return None

    def alive(self):
        return self.proc.poll() is None

    def send(self, sig):
        os.kill(self.pid, sig)

    def kill(self, sig=signal.SIGKILL):
        """Send `sig` (SIGKILL by default) and reap the process; returns the
        monotonic time the signal was sent."""
        sent = time.monotonic()
        os.kill(self.pid, sig)
        self.proc.wait(10)
        return sent

    def close(self):
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        for f in (self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except Exception:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Children:
    """Starts client processes for one test and kills every one of them at the end."""

    def __init__(self):
        self.started = []

    def start(self, dsn, body, **args):
        c = ClientProcess(dsn, body, **args)
        self.started.append(c)
        return c

    def close_all(self):
        for c in self.started:
            c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close_all()
