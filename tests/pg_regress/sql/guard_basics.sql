-- The guard trigger (docs/design.md, "The guard") on an inventory table: a
-- write is accepted only with the token of the live lease of the row's lock
-- name, so a holder that lost its lease cannot write, whatever client it
-- uses. FL001: stale token. FL002: no token (NULL column, or a DELETE
-- without fenced_lock_assert). A rejected statement changes nothing.
\set VERBOSITY sqlstate

CREATE TABLE inventory (
    item_id     int PRIMARY KEY,
    stock       int NOT NULL,
    fence_token bigint
);
CREATE TRIGGER inventory_fence
  BEFORE INSERT OR UPDATE OR DELETE ON inventory
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('inventory:{item_id}', 'fence_token');

-- Without a lease, nothing can be written.
INSERT INTO inventory VALUES (1, 10, 1);
SELECT :'LAST_ERROR_MESSAGE' AS message;
-- With the live lease of inventory:1 the row goes in.
SELECT fenced_lock_try_acquire('inventory:1', '1 minute', 'setup') AS t0 \gset
INSERT INTO inventory VALUES (1, 10, :t0);
SELECT fenced_lock_release('inventory:1', :t0) AS released;
SELECT item_id, stock, fence_token = :t0 AS written_with_t0 FROM inventory;

--
-- The worked example (docs/design.md, "Why"). Stock is 10.
--
-- A takes the lock (ttl 100 ms) and reads 10...
SELECT fenced_lock_try_acquire('inventory:1', '100 ms', 'client-a') AS ta \gset
SELECT stock AS a_read FROM inventory WHERE item_id = 1 \gset
-- ...and pauses longer than its ttl.
SELECT pg_sleep(0.2);
-- B takes the lock, reads 10, writes 9, releases.
SELECT fenced_lock_try_acquire('inventory:1', '1 minute', 'client-b') AS tb \gset
SELECT stock AS b_read FROM inventory WHERE item_id = 1 \gset
UPDATE inventory SET stock = :b_read - 1, fence_token = :tb WHERE item_id = 1;
SELECT fenced_lock_release('inventory:1', :tb) AS released;
-- A wakes up and writes 9: rejected, the sale B made is not lost.
UPDATE inventory SET stock = :a_read - 1, fence_token = :ta WHERE item_id = 1;
SELECT regexp_replace(:'LAST_ERROR_MESSAGE', '\m' || :'ta' || '\M', '<ta>', 'g') AS message;
SELECT item_id, stock, fence_token = :tb AS written_by_b FROM inventory;
-- A retries properly: acquire again, re-read, write with the new token.
SELECT fenced_lock_try_acquire('inventory:1', '1 minute', 'client-a') AS ta2 \gset
SELECT stock AS a_read FROM inventory WHERE item_id = 1 \gset
UPDATE inventory SET stock = :a_read - 1, fence_token = :ta2 WHERE item_id = 1;
SELECT item_id, stock, fence_token = :ta2 AS written_by_a FROM inventory;
-- Stock ends at 8.

-- While the lease is live, its holder writes freely, even without touching
-- the token column (the row keeps carrying the live token).
UPDATE inventory SET stock = stock + 5 WHERE item_id = 1;
INSERT INTO inventory VALUES (2, 3, NULL);
-- That was FL002: a NULL token is "no token", whatever lease is live.
\set VERBOSITY default
UPDATE inventory SET fence_token = NULL WHERE item_id = 1;
\set VERBOSITY sqlstate
SELECT item_id, stock, fence_token = :ta2 AS token_is_ta2 FROM inventory ORDER BY item_id;

-- Takeover: the lease of A is ended (here by an operator); B gets a new one.
SELECT fenced_lock_force_release('inventory:1') AS ended;
SELECT fenced_lock_try_acquire('inventory:1', '1 minute', 'client-b') AS tb2 \gset
-- A's writes fail, with its token or with no change to the token column.
UPDATE inventory SET stock = 0, fence_token = :ta2 WHERE item_id = 1;
UPDATE inventory SET stock = 0 WHERE item_id = 1;
-- A token that was never issued is just as stale.
UPDATE inventory SET stock = 0, fence_token = 9223372036854775807 WHERE item_id = 1;
SELECT item_id, stock, fence_token = :ta2 AS still_written_by_a FROM inventory;
-- B writes with its token.
UPDATE inventory SET stock = 12, fence_token = :tb2 WHERE item_id = 1;
SELECT item_id, stock, fence_token = :tb2 AS written_by_b FROM inventory;

-- A multi-row statement is rejected as a whole if any row is stale.
SELECT fenced_lock_try_acquire('inventory:2', '1 minute') AS tc \gset
INSERT INTO inventory VALUES (2, 3, :tc), (3, 4, :tc);
INSERT INTO inventory VALUES (2, 3, :tc);
SELECT item_id, stock FROM inventory ORDER BY item_id;

SELECT fenced_lock_release('inventory:2', :tc) AS released;

--
-- UPDATE may not lower the token stored in the row (FL001), even when the
-- lower token is live. That happens when a row moves to another lock name
-- whose lease is older than the one that last wrote the row.
--
SELECT fenced_lock_try_acquire('inventory:5', '1 minute') AS t5 \gset
SELECT fenced_lock_release('inventory:1', :tb2) AS released;
SELECT fenced_lock_try_acquire('inventory:1', '1 minute') AS t1 \gset
UPDATE inventory SET fence_token = :t1 WHERE item_id = 1;
SELECT :t1 > :t5 AS row_token_above_t5;
BEGIN;
SELECT fenced_lock_assert('inventory:1', :t1);
UPDATE inventory SET item_id = 5, fence_token = :t5 WHERE item_id = 1;
ROLLBACK;
SELECT regexp_replace(regexp_replace(:'LAST_ERROR_MESSAGE', '\m' || :'t5' || '\M', '<t5>', 'g'), '\m' || :'t1' || '\M', '<t1>', 'g') AS message;
SELECT item_id, stock, fence_token = :t1 AS token_is_t1 FROM inventory ORDER BY item_id;
-- With a newer lease of inventory:5 the move is accepted. Moving a row away
-- from a lock name is like deleting it there: it needs fenced_lock_assert of
-- the old name in the same transaction (see DELETE below).
SELECT fenced_lock_release('inventory:5', :t5) AS released;
SELECT fenced_lock_try_acquire('inventory:5', '1 minute') AS t5b \gset
UPDATE inventory SET item_id = 5, fence_token = :t5b WHERE item_id = 1;
BEGIN;
SELECT fenced_lock_assert('inventory:1', :t1);
UPDATE inventory SET item_id = 5, fence_token = :t5b WHERE item_id = 1;
COMMIT;
SELECT item_id, stock, fence_token = :t5b AS token_is_t5b FROM inventory ORDER BY item_id;

--
-- DELETE: the row has no new token, so the transaction must first prove it
-- holds the lock with fenced_lock_assert(name, live token).
--
\set VERBOSITY default
DELETE FROM inventory WHERE item_id = 5;
\set VERBOSITY sqlstate
-- The assert must be in the same transaction as the DELETE...
SELECT fenced_lock_assert('inventory:5', :t5b);
DELETE FROM inventory WHERE item_id = 5;
-- ...and for the lock name of the row being deleted.
BEGIN;
SELECT fenced_lock_assert('inventory:1', :t1);
DELETE FROM inventory WHERE item_id = 5;
ROLLBACK;
-- A failed assert does not count.
BEGIN;
SELECT fenced_lock_assert('inventory:5', :t1);
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT fenced_lock_assert('inventory:5', :t1);
ROLLBACK TO SAVEPOINT s;
DELETE FROM inventory WHERE item_id = 5;
ROLLBACK;
-- An assert that was true, of a lease that expires before the DELETE: FL001.
SELECT fenced_lock_try_acquire('inventory:2', '1 minute') AS t2 \gset
BEGIN;
SELECT fenced_lock_assert('inventory:2', :t2);
SELECT fenced_lock_renew('inventory:2', :t2, '1 microsecond') AS renewed_to_expire_now;
SELECT pg_sleep(0.01);
DELETE FROM inventory WHERE item_id = 2;
ROLLBACK;
-- (The renew was rolled back with the transaction: t2 is live again.)
SELECT fenced_lock_validate('inventory:2', :t2) AS t2_is_live;
SELECT item_id, stock FROM inventory ORDER BY item_id;
-- With a live asserted token the DELETE goes through.
BEGIN;
SELECT fenced_lock_assert('inventory:5', :t5b);
DELETE FROM inventory WHERE item_id = 5 RETURNING item_id, stock;
COMMIT;
-- After releasing, the holder's own writes are rejected too.
SELECT fenced_lock_release('inventory:5', :t5b) AS released;
INSERT INTO inventory VALUES (5, 1, :t5b);
BEGIN;
SELECT fenced_lock_assert('inventory:5', :t5b);
ROLLBACK;
SELECT item_id, stock FROM inventory ORDER BY item_id;

--
-- fenced_lock_assert fences writes the trigger cannot see (a file, a call to
-- another service, a table without the guard): FL001 when the token is not
-- the live lease. Its message names the lock, the token presented and the
-- live token.
--
\set VERBOSITY default
SELECT fenced_lock_assert('inventory:never-held', 12345);
\set VERBOSITY sqlstate
SELECT fenced_lock_try_acquire('inventory:9', '1 minute') AS t9 \gset
SELECT :t9 + 1 AS other \gset
SELECT fenced_lock_assert('inventory:9', :other);
SELECT regexp_replace(regexp_replace(:'LAST_ERROR_MESSAGE', '\m' || :'t9' || '\M', '<t9>', 'g'),
                      '\m' || :'other' || '\M', '<other>', 'g') AS message;
SELECT fenced_lock_assert('inventory:9', :t9) IS NULL AS asserted;
SELECT fenced_lock_release('inventory:9', :t9) AS released;
SELECT fenced_lock_assert('inventory:9', :t9);
SELECT regexp_replace(:'LAST_ERROR_MESSAGE', '\m' || :'t9' || '\M', '<t9>', 'g') AS message;
-- FL001 and FL002 can be caught by SQLSTATE in PL/pgSQL like any error.
\set VERBOSITY terse
DO $$
BEGIN
  PERFORM fenced_lock_assert('inventory:9', 12345);
EXCEPTION WHEN SQLSTATE 'FL001' THEN
  RAISE NOTICE 'lost the lock: %', SQLSTATE;
END $$;
DO $$
BEGIN
  INSERT INTO inventory VALUES (9, 1, NULL);
EXCEPTION WHEN SQLSTATE 'FL002' THEN
  RAISE NOTICE 'no token: %', SQLSTATE;
END $$;
\set VERBOSITY sqlstate

--
-- A template without braces guards the whole table with one lock.
--
CREATE TABLE settings (key text PRIMARY KEY, value text, fence_token bigint);
CREATE TRIGGER settings_fence
  BEFORE INSERT OR UPDATE OR DELETE ON settings
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('settings');
SELECT fenced_lock_try_acquire('settings', '1 minute', 'admin') AS ts \gset
INSERT INTO settings VALUES ('color', 'blue', :ts), ('size', 'L', :ts);
UPDATE settings SET value = 'red' WHERE key = 'color';
SELECT fenced_lock_release('settings', :ts) AS released;
UPDATE settings SET value = 'green', fence_token = :ts WHERE key = 'color';
INSERT INTO settings VALUES ('shape', 'round', :ts);
SELECT fenced_lock_try_acquire('settings', '1 minute', 'admin') AS ts2 \gset
UPDATE settings SET value = 'green', fence_token = :ts2;
BEGIN;
SELECT fenced_lock_assert('settings', :ts2);
DELETE FROM settings WHERE key = 'size';
COMMIT;
SELECT key, value, fence_token = :ts2 AS token_is_ts2 FROM settings ORDER BY key;
SELECT fenced_lock_release('settings', :ts2) AS released;

-- Clean up (dropping the table needs no lease).
DROP TABLE inventory;
DROP TABLE settings;
SELECT count(*) FILTER (WHERE fenced_lock_force_release(name)) AS force_released
  FROM fenced_lock_leases WHERE name LIKE 'inventory:%';
