"""Tables 1 and 3: lock + unlock pairs per second, with what each pair
costs the client and the server. fenced_lock beside a PL/pgSQL lease table,
two floors and advisory locks (table 1), and beside Redis and etcd (table 3).

Each row is driven by the lightest client we have for its protocol, and the
client's CPU per pair is shown so that a reader can see the comparison is
fair: pgbench -M prepared (C, libpq) for every PostgreSQL row, flbench with
a blocking redis-rs connection per OS thread for Redis, flbench's tokio
etcd-client (gRPC) for etcd. Each client has its own connection and names
of its own (a pool of 1000), so clients never contend. A second view drives
fenced_lock, the one-commit floor and Redis `always` through flbench's tokio
clients, as the bench did before: the ratio moves with the client, which is
why the headline ratios come from the first view.

Every row at 1 and 8 clients runs interleaved (run 1 of every row, then run
2, ...), so the fenced_lock runs serve both tables and report.py takes
every ratio run by run.
"""

import subprocess

from benchlib import (DURABLE, HERE, connect, database_setting, dsn, flbench_pairs, fresh_database,
                      interleaved, log, pgbench, run_sql_file, save, summarize_runs)
from costs import Meter, summarize_costs

DB, DB_NOHIST = "bench_pairs", "bench_pairs_nohist"
CLIENTS = [1, 8]
SYNC_OFF = "-c synchronous_commit=off"
PGB = "pgbench -M prepared (C, libpq)"
ETCD_URL = "http://127.0.0.1:2390"


def pgb(script, db=DB, options=None):
    """A pgbench row: run(clients, meter, servers), measured as a whole."""
    return lambda clients, meter, servers: meter.run(
        lambda: pgbench(db, HERE / "pgbench" / script, clients, tag="pairs", options=options),
        servers, lambda res: res["n"])


def flb(*args):
    """A flbench row, measured over its window."""
    return lambda clients, meter, servers: flbench_pairs(*args, clients=clients, meter=meter, servers=servers)


ROWS = {  # row: (run at n clients, servers it uses, client, durability, view)
    "fenced_lock": (pgb("pair_fenced.sql"), ["pg"], PGB, DURABLE, "fair"),
    "fenced_lock, history off": (pgb("pair_fenced.sql", DB_NOHIST), ["pg"], PGB,
                                 DURABLE + "; fenced_lock.history_retention = 0", "fair"),
    "PL/pgSQL lease table": (pgb("pair_plpgsql.sql"), ["pg"], PGB,
                             DURABLE + " (forced per grant and release)", "fair"),
    "floor: 1 durable commit": (pgb("pair_floor1.sql", options=SYNC_OFF), ["pg"], PGB,
                                "INSERT flushed; DELETE with synchronous_commit=off", "fair"),
    "floor: 2 durable commits": (pgb("pair_floor2.sql"), ["pg"], PGB, DURABLE, "fair"),
    "pg_advisory_lock/unlock": (pgb("pair_advisory.sql"), ["pg"], PGB, "none (in memory)", "fair"),
    "Redis, appendfsync always": (flb("pairs-redis", "--port", 6390, "--client", "sync"), ["redis_always"],
                                  "flbench, blocking redis-rs per thread", "AOF, fsync before the reply", "fair"),
    "Redis, appendfsync everysec": (flb("pairs-redis", "--port", 6391, "--client", "sync"), ["redis_everysec"],
                                    "flbench, blocking redis-rs per thread",
                                    "AOF, fsync once a second (may lose 1 s)", "fair"),
    "etcd v3 Lock/Unlock with a lease": (flb("pairs-etcd", "--endpoint", ETCD_URL), ["etcd"],
                                         "flbench, tokio etcd-client (gRPC)",
                                         "WAL fsync before the reply (etcd default)", "fair"),
    "fenced_lock (flbench)": (flb("pairs-pg", "--dsn", dsn(DB), "--kind", "fenced"), ["pg"],
                              "flbench, tokio-postgres", DURABLE, "flbench"),
    "floor: 1 durable commit (flbench)": (flb("pairs-pg", "--dsn", dsn(DB), "--kind", "floor1"), ["pg"],
                                          "flbench, tokio-postgres",
                                          "INSERT flushed; DELETE with synchronous_commit=off", "flbench"),
    "Redis, appendfsync always (flbench)": (flb("pairs-redis", "--port", 6390), ["redis_always"],
                                            "flbench, tokio redis-rs (multiplexed)", "AOF, fsync before the reply",
                                            "flbench"),
}
PEERS = ["Redis, appendfsync always", "Redis, appendfsync everysec", "etcd v3 Lock/Unlock with a lease"]


def history_off():
    """DB_NOHIST keeps no lease history: returns why the row is skipped, or None."""
    fresh_database(DB_NOHIST)
    if not database_setting(DB_NOHIST, "fenced_lock.history_retention", 0):
        return "skipped: this build of fenced_lock has no fenced_lock.history_retention"
    return None


def setup_db(db):
    with connect(db) as c:
        c.execute('CREATE TABLE IF NOT EXISTS bench_floor (name text COLLATE "C" PRIMARY KEY, token bigint NOT NULL)')


def main():
    fresh_database(DB)
    run_sql_file(DB, HERE / "baseline_plpgsql.sql")
    setup_db(DB)
    skipped = history_off()
    rows = [r for r in ROWS if not (skipped and r == "fenced_lock, history off")]

    subprocess.run(["bash", str(HERE / "servers.sh"), "start", "peers"], check=True)
    meter = Meter()
    try:
        log(f"pairs: {len(rows)} rows at {CLIENTS} clients, interleaved")
        runs = interleaved([(r, c) for r in rows for c in CLIENTS],
                           lambda key: ROWS[key[0]][0](key[1], meter, ROWS[key[0]][1]))
    finally:
        meter.close()
        subprocess.run(["bash", str(HERE / "servers.sh"), "stop", "peers"], check=False)

    # Every release succeeded: nothing is left behind.
    with connect(DB) as c:
        left = c.execute("SELECT (SELECT count(*) FROM fenced_lock_leases WHERE live),"
                         " (SELECT count(*) FROM plpgsql_lease.leases), (SELECT count(*) FROM bench_floor)").fetchone()
    if not skipped:
        with connect(DB_NOHIST) as c:
            left += c.execute("SELECT count(*) FROM fenced_lock_leases WHERE live").fetchone()
    if any(left):
        raise RuntimeError(f"pairs: records left behind (fenced_lock, PL/pgSQL, floor[, history off]) = {left}")
    save("pairs", {"rows": [{"row": r, "clients": c, "servers": ROWS[r][1], "client": ROWS[r][2],
                             "durability": ROWS[r][3], "view": ROWS[r][4], "peer": r.split(" (")[0] in PEERS,
                             **summarize_runs(runs[(r, c)]), "costs": summarize_costs(runs[(r, c)])}
                            for c in CLIENTS for r in rows],
                   "history_off": skipped})


if __name__ == "__main__":
    main()
