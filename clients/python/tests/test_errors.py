"""Promise (clients/README.md, "Errors"): each SQLSTATE of the table comes
back as its own error type, carrying the server's sqlstate, message, detail
and hint; every type is a psycopg error (and psycopg's own class for that
SQLSTATE where psycopg has one), so existing handlers still catch it."""

import asyncio
import time

import psycopg
import pytest

import fenced_lock
from conftest import DB, ROLE_NOEXEC, ROLE_OTHER, with_db
from fenced_lock import (AsyncLocker, FencedLockError, InvalidArgument, Locker, MissingToken, ModeConflict,
                         NotAllowed, ReadOnly, StaleToken, WaitTimeout)


def carries_the_servers_diagnostics(e, sqlstate):
    assert isinstance(e, FencedLockError) and isinstance(e, psycopg.Error)
    assert e.sqlstate == sqlstate
    assert e.message and e.message == e.diag.message_primary
    assert e.hint == e.diag.message_hint
    assert e.detail == e.diag.message_detail


def test_fl001_on_a_guarded_write_with_a_stale_token_is_stale_token(admin, doc):
    row, lock = doc
    t = admin.execute("SELECT fenced_lock_try_acquire(%s, '10 s')", (lock,)).fetchone()[0]
    admin.execute("SELECT fenced_lock_release(%s, %s)", (lock, t))
    # Any psycopg connection of the process: the code is registered on import.
    with pytest.raises(StaleToken) as e:
        admin.execute("UPDATE docs SET fence_token = %s WHERE id = %s", (t, row))
    carries_the_servers_diagnostics(e.value, "FL001")
    assert lock in e.value.message
    assert e.value.detail == f'lock: "{lock}"; presented token: {t}; live token: none'
    assert e.value.hint


def test_fl001_from_fenced_lock_assert_is_stale_token(admin, name):
    with pytest.raises(StaleToken) as e:
        admin.execute("SELECT fenced_lock_assert(%s, 1)", (name,))
    carries_the_servers_diagnostics(e.value, "FL001")


def test_fl002_on_a_guarded_write_without_a_token_is_missing_token(admin, doc):
    row, _ = doc
    with pytest.raises(MissingToken) as e:
        admin.execute("UPDATE docs SET fence_token = NULL WHERE id = %s", (row,))
    carries_the_servers_diagnostics(e.value, "FL002")
    assert e.value.hint


def test_55p03_when_acquire_waits_out_its_wait_is_wait_timeout(dsn, admin, name):
    t = admin.execute("SELECT fenced_lock_try_acquire(%s, '30 s')", (name,)).fetchone()[0]
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as e:
        Locker(dsn).acquire(name, ttl=5, wait=0.3)
    waited = time.monotonic() - started
    assert isinstance(e.value, psycopg.errors.LockNotAvailable)
    carries_the_servers_diagnostics(e.value, "55P03")
    assert waited >= 0.3, waited
    assert admin.execute("SELECT fenced_lock_validate(%s, %s)", (name, t)).fetchone()[0]


def test_25006_in_a_read_only_transaction_is_read_only(dsn, name):
    read_only = with_db(dsn, DB, options="-c default_transaction_read_only=on")
    with pytest.raises(ReadOnly) as e:
        Locker(read_only).try_acquire(name, ttl=5)
    assert isinstance(e.value, psycopg.errors.ReadOnlySqlTransaction)
    carries_the_servers_diagnostics(e.value, "25006")


def test_25006_on_a_release_inside_a_read_only_transaction_is_read_only(dsn, admin, name):
    lease = Locker(dsn).acquire(name, ttl=5, keepalive=False)
    try:
        with pytest.raises(ReadOnly):
            with lease.conn.transaction():
                lease.conn.execute("SET TRANSACTION READ ONLY")
                lease.release()
    finally:
        lease.close()
    admin.execute("SELECT fenced_lock_force_release(%s)", (name,))


def test_42501_release_of_another_roles_lease_is_not_allowed(dsn, admin, name):
    lease = Locker(dsn).acquire(name, ttl=10, keepalive=False)
    try:
        with lease.conn.transaction():
            lease.conn.execute(f"SET LOCAL ROLE {ROLE_OTHER}")
            with pytest.raises(NotAllowed) as e:
                lease.release()
    finally:
        lease.close()
    assert isinstance(e.value, psycopg.errors.InsufficientPrivilege)
    carries_the_servers_diagnostics(e.value, "42501")
    assert admin.execute("SELECT fenced_lock_validate(%s, %s)", (name, lease.token)).fetchone()[0]
    admin.execute("SELECT fenced_lock_force_release(%s)", (name,))


def test_42501_for_a_role_without_execute_is_not_allowed(dsn, name):
    with pytest.raises(NotAllowed) as e:
        Locker(with_db(dsn, DB, user=ROLE_NOEXEC)).try_acquire(name, ttl=5)
    carries_the_servers_diagnostics(e.value, "42501")


@pytest.mark.parametrize("kw", [{"name": "n" * 600}, {"ttl": 3 * 86400}],
                         ids=["name-over-512-bytes", "ttl-over-max_ttl"])
def test_22023_judged_by_the_server_is_invalid_argument(dsn, kw):
    args = {"name": "invalid:1", "ttl": 5, **kw}
    with pytest.raises(InvalidArgument) as e:
        Locker(dsn).try_acquire(args.pop("name"), **args)
    carries_the_servers_diagnostics(e.value, "22023")
    assert e.value.argument is None  # the server's judgement, not the client's
    assert isinstance(e.value, ValueError)


def test_fl003_another_permit_count_live_on_the_name_is_mode_conflict(dsn, name):
    locker = Locker(dsn)
    with locker.acquire(name, ttl=10, permits=2):
        with pytest.raises(ModeConflict) as e:
            locker.try_acquire(name, ttl=10, permits=3)
    carries_the_servers_diagnostics(e.value, "FL003")


def test_other_sqlstates_keep_psycopgs_own_class(dsn, admin, name):
    """57014 (statement_timeout) is not in the table: it stays psycopg's."""
    admin.execute("SELECT fenced_lock_try_acquire(%s, '30 s')", (name,))
    with pytest.raises(psycopg.errors.QueryCanceled) as e:
        Locker(with_db(dsn, DB, options="-c statement_timeout=200")).acquire(name, ttl=5)
    assert not isinstance(e.value, FencedLockError)


def test_every_error_type_is_exported_with_its_sqlstate():
    assert {cls.__name__: cls.sqlstate for cls in (StaleToken, MissingToken, ModeConflict, WaitTimeout, ReadOnly,
                                                   NotAllowed, InvalidArgument)} == {
        "StaleToken": "FL001", "MissingToken": "FL002", "ModeConflict": "FL003", "WaitTimeout": "55P03",
        "ReadOnly": "25006", "NotAllowed": "42501", "InvalidArgument": "22023"}
    assert fenced_lock.UsageError.sqlstate is None


def test_async_calls_map_sqlstates_to_the_same_types(dsn, admin, name):
    admin.execute("SELECT fenced_lock_try_acquire(%s, '30 s')", (name,))

    async def go():
        with pytest.raises(WaitTimeout) as e:
            await AsyncLocker(dsn).acquire(name, ttl=5, wait=0.2)
        carries_the_servers_diagnostics(e.value, "55P03")
        with pytest.raises(NotAllowed):
            await AsyncLocker(with_db(dsn, DB, user=ROLE_NOEXEC)).try_acquire(name, ttl=5)
        with pytest.raises(ReadOnly):
            await AsyncLocker(with_db(dsn, DB, options="-c default_transaction_read_only=on")).try_acquire(name)
        with pytest.raises(InvalidArgument) as e:
            await AsyncLocker(dsn).try_acquire("n" * 600)
        assert e.value.argument is None
        lease = await AsyncLocker(dsn).acquire(name + ":2", ttl=5, keepalive=False)
        async with lease:
            with pytest.raises(StaleToken):
                await lease.conn.execute("SELECT fenced_lock_assert(%s, %s)", (name, lease.token))

    asyncio.run(go())
