-- A guard attached the wrong way fails loudly the first time it fires (and
-- every time after), never silently letting writes through: AFTER, statement
-- level or INSTEAD OF (39P01), wrong argument count or a bad template
-- (22023), a column that does not exist (42703), a token column that is not
-- bigint (42804). The table is left unchanged each time.
--
-- The event trigger fenced_lock_check_guards refuses all of these already at
-- CREATE TRIGGER (guards.sql). This file proves the second line of defence:
-- with the event trigger disabled (or bypassed, e.g. by
-- session_replication_role = replica, under which event triggers do not
-- fire), the guard still fails closed at the first write.
\set VERBOSITY sqlstate
ALTER EVENT TRIGGER fenced_lock_check_guards DISABLE;

-- One table, one row already in it (written before any trigger existed),
-- and a live lease whose token we write with.
CREATE TABLE item (id int, "Name" text, qty int, fence_token bigint,
                   small_token int, text_token text, num_token numeric);
INSERT INTO item VALUES (1, 'one', 1, NULL, NULL, NULL, NULL);
SELECT fenced_lock_try_acquire('item:1', '1 minute') AS t \gset

-- The guard must be BEFORE ... FOR EACH ROW.
CREATE TRIGGER g AFTER INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{id}');
\set VERBOSITY default
INSERT INTO item (id, qty, fence_token) VALUES (1, 2, :t);
\set VERBOSITY sqlstate
UPDATE item SET qty = 2, fence_token = :t;
DELETE FROM item;
DROP TRIGGER g ON item;

CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH STATEMENT EXECUTE FUNCTION fenced_lock_guard('item:{id}');
INSERT INTO item (id, qty, fence_token) VALUES (1, 2, :t);
UPDATE item SET qty = 2, fence_token = :t;
DELETE FROM item;
DROP TRIGGER g ON item;

-- TRUNCATE fires no row triggers. Attached as BEFORE TRUNCATE (statement
-- level, the only kind TRUNCATE has), the guard refuses to truncate a table
-- guarded per row (42501: no single lock covers every row) ...
CREATE TRIGGER g BEFORE TRUNCATE ON item
  FOR EACH STATEMENT EXECUTE FUNCTION fenced_lock_guard('item:{id}');
TRUNCATE item;
DROP TRIGGER g ON item;
-- ... and treats TRUNCATE of a table guarded by one lock like a DELETE: it
-- needs fenced_lock_assert of that lock in the same transaction (FL002 without).
CREATE TABLE whole (id int, fence_token bigint);
CREATE TRIGGER g BEFORE TRUNCATE ON whole
  FOR EACH STATEMENT EXECUTE FUNCTION fenced_lock_guard('whole-table');
TRUNCATE whole;
SELECT fenced_lock_try_acquire('whole-table', '1 minute') AS tw \gset
BEGIN;
SELECT fenced_lock_assert('whole-table', :tw);
TRUNCATE whole;
COMMIT;
-- AFTER TRUNCATE is still misuse.
DROP TRIGGER g ON whole;
CREATE TRIGGER g2 AFTER TRUNCATE ON whole
  FOR EACH STATEMENT EXECUTE FUNCTION fenced_lock_guard('whole-table');
TRUNCATE whole;
DROP TABLE whole;
SELECT fenced_lock_release('whole-table', :tw);

CREATE VIEW item_view AS SELECT * FROM item;
CREATE TRIGGER g INSTEAD OF INSERT OR UPDATE OR DELETE ON item_view
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{id}');
INSERT INTO item_view (id, qty, fence_token) VALUES (1, 2, :t);
UPDATE item_view SET qty = 2, fence_token = :t;
DELETE FROM item_view;
DROP VIEW item_view;

-- It cannot be called as a plain function.
SELECT fenced_lock_guard();

-- Arguments: a lock name template, then optionally the token column.
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard();
\set VERBOSITY default
INSERT INTO item (id, qty, fence_token) VALUES (1, 2, :t);
\set VERBOSITY sqlstate
UPDATE item SET qty = 2, fence_token = :t;
DELETE FROM item;
DROP TRIGGER g ON item;
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{id}', 'fence_token', 'extra');
INSERT INTO item (id, qty, fence_token) VALUES (1, 2, :t);
DROP TRIGGER g ON item;

-- Bad templates: an unmatched brace, an empty column reference, a brace
-- inside a column reference.
\set VERBOSITY terse
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('{');
INSERT INTO item (id, qty, fence_token) VALUES (1, 2, :t);
UPDATE item SET qty = 2, fence_token = :t;
DROP TRIGGER g ON item;
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:}');
INSERT INTO item (id, qty, fence_token) VALUES (1, 2, :t);
DROP TRIGGER g ON item;
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{}');
INSERT INTO item (id, qty, fence_token) VALUES (1, 2, :t);
DROP TRIGGER g ON item;
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{id');
INSERT INTO item (id, qty, fence_token) VALUES (1, 2, :t);
DROP TRIGGER g ON item;
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{i{d}}');
INSERT INTO item (id, qty, fence_token) VALUES (1, 2, :t);
DROP TRIGGER g ON item;
-- An empty template resolves to an empty lock name.
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('');
INSERT INTO item (id, qty, fence_token) VALUES (1, 2, :t);
DROP TRIGGER g ON item;

-- Columns that do not exist. Column names are case-sensitive, as written in
-- the table ("Name" here), and system columns do not count.
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{no_such_column}');
INSERT INTO item (id, qty, fence_token) VALUES (1, 2, :t);
DELETE FROM item;
DROP TRIGGER g ON item;
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{ID}');
INSERT INTO item (id, qty, fence_token) VALUES (1, 2, :t);
DROP TRIGGER g ON item;
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{name}');
INSERT INTO item (id, qty, fence_token) VALUES (1, 2, :t);
DROP TRIGGER g ON item;
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{ctid}');
INSERT INTO item (id, qty, fence_token) VALUES (1, 2, :t);
DROP TRIGGER g ON item;
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{id}', 'no_such_token');
INSERT INTO item (id, qty, fence_token) VALUES (1, 2, :t);
DROP TRIGGER g ON item;
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{id}', 'Fence_Token');
INSERT INTO item (id, qty, fence_token) VALUES (1, 2, :t);
DROP TRIGGER g ON item;
-- The default token column is fence_token: a table without one cannot use the default.
CREATE TABLE no_token (id int);
CREATE TRIGGER g BEFORE INSERT ON no_token
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('x:{id}');
INSERT INTO no_token VALUES (1);
DROP TABLE no_token;
-- The exact spelling works: "Name" resolves.
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{Name}');
SELECT fenced_lock_try_acquire('item:two', '1 minute') AS t2 \gset
INSERT INTO item (id, "Name", qty, fence_token) VALUES (2, 'two', 2, :t2);
SELECT id, "Name" FROM item WHERE id = 2;
DROP TRIGGER g ON item;
DELETE FROM item WHERE id = 2;

-- The token column must be bigint.
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{id}', 'small_token');
INSERT INTO item (id, qty, small_token) VALUES (1, 2, 1);
DELETE FROM item;
DROP TRIGGER g ON item;
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{id}', 'text_token');
INSERT INTO item (id, qty, text_token) VALUES (1, 2, :'t');
DROP TRIGGER g ON item;
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON item
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{id}', 'num_token');
INSERT INTO item (id, qty, num_token) VALUES (1, 2, :t);
DROP TRIGGER g ON item;
\set VERBOSITY sqlstate

-- The same checks apply when a column is dropped or retyped after the
-- trigger was created: the next write fails.
CREATE TABLE later (id int, fence_token bigint);
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON later
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('later:{id}');
SELECT fenced_lock_try_acquire('later:1', '1 minute') AS tl \gset
INSERT INTO later VALUES (1, :tl);
ALTER TABLE later ALTER COLUMN fence_token TYPE numeric;
UPDATE later SET fence_token = :tl;
ALTER TABLE later DROP COLUMN fence_token;
INSERT INTO later VALUES (1);
DROP TABLE later;

-- None of it changed the table: the one original row, as it was.
SELECT id, "Name", qty, fence_token, small_token, text_token, num_token FROM item;

-- Clean up.
DROP TABLE item;
ALTER EVENT TRIGGER fenced_lock_check_guards ENABLE;
SELECT fenced_lock_release('item:1', :t) AS released, fenced_lock_release('item:two', :t2) AS released,
       fenced_lock_release('later:1', :tl) AS released;
