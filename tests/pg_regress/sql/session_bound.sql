-- Session-bound leases (docs/design.md, "Session-bound leases"; docs/reference.md,
-- "Functions"). With session_bound => true a lease also ends when the
-- session that acquired it ends; while the session lives it is a lease like
-- any other (ttl, renew, release). The session holds a session lock for it:
-- an advisory lock in pg_locks with objsubid 0x464D = 17997, held in
-- ExclusiveLock mode by the session's backend until the lease ends. A
-- second session (dblink) stands in for another client. Tokens differ from
-- run to run: this file prints comparisons of them, never their values.
\set VERBOSITY sqlstate

CREATE VIEW my_session_locks AS
  SELECT count(*) AS session_locks FROM pg_locks
   WHERE locktype = 'advisory' AND objsubid = 17997 AND pid = pg_backend_pid() AND mode = 'ExclusiveLock' AND granted;
SELECT dblink_connect('other', regress_conninfo()) AS connected;

-- A session-bound lease: the view says so, and the session holds its lock.
SELECT fenced_lock_try_acquire('sb:job', '1 minute', 'worker-1', session_bound => true) AS t1 \gset
SELECT name, token = :t1 AS is_t1, holder, session_bound, live FROM fenced_lock_leases WHERE name = 'sb:job';
SELECT * FROM my_session_locks;

-- The same session asking again gets the same token back, extended, whatever
-- holder it gives (or none), through either function. The holder recorded
-- stays the first one.
SELECT expires_at AS e1 FROM fenced_lock_leases WHERE name = 'sb:job' \gset
SELECT pg_sleep(0.01);
SELECT fenced_lock_try_acquire('sb:job', '1 minute', session_bound => true) = :t1 AS same_token;
SELECT fenced_lock_acquire('sb:job', '2 minutes', holder => 'worker-2', session_bound => true) = :t1 AS same_token;
SELECT holder, session_bound, expires_at > :'e1' AS extended,
       expires_at - clock_timestamp() BETWEEN '1 minute' AND '2 minutes' AS ends_in_2_minutes
  FROM fenced_lock_leases WHERE name = 'sb:job';
-- Still one lease, one session lock.
SELECT * FROM my_session_locks;

-- Another session is refused, with or without session_bound.
SELECT * FROM dblink('other', $$SELECT fenced_lock_try_acquire('sb:job', '1 minute', 'worker-3', session_bound => true) IS NULL$$) AS (refused boolean);
SELECT * FROM dblink('other', $$SELECT fenced_lock_try_acquire('sb:job', '1 minute', 'worker-3') IS NULL$$) AS (refused boolean);
-- fenced_lock_acquire waits; with wait => '0' it gives up at once (55P03).
SELECT * FROM dblink('other', $$SELECT fenced_lock_acquire('sb:job', '1 minute', '0', 'worker-3', true)$$) AS (token bigint);

-- renew keeps the lease session-bound (and keeps its token).
SELECT fenced_lock_renew('sb:job', :t1, '5 minutes') AS renewed;
SELECT session_bound, live, expires_at - clock_timestamp() BETWEEN '4 minutes' AND '5 minutes' AS ends_in_5_minutes
  FROM fenced_lock_leases WHERE name = 'sb:job';
SELECT * FROM my_session_locks;

-- release ends it like any lease, and gives the session lock back.
SELECT fenced_lock_release('sb:job', :t1) AS released;
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name = 'sb:job';
SELECT * FROM my_session_locks;
SELECT session_bound, ended_by FROM fenced_lock_history WHERE token = :t1;

-- A session-bound grant rolled back never existed: no record, no session
-- lock (also when only a savepoint rolls back).
BEGIN;
SELECT fenced_lock_try_acquire('sb:job', '1 minute', session_bound => true) IS NOT NULL AS granted_inside;
SELECT * FROM my_session_locks;
ROLLBACK;
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name = 'sb:job';
SELECT * FROM my_session_locks;
BEGIN;
SAVEPOINT s;
SELECT fenced_lock_try_acquire('sb:job', '1 minute', session_bound => true) IS NOT NULL AS granted_inside;
ROLLBACK TO SAVEPOINT s;
SELECT * FROM my_session_locks;
COMMIT;
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name = 'sb:job';

-- session_bound is true or false (the default), never NULL.
\set VERBOSITY default
SELECT fenced_lock_try_acquire('sb:job', session_bound => NULL);
\set VERBOSITY sqlstate
SELECT fenced_lock_acquire('sb:job', session_bound => NULL);
-- Without it, a lease is not session-bound.
SELECT fenced_lock_try_acquire('sb:plain', '1 minute') AS tp \gset
SELECT session_bound FROM fenced_lock_leases WHERE name = 'sb:plain';
SELECT * FROM my_session_locks;
SELECT fenced_lock_release('sb:plain', :tp) AS released;

-- The end of the session ends the lease. The other session takes a
-- session-bound lease and disconnects: its backend ends the lease on its
-- way out (history: session_end, no role), and the name is free at once.
SELECT token AS t2 FROM dblink('other', $$SELECT fenced_lock_try_acquire('sb:job', '1 hour', 'worker-3', session_bound => true)$$) AS (token bigint) \gset
SELECT holder, session_bound, live FROM fenced_lock_leases WHERE name = 'sb:job';
SELECT fenced_lock_try_acquire('sb:job', '1 minute', 'worker-1', session_bound => true) IS NULL AS refused;
SELECT dblink_disconnect('other');
SELECT regress_until(format('(SELECT ended_by IS NOT NULL FROM fenced_lock_history WHERE token = %s)', :t2)) AS ended;
SELECT session_bound, ended_by, ended_by_role, ended_at < expires_at AS before_its_expiry
  FROM fenced_lock_history WHERE token = :t2;
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name = 'sb:job';
SELECT fenced_lock_try_acquire('sb:job', '1 minute', 'worker-1', session_bound => true) AS t3 \gset
SELECT :t3 > :t2 AS t3_above_t2;

-- DISCARD ALL (what a pooler in session mode runs when its client leaves)
-- and pg_advisory_unlock_all() give back every session-level advisory lock
-- of the session, the session locks included: the session's session-bound
-- leases end with them. The record stays until the next transition of the
-- name sees it ended (here: this session's next acquire, which records
-- session_end in the history).
DISCARD ALL;
SELECT * FROM my_session_locks;
SELECT session_bound, live FROM fenced_lock_leases WHERE name = 'sb:job';
SELECT fenced_lock_validate('sb:job', :t3) AS t3_is_live;
SELECT fenced_lock_try_acquire('sb:job', '1 minute', 'worker-1', session_bound => true) AS t4 \gset
SELECT :t4 > :t3 AS t4_above_t3;
SELECT ended_by FROM fenced_lock_history WHERE token = :t3;
SELECT pg_advisory_unlock_all();
SELECT fenced_lock_validate('sb:job', :t4) AS t4_is_live;
SELECT fenced_lock_release('sb:job', :t4) AS released;

-- Clean up.
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name LIKE 'sb:%' AND live;
DROP VIEW my_session_locks;
