"""docs/reference.md, "Modes", and docs/design.md, "Modes" and "Waiting"
(invariants 1, 3, 4, 8 and 11): shared leases and counting semaphores
against the real server, with several connections and client processes.

- A semaphore of N admits N permit holders, each fenced by its own token: a
  holder frozen (SIGSTOP) past its ttl loses its permit to a waiter, and its
  late guarded write is refused (FL001); the server's history never shows
  more than N permits live at one instant, and tokens grow in grant order.
- Shared leases write through a guard given 'shared', each with its own
  token while it is live; a guard without it refuses them (FL003). An
  exclusive request is granted only once every shared lease has ended.
- Under an exclusive lease an UPDATE never lowers the row's token; permit
  holders write one row in any order.
- The same holder (or session) gets its token back for the same mode and
  FL003 for another; a change of mode is atomic as a release and an acquire
  in one transaction.
- Nobody waits for themselves: FL003 at once, single and _all.
- Waiters: a semaphore's waiter is served as soon as a permit frees
  (release, expiry, kill -9 of a session-bound holder's client); a queued
  exclusive request keeps later shared requests behind it, under a loop of
  readers.
- The views, the per-mode counters and the NOTIFY payloads say the mode and
  the count of every lease and waiter of a mixed workload, exactly.

Handoff times are printed; bounds are generous (the machine is shared).
"""

import signal
import threading
import time
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

import it_support
from it_support import elapsed_ms, start, wait_until
from modes_support import (
    Listener,
    assert_tokens_grow_in_grant_order,
    history_of,
    lease_end,
    lease_state,
    most_live_at_once,
    one,
    run_example,
    sqlstate,
)

HANDOFF_BOUND_S = 2.0  # "as soon as" takes milliseconds; asserted generously
AT_ONCE_S = 5.0        # an FL003 that must not wait: far below the wait it was given


@pytest.fixture(scope="module")
def app(cluster, db):
    with cluster.connect(db) as su:
        su.execute("CREATE TABLE pool_slots (worker text PRIMARY KEY, n int NOT NULL, fence_token bigint)")
        su.execute("SELECT fenced_lock_protect('pool_slots', 'modes:pool')")
    return db


@pytest.fixture
def mon(cluster, app):
    with cluster.connect(app) as conn:
        yield conn


def try_acquire(conn, name, ttl="30 s", holder=None, shared=False, permits=1, session_bound=False):
    return one(conn, "SELECT fenced_lock_try_acquire(%s, %s::interval, %s, session_bound => %s, shared => %s, "
                     "permits => %s)", (name, ttl, holder, session_bound, shared, permits))


ACQUIRE = ("SELECT fenced_lock_acquire(%s, %s::interval, %s::interval, %s, session_bound => %s, shared => %s, "
           "permits => %s)")


def acquire(conn, name, ttl="30 s", wait="20 s", holder=None, shared=False, permits=1, session_bound=False):
    return one(conn, ACQUIRE, (name, ttl, wait, holder, session_bound, shared, permits))


def release(conn, name, token):
    return one(conn, "SELECT fenced_lock_release(%s, %s)", (name, token))


def live_leases(mon, name):
    """(token, holder, mode, permits) of every live lease of `name`, by token."""
    return mon.execute("SELECT token, holder, mode, permits FROM fenced_lock_leases WHERE name = %s AND live "
                       "ORDER BY token", (name,)).fetchall()


def start_waiter(conn, mon, fn, what):
    """Run `fn` in a thread and return once conn's backend is visibly queued."""
    call = start(fn, name=what)
    wait_until(lambda: it_support.is_queued(mon, conn.info.backend_pid) or not call.is_alive(), 10,
               what=f"{what} to queue")
    assert call.is_alive(), f"{what} did not wait: {call.error or call.result}"
    return call


def next_of(client, events, timeout):
    """The next message of `client` that is one of `events` (others skipped)."""
    deadline = time.monotonic() + timeout
    while True:
        msg = client.message(max(0.01, deadline - time.monotonic()))
        if msg is not None and msg["event"] in events:
            return msg
        assert msg is None or msg["event"] != "exit", f"client {client.pid} exited"
        assert time.monotonic() < deadline, f"client {client.pid}: none of {events} within {timeout} s"


def make_table(su, table, template, accepts=None):
    """`table (id text PRIMARY KEY, body text, fence_token bigint)` guarded by
    fenced_lock_guard(template, 'fence_token'[, accepts])."""
    args = [sql.Literal(template), sql.Literal("fence_token")] + ([sql.Literal(accepts)] if accepts else [])
    su.execute(sql.SQL("CREATE TABLE {} (id text PRIMARY KEY, body text, fence_token bigint)").format(
        sql.Identifier(table)))
    su.execute(sql.SQL("CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON {} FOR EACH ROW "
                       "EXECUTE FUNCTION fenced_lock_guard({})").format(sql.Identifier(table),
                                                                        sql.SQL(", ").join(args)))


def upsert(table):
    return sql.SQL("INSERT INTO {} VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE "
                   "SET body = EXCLUDED.body, fence_token = EXCLUDED.fence_token").format(sql.Identifier(table))


def write(conn, table, row_id, body, token):
    conn.execute(upsert(table), (row_id, body, token))


def rows(mon, table):
    return mon.execute(sql.SQL("SELECT id, body, fence_token FROM {} ORDER BY id").format(
        sql.Identifier(table))).fetchall()


# -- a semaphore of N: a frozen holder loses its permit, and its late write ----------------------

# One permit holder: acquire a permit, then write its own row of pool_slots
# (guarded by the semaphore's name) in a loop with its token, renewing every
# `renew_every` s (a keepalive). A refused write ends the loop.
PERMIT_WORKER = '''
name, me = ARGS["name"], ARGS["me"]
token = conn.execute("SELECT fenced_lock_acquire(%s, %s::interval, '20 s', %s, permits => %s)",
                     (name, ARGS["ttl"], me, ARGS["permits"])).fetchone()[0]
say("granted", token=token)
n, renewed = 0, time.monotonic()
while True:
    n += 1
    try:
        conn.execute("INSERT INTO pool_slots VALUES (%s, %s, %s) ON CONFLICT (worker) DO UPDATE "
                     "SET n = EXCLUDED.n, fence_token = EXCLUDED.fence_token", (me, n, token))
    except psycopg.Error as e:
        say("refused", n=n, sqlstate=e.sqlstate)
        break
    if time.monotonic() - renewed >= ARGS["renew_every"]:
        if not conn.execute("SELECT fenced_lock_renew(%s, %s)", (name, token)).fetchone()[0]:
            say("renew_refused", n=n)
        renewed = time.monotonic()
    time.sleep(0.05)
time.sleep(600)
'''


@pytest.mark.budget(90)
def test_permit_holder_stopped_past_its_ttl_loses_its_permit_to_a_waiter_and_its_late_write_is_refused(
        cluster, app, mon, children):
    name, n = "modes:pool", 3
    workers = [children.start(cluster.dsn(app), PERMIT_WORKER, name=name, me=f"w{i}", ttl="2 s", permits=n,
                              renew_every=0.3) for i in range(n)]
    tokens = [w.expect("granted", 10)["token"] for w in workers]
    slot = lambda who: mon.execute("SELECT n, fence_token FROM pool_slots WHERE worker = %s", (who,)).fetchone()
    wait_until(lambda: all(slot(f"w{i}") for i in range(n)), 10, what="every worker to write")
    assert live_leases(mon, name) == [(t, f"w{i}", "permit", n) for i, t in enumerate(tokens)]
    wait_until(lambda: one(mon, "SELECT count(*) FROM fenced_lock_leases WHERE name = %s AND live "
                                "AND expires_at > acquired_at + interval '2 s'", (name,)) == n, 10,
               what="every worker's keepalive to renew")

    with cluster.connect(app) as wc:
        call = start_waiter(wc, mon, lambda: acquire(wc, name, "30 s", "20 s", "waiter", permits=n), "the waiter")
        frozen = workers[0]
        frozen.send(signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            got = call.outcome(15)
            print(f"semaphore of {n}: the waiter got the frozen holder's permit "
                  f"{elapsed_ms(stopped, call.finished_at):.0f} ms after SIGSTOP (ttl 2 s)")
            assert got > max(tokens)
            assert one(mon, "SELECT fenced_lock_validate(%s, %s)", (name, tokens[0])) is False
            assert [one(mon, "SELECT fenced_lock_validate(%s, %s)", (name, t)) for t in tokens[1:]] == [True, True]
            frozen_row = slot("w0")
            assert frozen_row[1] == tokens[0]
            wc.execute("INSERT INTO pool_slots VALUES ('waiter', 1, %s)", (got,))  # its own permit writes
        finally:
            frozen.send(signal.SIGCONT)
        refused = next_of(frozen, {"refused"}, 10)
        assert refused["sqlstate"] == "FL001", refused
        assert slot("w0") == frozen_row  # the late write changed nothing
        # the two holders that kept their permits are still writing
        seen = {i: slot(f"w{i}")[0] for i in (1, 2)}
        wait_until(lambda: all(slot(f"w{i}")[0] > seen[i] for i in (1, 2)), 10, what="the live holders to write on")
        for w in workers:
            w.close()
        for t in tokens[1:] + [got]:
            assert release(mon, name, t) is True

    h = history_of(mon, [name])
    assert [r["token"] for r in h] == tokens + [got]
    assert all((r["mode"], r["permits"]) == ("permit", n) for r in h)
    assert [r["ended_by"] for r in h] == ["expiry", "release", "release", "release"]
    assert h[0]["ended_at"] == h[0]["expires_at"]
    assert h[0]["expires_at"] - h[0]["acquired_at"] > timedelta(seconds=2)  # it was renewed
    assert h[3]["acquired_at"] >= h[0]["ended_at"]  # the waiter came in at the expiry, not before
    most = most_live_at_once(h)
    print(f"semaphore of {n}: at most {most} permits live at once in the history")
    assert most == n
    assert_tokens_grow_in_grant_order(h)
    assert one(mon, "SELECT count(*) FROM pool_slots WHERE fence_token <> ALL(%s)", (tokens + [got],)) == 0


# -- shared leases and the guard ----------------------------------------------------------------


def test_shared_holders_write_with_their_own_tokens_while_live_and_are_refused_after_their_own_release(
        cluster, app, mon):
    name, table = "modes:catalog", "catalog_shared"
    make_table(mon, table, name, "shared")
    conns = [cluster.connect(app) for _ in range(3)]
    try:
        tokens = [try_acquire(c, name, holder=f"r{i}", shared=True) for i, c in enumerate(conns)]
        assert None not in tokens and tokens == sorted(set(tokens))
        assert live_leases(mon, name) == [(t, f"r{i}", "shared", None) for i, t in enumerate(tokens)]
        # one row written by each in turn, the stored token going down as well as up, and a row each
        for i in (2, 0, 1):
            write(conns[i], table, "common", f"by r{i}", tokens[i])
            assert rows(mon, table)[0] == ("common", f"by r{i}", tokens[i])
            write(conns[i], table, f"r{i}", "mine", tokens[i])
        assert release(conns[0], name, tokens[0]) is True
        before = rows(mon, table)
        assert sqlstate(conns[0], upsert(table), ("common", "late r0", tokens[0])) == "FL001"
        assert sqlstate(conns[0], upsert(table), ("r0", "late r0", tokens[0])) == "FL001"
        assert sqlstate(conns[0], "SELECT fenced_lock_assert(%s, %s)", (name, tokens[0])) == "FL001"
        assert rows(mon, table) == before
        # the others' leases are untouched by r0's release
        write(conns[1], table, "common", "by r1 after r0 left", tokens[1])
        write(conns[2], table, "r2", "mine again", tokens[2])
        for i in (1, 2):
            assert release(conns[i], name, tokens[i]) is True
            assert sqlstate(conns[i], upsert(table), (f"r{i}", "late", tokens[i])) == "FL001"
        assert rows(mon, table) == [("common", "by r1 after r0 left", tokens[1]), ("r0", "mine", tokens[0]),
                                    ("r1", "mine", tokens[1]), ("r2", "mine again", tokens[2])]
        assert [r["ended_by"] for r in history_of(mon, [name])] == ["release"] * 3
    finally:
        for c in conns:
            c.close()


def test_exclusive_request_is_granted_only_after_every_shared_lease_ends_and_its_write_waits_for_no_one(
        cluster, app, mon):
    name, table = "modes:catalog:wait", "catalog_wait"
    make_table(mon, table, name, "shared")
    r1, r2, w, r3 = (cluster.connect(app) for _ in range(4))
    try:
        t1 = try_acquire(r1, name, "30 s", "r1", shared=True)
        t2 = try_acquire(r2, name, "2 s", "r2", shared=True)  # ends by expiry
        call = start_waiter(w, mon, lambda: acquire(w, name, "30 s", "20 s", "w"), "the exclusive request")
        assert mon.execute("SELECT holder, position, mode, permits FROM fenced_lock_waiters WHERE name = %s",
                           (name,)).fetchall() == [("w", 1, "exclusive", 1)]
        # a queued exclusive request blocks no shared holder's write (docs/design.md, L4)
        for c, t, who in ((r1, t1, "r1"), (r2, t2, "r2")):
            c.execute("SET statement_timeout = '10s'")
            t0 = time.monotonic()
            write(c, table, who, "while the writer waits", t)
            print(f"{who}'s guarded write beside a queued exclusive request: {elapsed_ms(t0):.1f} ms")
        assert release(r1, name, t1) is True
        got = call.outcome(15)
        h = {r["token"]: r for r in history_of(mon, [name])}
        assert h[t2]["ended_by"] == "expiry" and h[t1]["ended_by"] == "release"
        assert h[got]["acquired_at"] >= max(lease_end(h[t1]), lease_end(h[t2])), h
        assert h[got]["mode"] == "exclusive" and got > t2
        print(f"exclusive lease granted {(h[got]['acquired_at'] - h[t2]['ended_at']).total_seconds() * 1000:.1f} ms "
              "after the last shared lease expired")
        # a shared request now waits behind the exclusive lease, whose write waits for nobody
        call3 = start_waiter(r3, mon, lambda: acquire(r3, name, "30 s", "20 s", "r3", shared=True),
                             "a later shared request")
        w.execute("SET statement_timeout = '10s'")
        t0 = time.monotonic()
        write(w, table, "r1", "by the writer", got)
        print(f"the exclusive holder's guarded write with a shared request queued: {elapsed_ms(t0):.1f} ms")
        assert sqlstate(r2, upsert(table), ("r2", "late r2", t2)) == "FL001"
        assert release(w, name, got) is True
        t3 = call3.outcome(HANDOFF_BOUND_S + 5)
        assert t3 > got
        write(r3, table, "r3", "reader after the writer", t3)
        assert rows(mon, table) == [("r1", "by the writer", got), ("r2", "while the writer waits", t2),
                                    ("r3", "reader after the writer", t3)]
        assert release(r3, name, t3) is True
    finally:
        it_support.cancel_and_close(mon, [r1, r2, w, r3])


def test_a_guard_without_shared_refuses_a_shared_token_with_FL003_and_the_row_is_unchanged(cluster, app, mon):
    plain, ctl = "catalog_plain", "catalog_plain_ctl"
    make_table(mon, plain, "modes:plain:{id}")
    make_table(mon, ctl, "modes:plain:{id}", "shared")
    with cluster.connect(app) as a:
        e = try_acquire(a, "modes:plain:1", holder="writer")
        write(a, plain, "1", "exclusive", e)
        assert release(a, "modes:plain:1", e) is True
        s1 = try_acquire(a, "modes:plain:1", holder="reader", shared=True)
        s2 = try_acquire(a, "modes:plain:2", holder="reader", shared=True)
        before = rows(mon, plain)
        assert sqlstate(a, upsert(plain), ("1", "by a shared lease", s1)) == "FL003"
        assert sqlstate(a, sql.SQL("UPDATE {} SET body = 'x', fence_token = %s WHERE id = '1'").format(
            sql.Identifier(plain)), (s1,)) == "FL003"
        assert sqlstate(a, upsert(plain), ("2", "a new row", s2)) == "FL003"
        assert rows(mon, plain) == before == [("1", "exclusive", e)]
        # the same tokens through a guard given 'shared' (control)
        write(a, ctl, "1", "by a shared lease", s1)
        write(a, ctl, "2", "by a shared lease", s2)
        assert rows(mon, ctl) == [("1", "by a shared lease", s1), ("2", "by a shared lease", s2)]
        assert release(a, "modes:plain:1", s1) is True and release(a, "modes:plain:2", s2) is True


def test_permit_holders_write_one_row_in_any_order_but_an_exclusive_update_never_lowers_the_stored_token(
        cluster, app, mon):
    """Two rules of the guard's UPDATE (docs/reference.md, "The guard
    trigger"): permits live together, so each writes the row with its own
    token in any order; under an exclusive lease the stored token may not go
    down. A live exclusive lease cannot meet a higher stored token of its own
    name in normal operation (tokens grow), so the superuser plants one with
    the triggers off, as a restore from elsewhere would."""
    table, name = "ord", "modes:ord:1"
    make_table(mon, table, "modes:ord:{id}")
    conns = [cluster.connect(app) for _ in range(3)]
    try:
        p = [try_acquire(c, name, holder=f"p{i}", permits=3) for i, c in enumerate(conns)]
        assert p == sorted(p)
        for i in (2, 0, 1):  # the stored token goes from p2's down to p0's
            write(conns[i], table, "1", f"p{i}", p[i])
            assert rows(mon, table) == [("1", f"p{i}", p[i])]
        assert release(conns[0], name, p[0]) is True
        assert sqlstate(conns[0], upsert(table), ("1", "late p0", p[0])) == "FL001"
        assert rows(mon, table) == [("1", "p1", p[1])]
        for i in (1, 2):
            assert release(conns[i], name, p[i]) is True

        a = conns[0]
        e = try_acquire(a, name, holder="e")
        write(a, table, "1", "e", e)
        write(a, table, "1", "e again", e)  # the same token again is not lower
        mon.execute("BEGIN")
        mon.execute("SET LOCAL session_replication_role = replica")
        mon.execute("UPDATE ord SET fence_token = %s WHERE id = '1'", (e + 1000,))
        mon.execute("COMMIT")
        before = rows(mon, table)
        err = None
        try:
            write(a, table, "1", "lower than stored", e)
        except psycopg.Error as x:
            err = x
        assert err is not None and err.sqlstate == "FL001", err
        assert rows(mon, table) == before == [("1", "e again", e + 1000)]
        assert one(a, "SELECT fenced_lock_validate(%s, %s)", (name, e)) is True  # refused though live
        assert release(a, name, e) is True
        # under permits, the same higher stored token does not matter
        q = try_acquire(a, name, holder="q", permits=2)
        assert q < e + 1000
        write(a, table, "1", "permit below the stored token", q)
        assert rows(mon, table) == [("1", "permit below the stored token", q)]
        assert release(a, name, q) is True
    finally:
        for c in conns:
            c.close()


# -- the same holder or session, another mode ---------------------------------------------------

MODES = {
    "exclusive": dict(shared=False, permits=1),
    "shared": dict(shared=True, permits=1),
    "permit_of_3": dict(shared=False, permits=3),
}
ASKED = dict(MODES, permit_of_2=dict(shared=False, permits=2))


@pytest.mark.parametrize("by", ["holder", "session"])
@pytest.mark.parametrize("held", list(MODES))
def test_the_same_holder_or_session_gets_its_token_back_for_the_same_mode_and_FL003_for_another(
        cluster, app, mon, held, by):
    """By holder: from another connection of the role. By session: a
    session-bound lease without a holder, asked again by its session. No
    upgrade from shared to exclusive, no downgrade from exclusive to shared,
    no other count: FL003 at once (not after the wait), nothing changed."""
    name = f"modes:retry:{held}:{by}"
    kw = dict(holder="h") if by == "holder" else dict(session_bound=True)
    with cluster.connect(app) as a, cluster.connect(app) as b:
        again = b if by == "holder" else a
        t = try_acquire(a, name, "10 s", **kw, **MODES[held])
        first = mon.execute("SELECT expires_at FROM fenced_lock_leases WHERE token = %s", (t,)).fetchone()[0]
        assert try_acquire(again, name, "60 s", **kw, **MODES[held]) == t
        assert acquire(again, name, "90 s", "5 s", **kw, **MODES[held]) == t
        assert mon.execute("SELECT expires_at FROM fenced_lock_leases WHERE token = %s", (t,)).fetchone()[0] > first
        state = lease_state(mon, [name])
        for asked, mode in ASKED.items():
            if asked == held:
                continue
            args = (name, kw.get("holder"), by == "session", mode["shared"], mode["permits"])
            assert sqlstate(again, "SELECT fenced_lock_try_acquire(%s, '30 s', %s, session_bound => %s, "
                                   "shared => %s, permits => %s)", args) == "FL003", asked
            t0 = time.monotonic()
            assert sqlstate(again, ACQUIRE, (name, "30 s", "30 s", kw.get("holder"), by == "session",
                                             mode["shared"], mode["permits"])) == "FL003", asked
            assert time.monotonic() - t0 < AT_ONCE_S
        assert lease_state(mon, [name]) == state
        assert live_leases(mon, name) == [(t, kw.get("holder"), {"exclusive": "exclusive", "shared": "shared",
                                                                 "permit_of_3": "permit"}[held],
                                           None if held == "shared" else MODES[held]["permits"])]
        assert release(a, name, t) is True


def test_changing_modes_by_release_and_acquire_in_one_transaction_lets_nobody_in_between(cluster, app, mon):
    name = "modes:change"
    with cluster.connect(app) as a, cluster.connect(app) as b:
        held = try_acquire(a, name, holder="h", shared=True)
        held_as = ("shared", None)
        for new_mode, shown in ((dict(shared=False), ("exclusive", 1)), (dict(shared=True), ("shared", None))):
            a.execute("BEGIN")
            assert release(a, name, held) is True
            new = try_acquire(a, name, holder="h", **new_mode)
            assert new is not None and new > held
            # until the commit the name is held, in both modes: nobody slips in
            assert try_acquire(b, name, holder="x", shared=True) is None
            assert try_acquire(b, name, holder="x") is None
            assert sqlstate(b, ACQUIRE, (name, "30 s", "300 ms", "x", False, True, 1)) == "55P03"
            assert live_leases(mon, name) == [(held, "h") + held_as]
            a.execute("COMMIT")
            assert live_leases(mon, name) == [(new, "h") + shown]
            held, held_as = new, shown
        h = history_of(mon, [name])
        assert [(r["mode"], r["ended_by"]) for r in h] == [("shared", "release"), ("exclusive", "release"),
                                                          ("shared", None)]
        assert release(a, name, held) is True


# -- nobody waits for themselves ----------------------------------------------------------------


def _plain_lease_without_holder(a, name):
    assert try_acquire(a, name) is not None
    return "SELECT fenced_lock_acquire(%s, '30 s', NULL)", (name,), None


def _granted_by_this_transaction(a, name):
    a.execute("BEGIN")
    assert try_acquire(a, name, holder="first") is not None
    return "SELECT fenced_lock_acquire(%s, '30 s', '30 s', 'second')", (name,), "ROLLBACK"


def _all_after_a_plain_lease_without_holder(a, name):
    assert try_acquire(a, name + ":1") is not None
    return "SELECT fenced_lock_acquire_all(%s, '30 s', NULL)", ([name + ":0", name + ":1"],), None


def _all_granted_by_this_transaction(a, name):
    a.execute("BEGIN")
    assert one(a, "SELECT fenced_lock_acquire_all(%s, '30 s', '1 s', 'first')", ([name + ":0", name + ":1"],))
    return "SELECT fenced_lock_acquire_all(%s, '30 s', '30 s', 'second')", ([name + ":1", name + ":2"],), "ROLLBACK"


OWN = {
    "plain_lease_without_holder": _plain_lease_without_holder,
    "granted_by_this_transaction": _granted_by_this_transaction,
    "all_after_a_plain_lease_without_holder": _all_after_a_plain_lease_without_holder,
    "all_granted_by_this_transaction": _all_granted_by_this_transaction,
}


@pytest.mark.parametrize("case", list(OWN))
def test_an_acquire_that_could_only_be_granted_after_its_own_sessions_lease_ends_fails_at_once_with_FL003(
        cluster, app, mon, case):
    name = f"modes:own:{case}"
    with cluster.connect(app) as a:
        a.execute("SET statement_timeout = '20s'")  # a wait would show as 57014, not hang
        query, params, end = OWN[case](a, name)
        state = lease_state(mon)
        t0 = time.monotonic()
        code = sqlstate(a, query, params)
        ms = elapsed_ms(t0)
        print(f"{case}: {code} after {ms:.1f} ms")
        assert code == "FL003"
        assert ms < AT_ONCE_S * 1000
        if end:
            a.execute(end)
        else:
            assert lease_state(mon) == state  # nothing granted, nothing ended
        assert it_support.queue_locks(mon, a.info.backend_pid) == []
        for n in (name, name + ":0", name + ":1", name + ":2"):
            mon.execute("SELECT fenced_lock_force_release(%s)", (n,))


def test_with_a_matching_holder_the_sessions_own_lease_comes_back_and_another_holder_waits(cluster, app, mon):
    """A lease with a holder belongs to its holder, not to the session: the
    same holder gets its token back (single and _all); the same session
    naming another holder waits like anyone (55P03 after its wait)."""
    name = "modes:own:holder"
    with cluster.connect(app) as a:
        t = try_acquire(a, name, holder="h")
        assert acquire(a, name, "30 s", "30 s", "h") == t
        got = one(a, "SELECT fenced_lock_acquire_all(%s, '30 s', '30 s', 'h')", ([name + ":other", name],))
        assert got[1] == t and got[0] > t
        t0 = time.monotonic()
        assert sqlstate(a, ACQUIRE, (name, "30 s", "500 ms", "k", False, False, 1)) == "55P03"
        assert time.monotonic() - t0 >= 0.45
        assert one(a, "SELECT fenced_lock_release_all(%s, %s)", ([name + ":other", name], got)) == 2


# -- waiters ------------------------------------------------------------------------------------

SEM_HOLDER = '''
token = conn.execute("SELECT fenced_lock_try_acquire(%s, '60 s', %s, session_bound => true, permits => %s)",
                     (ARGS["name"], ARGS["holder"], ARGS["permits"])).fetchone()[0]
say("granted", token=token)
time.sleep(600)
'''


@pytest.mark.parametrize("how", ["release", "expiry", "session_end"])
def test_a_semaphore_waiter_is_served_as_soon_as_a_permit_frees(cluster, app, mon, children, how):
    name = f"modes:sem:{how}"
    with cluster.connect(app) as keep, cluster.connect(app) as free, cluster.connect(app) as wc:
        if how == "session_end":
            holder = children.start(cluster.dsn(app), SEM_HOLDER, name=name, holder="freed", permits=2)
            freed = holder.expect("granted", 10)["token"]
            assert mon.execute("SELECT session_bound, pid FROM fenced_lock_leases WHERE token = %s",
                               (freed,)).fetchone() == (True, holder.backend_pid)
        else:
            freed = try_acquire(free, name, "1.5 s" if how == "expiry" else "60 s", "freed", permits=2)
        kept = try_acquire(keep, name, "60 s", "kept", permits=2)
        assert try_acquire(wc, name, "30 s", "waiter", permits=2) is None
        call = start_waiter(wc, mon, lambda: acquire(wc, name, "30 s", "20 s", "waiter", permits=2), "the waiter")
        if how == "release":
            t0 = time.monotonic()
            assert release(free, name, freed) is True
        elif how == "session_end":
            t0 = holder.kill(signal.SIGKILL)
        got = call.outcome(15)
        h = {r["token"]: r for r in history_of(mon, [name])}
        if how == "expiry":
            ms = (h[got]["acquired_at"] - h[freed]["ended_at"]).total_seconds() * 1000
            assert ms >= 0
        else:
            ms = elapsed_ms(t0, call.finished_at)
        print(f"semaphore waiter served {ms:.1f} ms after a permit freed by {how}")
        assert ms < HANDOFF_BOUND_S * 1000
        assert got > kept
        assert h[freed]["ended_by"] == how
        assert live_leases(mon, name) == [(kept, "kept", "permit", 2), (got, "waiter", "permit", 2)]
        assert release(keep, name, kept) is True and release(wc, name, got) is True


@pytest.mark.budget(60)
def test_a_queued_exclusive_request_keeps_later_shared_requests_behind_it_in_a_loop_of_readers(cluster, app, mon):
    """Three readers take and give back shared leases in a loop, so the name
    is never free of readers for long; a writer's exclusive request is still
    served (writers are not starved): once it is queued, no reader is granted
    before it."""
    name = "modes:rw"
    stop = threading.Event()
    grants = {i: 0 for i in range(3)}

    def reader(i):
        with cluster.connect(app) as c:
            while not stop.is_set():
                t = acquire(c, name, "5 s", "20 s", f"r{i}", shared=True)
                grants[i] += 1
                time.sleep(0.03)
                assert release(c, name, t) is True
                time.sleep(0.005 * i)

    readers = [start(lambda i=i: reader(i), name=f"reader-{i}") for i in range(3)]
    with cluster.connect(app) as w:
        try:
            wait_until(lambda: min(grants.values()) >= 3, 20, what="the readers to loop")
            call = start_waiter(w, mon, lambda: acquire(w, name, "10 s", "20 s", "writer"), "the writer")
            queued_at = one(mon, "SELECT clock_timestamp()")
            t = call.outcome(15)
            before = dict(grants)
            assert live_leases(mon, name) == [(t, "writer", "exclusive", 1)]
            # while the writer holds, every reader queues behind it
            wait_until(lambda: one(mon, "SELECT count(*) FROM fenced_lock_waiters WHERE name = %s AND mode = 'shared'",
                                   (name,)) == 3, 10, what="the readers to queue behind the writer")
            assert grants == before
            assert release(w, name, t) is True
            wait_until(lambda: all(grants[i] > before[i] for i in grants), 20, what="the readers to go on")
        finally:
            stop.set()
            for r in readers:
                r.outcome(30)
    h = history_of(mon, [name])
    writer = next(r for r in h if r["holder"] == "writer")
    jumped = [r["token"] for r in h if r["mode"] == "shared" and queued_at < r["acquired_at"] < writer["acquired_at"]]
    waited = (writer["acquired_at"] - queued_at).total_seconds() * 1000
    ahead = sum(1 for r in h if r["acquired_at"] < queued_at < lease_end(r))
    print(f"the writer waited {waited:.0f} ms behind {ahead} readers' leases; {len(h) - 1} reader grants in all")
    assert jumped == []
    assert all(lease_end(r) <= writer["acquired_at"] for r in h if r["acquired_at"] < writer["acquired_at"])
    assert all(r["acquired_at"] >= writer["ended_at"] for r in h if r["token"] > writer["token"])
    assert sum(1 for r in h if r["token"] > writer["token"]) >= 3


# -- what the views, the counters and NOTIFY say about modes ------------------------------------

BY_MODE = ["grants", "renewals", "releases", "expiries", "force_releases", "session_ends", "waits", "wait_timeouts"]


def by_mode(conn):
    got = {r[0]: dict(zip(BY_MODE, r[1:])) for r in conn.execute(
        f"SELECT mode, {', '.join(BY_MODE)} FROM fenced_lock_stats_by_mode").fetchall()}
    assert set(got) == {"exclusive", "shared", "permit"}
    totals = dict(zip(BY_MODE, conn.execute(f"SELECT {', '.join(BY_MODE)} FROM fenced_lock_stats").fetchone()))
    for k in BY_MODE:  # the rows of a column add up to its total
        assert sum(got[m][k] for m in got) == totals[k], (k, got, totals)
    return got


@pytest.mark.budget(90)
def test_views_counters_and_notify_show_the_mode_and_permits_of_a_mixed_workload(preload_cluster):
    c = preload_cluster
    dbname = c.create_database("it_modes_mixed")
    c.sql(f'ALTER DATABASE "{dbname}" SET fenced_lock.notify = on')
    conns = []

    def connect():
        conns.append(c.connect(dbname))
        return conns[-1]

    try:
        mon, lc = connect(), connect()
        listener = Listener(lc)
        listener.until_marker(mon)
        start_counts = by_mode(mon)
        r1, r2, p1, p2, ec, f1, f2, w1, w2, w3, x = (connect() for _ in range(11))
        tr1 = try_acquire(r1, "mix:s", "60 s", "r1", shared=True)
        tr2 = try_acquire(r2, "mix:s", "60 s", "r2", shared=True)
        tp1 = try_acquire(p1, "mix:p", "60 s", "p1", permits=3)
        tp2 = try_acquire(p2, "mix:p", "60 s", "p2", permits=3)
        te = try_acquire(ec, "mix:e", "60 s", "e1", session_bound=True)
        tf1 = try_acquire(f1, "mix:f", "60 s", "f1", permits=2)
        tf2 = try_acquire(f2, "mix:f", "60 s", "f2", permits=2)
        assert one(r1, "SELECT fenced_lock_renew('mix:s', %s)", (tr1,)) is True
        assert one(p1, "SELECT fenced_lock_renew('mix:p', %s)", (tp1,)) is True
        assert one(ec, "SELECT fenced_lock_renew('mix:e', %s)", (te,)) is True
        assert try_acquire(x, "mix:p", "60 s", "p2", permits=3) == tp2  # a re-acquire is a renewal
        c1 = start_waiter(w1, mon, lambda: acquire(w1, "mix:s", "60 s", "20 s", "w1"), "w1")
        c2 = start_waiter(w2, mon, lambda: acquire(w2, "mix:s", "60 s", "20 s", "w2", shared=True), "w2")
        c3 = start_waiter(w3, mon, lambda: acquire(w3, "mix:f", "60 s", "20 s", "w3", permits=2), "w3")
        wait_until(lambda: one(mon, "SELECT count(*) FROM fenced_lock_waiters") == 3, 10, what="three waiters")
        assert mon.execute("SELECT name, holder, position, mode, permits, pid FROM fenced_lock_waiters "
                           "ORDER BY name, position").fetchall() == [
            ("mix:f", "w3", 1, "permit", 2, w3.info.backend_pid),
            ("mix:s", "w1", 1, "exclusive", 1, w1.info.backend_pid),
            ("mix:s", "w2", 2, "shared", None, w2.info.backend_pid)]
        assert mon.execute("SELECT name, token, holder, live, session_bound, mode, permits, pid IS NOT NULL "
                           "FROM fenced_lock_leases ORDER BY name, token").fetchall() == [
            ("mix:e", te, "e1", True, True, "exclusive", 1, True),
            ("mix:f", tf1, "f1", True, False, "permit", 2, False),
            ("mix:f", tf2, "f2", True, False, "permit", 2, False),
            ("mix:p", tp1, "p1", True, False, "permit", 3, False),
            ("mix:p", tp2, "p2", True, False, "permit", 3, False),
            ("mix:s", tr1, "r1", True, False, "shared", None, False),
            ("mix:s", tr2, "r2", True, False, "shared", None, False)]
        assert sqlstate(x, ACQUIRE, ("mix:e", "60 s", "200 ms", "x", False, True, 1)) == "55P03"

        assert release(r1, "mix:s", tr1) is True and release(r2, "mix:s", tr2) is True
        tw1 = c1.outcome(HANDOFF_BOUND_S + 5)
        assert live_leases(mon, "mix:s") == [(tw1, "w1", "exclusive", 1)]
        assert release(w1, "mix:s", tw1) is True
        tw2 = c2.outcome(HANDOFF_BOUND_S + 5)
        assert release(f1, "mix:f", tf1) is True
        tw3 = c3.outcome(HANDOFF_BOUND_S + 5)
        assert one(mon, "SELECT fenced_lock_force_release('mix:p')") is True
        ec.close()
        wait_until(lambda: one(mon, "SELECT count(*) FROM fenced_lock_leases WHERE name = 'mix:e'") == 0, 5,
                   what="the session's lease to end")
        tx1 = try_acquire(x, "mix:x", "200 ms", "x1", shared=True)
        wait_until(lambda: not one(mon, "SELECT live FROM fenced_lock_leases WHERE token = %s", (tx1,)), 5,
                   interval=0.02, what="the short shared lease to expire")
        tx2 = try_acquire(x, "mix:x", "60 s", "x2", shared=True)
        for conn, n, t in ((w2, "mix:s", tw2), (w3, "mix:f", tw3), (f2, "mix:f", tf2), (x, "mix:x", tx2)):
            assert release(conn, n, t) is True

        now = by_mode(mon)
        delta = {m: {k: now[m][k] - start_counts[m][k] for k in BY_MODE} for m in now}
        zero = dict.fromkeys(BY_MODE, 0)
        assert delta == {
            "exclusive": dict(zero, grants=2, renewals=1, releases=1, session_ends=1, waits=1),
            "shared": dict(zero, grants=5, renewals=1, releases=4, expiries=1, waits=2, wait_timeouts=1),
            "permit": dict(zero, grants=5, renewals=2, releases=3, force_releases=2, waits=1),
        }, delta

        seen = listener.until_marker(mon)
        per_name = {}
        for p in seen:
            assert set(p) == {"name", "event", "token", "mode"}, p
            per_name.setdefault(p["name"], []).append((p["event"], p["token"], p["mode"]))
        assert per_name == {
            "mix:s": [("grant", tr1, "shared"), ("grant", tr2, "shared"), ("release", tr1, "shared"),
                      ("release", tr2, "shared"), ("grant", tw1, "exclusive"), ("release", tw1, "exclusive"),
                      ("grant", tw2, "shared"), ("release", tw2, "shared")],
            "mix:p": [("grant", tp1, "permit"), ("grant", tp2, "permit"), ("force_release", tp1, "permit"),
                      ("force_release", tp2, "permit")],
            "mix:e": [("grant", te, "exclusive"), ("session_end", te, "exclusive")],
            "mix:f": [("grant", tf1, "permit"), ("grant", tf2, "permit"), ("release", tf1, "permit"),
                      ("grant", tw3, "permit"), ("release", tw3, "permit"), ("release", tf2, "permit")],
            "mix:x": [("grant", tx1, "shared"), ("expiry", tx1, "shared"), ("grant", tx2, "shared"),
                      ("release", tx2, "shared")],
        }, per_name
    finally:
        for conn in conns:
            conn.close()
        c.sql(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


# -- examples/api_pool.py: N workers, K permits --------------------------------------------------


@pytest.mark.budget(90)
def test_api_pool_example_never_has_more_than_k_permits_live_and_every_write_carries_a_live_permit_token(
        cluster, app, mon):
    k, workers, jobs, name = 2, 5, 20, "modes:partner-api"
    dsn = cluster.dsn(app)
    run_example("api_pool.py", "--dsn", dsn, "--name", name, "--setup")
    out = run_example("api_pool.py", "--dsn", dsn, "--name", name, "--workers", workers, "--permits", k,
                      "--jobs", jobs, "--call-ms", 40)
    done = out[-1]
    calls = [m for m in out if m["event"] == "call"]
    print(f"api_pool: {jobs} jobs by {workers} workers on {k} permits in {done['seconds']} s; the stand-in API "
          f"served at most {done['max_concurrent_calls']} calls at once; longest wait for a permit "
          f"{max(m['waited_ms'] for m in calls):.0f} ms")
    assert done["event"] == "done" and done["errors"] == [] and done["fenced"] == 0
    assert done["calls"] == jobs == len(calls)
    assert done["max_concurrent_calls"] <= k
    # from the server: never more than K permits live, each lease a permit of K, all given back
    h = history_of(mon, [name])
    assert len(h) == jobs
    assert all((r["mode"], r["permits"], r["ended_by"]) == ("permit", k, "release") for r in h)
    most = most_live_at_once(h)
    print(f"api_pool: at most {most} permits live at once in the history")
    assert most == k  # never more, and the workers did contend
    assert_tokens_grow_in_grant_order(h)
    assert len({r["holder"] for r in h}) == workers
    # every result was written under its worker's permit, while that permit was live
    lease = {r["token"]: r for r in h}
    results = mon.execute("SELECT job, worker, written_at, fence_token FROM api_results ORDER BY job").fetchall()
    assert [r[0] for r in results] == list(range(1, jobs + 1))
    for job, worker, written_at, token in results:
        r = lease[token]
        assert r["holder"] == worker, (job, r)
        assert r["acquired_at"] <= written_at < r["ended_at"], (job, written_at, r)
    assert len({r[3] for r in results}) == jobs  # one permit per call


# -- renewals racing with grants and guarded writes ---------------------------------------------
#
# A renew rewrites its lease's record (a new row version, with new index
# entries: expires_at is indexed) under its lease lock only
# (ShareUpdateExclusive; docs/design.md, "Lock protocol", L2), not under the
# name lock a grant decides under (L1). Holders renew all the time (a
# keepalive at a third of the ttl), so these tests renew in a loop while
# others try to get in, or write, and stop at the first wrong answer.

RENEW = "SELECT fenced_lock_renew(%s, %s, '5 min')"


def race(cluster, app, renewers, probes, bound_s):
    """Run renewers (name, token) and probes (functions of a connection that
    return a wrong answer, or None) in threads, until a probe finds one or
    `bound_s` passes. Returns (wrong answers, renew count, probe count, seconds)."""
    stop = threading.Event()
    wrong, counts, errors = [], {"renews": 0, "probes": 0}, []

    def renew_loop(name, token):
        with cluster.connect(app) as c:
            while not stop.is_set():
                assert one(c, RENEW, (name, token)) is True
                counts["renews"] += 1

    def probe_loop(probe):
        with cluster.connect(app) as c:
            while not stop.is_set():
                w = probe(c)
                counts["probes"] += 1
                if w is not None:
                    wrong.append(w)
                    stop.set()

    def guarded(fn, *args):
        def run():
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
                stop.set()
        return run

    t0 = time.monotonic()
    threads = [threading.Thread(target=guarded(renew_loop, n, t), daemon=True) for n, t in renewers]
    threads += [threading.Thread(target=guarded(probe_loop, p), daemon=True) for p in probes]
    for t in threads:
        t.start()
    stop.wait(bound_s)
    stop.set()
    for t in threads:
        t.join(30)
    if errors:  # the race could not run: that is not a pass
        raise RuntimeError(f"the race itself failed: {errors}")
    return wrong, counts["renews"], counts["probes"], time.monotonic() - t0


# The race these guard against (docs/design.md, "Lock protocol", L4): a
# renew, renew_all or same-holder re-acquire writes a new version of the
# lease record, with new index entries; a scan of the name's records running
# beside it could read the index before the new entry and the old version
# after it died, and miss the live lease (a grant past it, or the guard
# refusing it). Updates take the name lock (RowExclusive) for that reason.


# how a holder keeps its lease alive, and how long a race runs at most (the
# race showed within a second for the first two, within seconds for the third,
# before the fix)
KEEPALIVES = {
    "renew": ("SELECT fenced_lock_renew(%(name)s, %(token)s, '5 min') = %(true)s", 5),
    "renew_all": ("SELECT fenced_lock_renew_all(%(holder)s, '5 min') = 1", 5),
    "same_holder_reacquire": ("SELECT fenced_lock_try_acquire(%(name)s, '5 min', %(holder)s, permits => 100) "
                              "= %(token)s", 8),
}


@pytest.mark.budget(90)
@pytest.mark.parametrize("how", list(KEEPALIVES))
def test_renewing_permit_holders_never_let_a_contender_past_a_full_semaphore(cluster, app, mon, how):
    """A semaphore of 100, all permits held, the newest three kept alive in a
    loop (renew, renew_all, or a re-acquire by the same holder, which
    extends); two contenders try for a permit. None may ever get one while
    the 100 are live (invariant 1)."""
    k, name = 100, f"modes:race:sem:{how}"
    tokens = [try_acquire(mon, name, "5 min", f"h{i}", permits=k) for i in range(k)]
    assert None not in tokens
    query, bound = KEEPALIVES[how]

    def contender(c):
        got = try_acquire(c, name, "1 min", f"contender-{c.info.backend_pid}", permits=k)
        if got is not None:
            live = one(c, "SELECT count(*) FROM fenced_lock_leases WHERE name = %s AND live", (name,))
            assert release(c, name, got) is True
            return (got, live)
        return None

    def keepalive(i):
        def loop(c):
            assert one(c, query, dict(name=name, token=tokens[i], holder=f"h{i}", true=True)) is True
        return loop

    wrong, renews, tries, took = race(cluster, app, [], [keepalive(i) for i in (k - 1, k - 2, k - 3)] + [contender] * 2,
                                      bound)
    print(f"full semaphore of {k}, kept alive by {how}: {tries} calls in {took:.1f} s; "
          f"grants past the count: {wrong}")
    assert one(mon, "SELECT fenced_lock_force_release(%s)", (name,)) is True
    assert wrong == [], f"a contender got a permit with all {k} live (token, live permits seen): {wrong}"


@pytest.mark.budget(90)
def test_an_exclusive_lease_being_renewed_is_never_granted_to_another_holder(cluster, app, mon):
    """The holder renews in a loop (two sessions of its role, as a client
    with a keepalive thread would); two others try for the name. None may
    ever get it: two live exclusive leases would both pass the guard."""
    name = "modes:race:exclusive"
    token = try_acquire(mon, name, "5 min", "holder")

    def contender(c):
        got = try_acquire(c, name, "1 min", f"contender-{c.info.backend_pid}")
        if got is not None:
            live = [r[0] for r in c.execute("SELECT token FROM fenced_lock_leases WHERE name = %s AND live "
                                            "ORDER BY token", (name,)).fetchall()]
            assert release(c, name, got) is True
            return (got, live)
        return None

    wrong, renews, tries, took = race(cluster, app, [(name, token)] * 2, [contender, contender], 8)
    print(f"exclusive lease renewed {renews} times while {tries} tries ran for {took:.1f} s; "
          f"second holders: {wrong}")
    assert release(mon, name, token) is True
    assert wrong == [], f"another holder got the name while token {token} was live (token, live tokens): {wrong}"



@pytest.mark.budget(90)
def test_a_lease_being_renewed_is_never_refused_by_the_guard_assert_or_validate(cluster, app, mon):
    """While its holder renews in a loop, the holder's guarded writes,
    asserts and validates of the live token must all succeed."""
    name, table = "modes:race:guard:1", "race_guard"
    make_table(mon, table, "modes:race:guard:{id}")
    token = try_acquire(mon, name, "5 min", "holder")
    write(mon, table, "1", "start", token)

    def writer(c):
        try:
            c.execute(sql.SQL("UPDATE {} SET body = 'by the holder', fence_token = %s WHERE id = '1'").format(
                sql.Identifier(table)), (token,))
        except psycopg.Error as e:
            return ("guarded UPDATE", e.sqlstate)
        if one(c, "SELECT fenced_lock_validate(%s, %s)", (name, token)) is not True:
            return ("validate", False)
        code = sqlstate(c, "SELECT fenced_lock_assert(%s, %s)", (name, token))
        return None if code is None else ("assert", code)

    wrong, renews, probes, took = race(cluster, app, [(name, token)] * 2, [writer, writer], 10)
    print(f"lease renewed {renews} times while {probes} write/validate/assert rounds ran for {took:.1f} s; "
          f"wrong answers: {wrong}")
    assert one(mon, "SELECT fenced_lock_validate(%s, %s)", (name, token)) is True
    assert release(mon, name, token) is True
    assert wrong == [], f"the live lease {token} was refused while being renewed: {wrong}"
