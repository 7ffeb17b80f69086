-- fenced_lock_history (docs/reference.md, "Views"; docs/design.md,
-- "Observability"): one row per lease granted, written in the grant's
-- transaction and closed in the transaction that ends the lease, with how
-- it ended: release, force_release, expiry or session_end. Kept
-- fenced_lock.history_retention (default 1 day) after it ended, then pruned
-- by later grants. Tokens and times differ from run to run: this file
-- prints comparisons of them, never their values.
\set VERBOSITY sqlstate

-- The columns.
SELECT attname AS column, format_type(atttypid, atttypmod) AS type
  FROM pg_attribute WHERE attrelid = 'fenced_lock_history'::regclass AND attnum > 0 ORDER BY attnum;

CREATE ROLE fl_regress_h_app;
CREATE ROLE fl_regress_h_ops;
CREATE ROLE fl_regress_h_other;
GRANT EXECUTE ON FUNCTION fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer),
                          fenced_lock_renew(text, bigint, interval),
                          fenced_lock_release(text, bigint),
                          fenced_lock_force_release(text) TO fl_regress_h_app, fl_regress_h_ops;
GRANT SELECT ON fenced_lock_history TO fl_regress_h_app, fl_regress_h_other;
SET fenced_lock.operator_role = 'fl_regress_h_ops';

-- A grant writes a row at once (in its own transaction): not ended yet.
-- While the lease is live, expires_at follows its renewals.
SET ROLE fl_regress_h_app;
SELECT fenced_lock_try_acquire('hist:a', '1 minute', 'worker-1') AS t1 \gset
SELECT name, token = :t1 AS is_t1, holder, owner, session_bound, ended_at, ended_by, ended_by_role
  FROM fenced_lock_history WHERE name = 'hist:a';
SELECT fenced_lock_renew('hist:a', :t1, '1 hour') AS renewed;
SELECT expires_at - acquired_at > '59 minutes' AS expires_at_follows_renew FROM fenced_lock_history WHERE token = :t1;

-- release: ended_by = release, by the role that released, at the release.
SELECT fenced_lock_release('hist:a', :t1) AS released;
SELECT ended_by, ended_by_role, ended_at < expires_at AS before_its_expiry, ended_at <= clock_timestamp() AS in_the_past
  FROM fenced_lock_history WHERE token = :t1;
RESET ROLE;

-- force_release: ended_by = force_release, by the operator who did it.
SET ROLE fl_regress_h_app;
SELECT fenced_lock_try_acquire('hist:a', '1 minute', 'worker-1') AS t2 \gset
RESET ROLE;
SET ROLE fl_regress_h_ops;
SELECT fenced_lock_force_release('hist:a') AS forced;
RESET ROLE;
SELECT owner, ended_by, ended_by_role, ended_at < expires_at AS before_its_expiry
  FROM fenced_lock_history WHERE token = :t2;

-- expiry: nobody says a lease expired; it is recorded when a transition
-- observes it. Until then the row stays open...
SET ROLE fl_regress_h_app;
SELECT fenced_lock_try_acquire('hist:a', '100 ms', 'worker-1') AS t3 \gset
SELECT pg_sleep(0.2);
SELECT ended_by, expires_at < clock_timestamp() AS expired FROM fenced_lock_history WHERE token = :t3;
-- ...and the takeover of the name closes it, in the takeover's transaction:
-- ended_by = expiry, no role, and ended_at = the lease's expires_at.
SELECT fenced_lock_try_acquire('hist:a', '1 minute', 'worker-2') AS t4 \gset
SELECT ended_by, ended_by_role, ended_at = expires_at AS ended_at_its_expiry
  FROM fenced_lock_history WHERE token = :t3;
SELECT fenced_lock_release('hist:a', :t4) AS released;
RESET ROLE;

-- session_end: a lease taken with session_bound => true by another session
-- (dblink) that then disconnects. Its backend ends the lease on the way out,
-- in a transaction of its own: ended_by = session_end, no role.
SELECT dblink_connect('other', regress_conninfo()) AS connected;
SELECT token AS t5 FROM dblink('other', $$SET ROLE fl_regress_h_app;
  SELECT fenced_lock_try_acquire('hist:b', '1 hour', 'worker-3', session_bound => true)$$) AS (token bigint) \gset
SELECT session_bound, ended_by FROM fenced_lock_history WHERE token = :t5;
SELECT dblink_disconnect('other');
SELECT regress_until(format('(SELECT ended_by IS NOT NULL FROM fenced_lock_history WHERE token = %s)', :t5)) AS ended;
SELECT session_bound, ended_by, ended_by_role, ended_at < expires_at AS before_its_expiry
  FROM fenced_lock_history WHERE token = :t5;

-- A grant rolled back leaves no row (its token is burnt).
BEGIN;
SELECT fenced_lock_try_acquire('hist:c', '1 minute') AS t6 \gset
SELECT count(*) AS rows_inside FROM fenced_lock_history WHERE token = :t6;
ROLLBACK;
SELECT count(*) AS rows_after_rollback FROM fenced_lock_history WHERE token = :t6;

-- The rows of this file, in order.
SELECT name, holder, owner, session_bound, ended_by, ended_by_role
  FROM fenced_lock_history WHERE name LIKE 'hist:%' ORDER BY acquired_at;

-- Visibility: token and holder only for the owner's members, operators and
-- superusers; anyone granted SELECT sees the rest.
SET ROLE fl_regress_h_other;
SELECT name, token, holder, owner, ended_by, ended_by_role
  FROM fenced_lock_history WHERE name LIKE 'hist:%' ORDER BY acquired_at;
RESET ROLE;
SET ROLE fl_regress_h_app;
SELECT name, token IS NOT NULL AS sees_token, holder, owner
  FROM fenced_lock_history WHERE name LIKE 'hist:%' ORDER BY acquired_at;
RESET ROLE;
-- Without SELECT on the view no role reads it (42501), operators included...
SET ROLE fl_regress_h_ops;
SELECT count(*) FROM fenced_lock_history;
RESET ROLE;
-- ...and an operator granted SELECT sees every token and holder.
GRANT SELECT ON fenced_lock_history TO fl_regress_h_ops;
SET ROLE fl_regress_h_ops;
SELECT name, token IS NOT NULL AS sees_token, holder
  FROM fenced_lock_history WHERE name LIKE 'hist:%' ORDER BY acquired_at;
RESET ROLE;

-- fenced_lock.history_retention: how long rows are kept after they end
-- (superuser only). 0 keeps no history: a grant then writes no row at all.
SHOW fenced_lock.history_retention;
SET ROLE fl_regress_h_app;
SET fenced_lock.history_retention = 0;
RESET ROLE;
SET fenced_lock.history_retention = 0;
SELECT fenced_lock_try_acquire('hist:d', '1 minute') AS t7 \gset
SELECT fenced_lock_release('hist:d', :t7) AS released;
SELECT count(*) AS rows FROM fenced_lock_history WHERE name = 'hist:d';
RESET fenced_lock.history_retention;
SHOW fenced_lock.history_retention;

-- Clean up.
RESET fenced_lock.operator_role;
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name LIKE 'hist:%' AND live;
REVOKE ALL ON fenced_lock_history FROM fl_regress_h_app, fl_regress_h_ops, fl_regress_h_other;
REVOKE ALL ON FUNCTION fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer),
                       fenced_lock_renew(text, bigint, interval),
                       fenced_lock_release(text, bigint),
                       fenced_lock_force_release(text) FROM fl_regress_h_app, fl_regress_h_ops;
DROP ROLE fl_regress_h_app, fl_regress_h_ops, fl_regress_h_other;
