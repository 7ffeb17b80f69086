"""A client workload whose every operation is recorded only once its commit
has returned, and a checker that compares it with what a server shows after a
crash or a failover (docs/design.md, "Durability" and "Invariants" 6 and 7: no
acknowledged grant, renewal or guarded write is lost; an acknowledged release
may be lost, and then only brings back its own lease).

Each worker owns a few lock names, so its own record says exactly what each
name's lease must be; an operation cut off by the crash is "pending" and is
resolved from the server's state.

The rule for a release (acknowledged before its flush): after the crash the
name is free, or holds exactly the released lease again — same token, holder,
owner and expires_at (so it lives no longer than it would have). It can never
come back once a later grant of any name was acknowledged after it (that
grant's flush covers it), nor with a new token, nor over another holder's
lease: the record of the name is then that lease, and must match it.
"""

import random
import threading
import time

import psycopg

from faultkit import connect

LEDGER_DDL = (
    "CREATE TABLE ledger (id bigserial PRIMARY KEY, res text NOT NULL, writer text NOT NULL, "
    "seq int NOT NULL, fence_token bigint, UNIQUE (writer, seq))",
    "CREATE TRIGGER ledger_fence BEFORE INSERT OR UPDATE OR DELETE ON ledger "
    "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('{prefix}:{{res}}')",
)


def create_ledger(conn, prefix):
    for stmt in LEDGER_DDL:
        conn.execute(stmt.format(prefix=prefix))


def lost_writes(conn, model):
    """Acknowledged writes that the server does not have."""
    written = {(r[0], r[1]): (r[2], r[3]) for r in
               conn.execute("SELECT writer, seq, res, fence_token FROM ledger").fetchall()}
    lost = {k: v for k, v in model.must_writes.items() if written.get(k) != v}
    model.async_writes_lost += sum(1 for k, v in model.maybe_writes.items() if written.get(k) != v)
    model.maybe_writes.clear()
    return lost


class Model:
    """What the clients know, from acknowledged operations only."""

    def __init__(self, prefix, commit_modes, names_per_worker=3):
        self.prefix = prefix
        self.commit_modes = commit_modes  # synchronous_commit of each worker's session
        self.lock = threading.Lock()
        self.names = {}  # name -> dict(token, expires_at, holder, pending)
        for w in range(len(commit_modes)):
            for k in range(names_per_worker):
                self.names[f"{prefix}:{w}:{k}"] = dict(token=None, expires_at=None, holder=f"worker-{w}",
                                                        pending=None, released=None)
        self.acked_tokens = []
        self.must_writes = {}  # (writer, seq) -> (res, token)
        self.maybe_writes = {}  # async-commit writes: not promised, only counted
        self.async_writes_lost = 0
        self.counts = {"grant": 0, "async_grant": 0, "renew": 0, "release": 0, "write": 0,
                       "async_grant_write": 0, "release_came_back": 0}
        self.failures = []
        self.seqs = {}

    def next_seq(self, w):
        with self.lock:
            self.seqs[w] = self.seqs.get(w, 0) + 1
            return self.seqs[w]


def worker(port, dbname, w, model, stop):
    """Client `w`: acquire / write / renew / release its own names until `stop`
    or until the server goes away, recording only acknowledged operations."""
    mode = model.commit_modes[w]
    is_async = mode != "on"  # its plain writes are not promised to survive
    holder = f"worker-{w}"
    own = [n for n, st in model.names.items() if st["holder"] == holder]
    rnd = random.Random(w * 7919 + int(time.time()))
    try:
        conn = connect(port, dbname, statement_timeout_ms=10000)
    except psycopg.Error:
        return
    try:
        conn.execute(f"SET synchronous_commit = {mode}")
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == mode
        while not stop.is_set():
            name = rnd.choice(own)
            st = model.names[name]
            res = name.split(":", 1)[1]  # the ledger's guard template is '<prefix>:{res}'
            if st["token"] is None:
                seq = model.next_seq(w)
                with_write = is_async and rnd.random() < 0.5
                st["pending"] = ("grant",)
                with conn.transaction():
                    t = conn.execute("SELECT fenced_lock_try_acquire(%s, '60 seconds', %s)", (name, holder)).fetchone()[0]
                    if t is None:
                        raise AssertionError(f"{name} is free but try_acquire returned NULL")
                    exp = conn.execute("SELECT expires_at FROM fenced_lock_leases WHERE name = %s", (name,)).fetchone()[0]
                    if with_write:
                        conn.execute("INSERT INTO ledger (res, writer, seq, fence_token) VALUES (%s, %s, %s, %s)",
                                     (res, holder, seq, t))
                with model.lock:
                    st.update(token=t, expires_at=exp, pending=None, released=None)
                    model.acked_tokens.append(t)
                    model.counts["async_grant" if is_async else "grant"] += 1
                    if with_write:
                        model.must_writes[(holder, seq)] = (res, t)
                        model.counts["async_grant_write"] += 1
                continue
            r = rnd.random()
            t = st["token"]
            if r < 0.5:
                seq = model.next_seq(w)
                st["pending"] = ("write",)
                conn.execute("INSERT INTO ledger (res, writer, seq, fence_token) VALUES (%s, %s, %s, %s)",
                             (res, holder, seq, t))
                with model.lock:
                    st["pending"] = None
                    if is_async:
                        model.maybe_writes[(holder, seq)] = (res, t)
                    else:
                        model.must_writes[(holder, seq)] = (res, t)
                        model.counts["write"] += 1
            elif r < 0.75:
                st["pending"] = ("renew",)
                with conn.transaction():
                    ok = conn.execute("SELECT fenced_lock_renew(%s, %s, '60 seconds')", (name, t)).fetchone()[0]
                    if ok is not True:
                        raise AssertionError(f"renew of live {name}/{t} returned {ok}")
                    exp = conn.execute("SELECT expires_at FROM fenced_lock_leases WHERE name = %s", (name,)).fetchone()[0]
                with model.lock:
                    st.update(expires_at=exp, pending=None)
                    model.counts["renew"] += 1
            else:
                st["pending"] = ("release",)
                ok = conn.execute("SELECT fenced_lock_release(%s, %s)", (name, t)).fetchone()[0]
                if ok is not True:
                    raise AssertionError(f"release of live {name}/{t} returned {ok}")
                with model.lock:
                    # (a later grant of any name, acknowledged, makes it
                    # durable; the model keeps it until this name's next grant)
                    st.update(token=None, expires_at=None, pending=None,
                              released=(t, holder, "postgres", st["expires_at"]))
                    model.counts["release"] += 1
    except (psycopg.OperationalError, psycopg.errors.AdminShutdown, psycopg.errors.CrashShutdown):
        pass  # the server died under us: whatever was in flight is unknown
    except Exception as e:  # noqa: BLE001 - reported by the main thread
        model.failures.append(f"{holder}: {e!r}")
    finally:
        try:
            conn.close()
        except Exception:
            pass


def reconcile(model, server):
    """Check every name against the acknowledged state, then adopt the server's
    state for operations whose outcome the client could not know, and for
    acknowledged releases that the crash undid (allowed, see the module doc)."""
    problems = []
    for name, st in model.names.items():
        row = server.get(name)
        pending = st["pending"]
        expected = None if st["token"] is None else (st["token"], st["holder"], "postgres", st["expires_at"])
        released = st["released"]  # the lease of the last acknowledged release, if the name is free since
        came_back = expected is None and released is not None and row == released
        if pending is None or pending == ("write",):
            if row != expected and not came_back:
                problems.append(f"{name}: acknowledged {expected} (released: {released}), after crash {row}")
        elif pending == ("grant",):
            # unknown grant (the name was free): it never happened, or it is a new lease of ours
            if row is not None and not came_back and (row[1] != st["holder"] or row[0] in model.acked_tokens):
                problems.append(f"{name}: unacknowledged grant left {row} (released: {released})")
        elif pending == ("renew",):
            if row is None or row[0] != st["token"] or row[3] < st["expires_at"]:
                problems.append(f"{name}: lease {expected} after an unknown renew is {row}")
        elif pending == ("release",):
            if row is not None and row != expected:
                problems.append(f"{name}: lease {expected} after an unknown release is {row}")
        if came_back:
            model.counts["release_came_back"] += 1
        st["pending"] = None
        st["token"], st["expires_at"] = (row[0], row[3]) if row else (None, None)
        if row is not None:
            st["released"] = None
    return problems
