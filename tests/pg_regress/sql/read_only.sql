-- A lease change needs a read-write transaction (docs/design.md, "Tokens"
-- and "Durability": every change is written and flushed on the primary).
-- In a READ ONLY transaction try_acquire, acquire, renew, release and
-- force_release raise 25006 (read_only_sql_transaction) and change nothing;
-- on a hot standby they raise the same SQLSTATE ("cannot change a lease on a
-- standby server"), tested in tests/ha. validate and assert only read, and
-- work in a read-only transaction too.
\set VERBOSITY sqlstate

SELECT fenced_lock_try_acquire('ro:held', '1 minute', 'worker-1') AS t \gset

-- One message in full.
BEGIN TRANSACTION READ ONLY;
\set VERBOSITY default
SELECT fenced_lock_try_acquire('ro:free', '1 minute');
\set VERBOSITY sqlstate
ROLLBACK;

-- Every lease change, each in a read-only transaction of its own.
SET default_transaction_read_only = on;
SELECT fenced_lock_try_acquire('ro:free', '1 minute');
SELECT fenced_lock_acquire('ro:free', '1 minute');
SELECT fenced_lock_acquire('ro:free', '1 minute', wait => '0');
-- also for the holder of the lease, retrying or renewing it...
SELECT fenced_lock_try_acquire('ro:held', '1 minute', 'worker-1');
SELECT fenced_lock_renew('ro:held', :t);
SELECT fenced_lock_renew('ro:held', :t, '1 hour');
-- ...releasing it, or an operator force releasing it.
SELECT fenced_lock_release('ro:held', :t);
SELECT fenced_lock_force_release('ro:held');
-- Even a call that would change nothing (a token that is not live, a name
-- with no lease) is refused: the check comes first.
SELECT fenced_lock_release('ro:held', :t + 1000);
SELECT fenced_lock_force_release('ro:free');

-- validate and assert read; they work.
SELECT fenced_lock_validate('ro:held', :t) AS t_is_live;
SELECT fenced_lock_assert('ro:held', :t);
SELECT fenced_lock_assert('ro:held', :t + 1000);
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name LIKE 'ro:%';
RESET default_transaction_read_only;

-- Nothing changed: the lease is live with its token, 'ro:free' has no lease.
SELECT name, token = :t AS is_t, live FROM fenced_lock_leases WHERE name LIKE 'ro:%';
-- In a read-write transaction the same calls work.
SELECT fenced_lock_renew('ro:held', :t) AS renewed;
SELECT fenced_lock_release('ro:held', :t) AS released;
