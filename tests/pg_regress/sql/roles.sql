-- Security (docs/design.md, "Security"). Nothing is open to PUBLIC: each
-- application role is granted EXECUTE on the functions it uses and SELECT on
-- the views it reads. With that, it can neither read nor write the lease
-- state directly (so it cannot forge a lease or a token), it can renew and
-- release only the leases its own role (or a role it is a member of)
-- acquired, it cannot force release, and the views hide token and holder of
-- other roles' leases.
\set VERBOSITY sqlstate

CREATE ROLE fl_regress_alice;
CREATE ROLE fl_regress_bob;
CREATE ROLE fl_regress_alice_helper IN ROLE fl_regress_alice;
CREATE ROLE fl_regress_nobody;
GRANT EXECUTE ON FUNCTION
    fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer),
    fenced_lock_acquire(text, interval, interval, text, boolean, boolean, integer),
    fenced_lock_renew(text, bigint, interval),
    fenced_lock_release(text, bigint),
    fenced_lock_validate(text, bigint),
    fenced_lock_assert(text, bigint),
    fenced_lock_force_release(text)
  TO fl_regress_alice, fl_regress_bob;
GRANT SELECT ON fenced_lock_leases TO fl_regress_alice, fl_regress_bob;

-- A role that was granted nothing cannot call the functions or read the views.
SET ROLE fl_regress_nobody;
\set VERBOSITY default
SELECT fenced_lock_try_acquire('roles:a');
\set VERBOSITY sqlstate
SELECT fenced_lock_validate('roles:a', 1);
SELECT * FROM fenced_lock_leases;
SELECT * FROM fenced_lock_waiters;
SELECT * FROM fenced_lock_history;
SELECT * FROM fenced_lock_stats;
RESET ROLE;
-- Nor can a role granted only EXECUTE and SELECT on fenced_lock_leases (as
-- Alice and Bob are here) read the other views: each is granted on its own.
SET ROLE fl_regress_alice;
SELECT count(*) FROM fenced_lock_waiters;
SELECT count(*) FROM fenced_lock_history;
SELECT count(*) FROM fenced_lock_stats;
RESET ROLE;

-- Alice takes a lease.
SET ROLE fl_regress_alice;
SELECT fenced_lock_try_acquire('roles:a', '1 minute', 'alice-1') AS ta \gset
SELECT name, token = :ta AS is_ta, holder, owner, live FROM fenced_lock_leases WHERE name LIKE 'roles:%';
RESET ROLE;

-- The lease state is out of reach: the private schema is not usable at all.
SET ROLE fl_regress_alice;
\set VERBOSITY default
SELECT * FROM fenced_lock_internal.granted_leases;
\set VERBOSITY sqlstate
INSERT INTO fenced_lock_internal.granted_leases VALUES ('roles:forged', 1, NULL, 'fl_regress_alice', now(), now() + '1 hour', '1 hour');
UPDATE fenced_lock_internal.granted_leases SET expires_at = expires_at + '1 hour';
DELETE FROM fenced_lock_internal.granted_leases;
TRUNCATE fenced_lock_internal.granted_leases;
SELECT nextval('fenced_lock_internal.token_seq');
SELECT setval('fenced_lock_internal.token_seq', 1);
-- The same for the history: it cannot be read, forged or erased directly.
SELECT * FROM fenced_lock_internal.lease_history;
INSERT INTO fenced_lock_internal.lease_history (token, name, owner, session_bound, acquired_at, expires_at)
  VALUES (1, 'roles:forged', 'fl_regress_alice', false, now(), now() + '1 hour');
UPDATE fenced_lock_internal.lease_history SET ended_by = NULL, ended_at = NULL;
DELETE FROM fenced_lock_internal.lease_history;
TRUNCATE fenced_lock_internal.lease_history;
-- The functions behind the views cannot be named either.
SELECT * FROM fenced_lock_internal.waiters();
SELECT * FROM fenced_lock_internal.stats();
RESET ROLE;
-- Even with USAGE on the schema, the tables and the sequence grant nothing.
GRANT USAGE ON SCHEMA fenced_lock_internal TO fl_regress_alice;
SET ROLE fl_regress_alice;
SELECT * FROM fenced_lock_internal.granted_leases;
INSERT INTO fenced_lock_internal.granted_leases VALUES ('roles:forged', 1, NULL, 'fl_regress_alice', now(), now() + '1 hour', '1 hour');
UPDATE fenced_lock_internal.granted_leases SET expires_at = expires_at + '1 hour';
DELETE FROM fenced_lock_internal.granted_leases;
SELECT nextval('fenced_lock_internal.token_seq');
SELECT * FROM fenced_lock_internal.lease_history;
UPDATE fenced_lock_internal.lease_history SET ended_by = NULL, ended_at = NULL;
DELETE FROM fenced_lock_internal.lease_history;
RESET ROLE;
REVOKE USAGE ON SCHEMA fenced_lock_internal FROM fl_regress_alice;
-- Nothing changed: same single lease, still Alice's.
SELECT name, token = :ta AS is_ta, owner, live FROM fenced_lock_leases WHERE name LIKE 'roles:%';

-- Bob sees that the name is held and by which role, but not the token or the holder.
SET ROLE fl_regress_bob;
SELECT name, token, holder, owner, live FROM fenced_lock_leases WHERE name = 'roles:a';
-- He cannot take it, even with the same holder id: a holder id is matched
-- only for the role that acquired the lease.
SELECT fenced_lock_try_acquire('roles:a', '1 minute', 'alice-1') IS NULL AS refused;
-- validate and assert are open to anyone granted them: they change nothing.
SELECT fenced_lock_validate('roles:a', :ta) AS ta_is_live;
SELECT fenced_lock_assert('roles:a', :ta);
-- He may not renew or release Alice's lease, even knowing the token. (The
-- message carries the token; psql's LAST_ERROR_MESSAGE lets us print it
-- with the token masked, since tokens differ between runs.)
SELECT fenced_lock_renew('roles:a', :ta);
SELECT regexp_replace(:'LAST_ERROR_MESSAGE', '\m' || :'ta' || '\M', '<ta>', 'g') AS message;
SELECT fenced_lock_renew('roles:a', :ta, '1 day');
SELECT fenced_lock_release('roles:a', :ta);
-- Nor force release it.
SELECT fenced_lock_force_release('roles:a');
-- A wrong token is simply not live: false, not an error.
SELECT fenced_lock_release('roles:a', :ta + 1000) AS released;
SELECT fenced_lock_renew('roles:a', :ta + 1000) AS renewed;
RESET ROLE;
SELECT fenced_lock_validate('roles:a', :ta) AS ta_still_live;

-- A member of Alice's role acts for her: sees her token, may renew and release.
SET ROLE fl_regress_alice_helper;
SELECT name, token = :ta AS is_ta, holder FROM fenced_lock_leases WHERE name = 'roles:a';
SELECT fenced_lock_renew('roles:a', :ta, '2 minutes') AS renewed;
-- The same holder id from a member role is a retry of the same lease.
SELECT fenced_lock_try_acquire('roles:a', '1 minute', 'alice-1') = :ta AS same_token;
SELECT fenced_lock_release('roles:a', :ta) AS released;
RESET ROLE;

-- Bob's own lease: his to release, and Alice sees only that it exists.
SET ROLE fl_regress_bob;
SELECT fenced_lock_try_acquire('roles:a', '1 minute', 'bob-1') AS tb \gset
RESET ROLE;
SELECT :tb > :ta AS tb_above_ta;
SET ROLE fl_regress_alice;
SELECT name, token, holder, owner, live FROM fenced_lock_leases WHERE name = 'roles:a';
SELECT fenced_lock_release('roles:a', :tb);
RESET ROLE;
SET ROLE fl_regress_bob;
SELECT fenced_lock_release('roles:a', :tb) AS released;
RESET ROLE;

-- A superuser sees everything (and may act for any role).
SET ROLE fl_regress_alice;
SELECT fenced_lock_try_acquire('roles:b', '1 minute', 'alice-2') AS tc \gset
RESET ROLE;
SELECT name, token = :tc AS is_tc, holder, owner FROM fenced_lock_leases WHERE name LIKE 'roles:%';
SELECT fenced_lock_release('roles:b', :tc) AS released_by_superuser;

-- search_path tricks do not reach inside the functions: a role that shadows
-- pg_catalog operators and functions in its own schema changes nothing.
CREATE SCHEMA fl_regress_evil;
GRANT USAGE, CREATE ON SCHEMA fl_regress_evil TO fl_regress_bob;
SET ROLE fl_regress_bob;
CREATE FUNCTION fl_regress_evil.texteq_always(text, text) RETURNS boolean
  LANGUAGE sql IMMUTABLE AS 'SELECT true';
CREATE OPERATOR fl_regress_evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = fl_regress_evil.texteq_always);
CREATE FUNCTION fl_regress_evil.clock_timestamp() RETURNS timestamptz
  LANGUAGE sql AS $$SELECT '2000-01-01'::timestamptz$$;
SET search_path = fl_regress_evil, pg_catalog, public;
SELECT fenced_lock_try_acquire('roles:evil', '1 minute') AS te \gset
SELECT fenced_lock_try_acquire('roles:other', '1 minute') > :te AS other_name_is_separate;
SELECT fenced_lock_validate('roles:evil-2', :te) AS valid_for_another_name;
SELECT fenced_lock_release('roles:evil', :te) AS released;
SELECT fenced_lock_force_release('roles:other');
RESET search_path;
RESET ROLE;
SELECT name, owner, live FROM fenced_lock_leases WHERE name LIKE 'roles:%' ORDER BY name;
SELECT fenced_lock_force_release('roles:other') AS ended;
SET client_min_messages = warning;
DROP SCHEMA fl_regress_evil CASCADE;
RESET client_min_messages;

-- Clean up.
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name LIKE 'roles:%';
REVOKE ALL ON FUNCTION
    fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer),
    fenced_lock_acquire(text, interval, interval, text, boolean, boolean, integer),
    fenced_lock_renew(text, bigint, interval),
    fenced_lock_release(text, bigint),
    fenced_lock_validate(text, bigint),
    fenced_lock_assert(text, bigint),
    fenced_lock_force_release(text)
  FROM fl_regress_alice, fl_regress_bob;
REVOKE ALL ON fenced_lock_leases FROM fl_regress_alice, fl_regress_bob;
DROP ROLE fl_regress_alice_helper;
DROP ROLE fl_regress_alice;
DROP ROLE fl_regress_bob;
DROP ROLE fl_regress_nobody;
