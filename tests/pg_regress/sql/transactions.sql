-- Leases and transactions (docs/design.md, "Transitions", "The guard" and
-- "Invariants" 5). A grant made inside an explicit transaction takes effect
-- when it commits; rolled back, it never existed and its token is burnt,
-- never reused. A whole unit of work (acquire, guarded writes, release) fits
-- in one transaction. At REPEATABLE READ and SERIALIZABLE the functions and
-- the guard still decide on the latest committed lease state and the
-- server's clock, not on the transaction's snapshot or start time. A second
-- session (dblink) stands in for another client.
\set VERBOSITY sqlstate

SELECT dblink_connect('other', regress_conninfo()) AS connected;

CREATE TABLE ledger (account text PRIMARY KEY, balance int NOT NULL, fence_token bigint);
CREATE TRIGGER ledger_fence
  BEFORE INSERT OR UPDATE OR DELETE ON ledger
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('ledger:{account}');

--
-- Rolled back: the grant never existed, its token is burnt.
--
BEGIN;
SELECT fenced_lock_try_acquire('ledger:a', '1 minute', 'w1') AS t1 \gset
SELECT fenced_lock_validate('ledger:a', :t1) AS live_inside;
-- Until COMMIT, other sessions do not see it.
SELECT * FROM dblink('other', format('SELECT fenced_lock_validate(%L, %s)', 'ledger:a', :t1)) AS (live boolean);
SELECT * FROM dblink('other', $$SELECT count(*) FROM fenced_lock_leases WHERE name = 'ledger:a'$$) AS (leases bigint);
ROLLBACK;
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name = 'ledger:a';
SELECT fenced_lock_validate('ledger:a', :t1) AS t1_is_live;
SELECT fenced_lock_release('ledger:a', :t1) AS released;
-- The next grant gets a larger token: t1 is never handed out again.
SELECT fenced_lock_try_acquire('ledger:a', '1 minute', 'w1') AS t2 \gset
SELECT :t2 > :t1 AS t2_above_t1;
SELECT fenced_lock_release('ledger:a', :t2) AS released;

-- The same inside a savepoint rolled back.
BEGIN;
SAVEPOINT s;
SELECT fenced_lock_try_acquire('ledger:a', '1 minute') AS t3 \gset
ROLLBACK TO SAVEPOINT s;
SELECT fenced_lock_validate('ledger:a', :t3) AS t3_is_live;
SELECT fenced_lock_try_acquire('ledger:a', '1 minute') AS t4 \gset
COMMIT;
SELECT :t4 > :t3 AS t4_above_t3, fenced_lock_validate('ledger:a', :t4) AS t4_is_live;
-- A release rolled back did not happen either: the lease is as before.
BEGIN;
SELECT fenced_lock_release('ledger:a', :t4) AS released;
SELECT fenced_lock_validate('ledger:a', :t4) AS live_inside;
ROLLBACK;
SELECT fenced_lock_validate('ledger:a', :t4) AS t4_is_live;
SELECT fenced_lock_release('ledger:a', :t4) AS released;

--
-- One transaction: acquire, guarded writes, release, commit. The writes and
-- the release commit together.
--
BEGIN;
SELECT fenced_lock_try_acquire('ledger:a', '1 minute') AS t5 \gset
INSERT INTO ledger VALUES ('a', 100, :t5);
UPDATE ledger SET balance = balance - 30 WHERE account = 'a';
SELECT fenced_lock_release('ledger:a', :t5) AS released;
-- After the release, even in the same transaction, the token is stale.
UPDATE ledger SET balance = 0 WHERE account = 'a';
ROLLBACK;
SELECT count(*) AS rows_after_rollback FROM ledger;
BEGIN;
SELECT fenced_lock_try_acquire('ledger:a', '1 minute') AS t5 \gset
INSERT INTO ledger VALUES ('a', 100, :t5);
UPDATE ledger SET balance = balance - 30 WHERE account = 'a';
SELECT fenced_lock_release('ledger:a', :t5) AS released;
COMMIT;
SELECT account, balance, fence_token = :t5 AS token_is_t5 FROM ledger;
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name = 'ledger:a';

--
-- REPEATABLE READ: the snapshot is taken at the first query, but the
-- lease functions and the guard see what other sessions committed after it.
--
SELECT fenced_lock_try_acquire('ledger:a', '1 minute', 'w1') AS t6 \gset
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT account, balance FROM ledger;
-- Meanwhile the other session ends t6 (as an operator would) and takes the lock.
SELECT * FROM dblink('other', $$SELECT fenced_lock_force_release('ledger:a')$$) AS (ended boolean);
SELECT token AS t7 FROM dblink('other', $$SELECT fenced_lock_try_acquire('ledger:a', '1 minute', 'w2')$$) AS (token bigint) \gset
SELECT :t7 > :t6 AS t7_above_t6;
-- The functions see the new lease...
SELECT fenced_lock_validate('ledger:a', :t6) AS t6_is_live, fenced_lock_validate('ledger:a', :t7) AS t7_is_live;
SELECT fenced_lock_renew('ledger:a', :t6) AS renewed_t6;
-- ...while fenced_lock_leases, an ordinary view, shows this transaction's snapshot.
SELECT holder, token = :t6 AS is_t6, live FROM fenced_lock_leases WHERE name = 'ledger:a';
-- The guard rejects the stale token t6, though the snapshot still shows it.
UPDATE ledger SET balance = balance - 10, fence_token = :t6 WHERE account = 'a';
ROLLBACK;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT account, balance FROM ledger;
SELECT * FROM dblink('other', format('SELECT fenced_lock_release(%L, %s)', 'ledger:a', :t7)) AS (released boolean);
-- A lease granted after the snapshot was taken is live for this transaction's writes.
SELECT fenced_lock_try_acquire('ledger:a', '1 minute', 'w1') AS t8 \gset
UPDATE ledger SET balance = balance - 10, fence_token = :t8 WHERE account = 'a';
-- Expiry follows the server's clock, not the transaction start: shorten the
-- lease to 1 microsecond, and it is over inside the same transaction.
SELECT fenced_lock_renew('ledger:a', :t8, '1 microsecond') AS renewed;
SELECT pg_sleep(0.01);
SELECT fenced_lock_validate('ledger:a', :t8) AS t8_is_live;
UPDATE ledger SET balance = balance - 10 WHERE account = 'a';
ROLLBACK;
SELECT account, balance FROM ledger;

--
-- SERIALIZABLE: the same API, the same answers.
--
SELECT fenced_lock_try_acquire('ledger:b', '1 minute', 'w1') AS tb \gset
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT account, balance FROM ledger;
SELECT fenced_lock_try_acquire('ledger:a', '1 minute', 'w1') AS t9 \gset
SELECT fenced_lock_try_acquire('ledger:a', '1 minute', 'w1') = :t9 AS same_token;
SELECT fenced_lock_validate('ledger:a', :t9) AS t9_is_live;
UPDATE ledger SET balance = balance - 10, fence_token = :t9 WHERE account = 'a';
SELECT fenced_lock_renew('ledger:a', :t9, '2 minutes') AS renewed;
SELECT fenced_lock_assert('ledger:a', :t9);
INSERT INTO ledger VALUES ('b', 5, :tb);
SELECT fenced_lock_release('ledger:a', :t9) AS released;
SELECT fenced_lock_release('ledger:b', :tb) AS released;
COMMIT;
SELECT account, balance, fence_token = :t9 AS token_is_t9 FROM ledger ORDER BY account;
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name IN ('ledger:a', 'ledger:b');
-- A SERIALIZABLE transaction whose snapshot predates another session's grant
-- sees that grant too: its own try is refused.
SELECT token AS t10 FROM dblink('other', $$SELECT fenced_lock_try_acquire('ledger:a', '1 minute', 'w2')$$) AS (token bigint) \gset
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT account, balance FROM ledger;
SELECT * FROM dblink('other', format('SELECT fenced_lock_release(%L, %s)', 'ledger:a', :t10)) AS (released boolean);
SELECT token AS t11 FROM dblink('other', $$SELECT fenced_lock_try_acquire('ledger:a', '1 minute', 'w2')$$) AS (token bigint) \gset
SELECT fenced_lock_try_acquire('ledger:a', '1 minute', 'w1') IS NULL AS refused;
SELECT fenced_lock_validate('ledger:a', :t10) AS t10_is_live, fenced_lock_validate('ledger:a', :t11) AS t11_is_live;
UPDATE ledger SET balance = 0, fence_token = :t10 WHERE account = 'a';
ROLLBACK;

-- Clean up.
SELECT * FROM dblink('other', format('SELECT fenced_lock_release(%L, %s)', 'ledger:a', :t11)) AS (released boolean);
SELECT dblink_disconnect('other');
DROP TABLE ledger;
SELECT count(*) AS live_leases FROM fenced_lock_leases WHERE name LIKE 'ledger:%' AND live;
