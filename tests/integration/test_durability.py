"""docs/design.md, "Durability": a grant or renewal is never less durable than
synchronous_commit = on, whatever the session has set, and a crash (kill -9 of
the postmaster) loses none that was acknowledged. A release (or force
release) that is the transaction's only write is acknowledged before it is
flushed; a crash may then bring the released lease back, but only with its own
token and until its own expires_at ("Invariants" 7). A release in a
transaction that also wrote user data keeps the session's synchronous_commit.

A dedicated cluster (port 5501) makes "not flushed yet" observable: the WAL
writer runs only every 10 s and flushes nothing early, and nothing else writes
WAL. An asynchronous commit then stays in the WAL buffers (unflushed, and lost
by kill -9), while a durable commit is flushed before COMMIT returns.

How the flush is seen: the commit record of the transaction is found with
pg_walinspect; pg_current_wal_flush_lsn(), read right after COMMIT returns,
must be at or past the end of that record.
"""

import pytest

from harness.cluster import QUIET_WAL, Cluster

import it_support

PORT = 5501
DB = "it_durability"


@pytest.fixture(scope="module")
def quiet():
    c = Cluster("it_durability", PORT, QUIET_WAL)
    c.init()
    c.start()
    try:
        c.create_database(DB)
        with c.connect(DB) as conn:
            conn.execute("CREATE EXTENSION pg_walinspect")
            conn.execute("CREATE TABLE plain (id int, note text)")
            conn.execute("CREATE TABLE flusher (id int)")
            conn.execute(
                "CREATE FUNCTION grant_in_quiet_function(n text, ttl interval) RETURNS bigint "
                "LANGUAGE sql SET synchronous_commit = off "
                "AS $$ SELECT fenced_lock_try_acquire(n, ttl) $$")
        yield c
    finally:
        c.stop(check=False)


def async_session(cluster):
    conn = cluster.connect(DB)
    conn.execute("SET synchronous_commit = off")
    assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "off"
    return conn


def commit_flush_state(cluster, conn, body):
    """Run `body(conn)` in one transaction of `conn`; right after COMMIT returns,
    read the WAL flush position. Returns (flushed, commit_end, result), where
    `flushed` says the commit record was already on disk when COMMIT returned."""
    start = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    with conn.transaction():
        result = body(conn)
        # read after the body, and without assigning one: an xid assigned
        # before the first lease change counts as a write of the user's
        xid = conn.execute("SELECT pg_current_xact_id_if_assigned()::text").fetchone()[0]
        assert xid is not None, "the transaction wrote nothing"
    flushed_at = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
    # Now flush everything (a synchronous commit elsewhere), so pg_walinspect can read it.
    with cluster.connect(DB) as other:
        other.execute("SET synchronous_commit = on")
        other.execute("INSERT INTO flusher VALUES (1)")
        commit_end, lsn_ok = other.execute(
            "SELECT end_lsn, end_lsn <= %s::pg_lsn FROM pg_get_wal_records_info(%s::pg_lsn, pg_current_wal_flush_lsn()) "
            "WHERE resource_manager = 'Transaction' AND record_type LIKE 'COMMIT%%' AND xid::text = %s",
            (str(flushed_at), str(start), str(int(xid) % 2**32))).fetchone()
    return lsn_ok, commit_end, result


def test_plain_commit_with_synchronous_commit_off_is_not_flushed(quiet):
    """The control: proves the method can see an unflushed commit at all."""
    with async_session(quiet) as conn:
        seen = [commit_flush_state(quiet, conn, lambda c: c.execute("INSERT INTO plain VALUES (1, 'control')"))[0]
                for _ in range(5)]
    print("control commits flushed at COMMIT:", seen)
    assert not all(seen), "every asynchronous plain commit was already flushed: the setup cannot tell"


def _try_acquire(name):
    return lambda c: c.execute("SELECT fenced_lock_try_acquire(%s, '1 hour')", (name,)).fetchone()[0]


def _acquire(name):
    return lambda c: c.execute("SELECT fenced_lock_acquire(%s, '1 hour', '5 s')", (name,)).fetchone()[0]


def _set_local_then_grant(name):
    def body(c):
        c.execute("SET LOCAL synchronous_commit = off")
        return c.execute("SELECT fenced_lock_try_acquire(%s, '1 hour')", (name,)).fetchone()[0]
    return body


def _grant_in_function(name):
    return lambda c: c.execute("SELECT grant_in_quiet_function(%s, '1 hour')", (name,)).fetchone()[0]


@pytest.mark.parametrize("how", [_try_acquire, _acquire, _set_local_then_grant, _grant_in_function],
                         ids=["try_acquire", "acquire", "set_local_off_in_transaction",
                              "in_function_with_set_synchronous_commit_off"])
def test_grant_is_durable_with_synchronous_commit_off(quiet, how):
    name = f"durable:grant:{how.__name__}"
    with async_session(quiet) as conn:
        for i in range(3):
            flushed, _, token = commit_flush_state(quiet, conn, how(f"{name}:{i}"))
            assert token is not None and token > 0
            assert flushed, f"grant {token} was not flushed when COMMIT returned"


def _setup_lease(conn, name):
    conn.execute("SET synchronous_commit = on")
    token = conn.execute("SELECT fenced_lock_try_acquire(%s, '1 hour')", (name,)).fetchone()[0]
    conn.execute("SET synchronous_commit = off")
    return token


def test_renew_is_durable_with_synchronous_commit_off(quiet):
    with async_session(quiet) as conn:
        for i in range(3):
            name = f"durable:renew:{i}"
            token = _setup_lease(conn, name)
            flushed, _, ok = commit_flush_state(
                quiet, conn, lambda c: c.execute("SELECT fenced_lock_renew(%s, %s, '2 hours')", (name, token)).fetchone()[0])
            assert ok is True
            assert flushed, f"renew of lease {token} was not flushed when COMMIT returned"


@pytest.mark.parametrize("op", ["release", "force_release"])
@pytest.mark.parametrize("session_mode", ["on", "off"])
def test_lone_release_is_acknowledged_before_the_flush(quiet, op, session_mode):
    """A release that is its transaction's only write commits with
    synchronous_commit = off whatever the session asked for: COMMIT returns
    without waiting for the flush. A commit that is waited for is always
    flushed when COMMIT returns, so "not every one was flushed" shows that
    these were not waited for (one may be flushed by the WAL writer meanwhile)."""
    seen = []
    with async_session(quiet) as conn:
        for i in range(5):
            name = f"lone:{op}:{session_mode}:{i}"
            token = _setup_lease(conn, name)
            conn.execute(f"SET synchronous_commit = {session_mode}")
            if op == "release":
                body = lambda c: c.execute("SELECT fenced_lock_release(%s, %s)", (name, token)).fetchone()[0]
            else:
                body = lambda c: c.execute("SELECT fenced_lock_force_release(%s)", (name,)).fetchone()[0]
            flushed, _, ok = commit_flush_state(quiet, conn, body)
            assert ok is True
            seen.append(flushed)
    print(f"lone {op} (session synchronous_commit = {session_mode}) flushed at COMMIT:", seen)
    assert not all(seen), f"every lone {op} was flushed when COMMIT returned: they were waited for"


@pytest.mark.parametrize("op", ["release", "force_release"])
def test_release_beside_a_user_write_keeps_the_sessions_synchronous_commit(quiet, op):
    """With a user write in the same transaction the release keeps the
    session's durability: synchronous_commit = on flushes every such commit
    before COMMIT returns (before or after the write); off does not."""
    def body_for(name, token, write_first):
        def body(c):
            if write_first:
                c.execute("INSERT INTO plain VALUES (3, %s)", (name,))
            if op == "release":
                ok = c.execute("SELECT fenced_lock_release(%s, %s)", (name, token)).fetchone()[0]
            else:
                ok = c.execute("SELECT fenced_lock_force_release(%s)", (name,)).fetchone()[0]
            if not write_first:
                c.execute("INSERT INTO plain VALUES (3, %s)", (name,))
            return ok
        return body

    off_seen = []
    with async_session(quiet) as conn:
        for i in range(4):
            write_first = i % 2 == 0
            name = f"beside:{op}:on:{i}"
            token = _setup_lease(conn, name)
            conn.execute("SET synchronous_commit = on")
            flushed, _, ok = commit_flush_state(quiet, conn, body_for(name, token, write_first))
            assert ok is True
            assert flushed, f"{op} beside a user write ({'after' if write_first else 'before'} it) " \
                            "was not flushed with synchronous_commit = on"
        for i in range(4):
            name = f"beside:{op}:off:{i}"
            token = _setup_lease(conn, name)
            flushed, _, ok = commit_flush_state(quiet, conn, body_for(name, token, i % 2 == 0))
            assert ok is True
            off_seen.append(flushed)
    print(f"{op} beside a user write, synchronous_commit = off, flushed at COMMIT:", off_seen)
    assert not all(off_seen), "synchronous_commit = off was overridden for a release beside user writes"


def _crash_after(cluster, setup, op, control_note):
    """Run `setup` durably, then `op` with synchronous_commit = off, then an
    asynchronous plain INSERT (the control), then kill -9 the postmaster at once
    and restart. Returns (what setup returned, what op returned, control survived)."""
    with cluster.connect(DB) as conn:
        before = setup(conn)
        conn.execute("SET synchronous_commit = off")
        result = op(conn, before)
        conn.execute("INSERT INTO plain VALUES (2, %s)", (control_note,))
        cluster.kill9()
    cluster.start()
    survived = bool(cluster.sql("SELECT 1 FROM plain WHERE note = %s", (control_note,), dbname=DB))
    return before, result, survived


def test_lease_changes_survive_kill9_right_after_commit_with_synchronous_commit_off(quiet):
    lease_rows = ("SELECT token, expires_at FROM fenced_lock_internal.granted_leases WHERE name = %s")
    controls = []

    # grant
    def grant(conn, _):
        return conn.execute("SELECT fenced_lock_try_acquire('crash:grant', '1 hour')").fetchone()[0]
    _, token, survived = _crash_after(quiet, lambda c: None, grant, "after grant")
    controls.append(survived)
    assert quiet.sql(lease_rows, ("crash:grant",), dbname=DB)[0][0] == token
    # tokens after recovery are greater than every token before it
    after = quiet.sql("SELECT fenced_lock_try_acquire('crash:after', '1 hour')", dbname=DB)[0][0]
    assert after > token

    # grant inside a function with its own SET synchronous_commit = off
    def grant_fn(conn, _):
        return conn.execute("SELECT grant_in_quiet_function('crash:fn', '1 hour')").fetchone()[0]
    _, token, survived = _crash_after(quiet, lambda c: None, grant_fn, "after function grant")
    controls.append(survived)
    assert quiet.sql(lease_rows, ("crash:fn",), dbname=DB)[0][0] == token

    # renew: the new expiry survives
    def setup_renew(conn):
        t = conn.execute("SELECT fenced_lock_try_acquire('crash:renew', '1 minute')").fetchone()[0]
        return t, quiet.sql(lease_rows, ("crash:renew",), dbname=DB)[0][1]

    def renew(conn, before):
        assert conn.execute("SELECT fenced_lock_renew('crash:renew', %s, '3 hours')", (before[0],)).fetchone()[0]
        return conn.execute(lease_rows, ("crash:renew",)).fetchone()[1]
    (token, old_expiry), new_expiry, survived = _crash_after(quiet, setup_renew, renew, "after renew")
    controls.append(survived)
    assert new_expiry > old_expiry
    assert quiet.sql(lease_rows, ("crash:renew",), dbname=DB)[0] == (token, new_expiry)

    # release, acknowledged before the flush: the crash may bring the lease
    # back, but only as it was (same token, same expires_at) and only until
    # its own expiry; then the name is granted with a larger token.
    release_ttl_s = 5

    def setup_release(conn):
        t = conn.execute("SELECT fenced_lock_try_acquire('crash:release', %s::interval)",
                         (f"{release_ttl_s} s",)).fetchone()[0]
        return t, conn.execute(lease_rows, ("crash:release",)).fetchone()[1]

    def release(conn, before):
        return conn.execute("SELECT fenced_lock_release('crash:release', %s)", (before[0],)).fetchone()[0]
    (token, expiry), released, survived = _crash_after(quiet, setup_release, release, "after release")
    controls.append(survived)
    assert released is True
    after_crash = quiet.sql(lease_rows, ("crash:release",), dbname=DB)
    print("released lease after kill -9:", "came back" if after_crash else "stayed gone")
    assert after_crash in ([], [(token, expiry)]), f"lease {token} came back changed: {after_crash}"
    with quiet.connect(DB) as other:
        if after_crash:
            live = other.execute("SELECT clock_timestamp() < %s", (expiry,)).fetchone()[0]
            if live:
                assert other.execute("SELECT fenced_lock_try_acquire('crash:release', '1 hour')").fetchone()[0] is None
            it_support.wait_until(lambda: other.execute("SELECT clock_timestamp() >= %s", (expiry,)).fetchone()[0],
                                  release_ttl_s + 5, interval=0.05, what="the lease that came back to expire")
        again = other.execute("SELECT fenced_lock_try_acquire('crash:release', '1 hour')").fetchone()[0]
    assert again > token

    # The crash really loses asynchronous commits that were not flushed: the
    # control INSERT made after each lease change did not survive (at least once).
    print("control commits that survived kill -9:", controls)
    assert not all(controls), "every asynchronous control commit survived kill -9: the check cannot tell"
