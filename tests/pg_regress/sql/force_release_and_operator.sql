-- fenced_lock_force_release ends whatever lease of a name is live. Only a
-- superuser or a member of the role named in fenced_lock.operator_role may
-- call it (else 42501), and only a superuser may set fenced_lock.operator_role
-- or fenced_lock.max_ttl. After a forced release the old holder has lost the
-- lock like after an expiry.
\set VERBOSITY sqlstate

CREATE ROLE fl_regress_app;
CREATE ROLE fl_regress_ops;
CREATE ROLE fl_regress_oncall IN ROLE fl_regress_ops;
GRANT EXECUTE ON FUNCTION
    fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer),
    fenced_lock_release(text, bigint),
    fenced_lock_validate(text, bigint),
    fenced_lock_force_release(text)
  TO fl_regress_app, fl_regress_ops;
GRANT SELECT ON fenced_lock_leases TO fl_regress_app, fl_regress_ops;

-- Before the library is loaded in a session, PostgreSQL accepts any
-- fenced_lock.* setting as a placeholder; when the library loads, a value set
-- by a role that may not set it is thrown away with a warning.
SET ROLE fl_regress_app;
SET fenced_lock.operator_role = 'fl_regress_app';
SET fenced_lock.max_ttl = 999999;
\set VERBOSITY terse
SELECT fenced_lock_validate('force:nothing', 1) AS live;
\set VERBOSITY sqlstate
SHOW fenced_lock.operator_role;
SHOW fenced_lock.max_ttl;
-- Once loaded, setting them is refused outright.
\set VERBOSITY default
SET fenced_lock.operator_role = 'fl_regress_app';
\set VERBOSITY sqlstate
SET fenced_lock.max_ttl = 999999;
SELECT set_config('fenced_lock.operator_role', 'fl_regress_app', false);
RESET fenced_lock.operator_role;
RESET ROLE;

-- The application role takes a lease.
SET ROLE fl_regress_app;
SELECT fenced_lock_try_acquire('force:job', '1 minute', 'app-1') AS t1 \gset
-- It may not force release, even its own lease: that is for operators.
\set VERBOSITY default
SELECT fenced_lock_force_release('force:job');
\set VERBOSITY sqlstate
SELECT fenced_lock_force_release('force:free');
RESET ROLE;
SELECT fenced_lock_validate('force:job', :t1) AS t1_is_live;

-- A superuser may. The result says whether a live lease was ended.
SELECT fenced_lock_force_release('force:job') AS ended;
SELECT fenced_lock_force_release('force:job') AS ended_again;
SELECT fenced_lock_force_release('force:never-held') AS ended;
-- The record is gone; the old holder's token is no longer live anywhere.
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name = 'force:job';
SELECT fenced_lock_validate('force:job', :t1) AS t1_is_live;
SET ROLE fl_regress_app;
SELECT fenced_lock_release('force:job', :t1) AS released_by_old_holder;
RESET ROLE;
SELECT fenced_lock_assert('force:job', :t1);
-- The next grant gets a larger token.
SET ROLE fl_regress_app;
SELECT fenced_lock_try_acquire('force:job', '1 minute', 'app-2') AS t2 \gset
RESET ROLE;
SELECT :t2 > :t1 AS t2_above_t1;
-- An expired lease is not live, so there is nothing to force release.
SELECT fenced_lock_try_acquire('force:expired', '1 microsecond') IS NOT NULL AS granted;
SELECT pg_sleep(0.01);
SELECT fenced_lock_force_release('force:expired') AS ended;

-- Operators: name a role in fenced_lock.operator_role (superuser only; here
-- for this session, usually in postgresql.conf or ALTER DATABASE/ROLE ... SET).
-- Its members may force release; others still may not.
SET fenced_lock.operator_role = 'fl_regress_ops';
SHOW fenced_lock.operator_role;
SET ROLE fl_regress_app;
SELECT fenced_lock_force_release('force:job');
RESET ROLE;
SET ROLE fl_regress_oncall;
-- Operators see token and holder of every lease in the view.
SELECT name, token = :t2 AS is_t2, holder, owner, live FROM fenced_lock_leases WHERE name = 'force:job';
SELECT fenced_lock_force_release('force:job') AS ended;
RESET ROLE;
SELECT fenced_lock_validate('force:job', :t2) AS t2_is_live;
-- A member of the operator role may not change the setting either.
SET ROLE fl_regress_oncall;
SET fenced_lock.operator_role = 'fl_regress_oncall';
RESET ROLE;

-- A role name that does not exist makes nobody an operator (but superusers).
SET fenced_lock.operator_role = 'fl_regress_no_such_role';
SET ROLE fl_regress_app;
SELECT fenced_lock_try_acquire('force:job', '1 minute') AS t3 \gset
RESET ROLE;
SET ROLE fl_regress_oncall;
SELECT fenced_lock_force_release('force:job');
RESET ROLE;
-- Empty (the default) means superusers only.
RESET fenced_lock.operator_role;
SET ROLE fl_regress_oncall;
SELECT fenced_lock_force_release('force:job');
RESET ROLE;
SELECT fenced_lock_force_release('force:job') AS ended_by_superuser;

-- A forced release wakes a waiter at once; see the isolation tests. Here: the
-- name is free again.
SELECT fenced_lock_try_acquire('force:job', '1 minute') > :t3 AS granted_with_larger_token;
SELECT fenced_lock_force_release('force:job') AS ended;

-- Clean up.
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name LIKE 'force:%' AND live;
REVOKE ALL ON FUNCTION
    fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer),
    fenced_lock_release(text, bigint),
    fenced_lock_validate(text, bigint),
    fenced_lock_force_release(text)
  FROM fl_regress_app, fl_regress_ops;
REVOKE ALL ON fenced_lock_leases FROM fl_regress_app, fl_regress_ops;
DROP ROLE fl_regress_oncall;
DROP ROLE fl_regress_ops;
DROP ROLE fl_regress_app;
