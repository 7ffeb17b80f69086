"""Guarantee (docs/design.md, "Invariants" 1-4, "Modes", "Waiting",
"Session-bound leases"): under a long, messy mix of every operation in every
mode — exclusive leases, shared leases (and exclusive leases of the same
names, which wait for the shared holders or keep them out), permits of
counting semaphores (and, now and then, a request for another count) —
with try_acquire, acquire with and without a wait bound, renew, release,
validate, assert, guarded INSERT / UPDATE / DELETE at every isolation level,
an operator's force_release (a non-superuser named by
fenced_lock.operator_role), random pauses past the ttl, pg_cancel_backend of
waiting acquirers, and client processes that take session-bound leases of
every mode and are killed with SIGKILL at random moments (holding a lease,
waiting for one, or in the middle of a guarded write) — the committed
history never shows, on the server's clock:
  - an exclusive lease of a name live beside any other lease of it
    (exclusive, shared or permit); more than N live permits of a semaphore
    of N; a name's count changed while any of its leases was live;
  - an accepted guarded write whose token was not a live lease of its row's
    name at its commit, of a mode its guard accepts (a shared lease only
    where the guard says 'shared'; a write of a lease that expired while it
    was in flight commits before anything takes the lease's place);
  - a token granted twice, or tokens going down in grant order, across modes;
  - an expired lease being renewed;
  - a lost update: each exclusive counter equals its row's version and the
    number of committed increments, at every step of its history.
Shared holders write rows of their own (inserts), never one counter: several
of them are live at once, so nothing would fence a read-modify-write among
them. The history is recorded server-side by AFTER triggers and read with
commit timestamps (track_commit_timestamp = on); lease_history.py checks it,
and test_lease_history_checker.py checks the checker.
"""

import random
import signal
import threading
import time
from collections import Counter

import psycopg
import pytest

import lease_history
from faultkit import connect
from harness.clientproc import ClientProcess

APP = "fl_stress_app"
OPERATOR = "fl_stress_operator"  # fenced_lock.operator_role of the test database
RESOURCES = [f"r{i}" for i in range(4)]  # exclusive names stress:rN
SHARED = ["s0", "s1"]                    # shared:sN, mostly shared leases, some exclusive
# permit:pN and the counts clients ask for: p1 sometimes as a semaphore of 2,
# which only a moment with no permit of it live can grant.
SEMAPHORES = {"p0": [3], "p1": [3, 3, 3, 2]}
NAMES = ([f"stress:{r}" for r in RESOURCES] + [f"shared:{s}" for s in SHARED]
         + [f"permit:{p}" for p in SEMAPHORES])
CLIENTS = 10
RUN_S = 30
TTLS = [0.3, 0.8, 2.0]
WAITS = ["100 milliseconds", "500 milliseconds", "2 seconds", None]
LEVELS = ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"]

SCHEMA = f"""
CREATE TABLE stock (res text PRIMARY KEY, counter bigint NOT NULL DEFAULT 0,
                    version bigint NOT NULL DEFAULT 0, fence_token bigint);
INSERT INTO stock (res) SELECT 'r' || i FROM generate_series(0, {len(RESOURCES) - 1}) i;
CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('stress:{{res}}');
CREATE TABLE events (id bigserial PRIMARY KEY, res text NOT NULL, fence_token bigint, note text);
CREATE TRIGGER events_fence BEFORE INSERT OR UPDATE OR DELETE ON events
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('stress:{{res}}');
-- one row per write of a shared name's holder: its guard accepts shared leases
CREATE TABLE readings (id bigserial PRIMARY KEY, res text NOT NULL, fence_token bigint, note text);
CREATE TRIGGER readings_fence BEFORE INSERT OR UPDATE OR DELETE ON readings
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('shared:{{res}}', 'fence_token', 'shared');
-- a shared name's counter, for its exclusive holders only: its guard refuses shared leases
CREATE TABLE tallies (res text PRIMARY KEY, counter bigint NOT NULL DEFAULT 0,
                      version bigint NOT NULL DEFAULT 0, fence_token bigint);
INSERT INTO tallies (res) VALUES {", ".join(f"('{s}')" for s in SHARED)};
CREATE TRIGGER tallies_fence BEFORE INSERT OR UPDATE OR DELETE ON tallies
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('shared:{{res}}');
CREATE TABLE slots (id bigserial PRIMARY KEY, res text NOT NULL, fence_token bigint,
                    n integer NOT NULL DEFAULT 0);
CREATE TRIGGER slots_fence BEFORE INSERT OR UPDATE OR DELETE ON slots
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('permit:{{res}}');
GRANT EXECUTE ON FUNCTION fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer),
  fenced_lock_acquire(text, interval, interval, text, boolean, boolean, integer), fenced_lock_renew(text, bigint, interval),
  fenced_lock_release(text, bigint), fenced_lock_validate(text, bigint), fenced_lock_assert(text, bigint)
  TO {APP};
GRANT SELECT, INSERT, UPDATE, DELETE ON stock, events, readings, tallies, slots TO {APP};
GRANT USAGE ON SEQUENCE events_id_seq, readings_id_seq, slots_id_seq TO {APP};
GRANT EXECUTE ON FUNCTION fenced_lock_force_release(text) TO {OPERATOR};
"""

# 25P02 is not expected: every client runs in autocommit mode, and a statement
# that fails rolls its own transaction back (a cancelled wait included).
EXPECTED = {"FL001", "40001", "55P03", "57014"}
# FL003 only where a request can conflict as asked: an acquire (another count
# of a semaphore is live, or the client's own lease of another mode), and a
# shared lease presented to the tallies' guard.
MAY_CONFLICT = {"FL003"}

KILLABLE = 3  # client processes alive at any time, each killed with SIGKILL after a while

# A client process: session-bound leases of every mode, guarded writes,
# re-acquire, release. It reports grants, and stops at the first unexpected
# error (reported).
KILLABLE_BODY = """
import random
rnd = random.Random(ARGS["seed"])
conn.execute("SET statement_timeout = 3000")
expected = set(ARGS["expected"])
# One ttl per process: an acquire of a name this session still holds extends
# it, and the history checker tells the decision time by expires_at - ttl.
ttl = rnd.choice([0.8, 2.0, 5.0])


def write(mode, res, token):
    if mode == "exclusive":
        with conn.transaction():
            value = conn.execute("SELECT counter FROM stock WHERE res = %s", (res,)).fetchone()[0]
            time.sleep(rnd.uniform(0, 0.05))
            conn.execute("UPDATE stock SET counter = %s, version = version + 1, fence_token = %s "
                         "WHERE res = %s", (value + 1, token, res))
    elif mode == "shared":
        conn.execute("INSERT INTO readings (res, fence_token, note) VALUES (%s, %s, 'k')", (res, token))
    else:
        conn.execute("INSERT INTO slots (res, fence_token) VALUES (%s, %s)", (res, token))


while True:
    mode = rnd.choice(["exclusive", "shared", "permit"])
    if mode == "exclusive":
        res = rnd.choice(ARGS["resources"])
        name, shared, permits = "stress:" + res, False, 1
    elif mode == "shared":
        res = rnd.choice(ARGS["shared"])
        name, shared, permits = "shared:" + res, True, 1
    else:
        res = rnd.choice(sorted(ARGS["semaphores"]))
        name, shared, permits = "permit:" + res, False, ARGS["semaphores"][res][0]
    acquire = ("SELECT fenced_lock_acquire(%s, make_interval(secs => %s), %s::interval, NULL, true, %s, %s)")
    try:
        token = conn.execute(acquire, (name, ttl, rnd.choice(["200 milliseconds", "1 second"]), shared,
                                       permits)).fetchone()[0]
        say("granted", token=token, mode=mode)
        for _ in range(rnd.randint(1, 6)):
            write(mode, res, token)
            say("wrote", mode=mode)
            if rnd.random() < 0.3:
                # same session, same mode: same token, extended -- while the
                # lease is live. Since the write it may have expired (ttl
                # 0.8 s) or been force-released; then the history must say
                # so, and the new token must be larger.
                again = conn.execute(acquire, (name, ttl, "1 second", shared, permits)).fetchone()[0]
                # (This role may not read the history: the test checks
                # each such pair after the run, as the superuser.)
                if again != token:
                    say("reacquired_after_end", old=token, new=again)
                    token = again
        if rnd.random() < 0.5:
            conn.execute("SELECT fenced_lock_release(%s, %s)", (name, token))
            say("released")
        else:
            time.sleep(rnd.uniform(0, 0.3))  # keep it; it ends by expiry, release or our death
    except psycopg.Error as e:
        if e.sqlstate not in expected:
            say("unexpected", sqlstate=e.sqlstate, message=str(e))
            break
        say("sqlstate", sqlstate=e.sqlstate)
time.sleep(600)
"""


class Client:
    def __init__(self, port, dbname, i, stats, deadline):
        self.port, self.dbname, self.i = port, dbname, i
        self.stats, self.deadline = stats, deadline
        self.rnd = random.Random(1000 + i)
        # One ttl per name: a re-acquire by the same holder extends with the
        # ttl it asks for, and the checker assumes the granted one.
        self.ttls = {name: self.rnd.choice(TTLS) for name in NAMES}
        self.lease = None  # (mode, name, res, token, ttl)
        self.rows = []     # ids this client inserted into readings / slots under its current lease

    def op(self, what, fn, also=frozenset()):
        """Run one operation; count its outcome; return its value (or None on an expected error)."""
        mode = self.lease[0] if self.lease else "none"
        self.stats["op:" + what] += 1
        self.stats[f"op:{what}:{mode}"] += 1
        try:
            return fn()
        except psycopg.Error as e:
            if e.sqlstate not in EXPECTED | also:
                raise
            self.stats[f"{what}:{e.sqlstate}"] += 1
            self.stats["sqlstate:" + e.sqlstate] += 1
            if e.sqlstate == "FL001":
                self.stats[f"FL001:{mode}"] += 1
                self.lease = None  # we lost the lock: never write with this token again
            return None

    def run(self):
        with connect(self.port, self.dbname, user=APP, statement_timeout_ms=3000) as conn:
            self.conn = conn
            while time.monotonic() < self.deadline:
                if self.lease is None:
                    self.acquire()
                else:
                    self.act()

    def acquire(self):
        kind = self.rnd.choices(["exclusive", "shared", "permit"], weights=[4, 3, 3])[0]
        shared, permits = False, 1
        if kind == "exclusive":
            res = self.rnd.choice(RESOURCES)
            name = f"stress:{res}"
        elif kind == "shared":
            res = self.rnd.choice(SHARED)
            name = f"shared:{res}"
            shared = self.rnd.random() < 0.65
            kind = "shared" if shared else "exclusive"
        else:
            res = self.rnd.choice(sorted(SEMAPHORES))
            name = f"permit:{res}"
            permits = self.rnd.choice(SEMAPHORES[res])
        ttl = self.ttls[name]
        holder = self.rnd.choice([None, f"client-{self.i}"])
        if self.rnd.random() < 0.4:
            token = self.op("try_acquire", lambda: self.conn.execute(
                "SELECT fenced_lock_try_acquire(%s, make_interval(secs => %s), %s, false, %s, %s)",
                (name, ttl, holder, shared, permits)).fetchone()[0], also=MAY_CONFLICT)
            if token is None:
                time.sleep(self.rnd.uniform(0, 0.05))
        else:
            wait = self.rnd.choice(WAITS)
            token = self.op("acquire", lambda: self.conn.execute(
                "SELECT fenced_lock_acquire(%s, make_interval(secs => %s), %s::interval, %s, false, %s, %s)",
                (name, ttl, wait, holder, shared, permits)).fetchone()[0], also=MAY_CONFLICT)
        if token is not None:
            self.stats["granted"] += 1
            self.stats["granted:" + kind] += 1
            self.lease = (kind, name, res, token, ttl)
            self.rows = []

    def act(self):
        mode, name, res, token, ttl = self.lease
        c = self.conn
        writes = {
            ("exclusive", "stress"): [(0.30, lambda: self.increment("stock", res, token, ttl)),
                                      (0.12, lambda: self.insert("events", res, token)),
                                      (0.08, lambda: self.delete_oldest("events", name, res, token))],
            ("exclusive", "shared"): [(0.30, lambda: self.increment("tallies", res, token, ttl)),
                                      (0.12, lambda: self.insert("readings", res, token)),
                                      (0.08, lambda: self.delete_oldest("readings", name, res, token))],
            ("shared", "shared"): [(0.35, lambda: self.insert("readings", res, token)),
                                   (0.08, lambda: self.touch("readings", token)),
                                   (0.07, lambda: self.shared_into_tallies(res, token))],
            ("permit", "permit"): [(0.35, lambda: self.insert("slots", res, token)),
                                   (0.08, lambda: self.touch("slots", token)),
                                   (0.07, lambda: self.delete_oldest("slots", name, res, token))],
        }[(mode, name.split(":")[0])]
        r = self.rnd.random()
        for weight, write in writes:
            if r < weight:
                return write()
            r -= weight
        if r < 0.10:
            ok = self.op("renew", lambda: c.execute("SELECT fenced_lock_renew(%s, %s, %s::interval)",
                                                    (name, token, self.rnd.choice([None, f"{ttl} seconds"]))
                                                    ).fetchone()[0])
            if ok is False:
                self.lease = None
        elif r < 0.16:
            self.op("assert", lambda: c.execute("SELECT fenced_lock_assert(%s, %s)", (name, token)))
        elif r < 0.20:
            if self.op("validate", lambda: c.execute("SELECT fenced_lock_validate(%s, %s)", (name, token)
                                                     ).fetchone()[0]) is False:
                self.lease = None
        elif r < 0.32:
            self.op("release", lambda: c.execute("SELECT fenced_lock_release(%s, %s)", (name, token)).fetchone()[0])
            self.lease = None
        else:
            # A pause, sometimes past the ttl: the next write must then be rejected.
            self.stats["pause"] += 1
            self.stats["pause:" + mode] += 1
            time.sleep(self.rnd.uniform(0, ttl * 1.6))

    def increment(self, table, res, token, ttl):
        """Read-modify-write of an exclusive counter, at a random isolation
        level, sometimes pausing between the read and the write."""
        c = self.conn
        level = self.rnd.choice(LEVELS)
        pause = self.rnd.random() < 0.2

        def rmw():
            with c.transaction():
                c.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
                value = c.execute(f"SELECT counter FROM {table} WHERE res = %s", (res,)).fetchone()[0]
                if pause:
                    time.sleep(self.rnd.uniform(0, ttl * 1.6))
                c.execute(f"UPDATE {table} SET counter = %s, version = version + 1, fence_token = %s "
                          "WHERE res = %s", (value + 1, token, res))
            return True

        if self.op("increment:" + table, rmw):
            self.stats[f"acked_increments:{table}:{res}"] += 1

    def insert(self, table, res, token):
        """A row of this holder's own, at a random isolation level."""
        c = self.conn
        level = self.rnd.choice(LEVELS)

        def insert():
            with c.transaction():
                c.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
                return c.execute(f"INSERT INTO {table} (res, fence_token, note) VALUES (%s, %s, 'x') RETURNING id"
                                 if table != "slots" else
                                 "INSERT INTO slots (res, fence_token) VALUES (%s, %s) RETURNING id",
                                 (res, token)).fetchone()[0]

        row = self.op("insert:" + table, insert)
        if row is not None:
            self.rows.append(row)

    def touch(self, table, token):
        """An UPDATE of a row this holder inserted under this lease (unless
        an exclusive holder's clean-up or a permit holder deleted it)."""
        if not self.rows:
            return
        row = self.rnd.choice(self.rows)
        self.op("update:" + table, lambda: self.conn.execute(
            f"UPDATE {table} SET fence_token = %s, " + ("n = n + 1" if table == "slots" else "note = 'touched'")
            + " WHERE id = %s", (token, row)))

    def delete_oldest(self, table, name, res, token):
        def delete():
            with self.conn.transaction():
                self.conn.execute("SELECT fenced_lock_assert(%s, %s)", (name, token))
                self.conn.execute(f"DELETE FROM {table} WHERE id = (SELECT min(id) FROM {table} WHERE res = %s)",
                                  (res,))
        self.op("delete:" + table, delete)

    def shared_into_tallies(self, res, token):
        """A shared lease presented to a guard without 'shared': FL003 while
        the lease is live (FL001 once it is not), the row unchanged."""
        def write():
            self.conn.execute("UPDATE tallies SET fence_token = %s WHERE res = %s", (token, res))
            return True

        if self.op("shared_into_tallies", write, also=MAY_CONFLICT):
            self.stats["failure: a shared lease's write was accepted by the tallies' guard"] += 1


def operator(port, dbname, stats, deadline):
    rnd = random.Random(7)
    with connect(port, dbname, user=OPERATOR) as c:
        while time.monotonic() < deadline:
            time.sleep(rnd.uniform(0.3, 1.0))
            name = rnd.choice(NAMES)
            stats["op:force_release"] += 1
            if c.execute("SELECT fenced_lock_force_release(%s)", (name,)).fetchone()[0]:
                stats["forced"] += 1
                stats["forced:" + name.split(":")[0]] += 1


def canceller(port, dbname, stats, deadline):
    rnd = random.Random(11)
    with connect(port, dbname) as c:
        while time.monotonic() < deadline:
            time.sleep(rnd.uniform(0.1, 0.5))
            pids = [r[0] for r in c.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' "
                "AND query LIKE 'SELECT fenced_lock_acquire(%%' AND pid <> pg_backend_pid()").fetchall()]
            if pids:
                stats["op:cancel"] += 1
                if c.execute("SELECT pg_cancel_backend(%s)", (rnd.choice(pids),)).fetchone()[0]:
                    stats["cancel_sent"] += 1


def killer(port, dbname, stats, deadline, reacquired):
    """Keep KILLABLE client processes running; every 0.3-1.2 s SIGKILL one of
    them and start another. Then kill the rest. A same-session re-acquire
    that got a new token is put in reacquired as (old, new)."""
    rnd = random.Random(13)
    dsn = f"host=127.0.0.1 port={port} dbname={dbname} user={APP} connect_timeout=10"
    args = dict(resources=RESOURCES, shared=SHARED, semaphores=SEMAPHORES,
                expected=sorted(EXPECTED | MAY_CONFLICT))
    procs = []

    def spawn():
        procs.append(ClientProcess(dsn, KILLABLE_BODY, seed=rnd.randrange(1 << 30), **args))

    def drain(p):
        while (m := p.message()) is not None:
            stats["killable:" + m["event"]] += 1
            if m["event"] == "unexpected":
                stats[f"failure: killable client {m.get('sqlstate')} {m.get('message')}"] += 1
            elif m["event"] == "reacquired_after_end":
                reacquired.append((m["old"], m["new"]))
            elif m["event"] == "wrote":
                stats["killable:wrote:" + m["mode"]] += 1
            elif m["event"] in ("granted", "released"):
                p.holding = m.get("mode") if m["event"] == "granted" else None

    try:
        for _ in range(KILLABLE):
            spawn()
        while time.monotonic() < deadline:
            time.sleep(rnd.uniform(0.3, 1.2))
            victim = procs.pop(rnd.randrange(len(procs)))
            drain(victim)
            stats["killed"] += 1
            holding = getattr(victim, "holding", None)
            if holding:
                stats["killed_holding"] += 1
                stats["killed_holding:" + holding] += 1
            victim.kill(signal.SIGKILL)
            drain(victim)
            victim.close()
            spawn()
    finally:
        for p in procs:
            drain(p)
            p.close()


def guarded(stats, target, *args):
    try:
        target(*args)
    except Exception as e:  # noqa: BLE001 - reported by the main thread
        stats["failure: %r" % (e,)] += 1


@pytest.mark.budget(120)
def test_stress_history_invariants(main_cluster, fresh_db):
    with connect(main_cluster, fresh_db) as db:
        for role in (APP, OPERATOR):
            db.execute(f"DO $$ BEGIN CREATE ROLE {role} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        db.execute(f"ALTER DATABASE {fresh_db} SET fenced_lock.operator_role = '{OPERATOR}'")
        db.execute(SCHEMA)
        lease_history.install(db)
        lease_history.install_write_history(db, "stock", "'stress:' || r.res", "r.version", "r.counter")
        lease_history.install_write_history(db, "events", "'stress:' || r.res")
        lease_history.install_write_history(db, "readings", "'shared:' || r.res", accepts_shared=True)
        lease_history.install_write_history(db, "tallies", "'shared:' || r.res", "r.version", "r.counter")
        lease_history.install_write_history(db, "slots", "'permit:' || r.res")
        assert db.execute("SHOW track_commit_timestamp").fetchone()[0] == "on"

    stats = Counter()
    reacquired = []
    deadline = time.monotonic() + RUN_S
    threads = [threading.Thread(target=guarded, args=(stats, Client(main_cluster.port, fresh_db, i, stats,
                                                                    deadline).run), daemon=True)
               for i in range(CLIENTS)]
    threads.append(threading.Thread(target=guarded, args=(stats, operator, main_cluster.port, fresh_db, stats,
                                                          deadline), daemon=True))
    threads.append(threading.Thread(target=guarded, args=(stats, canceller, main_cluster.port, fresh_db, stats,
                                                          deadline), daemon=True))
    threads.append(threading.Thread(target=guarded, args=(stats, killer, main_cluster.port, fresh_db, stats,
                                                          deadline, reacquired), daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(RUN_S + 30)
        assert not t.is_alive(), "a stress client hung"
    print("stress:", dict(sorted(stats.items())))
    failures = [k for k in stats if k.startswith("failure")]
    assert not failures, failures

    # The run exercised what it claims to.
    for what in ("try_acquire", "acquire", "renew", "release", "assert", "validate", "increment:stock",
                 "increment:tallies", "insert:events", "insert:readings", "insert:slots", "update:readings",
                 "update:slots", "delete:events", "delete:readings", "delete:slots", "shared_into_tallies",
                 "force_release"):
        assert stats["op:" + what] > 0, f"no {what} ran"
    for what in ("renew", "release"):
        for mode in ("exclusive", "shared", "permit"):
            assert stats[f"op:{what}:{mode}"] > 0, f"no {what} of a {mode} lease ran"
    assert stats["granted"] > 50 and stats["forced"] > 0
    assert stats["sqlstate:FL001"] > 0, "no stale write was ever attempted"
    assert stats["shared_into_tallies:FL003"] > 0, "no shared lease was refused by a guard without 'shared'"
    assert stats["killed"] >= 10 and stats["killed_holding"] >= 3 and stats["killable:wrote"] > 0, \
        "too few client processes were killed while holding a session-bound lease"

    with connect(main_cluster, fresh_db) as db:
        lease_evs = lease_history.lease_events(db)
        write_evs = lease_history.write_events(db)
        assert all(e["commit_ts"] is not None for e in lease_evs + write_evs)
        counters = {(tbl, ("stress:" if tbl == "stock" else "shared:") + res): (counter, version)
                    for tbl in ("stock", "tallies")
                    for res, counter, version in db.execute(f"SELECT res, counter, version FROM {tbl}").fetchall()}
        problems = lease_history.check(lease_evs, write_evs, counters)
        assert not problems, "\n".join(str(p) for p in problems[:20])
        seen = lease_history.summary(lease_evs, write_evs)
        print("stress: the history:", seen)
        for mode in ("exclusive", "shared", "permit"):
            assert seen["grants"].get(mode, 0) >= 20 and seen["writes"].get(mode, 0) >= 20, \
                f"too few {mode} leases, or writes under them"
            assert seen["renews"].get(mode, 0) > 0, f"no {mode} lease was renewed"
            assert seen["ended_by"].get(f"{mode}:session_end", 0) >= 1, \
                f"no session-bound {mode} lease ended with its killed client"
        # Modes were used at their limits: shared leases and permits together.
        assert seen["most_live"]["shared"] >= 2 and seen["most_live"]["permit"] >= 2, seen["most_live"]
        assert sum(1 for e in lease_history.grants(lease_evs)
                   if e["name"].startswith("shared:") and e["mode"] == "exclusive") >= 3, \
            "too few exclusive leases of the shared names"

        # A same-session re-acquire returns the held token, unless that lease
        # ended in between by expiry or an operator; then the token is new and larger.
        for old, new in reacquired:
            ended = db.execute("SELECT ended_by FROM fenced_lock_history WHERE token = %s", (old,)).fetchone()
            assert new is not None and new > old and ended is not None \
                and ended[0] in ("expiry", "force_release"), \
                f"re-acquire returned {new}, not {old} (which ended by {ended and ended[0]})"
        print("stress: same-session re-acquires after an end:", len(reacquired))
        ends = dict(db.execute("SELECT mode || ':' || ended_by, count(*) FROM fenced_lock_internal.lease_history "
                               "GROUP BY 1 ORDER BY 1").fetchall())
        print("stress: leases by how they ended:", ends)
        # a session-bound record is never left live without its session
        assert db.execute("SELECT count(*) FROM fenced_lock_leases WHERE session_bound AND live").fetchone()[0] == 0

        # Every acknowledged increment is in its counter (the checker saw the steps).
        for (tbl, name), (counter, _) in counters.items():
            assert counter >= stats[f"acked_increments:{tbl}:{name.split(':')[1]}"], (tbl, name)
        assert sum(1 for w in write_evs if w["tbl"] == "stock") >= 20
        assert sum(1 for w in write_evs if w["tbl"] == "tallies") >= 3
        # The tallies' guard accepted no shared lease: every row's token is an exclusive lease's.
        modes = {e["new_token"]: e["mode"] for e in lease_history.grants(lease_evs)}
        assert all(modes[w["token"]] == "exclusive" for w in write_evs if w["tbl"] == "tallies")
