"""Table 4: scale.

4a. try_acquire + release latency (pgbench, 1 client) with 1 thousand, 100
    thousand and 1 million distinct live leases present. The leases are
    written straight into fenced_lock_internal.leases as superuser (tokens
    from the extension's own sequence, owner postgres, expiring in a day).
4b. Lease state under churn: grants of ever new names with a 1 s ttl that are
    never released, for longer than the 60 s after which expired records are
    reaped by later grants. The table's size is sampled while it runs.
"""

import os
import subprocess
import time

from benchlib import (DURABLE, HERE, PG_PORT, PGBENCH, SMOKE, connect, fresh_database, interleaved,
                      log, pgbench, save, summary)

LEVELS = [1_000, 2_000, 5_000] if SMOKE else [1_000, 100_000, 1_000_000]
CHURN_SECONDS = 2 if SMOKE else int(os.environ.get("FL_BENCH_CHURN_SECONDS", "150"))
SAMPLE_EVERY = 1 if SMOKE else 15


def fill(c, upto, have):
    c.execute("""
        INSERT INTO fenced_lock_internal.leases (name, token, holder, owner, acquired_at, expires_at, ttl)
        SELECT 'fill:' || g, nextval('fenced_lock_internal.token_seq'), NULL, 'postgres'::regrole,
               now(), now() + interval '1 day', interval '1 day'
          FROM generate_series(%s::bigint, %s::bigint) g""", (have + 1, upto))
    c.execute("VACUUM ANALYZE fenced_lock_internal.leases")
    c.execute("CHECKPOINT")


def records(c):
    """(records, live records, total size, heap size, last token)"""
    return c.execute("""
        SELECT count(*), count(*) FILTER (WHERE expires_at > clock_timestamp()),
               pg_total_relation_size('fenced_lock_internal.leases'),
               pg_relation_size('fenced_lock_internal.leases'),
               (SELECT last_value FROM fenced_lock_internal.token_seq)
          FROM fenced_lock_internal.leases""").fetchone()


def latency_by_size():
    db = "bench_scale"
    fresh_database(db)
    rows = []
    have = 0
    with connect(db) as c:
        for level in LEVELS:
            log(f"scale: {level} live leases")
            fill(c, level, have)
            have = level
            runs = interleaved(["pair"], lambda _: pgbench(db, HERE / "pgbench" / "scale_pair.sql", 1,
                                                          tag="scale", statements=True))["pair"]
            n, live, size, _, _ = records(c)
            if live < level:
                raise RuntimeError(f"scale: expected {level} live leases, found {live}")
            rows.append({"records": n, "live": live, "size": size,
                         "tps": summary([r["tps"] for r in runs]),
                         "p50": summary([r["p50"] for r in runs]),
                         "p99": summary([r["p99"] for r in runs]),
                         "acquire_mean": summary([r["statements"].get("fenced_lock_try_acquire")
                                                  for r in runs])})
    return rows


def sample(c, t0, tok0):
    n, live, size, heap, tok = records(c)
    return {"t": round(time.monotonic() - t0), "records": n, "live": live, "size": size, "heap": heap,
            "grants": tok - tok0}


def churn():
    db = "bench_churn"
    fresh_database(db)
    log(f"scale: churn for {CHURN_SECONDS} s")
    with connect(db) as c:
        if SMOKE:
            # Records long expired, so that the short smoke run reaps something.
            c.execute("""
                INSERT INTO fenced_lock_internal.leases (name, token, holder, owner, acquired_at, expires_at, ttl)
                SELECT 'old:' || g, nextval('fenced_lock_internal.token_seq'), NULL, 'postgres'::regrole,
                       now() - interval '3 min', now() - interval '2 min', interval '1 min'
                  FROM generate_series(1, 100) g""")
        n0, _, size0, heap0, tok0 = records(c)
        samples = [{"t": 0, "records": n0, "live": 0, "size": size0, "heap": heap0, "grants": 0}]
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
        reaped_old = c.execute("SELECT count(*) FROM fenced_lock_internal.leases WHERE name LIKE 'old:%'"
                               ).fetchone()[0] if SMOKE else None
    return {"seconds": CHURN_SECONDS, "ttl": "1 s", "samples": samples,
            "smoke_old_records_left": reaped_old}


def main():
    save("scale", {"durability": DURABLE, "levels": latency_by_size(), "churn": churn()})


if __name__ == "__main__":
    main()
