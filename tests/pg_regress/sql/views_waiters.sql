-- fenced_lock_waiters (docs/reference.md, "Views"; docs/design.md,
-- "Observability"): one row per fenced_lock_acquire waiting in this
-- database, with its place in line. position 1 is the head of the line,
-- served next; the others follow in the order the lock manager will serve
-- them. Rows come and go as waiters are granted, time out or are cancelled.
--
-- A waiter needs a session of its own: here two dblink connections wait
-- while this file reads the view. pid and waiting_since differ from run to
-- run, so they are compared, not printed.
\set VERBOSITY sqlstate

-- The columns.
SELECT attname AS column, format_type(atttypid, atttypmod) AS type
  FROM pg_attribute WHERE attrelid = 'fenced_lock_waiters'::regclass AND attnum > 0 ORDER BY attnum;
-- Nobody waits: the view is empty.
SELECT * FROM fenced_lock_waiters;

-- Who may read it: nobody but superusers, until granted SELECT (like every
-- fenced_lock view). holder is shown only to the waiter's role and its
-- members, to operators (fenced_lock.operator_role) and to superusers.
CREATE ROLE fl_regress_w_app;                              -- the role that waits
CREATE ROLE fl_regress_w_helper IN ROLE fl_regress_w_app;  -- acts for it
CREATE ROLE fl_regress_w_monitor;                          -- granted SELECT only
CREATE ROLE fl_regress_w_nobody;                           -- granted nothing
GRANT EXECUTE ON FUNCTION fenced_lock_acquire(text, interval, interval, text, boolean, boolean, integer),
                          fenced_lock_release(text, bigint) TO fl_regress_w_app;
GRANT SELECT ON fenced_lock_waiters TO fl_regress_w_app, fl_regress_w_monitor;
SET ROLE fl_regress_w_nobody;
\set VERBOSITY default
SELECT * FROM fenced_lock_waiters;
\set VERBOSITY sqlstate
RESET ROLE;

-- This session holds "wq:job". Two other sessions, as fl_regress_w_app, call
-- fenced_lock_acquire for it (waiting at most 30 s): first w1, then w2.
SELECT fenced_lock_try_acquire('wq:job', '1 minute', 'holder') AS t0 \gset
SELECT dblink_connect('w1', regress_conninfo()) AS w1, dblink_connect('w2', regress_conninfo()) AS w2;
SELECT pid AS w1_pid FROM dblink('w1', 'SET ROLE fl_regress_w_app; SELECT pg_backend_pid()') AS (pid int) \gset
SELECT pid AS w2_pid FROM dblink('w2', 'SET ROLE fl_regress_w_app; SELECT pg_backend_pid()') AS (pid int) \gset
SELECT dblink_send_query('w1', $$SELECT fenced_lock_acquire('wq:job', '1 minute', '30 s', 'worker-1')$$) AS sent;
SELECT regress_until($$EXISTS (SELECT FROM fenced_lock_waiters WHERE holder = 'worker-1')$$) AS w1_waits;
SELECT dblink_send_query('w2', $$SELECT fenced_lock_acquire('wq:job', '1 minute', '30 s', 'worker-2')$$) AS sent;
SELECT regress_until($$EXISTS (SELECT FROM fenced_lock_waiters WHERE holder = 'worker-2')$$) AS w2_waits;

-- A superuser sees both, w1 at the head.
SELECT name, holder, owner, position,
       pid = CASE holder WHEN 'worker-1' THEN :w1_pid WHEN 'worker-2' THEN :w2_pid END AS pid_is_its_backend,
       waiting_since <= clock_timestamp() AS waiting_since_is_past
  FROM fenced_lock_waiters ORDER BY position;
-- So do the waiting role and its members...
SET ROLE fl_regress_w_app;
SELECT name, holder, owner, position FROM fenced_lock_waiters ORDER BY position;
RESET ROLE;
GRANT SELECT ON fenced_lock_waiters TO fl_regress_w_helper;
SET ROLE fl_regress_w_helper;
SELECT name, holder, owner, position FROM fenced_lock_waiters ORDER BY position;
RESET ROLE;
-- ...while another role sees who waits for what, but not the holder.
SET ROLE fl_regress_w_monitor;
SELECT name, holder, owner, position FROM fenced_lock_waiters ORDER BY position;
RESET ROLE;

-- This session releases: w1 is granted and leaves the view; w2 is now the
-- head of the line.
SELECT fenced_lock_release('wq:job', :t0) AS released;
SELECT token AS t1 FROM dblink_get_result('w1') AS (token bigint) \gset
SELECT * FROM dblink_get_result('w1') AS (done bigint);
SELECT :t1 > :t0 AS w1_granted_after_t0;
SELECT regress_until($$(SELECT position = 1 FROM fenced_lock_waiters WHERE holder = 'worker-2')$$) AS w2_at_head;
SELECT name, holder, position FROM fenced_lock_waiters ORDER BY position;
-- w1 releases: w2 is granted, and nobody waits any more.
SELECT * FROM dblink('w1', format('SELECT fenced_lock_release(%L, %s)', 'wq:job', :t1)) AS (released boolean);
SELECT token AS t2 FROM dblink_get_result('w2') AS (token bigint) \gset
SELECT * FROM dblink_get_result('w2') AS (done bigint);
SELECT :t2 > :t1 AS w2_granted_after_w1;
SELECT * FROM fenced_lock_waiters;

-- A waiter that gives up leaves the view too: w1 waits at most 200 ms for
-- w2's lease and fails with 55P03.
SELECT dblink_send_query('w1', $$SELECT fenced_lock_acquire('wq:job', '1 minute', '200 ms', 'worker-1')$$) AS sent;
SELECT regress_until($$EXISTS (SELECT FROM fenced_lock_waiters WHERE holder = 'worker-1')$$) AS w1_waits;
SELECT * FROM dblink_get_result('w1', false) AS (token bigint);
SELECT * FROM dblink_get_result('w1') AS (done bigint);
SELECT * FROM fenced_lock_waiters;

-- Clean up.
SELECT * FROM dblink('w2', format('SELECT fenced_lock_release(%L, %s)', 'wq:job', :t2)) AS (released boolean);
SELECT dblink_disconnect('w1'), dblink_disconnect('w2');
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name LIKE 'wq:%' AND live;
REVOKE ALL ON fenced_lock_waiters FROM fl_regress_w_app, fl_regress_w_helper, fl_regress_w_monitor;
REVOKE ALL ON FUNCTION fenced_lock_acquire(text, interval, interval, text, boolean, boolean, integer),
                       fenced_lock_release(text, bigint) FROM fl_regress_w_app;
DROP ROLE fl_regress_w_helper, fl_regress_w_app, fl_regress_w_monitor, fl_regress_w_nobody;
