-- The SQL API end to end, as one client uses it: acquire a lease and get a
-- fencing token, see others refused, retry safely, validate, renew, release,
-- and take over a lease that expired. Tokens and times differ from run to
-- run, so this file prints comparisons of them, never their values.
\set VERBOSITY sqlstate

-- A lock name is any non-empty text. Nothing holds "walk:orders" yet.
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name LIKE 'walk:%';
SELECT fenced_lock_validate('walk:orders', 1) AS token_1_is_live;

-- try_acquire grants a lease at once and returns its fencing token (> 0).
SELECT fenced_lock_try_acquire('walk:orders', '10 minutes', holder => 'worker-a') AS t1 \gset
SELECT :t1 > 0 AS token_is_positive;

-- The view shows one row per lease (here the only one of its name). The ttl asked for is
-- expires_at - acquired_at.
SELECT name, token = :t1 AS is_t1, holder, owner, expires_at - acquired_at AS ttl, live
  FROM fenced_lock_leases WHERE name LIKE 'walk:%';

-- Another holder is refused: try_acquire returns NULL, it never waits for the lease.
SELECT fenced_lock_try_acquire('walk:orders', '30 seconds', 'worker-b') IS NULL AS refused;
-- So is a caller without a holder: a NULL holder never matches.
SELECT fenced_lock_try_acquire('walk:orders') IS NULL AS refused;

-- The same holder asking again (say it lost the reply) gets the same token
-- back, and the lease is extended: it now ends ttl from now.
SELECT expires_at AS e1 FROM fenced_lock_leases WHERE name = 'walk:orders' \gset
SELECT pg_sleep(0.01);
SELECT fenced_lock_try_acquire('walk:orders', '10 minutes', 'worker-a') = :t1 AS same_token;
SELECT expires_at > :'e1' AS extended FROM fenced_lock_leases WHERE name = 'walk:orders';

-- validate: is this token the live lease of this name right now?
SELECT fenced_lock_validate('walk:orders', :t1) AS t1_is_live;
SELECT fenced_lock_validate('walk:orders', :t1 + 1) AS other_token_is_live;
SELECT fenced_lock_validate('walk:elsewhere', :t1) AS t1_is_live_for_another_name;

-- assert is validate that raises FL001 instead of returning false.
SELECT fenced_lock_assert('walk:orders', :t1);
SELECT fenced_lock_assert('walk:orders', :t1 + 1);

-- renew without a ttl extends the lease by its ttl (10 minutes here) from now.
-- The token stays.
SELECT expires_at AS e2 FROM fenced_lock_leases WHERE name = 'walk:orders' \gset
SELECT pg_sleep(0.01);
SELECT fenced_lock_renew('walk:orders', :t1) AS renewed;
SELECT expires_at > :'e2' AS extended,
       expires_at - clock_timestamp() BETWEEN '9 minutes' AND '10 minutes' AS ends_in_10_minutes
  FROM fenced_lock_leases WHERE name = 'walk:orders';
-- renew with a ttl: the lease now ends that ttl from now (earlier, here).
SELECT fenced_lock_renew('walk:orders', :t1, '1 minute') AS renewed;
SELECT expires_at - clock_timestamp() BETWEEN '50 seconds' AND '1 minute' AS ends_in_1_minute
  FROM fenced_lock_leases WHERE name = 'walk:orders';
-- renew without a ttl again: the ttl the lease was granted with (10 minutes),
-- not the one the last renew used.
SELECT fenced_lock_renew('walk:orders', :t1) AS renewed;
SELECT expires_at - clock_timestamp() BETWEEN '9 minutes' AND '10 minutes' AS ends_in_10_minutes_again
  FROM fenced_lock_leases WHERE name = 'walk:orders';
-- Renewing a token that is not the live lease returns false and changes nothing.
SELECT fenced_lock_renew('walk:orders', :t1 + 1) AS renewed;
SELECT fenced_lock_validate('walk:orders', :t1) AS t1_still_live;

-- release ends the lease and removes its record; a second release is false.
SELECT fenced_lock_release('walk:orders', :t1) AS released;
SELECT fenced_lock_release('walk:orders', :t1) AS released_again;
SELECT fenced_lock_validate('walk:orders', :t1) AS t1_is_live;
SELECT fenced_lock_renew('walk:orders', :t1) AS renewed_after_release;
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name = 'walk:orders';

-- The next grant, for any name, gets a larger token than every earlier one.
SELECT fenced_lock_try_acquire('walk:orders', '50 ms', 'worker-a') AS t2 \gset
SELECT :t2 > :t1 AS t2_above_t1;

-- Expiry. Nobody renews t2; 50 ms later it is no longer live, by the server's clock.
SELECT pg_sleep(0.1);
SELECT fenced_lock_validate('walk:orders', :t2) AS t2_is_live;
-- The expired record stays visible, with live = false, until it is reaped or replaced.
SELECT name, token = :t2 AS is_t2, holder, live
  FROM fenced_lock_leases WHERE name = 'walk:orders';
-- An expired lease is never revived: not by renew, not by release...
SELECT fenced_lock_renew('walk:orders', :t2, '1 minute') AS renewed;
SELECT fenced_lock_release('walk:orders', :t2) AS released;
SELECT fenced_lock_validate('walk:orders', :t2) AS t2_is_live;

-- ...and anyone may take the name over: a new lease with a larger token.
SELECT fenced_lock_try_acquire('walk:orders', '30 seconds', 'worker-b') AS t3 \gset
SELECT :t3 > :t2 AS t3_above_t2;
SELECT fenced_lock_validate('walk:orders', :t2) AS t2_is_live,
       fenced_lock_validate('walk:orders', :t3) AS t3_is_live;
SELECT name, token = :t3 AS is_t3, holder, expires_at - acquired_at AS ttl, live
  FROM fenced_lock_leases WHERE name = 'walk:orders';
-- The old holder asking again with its holder id gets a NEW lease only when
-- the name is free; here worker-b holds it, so worker-a is refused.
SELECT fenced_lock_try_acquire('walk:orders', '30 seconds', 'worker-a') IS NULL AS refused;
-- The stale holder's assert now fails with FL001: it lost the lock.
SELECT fenced_lock_assert('walk:orders', :t2);

-- fenced_lock_acquire waits for the lock. With wait => '0' it gives up at
-- once with 55P03; with a NULL wait (the default) it waits until granted.
SELECT fenced_lock_acquire('walk:orders', wait => '0');
SELECT fenced_lock_acquire('walk:orders', wait => '20 ms', holder => 'worker-c');
-- On a free name it returns at once, like try_acquire.
SELECT fenced_lock_acquire('walk:invoices', '30 seconds') AS t4 \gset
SELECT :t4 > :t3 AS t4_above_t3;
-- The same holder retrying through acquire gets its token back too.
SELECT fenced_lock_acquire('walk:orders', '30 seconds', holder => 'worker-b') = :t3 AS same_token;
-- A waiter is granted the lock when the lease expires: shorten t3's lease
-- to 200 ms, then wait (at most 10 s) for it.
SELECT fenced_lock_renew('walk:orders', :t3, '200 ms') AS renewed;
SELECT fenced_lock_acquire('walk:orders', '30 seconds', wait => '10 seconds', holder => 'worker-c') AS t5 \gset
SELECT :t5 > :t4 AS t5_above_t4, fenced_lock_validate('walk:orders', :t5) AS t5_is_live;

-- An acquire never waits for a lease of its own session: this session holds
-- a lease of walk:self without a holder, so asking again without one could
-- only be granted once that lease ends. It fails at once (FL003) instead of
-- waiting for itself. (A lease with a holder belongs to its holder, who gets
-- its token back; another holder simply waits.)
SELECT fenced_lock_try_acquire('walk:self', '30 seconds') AS tself \gset
SELECT fenced_lock_acquire('walk:self', '30 seconds', wait => '1 hour');
SELECT fenced_lock_release('walk:self', :tself) AS released;

-- Lock names are compared byte for byte: case, spaces and unicode all count.
SELECT fenced_lock_try_acquire('walk:Orders') IS NOT NULL AS granted;
SELECT fenced_lock_try_acquire('walk:orders ') IS NOT NULL AS granted;
SELECT fenced_lock_try_acquire('walk:ördërs') IS NOT NULL AS granted;

SELECT format('%L', name) AS name, holder, live
  FROM fenced_lock_leases WHERE name LIKE 'walk:%' ORDER BY name COLLATE "C";

-- Clean up: release what is still held.
SELECT fenced_lock_release('walk:orders', :t5) AS released,
       fenced_lock_release('walk:invoices', :t4) AS released;
SELECT fenced_lock_force_release(name) FROM fenced_lock_leases
 WHERE name IN ('walk:Orders', 'walk:orders ', 'walk:ördërs') ORDER BY name COLLATE "C";
SELECT count(*) AS leases FROM fenced_lock_leases WHERE name LIKE 'walk:%';
