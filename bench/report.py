"""Turn the sections' raw results into Markdown tables (stdout and a file)
and two charts: first the speed targets (docs/design.md) beside
what was measured, then every table, each row with what it cost the client
and the server per operation. Full mode writes
bench/results/latest.{md,json} and latest.png (tables 1-5) and
latest_e2e.png (table 6); smoke mode writes to the work directory and fails
only if a figure is missing, never on a timing."""

import json
import os
import platform
import sys
from pathlib import Path

from benchlib import HERE, RUNS, SECONDS, SMOKE, WORK
from charts import chart, chart_e2e
from figures import ALWAYS, ETCD, FL, FLOOR1, GUARDED, NOOP, PLAIN, PLPGSQL, med, tps

SECTIONS = ["pairs", "recipes", "guarded", "e2e", "scale", "waiting", "instructions"]
OUT = Path(os.environ.get("FL_BENCH_OUT", WORK / "smoke" if SMOKE else HERE / "results"))
NOT_COUNTED = "not counted"  # a figure this machine cannot give (no perf): said, not missing


def fmt(x, digits=None):
    if x is None:
        return "n/a"
    if digits is None:
        digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2 if abs(x) >= 1 else 3
    return f"{x:,.{digits}f}"


def cell(s, digits=None, unit=""):
    """median [min-max] of a summary."""
    if s is None:
        return "n/a"
    if len(s["runs"]) == 1:
        return fmt(s["median"], digits) + unit
    return f"{fmt(s['median'], digits)} [{fmt(s['min'], digits)}-{fmt(s['max'], digits)}]{unit}"


def ratio(num, den):
    """Per-run ratio num/den of two summaries' runs, paired by run index
    (neighbours in the interleaved order)."""
    if num is None or den is None:
        return None
    r = sorted(a / b for a, b in zip(num["runs"], den["runs"]) if b)
    if not r:
        return None
    mid = len(r) // 2
    return {"median": r[mid] if len(r) % 2 else (r[mid - 1] + r[mid]) / 2, "min": r[0], "max": r[-1], "runs": r}


def fixed(x):
    """A single figure as a summary (instruction counts)."""
    return None if x is None else {"median": x, "min": x, "max": x, "runs": [x]}


def met(s, ok):
    return "n/a" if s is None else ("yes" if ok(s["median"]) else "**no**")


def table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# -- costs per operation ---------------------------------------------------------

COST_HEAD = ["client CPU µs/op", "server CPU µs/op", "log bytes/op", "log fsyncs/op"]
SERVER = {"pg": "PostgreSQL", "redis_always": "Redis", "redis_everysec": "Redis", "etcd": "etcd"}


def cost_cells(r, servers=("pg",)):
    """Client CPU, server CPU, log bytes and log fsyncs per operation
    (medians over the runs); a row on two servers shows both, PostgreSQL first."""
    c = r.get("costs")
    if not c:
        return ["n/a"] * 4
    servers = r.get("servers", servers)

    def joined(field, digits):
        vals = []
        for s in servers:
            v = med(c, s, field)
            if v is None and field == "fsyncs" and s.startswith("redis"):
                vals.append(NOT_COUNTED)
            else:
                vals.append(fmt(v, digits))
        return " + ".join(vals)

    return [fmt(med(c, "client", "cpu_us"), 1 if (med(c, "client", "cpu_us") or 0) < 100 else 0),
            joined("cpu_us", None), joined("log_bytes", 0), joined("fsyncs", 2)]


def cost_note(what):
    return (f"Costs are per {what}, medians over the runs: the client's CPU (user + system, the client process), "
            "the CPU of the server(s) the row uses (all processes: for PostgreSQL the backends, walwriter, "
            "checkpointer, autovacuum, ...), the bytes written to the server's log (PostgreSQL's WAL, Redis' AOF, "
            "etcd's WAL) and the fsyncs of that log. A row on two servers shows PostgreSQL + the lock service.")


# -- the targets ----------------------------------------------------------------

def e2e_shape(data, key):
    return next((s for s in data.get("e2e", {}).get("shapes", []) if s["key"] == key), None)


def e2e_tps(shape, key):
    r = next((r for r in shape["rows"] if r["key"] == key), None) if shape else None
    return r and r["tps"]


def inst(data, row):
    r = next((r for r in data.get("instructions", {}).get("rows", []) if r["row"] == row), None)
    return r and r["per_op"]


def targets(data):
    """(what, target, measured, met) for every speed target."""
    out = []
    pr = data.get("pairs", {}).get("rows", [])
    for name, other, goals in ((f"pair vs {FLOOR1}", FLOOR1, {1: 0.9, 8: 0.9}),
                               (f"pair vs {ALWAYS}", ALWAYS, {1: 1.3, 8: 1.0}),
                               (f"pair vs the {PLPGSQL}", PLPGSQL, {1: 1.5, 8: 1.5}),
                               (f"pair vs {ETCD}", ETCD, {1: 5.0, 8: 5.0})):
        for clients, goal in goals.items():
            x = ratio(tps(pr, FL, clients), tps(pr, other, clients))
            out.append([f"{name}, {clients} client(s), pairs/s", f">= {goal:g}x", cell(x, 2, "x"),
                        met(x, lambda v, g=goal: v >= g)])
    if data.get("instructions", {}).get("rows"):
        p, f = inst(data, "fenced_lock pair"), inst(data, "floor: INSERT + DELETE")
        x = fixed(p / f) if p and f else None
        out.append(["pair instructions vs the one-commit floor (callgrind)", "<= 1.3x",
                    f"{fmt(p / 1000, 0)}k / {fmt(f / 1000, 0)}k = {cell(x, 2, 'x')}" if x else "n/a",
                    met(x, lambda v: v <= 1.3)])
    gr = data.get("guarded", {}).get("rows", [])
    for clients in (1, 8):
        x = ratio(tps(gr, GUARDED, clients), tps(gr, PLAIN, clients))
        out.append([f"guarded UPDATE vs plain, {clients} client(s), transactions/s", ">= 0.93x",
                    cell(x, 2, "x"), met(x, lambda v: v >= 0.93)])
    if data.get("instructions", {}).get("rows"):
        p, n, g = inst(data, "UPDATE, plain"), inst(data, "UPDATE, no-op C trigger"), inst(data, "UPDATE, guarded")
        if p and g:
            x = fixed(p / g)
            out.append(["guarded UPDATE vs plain, instructions (plain / guarded)",
                        f">= 0.93x (a no-op C trigger: {fmt(p / n, 2)}x)" if n else ">= 0.93x", cell(x, 2, "x"),
                        met(x, lambda v: v >= 0.93)])
    for key, label in (("spread", "8 workers, 1,000 items"), ("hot", "16 workers, 1 hot item")):
        shape = e2e_shape(data, key)
        if not shape:
            continue
        for row, goal in (("fenced3", 1.3), ("fenced1", 1.5)):
            x = ratio(e2e_tps(shape, row), e2e_tps(shape, "redis"))
            form = "three transactions" if row == "fenced3" else "one transaction"
            out.append([f"sale, {label}: fenced_lock {form} vs Redis lock + write (no fence)", f">= {goal:g}x",
                        cell(x, 2, "x"), met(x, lambda v, g=goal: v >= g)])
        if key == "hot":
            x = ratio(e2e_tps(shape, "forupdate"), e2e_tps(shape, "fenced1"))
            out.append([f"sale, {label}: SELECT ... FOR UPDATE vs fenced_lock one transaction", "<= 1.25x",
                        cell(x, 2, "x"), met(x, lambda v: v <= 1.25)])
    shape = e2e_shape(data, "pause")
    if shape:
        for r in shape["rows"]:
            if r["key"] in ("fenced3", "fenced1"):
                out.append([f"sales lost with a 1.5 s pause and a 1 s ttl: {r['row']}", "0",
                            f"{r['lost_total']:,} of {r['acknowledged']:,}", "yes" if r["lost_total"] == 0 else "**no**"])
    rec = data.get("recipes", {})
    if rec.get("skipped"):
        out.append(["shared pair, permit pair (0.3.0)", ">= 0.91x, >= 0.9x", f"skipped: {rec['skipped']}", "-"])
    elif rec.get("rows"):
        rr = rec["rows"]
        for clients in (1, 8):
            x = ratio(tps(rr, "shared pair", clients), tps(rr, "exclusive pair", clients))
            out.append([f"shared pair vs exclusive pair, {clients} client(s)", ">= 0.91x", cell(x, 2, "x"),
                        met(x, lambda v: v >= 0.91)])
        x = ratio(tps(rr, "permit acquire + release, 8 clients on 1 name with permits => 8", 8),
                  tps(rr, "exclusive acquire + release, 8 clients on 8 names", 8))
        out.append(["permit pair, 8 clients on 1 name (permits => 8) vs 8 clients on 8 names", ">= 0.9x",
                    cell(x, 2, "x"), met(x, lambda v: v >= 0.9)])
    w = data.get("waiting", {})
    for r in (r for r in w.get("handoff", []) if r["queue"]):
        ok = r["p50"] and r["p99"] and r["p50"]["median"] < 1 and r["p99"]["median"] < 5
        out.append([f"handoff, {r['waiters']} waiter(s)", "p50 < 1 ms, p99 < 5 ms",
                    f"p50 {cell(r['p50'])} ms, p99 {cell(r['p99'])} ms", "yes" if ok else "**no**"])
    for r in (r for r in w.get("cpu", []) if r["queue"]):
        out.append([f"CPU of {r['waiters']} idle waiters (backends + client)", "< 1% of a core",
                    cell(r["total"], 2, "%"), met(r["total"], lambda v: v < 1)])
    k = w.get("session_kill")
    if k is not None:
        out.append(["session-bound holder killed -> next waiter granted", "p50 < 100 ms",
                    f"p50 {fmt(k['p50_ms'])} ms, p99 {fmt(k['p99_ms'])} ms" if k["available"] else "not available",
                    ("yes" if k["p50_ms"] < 100 else "**no**") if k["available"] else "-"])
    lv = data.get("scale", {}).get("levels", [])
    if len(lv) >= 2:  # the mean and p99 show periodic stalls that a p50 hides
        for what, f in (("try_acquire mean", "acquire_mean"), ("pair p50", "p50"), ("pair p99", "p99")):
            x = ratio(lv[-1][f], lv[0][f])
            out.append([f"{what} latency, {lv[-1]['live']:,} live leases / {lv[0]['live']:,}",
                        "flat (read as <= 1.2x)", cell(x, 2, "x"), met(x, lambda v: v <= 1.2)])
    return out


def section_targets(data):
    return "\n".join(["## Speed targets\n",
                      "Per-run ratios (median [min-max]) and medians, against the speed targets of "
                      "docs/design.md. The pair ratios come from the fair rows of table 1 (each protocol driven "
                      "by its lightest client). `met` compares the median with the target; it is information, "
                      "never a pass/fail.\n",
                      table(["what", "target", "measured", "met"], targets(data))])


# -- the tables -----------------------------------------------------------------

PAIR_HEAD = ["row", "clients", "client", "durability", "pairs/s", "p50 ms", "p99 ms"] + COST_HEAD


def pair_rows(rows):
    return [[r["row"], r["clients"], r["client"], r["durability"], cell(r["tps"]), cell(r["p50"]), cell(r["p99"])]
            + cost_cells(r) for r in rows]


def comparisons(rows, base):
    out = []
    for clients in sorted({r["clients"] for r in rows}):
        for other in [r for r in dict.fromkeys(r["row"] for r in rows) if r != base]:
            out.append([f"{clients}", other, cell(ratio(tps(rows, base, clients), tps(rows, other, clients)), 2)])
    return out


def section_pairs(d):
    rows = [r for r in d["rows"] if not r["peer"] and r["view"] == "fair"]
    second = [r for r in d["rows"] if r["view"] == "flbench"]
    out = ["## 1. Lock + unlock pair\n",
           "Each call its own transaction, loopback TCP, prepared statements; each client its own connection "
           "and names (a pool of 1000), so clients never contend. Latency is per pair (two round trips). "
           "Every PostgreSQL row is driven by pgbench -M prepared (C, libpq), the lightest client for the "
           "protocol. Floors: `1 durable commit` = INSERT a row (flushed), then DELETE it with "
           "`synchronous_commit = off` (not waited for); `2 durable commits` = INSERT a row, then DELETE it, "
           "both flushed. " + cost_note("pair") + "\n",
           table(PAIR_HEAD, pair_rows(rows))]
    if d.get("history_off"):
        out.append(f"\nRow `fenced_lock, history off` {d['history_off']}.")
    out += ["\nfenced_lock pairs/s relative to each row (per-run ratio):\n",
            table(["clients", "row", "fenced_lock / row"], comparisons(rows, FL))]
    if second:
        both = second + [r for r in d["rows"] if r["row"] in (FL, FLOOR1, ALWAYS)]
        comp = []
        for c in sorted({r["clients"] for r in second}):
            for a, b in (("fenced_lock (flbench)", "Redis, appendfsync always (flbench)"),
                         ("fenced_lock (flbench)", "floor: 1 durable commit (flbench)"), (FL, ALWAYS), (FL, FLOOR1)):
                comp.append([c, f"{a} / {b}", cell(ratio(tps(both, a, c), tps(both, b, c)), 2)])
        out += ["\n1b. The same pairs through flbench's tokio clients (tokio-postgres, a multiplexed redis-rs "
                "connection), as the bench drove them before, beside the rows above: on 2 cores the client's "
                "CPU is taken from the server it measures, so the ratio moves with the client.\n",
                table(PAIR_HEAD, pair_rows(second)), "\n", table(["clients", "ratio", "per run"], comp)]
    return "\n".join(out)


def section_peers(d):
    rows = [r for r in d["rows"] if (r["peer"] or r["row"] == FL) and r["view"] == "fair"]
    return "\n".join([
        "## 3. Against peers on the same machine\n",
        "fenced_lock as in table 1 (pgbench, interleaved with these). Redis: `SET key val NX PX 30000`, then a "
        "compare-and-delete Lua script by `EVALSHA`, from flbench with a blocking redis-rs connection per OS "
        "thread; it hands out no fencing token. etcd 3.4, one member: lease grant (30 s), Lock with that lease, "
        "Unlock, lease revoke, from flbench's tokio etcd-client (gRPC). " + cost_note("pair") + "\n",
        table(PAIR_HEAD, pair_rows(rows)),
        "\nfenced_lock pairs/s relative to each peer (per-run ratio):\n",
        table(["clients", "peer", "fenced_lock / peer"], comparisons(rows, FL))])


def section_recipes(d):
    out = ["## 7. Recipes of 0.3.0: shared leases, semaphore permits, acquire_all\n"]
    if d.get("skipped"):
        out.append(f"Skipped: {d['skipped']}.")
        return "\n".join(out)
    rows = d["rows"]
    out += ["pgbench -M prepared, each call its own transaction. Shared pair: `try_acquire(name, '30 s', shared "
            "=> true)` + `release` on the client's own names, beside the exclusive pair. Permit pair: 8 clients "
            "on one name, `acquire(name, '30 s', '10 s', permits => 8)` + `release`, beside 8 clients on a name "
            "each with the same calls. acquire_all: `try_acquire_all(names, '30 s')` + `release_all(names, "
            "tokens)` of 2 and of 8 names of the client's own. " + cost_note("operation") + "\n",
            table(["row", "clients", "operations/s", "names/s", "p50 ms", "p99 ms"] + COST_HEAD,
                  [[r["row"], r["clients"], cell(r["tps"]), fmt(r["tps"]["median"] * r["names"]), cell(r["p50"]),
                    cell(r["p99"])] + cost_cells(r) for r in rows])]
    comp = [[c, "shared pair / exclusive pair", cell(ratio(tps(rows, "shared pair", c), tps(rows, "exclusive pair", c)), 2)]
            for c in (1, 8)]
    comp.append([8, "permits on 1 name / 8 names", cell(ratio(
        tps(rows, "permit acquire + release, 8 clients on 1 name with permits => 8", 8),
        tps(rows, "exclusive acquire + release, 8 clients on 8 names", 8)), 2)])
    for k in (2, 8):
        for c in (1, 8):
            x = ratio(tps(rows, f"try_acquire_all + release_all, {k} names", c), tps(rows, "exclusive pair", c))
            comp.append([c, f"acquire_all of {k} / exclusive pair (operations)", cell(x, 2)])
    out += ["\nPer-run ratios:\n", table(["clients", "ratio", "per run"], comp)]
    return "\n".join(out)


def section_guarded(d):
    rows = d["rows"]
    comp = []
    for c in sorted({r["clients"] for r in rows}):
        for a, b in ((GUARDED, PLAIN), (NOOP, PLAIN), (GUARDED, NOOP)):
            comp.append([c, f"{a} / {b}", cell(ratio(tps(rows, a, c), tps(rows, b, c)), 2)])
    out = [
        "## 2. Guarded UPDATE\n",
        "pgbench for every row (the same script on three tables), one UPDATE per transaction on the client's "
        "own row (`SET v = v + 1, fence_token = token`), under a lease taken in advance per client: a table "
        "without triggers, one with a no-op C row trigger (bench/noop_trigger.c: what any row trigger costs), "
        "and one with `fenced_lock_guard`. The cycle row is acquire, one guarded UPDATE, release (three "
        f"commits). Durability: {d['durability']}. " + cost_note("transaction (a cycle for the last row)") + "\n",
        table(["row", "clients", "transactions/s", "p50 ms", "p99 ms"] + COST_HEAD,
              [[r["row"], r["clients"], cell(r["tps"]), cell(r["p50"]), cell(r["p99"])] + cost_cells(r)
               for r in rows])]
    if d.get("noop"):
        out.append(f"\nRow `{NOOP}` {d['noop']}.")
    out += ["\nPer-run ratios of transactions/s:\n", table(["clients", "ratio", "per run"], comp)]
    return "\n".join(out)


def mb(b):
    return f"{b / 1048576:,.1f} MB"


def section_scale(d):
    lv, ch = d["levels"], d["churn"]
    out = ["## 4. Scale\n",
           "4a. pgbench, 1 client: try_acquire + release of a name never seen before, with this many distinct "
           "live leases present (inserted straight into the extension's lease records, expiring in a day). "
           "Pair p50/p99 from pgbench's transaction log; try_acquire mean from `pgbench -r`. "
           + cost_note("pair") + "\n",
           table(["live leases", "lease records size", "pairs/s", "pair p50 ms", "pair p99 ms",
                  "try_acquire mean ms"] + COST_HEAD,
                 [[f"{r['live']:,}", f"{r['size'] / 1048576:,.1f} MB", cell(r["tps"]), cell(r["p50"]),
                   cell(r["p99"]), cell(r["acquire_mean"])] + cost_cells(r) for r in lv])]
    hist = ch.get("history_retention")
    cc = cost_cells(ch)
    out += [f"\n4b. Churn: pgbench, 1 client, {ch['seconds']} s of grants of ever new names with ttl "
            f"{ch['ttl']}, never released. Records expired for more than 60 s are reaped by later grants; "
            "without that the table would hold one record per grant."
            + (f" The history is kept {hist} (`fenced_lock.history_retention`, set for this database) and "
               "pruned by later grants. A reaped lease's history row ends at its `expires_at`, already more "
               "than 60 s back, so it is pruned soon after it is written: the row count stays near zero while "
               "the history's size shows the space that autovacuum recycles." if hist else "")
            + f" Per grant, over the whole run: client CPU {cc[0]} µs, server CPU {cc[1]} µs, WAL {cc[2]} "
            f"bytes, {cc[3]} WAL fsyncs.\n",
            table(["t (s)", "grants so far", "records in table", "of them live", "heap size",
                   "total size (with indexes)"] + (["history rows", "history size"] if hist else []),
                  [[f"{x['t']} (after the run)" if x["t"] > ch["seconds"] else x["t"], f"{x['grants']:,}",
                    f"{x['records']:,}", f"{x['live']:,}", mb(x["heap"]), mb(x["size"])]
                   + ([f"{x['history']:,}", mb(x["history_size"])] if hist else []) for x in ch["samples"]])]
    return "\n".join(out)


def section_waiting(d):
    out = ["## 5. Waiting\n",
           f"5a. Handoff on one name (flbench): waiters + 1 clients take the lock, hold it {d['hold_ms']:g} ms, "
           f"release, work {d['think_ms']:g} ms, queue again; {d['trials']} releases measured per run. Handoff = "
           "server clock from a release (read right after the call, before its commit) to the grant (read "
           "the same way) of the first client that was already waiting. " + cost_note("release (one acquire "
           "and one release)") + "\n",
           table(["method", "waiters", "waiting at release (mean)", "handoff p50 ms", "handoff p99 ms",
                  "handoffs"] + COST_HEAD,
                 [[r["method"], r["waiters"], cell(r["mean_waiting"], 1), cell(r["p50"]), cell(r["p99"]),
                   r["handoffs"]] + cost_cells(r) for r in d["handoff"]])]
    c = d["cpu"]
    out += [f"\n5b. CPU while {c[0]['waiters']} clients (tasks of one flbench process, own connections) wait "
            f"{c[0]['seconds']:g} s for a lock held all along: CPU time (from `/proc/<pid>/task/*/schedstat`, "
            "in ns) of their backends and of the client process, as % of one core.\n",
            table(["method", "backends % core", "client % core", "total % core"],
                  [[r["method"], cell(r["backends"], 2), cell(r["client"], 2), cell(r["total"], 2)] for r in c])]
    k = d["session_kill"]
    out.append("\n5c. A holder process takes a session-bound lease (`session_bound => true`) and is killed "
               "with SIGKILL while a waiter on another connection is queued for the name: from the kill "
               "(the bench's wall clock) to the waiter's grant (server clock, same machine), and to the "
               "waiter's call returning (monotonic clock).\n")
    if k["available"]:
        out.append(table(["trials", "kill -> grant p50 ms", "p99 ms", "kill -> call returned p50 ms", "p99 ms"],
                         [[k["trials"], fmt(k["p50_ms"]), fmt(k["p99_ms"]), fmt(k["returned_p50_ms"]),
                           fmt(k["returned_p99_ms"])]]))
    else:
        out.append(f"Not available in this build of fenced_lock: {k['reason']}.")
    return "\n".join(out)


def section_e2e(d):
    shapes = d["shapes"]
    keys = [r["key"] for r in shapes[0]["rows"]]
    label = {r["key"]: r["row"] for r in shapes[0]["rows"]}
    length = "smoke counts" if d.get("seconds") is None else f"{d['runs']} runs of {d['seconds']} s"
    out = ["## 6. End-to-end critical section: take the lock, read the stock, write stock - 1, release\n",
           "flbench `sale` (bench/client/src/sale.rs): each worker an OS thread with its own blocking "
           "connections (libpq for PostgreSQL; redis-rs, or etcd-client on a runtime of its own, for the lock "
           "service), each loop one sale of a random item. Redis is `appendfsync always` and is polled every "
           "1 ms while the key is held; the PL/pgSQL lease table too; fenced_lock waits in "
           "`fenced_lock_acquire`, etcd in its Lock call, `FOR UPDATE` on the row lock. A sale counts once its "
           "write committed; a write refused because the lock was lost (FL001, or the app-side fence matching "
           f"no row) is retried from the lock. Interleaved, median [min-max] of {length}, sales/s. Every sale "
           "is checked against the stock left in the table, item by item.\n",
           table(["row", "one critical section"], [[r["row"], r["what"]] for r in shapes[0]["rows"]]),
           "\n", table(["row"] + [s["label"] for s in shapes],
                       [[label[k]] + [cell(e2e_tps(s, k)) for s in shapes] for k in keys])]
    comp = []
    for s in shapes:
        for a, b in (("fenced3", "redis"), ("fenced1", "redis"), ("fenced1", "redis_fence"), ("fenced1", "etcd"),
                     ("fenced1", "plpgsql"), ("fenced1", "forupdate")):
            comp.append([s["label"], f"{label[a]} / {label[b]}", cell(ratio(e2e_tps(s, a), e2e_tps(s, b)), 2)])
    out += ["\nPer-run ratios of sales/s:\n", table(["shape", "ratio", "per run"], comp)]
    for s in shapes:
        pause = s["key"] == "pause"
        head = ["row", "sales/s", "p50 ms", "p99 ms"] + (["sales lost", "writes fenced off", "pauses"] if pause else [])
        out += [f"\n6{'abc'[shapes.index(s)]}. {s['label']}. " + cost_note("sale") + "\n",
                table(head + COST_HEAD,
                      [[r["row"], cell(r["tps"]), cell(r["p50"]), cell(r["p99"])]
                       + ([f"{r['lost_total']:,} of {r['acknowledged']:,} ({cell(r['lost'], 0)} per run)",
                           r["fenced_off"], r["pauses"]] if pause else []) + cost_cells(r) for r in s["rows"]])]
    return "\n".join(out)


def section_instructions(d):
    out = ["## 8. Instructions per operation (callgrind)\n"]
    if d.get("skipped"):
        out.append(f"Skipped: {d['skipped']}.")
        return "\n".join(out)
    rows = d["rows"]
    base = {r["row"]: r["per_op"] for r in rows}
    rel = {"fenced_lock pair": "floor: INSERT + DELETE", "fenced_lock pair, history off": "floor: INSERT + DELETE",
           "PL/pgSQL lease table pair": "floor: INSERT + DELETE", "UPDATE, no-op C trigger": "UPDATE, plain",
           "UPDATE, guarded": "UPDATE, plain", "sale: fenced_lock, three transactions": "sale: SELECT ... FOR UPDATE",
           "sale: fenced_lock, one transaction": "sale: SELECT ... FOR UPDATE", "shared pair": "fenced_lock pair",
           "permit pair": "fenced_lock pair", "try_acquire_all + release_all, 2 names": "fenced_lock pair",
           "try_acquire_all + release_all, 8 names": "fenced_lock pair"}
    out += [f"A single-user backend (`postgres --single`) under `valgrind --tool=callgrind`, driven statement by "
            f"statement (prepared, each its own transaction unless the row opens one); the difference of a run "
            f"of {d['warm']} + {d['ops']} operations and one of {d['warm']}, over {d['ops']}. Every statement "
            "also pays its `EXECUTE` line's parse (about 4k instructions), in every row alike. Repeatable to a "
            "few per cent whatever the machine does.\n",
            table(["row", "one operation", "instructions", "vs"],
                  [[r["row"], r["what"], f"{fmt(r['per_op'] / 1000, 1)}k",
                    f"{fmt(r['per_op'] / base[rel[r['row']]], 2)}x {rel[r['row']]}" if rel.get(r["row"]) in base
                    else ""] for r in rows]),
            "\nWhere they go: inclusive instructions per operation of the extension's own functions and of "
            "PostgreSQL's building blocks (a function's figure includes what it calls, so the lines overlap).\n"]
    for r in rows:
        out += [f"\n<details><summary>{r['row']}: {fmt(r['per_op'] / 1000, 1)}k</summary>\n",
                table(["function [object]", "instructions"], [[f"`{f}`", f"{fmt(x / 1000, 1)}k"] for f, x in r["profile"]]),
                "\n</details>"]
    return "\n".join(out)


def header(meta):
    mode = ("**SMOKE RUN**: every code path once with tiny counts; the numbers mean nothing."
            if SMOKE else f"full: each figure is the median [min-max] of {RUNS} runs of {SECONDS} s "
                          "(end-to-end and waiting: see their sections), the rows of a table interleaved run by run.")
    return "\n".join([
        "# fenced_lock benchmarks\n",
        f"- run: {meta.get('started', '?')}, {mode}",
        f"- machine: {os.cpu_count()} CPUs ({meta.get('cpu', platform.processor())}), "
        f"load average at start {meta.get('load', '?')}; {platform.system()} {platform.release()}",
        f"- PostgreSQL: {meta.get('pg', '?')}, fenced_lock {meta.get('fenced_lock', '?')}, one server on "
        "127.0.0.1, fsync=on, synchronous_commit=on, shared_buffers=256MB, everything else default",
    ] + ([f"- note: {meta['note']}"] if meta.get("note") else []) + [""])


def main():
    data = {}
    for s in SECTIONS:
        p = WORK / f"{s}.json"
        if p.exists():
            data[s] = json.loads(p.read_text())
    missing = [s for s in SECTIONS if s not in data]
    meta = json.loads((WORK / "meta.json").read_text()) if (WORK / "meta.json").exists() else {}
    parts = [header(meta), section_targets(data)]
    for s, f in (("pairs", section_pairs), ("guarded", section_guarded), ("pairs", section_peers),
                 ("scale", section_scale), ("waiting", section_waiting), ("e2e", section_e2e),
                 ("recipes", section_recipes), ("instructions", section_instructions)):
        if s in data:
            parts.append(f(data[s]))
    md = "\n\n".join(parts) + "\n"
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "latest.md").write_text(md)
    (OUT / "latest.json").write_text(json.dumps({"meta": meta, **data}, indent=1))
    chart(data, OUT / "latest.png")
    if "e2e" in data:
        chart_e2e(data["e2e"], OUT / "latest_e2e.png")
    sys.stdout.write(md)
    if missing:
        sys.exit(f"bench: no results from {', '.join(missing)}")
    if "n/a" in md:
        sys.exit("bench: a figure is missing (n/a) in the tables")


if __name__ == "__main__":
    main()
