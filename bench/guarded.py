"""Table 2: a guarded UPDATE beside the same UPDATE on an unguarded table, and
the whole acquire -> guarded UPDATE -> release cycle. pgbench, one row per
client, each statement its own transaction. Both UPDATE rows are the same
pgbench script on two tables, so the comparison is like for like; report.py
takes the ratio run by run."""

from benchlib import DURABLE, HERE, connect, fresh_database, interleaved, log, pgbench, save, summarize_runs

DB = "bench_guard"
CLIENTS = [1, 8]
MAX_CLIENTS = max(CLIENTS)


def setup():
    """Tables with one row per client. The guarded table's rows are each
    under a lease (1 hour) taken in advance, with consecutive tokens, so a
    pgbench client computes its token as base + client_id."""
    fresh_database(DB)
    with connect(DB) as c:
        for t in ("bench_guarded", "bench_plain", "bench_cycle"):
            c.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0, fence_token bigint)")
        c.execute("CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON bench_guarded FOR EACH ROW"
                  " EXECUTE FUNCTION fenced_lock_guard('item:{id}', 'fence_token')")
        c.execute("CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON bench_cycle FOR EACH ROW"
                  " EXECUTE FUNCTION fenced_lock_guard('cycle:{id}', 'fence_token')")
        with c.transaction():
            tokens = [c.execute("SELECT fenced_lock_try_acquire(%s, '1 hour')", (f"item:{i}",)).fetchone()[0]
                      for i in range(MAX_CLIENTS)]
        base = tokens[0]
        if tokens != [base + i for i in range(MAX_CLIENTS)]:
            raise RuntimeError(f"guarded: tokens not consecutive: {tokens}")
        for i, tok in enumerate(tokens):
            c.execute("INSERT INTO bench_guarded (id, fence_token) VALUES (%s, %s)", (i, tok))
            c.execute("INSERT INTO bench_plain (id, fence_token) VALUES (%s, %s)", (i, tok))
            # bench_cycle's rows are written under a short lease of their own
            t = c.execute("SELECT fenced_lock_try_acquire(%s, '1 min')", (f"cycle:{i}",)).fetchone()[0]
            c.execute("INSERT INTO bench_cycle (id, fence_token) VALUES (%s, %s)", (i, t))
            c.execute("SELECT fenced_lock_release(%s, %s)", (f"cycle:{i}", t))
    return base


ROWS = {
    "UPDATE, unguarded table": "update_plain.sql",
    "UPDATE, guarded table": "update_guarded.sql",
    "acquire + guarded UPDATE + release (3 commits)": "cycle.sql",
}


def main():
    base = setup()
    out = {"rows": [], "durability": DURABLE}
    for clients in CLIENTS:
        log(f"guarded: {clients} client(s)")
        runs = interleaved(list(ROWS), lambda row: pgbench(DB, HERE / "pgbench" / ROWS[row], clients,
                                                             defines={"base": base}, tag="guard"))
        for row in ROWS:
            out["rows"].append({"row": row, "clients": clients, "durability": DURABLE,
                                **summarize_runs(runs[row])})
    with connect(DB) as c:
        left = c.execute("SELECT count(*) FROM fenced_lock_leases WHERE live AND name LIKE 'cycle:%'"
                         ).fetchone()[0]
    if left:
        raise RuntimeError(f"guarded: {left} cycle leases left behind")
    save("guarded", out)


if __name__ == "__main__":
    main()
