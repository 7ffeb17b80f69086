"""Table 1: try_acquire + release pairs/s and latency, fenced_lock beside the
PL/pgSQL baseline, the floor (two minimal durable commits) and advisory locks.
pgbench, loopback TCP, prepared statements, 1 and 8 clients."""

from benchlib import (DURABLE, HERE, connect, fresh_database, interleaved, log, pgbench,
                      ratio_runs, run_sql_file, save, summarize_runs)

DB = "bench_pairs"
ROWS = [
    ("fenced_lock", "pair_fenced_lock.sql", DURABLE),
    ("plpgsql baseline", "pair_baseline.sql", DURABLE + " (forced per grant)"),
    ("floor: 2 durable commits", "pair_floor.sql", DURABLE),
    ("pg_advisory_lock/unlock", "pair_advisory.sql", "none (in memory)"),
]
CLIENTS = [1, 8]


def main():
    fresh_database(DB)
    run_sql_file(DB, HERE / "baseline_plpgsql.sql")
    with connect(DB) as c:
        c.execute('CREATE TABLE bench_floor (name text COLLATE "C" PRIMARY KEY, token bigint NOT NULL)')

    out = {"rows": []}
    for clients in CLIENTS:
        log(f"pairs: {clients} client(s)")
        runs = interleaved([r[0] for r in ROWS],
                           lambda row: pgbench(DB, HERE / "pgbench" / dict((r[0], r[1]) for r in ROWS)[row],
                                               clients, tag="pairs"))
        for row, _, durability in ROWS:
            out["rows"].append({"row": row, "clients": clients, "durability": durability,
                                **summarize_runs(runs[row])})
        out.setdefault("ratios", []).append({
            "clients": clients,
            "fenced_vs_floor": ratio_runs(runs["fenced_lock"], runs["floor: 2 durable commits"]),
            "fenced_vs_baseline": ratio_runs(runs["fenced_lock"], runs["plpgsql baseline"]),
        })

    # Every release succeeded: no lease and no floor row is left behind.
    with connect(DB) as c:
        left = c.execute("SELECT (SELECT count(*) FROM fenced_lock_internal.leases),"
                         " (SELECT count(*) FROM plpgsql_lease.leases),"
                         " (SELECT count(*) FROM bench_floor)").fetchone()
    if any(left):
        raise RuntimeError(f"pairs: records left behind (fenced_lock, baseline, floor) = {left}")
    save("pairs", out)


if __name__ == "__main__":
    main()
