"""Server-side history of lease changes and guarded writes, and the checkers
that read it (docs/design.md, "Invariants" 1-4: at most one live lease per
name, tokens only grow; a write accepted under lease T commits before the next
grant of the name; "Session-bound leases": a session-bound lease may be taken
over before its expires_at only once its session has ended).

The history is written by AFTER ROW triggers that the test installs as
superuser: one on fenced_lock_internal.granted_leases, one on each guarded table.
Rows of transactions that roll back vanish with them, so the history is
exactly what was committed. Every row carries its transaction id, so with
track_commit_timestamp = on the checker can put transactions in commit order.
"""

from collections import defaultdict

INSTALL = """
CREATE SCHEMA fl_history;
CREATE TABLE fl_history.lease_events (
    id          bigserial PRIMARY KEY,
    xid         xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    op          text NOT NULL,
    name        text NOT NULL,
    old_token   bigint,
    new_token   bigint,
    old_expires timestamptz,
    new_expires timestamptz,
    new_ttl     interval,
    acquired_at timestamptz,
    owner       text,
    old_session_bound boolean,
    new_session_bound boolean
);
CREATE FUNCTION fl_history.record_lease() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO fl_history.lease_events (op, name, new_token, new_expires, new_ttl, acquired_at, owner,
                                             new_session_bound)
        VALUES (TG_OP, NEW.name, NEW.token, NEW.expires_at, NEW.ttl, NEW.acquired_at, NEW.owner::text,
                NEW.session_bound);
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO fl_history.lease_events (op, name, old_token, new_token, old_expires, new_expires, new_ttl,
                                             acquired_at, owner, old_session_bound, new_session_bound)
        VALUES (TG_OP, NEW.name, OLD.token, NEW.token, OLD.expires_at, NEW.expires_at, NEW.ttl,
                NEW.acquired_at, NEW.owner::text, OLD.session_bound, NEW.session_bound);
    ELSE
        INSERT INTO fl_history.lease_events (op, name, old_token, old_expires, owner, old_session_bound)
        VALUES (TG_OP, OLD.name, OLD.token, OLD.expires_at, OLD.owner::text, OLD.session_bound);
    END IF;
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
    INSERT INTO fl_history.write_events (tbl, op, name, token, version, counter)
    VALUES ('{tbl}', TG_OP, {name_sql}, r.fence_token, {version_sql}, {counter_sql});
    RETURN NULL;
END $$;
CREATE TRIGGER zz_history AFTER INSERT OR UPDATE OR DELETE ON {tbl_q}
    FOR EACH ROW EXECUTE FUNCTION fl_history.record_{tbl}();
"""


def install(conn):
    conn.execute(INSTALL)


def install_write_history(conn, tbl, name_sql, version_sql="NULL", counter_sql="NULL"):
    conn.execute(WRITE_TRIGGER.format(tbl=tbl, tbl_q=f"public.{tbl}", name_sql=name_sql,
                                      version_sql=version_sql, counter_sql=counter_sql))


def lease_events(conn):
    """Committed lease changes with their commit timestamps, in id order, and
    how fenced_lock's own history says the replaced/removed lease ended."""
    cols = ["id", "op", "name", "old_token", "new_token", "old_expires", "new_expires", "new_ttl",
            "acquired_at", "commit_ts", "old_session_bound", "new_session_bound", "old_ended_by"]
    rows = conn.execute(
        "SELECT e.id, e.op, e.name, e.old_token, e.new_token, e.old_expires, e.new_expires, e.new_ttl, "
        "       e.acquired_at, pg_xact_commit_timestamp(e.xid::text::xid), e.old_session_bound, "
        "       e.new_session_bound, h.ended_by "
        "FROM fl_history.lease_events e "
        "LEFT JOIN fenced_lock_internal.lease_history h ON h.token = e.old_token AND e.old_token <> e.new_token "
        "ORDER BY e.id").fetchall()
    return [dict(zip(cols, r)) for r in rows]


def grants(events):
    """Every grant: an INSERT, or an UPDATE that put a new token in the record."""
    return [e for e in events if e["op"] == "INSERT" or (e["op"] == "UPDATE" and e["new_token"] != e["old_token"])]


def check_leases(events):
    """At most one live lease per name; tokens unique; per name, tokens grow in
    commit order; nothing revives an expired lease. Returns a list of problems."""
    problems = []
    by_name = defaultdict(list)
    for e in events:
        by_name[e["name"]].append(e)
    all_tokens = [g["new_token"] for g in grants(events)]
    if len(all_tokens) != len(set(all_tokens)):
        dup = sorted(t for t in set(all_tokens) if all_tokens.count(t) > 1)
        problems.append(f"tokens granted more than once: {dup[:10]}")

    for name, evs in by_name.items():
        # Transitions of one name are serialized by its FENCE lock, held to
        # commit: their id order must be their commit order.
        commits = [e["commit_ts"] for e in evs]
        if commits != sorted(commits):
            problems.append(f"{name}: lease changes committed out of order")
        current = None  # (token, expires_at) of the record as the history says
        last_token = 0
        for e in evs:
            if e["op"] == "INSERT":
                if current is not None:
                    problems.append(f"{name}: insert over an existing record {current} (event {e['id']})")
            else:
                if current is None or current[0] != e["old_token"] or current[1] != e["old_expires"]:
                    problems.append(f"{name}: event {e['id']} changed {e['old_token']} but the record was {current}")
            if e["op"] == "DELETE":
                current = None
                continue
            decided_at = e["new_expires"] - e["new_ttl"]  # the server's clock when it decided
            if e["op"] == "UPDATE" and e["new_token"] != e["old_token"]:
                # A takeover: the previous lease must have expired by then, or
                # (session-bound) its session must have ended.
                session_ended = e["old_session_bound"] and e["old_ended_by"] == "session_end"
                if not e["old_expires"] <= decided_at and not session_ended:
                    problems.append(f"{name}: token {e['new_token']} granted at {decided_at} while "
                                    f"{e['old_token']} was live until {e['old_expires']} "
                                    f"(session-bound: {e['old_session_bound']}, ended by {e['old_ended_by']})")
                if e["acquired_at"] != decided_at:
                    problems.append(f"{name}: grant {e['new_token']} acquired_at != its decision time")
            elif e["op"] == "UPDATE":
                # Renew or same-holder re-acquire: only of a lease still live.
                if not e["old_expires"] > decided_at:
                    problems.append(f"{name}: expired lease {e['old_token']} (until {e['old_expires']}) "
                                    f"extended at {decided_at}")
            if e["op"] == "INSERT" or e["new_token"] != e["old_token"]:
                if e["new_token"] <= last_token:
                    problems.append(f"{name}: token {e['new_token']} granted after {last_token}")
                last_token = e["new_token"]
            current = (e["new_token"], e["new_expires"])
    return problems


def write_events(conn):
    cols = ["id", "tbl", "op", "name", "token", "version", "counter", "commit_ts", "xid"]
    rows = conn.execute(
        "SELECT id, tbl, op, name, token, version, counter, pg_xact_commit_timestamp(xid::text::xid), xid::text "
        "FROM fl_history.write_events ORDER BY id").fetchall()
    return [dict(zip(cols, r)) for r in rows]


def check_writes(lease_evs, write_evs):
    """Every accepted write (INSERT/UPDATE) carries the token of a lease of its
    name, committed after that grant and before the name's next grant; so in
    commit order the tokens of a name's writes never go down."""
    problems = []
    by_name = defaultdict(list)
    for g in grants(lease_evs):
        by_name[g["name"]].append(g)
    for name in by_name:
        by_name[name].sort(key=lambda g: g["commit_ts"])
    for w in write_evs:
        if w["op"] == "DELETE":
            continue
        gs = by_name.get(w["name"], [])
        idx = next((i for i, g in enumerate(gs) if g["new_token"] == w["token"]), None)
        if idx is None:
            problems.append(f"write {w['id']} on {w['name']} with token {w['token']} that was never granted")
            continue
        if not gs[idx]["commit_ts"] <= w["commit_ts"]:
            problems.append(f"write {w['id']} with token {w['token']} committed before its grant")
        if idx + 1 < len(gs) and not w["commit_ts"] < gs[idx + 1]["commit_ts"]:
            problems.append(f"write {w['id']} on {w['name']} with token {w['token']} committed at {w['commit_ts']}, "
                            f"after token {gs[idx + 1]['new_token']} was granted at {gs[idx + 1]['commit_ts']}")
    writes_by_name = defaultdict(list)
    for w in write_evs:
        if w["op"] != "DELETE":
            writes_by_name[w["name"]].append(w)
    for name, ws in writes_by_name.items():
        ws.sort(key=lambda w: (w["commit_ts"], w["id"]))
        tokens = [w["token"] for w in ws]
        if any(b < a for a, b in zip(tokens, tokens[1:])):
            problems.append(f"{name}: accepted writes' tokens go down in commit order")
    return problems
