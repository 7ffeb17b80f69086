"""docs/operations.md, "Connection pooling" (and docs/design.md, "Session-bound
leases", for the one exception): nothing depends on session state, so
fenced_lock works behind a transaction-pooling proxy (PgBouncer): a lease
acquired on one connection is renewed, used, asserted and released on others
(same role), even after the acquiring session is gone or was reset with
DISCARD ALL."""

import itertools

import psycopg
import pytest

from it_support import one


@pytest.fixture(scope="module")
def app(cluster, db, execute_only_role):
    role = execute_only_role()
    with cluster.connect(db) as conn:
        conn.execute("CREATE TABLE docs (id int PRIMARY KEY, body text, fence_token bigint)")
        conn.execute("CREATE TRIGGER docs_fence BEFORE INSERT OR UPDATE OR DELETE ON docs "
                     "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('doc:{id}')")
        conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON docs TO "{role}"')
    return role


def test_works_through_many_connections_without_session_state(cluster, db, app):
    name = "doc:1"
    # acquire, then the acquiring session goes away entirely
    with cluster.connect(db, user=app) as c1:
        token = one(c1, "SELECT fenced_lock_try_acquire(%s, '30 s')", (name,))
        assert token > 0

    with cluster.connect(db, user=app) as c2:
        assert one(c2, "SELECT fenced_lock_validate(%s, %s)", (name, token)) is True
        assert one(c2, "SELECT fenced_lock_renew(%s, %s, '1 minute')", (name, token)) is True
        c2.execute("INSERT INTO docs VALUES (1, 'v1', %s)", (token,))

    with cluster.connect(db, user=app) as c3:
        c3.execute("DISCARD ALL")  # what a pooler runs between clients
        c3.execute("UPDATE docs SET body = 'v2' WHERE id = 1")  # same token, still live
        with c3.transaction():
            c3.execute("SELECT fenced_lock_assert(%s, %s)", (name, token))
            c3.execute("DELETE FROM docs WHERE id = 1")

    with cluster.connect(db, user=app) as c4:
        c4.execute("DISCARD ALL")
        assert one(c4, "SELECT fenced_lock_release(%s, %s)", (name, token)) is True

    with cluster.connect(db, user=app) as c5:
        assert one(c5, "SELECT fenced_lock_validate(%s, %s)", (name, token)) is False
        assert one(c5, "SELECT fenced_lock_renew(%s, %s)", (name, token)) is False
        with pytest.raises(psycopg.Error) as err:
            c5.execute("INSERT INTO docs VALUES (1, 'late', %s)", (token,))
        assert err.value.sqlstate == "FL001"

    with cluster.connect(db) as su:
        assert su.execute("SELECT count(*) FROM fenced_lock_internal.granted_leases WHERE name = %s",
                          (name,)).fetchone()[0] == 0
        assert su.execute("SELECT count(*) FROM docs").fetchone()[0] == 0


def test_retry_safe_acquire_works_from_another_connection(cluster, db, app):
    """A client that lost the reply to its acquire (its connection died) calls
    again, with the same holder, from a new connection: same token."""
    name = "doc:2"
    with cluster.connect(db, user=app) as c1:
        token = one(c1, "SELECT fenced_lock_acquire(%s, '30 s', '5 s', 'worker-7')", (name,))
    with cluster.connect(db, user=app) as c2:
        assert one(c2, "SELECT fenced_lock_acquire(%s, '30 s', '5 s', 'worker-7')", (name,)) == token
        assert one(c2, "SELECT fenced_lock_try_acquire(%s, '30 s', 'worker-8')", (name,)) is None
        assert one(c2, "SELECT fenced_lock_release(%s, %s)", (name, token)) is True


def test_transaction_pooling_round_robin(cluster, db, app):
    """Each transaction goes to the next of three pooled connections, as under
    PgBouncer's transaction mode; every step of each lease cycle lands on a
    different connection than the one before."""
    pool = [cluster.connect(db, user=app) for _ in range(3)]
    try:
        conns = itertools.cycle(pool)
        tokens = []
        for i in range(10):
            name = "doc:100"
            token = one(next(conns), "SELECT fenced_lock_try_acquire(%s, '30 s')", (name,))
            assert token is not None
            tokens.append(token)
            c = next(conns)
            with c.transaction():
                c.execute("INSERT INTO docs VALUES (100, %s, %s) ON CONFLICT (id) DO UPDATE "
                          "SET body = EXCLUDED.body, fence_token = EXCLUDED.fence_token", (f"v{i}", token))
            assert one(next(conns), "SELECT fenced_lock_renew(%s, %s)", (name, token)) is True
            assert one(next(conns), "SELECT fenced_lock_release(%s, %s)", (name, token)) is True
        assert tokens == sorted(tokens) and len(set(tokens)) == 10
    finally:
        for c in pool:
            c.close()
    with cluster.connect(db) as su:
        assert su.execute("SELECT body, fence_token FROM docs WHERE id = 100").fetchone() == ("v9", tokens[-1])
