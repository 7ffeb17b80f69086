"""docs/design.md, "Why" and "The guard": the seeds' inventory story with many
clients.

Stock is 10. Eight workers, each with its own connection and an application
role that has only EXECUTE on fenced_lock (plus its table privileges), each
sell one unit under the lock 'inventory:{item_id}': acquire, read the stock,
write stock - 1 with the token, log the sale in the same transaction, release.
Leases are short and some workers pause longer than the ttl between the read
and the write. One pair is forced into the story's interleaving: A reads 10
and pauses past its ttl; B takes the lock, reads 10, writes 9, releases; A
wakes up and writes.

With the guard trigger every stale write is rejected with FL001 and retried
properly (acquire again, re-read, write): nothing is lost or counted twice.
Without it, the same workload loses A's or B's sale.
"""

import threading

import psycopg
import pytest
from psycopg import sql

import it_support

STOCK = 10
TTL = "300 milliseconds"
PAUSE_PAST_TTL = 0.5  # seconds, > TTL
PAUSING = {"w2", "w4", "w6"}  # besides A: their first attempt outlives its lease
RANDOM_WORKERS = [f"w{i}" for i in range(1, 7)]


@pytest.fixture(scope="module")
def app(cluster, db, execute_only_role):
    return execute_only_role()


def make_store(cluster, db, role, table, item, guarded):
    with cluster.connect(db) as conn:
        t, s = sql.Identifier(table), sql.Identifier(table + "_sales")
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}, {}").format(t, s))
        conn.execute(sql.SQL(
            "CREATE TABLE {} (item_id int PRIMARY KEY, stock int NOT NULL, fence_token bigint)").format(t))
        conn.execute(sql.SQL(
            "CREATE TABLE {} (id serial PRIMARY KEY, item_id int NOT NULL, worker text NOT NULL, "
            "token bigint NOT NULL, stock_read int NOT NULL)").format(s))
        if guarded:
            conn.execute(sql.SQL(
                "CREATE TRIGGER inventory_fence BEFORE INSERT OR UPDATE OR DELETE ON {} "
                "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('inventory:{{item_id}}', 'fence_token')").format(t))
        name = f"inventory:{item}"
        token = conn.execute("SELECT fenced_lock_try_acquire(%s, '10 s')", (name,)).fetchone()[0]
        conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(t), (item, STOCK, token))
        assert conn.execute("SELECT fenced_lock_release(%s, %s)", (name, token)).fetchone()[0]
        conn.execute(sql.SQL("GRANT SELECT, UPDATE ON {} TO {}").format(t, sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(s, sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT USAGE ON SEQUENCE {} TO {}").format(
            sql.Identifier(table + "_sales_id_seq"), sql.Identifier(role)))


def sell_one(conn, table, item, worker, pause):
    """Sell one unit, retrying properly after FL001. `pause(attempt)` runs
    between the read and the write. Returns the number of rejected writes."""
    name = f"inventory:{item}"
    t, s = sql.Identifier(table), sql.Identifier(table + "_sales")
    rejected = 0
    for attempt in range(1, 20):
        token = conn.execute("SELECT fenced_lock_acquire(%s, %s::interval, '20 s')", (name, TTL)).fetchone()[0]
        stock = conn.execute(sql.SQL("SELECT stock FROM {} WHERE item_id = %s").format(t), (item,)).fetchone()[0]
        pause(attempt)
        try:
            with conn.transaction():
                conn.execute(sql.SQL("UPDATE {} SET stock = %s, fence_token = %s WHERE item_id = %s").format(t),
                             (stock - 1, token, item))
                conn.execute(sql.SQL("INSERT INTO {} (item_id, worker, token, stock_read) VALUES (%s, %s, %s, %s)")
                             .format(s), (item, worker, token, stock))
        except psycopg.Error as e:
            assert e.sqlstate == "FL001", f"{worker}: unexpected {e.sqlstate}: {e}"
            rejected += 1
            conn.execute("SELECT fenced_lock_release(%s, %s)", (name, token))  # false: it is not live
            continue
        conn.execute("SELECT fenced_lock_release(%s, %s)", (name, token))
        return rejected
    raise AssertionError(f"{worker} could not sell in 20 attempts")


def run_story(cluster, db, role, table, item):
    """All workers at once; returns {worker: rejected writes}."""
    a_read = threading.Event()
    b_read = threading.Event()
    b_done = threading.Event()
    conns = {w: cluster.connect(db, user=role) for w in ["A", "B"] + RANDOM_WORKERS}
    try:
        def a_pause(attempt):
            if attempt == 1:
                a_read.set()
                assert b_done.wait(30), "B never sold"

        def b_pause(attempt):
            b_read.set()

        def after_b_read(fn):
            def run():
                assert b_read.wait(30), "B never read"
                return fn()
            return run

        def pause_for(worker):
            def pause(attempt):
                if attempt == 1 and worker in PAUSING:
                    threading.Event().wait(PAUSE_PAST_TTL)
            return pause

        def b():
            try:
                return sell_one(conns["B"], table, item, "B", b_pause)
            finally:
                b_read.set()
                b_done.set()

        calls = {"A": it_support.start(lambda: sell_one(conns["A"], table, item, "A", a_pause), "A")}
        it_support.wait_until(a_read.is_set, 10, what="A to read the stock")
        calls["B"] = it_support.start(b, "B")
        for w in RANDOM_WORKERS:
            calls[w] = it_support.start(
                after_b_read(lambda w=w: sell_one(conns[w], table, item, w, pause_for(w))), w)
        return {w: c.outcome(60) for w, c in calls.items()}
    finally:
        for c in conns.values():
            c.close()


def sales_and_stock(cluster, db, table, item):
    with cluster.connect(db) as conn:
        sales = conn.execute(sql.SQL(
            "SELECT worker, token, stock_read FROM {} WHERE item_id = %s ORDER BY token").format(
                sql.Identifier(table + "_sales")), (item,)).fetchall()
        stock, token = conn.execute(sql.SQL("SELECT stock, fence_token FROM {} WHERE item_id = %s").format(
            sql.Identifier(table)), (item,)).fetchone()
    return sales, stock, token


def test_inventory_guard_prevents_lost_update(cluster, db, app):
    table, item = "inventory_guarded", 1
    make_store(cluster, db, app, table, item, guarded=True)
    rejected = run_story(cluster, db, app, table, item)

    # A's write after its lease was taken over was rejected, and so was the
    # first write of every worker that paused past its ttl.
    assert rejected["A"] >= 1
    for w in PAUSING:
        assert rejected[w] >= 1
    sales, stock, token = sales_and_stock(cluster, db, table, item)
    workers = ["A", "B"] + RANDOM_WORKERS
    # every worker sold exactly once: no sale lost, none counted twice
    assert sorted(w for w, _, _ in sales) == sorted(workers)
    assert stock == STOCK - len(sales) == STOCK - len(workers)
    # each accepted sale read what the previous accepted sale wrote
    assert [r for _, _, r in sales] == list(range(STOCK, STOCK - len(workers), -1))
    # the row carries the token of the last accepted write
    assert token == sales[-1][1]
    # B sold before A (the forced interleaving), and A's retry read B's write or later
    order = [w for w, _, _ in sales]
    assert order.index("B") < order.index("A")
    with cluster.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM fenced_lock_leases WHERE name = %s AND live",
                            (f"inventory:{item}",)).fetchone()[0] == 0


def test_inventory_without_guard_loses_updates(cluster, db, app):
    table, item = "inventory_unguarded", 2
    make_store(cluster, db, app, table, item, guarded=False)
    rejected = run_story(cluster, db, app, table, item)

    assert all(r == 0 for r in rejected.values())  # nothing stops a stale write
    sales, stock, _ = sales_and_stock(cluster, db, table, item)
    assert len(sales) == len(RANDOM_WORKERS) + 2
    # A and B both sold the 10th unit: one of their sales is lost
    read = {w: r for w, _, r in sales}
    assert read["A"] == read["B"] == STOCK
    assert stock > STOCK - len(sales)
