"""The HA tests' client workload, the server-side lease history, and the
checks that compare what clients were told with what the surviving cluster has.

Clients: several threads, each with the multi-host connection string
(target_session_attrs=read-write), each owning a few lock names, looping
acquire -> (guarded write | renew | release). Each records only what was
ACKNOWLEDGED (its commit returned without error and without a "canceling wait
for synchronous replication" warning), plus every refusal (FL001, renew or
release returning false) and every operation cut off by a lost connection
(outcome unknown). On a connection error a client reconnects and carries on:
with the token it holds (its next write learns whether it survived), and a
grant whose reply was lost is retried with the same `holder`, which returns
the same token if the grant had committed.

Server side: an AFTER trigger on the extension's lease records records every
committed lease change (ideas from tests/faults/lease_history.py, trimmed).
It is ordinary replicated data, so after a failover it says exactly which
grants, renewals and releases the surviving timeline has.
"""

import bisect
import random
import threading
import time
from collections import defaultdict

import psycopg

from ha_cluster import HACluster, lease_table

EPOCH_SHIFT = 47  # token = epoch << 47 | counter, epoch >= timeline - 1 (README: token format)
TTL = "15 seconds"  # longer than a failover, so leases do not expire while clients reconnect
SLACK = 0.5  # s: client and server read the same clock; this covers call latency
CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction)

HISTORY_SQL = """
CREATE SCHEMA fl_history;
CREATE TABLE fl_history.lease_events (
    id bigserial PRIMARY KEY,
    xid xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    op text NOT NULL, name text NOT NULL,
    old_token bigint, new_token bigint, old_expires timestamptz, new_expires timestamptz,
    new_ttl interval, acquired_at timestamptz);
CREATE FUNCTION fl_history.record_lease() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $fn$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO fl_history.lease_events (op, name, old_token, old_expires)
        VALUES (TG_OP, OLD.name, OLD.token, OLD.expires_at);
    ELSE
        INSERT INTO fl_history.lease_events (op, name, old_token, new_token, old_expires, new_expires,
                                             new_ttl, acquired_at)
        VALUES (TG_OP, NEW.name, CASE WHEN TG_OP = 'UPDATE' THEN OLD.token END, NEW.token,
                CASE WHEN TG_OP = 'UPDATE' THEN OLD.expires_at END, NEW.expires_at, NEW.ttl, NEW.acquired_at);
    END IF;
    RETURN NULL;
END $fn$;
CREATE TRIGGER zz_history AFTER INSERT OR UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION fl_history.record_lease();
"""


def install_history(conn):
    conn.execute(HISTORY_SQL.replace("{table}", lease_table(conn)))


# -- clients ------------------------------------------------------------------

class Records:
    """What the clients were told. Times are time.time() (the servers' clock too)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.grants = []    # worker, name, holder, token, first_sent, acked, expires, port
        self.renews = []    # name, token, expires, acked, port
        self.releases = []  # name, token, expires (last acknowledged), sent, acked, port
        self.writes = []    # name, token, writer, seq, acked, port
        self.refused = []   # name, token, op, at, port: FL001, or renew/release returning false
        self.unknown = []   # name, token, op, at: cut off by a lost connection
        self.sync_cancels = 0  # commits acknowledged with "canceling wait for synchronous replication"
        self.busy = []      # worker, name, at: the name was held by a lease this client does not have
        self.reconnects = 0
        self.failures = []

    def add(self, kind, **rec):
        with self.lock:
            getattr(self, kind).append(rec)


def worker(w, rec, stop, run, names_per_worker=3):
    """Client `w`. Even workers wait in fenced_lock_acquire (1 s), odd ones use try_acquire."""
    rnd = random.Random(w * 7919 + int(time.time()))
    names = [f"ha:{run}:{w}:{k}" for k in range(names_per_worker)]
    writer = f"{run}-w{w}"
    held = {}      # name -> [token, expires]
    pending = {}   # name -> (holder, first_sent): a grant attempt not yet answered
    attempts = seq = 0
    conn, warned = None, []
    while not stop.is_set():
        name, op, token, port = None, None, None, None
        try:
            if conn is None:
                conn = HACluster.connect(statement_timeout_ms=5000)
                warned = []
                # PostgreSQL reports a commit whose synchronous-replication wait was
                # cancelled (statement_timeout, cancel) as a SUCCESS with this warning:
                # it is committed locally but maybe not on the standby, so a client
                # must not count it as acknowledged.
                conn.add_notice_handler(lambda d, warned=warned: warned.append(d.message_primary or ""))
            port = conn.info.port
            warned.clear()
            name = rnd.choice(names)
            if name not in held:
                op = "grant"
                if name not in pending:
                    attempts += 1
                    pending[name] = (f"{writer}-{attempts}", time.time())
                holder, first_sent = pending[name]
                with conn.transaction():
                    if w % 2:
                        token = conn.execute("SELECT fenced_lock_try_acquire(%s, %s, %s)",
                                             (name, TTL, holder)).fetchone()[0]
                    else:
                        token = conn.execute("SELECT fenced_lock_acquire(%s, %s, '1 second', %s)",
                                             (name, TTL, holder)).fetchone()[0]
                    exp = conn.execute("SELECT expires_at FROM fenced_lock_leases WHERE name = %s",
                                       (name,)).fetchone()[0]
                if _sync_cancelled(warned, rec):
                    continue  # keep `pending`: the retry with the same holder settles it
                del pending[name]
                if token is None:
                    rec.add("busy", worker=w, name=name, at=time.time())
                    time.sleep(0.05)  # held by a lease this client no longer has (e.g. a lost release)
                    continue
                held[name] = [token, exp.timestamp()]
                rec.add("grants", worker=w, name=name, holder=holder, token=token, first_sent=first_sent,
                        acked=time.time(), expires=exp.timestamp(), port=port)
                continue
            token, expires = held[name]
            r = rnd.random()
            if r < 0.5:
                op, seq = "write", seq + 1
                with conn.transaction():  # a guarded INSERT and a guarded UPDATE, one transaction
                    conn.execute("INSERT INTO ha_ledger (res, writer, seq, fence_token) VALUES (%s, %s, %s, %s)",
                                 (name, writer, seq, token))
                    conn.execute("INSERT INTO ha_state (res, counter, fence_token) VALUES (%s, 1, %s) "
                                 "ON CONFLICT (res) DO UPDATE SET counter = ha_state.counter + 1, "
                                 "fence_token = EXCLUDED.fence_token", (name, token))
                if not _sync_cancelled(warned, rec):
                    rec.add("writes", name=name, token=token, writer=writer, seq=seq, acked=time.time(), port=port)
            elif r < 0.75:
                op = "renew"
                del held[name]  # an unanswered renew leaves the expiry unknown: stop using the token
                with conn.transaction():
                    ok = conn.execute("SELECT fenced_lock_renew(%s, %s, %s)", (name, token, TTL)).fetchone()[0]
                    exp = conn.execute("SELECT expires_at FROM fenced_lock_leases WHERE name = %s",
                                       (name,)).fetchone()
                if _sync_cancelled(warned, rec):
                    continue
                if ok:
                    held[name] = [token, exp[0].timestamp()]
                    rec.add("renews", name=name, token=token, expires=exp[0].timestamp(), acked=time.time(), port=port)
                else:
                    rec.add("refused", name=name, token=token, op=op, at=time.time(), port=port)
            else:
                op, sent = "release", time.time()
                del held[name]  # whatever the outcome, this client stops using the token
                ok = conn.execute("SELECT fenced_lock_release(%s, %s)", (name, token)).fetchone()[0]
                if _sync_cancelled(warned, rec):
                    rec.add("unknown", name=name, token=token, op=op, at=time.time())
                elif ok:
                    rec.add("releases", name=name, token=token, expires=expires, sent=sent, acked=time.time(), port=port)
                else:
                    rec.add("refused", name=name, token=token, op=op, at=time.time(), port=port)
        except psycopg.Error as e:
            if e.sqlstate == "FL001":  # the lease is gone: drop the token, re-acquire later
                held.pop(name, None)
                rec.add("refused", name=name, token=token, op=op, at=time.time(), port=port)
            elif e.sqlstate == "55P03":  # fenced_lock_acquire waited its 1 s
                pending.pop(name, None)
                rec.add("busy", worker=w, name=name, at=time.time())
            elif isinstance(e, CONNECTION_ERRORS) or (conn is not None and conn.broken):
                # Server gone, shutting down, or no longer the primary: the
                # outcome of `op` is unknown. Reconnect (libpq finds the new
                # primary) and carry on.
                if op in ("write", "renew", "release"):
                    rec.add("unknown", name=name, token=token, op=op, at=time.time())
                rec.reconnects += 1
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.1)
            else:
                rec.failures.append(f"w{w} {op} {name}/{token}: {e.sqlstate} {e!r}")
                time.sleep(0.1)
        except Exception as e:  # noqa: BLE001 - reported by the test
            rec.failures.append(f"w{w} {op} {name}/{token}: {e!r}")
            time.sleep(0.1)
    if conn is not None:
        conn.close()


def prober(rec, stop, run):
    """Measures availability: grants of fresh names (1 s leases), every 50 ms,
    through the same multi-host string. Unlike the workers' own names, a fresh
    name is never held by a lease that came back in a failover."""
    conn, i = None, 0
    while not stop.is_set():
        i += 1
        try:
            if conn is None:
                conn = HACluster.connect(statement_timeout_ms=5000)
                warned = []
                conn.add_notice_handler(lambda d, warned=warned: warned.append(d.message_primary or ""))
            warned.clear()
            name, sent, port = f"probe:{run}:{i}", time.time(), conn.info.port
            token = conn.execute("SELECT fenced_lock_try_acquire(%s, '1 second', %s)", (name, name)).fetchone()[0]
            if token is not None and not _sync_cancelled(warned, rec):
                rec.add("grants", worker="probe", name=name, holder=name, token=token, first_sent=sent,
                        acked=time.time(), expires=None, port=port)
            time.sleep(0.05)
        except psycopg.Error as e:
            if not (isinstance(e, CONNECTION_ERRORS) or (conn is not None and conn.broken)):
                rec.failures.append(f"probe {i}: {e.sqlstate} {e!r}")
            if conn is not None:
                conn.close()
            conn = None
            time.sleep(0.05)
    if conn is not None:
        conn.close()


def _sync_cancelled(warned, rec):
    if any("synchronous replication" in m for m in warned):
        with rec.lock:
            rec.sync_cancels += 1
        return True
    return False


class Workload:
    """`n` worker threads and a prober; `stop()` ends and joins them (bounded)."""

    runs = 0

    def __init__(self, n=4):
        Workload.runs += 1  # lock names and ledger writers are unique per run
        self.rec = Records()
        self._stop = threading.Event()
        self.n = n
        self.threads = [threading.Thread(target=worker, args=(w, self.rec, self._stop, Workload.runs), daemon=True)
                        for w in range(n)]
        self.threads.append(threading.Thread(target=prober, args=(self.rec, self._stop, Workload.runs), daemon=True))

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self._stop.set()
        for t in self.threads:
            t.join(30)
        return [t.name for t in self.threads if t.is_alive()]


# -- server state ---------------------------------------------------------------

class History:
    """The surviving timeline's lease history and guarded rows."""

    def __init__(self, conn):
        cols = ["id", "op", "name", "old_token", "new_token", "old_expires", "new_expires", "new_ttl",
                "acquired_at", "commit_ts"]
        self.events = [dict(zip(cols, r)) for r in conn.execute(
            "SELECT id, op, name, old_token, new_token, extract(epoch FROM old_expires)::float8, "
            "extract(epoch FROM new_expires)::float8, extract(epoch FROM new_ttl)::float8, "
            "extract(epoch FROM acquired_at)::float8, "
            "extract(epoch FROM pg_xact_commit_timestamp(xid::text::xid))::float8 "
            "FROM fl_history.lease_events ORDER BY id").fetchall()]
        self.grants = [e for e in self.events if e["op"] == "INSERT" or
                       (e["op"] == "UPDATE" and e["new_token"] != e["old_token"])]
        self.grant_of = {g["new_token"]: g for g in self.grants}
        self.expiries = defaultdict(set)  # token -> every expires_at it had
        self.end = {}  # token -> when its lease ended on this timeline (release or last expiry)
        for e in self.events:
            if e["op"] != "DELETE":
                self.expiries[e["new_token"]].add(e["new_expires"])
                self.end[e["new_token"]] = e["new_expires"]
            else:
                self.end[e["old_token"]] = min(self.end.get(e["old_token"], e["commit_ts"]), e["commit_ts"])
        self.deleted = {e["old_token"] for e in self.events if e["op"] == "DELETE"}
        self.ledger = conn.execute(
            "SELECT writer, seq, res, fence_token, "
            "extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8 FROM ha_ledger").fetchall()


def check_history(h):
    """On the surviving timeline: tokens unique; per name, grants in commit order
    have growing tokens and take over only an expired (or released) lease; every
    guarded row carries a lease of its name, committed while that lease was live."""
    problems = []
    tokens = [g["new_token"] for g in h.grants]
    if len(tokens) != len(set(tokens)):
        problems.append("a token was granted twice on the surviving timeline")
    last = {}
    for g in sorted(h.grants, key=lambda g: g["commit_ts"]):
        if g["new_token"] <= last.get(g["name"], 0):
            problems.append(f"{g['name']}: token {g['new_token']} granted after {last[g['name']]}")
        last[g["name"]] = g["new_token"]
        if g["op"] == "UPDATE" and g["old_expires"] > g["acquired_at"]:
            problems.append(f"{g['name']}: {g['new_token']} taken over while {g['old_token']} was live")
    by_name = defaultdict(list)
    for g in h.grants:
        by_name[g["name"]].append(g)
    for gs in by_name.values():
        gs.sort(key=lambda g: g["commit_ts"])
    for writer, seq, res, token, ts in h.ledger:
        gs = by_name.get(res, [])
        i = next((i for i, g in enumerate(gs) if g["new_token"] == token), None)
        if i is None:
            problems.append(f"row {writer}/{seq} on {res} carries token {token}, not a surviving grant of {res}")
        elif not (gs[i]["commit_ts"] <= ts < h.end[token] + SLACK and
                  (i + 1 == len(gs) or ts < gs[i + 1]["commit_ts"])):
            problems.append(f"row {writer}/{seq} with token {token} committed outside its lease")
    return problems


def check_clients(rec, h, old_port=None, kill_at=None):
    """Compare what clients were told with the surviving history. Returns
    (problems, figures). Nothing here depends on the replication mode: the
    callers decide which losses are allowed."""
    problems = []
    # 1. A token is acknowledged to one grant only (one name, one holder).
    owner = {}
    for g in rec.grants:
        if owner.setdefault(g["token"], (g["name"], g["holder"])) != (g["name"], g["holder"]):
            problems.append(f"token {g['token']} acknowledged to {owner[g['token']]} and {(g['name'], g['holder'])}")
    # 2. Tokens never go backwards, in real time: a grant sent after another
    #    was acknowledged gets a larger token (across failovers too).
    acked = sorted(rec.grants, key=lambda g: g["acked"])
    times = [g["acked"] for g in acked]
    prefix_max, m = [], 0
    for g in acked:
        m = max(m, g["token"])
        prefix_max.append(m)
    for g in rec.grants:
        i = bisect.bisect_left(times, g["first_sent"])
        if i and prefix_max[i - 1] >= g["token"]:
            problems.append(f"token {g['token']} ({g['name']}) sent after {prefix_max[i - 1]} was acknowledged")
    # 3. Acknowledged operations the surviving timeline does not have.
    lost_grants = [g for g in rec.grants if g["token"] not in h.grant_of]
    lost_tokens = {g["token"] for g in lost_grants}
    lost_renews = [r for r in rec.renews if r["token"] not in lost_tokens and r["expires"] not in h.expiries[r["token"]]]
    survived = {(w, s) for w, s, *_ in h.ledger}
    lost_writes = [w for w in rec.writes if (w["writer"], w["seq"]) not in survived]
    lost_releases = [r for r in rec.releases if r["token"] not in lost_tokens and r["token"] not in h.deleted]
    # 4. A write stamped with a lost lease was only ever accepted by the old
    #    primary before it died (and is lost with it); anywhere else: FL001.
    for w in rec.writes:
        if w["token"] in lost_tokens and (w["port"] != old_port or (w["writer"], w["seq"]) in survived):
            problems.append(f"write {w['writer']}/{w['seq']} with lost token {w['token']} accepted on port {w['port']}")
    # 5. The release rule: a lost release brings its lease back only until the
    #    lease's own expires_at, with its own token (no renewal after the
    #    release, nobody else granted the name meanwhile: check_history).
    for r in lost_releases:
        if h.end.get(r["token"], 0) > r["expires"] + 1e-6:
            problems.append(f"released lease {r['name']}/{r['token']} came back past its expiry")
    # 6. Every refusal is of a lease that really was gone: lost in the failover
    #    (and refused by a node other than the old primary), or ended on the
    #    surviving timeline.
    for f in rec.refused:
        t = f["token"]
        if t in lost_tokens:
            ok = f["port"] != old_port or (kill_at is not None and f["at"] >= kill_at)
        else:
            ok = h.end.get(t, float("inf")) <= f["at"] + SLACK
        if not ok:
            problems.append(f"{f['op']} of live lease {f['name']}/{t} refused on port {f['port']} at {f['at']:.3f}")
    figures = dict(grants=len(rec.grants), renews=len(rec.renews), releases=len(rec.releases),
                   writes=len(rec.writes), fl001=sum(f["op"] == "write" for f in rec.refused),
                   refused_other=sum(f["op"] != "write" for f in rec.refused), unknown=len(rec.unknown),
                   reconnects=rec.reconnects,
                   lost_grants=len(lost_grants), lost_renews=len(lost_renews), lost_writes=len(lost_writes),
                   lost_releases=len(lost_releases), sync_cancels=rec.sync_cancels, busy=len(rec.busy))
    return problems, figures, lost_grants


def probe_lost_tokens(conn, lost_grants):
    """Every lost grant's token, tried now on the primary: a guarded write must
    fail with FL001 and a renew must return false. Returns the offenders."""
    offenders = []
    for i, g in enumerate(lost_grants):
        try:
            with conn.transaction():
                conn.execute("INSERT INTO ha_ledger (res, writer, seq, fence_token) VALUES (%s, 'probe', %s, %s)",
                             (g["name"], i, g["token"]))
            offenders.append((g["name"], g["token"], "write accepted"))
        except psycopg.Error as e:
            if e.sqlstate != "FL001":
                offenders.append((g["name"], g["token"], e.sqlstate))
        if conn.execute("SELECT fenced_lock_renew(%s, %s)", (g["name"], g["token"])).fetchone()[0]:
            offenders.append((g["name"], g["token"], "renewed"))
    return offenders
