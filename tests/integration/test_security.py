"""docs/design.md, "Security": privileges, superuser-only settings, what the view
shows, and writing around the guard. Every attack runs as a real LOGIN role
(trust auth on loopback) and checks both the SQLSTATE and the state left
behind.

Run: /usr/bin/python3 -m pytest -q tests/integration/test_security.py
"""

import hashlib
import threading
import time

import psycopg
import pytest
from psycopg import sql

from harness.security import (
    LONG,
    acquire,
    error,
    lease_record,
    one,
    security_fixtures,
    sqlstate,
)

I = sql.Identifier


sec, su = security_fixtures("sec")


@pytest.fixture
def lock(request):
    """A lock name unique to the test."""
    return "sec:" + request.node.name


def held_by_a(sec, name, holder="worker-1"):
    """APP_A takes `name`; returns (token, stored record)."""
    with sec.connect(sec.APP_A) as a:
        token = acquire(a, name, holder=holder)
    assert token is not None and token > 0
    with sec.connect() as su:
        return token, lease_record(su, name)


# == privilege model ============================================================


def test_granted_role_uses_locks_through_the_functions_and_the_view(sec, lock):
    with sec.connect(sec.APP_A) as a:
        t = acquire(a, lock, holder="w")
        assert one(a, "SELECT fenced_lock_validate(%s, %s)", (lock, t)) is True
        a.execute("SELECT fenced_lock_assert(%s, %s)", (lock, t))
        assert one(a, "SELECT fenced_lock_renew(%s, %s, '1 hour')", (lock, t)) is True
        row = a.execute("SELECT token, holder, owner::text, live FROM fenced_lock_leases WHERE name = %s",
                        (lock,)).fetchone()
        assert row == (t, "w", sec.APP_A, True)
        assert one(a, "SELECT fenced_lock_release(%s, %s)", (lock, t)) is True
        t2 = one(a, f"SELECT fenced_lock_acquire(%s, {LONG}, interval '1 second')", (lock,))
        assert t2 > t
        assert one(a, "SELECT fenced_lock_release(%s, %s)", (lock, t2)) is True


def test_application_role_cannot_read_or_write_lease_state_directly(sec, su, lock):
    token, before = held_by_a(sec, lock)
    attacks = [
        "SELECT * FROM fenced_lock_internal.granted_leases",
        "INSERT INTO fenced_lock_internal.granted_leases VALUES "
        "('sec:forged', 1, NULL, current_user::regrole, now(), now() + '1 day', '1 day')",
        f"UPDATE fenced_lock_internal.granted_leases SET expires_at = now() + interval '1 day' WHERE name = '{lock}'",
        f"UPDATE fenced_lock_internal.granted_leases SET owner = current_user::regrole WHERE name = '{lock}'",
        f"DELETE FROM fenced_lock_internal.granted_leases WHERE name = '{lock}'",
        "TRUNCATE fenced_lock_internal.granted_leases",
        "COPY fenced_lock_internal.granted_leases FROM STDIN",
        "ALTER TABLE fenced_lock_internal.granted_leases DISABLE TRIGGER ALL",
        "CREATE TABLE fenced_lock_internal.shadow (x int)",
    ]
    for role in (sec.APP_A, sec.APP_B):
        with sec.connect(role) as c:
            for q in attacks:
                assert sqlstate(c, q) == "42501", (role, q)
            c.execute("BEGIN")
            assert sqlstate(c, "LOCK TABLE fenced_lock_internal.granted_leases") == "42501"
            c.execute("ROLLBACK")
    assert lease_record(su, lock) == before
    assert lease_record(su, "sec:forged") is None


def test_application_role_cannot_advance_or_reset_the_token_sequence(sec, su, lock):
    seq_oid = one(su, "SELECT 'fenced_lock_internal.token_seq'::regclass::oid")
    last = one(su, "SELECT last_value FROM fenced_lock_internal.token_seq")
    attacks = [
        "SELECT nextval('fenced_lock_internal.token_seq')",
        "SELECT setval('fenced_lock_internal.token_seq', 1)",
        "SELECT setval('fenced_lock_internal.token_seq', 9223372036854775000, true)",
        "SELECT currval('fenced_lock_internal.token_seq')",
        "SELECT last_value FROM fenced_lock_internal.token_seq",
        "ALTER SEQUENCE fenced_lock_internal.token_seq RESTART WITH 1",
        # by OID, which skips the schema lookup: the sequence's own ACL refuses
        f"SELECT nextval({seq_oid}::regclass)",
        f"SELECT setval({seq_oid}::regclass, 1)",
        f"SELECT setval({seq_oid}::regclass, 1, false)",
    ]
    with sec.connect(sec.APP_A) as a:
        for q in attacks:
            assert sqlstate(a, q) == "42501", q
        # Reading the position by OID: refused (42501) up to 17; from 18
        # PostgreSQL answers NULL to a role without privileges. Neither tells.
        peek = f"SELECT pg_sequence_last_value({seq_oid}::regclass)"
        state = sqlstate(a, peek)
        assert state == "42501" or (state is None and one(a, peek) is None), (peek, state)
    assert one(su, "SELECT last_value FROM fenced_lock_internal.token_seq") == last
    with sec.connect(sec.APP_A) as a:
        assert acquire(a, lock) > last


def test_internal_helper_only_answers_about_the_caller(sec, su, lock):
    held_by_a(sec, lock)
    with sec.connect(sec.APP_B) as b:
        # no USAGE on the private schema: not even callable by name
        assert sqlstate(b, "SELECT fenced_lock_internal.may_see(%s::regrole)", (sec.APP_A,)) == "42501"
    # Even a role given USAGE on the schema learns only about itself, and the
    # schema's tables stay closed to it.
    su.execute(sql.SQL("GRANT USAGE ON SCHEMA fenced_lock_internal TO {}").format(I(sec.APP_B)))
    try:
        with sec.connect(sec.APP_B) as b:
            see = lambda r: one(b, "SELECT fenced_lock_internal.may_see(%s::regrole)", (r,))
            assert see(sec.APP_A) is False
            assert see(sec.MEMBER_A) is False
            assert see(sec.APP_B) is True
            assert one(b, "SELECT fenced_lock_internal.may_see(NULL)") is False
            assert sqlstate(b, "SELECT token FROM fenced_lock_internal.granted_leases") == "42501"
            assert sqlstate(b, "SELECT nextval('fenced_lock_internal.token_seq')") == "42501"
    finally:
        su.execute(sql.SQL("REVOKE USAGE ON SCHEMA fenced_lock_internal FROM {}").format(I(sec.APP_B)))


def test_renew_and_release_of_another_roles_lease_are_refused(sec, su, lock):
    token, before = held_by_a(sec, lock)
    with sec.connect(sec.APP_B) as b:
        assert sqlstate(b, "SELECT fenced_lock_renew(%s, %s)", (lock, token)) == "42501"
        assert sqlstate(b, "SELECT fenced_lock_renew(%s, %s, '1 day')", (lock, token)) == "42501"
        assert sqlstate(b, "SELECT fenced_lock_release(%s, %s)", (lock, token)) == "42501"
        e = error(b, "SELECT fenced_lock_release(%s, %s)", (lock, token))
        assert lock in e.diag.message_primary and sec.APP_A in e.diag.message_primary
        # a token that is not the live lease is just "not live", owner or not
        assert one(b, "SELECT fenced_lock_release(%s, %s)", (lock, token + 1000)) is False
    assert lease_record(su, lock) == before


def test_reusing_another_roles_holder_text_does_not_take_over_its_lease(sec, su, lock):
    token, before = held_by_a(sec, lock, holder="worker-1")
    with sec.connect(sec.APP_B) as b:
        assert acquire(b, lock, holder="worker-1") is None
        assert acquire(b, lock, ttl="1 day", holder="worker-1") is None
        assert sqlstate(b, f"SELECT fenced_lock_acquire(%s, {LONG}, interval '0', 'worker-1')",
                        (lock,)) == "55P03"
    assert lease_record(su, lock) == before
    with sec.connect(sec.APP_A) as a:  # the real holder still gets its own token back
        assert acquire(a, lock, holder="worker-1") == token


def test_force_release_by_a_non_operator_is_refused(sec, su, lock):
    token, before = held_by_a(sec, lock)
    for role in (sec.APP_A, sec.APP_B, sec.MEMBER_A, sec.WRITER):
        with sec.connect(role) as c:
            assert sqlstate(c, "SELECT fenced_lock_force_release(%s)", (lock,)) == "42501", role
    assert lease_record(su, lock) == before


def test_operator_role_member_and_superuser_may_force_release(sec, su, lock):
    token, _ = held_by_a(sec, lock)
    with sec.connect(sec.OPMEMBER) as op:
        assert one(op, "SHOW fenced_lock.operator_role") == sec.OPS
        assert one(op, "SELECT fenced_lock_force_release(%s)", (lock,)) is True
        assert one(op, "SELECT fenced_lock_force_release(%s)", (lock,)) is False
    assert lease_record(su, lock) is None
    held_by_a(sec, lock)
    assert one(su, "SELECT fenced_lock_force_release(%s)", (lock,)) is True
    assert lease_record(su, lock) is None


def test_member_of_the_owner_role_may_renew_release_and_reacquire(sec, su, lock):
    token, before = held_by_a(sec, lock, holder="worker-1")
    with sec.connect(sec.MEMBER_A) as m:
        assert acquire(m, lock, holder="worker-1") == token  # acts for APP_A
        assert one(m, "SELECT fenced_lock_renew(%s, %s, '2 hours')", (lock, token)) is True
        after = lease_record(su, lock)
        assert after[0] == token and after[2] == sec.APP_A and after[4] > before[4]
        assert one(m, "SELECT fenced_lock_release(%s, %s)", (lock, token)) is True
    assert lease_record(su, lock) is None


def test_owner_role_may_not_act_for_its_members(sec, su, lock):
    with sec.connect(sec.MEMBER_A) as m:
        token = acquire(m, lock, holder="m")
    before = lease_record(su, lock)
    assert before[2] == sec.MEMBER_A
    with sec.connect(sec.APP_A) as a:
        assert sqlstate(a, "SELECT fenced_lock_release(%s, %s)", (lock, token)) == "42501"
        assert acquire(a, lock, holder="m") is None
    assert lease_record(su, lock) == before


def test_role_without_execute_is_refused_every_function_and_the_view(sec, su, lock):
    token, before = held_by_a(sec, lock)
    calls = [
        "SELECT fenced_lock_try_acquire(%(n)s)",
        "SELECT fenced_lock_try_acquire(%(n)s, '1 minute', 'h')",
        "SELECT fenced_lock_acquire(%(n)s, '1 minute', '0')",
        "SELECT fenced_lock_renew(%(n)s, %(t)s)",
        "SELECT fenced_lock_release(%(n)s, %(t)s)",
        "SELECT fenced_lock_validate(%(n)s, %(t)s)",
        "SELECT fenced_lock_assert(%(n)s, %(t)s)",
        "SELECT fenced_lock_force_release(%(n)s)",
        "SELECT fenced_lock_guard()",
        "SELECT * FROM fenced_lock_leases",
        "SELECT fenced_lock_internal.may_see(current_user::regrole)",
    ]
    with sec.connect(sec.NOEXEC) as c:
        for q in calls:
            assert sqlstate(c, q, {"n": lock, "t": token}) == "42501", q
        # nor can it put the guard on a table of its own
        c.execute("CREATE TEMP TABLE mine (id int, fence_token bigint)")
        assert sqlstate(c, "CREATE TRIGGER g BEFORE INSERT ON mine FOR EACH ROW "
                           "EXECUTE FUNCTION fenced_lock_guard('x')") == "42501"
    assert lease_record(su, lock) == before


def test_application_role_cannot_redefine_drop_or_regrant_the_extensions_objects(sec, su):
    attacks = [
        "DROP EXTENSION fenced_lock",
        "ALTER EXTENSION fenced_lock UPDATE",
        "ALTER EXTENSION fenced_lock DROP FUNCTION fenced_lock_validate(text, bigint)",
        "CREATE OR REPLACE FUNCTION public.fenced_lock_validate(name text, token bigint) RETURNS boolean "
        "LANGUAGE sql AS 'SELECT true'",
        "ALTER FUNCTION fenced_lock_validate(text, bigint) SECURITY DEFINER",
        "ALTER FUNCTION fenced_lock_force_release(text) OWNER TO CURRENT_USER",
        "ALTER FUNCTION fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer) SET fenced_lock.max_ttl = '10d'",
        "DROP FUNCTION fenced_lock_force_release(text)",
        "CREATE OR REPLACE VIEW fenced_lock_leases AS SELECT 1 AS x",
        "ALTER VIEW fenced_lock_leases RENAME TO hidden",
        "DROP VIEW fenced_lock_leases",
        "COMMENT ON FUNCTION fenced_lock_validate(text, bigint) IS 'mine'",
        "ALTER SCHEMA fenced_lock_internal RENAME TO mine",
        "DROP SCHEMA fenced_lock_internal CASCADE",
        "CREATE FUNCTION public.fenced_lock_shadow() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    ]
    with sec.connect(sec.APP_A) as a:
        for q in attacks:
            assert sqlstate(a, q) == "42501", q
        # without GRANT OPTION a GRANT is a no-op (a warning), not a privilege for anyone
        for q in [f"GRANT EXECUTE ON FUNCTION fenced_lock_force_release(text) TO {sec.NOEXEC}",
                  f"GRANT SELECT ON fenced_lock_leases TO {sec.NOEXEC}"]:
            assert sqlstate(a, q) is None
    assert one(su, "SELECT has_function_privilege(%s, 'fenced_lock_force_release(text)', 'EXECUTE')",
               (sec.NOEXEC,)) is False
    assert one(su, "SELECT has_table_privilege(%s, 'fenced_lock_leases', 'SELECT')", (sec.NOEXEC,)) is False
    assert one(su, "SELECT prosecdef FROM pg_proc WHERE oid = 'fenced_lock_validate(text, bigint)'::regprocedure") \
        is False


# fenced_lock's own advisory-lock key spaces (src/keys.rs): (space, hashtext(name))
FENCE_SPACE, QUEUE_SPACE = 0x464C0001, 0x464C0002


@pytest.mark.parametrize("space", [QUEUE_SPACE, FENCE_SPACE], ids=["queue_key", "fence_key"])
def test_other_roles_cannot_keep_a_free_lock_from_being_granted(sec, su, lock, space):
    with sec.connect(sec.APP_B) as squatter:
        squatter.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (space, lock))
        with sec.connect(sec.APP_A) as a:
            a.execute("SET statement_timeout = '3s'")  # "does not hang", not a timing claim
            code = sqlstate(a, "SELECT fenced_lock_try_acquire(%s)", (lock,))
            granted = lease_record(su, lock)
    assert code is None and granted is not None and granted[2] == sec.APP_A


# == superuser-only settings ====================================================


def loaded(conn):
    """Make sure the library is loaded in this session."""
    conn.execute("SELECT fenced_lock_validate('sec:load', 1)")


def test_application_role_cannot_change_superuser_only_settings_once_loaded(sec, lock):
    with sec.connect(sec.APP_A) as a:
        loaded(a)
        attacks = [
            "SET fenced_lock.max_ttl = '10d'",
            "SET fenced_lock.max_ttl = 2147483647",
            "SET SESSION fenced_lock.max_ttl = '10d'",
            "SELECT set_config('fenced_lock.max_ttl', '864000', false)",
            "SELECT set_config('fenced_lock.max_ttl', '864000', true)",
            f"SET fenced_lock.operator_role = '{sec.APP_A}'",
            f"SELECT set_config('fenced_lock.operator_role', '{sec.APP_A}', false)",
            "RESET fenced_lock.operator_role",
            f"ALTER ROLE {sec.APP_A} SET fenced_lock.max_ttl = '10d'",
            f"ALTER ROLE {sec.APP_A} SET fenced_lock.operator_role = '{sec.APP_A}'",
            f'ALTER ROLE {sec.APP_A} IN DATABASE "{sec.db}" SET fenced_lock.max_ttl = \'10d\'',
            f'ALTER DATABASE "{sec.db}" SET fenced_lock.max_ttl = \'10d\'',
            f'ALTER DATABASE "{sec.db}" SET fenced_lock.operator_role = \'{sec.APP_A}\'',
            "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql "
            "SET fenced_lock.max_ttl = '10d' AS 'SELECT 1'",
            "LOAD 'fenced_lock'",
        ]
        for q in attacks:
            assert sqlstate(a, q) == "42501", q
        a.execute("BEGIN")
        assert sqlstate(a, "SET LOCAL fenced_lock.max_ttl = '10d'") == "42501"
        a.execute("ROLLBACK")
        assert one(a, "SHOW fenced_lock.max_ttl") == "1d"
        assert one(a, "SHOW fenced_lock.operator_role") == sec.OPS
        assert sqlstate(a, "SELECT fenced_lock_try_acquire(%s, '5 days')", (lock,)) == "22023"


PLACEHOLDER_TRICKS = {
    "set": ("SET fenced_lock.max_ttl = '10d'", "SET fenced_lock.operator_role = '{me}'"),
    "set_config": ("SELECT set_config('fenced_lock.max_ttl', '864000', false)",
                   "SELECT set_config('fenced_lock.operator_role', '{me}', false)"),
    "set_local": ("SET LOCAL fenced_lock.max_ttl = '10d'", "SET LOCAL fenced_lock.operator_role = '{me}'"),
}


@pytest.mark.parametrize("trick", sorted(PLACEHOLDER_TRICKS))
def test_settings_made_before_the_library_loads_do_not_take_effect(sec, su, lock, trick):
    """In a fresh session the GUCs do not exist yet and PostgreSQL accepts a SET
    of the placeholder; when the library loads, the value must be dropped."""
    token, before = held_by_a(sec, lock)
    set_ttl, set_operator = PLACEHOLDER_TRICKS[trick]
    in_transaction = trick == "set_local"
    for setting, call, expected in [
        (set_ttl, "SELECT fenced_lock_try_acquire(%s, '5 days')", "22023"),
        (set_operator, "SELECT fenced_lock_force_release(%s)", "42501"),
    ]:
        with sec.connect(sec.APP_B) as b:  # a fresh session: the library is not loaded
            if in_transaction:
                b.execute("BEGIN")
            assert sqlstate(b, setting.format(me=sec.APP_B)) in (None, "42501"), setting
            code = sqlstate(b, call, (lock,))
            if in_transaction:
                b.execute("ROLLBACK")
            assert code == expected, call
            assert one(b, "SHOW fenced_lock.max_ttl") == "1d"
            assert one(b, "SHOW fenced_lock.operator_role") == sec.OPS
    assert lease_record(su, lock) == before


def test_settings_passed_in_the_startup_packet_do_not_take_effect(sec, su, lock):
    token, before = held_by_a(sec, lock)
    opts = f"-c fenced_lock.max_ttl=10d -c fenced_lock.operator_role={sec.APP_B}"
    try:
        conn = sec.connect(sec.APP_B, options=opts)
    except psycopg.Error as e:  # refusing the connection is fine too
        assert e.sqlstate == "42501"
        return
    with conn as b:
        # The startup value was refused when the library loaded, which loses the
        # server's own value too: lease requests in this session are refused (42501).
        assert sqlstate(b, "SELECT fenced_lock_try_acquire(%s, '5 days')", (lock + ":other",)) == "42501"
        assert sqlstate(b, "SELECT fenced_lock_force_release(%s)", (lock,)) == "42501"
        assert one(b, "SHOW fenced_lock.max_ttl") == "1d"
        assert one(b, "SHOW fenced_lock.operator_role") != sec.APP_B
    assert lease_record(su, lock) == before


@pytest.fixture
def b_limited_to_one_hour(sec, su):
    """The superuser limits APP_B's leases in this database to one hour."""
    su.execute(sql.SQL("ALTER ROLE {} IN DATABASE {} SET fenced_lock.max_ttl = '1h'").format(
        I(sec.APP_B), I(sec.db)))
    yield
    su.execute(sql.SQL("ALTER ROLE {} IN DATABASE {} RESET fenced_lock.max_ttl").format(
        I(sec.APP_B), I(sec.db)))


def b_settings(sec, su):
    return su.execute("SELECT setconfig FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase "
                      "WHERE s.setrole = %s::regrole AND d.datname = %s", (sec.APP_B, sec.db)).fetchall()


def test_role_cannot_undo_a_lower_max_ttl_the_superuser_set_for_it(sec, su, lock, b_limited_to_one_hour):
    two_hours = "SELECT fenced_lock_try_acquire(%s, '2 hours')"
    with sec.connect(sec.APP_B) as b:
        assert one(b, "SHOW fenced_lock.max_ttl") == "1h"
        assert sqlstate(b, two_hours, (lock,)) == "22023"
    for trick in ["SET fenced_lock.max_ttl = '10d'", "RESET fenced_lock.max_ttl", "RESET ALL",
                  "SET fenced_lock.max_ttl TO DEFAULT",
                  "SELECT set_config('fenced_lock.max_ttl', '86400', false)"]:
        with sec.connect(sec.APP_B) as b:  # before the library loads
            assert sqlstate(b, trick) in (None, "42501"), trick
            assert sqlstate(b, two_hours, (lock,)) == "22023", trick
            assert one(b, "SHOW fenced_lock.max_ttl") == "1h", trick
    with sec.connect(sec.APP_B) as b:
        for q in [f'ALTER ROLE {sec.APP_B} IN DATABASE "{sec.db}" RESET fenced_lock.max_ttl',
                  f'ALTER ROLE {sec.APP_B} IN DATABASE "{sec.db}" SET fenced_lock.max_ttl = \'1d\'']:
            assert sqlstate(b, q) == "42501", q
        # RESET ALL is allowed, but keeps what the role may not change itself
        b.execute(f'ALTER ROLE {sec.APP_B} IN DATABASE "{sec.db}" RESET ALL')
    assert b_settings(sec, su) == [(["fenced_lock.max_ttl=1h"],)]
    assert lease_record(su, lock) is None


def test_startup_options_cannot_undo_a_lower_max_ttl(sec, su, lock, b_limited_to_one_hour):
    """A client passing the setting in its connection options, before the library is
    loaded, makes PostgreSQL drop the administrator's 1 h for the built-in default when
    the library loads. fenced_lock notices and refuses every lease request in that
    session (42501) rather than grant one longer than the administrator allowed."""
    try:
        conn = sec.connect(sec.APP_B, options="-c fenced_lock.max_ttl=10d")
    except psycopg.Error as e:  # refusing the connection is fine too
        assert e.sqlstate == "42501"
        return
    with conn as b:
        over = sqlstate(b, "SELECT fenced_lock_try_acquire(%s, '2 hours')", (lock,))
        under = sqlstate(b, "SELECT fenced_lock_try_acquire(%s, '30 minutes')", (lock,))
        renew = sqlstate(b, "SELECT fenced_lock_renew(%s, 1, '2 hours')", (lock,))
    assert (over, under, renew) == ("42501", "42501", "42501")
    assert lease_record(su, lock) is None
    with sec.connect(sec.APP_B) as b:  # a session without the option gets the 1 h limit
        assert sqlstate(b, "SELECT fenced_lock_try_acquire(%s, '2 hours')", (lock,)) == "22023"
        assert one(b, "SHOW fenced_lock.max_ttl") == "1h"
    assert lease_record(su, lock) is None


def test_role_cannot_store_the_settings_for_its_own_future_sessions(sec, su, lock):
    token, before = held_by_a(sec, lock)
    with sec.connect(sec.APP_B) as b:  # a fresh session: library not loaded yet
        for q in [f"ALTER ROLE {sec.APP_B} SET fenced_lock.max_ttl = '10d'",
                  f"ALTER ROLE {sec.APP_B} SET fenced_lock.operator_role = '{sec.APP_B}'",
                  f'ALTER ROLE {sec.APP_B} IN DATABASE "{sec.db}" SET fenced_lock.max_ttl = \'10d\'',
                  f"ALTER ROLE CURRENT_USER SET fenced_lock.operator_role = '{sec.APP_B}'"]:
            assert sqlstate(b, q) == "42501", q
    assert one(su, "SELECT count(*) FROM pg_db_role_setting WHERE setrole = %s::regrole",
               (sec.APP_B,)) == 0
    with sec.connect(sec.APP_B) as b:  # and a new session is unaffected
        assert sqlstate(b, "SELECT fenced_lock_try_acquire(%s, '5 days')", (lock + ":other",)) == "22023"
        assert sqlstate(b, "SELECT fenced_lock_force_release(%s)", (lock,)) == "42501"
        assert one(b, "SHOW fenced_lock.max_ttl") == "1d"
    assert lease_record(su, lock) == before


def test_database_owner_cannot_set_the_settings_for_its_database(sec, su):
    owned = f"{sec.TABOWNER}_db"
    su.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(I(owned)))
    su.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(I(owned), I(sec.TABOWNER)))
    try:
        with sec.connect(sec.TABOWNER, dbname=owned) as o:
            for q in [f'ALTER DATABASE "{owned}" SET fenced_lock.max_ttl = \'10d\'',
                      f'ALTER DATABASE "{owned}" SET fenced_lock.operator_role = \'{sec.TABOWNER}\'']:
                assert sqlstate(o, q) == "42501", q
        assert one(su, "SELECT count(*) FROM pg_db_role_setting s JOIN pg_database d "
                       "ON d.oid = s.setdatabase WHERE d.datname = %s", (owned,)) == 0
    finally:
        su.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(I(owned)))


# == what the view discloses ====================================================


def test_view_shows_other_roles_leases_without_token_or_holder(sec, su, lock):
    token, rec = held_by_a(sec, lock, holder="secret-worker")
    q = ("SELECT name, token, holder, owner::text, acquired_at, expires_at, live "
         "FROM fenced_lock_leases WHERE name = %s")
    full = (lock, token, "secret-worker", sec.APP_A, rec[3], rec[4], True)
    hidden = (lock, None, None, sec.APP_A, rec[3], rec[4], True)
    for role, expected in [(sec.APP_B, hidden), (sec.WRITER, hidden),
                           (sec.APP_A, full), (sec.MEMBER_A, full),
                           (sec.OPMEMBER, full), ("postgres", full)]:
        with sec.connect(role) as c:
            assert c.execute(q, (lock,)).fetchone() == expected, role
    with sec.connect(sec.NOEXEC) as c:
        assert sqlstate(c, "SELECT * FROM fenced_lock_leases") == "42501"


# == writing around the guard ===================================================


@pytest.fixture
def table(sec, request):
    """guarded.<t>(id, qty, fence_token), owned by TABOWNER, guarded by
    '<t>:{id}', row (1, 10) written under a lease since released; WRITER may
    SELECT/INSERT/UPDATE/DELETE it."""
    digest = hashlib.md5(request.node.nodeid.encode()).hexdigest()[:6]
    t = f"t_{request.node.originalname[5:30]}_{digest}"
    with sec.connect(sec.TABOWNER) as o:
        o.execute(sql.SQL("DROP TABLE IF EXISTS guarded.{} CASCADE").format(I(t)))
        o.execute(sql.SQL("CREATE TABLE guarded.{} (id int PRIMARY KEY, qty int NOT NULL, "
                          "fence_token bigint)").format(I(t)))
        o.execute(sql.SQL("CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON guarded.{} "
                          "FOR EACH ROW EXECUTE FUNCTION public.fenced_lock_guard({})").format(
            I(t), sql.Literal(t + ":{id}")))
        o.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON guarded.{} TO {}").format(
            I(t), I(sec.WRITER)))
        tok = acquire(o, f"{t}:1")
        o.execute(sql.SQL("INSERT INTO guarded.{} VALUES (1, 10, %s)").format(I(t)), (tok,))
        assert one(o, "SELECT fenced_lock_release(%s, %s)", (f"{t}:1", tok)) is True
    return t


def rows(sec, t):
    with sec.connect() as su:
        return su.execute(sql.SQL("SELECT id, qty, fence_token FROM guarded.{} ORDER BY id").format(
            I(t))).fetchall()


def lose_lease(sec, name):
    """WRITER takes `name`, loses it (forced release), TABOWNER takes it over.
    Returns (WRITER's stale token, the live token)."""
    with sec.connect(sec.WRITER) as w:
        stale = acquire(w, name)
    with sec.connect() as su:
        assert one(su, "SELECT fenced_lock_force_release(%s)", (name,)) is True
    with sec.connect(sec.TABOWNER) as o:
        live = acquire(o, name)
    assert live > stale
    return stale, live


def test_writer_cannot_turn_triggers_off_with_session_replication_role(sec, table):
    before = rows(sec, table)
    with sec.connect(sec.WRITER) as w:
        for q in ["SET session_replication_role = replica",
                  "SET session_replication_role = local",
                  "SELECT set_config('session_replication_role', 'replica', false)",
                  f"ALTER ROLE {sec.WRITER} SET session_replication_role = replica"]:
            assert sqlstate(w, q) == "42501", q
        w.execute("BEGIN")
        assert sqlstate(w, "SET LOCAL session_replication_role = replica") == "42501"
        w.execute("ROLLBACK")
        assert sqlstate(w, sql.SQL("UPDATE guarded.{} SET qty = 0, fence_token = NULL").format(
            I(table))) == "FL002"
    assert rows(sec, table) == before


def test_writer_cannot_disable_drop_or_replace_the_guard_trigger(sec, table):
    before = rows(sec, table)
    t = sql.SQL("guarded.") + I(table)
    attacks = [
        sql.SQL("ALTER TABLE {} DISABLE TRIGGER fence").format(t),
        sql.SQL("ALTER TABLE {} DISABLE TRIGGER ALL").format(t),
        sql.SQL("ALTER TABLE {} DISABLE TRIGGER USER").format(t),
        sql.SQL("ALTER TABLE {} ENABLE REPLICA TRIGGER fence").format(t),
        sql.SQL("ALTER TRIGGER fence ON {} RENAME TO gone").format(t),
        sql.SQL("DROP TRIGGER fence ON {}").format(t),
        sql.SQL("CREATE OR REPLACE TRIGGER fence BEFORE INSERT ON {} FOR EACH ROW "
                "EXECUTE FUNCTION public.fenced_lock_guard('nothing')").format(t),
        sql.SQL("ALTER TABLE {} OWNER TO CURRENT_USER").format(t),
        sql.SQL("ALTER TABLE {} RENAME COLUMN fence_token TO ft").format(t),
        sql.SQL("ALTER TABLE {} ALTER COLUMN fence_token TYPE numeric").format(t),
        sql.SQL("TRUNCATE {}").format(t),
        sql.SQL("DROP TABLE {}").format(t),
    ]
    with sec.connect(sec.WRITER) as w:
        for q in attacks:
            assert sqlstate(w, q) == "42501", q.as_string(w)
    with sec.connect() as su:
        assert su.execute("SELECT tgname, tgenabled FROM pg_trigger WHERE tgrelid = %s::regclass "
                          "AND NOT tgisinternal", (f"guarded.{table}",)).fetchall() == [("fence", "O")]
    assert rows(sec, table) == before


def test_writes_through_a_view_are_guarded(sec, table):
    stale, live = lose_lease(sec, f"{table}:1")
    before = rows(sec, table)
    with sec.connect(sec.WRITER) as w:
        w.execute(sql.SQL("CREATE TEMP VIEW v AS SELECT * FROM guarded.{}").format(I(table)))
        w.execute(sql.SQL("CREATE TEMP VIEW r AS SELECT * FROM guarded.{}").format(I(table)))
        w.execute(sql.SQL("CREATE RULE r_upd AS ON UPDATE TO r DO INSTEAD "
                          "UPDATE guarded.{} SET qty = NEW.qty WHERE id = OLD.id").format(I(table)))
        assert sqlstate(w, "INSERT INTO v VALUES (2, 5, NULL)") == "FL002"
        assert sqlstate(w, "INSERT INTO v VALUES (2, 5, %s)", (stale,)) == "FL001"
        assert sqlstate(w, "UPDATE v SET qty = 0") == "FL001"  # keeps the old row's token
        assert sqlstate(w, "UPDATE v SET qty = 0, fence_token = %s", (stale,)) == "FL001"
        assert sqlstate(w, "UPDATE v SET qty = 0, fence_token = NULL") == "FL002"
        assert sqlstate(w, "DELETE FROM v") == "FL002"
        assert sqlstate(w, "UPDATE r SET qty = 0") == "FL001"
    assert rows(sec, table) == before


def test_security_definer_function_of_the_table_owner_still_needs_a_live_token(sec, table):
    stale, live = lose_lease(sec, f"{table}:1")
    with sec.connect(sec.TABOWNER) as o:
        o.execute(sql.SQL(
            "CREATE FUNCTION guarded.{f}(p_id int, p_qty int, p_token bigint) RETURNS void "
            "LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS "
            "$$ UPDATE guarded.{t} SET qty = p_qty, fence_token = p_token WHERE id = p_id $$").format(
            f=I(table + "_set"), t=I(table)))
        o.execute(sql.SQL("CREATE FUNCTION guarded.{f}(p_id int) RETURNS void "
                          "LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS "
                          "$$ DELETE FROM guarded.{t} WHERE id = p_id $$").format(
            f=I(table + "_del"), t=I(table)))
        o.execute(sql.SQL("GRANT EXECUTE ON FUNCTION guarded.{}(int, int, bigint), guarded.{}(int) TO {}").format(
            I(table + "_set"), I(table + "_del"), I(sec.WRITER)))
    before = rows(sec, table)
    setq = sql.SQL("SELECT guarded.{}(1, 0, %s)").format(I(table + "_set"))
    with sec.connect(sec.WRITER) as w:
        assert sqlstate(w, setq, (stale,)) == "FL001"
        assert sqlstate(w, setq, (None,)) == "FL002"
        assert sqlstate(w, setq, (live + 1,)) == "FL001"  # a guess at the next token
        assert sqlstate(w, sql.SQL("SELECT guarded.{}(1)").format(I(table + "_del"))) == "FL002"
    assert rows(sec, table) == before


def test_stale_token_is_rejected_through_copy(sec, table):
    stale, live = lose_lease(sec, f"{table}:1")
    before = rows(sec, table)
    with sec.connect(sec.WRITER) as w:
        for data, code in [((2, 9, stale), "FL001"), ((2, 9, None), "FL002"), ((1, 9, stale), "FL001")]:
            with pytest.raises(psycopg.Error) as info:
                with w.cursor() as cur:
                    with cur.copy(sql.SQL("COPY guarded.{} (id, qty, fence_token) FROM STDIN").format(
                            I(table))) as cp:
                        cp.write_row(data)
            assert info.value.sqlstate == code, data
    assert rows(sec, table) == before


def test_stale_token_is_rejected_through_insert_on_conflict(sec, table):
    name = f"{table}:1"
    stale, live = lose_lease(sec, name)
    before = rows(sec, table)
    t = I(table)
    with sec.connect(sec.WRITER) as w:
        ins = "INSERT INTO guarded.{} VALUES (1, 9, %s) ON CONFLICT (id) DO "
        assert sqlstate(w, sql.SQL(ins + "UPDATE SET qty = excluded.qty, "
                                   "fence_token = excluded.fence_token").format(t), (stale,)) == "FL001"
        assert sqlstate(w, sql.SQL(ins + "NOTHING").format(t), (stale,)) == "FL001"
        assert sqlstate(w, sql.SQL(ins + "UPDATE SET qty = 0").format(t), (stale,)) == "FL001"
        assert sqlstate(w, sql.SQL(ins + "UPDATE SET qty = 0").format(t), (None,)) == "FL002"
    assert rows(sec, table) == before
    # The writer takes the lock properly; an upsert that keeps the old row's
    # (stale) token is still refused, one that writes its own token is accepted.
    with sec.connect(sec.TABOWNER) as o:
        assert one(o, "SELECT fenced_lock_release(%s, %s)", (name, live)) is True
    with sec.connect(sec.WRITER) as w:
        mine = acquire(w, name)
        assert sqlstate(w, sql.SQL(ins + "UPDATE SET qty = excluded.qty").format(t), (mine,)) == "FL001"
        assert rows(sec, table) == before
        w.execute(sql.SQL(ins + "UPDATE SET qty = excluded.qty, fence_token = excluded.fence_token").format(t),
                  (mine,))
    assert rows(sec, table) == [(1, 9, mine)]


def test_stale_token_is_rejected_through_merge(sec, table):
    stale, live = lose_lease(sec, f"{table}:1")
    before = rows(sec, table)
    merge = ("MERGE INTO guarded.{} g USING (VALUES (%s::int, 7, %s::bigint)) s(id, qty, tok) "
             "ON g.id = s.id ")
    with sec.connect(sec.WRITER) as w:
        upd = "WHEN MATCHED THEN UPDATE SET qty = s.qty, fence_token = s.tok"
        insrt = "WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.qty, s.tok)"
        assert sqlstate(w, sql.SQL(merge + upd).format(I(table)), (1, stale)) == "FL001"
        assert sqlstate(w, sql.SQL(merge + insrt).format(I(table)), (2, stale)) == "FL001"
        assert sqlstate(w, sql.SQL(merge + insrt).format(I(table)), (2, None)) == "FL002"
        assert sqlstate(w, sql.SQL(merge + "WHEN MATCHED THEN DELETE").format(I(table)), (1, stale)) == "FL002"
    assert rows(sec, table) == before


def test_cascading_foreign_key_actions_cannot_write_around_the_guard(sec, table):
    parent, child = table + "_p", table + "_c"
    with sec.connect(sec.TABOWNER) as o:
        o.execute(sql.SQL("CREATE TABLE guarded.{} (id int PRIMARY KEY)").format(I(parent)))
        o.execute(sql.SQL("CREATE TABLE guarded.{} (pid int NOT NULL REFERENCES guarded.{} "
                          "ON DELETE CASCADE ON UPDATE CASCADE, qty int, fence_token bigint)").format(
            I(child), I(parent)))
        o.execute(sql.SQL("CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON guarded.{} "
                          "FOR EACH ROW EXECUTE FUNCTION public.fenced_lock_guard({})").format(
            I(child), sql.Literal(child + ":{pid}")))
        o.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON guarded.{} TO {}").format(
            I(parent), I(sec.WRITER)))
        o.execute(sql.SQL("INSERT INTO guarded.{} VALUES (1)").format(I(parent)))
        tok = acquire(o, child + ":1")
        o.execute(sql.SQL("INSERT INTO guarded.{} VALUES (1, 10, %s)").format(I(child)), (tok,))
        one(o, "SELECT fenced_lock_release(%s, %s)", (child + ":1", tok))
    with sec.connect(sec.WRITER) as w:
        assert sqlstate(w, sql.SQL("DELETE FROM guarded.{}").format(I(parent))) == "FL002"
        # moving the child row to lock name ...:2 needs an assert of ...:1
        assert sqlstate(w, sql.SQL("UPDATE guarded.{} SET id = 2").format(I(parent))) in ("FL001", "FL002")
    with sec.connect() as su:
        assert su.execute(sql.SQL("SELECT pid, qty, fence_token FROM guarded.{}").format(
            I(child))).fetchall() == [(1, 10, tok)]


def test_writes_straight_into_a_partition_are_guarded(sec, table):
    part = table + "_part"
    with sec.connect(sec.TABOWNER) as o:
        o.execute(sql.SQL("CREATE TABLE guarded.{} (id int, qty int, fence_token bigint) "
                          "PARTITION BY RANGE (id)").format(I(part)))
        o.execute(sql.SQL("CREATE TABLE guarded.{} PARTITION OF guarded.{} FOR VALUES FROM (0) TO (100)").format(
            I(part + "_0"), I(part)))
        o.execute(sql.SQL("CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON guarded.{} "
                          "FOR EACH ROW EXECUTE FUNCTION public.fenced_lock_guard({})").format(
            I(part), sql.Literal(part + ":{id}")))
        o.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON guarded.{} TO {}").format(
            I(part + "_0"), I(sec.WRITER)))
    stale, live = lose_lease(sec, part + ":1")
    with sec.connect(sec.WRITER) as w:
        assert sqlstate(w, sql.SQL("INSERT INTO guarded.{} VALUES (1, 1, %s)").format(I(part + "_0")),
                        (stale,)) == "FL001"
        assert sqlstate(w, sql.SQL("INSERT INTO guarded.{} VALUES (1, 1, NULL)").format(I(part + "_0"))) == "FL002"
    with sec.connect() as su:
        assert one(su, sql.SQL("SELECT count(*) FROM guarded.{}").format(I(part))) == 0


# The guard renders `{col}` with the column type's output function. Settings
# of the writer's session change the text of some types; the README promises
# fixed settings for them, so that no writer can make a row resolve to a lock
# name nobody holds.
DOCUMENTED_RENDERING = ("SET DateStyle = 'ISO, YMD'; SET TimeZone = 'UTC'; SET IntervalStyle = 'postgres'; "
                        "SET extra_float_digits = 1; SET bytea_output = 'hex'")

RENDERING = [
    pytest.param("date", "2024-01-02", "SET DateStyle = 'SQL, DMY'", id="date_DateStyle"),
    pytest.param("date[]", "{2024-01-02}", "SET DateStyle = 'German'", id="date_array_DateStyle"),
    pytest.param("timestamptz", "2024-01-02 10:00:00+00", "SET TimeZone = 'Asia/Tokyo'", id="timestamptz_TimeZone"),
    pytest.param("interval", "1 day 2 hours", "SET IntervalStyle = 'iso_8601'", id="interval_IntervalStyle"),
    pytest.param("float8", "1.2345678", "SET extra_float_digits = -14", id="float8_extra_float_digits"),
    pytest.param("bytea", "\\x6869", "SET bytea_output = 'escape'", id="bytea_bytea_output"),
    pytest.param("regclass", "guarded.{t}", "SET search_path = guarded, public", id="regclass_search_path"),
    pytest.param("regtype", "guarded.{t}", "SET search_path = guarded, public", id="regtype_search_path"),
]


@pytest.mark.parametrize("coltype,value,setting", RENDERING)
def test_guard_resolves_a_row_to_the_same_lock_whatever_the_writers_settings(sec, table, coltype, value, setting):
    t = table + "_r"
    value = value.replace("{t}", t)
    with sec.connect(sec.TABOWNER) as o:
        o.execute(sql.SQL("CREATE TABLE guarded.{} (k {} PRIMARY KEY, who text, fence_token bigint)").format(
            I(t), sql.SQL(coltype)))
        o.execute(sql.SQL("CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON guarded.{} "
                          "FOR EACH ROW EXECUTE FUNCTION public.fenced_lock_guard({})").format(
            I(t), sql.Literal(t + ":{k}")))
        o.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON guarded.{} TO {}").format(I(t), I(sec.WRITER)))
        o.execute(DOCUMENTED_RENDERING)
        canonical = t + ":" + one(o, sql.SQL("SELECT %s::{}::text").format(sql.SQL(coltype)), (value,))
        live = acquire(o, canonical)  # the owner holds the row's lock and writes it
        o.execute(sql.SQL("INSERT INTO guarded.{} VALUES (%s, 'owner', %s)").format(I(t)), (value, live))
    with sec.connect(sec.WRITER) as w:
        w.execute(setting)
        other = t + ":" + one(w, sql.SQL("SELECT %s::{}::text").format(sql.SQL(coltype)), (value,))
        assert other != canonical  # the setting changes how the value prints
        mine = acquire(w, other)
        assert mine is not None
        code = sqlstate(w, sql.SQL("UPDATE guarded.{} SET who = 'writer', fence_token = %s").format(I(t)), (mine,))
    with sec.connect() as su:
        assert su.execute(sql.SQL("SELECT who, fence_token FROM guarded.{}").format(I(t))).fetchall() == [
            ("owner", live)]
    assert code == "FL001"


def test_truncate_is_guarded_by_the_before_truncate_trigger(sec, table):
    """With the README's BEFORE TRUNCATE trigger, TRUNCATE privilege is no way around the guard."""
    whole = table + "_whole"
    with sec.connect(sec.TABOWNER) as o:
        o.execute(sql.SQL("CREATE TABLE guarded.{} (id int, fence_token bigint)").format(I(whole)))
        for t, template in [(table, table + ":{id}"), (whole, whole)]:
            o.execute(sql.SQL("CREATE TRIGGER fence_truncate BEFORE TRUNCATE ON guarded.{} "
                              "FOR EACH STATEMENT EXECUTE FUNCTION public.fenced_lock_guard({})").format(
                I(t), sql.Literal(template)))
            o.execute(sql.SQL("GRANT TRUNCATE ON guarded.{} TO {}").format(I(t), I(sec.WRITER)))
        o.execute(sql.SQL("CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON guarded.{} "
                          "FOR EACH ROW EXECUTE FUNCTION public.fenced_lock_guard({})").format(
            I(whole), sql.Literal(whole)))
        tok = acquire(o, whole)
        o.execute(sql.SQL("INSERT INTO guarded.{} VALUES (1, %s)").format(I(whole)), (tok,))
        one(o, "SELECT fenced_lock_release(%s, %s)", (whole, tok))
    before = rows(sec, table)
    with sec.connect(sec.WRITER) as w:
        # per-row locks: one statement cannot hold them all
        assert sqlstate(w, sql.SQL("TRUNCATE guarded.{}").format(I(table))) == "42501"
        # whole-table lock: like a DELETE, needs an assert of the live lease
        assert sqlstate(w, sql.SQL("TRUNCATE guarded.{}").format(I(whole))) == "FL002"
        stale = acquire(w, whole)
        with sec.connect() as su:
            one(su, "SELECT fenced_lock_force_release(%s)", (whole,))
        w.execute("BEGIN")
        assert sqlstate(w, "SELECT fenced_lock_assert(%s, %s)", (whole, stale)) == "FL001"
        w.execute("ROLLBACK")
        mine = acquire(w, whole)
        w.execute("BEGIN")
        w.execute("SELECT fenced_lock_assert(%s, %s)", (whole, mine))
        w.execute(sql.SQL("TRUNCATE guarded.{}").format(I(whole)))
        w.execute("COMMIT")
    assert rows(sec, table) == before
    with sec.connect() as su:
        assert one(su, sql.SQL("SELECT count(*) FROM guarded.{}").format(I(whole))) == 0


# == 0.3.0: several names, renew_all, proclaim, the leader, pid =================

from modes_support import NEW_FUNCTIONS, grant_new_functions  # noqa: E402


@pytest.fixture(scope="module")
def api030(sec):
    """APP_A and APP_B may call the 0.3.0 functions, and read the history
    and waiters views too."""
    with sec.connect() as su:
        grant_new_functions(su, sec.APP_A, sec.APP_B)
        for v in ("fenced_lock_history", "fenced_lock_waiters"):
            su.execute(sql.SQL("GRANT SELECT ON {} TO {}, {}").format(I(v), I(sec.APP_A), I(sec.APP_B)))
    return sec


def test_release_all_renew_all_and_proclaim_of_another_roles_lease_are_refused(sec, su, lock, api030):
    holder = "worker-030"  # only this test's leases have it
    token, _ = held_by_a(sec, lock, holder=holder)
    with sec.connect(sec.APP_A) as a:
        assert one(a, "SELECT fenced_lock_proclaim(%s, %s, 'mine')", (lock, token)) is True
    before = lease_record(su, lock)
    value = one(su, "SELECT value FROM fenced_lock_internal.granted_leases WHERE name = %s", (lock,))
    with sec.connect(sec.APP_B) as b:
        mine = acquire(b, lock + ":b", holder=holder)
        assert sqlstate(b, "SELECT fenced_lock_release_all(%s, %s)", ([lock], [token])) == "42501"
        # refused as a whole: B's own lease in the same call is not released either
        assert sqlstate(b, "SELECT fenced_lock_release_all(%s, %s)", ([lock + ":b", lock], [mine, token])) == "42501"
        assert one(b, "SELECT fenced_lock_validate(%s, %s)", (lock + ":b", mine)) is True
        # renew_all renews only what B may renew: its own lease with that holder
        assert one(b, "SELECT fenced_lock_renew_all(%s, '1 day')", (holder,)) == 1
        assert one(b, "SELECT fenced_lock_proclaim(%s, %s, 'evil')", (lock, token)) is False
        # the holder text is A's, and still not B's way in
        assert one(b, "SELECT fenced_lock_try_acquire_all(%s, '1 minute', %s)", ([lock], holder)) is None
        assert sqlstate(b, "SELECT fenced_lock_acquire_all(%s, '1 minute', '0', %s)", ([lock], holder)) == "55P03"
        assert one(b, "SELECT fenced_lock_release(%s, %s)", (lock + ":b", mine)) is True
    assert lease_record(su, lock) == before
    assert one(su, "SELECT value FROM fenced_lock_internal.granted_leases WHERE name = %s", (lock,)) == value == "mine"
    with sec.connect(sec.MEMBER_A) as m:  # a member of the owner may (control)
        assert one(m, "SELECT fenced_lock_renew_all(%s, '2 hours')", (holder,)) == 1
        assert one(m, "SELECT fenced_lock_release_all(%s, %s)", ([lock], [token])) == 1


def test_another_roles_pid_and_holder_are_hidden_except_through_fenced_lock_leader(sec, su, lock, api030):
    with sec.connect(sec.APP_A) as a, sec.connect(sec.APP_A) as a2, sec.connect(sec.APP_B) as b:
        token = one(a, "SELECT fenced_lock_try_acquire(%s, '10 minutes', 'secret-holder', session_bound => true)",
                    (lock,))
        assert one(a, "SELECT fenced_lock_proclaim(%s, %s, 'secret-value')", (lock, token)) is True
        ended = acquire(a, lock + ":ended", holder="secret-ended")
        assert one(a, "SELECT fenced_lock_release(%s, %s)", (lock + ":ended", ended)) is True
        a2.execute("SET statement_timeout = '20s'")
        waiter = threading.Thread(target=lambda: sqlstate(
            a2, "SELECT fenced_lock_acquire(%s, '1 minute', '10 seconds', 'secret-waiter')", (lock,)), daemon=True)
        waiter.start()
        try:
            deadline = time.monotonic() + 10
            while not one(su, "SELECT count(*) FROM fenced_lock_waiters WHERE name = %s", (lock,)):
                assert time.monotonic() < deadline, "the waiter never queued"
                time.sleep(0.01)
            leases = ("SELECT token, holder, pid, owner::text, session_bound, live FROM fenced_lock_leases "
                      "WHERE name = %s")
            history = "SELECT token, holder FROM fenced_lock_history WHERE name = %s"
            waiters = "SELECT holder, owner::text FROM fenced_lock_waiters WHERE name = %s"
            assert a.execute(leases, (lock,)).fetchone() == (token, "secret-holder", a.info.backend_pid, sec.APP_A,
                                                            True, True)
            assert b.execute(leases, (lock,)).fetchone() == (None, None, None, sec.APP_A, True, True)
            assert b.execute(history, (lock,)).fetchall() == [(None, None)]
            assert b.execute(history, (lock + ":ended",)).fetchall() == [(None, None)]
            assert a.execute(history, (lock + ":ended",)).fetchall() == [(ended, "secret-ended")]
            assert b.execute(waiters, (lock,)).fetchall() == [(None, sec.APP_A)]
            assert a.execute(waiters, (lock,)).fetchall() == [("secret-waiter", sec.APP_A)]
            assert b.execute("SELECT count(*) FROM fenced_lock_leases l JOIN pg_stat_activity s USING (pid) "
                             "WHERE l.name = %s", (lock,)).fetchone()[0] == 0
            # by design, the leader function shows holder, token and value to whoever may call it
            assert b.execute("SELECT holder, token, value FROM fenced_lock_leader(%s)", (lock,)).fetchone() == (
                "secret-holder", token, "secret-value")
        finally:
            su.execute("SELECT pg_cancel_backend(%s)", (a2.info.backend_pid,))
            waiter.join(10)


def test_no_new_function_is_executable_by_public_after_create_extension(sec, su):
    """In a fresh database: no function or view of the extension outside its
    private schema is open to PUBLIC (the view helpers in
    fenced_lock_internal are, by design, and PUBLIC cannot name them), and a
    role granted nothing gets 42501 from each 0.3.0 function."""
    fresh = f"{sec.db}_fresh"
    su.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(I(fresh)))
    su.execute(sql.SQL("CREATE DATABASE {}").format(I(fresh)))
    try:
        with sec.connect(dbname=fresh) as c:
            c.execute("CREATE EXTENSION fenced_lock")
            objects = c.execute(
                "SELECT p.oid::regprocedure::text, n.nspname, "
                "       EXISTS (SELECT FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) x "
                "               WHERE x.grantee = 0 AND x.privilege_type = 'EXECUTE') "
                "  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e' "
                "  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'fenced_lock'").fetchall()
            public = {f for f, schema, open_ in objects if open_ and schema != "fenced_lock_internal"}
            assert public == set(), public
            names = {f for f, schema, _ in objects if schema != "fenced_lock_internal"}
            new = {one(c, "SELECT %s::regprocedure::text", (f,)) for f in NEW_FUNCTIONS}
            assert new <= names, new - names
            views = c.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_depend d ON d.classid = 'pg_class'::regclass "
                "AND d.objid = c.oid AND d.deptype = 'e' JOIN pg_extension e ON e.oid = d.refobjid "
                "AND e.extname = 'fenced_lock' WHERE c.relkind = 'v' AND EXISTS (SELECT FROM "
                "aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) x WHERE x.grantee = 0)").fetchall()
            assert views == []
            c.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(I(fresh), I(sec.NOEXEC)))
        calls = [
            "SELECT fenced_lock_try_acquire_all(ARRAY['x'])",
            "SELECT fenced_lock_acquire_all(ARRAY['x'], '1 minute', '0')",
            "SELECT fenced_lock_release_all(ARRAY['x'], ARRAY[1::bigint])",
            "SELECT fenced_lock_renew_all('h')",
            "SELECT * FROM fenced_lock_leader('x')",
            "SELECT fenced_lock_proclaim('x', 1, 'v')",
            "SELECT * FROM fenced_lock_stats_by_mode",
            "SELECT * FROM fenced_lock_waiters",
            "SELECT * FROM fenced_lock_history",
        ]
        with sec.connect(sec.NOEXEC, dbname=fresh) as n:
            for q in calls:
                assert sqlstate(n, q) == "42501", q
        with sec.connect(dbname=fresh) as c:
            assert c.execute("SELECT count(*) FROM fenced_lock_internal.granted_leases").fetchone()[0] == 0
    finally:
        su.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(I(fresh)))
