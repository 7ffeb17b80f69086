"""docs/design.md, "Lock protocol": fenced_lock_try_acquire never
waits for another transaction. While another connection holds an open
transaction with something in flight on the name — a guarded write (under a
live or an expired lease), an uncommitted grant, release, renew or force
release — a try returns NULL at once (asserted < 1 s, printed). The same
situation makes fenced_lock_acquire wait until that transaction ends, and only
then decide (the ordering guarantee: an accepted write commits before any
later grant). Both sides are shown for each case.
"""

import time

import psycopg
import pytest

import it_support
from it_support import elapsed_ms, one, start, wait_until

TRY_BOUND_S = 1.0


@pytest.fixture(scope="module")
def app(cluster, db):
    it_support.create_guarded_docs(cluster, db, "try:{id}")
    return db


def grab(conn, name, ttl="60 s"):
    token = one(conn, "SELECT fenced_lock_try_acquire(%s, %s::interval)", (name, ttl))
    assert token is not None
    return token


def timed_try(conn, name):
    t0 = time.monotonic()
    token = one(conn, "SELECT fenced_lock_try_acquire(%s, '30 s')", (name,))
    return token, elapsed_ms(t0)


def in_flight_write(holder, name, token):
    holder.execute("BEGIN")
    holder.execute("INSERT INTO docs VALUES (%s, 'in flight', %s) ON CONFLICT (id) DO UPDATE "
                   "SET body = EXCLUDED.body, fence_token = EXCLUDED.fence_token", (name.split(":", 1)[1], token))


def expire(mon, name):
    wait_until(lambda: mon.execute("SELECT NOT live FROM fenced_lock_leases WHERE name = %s", (name,)).fetchone()[0],
               5, interval=0.02, what=f"the lease of {name} to expire")


# Each case: (prepare(holder, mon, name) -> old token or None, end_sql, what the
# acquirer then gets: "granted" or "still_held").
def _write_live(holder, mon, name):
    token = grab(holder, name)
    in_flight_write(holder, name, token)
    return token


def _write_expired(holder, mon, name):
    token = grab(holder, name, "1 s")
    in_flight_write(holder, name, token)  # accepted while live
    expire(mon, name)
    return token


def _uncommitted_grant(holder, mon, name):
    holder.execute("BEGIN")
    assert grab(holder, name) is not None
    return None


def _uncommitted_release(holder, mon, name):
    token = grab(holder, name)
    holder.execute("BEGIN")
    assert one(holder, "SELECT fenced_lock_release(%s, %s)", (name, token)) is True
    return token


def _uncommitted_renew(holder, mon, name):
    token = grab(holder, name, "1 s")
    holder.execute("BEGIN")
    assert one(holder, "SELECT fenced_lock_renew(%s, %s, '600 ms')", (name, token)) is True
    expire(mon, name)  # the committed lease has expired; so would the renewed one
    time.sleep(0.2)
    return token


def _uncommitted_force_release(holder, mon, name):
    token = grab(holder, name)
    holder.execute("BEGIN")
    assert one(holder, "SELECT fenced_lock_force_release(%s)", (name,)) is True
    return token


CASES = {
    # name: (prepare, how the holder's transaction ends, the acquirer is granted after it)
    "guarded_write_live_lease": (_write_live, "COMMIT", False),
    "guarded_write_expired_lease": (_write_expired, "COMMIT", True),
    "uncommitted_grant_committed": (_uncommitted_grant, "COMMIT", False),
    "uncommitted_grant_rolled_back": (_uncommitted_grant, "ROLLBACK", True),
    "uncommitted_release": (_uncommitted_release, "COMMIT", True),
    "uncommitted_renew_rolled_back": (_uncommitted_renew, "ROLLBACK", True),
    "uncommitted_force_release": (_uncommitted_force_release, "COMMIT", True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_try_returns_null_at_once_while_acquire_waits_for_the_transaction(cluster, app, case):
    prepare, end, granted_after = CASES[case]
    name = f"try:{case}"
    with cluster.connect(app) as holder, cluster.connect(app) as other, cluster.connect(app) as acq, \
            cluster.connect(app) as mon:
        old = prepare(holder, mon, name)
        # The open transaction is in the middle of something on the name: it
        # holds the lease's lock (a guarded write, a release, renew or force
        # release), or has written a record it has not committed (a grant).
        pid = holder.info.backend_pid
        xid = one(mon, "SELECT backend_xid FROM pg_stat_activity WHERE pid = %s", (pid,))
        assert it_support.fenced_locks_of(mon, pid) or xid is not None, "the holder has nothing in flight"

        # try: NULL at once, every time
        times = []
        for _ in range(3):
            token, ms = timed_try(other, name)
            assert token is None, f"{case}: try returned {token} during the open transaction"
            times.append(ms)
        print(f"{case}: try returned NULL in {', '.join(f'{t:.1f}' for t in times)} ms")
        assert max(times) < TRY_BOUND_S * 1000
        assert one(other, "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'") == 0

        # acquire: waits until the holder's transaction ends
        call = start(lambda: one(acq, "SELECT fenced_lock_acquire(%s, '30 s', %s::interval)",
                                 (name, "20 s" if granted_after else "1500 ms")))
        pid = acq.info.backend_pid
        wait_until(lambda: it_support.is_queued(mon, pid) or not call.is_alive(), 10, what="the acquirer to queue")
        time.sleep(0.3)
        assert call.is_alive(), f"{case}: acquire did not wait for the open transaction: {call.error or call.result}"
        ended = time.monotonic()
        holder.execute(end)
        if granted_after:
            token = call.outcome(10)
            print(f"{case}: acquire granted {elapsed_ms(ended, call.finished_at):.1f} ms after the transaction ended")
            assert call.finished_at >= ended
            assert old is None or token > old
            # ordering: whatever the holder's transaction committed came first
            if case == "guarded_write_expired_lease":
                assert one(mon, "SELECT fence_token FROM docs WHERE id = %s", (name.split(":", 1)[1],)) == old
                assert one(mon, "SELECT ended_by FROM fenced_lock_history WHERE token = %s", (old,)) == "expiry"
                with pytest.raises(psycopg.Error) as err:
                    holder.execute("UPDATE docs SET body = 'late' WHERE id = %s", (name.split(":", 1)[1],))
                assert err.value.sqlstate == "FL001"
            assert one(acq, "SELECT fenced_lock_release(%s, %s)", (name, token)) is True
        else:
            # the holder's lease is live after its transaction: the acquire keeps
            # waiting (its wait runs out), and never gets a second live lease
            with pytest.raises(psycopg.Error) as err:
                call.outcome(10)
            assert err.value.sqlstate == "55P03"
            live = mon.execute("SELECT token FROM fenced_lock_leases WHERE name = %s AND live", (name,)).fetchall()
            assert len(live) == 1
            assert one(mon, "SELECT fenced_lock_force_release(%s)", (name,)) is True
