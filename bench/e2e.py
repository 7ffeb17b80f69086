"""Table 6: the end-to-end critical section, the job users run: take the
item's lock, read its stock, write stock - 1, let the lock go.

Every row is driven by flbench `sale` (bench/client/src/sale.rs): one OS
thread per worker, each with its own blocking connections, libpq for
PostgreSQL and redis-rs or etcd-client for the lock service. Rows:

  fenced3      fenced_lock_acquire; SELECT stock; guarded UPDATE; fenced_lock_release
               (three transactions: the acquire, the UPDATE and the release commit)
  fenced1      BEGIN; fenced_lock_acquire; SELECT; guarded UPDATE; fenced_lock_release; COMMIT
  redis        SET NX PX (polled every 1 ms while held); SELECT; UPDATE; compare-and-delete
  redis_fence  the same with a fencing token: one Lua script does SET NX PX and INCR,
               the UPDATE carries the token and matches only if fence < token
  etcd         etcd's Lock (v3lock: a key under the name with the worker's lease,
               granted when it has the lowest revision); SELECT; UPDATE; Unlock
  plpgsql      plpgsql_lease.try_acquire (bench/baseline_plpgsql.sql, polled every 1 ms);
               SELECT; UPDATE; plpgsql_lease.release
  forupdate    BEGIN; SELECT ... FOR UPDATE; UPDATE; COMMIT: no lease at all

Shapes: 8 workers on 1,000 items (contention is rare), 16 workers on 1 hot item
(handoff decides), and the hot item with a 1 s ttl where one critical
section in 200 sleeps 1.5 s between its read and its write, as a GC pause
would. Every sale is checked against the stock the table has left, item by
item: in the first two shapes any difference fails the bench; in the third
it is the figure, the sales lost.
"""

import os
import subprocess

from benchlib import (DURABLE, HERE, SMOKE, connect, dsn, flbench, fresh_database, interleaved, log,
                      run_sql_file, save, summary)
from costs import Meter, summarize_costs

DB = "bench_e2e"
STOCK = 1_000_000_000
RUNS = 1 if SMOKE else int(os.environ.get("FL_BENCH_E2E_RUNS", "3"))
SECONDS = int(os.environ.get("FL_BENCH_E2E_SECONDS", "5"))
SMOKE_SALES = 10  # per worker

ROWS = {  # key: (label, servers it uses, what one critical section is)
    "fenced3": ("fenced_lock, three transactions", ["pg"],
                "acquire; SELECT; guarded UPDATE; release: 4 round trips, 3 commits (2 flushed)"),
    "fenced1": ("fenced_lock, one transaction", ["pg"],
                "BEGIN; acquire; SELECT; guarded UPDATE; release; COMMIT: 6 round trips, 1 commit"),
    "redis": ("Redis lock + write, no fence", ["pg", "redis_always"],
              "SET NX PX; SELECT; UPDATE; compare-and-delete: 2 Redis + 2 PostgreSQL round trips"),
    "redis_fence": ("Redis lock + write, app-side fence", ["pg", "redis_always"],
                    "SET NX PX + INCR (one script); SELECT; UPDATE ... WHERE fence < token; "
                    "compare-and-delete"),
    "etcd": ("etcd lock + write", ["pg", "etcd"],
             "Lock (worker's lease, kept alive); SELECT; UPDATE; Unlock: 2 etcd + 2 PostgreSQL round trips"),
    "plpgsql": ("PL/pgSQL lease table + write", ["pg"],
                "try_acquire (polled); SELECT; UPDATE; release: 4 round trips, 3 commits"),
    "forupdate": ("SELECT ... FOR UPDATE, one transaction", ["pg"],
                  "BEGIN; SELECT ... FOR UPDATE; UPDATE; COMMIT: 4 round trips, 1 commit"),
}
SHAPES = {  # key: (label, flbench options)
    "spread": ("8 workers, 1,000 items", {"workers": 8, "items": 1000, "ttl-ms": 30_000}),
    "hot": ("16 workers, 1 hot item", {"workers": 16, "items": 1, "ttl-ms": 30_000}),
    "pause": ("16 workers, 1 hot item, ttl 1 s, 1 in 200 pauses 1.5 s",
              {"workers": 16, "items": 1, "ttl-ms": 1000, "pause-one-in": 200, "pause-ms": 1500}),
}
FENCED = ("fenced3", "fenced1")


def setup():
    fresh_database(DB)
    run_sql_file(DB, HERE / "baseline_plpgsql.sql")
    with connect(DB) as c:
        for r in ROWS:
            # The rows go in before the guard exists: they need no lease.
            c.execute(f"CREATE TABLE sale_{r} (item int PRIMARY KEY, stock bigint NOT NULL,"
                      " fence bigint NOT NULL DEFAULT 0)")
            c.execute(f"INSERT INTO sale_{r} (item, stock) SELECT g, {STOCK} FROM generate_series(1, 1000) g")
            if r in FENCED:
                c.execute(f"CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON sale_{r} FOR EACH ROW"
                          f" EXECUTE FUNCTION fenced_lock_guard('sale_{r}:{{item}}', 'fence')")
        c.execute("VACUUM ANALYZE")


def stocks(c, row, items):
    return [s for (s,) in c.execute(f"SELECT stock FROM sale_{row} WHERE item <= %s ORDER BY item", (items,))]


def main():
    setup()
    subprocess.run(["bash", str(HERE / "servers.sh"), "start", "peers"], check=True)
    meter = Meter()
    out = {"durability": DURABLE, "runs": RUNS, "seconds": None if SMOKE else SECONDS, "shapes": []}
    try:
        with connect(DB) as c:
            for shape, (label, opts) in SHAPES.items():
                opts = dict(opts)
                if SMOKE and "pause-one-in" in opts:
                    # one short pause per row, at once, outlasting a short ttl: the code
                    # paths of the shape in a fraction of a second
                    opts.update({"pause-one-in": 1, "max-pauses": 1, "ttl-ms": 200, "pause-ms": 300})
                length = {"count": SMOKE_SALES} if SMOKE else {"seconds": SECONDS}

                def one(row):
                    before = stocks(c, row, opts["items"])
                    r = flbench("sale", row=row, name=f"sale_{row}", dsn=dsn(DB), meter=meter,
                                servers=ROWS[row][1], **opts, **length)
                    after = stocks(c, row, opts["items"])
                    sold = [b - a for b, a in zip(before, after)]
                    acks = r.pop("acks")
                    over = [i + 1 for i, (s, a) in enumerate(zip(sold, acks)) if s > a]
                    lost = sum(acks) - sum(sold)
                    if over:
                        raise RuntimeError(f"e2e {shape} {row}: stock fell by more than the sales on items {over[:5]}")
                    if lost and shape != "pause":
                        raise RuntimeError(f"e2e {shape} {row}: {lost} acknowledged sales are not in the stock")
                    return dict(r, lost=lost, acknowledged=sum(acks))

                if SMOKE:
                    label += " (smoke: " + ", ".join(f"{k} {v}" for k, v in opts.items()) + ")"
                log(f"e2e: {label}, {len(ROWS)} rows, interleaved")
                runs = interleaved(list(ROWS), one, RUNS)
                rows = []
                for row, (name, servers, what) in ROWS.items():
                    rs = runs[row]
                    rows.append({"key": row, "row": name, "servers": servers, "what": what,
                                 "tps": summary([r["per_s"] for r in rs]),
                                 "p50": summary([r["p50_ms"] for r in rs]),
                                 "p99": summary([r["p99_ms"] for r in rs]),
                                 "lost": summary([r["lost"] for r in rs]),
                                 "lost_total": sum(r["lost"] for r in rs),
                                 "acknowledged": sum(r["acknowledged"] for r in rs),
                                 "fenced_off": sum(r["fenced_off"] for r in rs),
                                 "pauses": sum(r["pauses"] for r in rs),
                                 "costs": summarize_costs(rs)})
                out["shapes"].append({"key": shape, "label": label, "options": opts, "rows": rows})
    finally:
        meter.close()
        subprocess.run(["bash", str(HERE / "servers.sh"), "stop", "peers"], check=False)
    with connect(DB) as c:
        left = c.execute("SELECT count(*) FROM fenced_lock_leases WHERE live AND expires_at > now() + '2 s'"
                         ).fetchone()[0]
    if left:
        raise RuntimeError(f"e2e: {left} live leases left behind")
    save("e2e", out)


if __name__ == "__main__":
    main()
