-- fenced_lock_stats (docs/reference.md, "Views"; docs/design.md,
-- "Observability"): one row of counters since the server started. They live
-- in shared memory reserved at server start, so they exist only when
-- fenced_lock is in shared_preload_libraries. This cluster does not preload
-- it: the view says preloaded = false and shows NULL for every counter,
-- never a number it cannot vouch for.
\set VERBOSITY sqlstate
\pset null '(null)'

-- The columns. What each counts (lease changes counted when their
-- transaction commits; the last four when they happen):
--   grants            grants that handed out a new token
--   renewals          renewals, and re-acquires by the same holder or session
--   releases          releases
--   expiries          expiries, recorded when observed (takeover or reaper)
--   force_releases    forced releases
--   session_ends      session-bound leases ended by the end of their session
--   waits             fenced_lock_acquire calls that had to queue
--   wait_timeouts     55P03 raised by a wait that ran out
--   fence_rejections  FL001 raised (the guard and fenced_lock_assert)
--   missing_tokens    FL002 raised
--   preloaded         fenced_lock is in shared_preload_libraries
SELECT attname AS column, format_type(atttypid, atttypmod) AS type
  FROM pg_attribute WHERE attrelid = 'fenced_lock_stats'::regclass AND attnum > 0 ORDER BY attnum;

-- Not preloaded here.
SELECT current_setting('shared_preload_libraries') LIKE '%fenced_lock%' AS preloaded_by_the_server;
\x on
SELECT * FROM fenced_lock_stats;
\x off

-- Lease changes do not make numbers appear: a library loaded on first use
-- cannot know what happened before it was loaded.
SELECT fenced_lock_try_acquire('stats:a', '1 minute') AS t \gset
SELECT fenced_lock_renew('stats:a', :t) AS renewed;
SELECT fenced_lock_release('stats:a', :t) AS released;
SELECT grants, renewals, releases, preloaded FROM fenced_lock_stats;

-- Who may read it: superusers, and roles granted SELECT (42501 otherwise).
CREATE ROLE fl_regress_s_monitor;
SET ROLE fl_regress_s_monitor;
SELECT * FROM fenced_lock_stats;
RESET ROLE;
GRANT SELECT ON fenced_lock_stats TO fl_regress_s_monitor;
SET ROLE fl_regress_s_monitor;
SELECT grants IS NULL AS grants_unknown, preloaded FROM fenced_lock_stats;
RESET ROLE;

-- Clean up.
REVOKE ALL ON fenced_lock_stats FROM fl_regress_s_monitor;
DROP ROLE fl_regress_s_monitor;
