"""Guarantee (docs/design.md, "Durability"; "Invariants" 6 and 7): a release
that is the only write of its transaction is acknowledged before it is
flushed, so a crash right after it may undo it — but then the lease comes
back exactly as it was: its own token, holder and expires_at (so never past
its expiry), and never over a later holder's lease. A release committed in
the same transaction as a user write keeps the session's synchronous_commit:
with `on`, a crash right after COMMIT loses neither the write nor the release.
Grants and renewals stay durable with synchronous_commit = off.

One quiet server (WAL writer every 10 s, no autovacuum, no replication: only
the test writes WAL) is crashed CYCLES times. Every cycle, from one session:

  1. name other:i — a lone release, then another holder's grant of the name
     (acknowledged, so flushed, which flushes the release before it too);
  2. name grant:i — a grant and then a renewal, both with
     synchronous_commit = off;
  3. the last operation, alternately
     - lone: a lease of lone:i (ttl 3 s) released alone (session
       synchronous_commit = on), then a synchronous_commit = off plain
       INSERT (a control: its loss shows the crash loses unflushed commits);
     - with write: a lease of write:i released in one transaction with an
       UPDATE of a user table (a guarded write before the release, or a plain
       UPDATE after it), synchronous_commit = on;
  4. right after COMMIT returns, the WAL flush position is read (past the
     insert position read before the transaction: the commit was on disk
     when COMMIT returned), then the
     postmaster is killed with SIGKILL — in half of the cycles with every
     child at once (a power loss), in the others alone (its children exit when
     they notice) — and the server is restarted.

After each recovery: other:i is the other holder's lease; grant:i has its
token and renewed expiry; lone:i is free or its own lease unchanged; the
write of write:i is there and its lease stays released. At the end, every
lease that came back expires at its own expires_at: its token is then
rejected (FL001) and the name is granted with a larger token, the history
recording the end as `expiry` at exactly that instant.
"""

import time

import pytest

from faultkit import RELEASE_PORT, connect, leases, sqlstate_of, wait_until
from harness.cluster import QUIET_WAL

CYCLES = 48
LONE_TTL_S = 3

SCHEMA = """
CREATE TABLE docs (id int PRIMARY KEY, body text, fence_token bigint);
INSERT INTO docs SELECT i, 'v0', NULL FROM generate_series(0, {n}) i;
CREATE TRIGGER docs_fence BEFORE INSERT OR UPDATE OR DELETE ON docs
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('write:{{id}}');
CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL);
INSERT INTO accounts SELECT i, 100 FROM generate_series(0, {n}) i;
CREATE TABLE plain (id int, note text);
"""

LEASE = "SELECT token, holder, owner::text, expires_at FROM fenced_lock_internal.granted_leases WHERE name = %s"


def lease(conn, name):
    return conn.execute(LEASE, (name,)).fetchone()


def insert_lsn(conn):
    return conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]


def flushed_since(conn, before):
    """Right after a COMMIT returned: was it already on disk? `before` is the
    WAL insert position read just before the transaction: a commit waited for
    flushes past it, one not waited for leaves the flush position at or
    before it, unless the WAL writer flushed in between. Comparing with the
    insert position instead would count WAL written after the COMMIT by reads
    that set hint bits (a full-page image when checksums are on, as initdb
    enables by default from 18)."""
    return conn.execute("SELECT pg_current_wal_flush_lsn() > %s::pg_lsn", (before,)).fetchone()[0]


def surely_flushed(conn):
    """Right after a COMMIT returned: is all WAL written so far on disk, the
    commit record included? Only this proves a commit durable: an
    asynchronous commit wakes the WAL writer, which may flush only up to the
    last completed WAL page, past `before` but short of the commit record (so
    `flushed_since` may say yes for a commit that a crash then loses)."""
    return conn.execute("SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()").fetchone()[0]


def crash(cluster, everything):
    """kill -9 of the postmaster (`everything`: and at once of all its
    children, as a power loss: nothing can flush after the signal; otherwise
    the children exit on their own when they notice), then a restart with
    crash recovery."""
    cluster.kill9(children_grace=0 if everything else 10)
    cluster.start()
    quiet(cluster)


def quiet(cluster):
    """Let the end-of-recovery checkpoint (and anything else a start writes)
    finish, so that the WAL this test reads is its own."""
    with cluster.connect() as db:
        db.execute("CHECKPOINT")


@pytest.mark.budget(200)
def test_release_may_be_undone_by_a_crash_only_as_its_own_lease(clusters):
    c = clusters.new("f_release", RELEASE_PORT, QUIET_WAL)
    dbname = c.create_database("reldur")
    with connect(c, dbname) as db:
        db.execute(SCHEMA.format(n=CYCLES))
    quiet(c)

    acked_tokens = []
    came_back = {}  # lone:i -> (token, holder, owner, expires_at)
    stats = {"lone": 0, "lone_lost": 0, "lone_flushed_at_commit": 0, "control_lost": 0,
             "write": 0, "write_flushed_at_commit": 0, "lone_lost:everything": 0, "lone_lost:postmaster": 0}
    restart_s = []
    for i in range(CYCLES):
        kind = "lone" if i % 2 == 0 else "write"
        everything = (i // 2) % 2 == 0  # how the crash kills: see crash()
        with connect(c, dbname) as conn:
            conn.execute("SET synchronous_commit = on")
            # 1. a release followed by another holder's acknowledged grant
            a = conn.execute("SELECT fenced_lock_try_acquire(%s, '1 hour', 'a')", (f"other:{i}",)).fetchone()[0]
            assert conn.execute("SELECT fenced_lock_release(%s, %s)", (f"other:{i}", a)).fetchone()[0] is True
            b = conn.execute("SELECT fenced_lock_try_acquire(%s, '1 hour', 'b')", (f"other:{i}",)).fetchone()[0]
            assert b is not None and b > a
            other = lease(conn, f"other:{i}")
            # 2. a grant and a renewal with synchronous_commit = off
            conn.execute("SET synchronous_commit = off")
            g = conn.execute("SELECT fenced_lock_try_acquire(%s, '1 hour', 'g')", (f"grant:{i}",)).fetchone()[0]
            assert conn.execute("SELECT fenced_lock_renew(%s, %s, '2 hours')", (f"grant:{i}", g)).fetchone()[0]
            granted = lease(conn, f"grant:{i}")
            conn.execute("SET synchronous_commit = on")
            acked_tokens += [a, b, g]
            # 3. the last operation, 4. crash right after it
            if kind == "lone":
                name = f"lone:{i}"
                t = conn.execute("SELECT fenced_lock_try_acquire(%s, %s::interval, 'lone')",
                                 (name, f"{LONE_TTL_S} s")).fetchone()[0]
                released = lease(conn, name)
                before = insert_lsn(conn)
                assert conn.execute("SELECT fenced_lock_release(%s, %s)", (name, t)).fetchone()[0] is True
                on_disk = flushed_since(conn, before)
                durable = surely_flushed(conn)
                conn.execute("SET synchronous_commit = off")
                conn.execute("INSERT INTO plain VALUES (%s, 'control')", (i,))
            else:
                name = f"write:{i}"
                t = conn.execute("SELECT fenced_lock_try_acquire(%s, '1 hour', 'writer')", (name,)).fetchone()[0]
                before = insert_lsn(conn)
                with conn.transaction():
                    if i % 4 == 1:
                        conn.execute("UPDATE docs SET body = %s, fence_token = %s WHERE id = %s", (f"v{i}", t, i))
                        assert conn.execute("SELECT fenced_lock_release(%s, %s)", (name, t)).fetchone()[0]
                    else:
                        assert conn.execute("SELECT fenced_lock_release(%s, %s)", (name, t)).fetchone()[0]
                        conn.execute("UPDATE accounts SET balance = balance - %s WHERE id = %s", (i, i))
                on_disk = flushed_since(conn, before)
            acked_tokens.append(t)
            t0 = time.monotonic()
            crash(c, everything)
            restart_s.append(time.monotonic() - t0)

        with connect(c, dbname) as db:
            state = leases(db)
            assert state.get(f"other:{i}") == other, f"other:{i}: {state.get(f'other:{i}')}, acknowledged {other}"
            assert state.get(f"grant:{i}") == granted, f"grant:{i}: {state.get(f'grant:{i}')}, acknowledged {granted}"
            if kind == "lone":
                stats["lone"] += 1
                stats["lone_flushed_at_commit"] += on_disk
                back = state.get(name)
                assert back in (None, released), f"{name}: released {released}, after the crash {back}"
                if back is not None:
                    stats["lone_lost"] += 1
                    stats["lone_lost:" + ("everything" if everything else "postmaster")] += 1
                    came_back[name] = released
                    assert not durable, f"{name}: a release on disk at COMMIT was undone"
                    # while it lives, nobody else gets the name
                    if db.execute("SELECT clock_timestamp() < %s", (released[3],)).fetchone()[0]:
                        assert db.execute("SELECT fenced_lock_try_acquire(%s, '1 hour', 'next')",
                                          (name,)).fetchone()[0] is None
                if not db.execute("SELECT count(*) FROM plain WHERE id = %s", (i,)).fetchone()[0]:
                    stats["control_lost"] += 1
            else:
                stats["write"] += 1
                stats["write_flushed_at_commit"] += on_disk
                assert on_disk, f"{name}: a release beside a user write was not flushed at COMMIT (synchronous_commit = on)"
                assert name not in state, f"{name}: released with a user write, after the crash {state[name]}"
                if i % 4 == 1:
                    assert db.execute("SELECT body, fence_token FROM docs WHERE id = %s", (i,)).fetchone() == (f"v{i}", t)
                else:
                    assert db.execute("SELECT balance FROM accounts WHERE id = %s", (i,)).fetchone()[0] == 100 - i
            # tokens after recovery exceed every acknowledged one
            probe = db.execute("SELECT fenced_lock_try_acquire(%s, '1 minute')", (f"probe:{i}",)).fetchone()[0]
            assert probe > max(acked_tokens)
            acked_tokens.append(probe)

    print(f"release durability over {CYCLES} crashes: {stats}; restart after kill -9: "
          f"median {sorted(restart_s)[len(restart_s) // 2]:.2f} s, max {max(restart_s):.2f} s")
    print(f"lone releases undone by the crash: {stats['lone_lost']} of {stats['lone']} "
          f"({stats['lone_lost:everything']} of {stats['lone'] // 2} when every process was killed at once, "
          f"{stats['lone_lost:postmaster']} of {stats['lone'] - stats['lone'] // 2} when only the postmaster was)")
    # The lone release was not waited for: most were not on disk when COMMIT
    # returned (a commit that is waited for always is).
    assert stats["lone_flushed_at_commit"] <= stats["lone"] // 2, stats
    # Positive control: this crash does lose commits nobody flushed.
    assert stats["control_lost"] >= 1, f"the crash never lost an unflushed commit: {stats}"

    # Every lease that came back ends at its own expires_at.
    with connect(c, dbname) as db:
        for name, (token, holder, owner, expires_at) in came_back.items():
            wait_until(lambda: db.execute("SELECT clock_timestamp() >= %s", (expires_at,)).fetchone()[0],
                       LONE_TTL_S + 10, what=f"{name} to reach its expires_at")
            assert db.execute("SELECT fenced_lock_validate(%s, %s)", (name, token)).fetchone()[0] is False
            i = int(name.split(":")[1])
            assert sqlstate_of(db.execute, "SELECT fenced_lock_assert(%s, %s)", (name, token)) == "FL001"
            nxt = db.execute("SELECT fenced_lock_try_acquire(%s, '1 minute', 'next')", (name,)).fetchone()[0]
            assert nxt is not None and nxt > max(acked_tokens)
            acked_tokens.append(nxt)
            assert db.execute("SELECT ended_by, ended_at FROM fenced_lock_history WHERE token = %s",
                              (token,)).fetchone() == ("expiry", expires_at), i
        # and every one that stayed gone is recorded as released
        for j in range(0, CYCLES, 2):
            name = f"lone:{j}"
            if name not in came_back:
                assert db.execute("SELECT ended_by FROM fenced_lock_history WHERE name = %s",
                                  (name,)).fetchall() == [("release",)]
