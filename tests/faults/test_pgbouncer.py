"""Guarantee (docs/operations.md, "Connection pooling"): nothing depends on
session state, so fenced_lock works behind PgBouncer in transaction pooling
mode.

16 client threads share 4 server connections through PgBouncer
(pool_mode = transaction, default_pool_size = 4) and repeat on 6 names:
acquire (try_acquire, or acquire with a bounded wait), read a counter, renew, guarded write of counter + 1, release — each
statement its own transaction, so consecutive statements of one client land on
different server backends. Afterwards:
  - every renew and release by the owner succeeded, although many ran on
    another backend than the acquire;
  - the server-side history of fenced_lock_internal.granted_leases shows no two live
    leases of a name at any moment and tokens growing per name;
  - no lost update: each counter equals the number of acknowledged increments.
And through a pool of one server connection, where every client's
transactions run on the same backend: what one transaction asserted is not
remembered for the next (another client's DELETE still needs its own
fenced_lock_assert, FL002), and a lease acquired by one client is renewed and
released by its owner whichever client used the backend in between.

A waiting fenced_lock_acquire occupies a server connection while it waits,
so behind a small pool the clients mostly use try_acquire with a client-side
backoff, and bound the waits of fenced_lock_acquire (here 50 ms).
"""

import random
import threading
import time
from collections import Counter

import psycopg
import pytest

import lease_history
from faultkit import PGBOUNCER_PORT, PgBouncer, connect, sqlstate_of
from harness.cluster import ROOT

APP = "fl_bouncer_app"
NAMES = [f"bouncer:{i}" for i in range(6)]
CLIENTS = 16
POOL = 4
RUN_S = 8


def client(bouncer, dbname, i, stats, stop):
    rnd = random.Random(i)
    holder = f"client-{i}"
    try:
        with bouncer.connect(dbname, APP) as conn:
            while not stop.is_set():
                name = rnd.choice(NAMES)
                try:
                    if rnd.random() < 0.25:
                        token, pid_acquire = conn.execute(
                            "SELECT fenced_lock_acquire(%s, '30 seconds', '50 milliseconds', %s), pg_backend_pid()",
                            (name, holder)).fetchone()
                    else:
                        token, pid_acquire = conn.execute(
                            "SELECT fenced_lock_try_acquire(%s, '30 seconds', %s), pg_backend_pid()",
                            (name, holder)).fetchone()
                except psycopg.Error as e:
                    if e.sqlstate != "55P03":
                        raise
                    token = None
                if token is None:
                    stats["busy"] += 1
                    time.sleep(rnd.uniform(0.001, 0.01))
                    continue
                value, pid_read = conn.execute("SELECT value, pg_backend_pid() FROM counters WHERE name = %s",
                                               (name,)).fetchone()
                renewed, pid_renew = conn.execute("SELECT fenced_lock_renew(%s, %s, '30 seconds'), pg_backend_pid()",
                                                  (name, token)).fetchone()
                assert renewed is True, f"{holder}: renew of its live lease {name}/{token} returned {renewed}"
                pid_write = conn.execute(
                    "UPDATE counters SET value = %s, fence_token = %s WHERE name = %s RETURNING pg_backend_pid()",
                    (value + 1, token, name)).fetchone()[0]
                stats["increments:" + name] += 1
                released, pid_release = conn.execute("SELECT fenced_lock_release(%s, %s), pg_backend_pid()",
                                                     (name, token)).fetchone()
                assert released is True, f"{holder}: release of its live lease {name}/{token} returned {released}"
                stats["cycles"] += 1
                stats["renew_elsewhere"] += pid_renew != pid_acquire
                stats["release_elsewhere"] += pid_release != pid_acquire
                for pid in (pid_acquire, pid_read, pid_renew, pid_write, pid_release):
                    stats["pid:%d" % pid] = 1
    except Exception as e:  # noqa: BLE001 - reported by the main thread
        stats["failure: %r" % (e,)] += 1


def single_backend_checks(bouncer):
    with bouncer.connect("fl_single", APP) as x, bouncer.connect("fl_single", APP) as y:
        pid = lambda c: c.execute("SELECT pg_backend_pid()").fetchone()[0]  # noqa: E731
        token = x.execute("SELECT fenced_lock_try_acquire('notes', '30 seconds')").fetchone()[0]
        x.execute("INSERT INTO notes VALUES ('notes', 1, %s)", (token,))
        x.execute("SELECT fenced_lock_assert('notes', %s)", (token,))
        assert pid(x) == pid(y), "a pool of one should share one backend"
        # x's assert ended with x's transaction: y's DELETE on that same backend has none.
        assert sqlstate_of(y.execute, "DELETE FROM notes WHERE id = 1") == "FL002"
        assert sqlstate_of(x.execute, "DELETE FROM notes WHERE id = 1") == "FL002"
        with x.transaction():
            x.execute("SELECT fenced_lock_assert('notes', %s)", (token,))
            x.execute("DELETE FROM notes WHERE id = 1")
        assert x.execute("SELECT count(*) FROM notes").fetchone()[0] == 0
        # Owner-only operations work from any client of the owner role, on any backend.
        assert y.execute("SELECT fenced_lock_renew('notes', %s)", (token,)).fetchone()[0] is True
        assert x.execute("SELECT fenced_lock_release('notes', %s)", (token,)).fetchone()[0] is True
        assert y.execute("SELECT fenced_lock_release('notes', %s)", (token,)).fetchone()[0] is False


@pytest.mark.budget(90)
def test_pgbouncer_transaction_pooling_stays_correct(main_cluster, fresh_db):
    with connect(main_cluster, fresh_db) as db:
        db.execute(f"DO $$ BEGIN CREATE ROLE {APP} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        db.execute("CREATE TABLE counters (name text PRIMARY KEY, value bigint NOT NULL, fence_token bigint)")
        db.execute("INSERT INTO counters SELECT n, 0, NULL FROM unnest(%s::text[]) n", (NAMES,))
        db.execute("CREATE TRIGGER counters_fence BEFORE INSERT OR UPDATE OR DELETE ON counters "
                   "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('{name}')")
        db.execute(f"GRANT EXECUTE ON FUNCTION fenced_lock_acquire(text, interval, interval, text, boolean, boolean, integer), "
                   f"fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer), "
                   f"fenced_lock_renew(text, bigint, interval), fenced_lock_release(text, bigint) TO {APP}")
        db.execute(f"GRANT SELECT, UPDATE ON counters TO {APP}")
        lease_history.install(db)

        db.execute("CREATE TABLE notes (name text NOT NULL, id int PRIMARY KEY, fence_token bigint)")
        db.execute("CREATE TRIGGER notes_fence BEFORE INSERT OR UPDATE OR DELETE ON notes "
                   "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('{name}')")
        db.execute(f"GRANT SELECT, INSERT, DELETE ON notes TO {APP}")
        db.execute(f"GRANT EXECUTE ON FUNCTION fenced_lock_assert(text, bigint) TO {APP}")

    bouncer = PgBouncer(ROOT / "f_pgbouncer", PGBOUNCER_PORT, main_cluster.port, [fresh_db], [APP, "postgres"],
                        pool_size=POOL, single={"fl_single": fresh_db})
    bouncer.start()
    try:
        single_backend_checks(bouncer)
        stats = Counter()
        stop = threading.Event()
        threads = [threading.Thread(target=client, args=(bouncer, fresh_db, i, stats, stop), daemon=True)
                   for i in range(CLIENTS)]
        for t in threads:
            t.start()
        time.sleep(RUN_S)
        stop.set()
        for t in threads:
            t.join(40)
            assert not t.is_alive(), "a client hung behind PgBouncer"
    finally:
        bouncer.stop()

    failures = [k for k in stats if k.startswith("failure")]
    assert not failures, failures
    backends = [k for k in stats if k.startswith("pid:")]
    print(f"pgbouncer: {stats['cycles']} cycles, {stats['busy']} busy attempts, "
          f"{len(backends)} server backends, renew elsewhere {stats['renew_elsewhere']}, "
          f"release elsewhere {stats['release_elsewhere']}")
    assert stats["cycles"] >= 20
    # Pooling really happened: 16 clients on at most 4 backends, and owners'
    # renew / release often ran on a backend other than their acquire's.
    assert len(backends) <= POOL
    assert stats["renew_elsewhere"] > 0 and stats["release_elsewhere"] > 0

    with connect(main_cluster, fresh_db) as db:
        counters = dict(db.execute("SELECT name, value FROM counters").fetchall())
        assert counters == {n: stats["increments:" + n] for n in NAMES}, "lost update"
        events = lease_history.lease_events(db)
        assert len(lease_history.grants(events)) >= stats["cycles"]
        problems = lease_history.check_leases(events)
        assert not problems, problems[:20]
        assert db.execute("SELECT count(*) FROM fenced_lock_internal.granted_leases").fetchone()[0] == 0
