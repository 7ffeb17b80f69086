-- Lock-name templates of the guard: '{col}' is replaced by the text of that
-- column in the row being written (NEW; OLD for DELETE), '{{' and '}}' are
-- literal braces, and values are used verbatim: quotes, backslashes, %,
-- newlines and unicode are just characters of the name. Also: every way of
-- writing a row goes through the guard (INSERT ... ON CONFLICT, COPY,
-- partitions, views).
\set VERBOSITY sqlstate

-- Several columns, literal text and literal braces in one template.
CREATE TABLE shelf (
    warehouse   text,
    aisle       int,
    bin         text,
    qty         int,
    fence_token bigint
);
CREATE TRIGGER shelf_fence
  BEFORE INSERT OR UPDATE OR DELETE ON shelf
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('{{shelf}}/{warehouse}/{aisle}-{bin}');

-- The resolved name of ('north', 7, 'b3') is '{shelf}/north/7-b3': holding a
-- lease of exactly that name is what lets the row in.
SELECT fenced_lock_try_acquire('{shelf}/north/7-b3', '1 minute') AS t1 \gset
INSERT INTO shelf VALUES ('north', 7, 'b3', 1, :t1);
-- The same token for another row (another name) is stale.
INSERT INTO shelf VALUES ('north', 7, 'b4', 1, :t1);
SELECT :'LAST_ERROR_MESSAGE' ~ '"\{shelf\}/north/7-b4"' AS message_names_the_resolved_lock;
-- A NULL in a template column names no lock: 22004, whatever the token.
\set VERBOSITY default
INSERT INTO shelf VALUES ('north', NULL, 'b3', 1, :t1);
\set VERBOSITY sqlstate
INSERT INTO shelf VALUES (NULL, 7, 'b3', 1, :t1);
UPDATE shelf SET bin = NULL;
-- An empty string is a value: '{shelf}/north/7-'.
SELECT fenced_lock_try_acquire('{shelf}/north/7-', '1 minute') AS t2 \gset
INSERT INTO shelf VALUES ('north', 7, '', 2, :t2);
SELECT warehouse, aisle, format('%L', bin) AS bin, qty FROM shelf ORDER BY bin;

-- Values with characters that mean something elsewhere (SQL quotes,
-- backslashes, format % signs, braces, newlines, unicode) go into the name
-- unchanged. For each, take the lease of the name we expect, and write the row.
CREATE TABLE notes (k text PRIMARY KEY, body text, fence_token bigint);
CREATE TRIGGER notes_fence
  BEFORE INSERT OR UPDATE OR DELETE ON notes
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('note:{k}');
CREATE TABLE note_keys (k text);
INSERT INTO note_keys VALUES
  ($$it's$$), ($$a\b$$), ('100%'), ('%s%d'), ('{k}'), ('}}{{'), (E'line1\nline2'),
  ('ünïcødé €'), ('😀'), ($$'); DROP TABLE notes; --$$), (' '), ('NULL');
SELECT format('%L', k) AS k,
       fenced_lock_try_acquire('note:' || k, '1 minute') IS NOT NULL AS granted
  FROM note_keys ORDER BY k COLLATE "C";
INSERT INTO notes
SELECT k, 'body', l.token
  FROM note_keys JOIN fenced_lock_leases l ON l.name = 'note:' || k;
SELECT format('%L', k) AS k, body FROM notes ORDER BY k COLLATE "C";
-- A value that is close to a key with a lease but not equal is refused.
INSERT INTO notes SELECT $$it''s$$, 'x', token FROM fenced_lock_leases WHERE name = $$note:it's$$;
INSERT INTO notes SELECT 'A\b', 'x', token FROM fenced_lock_leases WHERE name = 'note:a\b';
SELECT count(*) AS notes FROM notes;
-- The stale-token message carries the resolved name as it is (live token masked).
UPDATE notes SET body = 'x', fence_token = 1 WHERE k = $$it's$$;
SELECT regexp_replace(:'LAST_ERROR_MESSAGE', 'live token is \d+', 'live token is <live>') AS message;
UPDATE notes SET body = 'x', fence_token = 1 WHERE k = E'line1\nline2';
SELECT regexp_replace(:'LAST_ERROR_MESSAGE', 'live token is \d+', 'live token is <live>') AS message;

-- Non-text columns resolve to their text output: int 7 -> '7', bool -> 't'.
CREATE TABLE flags (id int, on_off boolean, fence_token bigint);
CREATE TRIGGER flags_fence
  BEFORE INSERT OR UPDATE OR DELETE ON flags
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('flag:{id}:{on_off}');
SELECT fenced_lock_try_acquire('flag:7:t', '1 minute') AS tf \gset
INSERT INTO flags VALUES (7, true, :tf);
INSERT INTO flags VALUES (7, false, :tf);
SELECT id, on_off FROM flags WHERE fence_token = :tf;

-- Values whose text form depends on session settings (dates, timestamps,
-- intervals, floats, bytea) are rendered under fixed settings (DateStyle ISO,
-- TimeZone UTC, IntervalStyle postgres, extra_float_digits 1, bytea_output
-- hex), so every session resolves a row to the same lock name.
CREATE TABLE days (day date, at timestamptz, span interval, ratio float8, raw bytea, fence_token bigint);
CREATE TRIGGER days_fence
  BEFORE INSERT OR UPDATE OR DELETE ON days
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('day:{day}|{at}|{span}|{ratio}|{raw}');
SET datestyle = 'German'; SET timezone = 'America/New_York';
SET intervalstyle = 'sql_standard'; SET extra_float_digits = -3; SET bytea_output = 'escape';
SELECT fenced_lock_try_acquire('day:2024-03-01|2024-03-01 12:00:00+00|1 day 02:00:00|0.1|\x6869', '1 minute') AS td \gset
INSERT INTO days VALUES ('2024-03-01', '2024-03-01 12:00:00+00', '1 day 2 hours', 0.1, 'hi', :td);
-- The session's own settings are untouched, and a second session style agrees.
SHOW datestyle;
SET datestyle = 'ISO, MDY'; SET timezone = 'UTC'; SET intervalstyle = 'postgres';
UPDATE days SET fence_token = :td;
-- A lease of the name as another DateStyle would print it does not let the row in.
SELECT fenced_lock_try_acquire('day:01.03.2024|2024-03-01 12:00:00+00|1 day 02:00:00|0.1|\x6869', '1 minute') AS tg \gset
UPDATE days SET fence_token = :tg;
RESET datestyle; RESET timezone; RESET intervalstyle; RESET extra_float_digits; RESET bytea_output;

-- A value that makes the name longer than 512 bytes: 22023 (and the message
-- quotes the name cut short).
SELECT fenced_lock_try_acquire('note:' || repeat('x', 507), '1 minute') AS t512 \gset
INSERT INTO notes VALUES (repeat('x', 507), 'fits in 512 bytes', :t512);
\set VERBOSITY default
INSERT INTO notes VALUES (repeat('x', 508), 'one byte too long', :t512);
\set VERBOSITY sqlstate
SELECT count(*) AS long_notes FROM notes WHERE length(k) > 500;
-- Likewise a template that resolves to an empty name.
CREATE TABLE bare (k text, fence_token bigint);
CREATE TRIGGER bare_fence BEFORE INSERT ON bare
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('{k}');
INSERT INTO bare VALUES ('', 1);
DROP TABLE bare;

--
-- UPDATE that moves a row to another lock name: the new name needs its live
-- token in the row, the old name an assert in the same transaction (a move
-- is a delete there).
--
SELECT fenced_lock_try_acquire('{shelf}/south/1-a1', '1 minute') AS t3 \gset
UPDATE shelf SET warehouse = 'south', aisle = 1, bin = 'a1', fence_token = :t3 WHERE bin = 'b3';
BEGIN;
SELECT fenced_lock_assert('{shelf}/north/7-b3', :t1);
UPDATE shelf SET warehouse = 'south', aisle = 1, bin = 'a1', fence_token = :t3 WHERE bin = 'b3';
COMMIT;
SELECT warehouse, aisle, bin, qty, fence_token = :t3 AS token_is_t3 FROM shelf ORDER BY bin;
-- An UPDATE that leaves the template columns alone keeps the name: no assert needed.
UPDATE shelf SET qty = 5 WHERE bin = 'a1';
-- One that changes them but resolves to the same name is not a move either:
-- the guard compares names, not columns.
SELECT fenced_lock_try_acquire('{shelf}/a/1/1', '1 minute') AS t4 \gset
CREATE TABLE parts (a text, b text, fence_token bigint);
CREATE TRIGGER parts_fence BEFORE INSERT OR UPDATE OR DELETE ON parts
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('{{shelf}}/{a}/{b}');
INSERT INTO parts VALUES ('a/1', '1', :t4);
UPDATE parts SET a = 'a', b = '1/1';
SELECT a, b FROM parts WHERE fence_token = :t4;
DROP TABLE parts;

--
-- INSERT ... ON CONFLICT DO UPDATE: the proposed row is checked as an
-- INSERT, then the update of the existing row as an UPDATE.
--
SELECT fenced_lock_try_acquire('note:upsert', '1 minute') AS tu \gset
INSERT INTO notes VALUES ('upsert', 'v1', :tu)
  ON CONFLICT (k) DO UPDATE SET body = EXCLUDED.body, fence_token = EXCLUDED.fence_token;
INSERT INTO notes VALUES ('upsert', 'v2', :tu)
  ON CONFLICT (k) DO UPDATE SET body = EXCLUDED.body, fence_token = EXCLUDED.fence_token;
SELECT k, body FROM notes WHERE k = 'upsert';
SELECT fenced_lock_release('note:upsert', :tu) AS released;
-- Stale: the statement fails, nothing is written.
INSERT INTO notes VALUES ('upsert', 'v3', :tu)
  ON CONFLICT (k) DO UPDATE SET body = EXCLUDED.body, fence_token = EXCLUDED.fence_token;
INSERT INTO notes VALUES ('upsert', 'v3', :tu) ON CONFLICT (k) DO NOTHING;
-- With a new lease, an upsert that keeps the old token in the row is refused
-- by the UPDATE check (the stored token is not live).
SELECT fenced_lock_try_acquire('note:upsert', '1 minute') AS tu2 \gset
INSERT INTO notes VALUES ('upsert', 'v4', :tu2)
  ON CONFLICT (k) DO UPDATE SET body = EXCLUDED.body;
INSERT INTO notes VALUES ('upsert', 'v4', :tu2)
  ON CONFLICT (k) DO UPDATE SET body = EXCLUDED.body, fence_token = EXCLUDED.fence_token;
SELECT k, body, fence_token = :tu2 AS token_is_tu2 FROM notes WHERE k = 'upsert';

--
-- COPY goes through the guard row by row; one stale row fails the whole
-- COPY. (Here the token comes from a column default reading a session
-- setting, one way to hand a token to bulk loads.)
--
CREATE TABLE batch_rows (batch text, line int, payload text,
                         fence_token bigint DEFAULT current_setting('app.fence_token')::bigint);
CREATE TRIGGER batch_rows_fence
  BEFORE INSERT OR UPDATE OR DELETE ON batch_rows
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('batch:{batch}');
SELECT fenced_lock_try_acquire('batch:b1', '1 minute') AS tb1 \gset
SET app.fence_token = :tb1;
COPY batch_rows (batch, line, payload) FROM STDIN;
b1	1	first
b1	2	second with 'quotes' and \\ a backslash
\.
-- One row of another batch (a lock this token is not the lease of) fails the whole COPY.
COPY batch_rows (batch, line, payload) FROM STDIN;
b1	3	third
b2	1	elsewhere
\.
SELECT batch, line, payload FROM batch_rows ORDER BY batch, line;
-- After the lease ends, COPY is refused.
SELECT fenced_lock_release('batch:b1', :tb1) AS released;
COPY batch_rows (batch, line, payload) FROM STDIN;
b1	4	late
\.
SELECT count(*) AS lines FROM batch_rows;
RESET app.fence_token;

--
-- Partitioned tables: the trigger on the parent is cloned to every partition
-- and resolves columns by name, whatever a partition's column order.
--
CREATE TABLE events (region text, id int, payload text, fence_token bigint)
  PARTITION BY LIST (region);
CREATE TABLE events_eu PARTITION OF events FOR VALUES IN ('eu');
CREATE TRIGGER events_fence
  BEFORE INSERT OR UPDATE OR DELETE ON events
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('event:{region}:{id}');
-- A partition made separately, with its columns in another order.
CREATE TABLE events_us (fence_token bigint, payload text, id int, region text);
ALTER TABLE events ATTACH PARTITION events_us FOR VALUES IN ('us');
SELECT tgrelid::regclass AS partition, tgname FROM pg_trigger
 WHERE tgrelid IN ('events_eu'::regclass, 'events_us'::regclass) ORDER BY 1::text;
SELECT fenced_lock_try_acquire('event:eu:1', '1 minute') AS te1 \gset
SELECT fenced_lock_try_acquire('event:us:1', '1 minute') AS tu1 \gset
INSERT INTO events VALUES ('eu', 1, 'via parent', :te1), ('us', 1, 'via parent', :tu1);
INSERT INTO events VALUES ('us', 1, 'stale', :te1);
-- Writing the partition directly is guarded the same way.
INSERT INTO events_us (region, id, payload, fence_token) VALUES ('us', 2, 'direct', :tu1);
UPDATE events_us SET payload = 'direct' WHERE id = 1;
SELECT tableoid::regclass AS partition, region, id, payload FROM events ORDER BY region, id;
-- An UPDATE that moves a row to another partition is a move to another lock
-- name: it needs the new name's live token and an assert of the old name.
SELECT fenced_lock_try_acquire('event:us:9', '1 minute') AS tu9 \gset
UPDATE events SET region = 'us', id = 9, fence_token = :tu9 WHERE region = 'eu' AND id = 1;
BEGIN;
SELECT fenced_lock_assert('event:eu:1', :te1);
UPDATE events SET region = 'us', id = 9, fence_token = :tu9 WHERE region = 'eu' AND id = 1;
COMMIT;
SELECT tableoid::regclass AS partition, region, id, payload FROM events ORDER BY region, id;

--
-- Writes through a view reach the guarded table and its trigger.
--
CREATE VIEW shelf_north AS SELECT * FROM shelf WHERE warehouse = 'north';
SELECT fenced_lock_try_acquire('{shelf}/north/8-c1', '1 minute') AS t5 \gset
INSERT INTO shelf_north VALUES ('north', 8, 'c1', 3, :t5);
INSERT INTO shelf_north VALUES ('north', 8, 'c2', 3, :t5);
UPDATE shelf_north SET qty = 0, fence_token = :t1;
DELETE FROM shelf_north;
SELECT warehouse, aisle, format('%L', bin) AS bin, qty FROM shelf ORDER BY warehouse, bin;

-- Clean up.
DROP VIEW shelf_north;
DROP TABLE shelf, notes, note_keys, flags, batch_rows, events, days;
SELECT count(*) FILTER (WHERE fenced_lock_force_release(name)) > 0 AS force_released
  FROM fenced_lock_leases
 WHERE name LIKE '{shelf}/%' OR name LIKE 'note:%' OR name LIKE 'flag:%'
    OR name LIKE 'batch:%' OR name LIKE 'event:%' OR name LIKE 'day:%';
SELECT count(*) AS live_leases FROM fenced_lock_leases
 WHERE live AND (name LIKE '{shelf}/%' OR name LIKE 'note:%' OR name LIKE 'flag:%'
    OR name LIKE 'batch:%' OR name LIKE 'event:%' OR name LIKE 'day:%');
