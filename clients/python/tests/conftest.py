"""Shared fixtures of the Python client's suite.

The suite runs against the server named by FL_DSN (a superuser URL of
database `postgres`) and works in a database of its own, fl_client_python,
created here with the extension, the guarded tables the tests and the
examples write, and the roles some tests need; all of it is dropped at the
end. Other client suites may run against the same server at the same time:
everything cluster-wide (roles) is prefixed with fl_client_python_.

Under pytest-xdist (test.sh runs the suite on several workers) each worker
has a database and roles of its own, fl_client_python_gwN: several tests
count the keepalive connections of their database, which must be theirs.
"""

import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ... under pytest-xdist
DB = f"fl_client_python_{_WORKER}" if _WORKER else "fl_client_python"
ROLE_NOEXEC = f"{DB}_noexec"
ROLE_OTHER = f"{DB}_other"
HERE = Path(__file__).resolve().parent
CLIENT = HERE.parent
RUN_EXAMPLE = CLIENT / "run-example"


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("FL_DSN"):
        skip = pytest.mark.skip(reason="FL_DSN is not set (a superuser postgresql:// URL of database postgres)")
        for item in items:
            item.add_marker(skip)


def with_db(dsn, dbname, **extra):
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    params.update(extra)
    return make_conninfo(**params)


class BudgetExceeded(Exception):
    pass


@pytest.fixture(autouse=True)
def time_budget(request):
    """Fail, with teardown, any test that runs past its budget (default 60 s),
    so that the suite can never hang."""
    marker = request.node.get_closest_marker("budget")
    seconds = int(marker.args[0]) if marker else 60

    def expired(signum, frame):
        raise BudgetExceeded(f"{request.node.name} ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="session")
def dsn():
    """Superuser URL of the suite's own database, created fresh."""
    admin = os.environ["FL_DSN"]
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        for role in (ROLE_NOEXEC, ROLE_OTHER):
            c.execute(f"DROP ROLE IF EXISTS {role}")
        c.execute(f"CREATE DATABASE {DB}")
        c.execute(f"CREATE ROLE {ROLE_NOEXEC} LOGIN")
        c.execute(f"CREATE ROLE {ROLE_OTHER} LOGIN")
    url = with_db(admin, DB)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE EXTENSION fenced_lock")
        c.execute("CREATE TABLE inventory (item_id int PRIMARY KEY, stock int NOT NULL, fence_token bigint)")
        c.execute("CREATE TRIGGER inventory_fence BEFORE INSERT OR UPDATE OR DELETE ON inventory FOR EACH ROW "
                  "EXECUTE FUNCTION fenced_lock_guard('inventory:{item_id}', 'fence_token')")
        # The hold example writes `UPDATE TABLE SET fence_token = N WHERE id = ID`.
        c.execute("CREATE TABLE docs (id int PRIMARY KEY, fence_token bigint)")
        c.execute("CREATE TRIGGER docs_fence BEFORE INSERT OR UPDATE OR DELETE ON docs FOR EACH ROW "
                  "EXECUTE FUNCTION fenced_lock_guard('doc:{id}', 'fence_token')")
        c.execute(f"GRANT USAGE ON SCHEMA public TO {ROLE_OTHER}")
        c.execute(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO {ROLE_OTHER}")
    yield url
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        for role in (ROLE_NOEXEC, ROLE_OTHER):
            c.execute(f"DROP ROLE IF EXISTS {role}")


@pytest.fixture
def admin(dsn):
    """A superuser connection of the suite's database, for the test's own
    checks (the history, pg_stat_activity, takeovers)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


_names = iter(range(1, 1 << 30))


@pytest.fixture
def name(request):
    """A lock name of this test's own."""
    return f"{request.node.name}:{next(_names)}"


_ids = iter(range(1000, 1 << 30))


@pytest.fixture
def doc(admin):
    """A fresh row of `docs`: (id, its lock name). Rows can only be inserted
    with a live token, so the row is inserted under a lease of its own."""
    i = next(_ids)
    lock = f"doc:{i}"
    t = admin.execute("SELECT fenced_lock_try_acquire(%s, '10 s')", (lock,)).fetchone()[0]
    admin.execute("INSERT INTO docs VALUES (%s, %s)", (i, t))
    assert admin.execute("SELECT fenced_lock_release(%s, %s)", (lock, t)).fetchone()[0]
    return i, lock


def history(conn, name):
    """The history of lock `name`, oldest first: dicts of token, ended_by, ..."""
    cur = conn.execute("SELECT token, holder, session_bound, ended_by, ended_by_role, acquired_at, ended_at "
                       "FROM fenced_lock_history WHERE name = %s ORDER BY token", (name,))
    cols = [d.name for d in cur.description]
    return [dict(zip(cols, row)) for row in cur.fetchall()]


def live_token(conn, name):
    row = conn.execute("SELECT token FROM fenced_lock_leases WHERE name = %s AND live", (name,)).fetchone()
    return row[0] if row else None


def wait_until(predicate, timeout, what, step=0.02):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


def keepalive_pids(conn, dbname=DB):
    return [r[0] for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = 'fenced_lock_keepalive'",
        (dbname,)).fetchall()]


@contextmanager
def traced(pgconn_owner):
    """Record the protocol messages libpq exchanges on a connection; yields a
    function returning the lines so far (see `sent`)."""
    tmp = tempfile.TemporaryFile(mode="w+")
    fd = os.dup(tmp.fileno())  # the FILE* libpq writes through owns this one
    pgconn_owner.pgconn.trace(fd)

    def lines():
        return [line for line in open(f"/proc/self/fd/{tmp.fileno()}").read().splitlines() if line.strip()]

    try:
        yield lines
    finally:
        pgconn_owner.pgconn.untrace()
        tmp.close()


def sent(lines):
    """The messages the client sent (libpq marks them F, for frontend)."""
    return [line for line in lines() if line.split("\t")[1:2] == ["F"]]


def statements_sent(lines):
    """The statements among them (not the Terminate of a close)."""
    return [line for line in sent(lines) if line.split("\t")[3:4] != ["Terminate"]]


class Example:
    """A conformance example (clients/python/run-example) in a process group
    of its own, so that SIGSTOP and SIGKILL reach the interpreter whatever
    wraps it. Its JSON lines are read by a thread and stamped with this
    process's monotonic clock on arrival."""

    def __init__(self, args, env=None):
        self.args = [str(a) for a in args]
        self.proc = subprocess.Popen([str(RUN_EXAMPLE), *self.args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, env={**os.environ, **(env or {})})
        self.lines = queue.Queue()
        self.all = []
        self.raw = []
        self._stderr = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            at = time.monotonic()
            self.raw.append(line)
            try:
                msg = json.loads(line)
            except ValueError:
                msg = {"event": "<not json>", "line": line}
            msg["_at"] = at
            self.all.append(msg)
            self.lines.put(msg)
        self.lines.put({"event": "<eof>", "_at": time.monotonic()})

    def _read_stderr(self):
        for line in self.proc.stderr:
            self._stderr.append(line)

    @property
    def stderr(self):
        return "".join(self._stderr)

    def next(self, timeout):
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line from {self.args[0]} within {timeout} s; stderr:\n{self.stderr}") from None

    def expect(self, event, timeout, skip=("renewed",)):
        """The next line that is not one of `skip`; it must be `event`."""
        while True:
            msg = self.next(timeout)
            if msg["event"] in skip:
                continue
            assert msg["event"] == event, f"expected {event!r}, got {msg}; stderr:\n{self.stderr}"
            return msg

    def signal(self, sig):
        os.killpg(self.proc.pid, sig)
        return time.monotonic()

    def wait(self, timeout):
        return self.proc.wait(timeout)

    def events(self, name):
        return [m for m in self.all if m["event"] == name]

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)


@pytest.fixture
def examples():
    """Starts examples for one test and kills every one of them at the end."""
    started = []

    def start(*args, env=None):
        e = Example(args, env)
        started.append(e)
        return e

    yield start
    for e in started:
        e.kill()


def process_state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


SPY = """
CREATE SCHEMA IF NOT EXISTS fl_spy;
CREATE TABLE IF NOT EXISTS fl_spy.calls (
    fn text NOT NULL, name text NOT NULL, token bigint NOT NULL, pid int NOT NULL,
    application_name text, started timestamptz NOT NULL, ended timestamptz NOT NULL, result boolean);
-- Stand-ins found first on the search_path of the connections that set it:
-- they record every renew and release the server runs (when each started and
-- ended, on the server's clock), then call the real function. A renew can
-- be made to take a while (fl_spy.renew_delay, seconds) before it runs.
CREATE OR REPLACE FUNCTION fl_spy.fenced_lock_renew(name text, token bigint, ttl interval DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE started timestamptz := clock_timestamp(); r boolean;
BEGIN
    PERFORM pg_sleep(coalesce(nullif(current_setting('fl_spy.renew_delay', true), ''), '0')::float8);
    r := public.fenced_lock_renew(name, token, ttl);
    INSERT INTO fl_spy.calls VALUES ('renew', name, token, pg_backend_pid(), current_setting('application_name'),
                                     started, clock_timestamp(), r);
    RETURN r;
END $$;
CREATE OR REPLACE FUNCTION fl_spy.fenced_lock_release(name text, token bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE started timestamptz := clock_timestamp(); r boolean;
BEGIN
    r := public.fenced_lock_release(name, token);
    INSERT INTO fl_spy.calls VALUES ('release', name, token, pg_backend_pid(), current_setting('application_name'),
                                     started, clock_timestamp(), r);
    RETURN r;
END $$;
"""


@pytest.fixture(scope="session")
def _spy_installed(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(SPY)


@pytest.fixture
def spy(dsn, _spy_installed):
    """(conninfo, calls): a connection string whose sessions run every renew
    and release through the recording stand-ins, and a function returning the
    calls recorded for a lock name, in the order they started."""

    def conninfo(renew_delay=0.0):
        return with_db(dsn, DB, options=f"-c search_path=fl_spy,public -c fl_spy.renew_delay={renew_delay}")

    def calls(name):
        with psycopg.connect(dsn, autocommit=True) as c:
            cur = c.execute("SELECT fn, token, pid, application_name, started, ended, result FROM fl_spy.calls "
                            "WHERE name = %s ORDER BY started", (name,))
            cols = [d.name for d in cur.description]
            return [dict(zip(cols, r)) for r in cur.fetchall()]

    return conninfo, calls
