"""The charts of the bench report (bench/results/latest.png and
latest_e2e.png), drawn with matplotlib from the results report.py reads."""

import textwrap

from benchlib import SMOKE
from figures import FL, QUEUE, med


def bars(a, rows, title, ylabel, label="clients"):
    names = list(dict.fromkeys(r["row"] for r in rows))
    groups = sorted({r[label] for r in rows}) if label == "clients" else list(dict.fromkeys(r[label] for r in rows))
    w = 0.8 / len(groups)
    for j, g in enumerate(groups):
        xs, ys, lo, hi = [], [], [], []
        for i, n in enumerate(names):
            r = next((r for r in rows if r["row"] == n and r[label] == g), None)
            if r:
                xs.append(i + j * w)
                ys.append(r["tps"]["median"])
                lo.append(r["tps"]["median"] - r["tps"]["min"])
                hi.append(r["tps"]["max"] - r["tps"]["median"])
        a.bar(xs, ys, w, yerr=[lo, hi], capsize=3, label=f"{g} client(s)" if label == "clients" else g)
    a.set_xticks([i + w * (len(groups) - 1) / 2 for i in range(len(names))])
    a.set_xticklabels([textwrap.fill(n, 14) for n in names], fontsize=7)
    a.set_title(title)
    a.set_ylabel(ylabel)
    a.legend(fontsize=8)


def chart(data, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 3, figsize=(18, 10))
    if "pairs" in data:
        rows = [r for r in data["pairs"]["rows"] if r["view"] == "fair"]
        bars(ax[0][0], [r for r in rows if not r["peer"]], "1. lock + unlock pairs/s (pgbench)", "pairs/s")
        ax[0][0].set_yscale("log")
        bars(ax[0][2], [r for r in rows if r["peer"] or r["row"] == FL], "3. peers", "pairs/s")
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
    plt.close(fig)


def chart_e2e(d, path):
    """Sales/s of every row in every shape; CPU per sale; sales lost in the pause shape."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = d["shapes"]
    fig, ax = plt.subplots(1, 3, figsize=(20, 6.5), gridspec_kw={"width_ratios": [3, 2, 2]})
    rows = [dict(r, shape=s["label"]) for s in shapes for r in s["rows"]]
    bars(ax[0], rows, "6. sales/s: lock, read, write stock - 1, unlock", "sales/s", label="shape")
    ax[0].set_yscale("log")
    hot = shapes[0]  # the shape where nobody waits: what a sale costs
    names = [r["row"] for r in hot["rows"]]
    bottom = [0.0] * len(names)
    for what, get in (("client", lambda r: med(r["costs"], "client", "cpu_us")),
                      ("PostgreSQL", lambda r: med(r["costs"], "pg", "cpu_us")),
                      ("Redis / etcd", lambda r: sum(med(r["costs"], s, "cpu_us") or 0 for s in r["servers"]
                                                    if s != "pg"))):
        ys = [get(r) or 0 for r in hot["rows"]]
        ax[1].bar(range(len(names)), ys, 0.6, bottom=bottom, label=what)
        bottom = [b + y for b, y in zip(bottom, ys)]
    ax[1].set_xticks(range(len(names)))
    ax[1].set_xticklabels([textwrap.fill(n, 14) for n in names], fontsize=7)
    ax[1].set_ylabel("CPU µs per sale")
    ax[1].set_title(f"CPU per sale, {hot['label']}", fontsize=10)
    ax[1].legend(fontsize=8)
    pause = next((s for s in shapes if s["key"] == "pause"), None)
    if pause:
        ys = [r["lost_total"] for r in pause["rows"]]
        ax[2].bar(range(len(ys)), ys, 0.6, color=["tab:green" if y == 0 else "tab:red" for y in ys])
        for i, (y, r) in enumerate(zip(ys, pause["rows"])):
            ax[2].text(i, y, f"{y:,}\nof {r['acknowledged']:,}", ha="center", va="bottom", fontsize=7)
        ax[2].set_xticks(range(len(ys)))
        ax[2].set_xticklabels([textwrap.fill(r["row"], 14) for r in pause["rows"]], fontsize=7)
        ax[2].set_ylabel("sales lost (acknowledged - stock sold), all runs")
        ax[2].set_title("ttl 1 s, 1 critical section in 200 pauses 1.5 s", fontsize=10)
    fig.suptitle("fenced_lock: the end-to-end critical section" + (" (SMOKE: meaningless numbers)" if SMOKE else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
