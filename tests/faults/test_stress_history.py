"""Guarantee (docs/design.md, "Invariants" 1-4, "Waiting", "Session-bound
leases"): under a long, messy mix of every operation — try_acquire, acquire
with and without a wait bound, renew, release, validate, assert, guarded
INSERT / UPDATE / DELETE at every isolation level, an operator's force_release
(a non-superuser named by fenced_lock.operator_role), random pauses past the
ttl, pg_cancel_backend of waiting acquirers, and client processes that take
session-bound leases and are killed with SIGKILL at random moments (holding a
lease, waiting for one, or in the middle of a guarded write) — the committed
history never shows:
  - two live leases of one name at the same moment (on the server's clock; a
    session-bound lease is over once its session ended, which fenced_lock's
    own history must then record as `session_end`);
  - a token granted twice, or a name's tokens going down in commit order;
  - an expired lease being renewed;
  - an accepted write whose token was not the name's lease at commit time
    (every accepted write commits after its grant and before the next one);
  - a lost update: each counter equals its row's version and the number of
    committed increments, at every step of its history.
The history is recorded server-side by AFTER triggers (see lease_history.py)
and read with commit timestamps (track_commit_timestamp = on).
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
RESOURCES = [f"r{i}" for i in range(4)]
CLIENTS = 8
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
GRANT EXECUTE ON FUNCTION fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer),
  fenced_lock_acquire(text, interval, interval, text, boolean, boolean, integer), fenced_lock_renew(text, bigint, interval),
  fenced_lock_release(text, bigint), fenced_lock_validate(text, bigint), fenced_lock_assert(text, bigint)
  TO {APP};
GRANT SELECT, INSERT, UPDATE, DELETE ON stock, events TO {APP};
GRANT USAGE ON SEQUENCE events_id_seq TO {APP};
GRANT EXECUTE ON FUNCTION fenced_lock_force_release(text) TO {OPERATOR};
"""

# 25P02 is not expected: every client runs in autocommit mode, and a statement
# that fails rolls its own transaction back (a cancelled wait included).
EXPECTED = {"FL001", "40001", "55P03", "57014"}

KILLABLE = 3  # client processes alive at any time, each killed with SIGKILL after a while

# A client process: session-bound leases, guarded increments, renew, release.
# It reports grants, and stops at the first unexpected error (reported).
KILLABLE_BODY = """
import random
rnd = random.Random(ARGS["seed"])
conn.execute("SET statement_timeout = 3000")
expected = set(ARGS["expected"])
# One ttl per process: an acquire of a name this session still holds extends
# it, and the history checker tells the decision time by expires_at - ttl.
ttl = rnd.choice([0.8, 2.0, 5.0])
while True:
    res = rnd.choice(ARGS["resources"])
    name = "stress:" + res
    try:
        token = conn.execute(
            "SELECT fenced_lock_acquire(%s, make_interval(secs => %s), %s::interval, NULL, true)",
            (name, ttl, rnd.choice(["200 milliseconds", "1 second"]))).fetchone()[0]
        say("granted", token=token)
        for _ in range(rnd.randint(1, 6)):
            with conn.transaction():
                value = conn.execute("SELECT counter FROM stock WHERE res = %s", (res,)).fetchone()[0]
                time.sleep(rnd.uniform(0, 0.05))
                conn.execute("UPDATE stock SET counter = %s, version = version + 1, fence_token = %s "
                             "WHERE res = %s", (value + 1, token, res))
            say("wrote")
            if rnd.random() < 0.3:
                # same session: same token, extended -- while the lease is
                # live. Since the write it may have expired (ttl 0.8 s) or
                # been force-released; then the history must say so, and
                # the new token must be larger.
                again = conn.execute("SELECT fenced_lock_acquire(%s, make_interval(secs => %s), '1 second', "
                                     "NULL, true)", (name, ttl)).fetchone()[0]
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
        self.lease = None  # (name, res, token, ttl)

    def op(self, what, fn):
        """Run one operation; count its outcome; return its value (or None on an expected error)."""
        self.stats["op:" + what] += 1
        try:
            return fn()
        except psycopg.Error as e:
            if e.sqlstate not in EXPECTED:
                raise
            self.stats[f"{what}:{e.sqlstate}"] += 1
            self.stats["sqlstate:" + e.sqlstate] += 1
            if e.sqlstate == "FL001":
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
        res = self.rnd.choice(RESOURCES)
        name = f"stress:{res}"
        ttl = self.rnd.choice(TTLS)
        holder = self.rnd.choice([None, f"client-{self.i}"])
        if self.rnd.random() < 0.4:
            token = self.op("try_acquire", lambda: self.conn.execute(
                "SELECT fenced_lock_try_acquire(%s, make_interval(secs => %s), %s)", (name, ttl, holder)).fetchone()[0])
            if token is None:
                time.sleep(self.rnd.uniform(0, 0.05))
        else:
            wait = self.rnd.choice(WAITS)
            token = self.op("acquire", lambda: self.conn.execute(
                "SELECT fenced_lock_acquire(%s, make_interval(secs => %s), %s::interval, %s)",
                (name, ttl, wait, holder)).fetchone()[0])
        if token is not None:
            self.stats["granted"] += 1
            self.lease = (name, res, token, ttl)

    def act(self):
        name, res, token, ttl = self.lease
        c = self.conn
        r = self.rnd.random()
        if r < 0.30:
            self.increment(res, token, ttl)
        elif r < 0.42:
            self.op("insert", lambda: c.execute("INSERT INTO events (res, fence_token, note) VALUES (%s, %s, 'x')",
                                                (res, token)))
        elif r < 0.50:
            def delete():
                with c.transaction():
                    c.execute("SELECT fenced_lock_assert(%s, %s)", (name, token))
                    c.execute("DELETE FROM events WHERE id = (SELECT min(id) FROM events WHERE res = %s)", (res,))
            self.op("delete", delete)
        elif r < 0.60:
            ok = self.op("renew", lambda: c.execute("SELECT fenced_lock_renew(%s, %s, %s::interval)",
                                                    (name, token, self.rnd.choice([None, f"{ttl} seconds"]))
                                                    ).fetchone()[0])
            if ok is False:
                self.lease = None
        elif r < 0.66:
            self.op("assert", lambda: c.execute("SELECT fenced_lock_assert(%s, %s)", (name, token)))
        elif r < 0.70:
            if self.op("validate", lambda: c.execute("SELECT fenced_lock_validate(%s, %s)", (name, token)
                                                     ).fetchone()[0]) is False:
                self.lease = None
        elif r < 0.82:
            self.op("release", lambda: c.execute("SELECT fenced_lock_release(%s, %s)", (name, token)).fetchone()[0])
            self.lease = None
        else:
            # A pause, sometimes past the ttl: the next write must then be rejected.
            self.stats["pause"] += 1
            time.sleep(self.rnd.uniform(0, ttl * 1.6))

    def increment(self, res, token, ttl):
        """Read-modify-write of the counter, at a random isolation level,
        sometimes pausing between the read and the write."""
        c = self.conn
        level = self.rnd.choice(LEVELS)
        pause = self.rnd.random() < 0.2

        def rmw():
            with c.transaction():
                c.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
                value = c.execute("SELECT counter FROM stock WHERE res = %s", (res,)).fetchone()[0]
                if pause:
                    time.sleep(self.rnd.uniform(0, ttl * 1.6))
                c.execute("UPDATE stock SET counter = %s, version = version + 1, fence_token = %s WHERE res = %s",
                          (value + 1, token, res))
            return True

        if self.op("increment", rmw):
            self.stats["acked_increments:" + res] += 1


def operator(port, dbname, stats, deadline):
    rnd = random.Random(7)
    with connect(port, dbname, user=OPERATOR) as c:
        while time.monotonic() < deadline:
            time.sleep(rnd.uniform(0.3, 1.0))
            name = f"stress:{rnd.choice(RESOURCES)}"
            stats["op:force_release"] += 1
            if c.execute("SELECT fenced_lock_force_release(%s)", (name,)).fetchone()[0]:
                stats["forced"] += 1


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
    args = dict(resources=RESOURCES, expected=sorted(EXPECTED))
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
            elif m["event"] in ("granted", "released"):
                p.holding = m["event"] == "granted"

    try:
        for _ in range(KILLABLE):
            spawn()
        while time.monotonic() < deadline:
            time.sleep(rnd.uniform(0.3, 1.2))
            victim = procs.pop(rnd.randrange(len(procs)))
            drain(victim)
            stats["killed"] += 1
            stats["killed_holding"] += getattr(victim, "holding", False)
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
    for what in ("try_acquire", "acquire", "renew", "release", "assert", "validate", "increment", "insert",
                 "delete", "force_release"):
        assert stats["op:" + what] > 0, f"no {what} ran"
    assert stats["granted"] > 50 and stats["forced"] > 0
    assert stats["sqlstate:FL001"] > 0, "no stale write was ever attempted"
    assert stats["killed"] >= 10 and stats["killed_holding"] >= 3 and stats["killable:wrote"] > 0, \
        "too few client processes were killed while holding a session-bound lease"

    with connect(main_cluster, fresh_db) as db:
        lease_evs = lease_history.lease_events(db)
        write_evs = lease_history.write_events(db)
        assert all(e["commit_ts"] is not None for e in lease_evs + write_evs)
        problems = lease_history.check(lease_evs, write_evs)
        assert not problems, "\n".join(str(p) for p in problems[:20])
        # A same-session re-acquire returns the held token, unless that lease
        # ended in between by expiry or an operator; then the token is new and larger.
        for old, new in reacquired:
            ended = db.execute("SELECT ended_by FROM fenced_lock_history WHERE token = %s", (old,)).fetchone()
            assert new is not None and new > old and ended is not None \
                and ended[0] in ("expiry", "force_release"), \
                f"re-acquire returned {new}, not {old} (which ended by {ended and ended[0]})"
        print("stress: same-session re-acquires after an end:", len(reacquired))
        ends = dict(db.execute("SELECT ended_by, count(*) FROM fenced_lock_internal.lease_history "
                               "GROUP BY ended_by").fetchall())
        print("stress: leases by how they ended:", ends)
        assert ends.get("session_end", 0) >= 3, "no session-bound lease ended with its killed client"
        # a session-bound record is never left live without its session
        assert db.execute("SELECT count(*) FROM fenced_lock_leases WHERE session_bound AND live").fetchone()[0] == 0

        # No lost update: the counter went up by one at every committed write, in order.
        for res, counter, version in db.execute("SELECT res, counter, version FROM stock ORDER BY res").fetchall():
            steps = sorted((w["version"], w["counter"]) for w in write_evs
                           if w["tbl"] == "stock" and w["name"] == f"stress:{res}" and w["op"] == "UPDATE")
            assert counter == version == len(steps)
            assert steps == [(v, v) for v in range(1, version + 1)], f"{res}: lost update in its history"
            assert counter >= stats["acked_increments:" + res]
        assert sum(1 for w in write_evs if w["tbl"] == "stock") >= 20
