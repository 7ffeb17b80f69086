-- Guards a DBA can see (docs/reference.md, "Guards a DBA can see"):
-- fenced_lock_protect guards a table completely in one call, the view
-- fenced_lock_guards lists every guard with what is wrong with it, and a
-- guard that could never work is refused when it is created.
\set VERBOSITY sqlstate

CREATE TABLE gd_item (id int PRIMARY KEY, qty int NOT NULL, fence_token bigint);

-- One call: the row guard and the TRUNCATE guard, named predictably.
SELECT fenced_lock_protect('gd_item', 'gd:{id}');
SELECT "table", trigger, template, token_column, events, valid, problem
  FROM fenced_lock_guards WHERE "table" = 'gd_item'::regclass ORDER BY trigger;
-- The same arguments again change nothing; other arguments are refused (42710).
SELECT fenced_lock_protect('gd_item', 'gd:{id}', 'fence_token');
SELECT count(*) AS triggers FROM pg_trigger WHERE tgrelid = 'gd_item'::regclass;
SELECT fenced_lock_protect('gd_item', 'other:{id}');

-- The guards guard: a write needs the live token, TRUNCATE of per-row locks is refused.
SELECT fenced_lock_try_acquire('gd:1', '1 minute') AS t \gset
INSERT INTO gd_item VALUES (1, 5, :t);
INSERT INTO gd_item VALUES (2, 5, :t);
TRUNCATE gd_item;
SELECT id, qty FROM gd_item;

-- Everything is checked before anything is created, with the code the
-- first write would raise: a malformed template (22023), a column that
-- does not exist (42703), a token column that is not bigint (42804), and
-- something that is not a table (42809).
CREATE TABLE gd_other (id int, fence_token int, tok bigint);
SELECT fenced_lock_protect('gd_other', 'o:{id');
SELECT fenced_lock_protect('gd_other', 'o:{nope}');
SELECT fenced_lock_protect('gd_other', 'o:{id}', 'nope');
SELECT fenced_lock_protect('gd_other', 'o:{id}');
CREATE VIEW gd_view AS SELECT 1 AS id, 1::bigint AS fence_token;
SELECT fenced_lock_protect('gd_view', 'v:{id}');
SELECT fenced_lock_protect(NULL, 'v:{id}');
SELECT count(*) AS triggers FROM pg_trigger WHERE tgrelid = 'gd_other'::regclass;
-- With the right token column it works.
SELECT fenced_lock_protect('gd_other', 'o:{id}', 'tok');
SELECT trigger, token_column, valid FROM fenced_lock_guards WHERE "table" = 'gd_other'::regclass ORDER BY trigger;

-- A guard created by hand that could never work is refused by CREATE
-- TRIGGER, with the error its first write would raise.
\set VERBOSITY default
CREATE TRIGGER bad BEFORE INSERT ON gd_item FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('gd:{nope}');
\set VERBOSITY sqlstate
CREATE TRIGGER bad BEFORE INSERT ON gd_item FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('gd:{id');
CREATE TRIGGER bad AFTER INSERT ON gd_item FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('gd:{id}');
CREATE TRIGGER bad BEFORE INSERT ON gd_item FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('gd:{id}', 'qty');
CREATE TRIGGER bad BEFORE INSERT ON gd_item FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('gd:{id}', 'fence_token', 'both');
SELECT count(*) AS triggers FROM pg_trigger WHERE tgrelid = 'gd_item'::regclass;

-- A hand-made row guard without a TRUNCATE guard works, and the view says
-- what it leaves open; so does a disabled guard.
CREATE TABLE gd_hand (id int PRIMARY KEY, fence_token bigint);
CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON gd_hand FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('h:{id}');
SELECT trigger, events, valid, problem FROM fenced_lock_guards WHERE "table" = 'gd_hand'::regclass;
ALTER TABLE gd_item DISABLE TRIGGER fenced_lock_guard;
SELECT trigger, valid, problem FROM fenced_lock_guards WHERE "table" = 'gd_item'::regclass ORDER BY trigger;
ALTER TABLE gd_item ENABLE TRIGGER fenced_lock_guard;

-- An ALTER TABLE that would break a guard is refused; other changes are not.
\set VERBOSITY default
ALTER TABLE gd_item DROP COLUMN fence_token;
\set VERBOSITY sqlstate
ALTER TABLE gd_item RENAME COLUMN id TO item_id;
ALTER TABLE gd_item ALTER COLUMN fence_token TYPE integer;
ALTER TABLE gd_item ADD COLUMN note text;
SELECT bool_and(valid) AS all_valid FROM fenced_lock_guards WHERE "table" = 'gd_item'::regclass;

-- A guard that got in broken (here with the event trigger disabled; also
-- under session_replication_role = replica) is listed with its problem,
-- and does not hold up ALTER TABLE on other columns, or disabling it. Once
-- the missing column is added, dropping it again is refused like any
-- change that would break a guard (disabled or not).
ALTER EVENT TRIGGER fenced_lock_check_guards DISABLE;
CREATE TRIGGER broken BEFORE INSERT ON gd_hand FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('h:{nope}');
ALTER EVENT TRIGGER fenced_lock_check_guards ENABLE;
SELECT trigger, valid, problem FROM fenced_lock_guards WHERE "table" = 'gd_hand'::regclass AND trigger = 'broken';
ALTER TABLE gd_hand ADD COLUMN note text;
ALTER TABLE gd_hand DISABLE TRIGGER broken;
ALTER TABLE gd_hand ADD COLUMN nope int;
SELECT trigger, valid, problem FROM fenced_lock_guards WHERE "table" = 'gd_hand'::regclass AND trigger = 'broken';
ALTER TABLE gd_hand DROP COLUMN nope;
DROP TRIGGER broken ON gd_hand;

-- A partitioned table: the row guard is cloned to every partition, now and
-- later; TRUNCATE guards go on the table and each partition. A partition
-- created later is cloned the row guard but not the TRUNCATE guard: a
-- warning says so, the view shows it, and protect again adds it.
CREATE TABLE gd_part (id int, region text, fence_token bigint) PARTITION BY LIST (region);
CREATE TABLE gd_part_eu PARTITION OF gd_part FOR VALUES IN ('eu');
SELECT fenced_lock_protect('gd_part', 'p:{id}');
SELECT "table", trigger, events, valid FROM fenced_lock_guards
 WHERE "table"::text LIKE 'gd_part%' ORDER BY "table"::text, trigger;
CREATE TABLE gd_part_us PARTITION OF gd_part FOR VALUES IN ('us');
SELECT "table", trigger, valid, problem FROM fenced_lock_guards
 WHERE "table" = 'gd_part_us'::regclass ORDER BY trigger;
SELECT fenced_lock_protect('gd_part', 'p:{id}');
SELECT "table", bool_and(valid) AS valid FROM fenced_lock_guards
 WHERE "table"::text LIKE 'gd_part%' GROUP BY "table" ORDER BY "table"::text;
SELECT fenced_lock_try_acquire('p:7', '1 minute') AS tp \gset
INSERT INTO gd_part VALUES (7, 'us', :tp);
INSERT INTO gd_part_us VALUES (8, 'us', :tp);
TRUNCATE gd_part_us;

-- unprotect removes exactly those triggers (the hand-made one stays).
SELECT fenced_lock_unprotect('gd_part');
SELECT count(*) AS guards FROM fenced_lock_guards WHERE "table"::text LIKE 'gd_part%';
CREATE TRIGGER mine BEFORE UPDATE ON gd_item FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('gd:{id}');
SELECT fenced_lock_unprotect('gd_item');
SELECT trigger FROM fenced_lock_guards WHERE "table" = 'gd_item'::regclass;
SELECT fenced_lock_unprotect('gd_item');

-- Privileges: protect needs what CREATE TRIGGER needs (the TRIGGER
-- privilege on the table, EXECUTE on fenced_lock_guard), unprotect what
-- DROP TRIGGER needs (owning the table). The view shows a role only the
-- guards of tables it has a privilege on.
CREATE ROLE fl_regress_gd_dba;
CREATE ROLE fl_regress_gd_app;
GRANT EXECUTE ON FUNCTION fenced_lock_protect(regclass, text, name), fenced_lock_unprotect(regclass),
  fenced_lock_guard() TO fl_regress_gd_dba, fl_regress_gd_app;
GRANT SELECT ON fenced_lock_guards TO fl_regress_gd_dba, fl_regress_gd_app;
CREATE TABLE gd_priv (id int, fence_token bigint);
GRANT TRIGGER ON gd_priv TO fl_regress_gd_dba;
SET ROLE fl_regress_gd_app;
SELECT fenced_lock_protect('gd_priv', 'priv:{id}');
SELECT count(*) AS seen FROM fenced_lock_guards;
RESET ROLE;
SET ROLE fl_regress_gd_dba;
SELECT fenced_lock_protect('gd_priv', 'priv:{id}');
SELECT "table", trigger, valid FROM fenced_lock_guards ORDER BY trigger;
SELECT fenced_lock_unprotect('gd_priv');
RESET ROLE;
SELECT fenced_lock_unprotect('gd_priv');
SELECT count(*) AS guards FROM fenced_lock_guards WHERE "table" = 'gd_priv'::regclass;

-- Clean up.
DROP VIEW gd_view;
DROP TABLE gd_item, gd_other, gd_hand, gd_part, gd_priv;
REVOKE ALL ON FUNCTION fenced_lock_protect(regclass, text, name), fenced_lock_unprotect(regclass),
  fenced_lock_guard() FROM fl_regress_gd_dba, fl_regress_gd_app;
REVOKE ALL ON fenced_lock_guards FROM fl_regress_gd_dba, fl_regress_gd_app;
DROP ROLE fl_regress_gd_dba;
DROP ROLE fl_regress_gd_app;
SELECT fenced_lock_force_release('gd:1'), fenced_lock_force_release('p:7');
