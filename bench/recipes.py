"""Table 7: the recipes of fenced_lock 0.3.0, each beside the exclusive lease
it is measured against. pgbench -M prepared (C, libpq), each call its own
transaction, with the client and server costs of every row.

  shared pair       try_acquire(shared => true) + release, on the client's own
                    names, beside the exclusive pair (pair_fenced.sql)
  permit pair       8 clients on one name with permits => 8: acquire + release,
                    beside 8 clients each on a name of its own (acquire + release)
  acquire_all       try_acquire_all of 2 and of 8 names + release_all

On a server whose fenced_lock is older than 0.3.0 the section records why it
was skipped, and the report says so instead of showing figures.
"""

from benchlib import DURABLE, HERE, connect, fresh_database, interleaved, log, pgbench, save, summarize_runs
from costs import Meter, summarize_costs

DB = "bench_recipes"
NEEDS = (0, 3, 0)
ROWS = {  # row: (pgbench script, client counts, names per operation)
    "exclusive pair": ("pair_fenced.sql", [1, 8], 1),
    "shared pair": ("pair_shared.sql", [1, 8], 1),
    "exclusive acquire + release, 8 clients on 8 names": ("pair_acquire.sql", [8], 1),
    "permit acquire + release, 8 clients on 1 name with permits => 8": ("pair_permit.sql", [8], 1),
    "try_acquire_all + release_all, 2 names": ("all2.sql", [1, 8], 2),
    "try_acquire_all + release_all, 8 names": ("all8.sql", [1, 8], 8),
}


def version(c):
    v = c.execute("SELECT extversion FROM pg_extension WHERE extname = 'fenced_lock'").fetchone()[0]
    return v, tuple(int(x) for x in v.split(".")[:3] if x.isdigit())


def main():
    fresh_database(DB)
    with connect(DB) as c:
        v, parsed = version(c)
    if parsed < NEEDS:
        why = (f"fenced_lock {v} is installed; shared leases, permits and acquire_all come with "
               f"{'.'.join(map(str, NEEDS))}")
        log(f"recipes: skipped ({why})")
        save("recipes", {"skipped": why, "version": v, "rows": []})
        return
    keys = [(r, c) for r, (_, clients, _) in ROWS.items() for c in clients]
    meter = Meter()
    try:
        log(f"recipes: {len(keys)} rows, interleaved")
        runs = interleaved(keys, lambda k: meter.run(lambda: pgbench(DB, HERE / "pgbench" / ROWS[k[0]][0], k[1],
                                                                     tag="recipes"),
                                                     ["pg"], lambda res: res["n"]))
    finally:
        meter.close()
    with connect(DB) as c:
        left = c.execute("SELECT count(*) FROM fenced_lock_leases WHERE live").fetchone()[0]
    if left:
        raise RuntimeError(f"recipes: {left} live leases left behind")
    save("recipes", {"skipped": None, "version": v, "durability": DURABLE,
                     "rows": [{"row": r, "clients": c, "names": ROWS[r][2], **summarize_runs(runs[(r, c)]),
                               "costs": summarize_costs(runs[(r, c)])} for r, c in keys]})


if __name__ == "__main__":
    main()
