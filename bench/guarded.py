"""Table 2: a guarded UPDATE beside the same UPDATE on an unguarded table and
on a table with a no-op C row trigger (what any trigger costs), and the
whole acquire -> guarded UPDATE -> release cycle. pgbench, one row per
client, each statement its own transaction, with the client and server
costs of every row. The UPDATE rows are the same pgbench script on three
tables, so the comparison is like for like; report.py takes the ratios run
by run."""

from benchlib import (DURABLE, HERE, WORK, build_noop_trigger, connect, fresh_database, interleaved, log, pgbench,
                      save, summarize_runs)
from costs import Meter, summarize_costs

DB = "bench_guard"
CLIENTS = [1, 8]
MAX_CLIENTS = max(CLIENTS)
NOOP = "UPDATE, no-op C trigger"


def setup():
    """Tables with one row per client. The guarded table's rows are each
    under a lease (1 hour) taken in advance, with consecutive tokens, so a
    pgbench client computes its token as base + client_id."""
    fresh_database(DB)
    so = WORK / "noop_trigger.so"
    why = build_noop_trigger(so)
    so, skipped = (None, f"skipped: {why}") if why else (so, None)
    with connect(DB) as c:
        for t in ("bench_guarded", "bench_plain", "bench_noop", "bench_cycle"):
            c.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0, fence_token bigint)")
        c.execute("CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON bench_guarded FOR EACH ROW"
                  " EXECUTE FUNCTION fenced_lock_guard('item:{id}', 'fence_token')")
        c.execute("CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON bench_cycle FOR EACH ROW"
                  " EXECUTE FUNCTION fenced_lock_guard('cycle:{id}', 'fence_token')")
        if so:
            c.execute(f"CREATE FUNCTION bench_noop_trigger() RETURNS trigger LANGUAGE c"
                      f" AS '{so}', 'bench_noop_trigger'")
            c.execute("CREATE TRIGGER noop BEFORE INSERT OR UPDATE OR DELETE ON bench_noop FOR EACH ROW"
                      " EXECUTE FUNCTION bench_noop_trigger()")
        with c.transaction():
            tokens = [c.execute("SELECT fenced_lock_try_acquire(%s, '1 hour')", (f"item:{i}",)).fetchone()[0]
                      for i in range(MAX_CLIENTS)]
        base = tokens[0]
        if tokens != [base + i for i in range(MAX_CLIENTS)]:
            raise RuntimeError(f"guarded: tokens not consecutive: {tokens}")
        for i, tok in enumerate(tokens):
            for t in ("bench_guarded", "bench_plain", "bench_noop"):
                c.execute(f"INSERT INTO {t} (id, fence_token) VALUES (%s, %s)", (i, tok))
            # bench_cycle's rows are written under a short lease of their own
            t = c.execute("SELECT fenced_lock_try_acquire(%s, '1 min')", (f"cycle:{i}",)).fetchone()[0]
            c.execute("INSERT INTO bench_cycle (id, fence_token) VALUES (%s, %s)", (i, t))
            c.execute("SELECT fenced_lock_release(%s, %s)", (f"cycle:{i}", t))
    return base, skipped


ROWS = {
    "UPDATE, unguarded table": "update_plain.sql",
    NOOP: "update_noop.sql",
    "UPDATE, guarded table": "update_guarded.sql",
    "acquire + guarded UPDATE + release (3 commits)": "cycle.sql",
}


def main():
    base, skipped = setup()
    rows = [r for r in ROWS if not (skipped and r == NOOP)]
    out = {"rows": [], "durability": DURABLE, "noop": skipped}
    meter = Meter()
    done = {}  # transactions pgbench reported, per row
    try:
        for clients in CLIENTS:
            log(f"guarded: {clients} client(s)")
            runs = interleaved(rows, lambda row: meter.run(
                lambda: pgbench(DB, HERE / "pgbench" / ROWS[row], clients, defines={"base": base}, tag="guard"),
                ["pg"], lambda res: res["n"]))
            for row in rows:
                done[row] = done.get(row, 0) + sum(r["n"] for r in runs[row])
                out["rows"].append({"row": row, "clients": clients, "durability": DURABLE,
                                    **summarize_runs(runs[row]), "costs": summarize_costs(runs[row])})
    finally:
        meter.close()
    with connect(DB) as c:
        left = c.execute("SELECT count(*) FROM fenced_lock_leases WHERE live AND name LIKE 'cycle:%'"
                         ).fetchone()[0]
        # Every UPDATE pgbench counted landed: v counts them, per table.
        for row, table in (("UPDATE, unguarded table", "bench_plain"), (NOOP, "bench_noop"),
                           ("UPDATE, guarded table", "bench_guarded"),
                           ("acquire + guarded UPDATE + release (3 commits)", "bench_cycle")):
            if row in done:
                v = c.execute(f"SELECT sum(v) FROM {table}").fetchone()[0]
                if v != done[row]:
                    raise RuntimeError(f"guarded: {table} counts {v} updates, pgbench {done[row]}")
    if left:
        raise RuntimeError(f"guarded: {left} cycle leases left behind")
    save("guarded", out)


if __name__ == "__main__":
    main()
