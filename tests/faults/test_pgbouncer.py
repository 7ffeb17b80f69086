"""Guarantee (SPEC §7, last sentence): nothing depends on session state, so
fenced_lock works behind PgBouncer in transaction pooling mode.

16 client threads share 4 server connections through PgBouncer
(pool_mode = transaction, default_pool_size = 4) and repeat on 6 names:
acquire (try_acquire, or acquire with a bounded wait), read a counter, renew, guarded write of counter + 1, release — each
statement its own transaction, so consecutive statements of one client land on
different server backends. Afterwards:
  - every renew and release by the owner succeeded, although many ran on
    another backend than the acquire;
  - the server-side history of fenced_lock_internal.leases shows no two live
    leases of a name at any moment and tokens growing per name;
  - no lost update: each counter equals the number of acknowledged increments.

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
from faultkit import PGBOUNCER_PORT, PgBouncer, connect
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


@pytest.mark.budget(90)
def test_pgbouncer_transaction_pooling_stays_correct(main_cluster, fresh_db):
    with connect(main_cluster, fresh_db) as db:
        db.execute(f"DO $$ BEGIN CREATE ROLE {APP} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        db.execute("CREATE TABLE counters (name text PRIMARY KEY, value bigint NOT NULL, fence_token bigint)")
        db.execute("INSERT INTO counters SELECT n, 0, NULL FROM unnest(%s::text[]) n", (NAMES,))
        db.execute("CREATE TRIGGER counters_fence BEFORE INSERT OR UPDATE OR DELETE ON counters "
                   "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('{name}')")
        db.execute(f"GRANT EXECUTE ON FUNCTION fenced_lock_acquire(text, interval, interval, text), "
                   f"fenced_lock_try_acquire(text, interval, text), "
                   f"fenced_lock_renew(text, bigint, interval), fenced_lock_release(text, bigint) TO {APP}")
        db.execute(f"GRANT SELECT, UPDATE ON counters TO {APP}")
        lease_history.install(db)

    bouncer = PgBouncer(ROOT / "f_pgbouncer", PGBOUNCER_PORT, main_cluster.port, [fresh_db], [APP, "postgres"],
                        pool_size=POOL)
    bouncer.start()
    try:
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
        assert db.execute("SELECT count(*) FROM fenced_lock_internal.leases").fetchone()[0] == 0
