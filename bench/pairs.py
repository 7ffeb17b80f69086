"""Tables 1 and 3: lock + unlock pairs per second. fenced_lock beside a
PL/pgSQL lease table, two floors and advisory locks (table 1), and beside
Redis and etcd (table 3).

Every row is driven by the same compiled client, flbench (bench/client):
one connection and one task per client, each client on names of its own (a
pool of 1000), so clients never contend. All rows at 1 and 8 clients run
interleaved (run 1 of every row, then run 2, ...), so the fenced_lock runs
serve both tables and report.py takes every ratio run by run.
"""

import subprocess

from benchlib import (DURABLE, HERE, connect, database_setting, dsn, flbench_pairs, fresh_database,
                      interleaved, log, run_sql_file, save, summarize_runs)

DB, DB_NOHIST = "bench_pairs", "bench_pairs_nohist"
CLIENTS = [1, 8]
ROWS = {  # row: (flbench arguments, durability)
    "fenced_lock": (["pairs-pg", "--dsn", dsn(DB), "--kind", "fenced"], DURABLE),
    "fenced_lock, history off": (["pairs-pg", "--dsn", dsn(DB_NOHIST), "--kind", "fenced"],
                                 DURABLE + "; fenced_lock.history_retention = 0"),
    "PL/pgSQL lease table": (["pairs-pg", "--dsn", dsn(DB), "--kind", "plpgsql"],
                             DURABLE + " (forced per grant and release)"),
    "floor: 1 durable commit": (["pairs-pg", "--dsn", dsn(DB), "--kind", "floor1"],
                                "INSERT flushed; DELETE with synchronous_commit=off"),
    "floor: 2 durable commits": (["pairs-pg", "--dsn", dsn(DB), "--kind", "floor2"], DURABLE),
    "pg_advisory_lock/unlock": (["pairs-pg", "--dsn", dsn(DB), "--kind", "advisory"], "none (in memory)"),
    "Redis, appendfsync always": (["pairs-redis", "--port", 6390], "AOF, fsync before the reply"),
    "Redis, appendfsync everysec": (["pairs-redis", "--port", 6391], "AOF, fsync once a second (may lose 1 s)"),
    "etcd v3 Lock/Unlock with a lease": (["pairs-etcd", "--endpoint", "http://127.0.0.1:2390"],
                                         "WAL fsync before the reply (etcd default)"),
}
PEERS = ["Redis, appendfsync always", "Redis, appendfsync everysec", "etcd v3 Lock/Unlock with a lease"]


def history_off():
    """DB_NOHIST keeps no lease history: returns why the row is skipped, or None."""
    fresh_database(DB_NOHIST)
    if not database_setting(DB_NOHIST, "fenced_lock.history_retention", 0):
        return "skipped: this build of fenced_lock has no fenced_lock.history_retention"
    return None


def main():
    fresh_database(DB)
    run_sql_file(DB, HERE / "baseline_plpgsql.sql")
    with connect(DB) as c:
        c.execute('CREATE TABLE bench_floor (name text COLLATE "C" PRIMARY KEY, token bigint NOT NULL)')
    skipped = history_off()
    rows = [r for r in ROWS if not (skipped and r == "fenced_lock, history off")]

    subprocess.run(["bash", str(HERE / "servers.sh"), "start", "peers"], check=True)
    try:
        log(f"pairs: {len(rows)} rows at {CLIENTS} clients, interleaved")
        runs = interleaved([(r, c) for r in rows for c in CLIENTS],
                           lambda key: flbench_pairs(*ROWS[key[0]][0], clients=key[1]))
    finally:
        subprocess.run(["bash", str(HERE / "servers.sh"), "stop", "peers"], check=False)

    # Every release succeeded: nothing is left behind.
    with connect(DB) as c:
        left = c.execute("SELECT (SELECT count(*) FROM fenced_lock_leases WHERE live),"
                         " (SELECT count(*) FROM plpgsql_lease.leases),"
                         " (SELECT count(*) FROM bench_floor)").fetchone()
    if any(left):
        raise RuntimeError(f"pairs: records left behind (fenced_lock, PL/pgSQL, floor) = {left}")
    save("pairs", {"rows": [{"row": r, "clients": c, "durability": ROWS[r][1], "peer": r in PEERS,
                             **summarize_runs(runs[(r, c)])} for c in CLIENTS for r in rows],
                   "history_off": skipped})


if __name__ == "__main__":
    main()
