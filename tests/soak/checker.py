#!/usr/bin/env python3
"""The soak's independent checker. It imports nothing from the workload and
reads only:

- the lease history: `fenced_lock_history` as the superuser (ended leases
  from `fenced_lock_internal.lease_history`, the rest from their records);
- the workers' logs: JSON lines, one file per worker process, of what each
  was told (grants, renewals, writes, releases, refusals) and what it sent
  without hearing back;
- the final data: `inventory`, `sale_audit` (one row per committed sale,
  written in the sale's transaction) and `soak_meta` (items, initial stock);
- the nemesis log, only to count the faults and to know when the server was
  crashed (a release acknowledged before its flush may be undone by a crash).

What it proves, and from what:

1. No two exclusive leases of a name are live together, on the server's
   clock: a lease is live from `acquired_at` (the server's clock at the
   grant) to its end (`ended_at`, or `expires_at` if it has none); an
   exclusive lease's interval meets no other lease of its name; shared
   leases only meet shared ones.
2. No name has more live permits than its count: a sweep over the same
   intervals; a permit's interval meets only permits of the same count.
3. Every accepted guarded write was under a lease that was live at its
   commit: the sale's token is a lease of the row's name; the stamp taken
   before the guard (which bounds the guard's decision from below) lies in
   that lease's interval; the sale committed (commit timestamp) before the
   name's next lease was granted, so no other holder could write or be
   granted between the guard's check and the commit (invariant 4).
4. Tokens strictly grow in grant order and none repeats: per name, in
   `acquired_at` order; no token in two history rows; no token acknowledged
   to two grants (but to a session that re-acquires a name whose
   session-bound lease it holds: that returns the lease, extended); a grant sent after another was acknowledged (monotonic
   clocks, system-wide) has a larger token.
5. The final stock equals the initial stock minus the acknowledged sales,
   plus the sales whose outcome the worker never learned and that committed:
   each item's audit chain replaces exactly the stock before it (no lost
   update), the last one is the final stock, every acknowledged sale is in
   it with its token, every sale in it was sent by a worker, and no sale the
   database refused (FL001) is in it.

And: no acknowledged grant or renewal is missing from the history.

    checker.py --dsn DSN --logs DIR [--nemesis FILE]    (exit 1 on any violation)
"""

import argparse
import bisect
import glob
import heapq
import json
import os
import sys
from collections import Counter, defaultdict

US = 1_000_000
# What a worker may meet besides FL001 and 55P03 (which it handles): a
# statement timeout while a stopped holder keeps a name locked,
# serialization or deadlock retries, a node that is no longer primary, a
# server shutting down or crashing, and from 0.3.0 a wait for a lease of its
# own session (FL003). Anything else is reported: an error nobody expects
# is a defect even when no property broke.
EXPECTED_ERRORS = {"57014", "40001", "40P01", "25006", "57P01", "57P02", "57P03", "FL003", "55P03", "FL001"}


# -- inputs ---------------------------------------------------------------------

def load_logs(directory):
    """Every worker log line, per file, in file order; a torn last line (the
    process was killed while writing it) is skipped and counted."""
    logs, torn = {}, 0
    for path in sorted(glob.glob(os.path.join(directory, "*.jsonl"))):
        events = []
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                events.append(json.loads(line))
            except ValueError:
                if i >= len(lines) - 2:
                    torn += 1
                else:
                    raise ValueError(f"{path}:{i + 1}: not JSON: {line[:100]!r}")
        logs[os.path.basename(path)] = events
    return logs, torn


def load_nemesis(path):
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


def load_db(dsn):
    import psycopg

    us = lambda col: f"(extract(epoch FROM {col}) * 1000000)::bigint"
    with psycopg.connect(dsn, autocommit=True) as c:
        cols = {r[0] for r in c.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'fenced_lock_history'::regclass AND attnum > 0"
        ).fetchall()}
        mode = "mode" if "mode" in cols else "NULL::text"
        permits = "permits" if "permits" in cols else "NULL::int"
        history = [dict(zip(("name", "token", "holder", "session_bound", "acquired", "expires", "ended",
                             "ended_by", "mode", "permits"), r)) for r in c.execute(
            f"SELECT name, token, holder, session_bound, {us('acquired_at')}, {us('expires_at')}, "
            f"{us('ended_at')}, ended_by, {mode}, {permits} FROM fenced_lock_history").fetchall()]
        audit = [dict(zip(("id", "item", "sale", "token", "old", "new", "stamped", "commit"), r)) for r in c.execute(
            f"SELECT id, item_id, sale_id, token, old_stock, new_stock, {us('stamped_at')}, "
            f"{us('pg_xact_commit_timestamp(xid::text::xid)')} FROM sale_audit").fetchall()]
        final = dict(c.execute("SELECT item_id, stock FROM inventory").fetchall())
        # 0.3.0 on: counts taken under shared leases, uses of permits.
        shelf = pool = None
        if c.execute("SELECT to_regclass('shelf_reads') IS NOT NULL").fetchone()[0]:
            shelf = [dict(item=r[0], token=r[1]) for r in c.execute(
                "SELECT item_id, fence_token FROM shelf_reads").fetchall()]
            pool = [dict(pool=r[0], token=r[1]) for r in c.execute("SELECT pool, token FROM pool_use").fetchall()]
        items, initial = c.execute("SELECT items, initial_stock FROM soak_meta").fetchone()
    return dict(history=history, audit=audit, final=final, items=items, initial=initial, shelf=shelf, pool=pool)


# -- the checks -------------------------------------------------------------------

def _mode(lease):
    if lease.get("mode") in (None, "exclusive") and (lease.get("permits") or 1) == 1:
        return "exclusive"
    return lease["mode"] or "permit"


def _end(lease):
    return lease["ended"] if lease.get("ended") is not None else lease["expires"]


def check(history, logs, audit, final, initial, nemesis=(), items=None, shelf=None, pool=None):
    """Returns (violations, counts). Pure: every input is plain data."""
    v = []
    counts = Counter()

    # --- the history ------------------------------------------------------------
    by_token = {}
    for h in history:
        if h["token"] in by_token:
            v.append(f"token {h['token']} is in the history twice ({by_token[h['token']]['name']}, {h['name']})")
        by_token[h["token"]] = h
    by_name = defaultdict(list)
    for h in history:
        by_name[h["name"]].append(h)
    counts["leases in the history"] = len(history)
    next_lease = {}  # token -> the name's next lease in grant order
    for name, leases in by_name.items():
        leases.sort(key=lambda h: (h["acquired"], h["token"]))
        for a, b in zip(leases, leases[1:]):
            next_lease[a["token"]] = b
            if b["token"] <= a["token"]:
                v.append(f"{name}: token {b['token']} granted at {b['acquired']} after token {a['token']} "
                         f"(granted at {a['acquired']}): tokens must grow in grant order")
        # 1 and 2: a sweep over the live intervals.
        active = []  # heap of (end, token)
        for h in leases:
            if _end(h) < h["acquired"]:
                v.append(f"{name}: lease {h['token']} ends before it starts")
            while active and active[0][0] <= h["acquired"]:
                heapq.heappop(active)
            live = [by_token[t] for _, t in active]
            m = _mode(h)
            for o in live:
                om = _mode(o)
                if m == "exclusive" or om == "exclusive":
                    v.append(f"{name}: exclusive lease overlap: token {o['token']} ({om}, live "
                             f"{o['acquired']}..{_end(o)}) and token {h['token']} ({m}, granted at {h['acquired']})")
                elif m != om:
                    v.append(f"{name}: a {m} lease ({h['token']}) granted while a {om} lease ({o['token']}) was live")
                elif m == "permit" and o.get("permits") != h.get("permits"):
                    v.append(f"{name}: permits of counts {o.get('permits')} and {h.get('permits')} live together")
            if m == "permit":
                n_live = 1 + sum(1 for o in live if _mode(o) == "permit")
                counts["most permits live at once"] = max(counts["most permits live at once"], n_live)
                if n_live > (h.get("permits") or 1):
                    v.append(f"{name}: {n_live} permits live at once at {h['acquired']}, count {h.get('permits')}")
            heapq.heappush(active, (_end(h), h["token"]))

    # --- the logs: what each worker was told ------------------------------------
    acked_grants = []   # dict(token, name, holder, sent, acked, file)
    acked_writes = {}   # sale -> event
    sent_sales, fenced_sales = set(), set()
    acked_renews, acked_releases = [], []
    for fname, events in logs.items():
        sent, session = None, 0
        for e in events:
            ev = e.get("ev")
            counts["log: " + ev] += 1
            if ev == "connect":
                session += 1
            elif ev in ("acquire_sent", "shared_sent", "permit_sent"):
                sent = e["mono"]
            elif ev in ("grant", "shared_grant", "permit_grant"):
                acked_grants.append(dict(token=e["token"], name=e["name"], holder=e.get("holder"),
                                         sent=sent, acked=e["mono"], file=fname, session=(fname, session),
                                         session_bound=bool(e.get("session_bound"))))
                sent = None
            elif ev == "write_sent":
                sent_sales.add(e["sale"])
            elif ev == "write":
                acked_writes[e["sale"]] = e
            elif ev == "fenced" and "sale" in e:
                fenced_sales.add(e["sale"])
            elif ev == "renew":
                acked_renews.append(e)
            elif ev in ("error", "conn_error") and e.get("sqlstate") is not None \
                    and e["sqlstate"] not in EXPECTED_ERRORS and not e["sqlstate"].startswith("08"):
                v.append(f"{fname}: unexpected error {e['sqlstate']}: {e.get('msg', '')[:200]}")
            elif ev == "release" and e.get("ok"):
                acked_releases.append(e)

    first = {}
    for g in acked_grants:
        f = first.setdefault(g["token"], g)
        if f is not g:
            # The one way a token is acknowledged twice: an acquire of a name
            # whose session-bound lease the same session still holds returns
            # that lease, extended, whatever the holder (design.md,
            # "Session-bound leases").
            if not (f["session_bound"] and f["session"] == g["session"] and f["name"] == g["name"]):
                v.append(f"token {g['token']} acknowledged to two grants: {(f['name'], f['holder'])} and "
                         f"{(g['name'], g['holder'])}")
            else:
                counts["session-bound re-acquires (same token)"] += 1
            continue
        h = by_token.get(g["token"])
        if h is None or h["name"] != g["name"]:
            v.append(f"acknowledged grant lost: {g['name']} token {g['token']} ({g['file']}) is not in the history")
        elif g["holder"] is not None and h.get("holder") not in (None, g["holder"]):
            v.append(f"token {g['token']}: acknowledged to holder {g['holder']}, history says {h['holder']}")
    # Real time: a grant sent after another grant was acknowledged got a larger token.
    by_ack = sorted(acked_grants, key=lambda g: g["acked"])
    ack_times = [g["acked"] for g in by_ack]
    prefix_max, best = [], None
    for g in by_ack:
        best = g if best is None or g["token"] > best["token"] else best
        prefix_max.append(best)
    first_ack = {}
    for g in by_ack:
        first_ack.setdefault(g["token"], g)
    for g in acked_grants:
        # Only a token's first acknowledgement is its grant; a later one to
        # the same holder is a retry that extends it (reported above if not).
        if g["sent"] is None or first_ack[g["token"]] is not g:
            continue
        i = bisect.bisect_left(ack_times, g["sent"])
        if i and prefix_max[i - 1]["token"] >= g["token"] and prefix_max[i - 1] is not g:
            p = prefix_max[i - 1]
            v.append(f"token {g['token']} ({g['name']}) was sent for after token {p['token']} ({p['name']}) "
                     f"was acknowledged, yet is not larger")
    counts["acknowledged grants"] = len(acked_grants)

    # No acknowledged renewal lost: a lease that ended by expiry (or is still
    # there) expires no earlier than the last expiry its holder was told —
    # unless its session sent another acquire or renew of the name after that
    # and never heard back (a re-acquire by the session extends the lease to
    # now + its ttl, which may be sooner).
    told = {}  # token -> (expires, name, kind), or None once unknown
    for fname, events in logs.items():
        session, current = 0, {}  # name -> token this session was last told about
        for e in events:
            ev = e.get("ev")
            if ev == "connect":
                session, current = session + 1, {}
            elif ev in ("grant", "renew") and e.get("expires") is not None:
                told[e["token"]] = (e["expires"], e["name"], ev)
                current[e["name"]] = e["token"]
            elif ev in ("acquire_sent", "renew_sent") and e.get("name") in current:
                told[current[e["name"]]] = None
    for r in acked_renews:
        if r["token"] not in by_token:
            v.append(f"acknowledged renewal of {r['name']}/{r['token']}: lease not in the history")
    for token, last in told.items():
        h = by_token.get(token)
        if last is None or h is None:
            continue
        expires, name, kind = last
        if h["ended_by"] in (None, "expiry") and h["expires"] < int(round(expires * US)) - 1:
            v.append(f"acknowledged {'renewal' if kind == 'renew' else 'grant'} lost: {name}/{token} was told "
                     f"it lasts until {expires}, history says it expired at {h['expires'] / US}")
    counts["acknowledged renewals"] = len(acked_renews)

    crashes = sorted(n["start"] for n in nemesis if n.get("kind") in ("kill_server", "failover"))
    for r in acked_releases:
        h = by_token.get(r["token"])
        if h is None:
            continue  # reported above if it was an acknowledged grant
        if h["ended_by"] not in (None, "release"):
            # A release is acknowledged before its flush: only a crash after
            # the acknowledgement can undo it, and then the lease ends on its own.
            if not any(c >= r["mono"] for c in crashes):
                v.append(f"acknowledged release of {r['name']}/{r['token']} undone without a crash "
                         f"(history: {h['ended_by']})")
            else:
                counts["releases undone by a crash"] += 1
    counts["acknowledged releases"] = len(acked_releases)

    # --- 3 and 5: the sales ---------------------------------------------------------
    per_item = defaultdict(list)
    seen_sales = set()
    for a in audit:
        per_item[a["item"]].append(a)
        if a["sale"] in seen_sales:
            v.append(f"sale {a['sale']} committed twice")
        seen_sales.add(a["sale"])
        name = f"inv:{a['item']}"
        h = by_token.get(a["token"])
        if h is None or h["name"] != name:
            v.append(f"sale {a['sale']} on {name} committed with token {a['token']}, not a lease of {name}")
            continue
        if _mode(h) != "exclusive":
            v.append(f"sale {a['sale']} committed under a {_mode(h)} lease {a['token']}")
        if a["stamped"] is None or a["commit"] is None:
            v.append(f"sale {a['sale']}: no stamp or no commit timestamp")
            continue
        if not h["acquired"] <= a["stamped"] < _end(h):
            v.append(f"write outside its lease: sale {a['sale']} on {name} checked at {a['stamped']}, "
                     f"lease {a['token']} live {h['acquired']}..{_end(h)}")
        n = next_lease.get(a["token"])
        if n is not None and a["commit"] > n["acquired"]:
            v.append(f"sale {a['sale']} with token {a['token']} committed at {a['commit']}, after {name} "
                     f"was granted to token {n['token']} at {n['acquired']}")
        if a["sale"] not in sent_sales:
            v.append(f"sale {a['sale']} is in the data but no worker sent it")
        if a["sale"] in fenced_sales:
            v.append(f"sale {a['sale']} was refused (FL001) yet committed")
        if a["sale"] in acked_writes:
            w = acked_writes[a["sale"]]
            if (w["token"], w["item"], w["new_stock"]) != (a["token"], a["item"], a["new"]):
                v.append(f"sale {a['sale']}: acknowledged as {(w['token'], w['item'], w['new_stock'])}, "
                         f"committed as {(a['token'], a['item'], a['new'])}")
    for sale, w in acked_writes.items():
        if sale not in seen_sales:
            v.append(f"acknowledged sale lost: {sale} (item {w['item']}, token {w['token']}) is not in the data")
    item_ids = set(final) | set(per_item) | (set(range(items)) if items else set())
    for item in sorted(item_ids):
        chain = sorted(per_item.get(item, []), key=lambda a: (a["commit"] or 0, a["id"]))
        stock = initial
        for a in chain:
            if a["old"] != stock or a["new"] != a["old"] - 1:
                v.append(f"item {item}: lost update at sale {a['sale']}: replaced {a['old']} with {a['new']}, "
                         f"the stock before it was {stock}")
            stock = a["new"]
        acked = sum(1 for a in chain if a["sale"] in acked_writes)
        if final.get(item) != initial - len(chain):
            v.append(f"item {item}: final stock {final.get(item)} != initial {initial} - {len(chain)} committed sales "
                     f"({acked} acknowledged, {len(chain) - acked} whose answer was lost)")
        if final.get(item) != stock:
            v.append(f"item {item}: final stock {final.get(item)} is not the last sale's {stock}")
    # Rows written under shared leases and permits carry a lease of that kind.
    for r in shelf or ():
        h = by_token.get(r["token"])
        if h is None or h["name"] != f"inv:{r['item']}" or _mode(h) != "shared":
            v.append(f"a count of item {r['item']} recorded under token {r['token']}, not a shared lease of it")
    for r in pool or ():
        h = by_token.get(r["token"])
        if h is None or h["name"] != f"pool:{r['pool']}" or _mode(h) != "permit":
            v.append(f"a use of pool {r['pool']} recorded under token {r['token']}, not a permit of it")
    if shelf is not None:  # (the tables exist from 0.3.0 on)
        counts["counts under shared leases"] = len(shelf)
        counts["uses of permits"] = len(pool or ())
    counts["acknowledged sales"] = len(acked_writes)
    counts["committed sales"] = len(audit)
    counts["sales committed, answer lost"] = sum(1 for a in audit if a["sale"] not in acked_writes)
    counts["writes refused with FL001"] = len(fenced_sales)
    for n in nemesis:
        counts["fault: " + n["kind"]] += 1
    return v, counts


def report(violations, counts, torn=0, out=None):
    out = out or sys.stdout
    faults = {k[7:]: c for k, c in counts.items() if k.startswith("fault: ")}
    ops = {k: c for k, c in counts.items() if not k.startswith(("fault: ", "log: "))}
    print("faults injected: " + (", ".join(f"{k} {c}" for k, c in sorted(faults.items())) or "none"), file=out)
    print("operations checked: " + ", ".join(f"{k} {c}" for k, c in ops.items()), file=out)
    logs = {k[5:]: c for k, c in counts.items() if k.startswith("log: ")}
    print("log events: " + ", ".join(f"{k} {c}" for k, c in sorted(logs.items())) + f", torn last lines {torn}",
          file=out)
    if violations:
        print(f"VIOLATIONS: {len(violations)}", file=out)
        for x in violations[:50]:
            print("  " + x, file=out)
    else:
        print("no violation of the five properties", file=out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--logs", required=True)
    ap.add_argument("--nemesis")
    ap.add_argument("--json", help="also write the counts and violations here")
    a = ap.parse_args()
    logs, torn = load_logs(a.logs)
    db = load_db(a.dsn)
    violations, counts = check(db["history"], logs, db["audit"], db["final"], db["initial"],
                               load_nemesis(a.nemesis), items=db["items"], shelf=db["shelf"], pool=db["pool"])
    report(violations, counts, torn)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(violations=violations, counts=counts, torn=torn), f, indent=1)
    sys.exit(1 if violations else 0)


if __name__ == "__main__":
    main()
