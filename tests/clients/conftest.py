"""Fixtures of the conformance examples' test (test_conformance.py).

- `langs`: the languages of FL_CLIENT_LANGS (space-separated; default all
  five) whose clients/LANG/run-example exists (the test is skipped if none
  does). Before the first test, each of them runs one short hold to its end,
  all at once, with a long bound, since that may build the client: whatever
  building takes happens there, not inside the tests' bounded waits.
- `each_lang`: runs a test's check for every language at the same time, one
  thread each, and fails once with what failed for every language that
  failed, each named.
- `dsn`: a superuser URL of database fl_conformance, created fresh (from
  FL_DSN, a superuser URL of database postgres) with the extension and the
  guarded tables the examples write: `docs` (the hold example's `--write
  docs:ID`, lock `doc:{id}`) and `inventory` (lock `inventory:{item_id}`).
- `run_example`: starts `clients/run LANG EXAMPLE ARGS...` in a process group
  of its own (SIGSTOP and SIGKILL reach the program whatever wraps it),
  reads its stdout lines as they come, stamped with this process's monotonic
  clock; every one still running is killed when the test ends.
"""

import json
import os
import queue
import signal
import subprocess
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from harness.budget import budget_fixture, register_budget_marker

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "clients" / "run"
LANGS = os.environ.get("FL_CLIENT_LANGS", "python rust java go node").split()
DB = "fl_conformance"
BUILD_BOUND_S = 900

time_budget = budget_fixture(default_seconds=120)
pytest_configure = register_budget_marker


def url_of_database(dsn, dbname):
    """FL_DSN with another database, as the postgresql:// URL the examples
    take (clients/README.md), whether FL_DSN is a URL or key=value."""
    if dsn.startswith(("postgresql://", "postgres://")):
        u = urlsplit(dsn)
        return urlunsplit((u.scheme, u.netloc, "/" + quote(dbname), u.query, u.fragment))
    p = conninfo_to_dict(dsn)
    auth = quote(p.get("user", "postgres")) + (":" + quote(p["password"]) if p.get("password") else "")
    return f"postgresql://{auth}@{p.get('host', '127.0.0.1')}:{p.get('port', 5432)}/{quote(dbname)}"


@pytest.fixture(scope="session")
def dsn():
    admin = os.environ.get("FL_DSN")
    if not admin:
        pytest.skip("FL_DSN is not set (a superuser postgresql:// URL of database postgres)")
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {DB}")
    url = url_of_database(admin, DB)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE EXTENSION fenced_lock")
        c.execute("CREATE TABLE docs (id int PRIMARY KEY, fence_token bigint)")
        c.execute("CREATE TRIGGER docs_fence BEFORE INSERT OR UPDATE OR DELETE ON docs FOR EACH ROW "
                  "EXECUTE FUNCTION fenced_lock_guard('doc:{id}', 'fence_token')")
        c.execute("CREATE TABLE inventory (item_id int PRIMARY KEY, stock int NOT NULL, fence_token bigint)")
        c.execute("CREATE TRIGGER inventory_fence BEFORE INSERT OR UPDATE OR DELETE ON inventory FOR EACH ROW "
                  "EXECUTE FUNCTION fenced_lock_guard('inventory:{item_id}', 'fence_token')")
    yield url
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


@pytest.fixture(scope="session")
def langs(dsn):
    present = [lang for lang in LANGS if (ROOT / "clients" / lang / "run-example").exists()]
    if not present:
        pytest.skip(f"none of clients/{{{','.join(LANGS)}}}/run-example exists yet")

    def warm_up(lang):
        started = time.monotonic()
        p = subprocess.run([str(RUN), lang, "hold", "--dsn", dsn, "--name", f"warmup:{lang}", "--ttl", "5",
                            "--hold", "0"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=BUILD_BOUND_S)
        print(f"{lang}: first run (with any build) took {time.monotonic() - started:.1f} s, exit {p.returncode}")

    with ThreadPoolExecutor(len(present)) as pool:
        list(pool.map(warm_up, present))
    return present


@pytest.fixture
def each_lang(langs, run_example):
    """each_lang(check): check(lang) for every language at once, one thread
    each; then one AssertionError naming each language whose check failed,
    with its message (and, for an error that is not an assertion, its
    traceback). If the test is stopped meanwhile (its budget ran out), every
    example is killed first, so that no check waits on."""

    def run(check):
        def one(lang):
            try:
                check(lang)
                return None
            except AssertionError as e:
                return f"{lang}: {e}"
            except Exception:
                return f"{lang}: {traceback.format_exc()}"

        pool = ThreadPoolExecutor(len(langs))
        try:
            failures = [(lang, f) for lang, f in zip(langs, pool.map(one, langs)) if f is not None]
        except BaseException:
            run_example.kill_all()
            raise
        finally:
            pool.shutdown(wait=True)
        if failures:
            names = ", ".join(lang for lang, _ in failures)
            raise AssertionError(f"failed for {names} ({len(failures)} of {len(langs)} languages):\n\n"
                                 + "\n\n".join(f for _, f in failures))

    return run


class Example:
    def __init__(self, lang, args):
        self.lang = lang
        self.args = [str(a) for a in args]
        self.proc = subprocess.Popen([str(RUN), lang, *self.args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.queue = queue.Queue()
        self.lines = []      # every stdout line, as (monotonic time, text)
        self.messages = []   # the JSON ones, parsed, with "_at"
        self.stderr_lines = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            at = time.monotonic()
            self.lines.append((at, line))
            try:
                msg = json.loads(line)
                if not isinstance(msg, dict):
                    raise ValueError("not an object")
            except ValueError:
                msg = {"event": "<not a JSON object>", "line": line}
            msg["_at"] = at
            self.messages.append(msg)
            self.queue.put(msg)
        self.queue.put({"event": "<end of output>", "_at": time.monotonic()})

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    @property
    def stderr(self):
        return "".join(self.stderr_lines[-40:])

    def expect(self, event, timeout, skip=("renewed",)):
        """The next line that is not one of `skip`; it must be `event`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{self.args[0]}: no {event!r} line within {timeout} s; "
                                     f"stderr:\n{self.stderr}") from None
            if msg["event"] in skip:
                continue
            assert msg["event"] == event, f"{self.args[0]}: expected {event!r}, got {msg}; stderr:\n{self.stderr}"
            return msg

    def events(self, name):
        return [m for m in self.messages if m["event"] == name]

    def signal(self, sig):
        os.killpg(self.proc.pid, sig)
        return time.monotonic()

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.args[0]}: still running after {timeout} s; "
                                 f"stderr:\n{self.stderr}") from None

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)


@pytest.fixture
def run_example():
    started = []
    lock = threading.Lock()

    def start(lang, *args):
        e = Example(lang, args)
        with lock:
            started.append(e)
        return e

    def kill_all():
        with lock:
            running = list(started)
        for e in running:
            e.kill()

    start.kill_all = kill_all
    yield start
    kill_all()
