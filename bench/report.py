"""Turn the sections' raw results into Markdown tables (stdout and a file)
and one chart. Full mode writes bench/results/latest.{md,png,json}; smoke
mode writes to the work directory and fails only if a figure is missing."""

import json
import os
import platform
import sys
import textwrap
from pathlib import Path

from benchlib import HERE, RUNS, SECONDS, SMOKE, WORK

SECTIONS = ["pairs", "guarded", "peers", "scale", "waiting"]
OUT = Path(os.environ.get("FL_BENCH_OUT", WORK / "smoke" if SMOKE else HERE / "results"))


def fmt(x, digits=None):
    if x is None:
        return "n/a"
    if digits is None:
        digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2 if abs(x) >= 1 else 3
    return f"{x:,.{digits}f}"


def cell(s, digits=None):
    """median [min-max] of a summary."""
    if s is None:
        return "n/a"
    if len(s["runs"]) == 1:
        return fmt(s["median"], digits)
    return f"{fmt(s['median'], digits)} [{fmt(s['min'], digits)}-{fmt(s['max'], digits)}]"


def ratio(num, den):
    """Per-run ratio num/den of two summaries' runs (paired by run index)."""
    r = [a / b for a, b in zip(num["runs"], den["runs"]) if b]
    if not r:
        return None
    r.sort()
    mid = len(r) // 2
    med = r[mid] if len(r) % 2 else (r[mid - 1] + r[mid]) / 2
    return {"median": med, "min": r[0], "max": r[-1], "runs": r}


def met(s, ok):
    return "n/a" if s is None else ("yes" if ok(s["median"]) else "**no**")


def table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def pick(rows, row, clients):
    for r in rows:
        if r["row"] == row and r["clients"] == clients:
            return r
    return None


def section_pairs(d):
    out = ["## 1. try_acquire + release pair\n",
           "pgbench, loopback TCP, `-M prepared`, each call its own transaction; each client uses its own "
           "names (a pool of 1000), so clients never contend. Latency is per pair (two round trips, two commits).\n",
           table(["row", "clients", "durability", "pairs/s", "p50 ms", "p99 ms"],
                 [[r["row"], r["clients"], r["durability"], cell(r["tps"]), cell(r["p50"]), cell(r["p99"])]
                  for r in d["rows"]]),
           "\nTime per pair, fenced_lock relative to (per-run ratio, median [min-max]):\n"]
    rows = []
    for x in d["ratios"]:
        f, b = x["fenced_vs_floor"], x["fenced_vs_baseline"]
        rows.append([f"{x['clients']}", cell(f, 2), met(f, lambda v: v <= 1.2), cell(b, 2), met(b, lambda v: v < 1)])
    out.append(table(["clients", "/ floor (target <= 1.2)", "met", "/ PL/pgSQL baseline (target < 1)", "met"], rows))
    return "\n".join(out)


def section_guarded(d):
    out = ["## 2. Guarded UPDATE\n",
           "pgbench, one UPDATE per transaction on the client's own row (`SET v = v + 1, fence_token = token`), "
           "under a lease taken in advance per client; the cycle row is acquire, one guarded UPDATE, release "
           f"(three commits). Durability: {d['durability']}.\n",
           table(["row", "clients", "transactions/s", "p50 ms", "p99 ms"],
                 [[r["row"], r["clients"], cell(r["tps"]), cell(r["p50"]), cell(r["p99"])] for r in d["rows"]]),
           "\nTime per UPDATE, guarded relative to unguarded (per-run ratio):\n",
           table(["clients", "guarded / unguarded (target <= 1.15)", "met"],
                 [[x["clients"], cell(x["guarded_vs_plain"], 2), met(x["guarded_vs_plain"], lambda v: v <= 1.15)]
                  for x in d["ratios"]])]
    return "\n".join(out)


def section_peers(d):
    rows = d["rows"]
    out = ["## 3. Against peers on the same machine\n",
           "One Python process per client, one persistent connection each: psycopg 3 (prepared statements) "
           "for fenced_lock, redis-py for Redis (`SET key val NX PX 30000` + compare-and-delete Lua via "
           "`EVALSHA`), http.client keep-alive to etcd's JSON gateway (`/v3/lease/grant`, `/v3/lock/lock`, "
           "`/v3/lock/unlock`, `/v3/lease/revoke`). One pair = lock with a 30 s TTL, then unlock.\n",
           table(["row", "clients", "durability", "pairs/s", "p50 ms", "p99 ms"],
                 [[r["row"], r["clients"], r["durability"], cell(r["tps"]), cell(r["p50"]), cell(r["p99"])]
                  for r in rows])]
    fl, etcd = "fenced_lock (psycopg)", "etcd v3 Lock (grant, lock, unlock, revoke)"
    always = "Redis SET NX PX + CAS delete, appendfsync always"
    comp = []
    for clients in sorted({r["clients"] for r in rows}):
        a, e, ra = pick(rows, fl, clients), pick(rows, etcd, clients), pick(rows, always, clients)
        if a and e:
            x = ratio(a["tps"], e["tps"])
            comp.append([f"fenced_lock / etcd pairs/s, {clients} client(s)", cell(x, 1), ">= 4", met(x, lambda v: v >= 4)])
        if a and ra:
            x = ratio(a["tps"], ra["tps"])
            target = ">= 1" if clients == 1 else "(none)"
            comp.append([f"fenced_lock / Redis appendfsync always pairs/s, {clients} client(s)", cell(x, 2), target,
                         met(x, lambda v: v >= 1) if clients == 1 else ""])
    out += ["\nPer-run ratios:\n", table(["comparison", "ratio", "target", "met"], comp)]
    return "\n".join(out)


def section_scale(d):
    lv, ch = d["levels"], d["churn"]
    out = ["## 4. Scale\n",
           "4a. pgbench, 1 client: try_acquire + release of a name never seen before, with this many distinct "
           "live leases present (inserted straight into `fenced_lock_internal.leases`, expiring in a day). "
           "Pair p50/p99 from pgbench's transaction log; try_acquire mean from `pgbench -r`.\n",
           table(["live leases", "lease table size", "pairs/s", "pair p50 ms", "pair p99 ms", "try_acquire mean ms"],
                 [[f"{r['live']:,}", f"{r['size'] / 1048576:,.1f} MB", cell(r["tps"]), cell(r["p50"]),
                   cell(r["p99"]), cell(r["acquire_mean"])] for r in lv])]
    s = ch["samples"]
    out += [f"\n4b. Churn: pgbench, 1 client, {ch['seconds']} s of grants of ever new names with ttl "
            f"{ch['ttl']}, never released. Records expired for more than 60 s are reaped by later grants; "
            "without that the table would hold one record per grant.\n",
            table(["t (s)", "grants so far", "records in table", "of them live", "heap size", "total size (with indexes)"],
                  [[f"{x['t']} (after the run)" if x["t"] > ch["seconds"] else x["t"], f"{x['grants']:,}", f"{x['records']:,}", f"{x['live']:,}",
                    f"{x['heap'] / 1048576:,.1f} MB", f"{x['size'] / 1048576:,.1f} MB"] for x in s])]
    out.append("\nRecords stop growing once the first grants are 60 s past expiry; the space they leave is "
               "reused after autovacuum (default settings) has visited the table, so the size levels off "
               "a minute or two later.")
    return "\n".join(out)


def section_waiting(d):
    out = ["## 5. Waiting\n",
           f"5a. Handoff on one name: waiters + 1 clients (threads, own connections) take the lock, hold it "
           f"{d['hold_ms']:g} ms, release, work {d['think_ms']:g} ms, queue again. Handoff = server clock from "
           "a release (its DELETE, before its commit) to the grant decision (`acquired_at`) of the first client "
           "that was already waiting; recorded by a history trigger the bench puts on "
           "`fenced_lock_internal.leases`.\n",
           table(["method", "waiters", "waiting at release (mean)", "handoff p50 ms", "handoff p99 ms",
                  "handoffs", "p50 < 5 ms"],
                 [[r["method"], r["waiters"], cell(r["mean_waiting"], 1), cell(r["p50"]), cell(r["p99"]),
                   r["handoffs"], met(r["p50"], lambda v: v < 5)] for r in d["handoff"]])]
    c = d["cpu"]
    out += [f"\n5b. CPU while {c[0]['waiters']} clients wait {c[0]['seconds']:g} s for a lock held all along: "
            "CPU time (utime+stime, read in ns from `/proc/<pid>/task/*/schedstat`) of their backends and of "
            "the one client process running their threads, as % of one core.\n",
            table(["method", "backends % core", "client % core", "total % core", "< 5 %"],
                  [[r["method"], cell(r["backends"], 2), cell(r["client"], 2), cell(r["total"], 2),
                    met(r["total"], lambda v: v < 5)] for r in c])]
    return "\n".join(out)


def header(meta):
    mode = ("**SMOKE RUN**: every script ran once with tiny counts; the numbers mean nothing."
            if SMOKE else f"full: each figure is the median [min-max] of {RUNS} runs of {SECONDS} s "
                          "(waiting: see its section), the rows of a table interleaved run by run.")
    return "\n".join([
        "# fenced_lock benchmarks (SPEC §9)\n",
        f"- run: {meta.get('started', '?')}, {mode}",
        f"- machine: {os.cpu_count()} CPUs ({meta.get('cpu', platform.processor())}), "
        f"load average at start {meta.get('load', '?')}; {platform.system()} {platform.release()}",
        f"- PostgreSQL: {meta.get('pg', '?')}, one server on 127.0.0.1, fsync=on, synchronous_commit=on, "
        "shared_buffers=256MB, everything else default",
        "- Timings are never pass/fail; the `met` columns only compare medians with the SPEC's targets.",
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
        a.set_xticklabels([textwrap.fill(n, 22) for n in names], fontsize=7)
        a.set_title(title)
        a.set_ylabel(ylabel)
        a.legend(fontsize=8)

    if "pairs" in data:
        bars(ax[0][0], data["pairs"]["rows"], "1. pairs/s (pgbench)", "pairs/s")
        ax[0][0].set_yscale("log")
    if "guarded" in data:
        bars(ax[0][1], data["guarded"]["rows"], "2. guarded UPDATE", "transactions/s")
    if "peers" in data:
        bars(ax[0][2], data["peers"]["rows"], "3. peers (Python clients)", "pairs/s")
        ax[0][2].set_yscale("log")
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
        a.set_xlabel("s")
        a.set_title("4b. churn (ttl 1 s, never released)")
        a.legend(fontsize=8, loc="upper left")
        a2 = a.twinx()
        a2.plot([x["t"] for x in s], [x["size"] / 1048576 for x in s], color="gray", marker=".",
                label="total size MB")
        a2.plot([x["t"] for x in s], [x["heap"] / 1048576 for x in s], color="silver", marker=".",
                label="heap size MB")
        a2.set_ylabel("MB (gray: total, silver: heap)")
        a2.set_ylim(bottom=0)
    if "waiting" in data:
        a = ax[1][2]
        for m in dict.fromkeys(r["method"] for r in data["waiting"]["handoff"]):
            rs = [r for r in data["waiting"]["handoff"] if r["method"] == m]
            short = "fenced_lock_acquire" if m.startswith("fenced") else "try_acquire + backoff"
            for f, style in (("p50", "-o"), ("p99", ":^")):
                a.plot([r["waiters"] for r in rs], [r[f]["median"] for r in rs], style, label=f"{short} {f}")
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel("waiters")
        a.set_ylabel("handoff ms")
        a.axhline(5, color="red", lw=0.8, ls="--")
        cpu = "; ".join(f"{'acquire' if r['method'].startswith('fenced') else 'backoff'}: "
                        f"{r['total']['median']:.2f}% core" for r in data["waiting"]["cpu"])
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
    parts = [header(meta)]
    render = {"pairs": section_pairs, "guarded": section_guarded, "peers": section_peers,
              "scale": section_scale, "waiting": section_waiting}
    for s in SECTIONS:
        if s in data:
            parts.append(render[s](data[s]))
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
