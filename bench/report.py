"""Turn the sections' raw results into Markdown tables (stdout and a file)
and one chart: first the speed targets (docs/design.md) beside what was
measured, then every table. Full mode writes bench/results/latest.{md,png,json};
smoke mode writes to the work directory and fails only if a figure is missing,
never on a timing."""

import json
import os
import platform
import sys
import textwrap
from pathlib import Path

from benchlib import HERE, RUNS, SECONDS, SMOKE, WORK

SECTIONS = ["pairs", "guarded", "scale", "waiting"]
OUT = Path(os.environ.get("FL_BENCH_OUT", WORK / "smoke" if SMOKE else HERE / "results"))
FL = "fenced_lock"
PLPGSQL = "PL/pgSQL lease table"
ALWAYS = "Redis, appendfsync always"
ETCD = "etcd v3 Lock/Unlock with a lease"
QUEUE = "fenced_lock_acquire (FIFO queue, asleep)"


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


def met(s, ok):
    return "n/a" if s is None else ("yes" if ok(s["median"]) else "**no**")


def table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def pick(rows, row, clients):
    return next((r for r in rows if r["row"] == row and r["clients"] == clients), None)


def tps(rows, row, clients):
    r = pick(rows, row, clients)
    return r and r["tps"]


# -- the targets ----------------------------------------------------------------

def targets(data):
    """(what, target, measured, met) for every speed target."""
    out = []
    pr = data.get("pairs", {}).get("rows", [])
    for name, other, goals in ((f"pair vs the {PLPGSQL}", PLPGSQL, {1: 1.5, 8: 1.5}),
                               (f"pair vs {ALWAYS}", ALWAYS, {1: 1.3, 8: 1.0}),
                               (f"pair vs {ETCD}", ETCD, {1: 5.0, 8: 5.0})):
        for clients, goal in goals.items():
            x = ratio(tps(pr, FL, clients), tps(pr, other, clients))
            out.append([f"{name}, {clients} client(s), pairs/s", f">= {goal:g}x", cell(x, 2, "x"),
                        met(x, lambda v, g=goal: v >= g)])
    gr = data.get("guarded", {}).get("rows", [])
    for clients in (1, 8):
        x = ratio(tps(gr, "UPDATE, guarded table", clients), tps(gr, "UPDATE, unguarded table", clients))
        out.append([f"guarded UPDATE vs plain, {clients} client(s), transactions/s", ">= 0.90x",
                    cell(x, 2, "x"), met(x, lambda v: v >= 0.90)])
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
                      "docs/design.md. `met` compares the median with the target; it is information, "
                      "never a pass/fail.\n",
                      table(["what", "target", "measured", "met"], targets(data))])


# -- the tables -----------------------------------------------------------------

def pair_rows(rows):
    return [[r["row"], r["clients"], r["durability"], cell(r["tps"]), cell(r["p50"]), cell(r["p99"])] for r in rows]


def section_pairs(d):
    rows = [r for r in d["rows"] if not r["peer"]]
    out = ["## 1. Lock + unlock pair\n",
           "flbench (compiled, bench/client), loopback TCP, prepared statements, each call its own "
           "transaction; each client its own connection and names (a pool of 1000), so clients never "
           "contend. Latency is per pair (two round trips). Floors: `1 durable commit` = INSERT a row "
           "(flushed), then DELETE it with `synchronous_commit = off` (not waited for); `2 durable "
           "commits` = INSERT a row, then DELETE it, both flushed.\n",
           table(["row", "clients", "durability", "pairs/s", "p50 ms", "p99 ms"], pair_rows(rows))]
    if d.get("history_off"):
        out.append(f"\nRow `fenced_lock, history off` {d['history_off']}.")
    comp = []
    for clients in sorted({r["clients"] for r in rows}):
        for other in [r for r in dict.fromkeys(r["row"] for r in rows) if r != FL]:
            comp.append([f"{clients}", other, cell(ratio(tps(rows, FL, clients), tps(rows, other, clients)), 2)])
    out += ["\nfenced_lock pairs/s relative to each row (per-run ratio):\n",
            table(["clients", "row", "fenced_lock / row"], comp)]
    return "\n".join(out)


def section_guarded(d):
    rows = d["rows"]
    comp = [[c, cell(ratio(tps(rows, "UPDATE, guarded table", c), tps(rows, "UPDATE, unguarded table", c)), 2)]
            for c in sorted({r["clients"] for r in rows})]
    return "\n".join([
        "## 2. Guarded UPDATE\n",
        "pgbench for both rows (the same script on two tables), one UPDATE per transaction on the client's "
        "own row (`SET v = v + 1, fence_token = token`), under a lease taken in advance per client; the "
        f"cycle row is acquire, one guarded UPDATE, release (three commits). Durability: {d['durability']}.\n",
        table(["row", "clients", "transactions/s", "p50 ms", "p99 ms"],
              [[r["row"], r["clients"], cell(r["tps"]), cell(r["p50"]), cell(r["p99"])] for r in rows]),
        "\nGuarded transactions/s relative to unguarded (per-run ratio):\n",
        table(["clients", "guarded / unguarded"], comp)])


def section_peers(d):
    rows = [r for r in d["rows"] if r["peer"] or r["row"] == FL]
    comp = [[c, other, cell(ratio(tps(rows, FL, c), tps(rows, other, c)), 2)]
            for c in sorted({r["clients"] for r in rows}) for other in dict.fromkeys(r["row"] for r in rows)
            if other != FL]
    return "\n".join([
        "## 3. Against peers on the same machine\n",
        "The same compiled client for every row (flbench: tokio-postgres, redis-rs, etcd-client over gRPC), "
        "each client its own connection, the fenced_lock runs the same as in table 1 (interleaved with "
        "these). Redis: `SET key val NX PX 30000`, then a compare-and-delete Lua script by `EVALSHA`; it "
        "hands out no fencing token. etcd 3.4, one member: lease grant (30 s), Lock with that lease, "
        "Unlock, lease revoke.\n",
        table(["row", "clients", "durability", "pairs/s", "p50 ms", "p99 ms"], pair_rows(rows)),
        "\nfenced_lock pairs/s relative to each peer (per-run ratio):\n",
        table(["clients", "peer", "fenced_lock / peer"], comp)])


def mb(b):
    return f"{b / 1048576:,.1f} MB"


def section_scale(d):
    lv, ch = d["levels"], d["churn"]
    out = ["## 4. Scale\n",
           "4a. pgbench, 1 client: try_acquire + release of a name never seen before, with this many distinct "
           "live leases present (inserted straight into the extension's lease records, expiring in a day). "
           "Pair p50/p99 from pgbench's transaction log; try_acquire mean "
           "from `pgbench -r`.\n",
           table(["live leases", "lease records size", "pairs/s", "pair p50 ms", "pair p99 ms",
                  "try_acquire mean ms"],
                 [[f"{r['live']:,}", f"{r['size'] / 1048576:,.1f} MB", cell(r["tps"]), cell(r["p50"]),
                   cell(r["p99"]), cell(r["acquire_mean"])] for r in lv])]
    hist = ch.get("history_retention")
    out += [f"\n4b. Churn: pgbench, 1 client, {ch['seconds']} s of grants of ever new names with ttl "
            f"{ch['ttl']}, never released. Records expired for more than 60 s are reaped by later grants; "
            "without that the table would hold one record per grant."
            + (f" The history is kept {hist} (`fenced_lock.history_retention`, set for this database) and "
               "pruned by later grants. A reaped lease's history row ends at its `expires_at`, already more "
               "than 60 s back, so it is pruned soon after it is written: the row count stays near zero while "
               "the history's size shows the space that autovacuum recycles." if hist else "") + "\n",
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
           "the same way) of the first client that was already waiting.\n",
           table(["method", "waiters", "waiting at release (mean)", "handoff p50 ms", "handoff p99 ms",
                  "handoffs"],
                 [[r["method"], r["waiters"], cell(r["mean_waiting"], 1), cell(r["p50"]), cell(r["p99"]),
                   r["handoffs"]] for r in d["handoff"]])]
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


def header(meta):
    mode = ("**SMOKE RUN**: every code path once with tiny counts; the numbers mean nothing."
            if SMOKE else f"full: each figure is the median [min-max] of {RUNS} runs of {SECONDS} s "
                          "(waiting: see its section), the rows of a table interleaved run by run.")
    return "\n".join([
        "# fenced_lock benchmarks\n",
        f"- run: {meta.get('started', '?')}, {mode}",
        f"- machine: {os.cpu_count()} CPUs ({meta.get('cpu', platform.processor())}), "
        f"load average at start {meta.get('load', '?')}; {platform.system()} {platform.release()}",
        f"- PostgreSQL: {meta.get('pg', '?')}, one server on 127.0.0.1, fsync=on, synchronous_commit=on, "
        "shared_buffers=256MB, everything else default",
    ] + ([f"- note: {meta['note']}"] if meta.get("note") else []) + [""])


def chart(data, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 3, figsize=(18, 10))

    def bars(a, rows, title, ylabel):
        names = list(dict.fromkeys(r["row"] for r in rows))
        clients = sorted({r["clients"] for r in rows})
        w = 0.8 / len(clients)
        for j, cl in enumerate(clients):
            xs, ys, lo, hi = [], [], [], []
            for i, n in enumerate(names):
                r = pick(rows, n, cl)
                if r:
                    xs.append(i + j * w)
                    ys.append(r["tps"]["median"])
                    lo.append(r["tps"]["median"] - r["tps"]["min"])
                    hi.append(r["tps"]["max"] - r["tps"]["median"])
            a.bar(xs, ys, w, yerr=[lo, hi], capsize=3, label=f"{cl} client(s)")
        a.set_xticks([i + w * (len(clients) - 1) / 2 for i in range(len(names))])
        a.set_xticklabels([textwrap.fill(n, 14) for n in names], fontsize=7)
        a.set_title(title)
        a.set_ylabel(ylabel)
        a.legend(fontsize=8)

    if "pairs" in data:
        rows = data["pairs"]["rows"]
        bars(ax[0][0], [r for r in rows if not r["peer"]], "1. lock + unlock pairs/s (flbench)", "pairs/s")
        ax[0][0].set_yscale("log")
        bars(ax[0][2], [r for r in rows if r["peer"] or r["row"] == FL], "3. peers (flbench)", "pairs/s")
        ax[0][2].set_yscale("log")
    if "guarded" in data:
        bars(ax[0][1], data["guarded"]["rows"], "2. guarded UPDATE (pgbench)", "transactions/s")
    if "scale" in data:
        lv = data["scale"]["levels"]
        x = [r["live"] for r in lv]
        for f in ("p50", "p99"):
            ax[1][0].errorbar(x, [r[f]["median"] for r in lv],
                              yerr=[[r[f]["median"] - r[f]["min"] for r in lv],
                                    [r[f]["max"] - r[f]["median"] for r in lv]], marker="o", capsize=3,
                              label=f"pair {f}")
        ax[1][0].set_xscale("log")
        ax[1][0].set_xlabel("live leases present")
        ax[1][0].set_ylabel("ms")
        ax[1][0].set_ylim(bottom=0)
        ax[1][0].set_title("4a. try_acquire + release latency vs lease count")
        ax[1][0].legend(fontsize=8)
        s = data["scale"]["churn"]["samples"]
        a = ax[1][1]
        a.plot([x["t"] for x in s], [x["grants"] for x in s], "--", label="grants so far")
        a.plot([x["t"] for x in s], [x["records"] for x in s], marker="o", label="records in table")
        if data["scale"]["churn"].get("history_retention"):
            a.plot([x["t"] for x in s], [x["history"] for x in s], marker="x", label="history rows")
        a.set_xlabel("s")
        a.set_title("4b. churn (ttl 1 s, never released)")
        a.legend(fontsize=8, loc="upper left")
        a2 = a.twinx()
        a2.plot([x["t"] for x in s], [x["size"] / 1048576 for x in s], color="gray", marker=".")
        a2.plot([x["t"] for x in s], [x["heap"] / 1048576 for x in s], color="silver", marker=".")
        a2.set_ylabel("MB (gray: total, silver: heap)")
        a2.set_ylim(bottom=0)
    if "waiting" in data:
        a = ax[1][2]
        for m in dict.fromkeys(r["method"] for r in data["waiting"]["handoff"]):
            rs = [r for r in data["waiting"]["handoff"] if r["method"] == m]
            short = "fenced_lock_acquire" if m == QUEUE else "try_acquire + backoff"
            for f, style in (("p50", "-o"), ("p99", ":^")):
                a.plot([r["waiters"] for r in rs], [r[f]["median"] for r in rs], style, label=f"{short} {f}")
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel("waiters")
        a.set_ylabel("handoff ms")
        a.axhline(1, color="red", lw=0.8, ls="--")
        cpu = "; ".join(f"{'acquire' if r['queue'] else 'backoff'}: {r['total']['median']:.2f}% core"
                        for r in data["waiting"]["cpu"])
        a.set_title(f"5. handoff latency (CPU of {data['waiting']['cpu'][0]['waiters']} waiters: {cpu})",
                    fontsize=9)
        a.legend(fontsize=7)
    fig.suptitle("fenced_lock benchmarks" + (" (SMOKE: meaningless numbers)" if SMOKE else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main():
    data = {}
    for s in SECTIONS:
        p = WORK / f"{s}.json"
        if p.exists():
            data[s] = json.loads(p.read_text())
    missing = [s for s in SECTIONS if s not in data]
    meta = json.loads((WORK / "meta.json").read_text()) if (WORK / "meta.json").exists() else {}
    parts = [header(meta), section_targets(data)]
    if "pairs" in data:
        parts.append(section_pairs(data["pairs"]))
    if "guarded" in data:
        parts.append(section_guarded(data["guarded"]))
    if "pairs" in data:
        parts.append(section_peers(data["pairs"]))
    if "scale" in data:
        parts.append(section_scale(data["scale"]))
    if "waiting" in data:
        parts.append(section_waiting(data["waiting"]))
    md = "\n\n".join(parts) + "\n"
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "latest.md").write_text(md)
    (OUT / "latest.json").write_text(json.dumps({"meta": meta, **data}, indent=1))
    chart(data, OUT / "latest.png")
    sys.stdout.write(md)
    if missing:
        sys.exit(f"bench: no results from {', '.join(missing)}")
    if "n/a" in md:
        sys.exit("bench: a figure is missing (n/a) in the tables")


if __name__ == "__main__":
    main()
