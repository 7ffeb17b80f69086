-- Bad arguments are refused before anything happens: a required NULL
-- argument is 22004, a bad value is 22023 (docs/reference.md, "SQLSTATEs";
-- docs/design.md, "Words"). Every function, every argument. Each error names
-- the function and the lock; one message of each kind is shown in full. At
-- the end: no failed call left a lease.
\set VERBOSITY sqlstate

-- A live lease to renew, release, validate and assert against.
SELECT fenced_lock_try_acquire('args:held', '1 minute') AS t \gset

--
-- NULL where a value is required: 22004.
--
\set VERBOSITY default
SELECT fenced_lock_try_acquire(NULL);
SELECT fenced_lock_renew('args:held', NULL);
\set VERBOSITY sqlstate
-- try_acquire(name, ttl, holder, session_bound): name and ttl are required,
-- holder is optional.
SELECT fenced_lock_try_acquire(NULL, '1 minute', 'h');
SELECT fenced_lock_try_acquire('args:bad', NULL, 'h');
SELECT fenced_lock_try_acquire('args:null-holder', '1 minute', NULL) IS NOT NULL AS granted;
-- acquire(name, ttl, wait, holder, session_bound): name and ttl are
-- required; wait NULL means "no limit", holder is optional.
SELECT fenced_lock_acquire(NULL);
SELECT fenced_lock_acquire(NULL, '1 minute', '1 s', 'h');
SELECT fenced_lock_acquire('args:bad', NULL);
SELECT fenced_lock_acquire('args:null-wait', '1 minute', NULL, NULL) IS NOT NULL AS granted;
-- session_bound (both acquires) is true or false (the default), never NULL.
\set VERBOSITY default
SELECT fenced_lock_try_acquire('args:bad', '1 minute', 'h', NULL);
\set VERBOSITY sqlstate
SELECT fenced_lock_try_acquire('args:bad', session_bound => NULL);
SELECT fenced_lock_acquire('args:bad', '1 minute', NULL, 'h', NULL);
SELECT fenced_lock_acquire('args:bad', session_bound => NULL);
-- renew(name, token, ttl): name and token are required; ttl NULL means "its own ttl".
SELECT fenced_lock_renew(NULL, :t);
SELECT fenced_lock_renew('args:held', NULL, '1 minute');
SELECT fenced_lock_renew('args:held', :t, NULL) AS renewed;
-- release(name, token), validate(name, token), assert(name, token): both required.
SELECT fenced_lock_release(NULL, :t);
SELECT fenced_lock_release('args:held', NULL);
SELECT fenced_lock_validate(NULL, :t);
SELECT fenced_lock_validate('args:held', NULL);
SELECT fenced_lock_assert(NULL, :t);
SELECT fenced_lock_assert('args:held', NULL);
-- force_release(name)
SELECT fenced_lock_force_release(NULL);

--
-- Lock names: non-empty text of at most 512 bytes (bytes, not characters).
--
\set VERBOSITY default
SELECT fenced_lock_try_acquire('');
SELECT fenced_lock_try_acquire(repeat('n', 513));
\set VERBOSITY sqlstate
-- Every function checks the name the same way.
SELECT fenced_lock_acquire('');
SELECT fenced_lock_acquire(repeat('n', 513));
SELECT fenced_lock_renew('', :t);
SELECT fenced_lock_renew(repeat('n', 513), :t);
SELECT fenced_lock_release('', :t);
SELECT fenced_lock_release(repeat('n', 513), :t);
SELECT fenced_lock_validate('', :t);
SELECT fenced_lock_validate(repeat('n', 513), :t);
SELECT fenced_lock_assert('', :t);
SELECT fenced_lock_assert(repeat('n', 513), :t);
SELECT fenced_lock_force_release('');
SELECT fenced_lock_force_release(repeat('n', 513));
-- 512 bytes is fine.
SELECT fenced_lock_try_acquire('args:' || repeat('n', 507)) IS NOT NULL AS granted_512_bytes;
SELECT fenced_lock_validate(repeat('n', 512), :t) AS validated_512_bytes;
-- Multibyte characters count by their bytes: 256 x 'é' (2 bytes) = 512 bytes
-- is fine, one more ASCII byte is not; 170 x '€' (3 bytes) = 510 bytes is
-- fine, 171 x '€' = 513 bytes is not.
SELECT octet_length(repeat('é', 256)) AS bytes, fenced_lock_try_acquire(repeat('é', 256)) IS NOT NULL AS granted;
SELECT fenced_lock_try_acquire(repeat('é', 256) || 'a');
SELECT octet_length(repeat('€', 170)) AS bytes, fenced_lock_try_acquire(repeat('€', 170)) IS NOT NULL AS granted;
-- The message quotes a long name cut to about 80 bytes, never inside a character.
\set VERBOSITY terse
SELECT fenced_lock_try_acquire(repeat('€', 171));
\set VERBOSITY sqlstate
-- Whitespace-only and control characters are ordinary characters of a name.
SELECT fenced_lock_try_acquire(' ') IS NOT NULL AS granted;
SELECT fenced_lock_try_acquire(E'args:tab\there') IS NOT NULL AS granted;

--
-- ttl: greater than zero and at most fenced_lock.max_ttl (default 1 day).
--
SHOW fenced_lock.max_ttl;
\set VERBOSITY default
SELECT fenced_lock_try_acquire('args:bad', '0');
SELECT fenced_lock_try_acquire('args:bad', '1 day 1 second');
\set VERBOSITY sqlstate
SELECT fenced_lock_try_acquire('args:bad', '-1 second');
SELECT fenced_lock_try_acquire('args:bad', '-1 microsecond');
SELECT fenced_lock_try_acquire('args:bad', '1 mon');
SELECT fenced_lock_try_acquire('args:bad', '1000000 years');
SELECT fenced_lock_try_acquire('args:bad', '-1000000 years');
-- An interval with mixed signs counts as a whole (a month is 30 days): still negative.
SELECT fenced_lock_try_acquire('args:bad', '-1 day +1 hour');
SELECT fenced_lock_try_acquire('args:bad', '1 mon -31 days');
-- The same checks in acquire and renew.
SELECT fenced_lock_acquire('args:bad', '0');
SELECT fenced_lock_acquire('args:bad', '-1 s');
SELECT fenced_lock_acquire('args:bad', '1000000 years');
SELECT fenced_lock_renew('args:held', :t, '0');
SELECT fenced_lock_renew('args:held', :t, '-1 s');
SELECT fenced_lock_renew('args:held', :t, '1000000 years');
SELECT fenced_lock_renew('args:held', :t, '1 day 1 microsecond');
-- The smallest and the largest allowed ttl.
SELECT fenced_lock_try_acquire('args:ttl-1us', '1 microsecond') IS NOT NULL AS granted;
SELECT fenced_lock_try_acquire('args:ttl-1day', '1 day') IS NOT NULL AS granted;
SELECT fenced_lock_try_acquire('args:ttl-1mon-29days', '1 mon -29 days') IS NOT NULL AS granted;
SELECT name, expires_at - acquired_at AS ttl FROM fenced_lock_leases
 WHERE name LIKE 'args:ttl-%' ORDER BY name;
-- A superuser may raise (or lower) the maximum for a session, or in postgresql.conf.
SET fenced_lock.max_ttl = '7d';
SHOW fenced_lock.max_ttl;
SELECT fenced_lock_try_acquire('args:ttl-7days', '7 days') IS NOT NULL AS granted;
SELECT fenced_lock_renew('args:held', :t, '2 days') AS renewed;
SET fenced_lock.max_ttl = 10;
SELECT fenced_lock_renew('args:held', :t, '11 s');
SELECT fenced_lock_renew('args:held', :t, '10 s') AS renewed;
RESET fenced_lock.max_ttl;
SHOW fenced_lock.max_ttl;
SELECT fenced_lock_renew('args:held', :t, '1 minute') AS renewed;
SELECT fenced_lock_try_acquire('args:bad', '7 days');
-- The maximum itself must be at least 1 second.
SET fenced_lock.max_ttl = 0;

--
-- wait: zero or more; NULL waits without limit.
--
\set VERBOSITY default
SELECT fenced_lock_acquire('args:bad', '1 minute', '-1 ms');
\set VERBOSITY sqlstate
SELECT fenced_lock_acquire('args:bad', '1 minute', '-1000000 years');
SELECT fenced_lock_acquire('args:bad', '1 minute', '1 mon -31 days');
-- A huge wait is fine: on a free name the lease is granted at once.
SELECT fenced_lock_acquire('args:wait-huge', '1 minute', '1000000 years') IS NOT NULL AS granted;
SELECT fenced_lock_acquire('args:wait-zero', '1 minute', '0') IS NOT NULL AS granted;

--
-- holder: optional, at most 512 bytes; empty is a holder like any other.
--
\set VERBOSITY default
SELECT fenced_lock_try_acquire('args:bad', '1 minute', repeat('h', 513));
\set VERBOSITY sqlstate
SELECT fenced_lock_acquire('args:bad', '1 minute', NULL, repeat('h', 513));
SELECT fenced_lock_try_acquire('args:bad', '1 minute', repeat('ü', 257));
SELECT fenced_lock_try_acquire('args:holder-512', '1 minute', repeat('h', 512)) AS h512 \gset
SELECT :h512 > 0 AS granted;
SELECT fenced_lock_try_acquire('args:holder-512', '1 minute', repeat('h', 512)) = :h512 AS same_holder_same_token;
SELECT fenced_lock_try_acquire('args:holder-empty', '1 minute', '') AS hempty \gset
SELECT fenced_lock_try_acquire('args:holder-empty', '1 minute', '') = :hempty AS same_holder_same_token;

--
-- token: greater than zero. Zero, negative and the smallest bigint are
-- refused (22023), not merely "not live".
--
\set VERBOSITY default
SELECT fenced_lock_validate('args:held', 0);
\set VERBOSITY sqlstate
SELECT fenced_lock_validate('args:held', -1);
SELECT fenced_lock_validate('args:held', -9223372036854775808);
SELECT fenced_lock_assert('args:held', 0);
SELECT fenced_lock_assert('args:held', -1);
SELECT fenced_lock_assert('args:held', -9223372036854775808);
SELECT fenced_lock_renew('args:held', 0);
SELECT fenced_lock_renew('args:held', -1, '1 minute');
SELECT fenced_lock_renew('args:held', -9223372036854775808);
SELECT fenced_lock_release('args:held', 0);
SELECT fenced_lock_release('args:held', -1);
SELECT fenced_lock_release('args:held', -9223372036854775808);
-- The largest bigint is a valid token that was never issued: not live.
SELECT fenced_lock_validate('args:held', 9223372036854775807) AS live;
SELECT fenced_lock_renew('args:held', 9223372036854775807) AS renewed;
SELECT fenced_lock_release('args:held', 9223372036854775807) AS released;
SELECT fenced_lock_assert('args:held', 9223372036854775807);

-- When several arguments are bad, the first one (in argument order) is reported.
\set VERBOSITY terse
SELECT fenced_lock_renew(NULL, 0, '-1 s');
SELECT fenced_lock_renew('', 0, '-1 s');
SELECT fenced_lock_renew('args:held', 0, '-1 s');
SELECT fenced_lock_renew('args:held', NULL, '-1 s');
SELECT fenced_lock_try_acquire('', '-1 s', NULL, NULL);
SELECT fenced_lock_try_acquire('args:bad', '-1 s', NULL, NULL);
SELECT fenced_lock_acquire('args:bad', '1 minute', '-1 s', repeat('h', 513));
SELECT fenced_lock_acquire('args:bad', '1 minute', '-1 s', 'h', NULL);
\set VERBOSITY sqlstate

--
-- None of the failed calls left anything behind, and the lease we hold is
-- untouched (still live, still ours).
--
SELECT count(*) AS leases_left_by_errors FROM fenced_lock_leases
 WHERE name IN ('', 'args:bad', repeat('é', 256) || 'a', repeat('€', 171)) OR octet_length(name) > 512;
SELECT fenced_lock_validate('args:held', :t) AS held_is_live;
SELECT left(format('%L', name), 24) AS name, octet_length(name) AS bytes, live
  FROM fenced_lock_leases
 WHERE name LIKE 'args:%' OR name = ' ' OR name LIKE 'éé%' OR name LIKE '€€%'
 ORDER BY name COLLATE "C";

-- Clean up.
SELECT count(*) FILTER (WHERE fenced_lock_force_release(name)) AS force_released
  FROM fenced_lock_leases
 WHERE name LIKE 'args:%' OR name = ' ' OR name LIKE 'éé%' OR name LIKE '€€%';
