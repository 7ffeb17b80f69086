"""Guarantee (docs/design.md, "Tokens", "Durability"; "Invariants" 2, 6, 7):
after a streaming standby is promoted, tokens keep growing past everything the
old primary could have handed out — even under asynchronous replication, where
the old primary's last grants are lost — so a token is never handed out twice,
and the holders of lost grants cannot write on the new primary (FL001). With a
synchronous standby no acknowledged grant or renewal is lost at all, whatever
synchronous_commit the session set: while the synchronous standby receives
nothing, a grant or renewal from a session with synchronous_commit = local or
off is not acknowledged (it waits in SyncRep). A lone release is acknowledged
without waiting for the standby; after the failover it may come back, but
only as the very lease it released (acked_workload.reconcile). A release in a
transaction with a user write waits for the standby like the write.

Token format: on timeline N every token is >= (N - 1) << 47 (src/token.rs),
so the first promotion (timeline 2) moves tokens to >= 1 << 47.
"""

import os
import signal
import threading
import time

import pytest

from acked_workload import Model, create_ledger, lost_writes, reconcile, worker
from faultkit import (ASYNC_PRIMARY_PORT, ASYNC_STANDBY_PORT, EPOCH_SHIFT, SYNC_PRIMARY_PORT,
                      SYNC_STANDBY_PORT, connect, leases, sqlstate_of, timeline_of, wait_until)

REPLICATION_CONF = {"wal_level": "replica", "max_wal_senders": "5", "wal_keep_size": "128MB",
                    "hot_standby": "on"}


def streaming(primary_conn, sync_state=None):
    rows = primary_conn.execute("SELECT state, sync_state FROM pg_stat_replication").fetchall()
    return any(r[0] == "streaming" and (sync_state is None or r[1] == sync_state) for r in rows)


def caught_up(primary_conn, standby_conn):
    lsn = primary_conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
    return standby_conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone()[0]


def make_pair(clusters, prefix, primary_port, standby_port, dbname):
    primary = clusters.new(f"f_{prefix}_primary", primary_port, REPLICATION_CONF)
    primary.create_database(dbname)
    with connect(primary, dbname) as db:
        db.execute("CREATE TABLE stock (item_id int PRIMARY KEY, qty int NOT NULL, fence_token bigint)")
        db.execute("INSERT INTO stock SELECT i, 100, NULL FROM generate_series(1, 10) i")
        db.execute("CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock "
                   "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{item_id}')")
        create_ledger(db, prefix)
    standby = clusters.adopt(primary.make_standby(f"f_{prefix}_standby", standby_port))
    standby.start()
    with connect(primary, dbname) as p:
        wait_until(lambda: streaming(p), 30, what="the standby to stream")
    return primary, standby


def write_stock(conn, item, token):
    conn.execute("UPDATE stock SET qty = qty - 1, fence_token = %s WHERE item_id = %s", (token, item))


@pytest.mark.budget(150)
def test_async_failover_never_reissues_a_token_and_fences_lost_grants(clusters):
    dbname = "failover"
    primary, standby = make_pair(clusters, "fo_async", ASYNC_PRIMARY_PORT, ASYNC_STANDBY_PORT, dbname)
    p = connect(primary, dbname)
    s = connect(standby, dbname)

    # Replicated grants: items 1..5.
    kept = {}
    for item in range(1, 6):
        kept[item] = p.execute("SELECT fenced_lock_try_acquire(%s, '10 minutes', %s)",
                               (f"item:{item}", f"kept-{item}")).fetchone()[0]
        write_stock(p, item, kept[item])
    wait_until(lambda: caught_up(p, s), 30, what="the standby to replay everything")
    assert timeline_of(p) == 1

    # Cut the standby off: point its walreceiver at a dead port. It keeps what
    # it has, and receives nothing more.
    s.execute("ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port=1 user=postgres connect_timeout=1'")
    s.execute("SELECT pg_reload_conf()")
    wait_until(lambda: not streaming(p), 30, what="the walsender to go away")
    wait_until(lambda: s.execute("SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'"
                                 ).fetchone()[0] == 0, 30, what="the standby's walreceiver to stop streaming")
    cut_lsn = s.execute("SELECT pg_last_wal_receive_lsn()").fetchone()[0]

    # Grants the standby will never see: a re-grant of item 1, new items 6..10,
    # and a run of grants long enough to outrun the sequence's prefetch of 32.
    lost = {}
    assert p.execute("SELECT fenced_lock_release('item:1', %s)", (kept[1],)).fetchone()[0] is True
    lost[1] = p.execute("SELECT fenced_lock_try_acquire('item:1', '10 minutes', 'lost-1')").fetchone()[0]
    write_stock(p, 1, lost[1])
    for item in range(6, 11):
        lost[item] = p.execute("SELECT fenced_lock_try_acquire(%s, '10 minutes', %s)",
                               (f"item:{item}", f"lost-{item}")).fetchone()[0]
        write_stock(p, item, lost[item])
    churn = [p.execute("SELECT fenced_lock_try_acquire(%s, '10 minutes')", (f"churn:{i}",)).fetchone()[0]
             for i in range(100)]
    issued = list(kept.values()) + list(lost.values()) + churn
    assert all(t is not None for t in issued)
    assert s.execute("SELECT pg_last_wal_receive_lsn()").fetchone()[0] == cut_lsn, "the standby kept receiving"

    p.close()
    primary.kill9()
    s.close()
    standby.promote()

    with connect(standby, dbname) as n:
        wait_until(lambda: not n.execute("SELECT pg_is_in_recovery()").fetchone()[0], 30, what="promotion")
        timeline = timeline_of(n)
        assert timeline == 2
        state = leases(n)
        # What the standby had is there; what it never received is not.
        for item in range(2, 6):
            assert state[f"item:{item}"][:2] == (kept[item], f"kept-{item}")
        assert state["item:1"][:2] == (kept[1], "kept-1")
        for item in range(6, 11):
            assert f"item:{item}" not in state
        assert not any(name.startswith("churn:") for name in state)

        # The scenario is real: the new primary's sequence is behind tokens the
        # old one handed out, so a plain sequence would hand them out again.
        seq_at = n.execute("SELECT last_value FROM fenced_lock_internal.token_seq").fetchone()[0]
        assert seq_at < max(issued)
        # New tokens exceed every token the old primary issued, lost ones included,
        # and carry the new timeline's epoch.
        first = n.execute("SELECT fenced_lock_try_acquire('after-failover', '1 minute')").fetchone()[0]
        assert first > max(issued)
        assert first >= (timeline - 1) << EPOCH_SHIFT
        assert max(issued) < 1 << EPOCH_SHIFT

        # Holders of lost grants cannot write, whether or not someone took the name since.
        for item, token in lost.items():
            assert sqlstate_of(write_stock, n, item, token) == "FL001", f"lost grant of item {item} wrote"
            assert n.execute("SELECT fenced_lock_renew(%s, %s)", (f"item:{item}", token)).fetchone()[0] is False
        taken = n.execute("SELECT fenced_lock_try_acquire('item:6', '1 minute', 'new-6')").fetchone()[0]
        assert taken > lost[6] and taken > first
        assert sqlstate_of(write_stock, n, 6, lost[6]) == "FL001"
        write_stock(n, 6, taken)
        # Holders of replicated grants still can.
        for item in range(1, 6):
            write_stock(n, item, kept[item])
        rows = dict(n.execute("SELECT item_id, fence_token FROM stock").fetchall())
        assert rows == {1: kept[1], 2: kept[2], 3: kept[3], 4: kept[4], 5: kept[5], 6: taken,
                        7: None, 8: None, 9: None, 10: None}
        # Every token handed out on the new timeline is in the new epoch.
        more = [n.execute("SELECT fenced_lock_try_acquire(%s, '1 minute')", (f"new:{i}",)).fetchone()[0]
                for i in range(5)]
        assert more == sorted(more) and min(more) > taken
        assert all(t >> EPOCH_SHIFT == timeline - 1 for t in [first, taken] + more)


def _in_thread(conn, query, params, result):
    def run():
        try:
            result["value"] = conn.execute(query, params).fetchone()[0]
        except Exception as e:  # noqa: BLE001 - checked by the test
            result["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _wait_event(watcher, pid):
    return watcher.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]


@pytest.mark.budget(150)
def test_sync_failover_loses_no_acknowledged_grant_or_renewal(clusters):
    dbname = "failover"
    primary, standby = make_pair(clusters, "fo_sync", SYNC_PRIMARY_PORT, SYNC_STANDBY_PORT, dbname)
    with connect(primary, dbname) as p:
        p.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        p.execute("SELECT pg_reload_conf()")
        wait_until(lambda: streaming(p, "sync"), 30, what="the standby to become synchronous")
        p.execute("CREATE TABLE plain (mode text)")
        # leases to renew and release while the standby is stalled
        probes = {n: p.execute("SELECT fenced_lock_try_acquire(%s, '10 minutes')", (n,)).fetchone()[0]
                  for n in ("renew:local", "renew:off", "release:lone", "release:beside")}

    # While the standby receives nothing, a grant or renewal is not
    # acknowledged, even from sessions with synchronous_commit = local or off:
    # its commit waits for the standby. A plain write in such a session is
    # acknowledged at once, and so is a lone release in any session.
    with connect(standby, dbname) as s:
        walreceiver = s.execute("SELECT pid FROM pg_stat_wal_receiver").fetchone()[0]
    os.kill(walreceiver, signal.SIGSTOP)
    pending = []  # (what, conn, pid, result, thread)
    try:
        with connect(primary, dbname) as watcher:
            for mode in ("local", "off"):
                for what, query, params in (
                        ("grant", "SELECT fenced_lock_try_acquire(%s, '1 minute')", (f"probe:{mode}",)),
                        ("renew", "SELECT fenced_lock_renew(%s, %s, '20 minutes')",
                         (f"renew:{mode}", probes[f"renew:{mode}"]))):
                    conn = connect(primary, dbname)
                    conn.execute(f"SET synchronous_commit = {mode}")
                    conn.execute("INSERT INTO plain VALUES (%s)", (mode,))  # acknowledged without the standby
                    result = {}
                    pending.append((f"{what} ({mode})", conn, conn.info.backend_pid, result,
                                    _in_thread(conn, query, params, result)))
            # a release with a user write, synchronous_commit = on: waits too
            conn = connect(primary, dbname)
            conn.autocommit = False
            conn.execute("INSERT INTO plain VALUES ('beside')")
            assert conn.execute("SELECT fenced_lock_release('release:beside', %s)",
                                (probes["release:beside"],)).fetchone()[0] is True
            result = {}
            t = threading.Thread(target=lambda c=conn, r=result: (c.commit(), r.update(value=True)), daemon=True)
            t.start()
            pending.append(("release beside a write (on)", conn, conn.info.backend_pid, result, t))

            for what, conn, pid, result, thread in pending:
                wait_until(lambda: _wait_event(watcher, pid) == "SyncRep", 10,
                           what=f"the {what} to wait for the standby")
                assert not result, f"the {what} was acknowledged before the synchronous standby had it"

            # a lone release from a synchronous_commit = on session: acknowledged at once
            with connect(primary, dbname) as lone:
                t0 = time.monotonic()
                assert lone.execute("SELECT fenced_lock_release('release:lone', %s)",
                                    (probes["release:lone"],)).fetchone()[0] is True
                lone_ms = (time.monotonic() - t0) * 1000
            print(f"lone release acknowledged in {lone_ms:.1f} ms while the synchronous standby was stalled")
            assert lone_ms < 2000
            for what, conn, pid, result, thread in pending:
                assert not result, f"the {what} was acknowledged before the synchronous standby had it"
    finally:
        os.kill(walreceiver, signal.SIGCONT)
    for what, conn, pid, result, thread in pending:
        thread.join(30)
        assert not thread.is_alive() and result.get("value") not in (None, False), (what, result)
        conn.close()
    with connect(primary, dbname) as p:
        wait_until(lambda: streaming(p, "sync"), 30, what="the standby to be synchronous again")

    # Sessions with every synchronous_commit: grants and renewals are
    # replicated before they are acknowledged in all of them; plain writes
    # only under on (and above).
    model = Model("fo_sync", ["on", "on", "off", "local", "remote_write"])
    stop = threading.Event()
    threads = [threading.Thread(target=worker, args=(primary.port, dbname, w, model, stop), daemon=True)
               for w in range(len(model.commit_modes))]
    for t in threads:
        t.start()
    time.sleep(2.0)
    primary.kill9()
    stop.set()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a client thread hung after the crash"
    assert not model.failures, model.failures
    for kind in ("grant", "async_grant", "renew", "release"):
        assert model.counts[kind] > 0, f"the workload never acknowledged a {kind}: {model.counts}"

    standby.promote()
    with connect(standby, dbname) as n:
        wait_until(lambda: not n.execute("SELECT pg_is_in_recovery()").fetchone()[0], 30, what="promotion")
        problems = reconcile(model, leases(n))
        assert not problems, problems
        lost = lost_writes(n, model)
        assert not lost, f"acknowledged synchronously replicated writes lost: {lost}"

        timeline = timeline_of(n)
        assert timeline == 2
        first = n.execute("SELECT fenced_lock_try_acquire('after-failover', '1 minute')").fetchone()[0]
        assert first > max(model.acked_tokens)
        assert first >= (timeline - 1) << EPOCH_SHIFT
    print(f"sync failover workload: {model.counts} (release_came_back: acknowledged releases the failover "
          "undid, allowed)")
