"""Table 4: scale.

4a. try_acquire + release latency (pgbench, 1 client) with 1 thousand, 100
    thousand and 1 million distinct live leases present. The leases are
    written straight into the extension's lease records as superuser (tokens
    from its own sequence, owner postgres, expiring in a day), and into its
    lease history too where there is one, as granting them would have.
4b. Lease state under churn: grants of ever new names with a 1 s ttl that are
    never released, for longer than the 60 s after which expired records are
    reaped by later grants. The table's size is sampled while it runs, and
    the history's, kept for 60 s (fenced_lock.history_retention) where the
    extension keeps one, so that its bound shows within the run.
"""

import os
import subprocess
import time

from benchlib import (DURABLE, HERE, PG_PORT, PGBENCH, SMOKE, connect, database_setting, fresh_database,
                      interleaved, log, pgbench, save, summary)
from costs import Meter, summarize_costs

LEVELS = [1_000, 2_000, 5_000] if SMOKE else [1_000, 100_000, 1_000_000]
CHURN_SECONDS = 2 if SMOKE else int(os.environ.get("FL_BENCH_CHURN_SECONDS", "150"))
SAMPLE_EVERY = 1 if SMOKE else 15


def tables(c):
    """The lease records table (`lease_records` since 0.2.0, `leases` before)
    and the lease history table, None before 0.2.0."""
    return c.execute("SELECT coalesce(to_regclass('fenced_lock_internal.granted_leases'),"
                     "                to_regclass('fenced_lock_internal.leases'))::text,"
                     "       to_regclass('fenced_lock_internal.lease_history')::text").fetchone()


def insert_leases(c, prefix, lo, hi, acquired, expires, ttl):
    """Lease records `prefix || g` for g in lo..hi, owner postgres (a lease
    that has not ended has no history row: the history view shows its record)."""
    records, _ = tables(c)
    sql = f"""
        INSERT INTO {records} (name, token, holder, owner, acquired_at, expires_at, ttl)
        SELECT %(p)s || g, nextval('fenced_lock_internal.token_seq'), NULL, 'postgres'::regrole,
               now() + %(a)s::interval, now() + %(e)s::interval, %(t)s::interval
          FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) g
        """
    c.execute(sql, {"p": prefix, "lo": lo, "hi": hi, "a": acquired, "e": expires, "t": ttl})


def fill(c, upto, have):
    insert_leases(c, "fill:", have + 1, upto, "0 s", "1 day", "1 day")
    c.execute("VACUUM ANALYZE")
    c.execute("CHECKPOINT")


def records(c):
    """(records, live records, total size, heap size, last token, history
    rows, history total size); the last two None without a history"""
    t, h = tables(c)
    hist = f"(SELECT count(*) FROM {h}), pg_total_relation_size('{h}')" if h else "NULL::bigint, NULL::bigint"
    return c.execute(f"""
        SELECT count(*), count(*) FILTER (WHERE expires_at > clock_timestamp()),
               pg_total_relation_size('{t}'), pg_relation_size('{t}'),
               (SELECT last_value FROM fenced_lock_internal.token_seq), {hist}
          FROM {t}""").fetchone()


def latency_by_size(meter):
    db = "bench_scale"
    fresh_database(db)
    rows = []
    have = 0
    with connect(db) as c:
        for level in LEVELS:
            log(f"scale: {level} live leases")
            fill(c, level, have)
            have = level
            runs = interleaved(["pair"], lambda _: meter.run(
                lambda: pgbench(db, HERE / "pgbench" / "scale_pair.sql", 1, tag="scale", statements=True),
                ["pg"], lambda r: r["n"]))["pair"]
            n, live, size = records(c)[:3]
            if live < level:
                raise RuntimeError(f"scale: expected {level} live leases, found {live}")
            rows.append({"records": n, "live": live, "size": size,
                         "tps": summary([r["tps"] for r in runs]),
                         "p50": summary([r["p50"] for r in runs]),
                         "p99": summary([r["p99"] for r in runs]),
                         "acquire_mean": summary([r["statements"].get("fenced_lock_try_acquire")
                                                  for r in runs]),
                         "costs": summarize_costs(runs)})
    return rows


def sample(c, t0, tok0):
    n, live, size, heap, tok, hist, hist_size = records(c)
    return {"t": round(time.monotonic() - t0), "records": n, "live": live, "size": size, "heap": heap,
            "grants": tok - tok0, "history": hist, "history_size": hist_size}


def churn(meter):
    db = "bench_churn"
    fresh_database(db)
    retention = "60 s" if database_setting(db, "fenced_lock.history_retention", 60) else None
    log(f"scale: churn for {CHURN_SECONDS} s")
    with connect(db) as c:
        if SMOKE:
            # Records long expired, so that the short smoke run reaps something.
            insert_leases(c, "old:", 1, 100, "-3 min", "-2 min", "1 min")
        tok0 = records(c)[4]
        samples = [sample(c, time.monotonic(), tok0)]

        def run():
            bench = subprocess.Popen(
                [PGBENCH, "-n", "-M", "prepared", "-h", "127.0.0.1", "-p", str(PG_PORT), "-U", "postgres",
                 "-c", "1", "-j", "1", "-T", str(CHURN_SECONDS), "-f", str(HERE / "pgbench" / "churn.sql"), db],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            t0 = time.monotonic()
            while True:
                time.sleep(SAMPLE_EVERY - (time.monotonic() - t0) % SAMPLE_EVERY)
                if bench.poll() is not None:
                    break
                samples.append(sample(c, t0, tok0))
            output = bench.stdout.read()
            if bench.returncode != 0 or "aborted" in output:
                raise RuntimeError(f"churn pgbench failed:\n{output}")
            samples.append(sample(c, t0, tok0))
            return {"grants": samples[-1]["grants"]}

        costs = meter.run(run, ["pg"], lambda r: r["grants"])["costs"]
        reaped_old = c.execute(f"SELECT count(*) FROM {tables(c)[0]} WHERE name LIKE 'old:%'"
                               ).fetchone()[0] if SMOKE else None
    return {"seconds": CHURN_SECONDS, "ttl": "1 s", "samples": samples, "history_retention": retention,
            "smoke_old_records_left": reaped_old, "costs": summarize_costs([{"costs": costs}])}


def main():
    meter = Meter()
    try:
        save("scale", {"durability": DURABLE, "levels": latency_by_size(meter), "churn": churn(meter)})
    finally:
        meter.close()


if __name__ == "__main__":
    main()
