-- Watching leases with LISTEN (docs/reference.md, "Watching leases";
-- docs/design.md, "Observability"). With fenced_lock.notify = on (a
-- superuser setting), every committed grant, release, force release, expiry
-- (observed at a takeover) and session end sends NOTIFY on the channel
-- fenced_lock, with the payload {"name":...,"event":...,"token":...,"mode":...}.
-- PostgreSQL delivers notifications at commit, in commit order; renewals,
-- rolled-back work, and anything done with the setting off send nothing.
--
-- The listener is another session (dblink). psql would print each
-- notification with the sending backend's pid, which varies; instead
-- received() (below) returns what the listener got since the last call,
-- with each token in the payload replaced by its name (<t1>, ...), since
-- tokens differ from run to run.
\set VERBOSITY sqlstate
-- The setting exists once the library is loaded in the session (by the
-- first call of a fenced_lock function, by the first CREATE TABLE, ALTER
-- TABLE or CREATE TRIGGER, which fire the extension's event trigger, or by
-- LOAD 'fenced_lock', unless it is in shared_preload_libraries); before
-- that, SHOW does not know it (42704).
SHOW fenced_lock.notify;

CREATE TEMP TABLE notify_tokens (who text PRIMARY KEY, token bigint);
CREATE TEMP TABLE notify_received (n serial, channel text, payload text);
-- received(expected): what the listener has received since the last call,
-- waiting (at most 10 s) until there are at least `expected` of them. A
-- round trip on the listener's connection comes first: its server delivers
-- every notification committed before it, so "nothing" means nothing sent.
CREATE FUNCTION received(expected int DEFAULT 0) RETURNS TABLE (channel text, payload text) LANGUAGE plpgsql AS $$
DECLARE
  r record;
  tok bigint;
BEGIN
  TRUNCATE notify_received;
  FOR i IN 1..1000 LOOP
    PERFORM * FROM dblink('listener', 'SELECT 1') AS (one int);
    FOR r IN SELECT * FROM dblink_get_notify('listener') LOOP
      tok := (r.extra::json ->> 'token')::bigint;
      INSERT INTO notify_received (channel, payload)
        SELECT r.notify_name,
               replace(r.extra, '"token":' || tok || ',',
                       '"token":<' || coalesce((SELECT who FROM notify_tokens WHERE token = tok), '?') || '>,');
    END LOOP;
    EXIT WHEN (SELECT count(*) FROM notify_received) >= expected;
    PERFORM pg_sleep(0.01);
  END LOOP;
  RETURN QUERY SELECT nr.channel, nr.payload FROM notify_received nr ORDER BY nr.n;
END $$;

SELECT dblink_connect('listener', regress_conninfo()) AS connected;
SELECT dblink_exec('listener', 'LISTEN fenced_lock') AS listening;

SHOW fenced_lock.notify;
-- Off by default: lease changes send nothing.
INSERT INTO notify_tokens SELECT 't0', fenced_lock_try_acquire('notify:a', '1 minute');
SELECT fenced_lock_release('notify:a', token) AS released FROM notify_tokens WHERE who = 't0';
SELECT * FROM received();
SHOW fenced_lock.notify;

-- Only a superuser may turn it on (here for this session only; an operator
-- would set it in postgresql.conf or with ALTER DATABASE/ROLE).
CREATE ROLE fl_regress_n_app;
SET ROLE fl_regress_n_app;
\set VERBOSITY default
SET fenced_lock.notify = on;
\set VERBOSITY sqlstate
SELECT set_config('fenced_lock.notify', 'on', false);
RESET ROLE;
DROP ROLE fl_regress_n_app;
SET fenced_lock.notify = on;

-- A grant, a renewal (nothing), a release.
INSERT INTO notify_tokens SELECT 't1', fenced_lock_try_acquire('notify:a', '1 minute', 'worker-1');
SELECT * FROM received(1);
SELECT fenced_lock_renew('notify:a', token, '2 minutes') AS renewed FROM notify_tokens WHERE who = 't1';
SELECT fenced_lock_try_acquire('notify:a', '1 minute', 'worker-1') = token AS same_token FROM notify_tokens WHERE who = 't1';
SELECT * FROM received();
SELECT fenced_lock_release('notify:a', token) AS released FROM notify_tokens WHERE who = 't1';
SELECT * FROM received(1);

-- Nothing is delivered before the commit; a rolled-back grant or release
-- sends nothing at all.
BEGIN;
INSERT INTO notify_tokens SELECT 't2', fenced_lock_try_acquire('notify:a', '1 minute');
SELECT * FROM received();
ROLLBACK;
SELECT * FROM received();
INSERT INTO notify_tokens SELECT 't2', fenced_lock_try_acquire('notify:a', '1 minute');
SELECT * FROM received(1);
BEGIN;
SELECT fenced_lock_release('notify:a', token) AS released FROM notify_tokens WHERE who = 't2';
ROLLBACK;
SELECT * FROM received();
-- A force release.
SELECT fenced_lock_force_release('notify:a') AS forced;
SELECT * FROM received(1);

-- Several changes in one transaction arrive together at its commit, in the
-- order they were made.
BEGIN;
INSERT INTO notify_tokens SELECT 't3', fenced_lock_try_acquire('notify:a', '1 minute');
INSERT INTO notify_tokens SELECT 't4', fenced_lock_try_acquire('notify:b', '1 minute');
SELECT fenced_lock_release('notify:a', token) AS released FROM notify_tokens WHERE who = 't3';
COMMIT;
SELECT * FROM received(3);

-- An expiry is announced when a takeover observes it, just before the new
-- grant, in the takeover's transaction.
INSERT INTO notify_tokens SELECT 't5', fenced_lock_try_acquire('notify:a', '100 ms');
SELECT * FROM received(1);
SELECT pg_sleep(0.2);
SELECT * FROM received();
INSERT INTO notify_tokens SELECT 't6', fenced_lock_try_acquire('notify:a', '1 minute');
SELECT * FROM received(2);

-- A session end is announced by the ending session itself (if notify is on
-- there), as its backend exits.
SELECT dblink_connect('worker', regress_conninfo()) AS connected;
SELECT dblink_exec('worker', 'SET fenced_lock.notify = on') AS set;
INSERT INTO notify_tokens SELECT 't7', token
  FROM dblink('worker', $$SELECT fenced_lock_try_acquire('notify:c', '1 hour', session_bound => true)$$) AS (token bigint);
SELECT * FROM received(1);
SELECT dblink_disconnect('worker');
SELECT * FROM received(1);

-- The name is JSON-escaped in the payload.
INSERT INTO notify_tokens SELECT 't8', fenced_lock_try_acquire(E'notify:"quoted"\\back\tslash', '1 minute');
SELECT * FROM received(1);

-- Turned off again: nothing more.
RESET fenced_lock.notify;
SELECT fenced_lock_release('notify:a', token) AS released FROM notify_tokens WHERE who = 't6';
SELECT * FROM received();

-- Clean up.
SELECT count(*) FILTER (WHERE fenced_lock_force_release(name)) AS force_released
  FROM fenced_lock_leases WHERE name LIKE 'notify:%';
SELECT dblink_exec('listener', 'UNLISTEN *') AS unlistened;
SELECT dblink_disconnect('listener');
DROP FUNCTION received(int);
