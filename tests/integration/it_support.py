"""Helpers for the multi-connection integration tests.

Everything here is plain functions over psycopg connections, so that every test
module of tests/integration (and the fixtures in conftest.py) can share them.
"""

import os
import re
import threading
import time
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from harness.api import GUARD, LEASE_FUNCTIONS

# Advisory-lock key spaces of fenced_lock (src/locktags.rs), as pg_locks.classid.
FENCE_SPACE = 0x464C0001  # 1179385857
QUEUE_SPACE = 0x464C0002  # 1179385858
# A session lock (docs/design.md, "Lock protocol") is (db, token >> 32,
# token & 0xffffffff, 0x464D): pg_locks.classid, objid, objsubid.
SESSION_KIND = 0x464D  # 17997
# A lease lock: (token >> 32, token & 0xffffffff, 0x464E).
LEASE_KIND = 0x464E  # 17998

# Every SQL-callable object an application role may be granted.
API_FUNCTIONS = LEASE_FUNCTIONS + [GUARD]


def safe_ident(text):
    """A lower-case identifier made from `text` (a test or module name)."""
    return re.sub(r"[^a-z0-9_]", "_", text.lower())[:50]


# -- roles -----------------------------------------------------------------------


def create_execute_only_role(cluster, dbname, role, functions=None, view=True, login=True):
    """(Re)create `role` with nothing but EXECUTE on the fenced_lock functions of
    `dbname` (all of API_FUNCTIONS unless `functions` names some), SELECT on the
    fenced_lock_leases view when `view`, and CONNECT/USAGE to reach them.
    Force release is not granted: it is for operators. Returns the role name."""
    functions = API_FUNCTIONS if functions is None else functions
    drop_role(cluster, role)
    with cluster.connect() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} {}").format(
            sql.Identifier(role), sql.SQL("LOGIN" if login else "NOLOGIN")))
    with cluster.connect(dbname) as conn:
        conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
            sql.Identifier(dbname), sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(sql.Identifier(role)))
        for f in functions:
            conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(
                sql.SQL(f), sql.Identifier(role)))
        if view:
            conn.execute(sql.SQL("GRANT SELECT ON fenced_lock_leases TO {}").format(sql.Identifier(role)))
    return role


def drop_role(cluster, role):
    """Drop `role` everywhere it has privileges (best effort, for fixtures)."""
    with cluster.connect() as conn:
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
        if not exists:
            return
        dbs = [r[0] for r in conn.execute(
            "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate").fetchall()]
    for db in dbs:
        try:
            with cluster.connect(db) as conn:
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        except psycopg.Error:
            pass
    with cluster.connect() as conn:
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


# -- lease history (test-only trigger on the private lease table) ----------------

HISTORY_DDL = """
CREATE TABLE IF NOT EXISTS public.it_lease_history (
    id             bigserial PRIMARY KEY,
    op             text NOT NULL,          -- grant | renew | release
    name           text NOT NULL,
    token          bigint NOT NULL,
    old_token      bigint,                 -- grant over an expired record: its token
    at             timestamptz NOT NULL,   -- clock_timestamp() of the change
    acquired_at    timestamptz,
    old_expires_at timestamptz,
    new_expires_at timestamptz,
    backend        int NOT NULL DEFAULT pg_backend_pid(),
    xid            bigint NOT NULL DEFAULT txid_current()  -- a takeover ends and grants in one
);
CREATE OR REPLACE FUNCTION public.it_log_lease() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO public.it_lease_history (op, name, token, at, acquired_at, new_expires_at)
    VALUES ('grant', NEW.name, NEW.token, clock_timestamp(), NEW.acquired_at, NEW.expires_at);
  ELSIF TG_OP = 'UPDATE' AND NEW.token IS DISTINCT FROM OLD.token THEN
    INSERT INTO public.it_lease_history (op, name, token, old_token, at, acquired_at, old_expires_at, new_expires_at)
    VALUES ('grant', NEW.name, NEW.token, OLD.token, clock_timestamp(), NEW.acquired_at, OLD.expires_at, NEW.expires_at);
  ELSIF TG_OP = 'UPDATE' THEN
    INSERT INTO public.it_lease_history (op, name, token, at, acquired_at, old_expires_at, new_expires_at)
    VALUES ('renew', NEW.name, NEW.token, clock_timestamp(), NEW.acquired_at, OLD.expires_at, NEW.expires_at);
  ELSE
    INSERT INTO public.it_lease_history (op, name, token, at, acquired_at, old_expires_at)
    VALUES ('release', OLD.name, OLD.token, clock_timestamp(), OLD.acquired_at, OLD.expires_at);
  END IF;
  RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS it_log_lease ON fenced_lock_internal.granted_leases;
CREATE TRIGGER it_log_lease AFTER INSERT OR UPDATE OR DELETE ON fenced_lock_internal.granted_leases
  FOR EACH ROW EXECUTE FUNCTION public.it_log_lease();
"""


def install_history(cluster, dbname):
    """As superuser: log every committed change of a lease record of `dbname`
    into public.it_lease_history (the log row commits or aborts with it)."""
    with cluster.connect(dbname) as conn:
        conn.execute(HISTORY_DDL)


def remove_history(cluster, dbname):
    with cluster.connect(dbname) as conn:
        conn.execute("DROP TRIGGER IF EXISTS it_log_lease ON fenced_lock_internal.granted_leases")
        conn.execute("DROP TABLE IF EXISTS public.it_lease_history")
        conn.execute("DROP FUNCTION IF EXISTS public.it_log_lease()")


@dataclass
class Event:
    id: int
    op: str
    name: str
    token: int
    old_token: int
    at: object
    acquired_at: object
    old_expires_at: object
    new_expires_at: object
    xid: int = 0


def read_history(conn, names=None):
    """The log, a takeover told apart from a release: since 0.3.0 a grant
    that replaces an ended record deletes it and inserts its own, in one
    transaction, so such a delete is logged as `takeover` and its grant
    carries the old token and expiry."""
    q = ("SELECT id, op, name, token, old_token, at, acquired_at, old_expires_at, new_expires_at, xid "
         "FROM public.it_lease_history")
    params = None
    if names is not None:
        q += " WHERE name = ANY(%s)"
        params = (list(names),)
    q += " ORDER BY id"
    events = [Event(*r) for r in conn.execute(q, params).fetchall()]
    grants = {(e.name, e.xid): e for e in events if e.op == "grant"}
    for e in events:
        g = grants.get((e.name, e.xid))
        if e.op == "release" and g is not None and g.id > e.id:
            e.op = "takeover"
            g.old_token, g.old_expires_at = e.token, e.old_expires_at
    return [e for e in events if e.op != "takeover"]


@dataclass
class Lease:
    token: int
    acquired_at: object
    expires_at: object
    end: object = None  # release time, or expires_at if it was never released


@dataclass
class LeaseCheck:
    """What check_history found: per name, the leases in grant order."""
    leases: dict = field(default_factory=dict)
    grants: list = field(default_factory=list)  # tokens of every grant, all names
    renews: int = 0
    releases: int = 0


def check_history(events):
    """Replay the server-side lease history and assert the lease invariants:

    - every token is granted once, across all names;
    - per name, tokens strictly increase in grant order;
    - per name, a grant starts no earlier than the previous lease ended (its
      release, or its expiry if it was not released): leases never overlap;
    - renew and release only ever touch the current lease of the name.

    Transitions of one name are serialized (exclusive advisory lock held to
    commit), so clock_timestamp() order is their commit order."""
    out = LeaseCheck()
    by_name = {}
    for e in events:
        by_name.setdefault(e.name, []).append(e)
    for name, evs in by_name.items():
        evs.sort(key=lambda e: (e.at, e.id))
        cur = None
        done = []
        for e in evs:
            if e.op == "grant":
                if cur is not None:
                    # the record was replaced: the current lease must have expired
                    assert e.old_token == cur.token, (name, e, cur)
                    assert e.old_expires_at == cur.expires_at, (name, e, cur)
                    cur.end = cur.expires_at
                    done.append(cur)
                else:
                    assert e.old_token is None, ("grant over a record history does not know", name, e)
                if done:
                    prev = done[-1]
                    assert e.token > prev.token, f"{name}: token {e.token} granted after {prev.token}"
                    assert e.acquired_at >= prev.end, (
                        f"{name}: lease {e.token} acquired at {e.acquired_at} overlaps lease {prev.token} "
                        f"that ended at {prev.end}")
                cur = Lease(e.token, e.acquired_at, e.new_expires_at)
                out.grants.append(e.token)
            elif e.op == "renew":
                assert cur is not None and e.token == cur.token, (name, e, cur)
                assert e.old_expires_at == cur.expires_at, (name, e, cur)
                cur.expires_at = e.new_expires_at
                out.renews += 1
            elif e.op == "release":
                assert cur is not None and e.token == cur.token, (name, e, cur)
                cur.end = min(e.at, cur.expires_at)
                done.append(cur)
                cur = None
                out.releases += 1
            else:
                raise AssertionError(f"unknown op {e.op}")
        if cur is not None:
            cur.end = cur.expires_at
            done.append(cur)
        out.leases[name] = done
    assert len(out.grants) == len(set(out.grants)), "a token was granted twice"
    return out


# -- waiting ---------------------------------------------------------------------


def one(conn, query, params=None):
    """The first column of the first row of `query`."""
    return conn.execute(query, params).fetchone()[0]


def create_guarded_docs(cluster, dbname, template):
    """Table `docs (id text, body text, fence_token bigint)`, guarded by
    `fenced_lock_guard(template)`."""
    with cluster.connect(dbname) as conn:
        conn.execute("CREATE TABLE docs (id text PRIMARY KEY, body text, fence_token bigint)")
        conn.execute("CREATE TRIGGER docs_fence BEFORE INSERT OR UPDATE OR DELETE ON docs "
                     f"FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('{template}')")


def wait_until(predicate, timeout=10.0, interval=0.005, what="condition"):
    """Poll `predicate` until it returns something truthy; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        v = predicate()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def queue_locks(mon, pid=None, name=None):
    """fenced_lock queue-space advisory locks held or awaited (by `pid`, for
    lock `name`), as (pid, granted) rows."""
    q = ("SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
         "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
    params = [QUEUE_SPACE]
    if pid is not None:
        q += " AND pid = %s"
        params.append(pid)
    if name is not None:
        q += " AND objid = hashtext(%s)::oid"
        params.append(name)
    return mon.execute(q, params).fetchall()


def is_queued(mon, pid):
    """`pid` is visibly waiting in fenced_lock_acquire: it holds (head waiter)
    or awaits (queued behind the head) the name's queue lock."""
    return bool(queue_locks(mon, pid))


def session_locks(mon, pid=None):
    """Tokens whose session lock (a session-bound lease's) is held, by `pid`."""
    q = ("SELECT (classid::bigint << 32) + objid::bigint FROM pg_locks WHERE locktype = 'advisory' "
         "AND objsubid = %s AND granted")
    params = [SESSION_KIND]
    if pid is not None:
        q += " AND pid = %s"
        params.append(pid)
    return sorted(r[0] for r in mon.execute(q, params).fetchall())


def elapsed_ms(since, until=None):
    return ((until if until is not None else time.monotonic()) - since) * 1000


def fenced_locks_of(mon, pid):
    """Every fenced_lock advisory lock held or awaited by `pid`: name, queue
    and the other keyed spaces, and lease locks (token, 0x464E)."""
    return mon.execute(
        "SELECT classid::bigint, objid::bigint, mode, granted FROM pg_locks "
        "WHERE locktype = 'advisory' AND pid = %s AND (classid BETWEEN %s AND %s OR objsubid = %s)",
        (pid, FENCE_SPACE, FENCE_SPACE + 15, LEASE_KIND)).fetchall()


def cancel_and_close(mon, conns):
    """Close `conns`; cancel first whatever their backends still run (a wait
    that did not end as a test expected must not outlive the test)."""
    for c in conns:
        if c is None or c.closed:
            continue
        try:
            mon.execute("SELECT pg_cancel_backend(%s)", (c.info.backend_pid,))
        except psycopg.Error:
            pass
        c.close()


class Call(threading.Thread):
    """Run `fn()` in a thread; keep its result or the exception it raised, and
    the monotonic time at which it returned."""

    def __init__(self, fn, name=None):
        super().__init__(daemon=True, name=name)
        self.fn = fn
        self.result = None
        self.error = None
        self.finished_at = None

    def run(self):
        try:
            self.result = self.fn()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            self.finished_at = time.monotonic()

    def outcome(self, timeout):
        """Join; the result, or raise what the call raised."""
        self.join(timeout)
        assert not self.is_alive(), f"call {self.name} did not finish within {timeout} s"
        if self.error is not None:
            raise self.error
        return self.result


def start(fn, name=None):
    c = Call(fn, name)
    c.start()
    return c


# -- processes -------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime + stime of process `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # after the ')' : state is field 3, utime field 14, stime field 15
    return (int(fields[11]) + int(fields[12])) / CLK_TCK
