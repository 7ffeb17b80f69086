"""Server-side history of lease changes and guarded writes, and the checker
that reads it (docs/design.md, "Invariants" 1-4 and "Modes": the live leases
of a name fit its mode; tokens only grow; a write accepted under a lease
commits while that lease holds the name, before anything that replaces it).

The history is written by AFTER ROW triggers that the test installs as
superuser: one on fenced_lock_internal.granted_leases (one record per lease,
keyed by (name, token)), one on each guarded table. Rows of transactions that
roll back vanish with them, so the history is exactly what was committed.
Every row carries its transaction id, so with track_commit_timestamp = on
the checker can place each change on the server's clock.

The checker takes plain data, so that it can itself be tested on hand-made
histories (test_lease_history_checker.py). A lease event is a dict:
  id, op ('INSERT' a grant, 'UPDATE' a renew or an extend, 'DELETE' the end
  of the record), name, old_token, new_token, old_expires, new_expires,
  new_ttl (the ttl in the record: the one granted), acquired_at, commit_ts,
  mode ('exclusive', 'shared', 'permit'), permits (the semaphore's N; 1
  otherwise), session_bound, and for a DELETE how fenced_lock's own history
  says the lease ended (ended_by, ended_at); optionally `at`, the server's
  clock when the row was written, and `xid`, its transaction (a takeover
  removes the expired record in the grant's transaction).
A write event: id, tbl, op, name (the row's lock name), token, commit_ts,
accepts_shared (the guard's third argument is 'shared'), and for a counter
row version and counter.

A renew's decision time is new_expires - new_ttl: the record keeps the ttl
it was granted with, so every renew and re-acquire of a test must use that
same ttl (or NULL). `at` catches a test that does not.
"""

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime

INSTALL = """
CREATE SCHEMA fl_history;
CREATE TABLE fl_history.lease_events (
    id          bigserial PRIMARY KEY,
    xid         xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    at          timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    op          text NOT NULL,
    name        text NOT NULL,
    old_token   bigint,
    new_token   bigint,
    old_expires timestamptz,
    new_expires timestamptz,
    new_ttl     interval,
    acquired_at timestamptz,
    owner       text,
    session_bound boolean,
    mode        text,
    permits     integer
);
CREATE FUNCTION fl_history.record_lease() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE r fenced_lock_internal.granted_leases%ROWTYPE;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    INSERT INTO fl_history.lease_events (op, name, old_token, new_token, old_expires, new_expires, new_ttl,
                                         acquired_at, owner, session_bound, mode, permits)
    VALUES (TG_OP, r.name,
            CASE WHEN TG_OP <> 'INSERT' THEN OLD.token END, CASE WHEN TG_OP <> 'DELETE' THEN NEW.token END,
            CASE WHEN TG_OP <> 'INSERT' THEN OLD.expires_at END,
            CASE WHEN TG_OP <> 'DELETE' THEN NEW.expires_at END,
            r.ttl, r.acquired_at, r.owner::text, r.session_bound,
            CASE WHEN r.shared THEN 'shared' WHEN r.permits > 1 THEN 'permit' ELSE 'exclusive' END, r.permits);
    RETURN NULL;
END $$;
CREATE TRIGGER zz_history AFTER INSERT OR UPDATE OR DELETE ON fenced_lock_internal.granted_leases
    FOR EACH ROW EXECUTE FUNCTION fl_history.record_lease();

CREATE TABLE fl_history.write_events (
    id        bigserial PRIMARY KEY,
    xid       xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    tbl       text NOT NULL,
    op        text NOT NULL,
    name      text NOT NULL,
    token     bigint,
    accepts_shared boolean NOT NULL,
    version   bigint,
    counter   bigint
);
"""

# A write-history trigger for a guarded table whose lock name is `name_sql`
# (an SQL expression over the row `r`); `version`/`counter` columns optional.
WRITE_TRIGGER = """
CREATE FUNCTION fl_history.record_{tbl}() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE r {tbl_q}%ROWTYPE;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    INSERT INTO fl_history.write_events (tbl, op, name, token, accepts_shared, version, counter)
    VALUES ('{tbl}', TG_OP, {name_sql}, r.fence_token, {accepts_shared}, {version_sql}, {counter_sql});
    RETURN NULL;
END $$;
CREATE TRIGGER zz_history AFTER INSERT OR UPDATE OR DELETE ON {tbl_q}
    FOR EACH ROW EXECUTE FUNCTION fl_history.record_{tbl}();
"""


def install(conn):
    conn.execute(INSTALL)


def install_write_history(conn, tbl, name_sql, version_sql="NULL", counter_sql="NULL", accepts_shared=False):
    """`accepts_shared`: the table's guard was given 'shared' (the checker
    then lets shared leases' writes stand)."""
    conn.execute(WRITE_TRIGGER.format(tbl=tbl, tbl_q=f"public.{tbl}", name_sql=name_sql,
                                      accepts_shared="true" if accepts_shared else "false",
                                      version_sql=version_sql, counter_sql=counter_sql))


def lease_events(conn):
    """Committed lease changes with their commit timestamps, in id order, and
    how fenced_lock's own history says each removed record's lease ended."""
    cols = ["id", "op", "name", "old_token", "new_token", "old_expires", "new_expires", "new_ttl",
            "acquired_at", "commit_ts", "at", "session_bound", "mode", "permits", "ended_by", "ended_at", "xid"]
    rows = conn.execute(
        "SELECT e.id, e.op, e.name, e.old_token, e.new_token, e.old_expires, e.new_expires, e.new_ttl, "
        "       e.acquired_at, pg_xact_commit_timestamp(e.xid::text::xid), e.at, e.session_bound, e.mode, "
        "       e.permits, h.ended_by, h.ended_at, e.xid::text "
        "FROM fl_history.lease_events e "
        "LEFT JOIN fenced_lock_internal.lease_history h ON e.op = 'DELETE' AND h.token = e.old_token "
        "ORDER BY e.id").fetchall()
    return [dict(zip(cols, r)) for r in rows]


def write_events(conn):
    cols = ["id", "tbl", "op", "name", "token", "accepts_shared", "version", "counter", "commit_ts", "xid"]
    rows = conn.execute(
        "SELECT id, tbl, op, name, token, accepts_shared, version, counter, "
        "       pg_xact_commit_timestamp(xid::text::xid), xid::text "
        "FROM fl_history.write_events ORDER BY id").fetchall()
    return [dict(zip(cols, r)) for r in rows]


def grants(events):
    """Every grant: an INSERT (or an UPDATE that put a new token in a record)."""
    return [e for e in events if e["op"] == "INSERT" or (e["op"] == "UPDATE" and e["new_token"] != e["old_token"])]


# -- what the checker reports --------------------------------------------------

EXCLUSIVE_OVERLAP = "exclusive-overlap"  # an exclusive lease live beside another lease of its name
MODES_MIXED = "modes-mixed"              # shared leases and permits of one name live together
COUNT_CHANGED = "count-changed"          # permits of two counts of one name live together
PERMITS_EXCEEDED = "permits-exceeded"    # more than N permits of a semaphore of N live at once
WRITE_OUTSIDE_LEASE = "write-outside-lease"  # an accepted write not under a live lease of its row's name
WRITE_MODE_REFUSED = "write-mode-refused"    # a shared lease's write accepted by a guard without 'shared'
TOKEN_REPEATED = "token-repeated"
TOKEN_BACKWARDS = "token-backwards"
RENEW_EXPIRED = "renew-expired"          # an ended lease renewed (or extended)
ENDED_LIVE = "ended-while-live"          # a record removed as expired (or session-ended) that was not
LOST_UPDATE = "lost-update"
HISTORY = "history"                      # the history contradicts itself: the checker's premises fail


@dataclass(frozen=True)
class Violation:
    kind: str
    name: str
    tokens: tuple
    at: object  # the server's time of the violation (datetime), when there is one
    detail: str

    def __str__(self):
        return f"{self.kind} on {self.name!r} at {_t(self.at)}: {self.detail}"


def _t(ts):
    return ts.strftime("%H:%M:%S.%f") if isinstance(ts, datetime) else str(ts)


@dataclass
class Lease:
    """One lease as its history tells it, on the server's clock."""
    name: str
    token: int
    mode: str
    permits: int
    session_bound: bool
    decided: object   # acquired_at: the clock when the grant was decided
    granted: object   # the grant's commit: the lease is live from here
    expires: object   # the last expiry it was given (renews move it)
    ttl: object
    ended: object = None  # the commit that removed its record
    ended_by: str = None
    ended_at: object = None
    renews: list = field(default_factory=list)

    @property
    def end(self):
        """When it stopped being live: its expiry, or the commit that ended it
        (a release counts as held until it commits), or for a session end the
        moment fenced_lock recorded it, if earlier. A removal said to be an
        expiry ends nothing before the expiry: if it came sooner, the lease
        still counts as live (ENDED_LIVE says why)."""
        ends = [self.expires]
        if self.ended is not None and self.ended_by != "expiry" and not self._false_session_end:
            ends.append(self.ended)
            if self.ended_by == "session_end" and self.ended_at is not None:
                ends.append(self.ended_at)
        return min(ends)

    @property
    def _false_session_end(self):
        return self.ended_by == "session_end" and not self.session_bound

    def describe(self):
        n = f" of {self.permits}" if self.mode == "permit" else ""
        return f"{self.mode}{n} lease {self.token} (live {_t(self.granted)}..{_t(self.end)})"


def _mode(e):
    return e.get("mode") or "exclusive", e.get("permits") or 1


def build_leases(lease_evs):
    """The leases the history shows, by token, and what contradicts it while
    reading it: a token granted twice, a renew of an ended lease, events that
    do not follow each other."""
    leases, out = {}, []
    gone = {}  # token -> its Lease, once its record was removed
    decided_in = {}  # xid -> the earliest decision of a grant in that transaction
    for e in grants(lease_evs):
        if e.get("xid") is not None:
            decided_in[e["xid"]] = min(e["acquired_at"], decided_in.get(e["xid"], e["acquired_at"]))
    for e in sorted(lease_evs, key=lambda e: e["id"]):
        name, op = e["name"], e["op"]
        at = e.get("at")
        if op == "INSERT" or (op == "UPDATE" and e["new_token"] != e["old_token"]):
            if op == "UPDATE":
                _end(leases, gone, out, e, e["old_token"], decided_in)
            token = e["new_token"]
            if token in leases or token in gone:
                first = leases.get(token) or gone[token]
                out.append(Violation(TOKEN_REPEATED, name, (token,), e["commit_ts"],
                                     f"token {token} granted again (event {e['id']}); first granted on "
                                     f"{first.name!r} at {_t(first.granted)}"))
                continue
            mode, permits = _mode(e)
            decided = e["acquired_at"]
            if e["new_ttl"] is not None and e["new_expires"] - e["new_ttl"] != decided:
                out.append(Violation(HISTORY, name, (token,), decided,
                                     f"grant {token}: expires_at - ttl is not acquired_at"))
            if at is not None and decided > at:
                out.append(Violation(HISTORY, name, (token,), decided, f"grant {token} decided after it was written"))
            leases[token] = Lease(name, token, mode, permits, bool(e.get("session_bound")), decided,
                                  e["commit_ts"], e["new_expires"], e["new_ttl"])
        elif op == "UPDATE":
            token = e["new_token"]
            lease = leases.get(token)
            decided = e["new_expires"] - e["new_ttl"]
            if lease is None:
                if token in gone:
                    g = gone[token]
                    out.append(Violation(RENEW_EXPIRED, name, (token,), decided,
                                         f"lease {token} renewed at {_t(decided)} after its record was removed "
                                         f"(ended by {g.ended_by} at {_t(g.end)})"))
                else:
                    out.append(Violation(HISTORY, name, (token,), decided,
                                         f"event {e['id']} renews {token}, which was never granted"))
                continue
            if e["old_expires"] != lease.expires:
                out.append(Violation(HISTORY, name, (token,), decided,
                                     f"event {e['id']} renews {token} from {_t(e['old_expires'])}, but it was "
                                     f"to expire at {_t(lease.expires)}"))
            # The two ways a renew with another ttl than the granted one shows.
            if (at is not None and decided > at) or decided < (lease.renews or [lease.decided])[-1]:
                out.append(Violation(HISTORY, name, (token,), decided,
                                     f"renew of {token} (event {e['id']}) decided at {_t(decided)}, after it was "
                                     f"written or before its last decision: renewed with another ttl than its "
                                     f"own?"))
            if not e["old_expires"] > decided:
                out.append(Violation(RENEW_EXPIRED, name, (token,), decided,
                                     f"lease {token} expired at {_t(e['old_expires'])} and was renewed at "
                                     f"{_t(decided)} (to {_t(e['new_expires'])})"))
            if e["commit_ts"] < lease.granted:
                out.append(Violation(HISTORY, name, (token,), e["commit_ts"],
                                     f"renew of {token} committed before its grant"))
            lease.renews.append(decided)
            lease.expires = e["new_expires"]
        elif op == "DELETE":
            _end(leases, gone, out, e, e["old_token"], decided_in)
    return {**gone, **leases}, out


def _end(leases, gone, out, e, token, decided_in):
    lease = leases.pop(token, None)
    if lease is None:
        out.append(Violation(HISTORY, e["name"], (token,), e["commit_ts"],
                             f"event {e['id']} removes {token}, which has no record"))
        return
    if e["old_expires"] is not None and e["old_expires"] != lease.expires:
        out.append(Violation(HISTORY, e["name"], (token,), e["commit_ts"],
                             f"event {e['id']} removes {token} expiring at {_t(e['old_expires'])}, but it was "
                             f"to expire at {_t(lease.expires)}"))
    lease.ended, lease.ended_by, lease.ended_at = e["commit_ts"], e.get("ended_by"), e.get("ended_at")
    gone[token] = lease
    if lease.ended_by is None:
        out.append(Violation(HISTORY, lease.name, (token,), e["commit_ts"],
                             f"event {e['id']} removes {token}, and fenced_lock's history has no row for it"))
    elif lease.ended_by == "expiry":
        # Removed by a takeover (decided in this transaction) or the reaper.
        decided = decided_in.get(e.get("xid"), e["commit_ts"])
        if not lease.expires <= decided:
            out.append(Violation(ENDED_LIVE, lease.name, (token,), decided,
                                 f"{lease.describe()} removed as expired by a transaction that decided at "
                                 f"{_t(decided)} (event {e['id']})"))
    elif lease._false_session_end:
        out.append(Violation(ENDED_LIVE, lease.name, (token,), e["commit_ts"],
                             f"{lease.describe()}, not session-bound, removed as ended with its session"))


def _by_name(leases):
    by = defaultdict(list)
    for lease in leases.values():
        by[lease.name].append(lease)
    return by


def _sweep(leases_of_name):
    """(lease, live leases of the name when it became live), in the order
    they became live; a lease that ends as another starts does not meet it."""
    points = []
    for lease in leases_of_name:
        if lease.end > lease.granted:
            points.append((lease.granted, 1, lease.token, lease))
            points.append((lease.end, 0, lease.token, lease))
    points.sort(key=lambda p: p[:3])
    live = {}
    for _, starts, token, lease in points:
        if not starts:
            live.pop(token, None)
            continue
        yield lease, list(live.values())
        live[token] = lease


def check_modes(leases):
    """The live leases of a name fit its mode: an exclusive lease alone;
    shared leases only with shared ones; at most N permits of one N."""
    out = []
    for name, ls in sorted(_by_name(leases).items()):
        for lease, live in _sweep(ls):
            for other in live:
                if "exclusive" in (lease.mode, other.mode):
                    kind = EXCLUSIVE_OVERLAP
                elif lease.mode != other.mode:
                    kind = MODES_MIXED
                elif lease.permits != other.permits:
                    kind = COUNT_CHANGED
                else:
                    continue
                out.append(Violation(kind, name, (other.token, lease.token), lease.granted,
                                     f"{lease.describe()} granted while {other.describe()}"))
            if lease.mode == "permit":
                permits = [o for o in live if o.mode == "permit"] + [lease]
                if len(permits) > lease.permits:
                    out.append(Violation(PERMITS_EXCEEDED, name, tuple(p.token for p in permits), lease.granted,
                                         f"{len(permits)} permits of a semaphore of {lease.permits} live at once: "
                                         + ", ".join(p.describe() for p in permits)))
    return out


def check_tokens(leases):
    """Per name, tokens grow in the order grants were decided (the name lock
    orders them, across modes); across names, a grant decided after another
    grant committed has a larger token."""
    out = []
    for name, ls in sorted(_by_name(leases).items()):
        ls = sorted(ls, key=lambda g: (g.decided, g.token))
        for a, b in zip(ls, ls[1:]):
            if b.token < a.token:
                out.append(Violation(TOKEN_BACKWARDS, name, (a.token, b.token), b.decided,
                                     f"{b.mode} grant {b.token} decided at {_t(b.decided)}, after {a.mode} grant "
                                     f"{a.token} at {_t(a.decided)}"))
    by_commit = sorted(leases.values(), key=lambda g: g.granted)
    top = {}  # name -> its grant with the largest token committed so far
    i = 0
    for g in sorted(leases.values(), key=lambda g: g.decided):
        while i < len(by_commit) and by_commit[i].granted < g.decided:
            c = by_commit[i]
            if c.name not in top or c.token > top[c.name].token:
                top[c.name] = c
            i += 1
        above = [c for n, c in top.items() if n != g.name and c.token > g.token]
        if above:
            c = max(above, key=lambda c: c.token)
            out.append(Violation(TOKEN_BACKWARDS, g.name, (c.token, g.token), g.decided,
                                 f"grant {g.token} decided at {_t(g.decided)}, after grant {c.token} of "
                                 f"{c.name!r} committed at {_t(c.granted)}"))
    return out


def _displaces(lease, other, leases_of_name, at):
    """Would `other`, granted at `at`, have needed `lease` gone?"""
    if "exclusive" in (lease.mode, other.mode) or lease.mode != other.mode or lease.permits != other.permits:
        return True
    if lease.mode != "permit":
        return False
    live = [o for o in leases_of_name if o is not lease and o.granted <= at < o.end and o.mode == "permit"]
    return len(live) + 1 > lease.permits


def check_writes(leases, write_evs):
    """Every accepted INSERT/UPDATE carries the token of a lease of its row's
    name, of a mode its guard accepts, and commits while that lease holds the
    name: after its grant, no later than the commit that removed its record
    (which waits for the lease's guarded writes), and, if the lease expired
    before the write committed, before any grant that took its place."""
    out = []
    by_name = _by_name(leases)
    for w in write_evs:
        if w["op"] == "DELETE":
            continue  # fenced by the assert of its transaction, which the history does not see
        token, name, at = w["token"], w["name"], w["commit_ts"]
        where = f"{w['op']} {w['id']} of {w['tbl']} with token {token}, committed at {_t(at)},"
        lease = leases.get(token)
        if lease is None:
            out.append(Violation(WRITE_OUTSIDE_LEASE, name, (token,), at, f"{where} under no lease ever granted"))
            continue
        if lease.name != name:
            out.append(Violation(WRITE_OUTSIDE_LEASE, name, (token,), at,
                                 f"{where} under a lease of {lease.name!r}"))
            continue
        if lease.mode == "shared" and not w.get("accepts_shared", False):
            out.append(Violation(WRITE_MODE_REFUSED, name, (token,), at,
                                 f"{where} under {lease.describe()}, accepted by a guard without 'shared'"))
        if at < lease.granted:
            out.append(Violation(WRITE_OUTSIDE_LEASE, name, (token,), at,
                                 f"{where} before its {lease.describe()} was granted"))
        elif lease.ended is not None and at > lease.ended:
            out.append(Violation(WRITE_OUTSIDE_LEASE, name, (token,), at,
                                 f"{where} after its {lease.describe()} ended by {lease.ended_by} "
                                 f"(committed at {_t(lease.ended)})"))
        elif at > lease.end:
            # Expired while the write was in flight: fine until something replaced it.
            ls = by_name[name]
            for other in sorted(ls, key=lambda o: o.granted):
                if other is not lease and lease.end <= other.granted <= at and _displaces(lease, other, ls,
                                                                                            other.granted):
                    out.append(Violation(WRITE_OUTSIDE_LEASE, name, (token, other.token), at,
                                         f"{where} after its {lease.describe()} expired and "
                                         f"{other.describe()} was granted"))
                    break
    return out


def check_counters(write_evs, finals):
    """No lost update: `finals` maps (tbl, name) to a counter row's final
    (counter, version); every committed UPDATE of it added one to both."""
    out = []
    for (tbl, name), (counter, version) in sorted(finals.items()):
        ups = sorted((w for w in write_evs if w["tbl"] == tbl and w["name"] == name and w["op"] == "UPDATE"),
                     key=lambda w: (w["version"], w["id"]))
        bad = next((w for i, w in enumerate(ups, 1) if (w["version"], w["counter"]) != (i, i)), None)
        if bad is not None:
            out.append(Violation(LOST_UPDATE, name, (bad["token"],), bad["commit_ts"],
                                 f"{tbl}: update {bad['id']} with token {bad['token']} made version "
                                 f"{bad['version']} with counter {bad['counter']} (its {ups.index(bad) + 1}th "
                                 f"committed update)"))
        elif not counter == version == len(ups):
            out.append(Violation(LOST_UPDATE, name, (), None,
                                 f"{tbl}: counter {counter}, version {version}, after {len(ups)} committed updates"))
    return out


def check(lease_evs, write_evs=(), counters=None):
    """Every violation the history shows (an empty list: none)."""
    leases, out = build_leases(lease_evs)
    out += check_modes(leases) + check_tokens(leases) + check_writes(leases, write_evs)
    if counters:
        out += check_counters(write_evs, counters)
    return out


def summary(lease_evs, write_evs=()):
    """What the history holds, per mode: grants, renews, how leases ended,
    accepted writes, the most leases of one name live at once, and the
    permits granted per semaphore and count."""
    leases, _ = build_leases(lease_evs)
    s = {"grants": Counter(), "renews": Counter(), "ended_by": Counter(), "writes": Counter(),
         "most_live": Counter(), "counts": Counter()}
    for lease in leases.values():
        s["grants"][lease.mode] += 1
        if lease.mode == "permit":
            s["counts"][f"{lease.name}:{lease.permits}"] += 1
        s["renews"][lease.mode] += len(lease.renews)
        s["ended_by"][f"{lease.mode}:{lease.ended_by or 'open'}"] += 1  # open: its record is still there
    for w in write_evs:
        lease = leases.get(w["token"])
        if w["op"] != "DELETE" and lease is not None:
            s["writes"][lease.mode] += 1
    for ls in _by_name(leases).values():
        for lease, live in _sweep(ls):
            n = 1 + sum(1 for o in live if o.mode == lease.mode)
            s["most_live"][lease.mode] = max(s["most_live"][lease.mode], n)
    return {k: dict(sorted(v.items())) for k, v in s.items()}


# -- the 0.2.0 interface, as other tests use it --------------------------------

def check_leases(events):
    """Problems of the lease history alone, as text (empty: none)."""
    leases, out = build_leases(events)
    return [str(v) for v in out + check_modes(leases) + check_tokens(leases)]
