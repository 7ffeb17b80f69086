-- try_acquire + release of a name never seen before, among the pre-filled
-- live leases (the release keeps the number of records constant).
\set n random(1, 1000000000000)
SELECT fenced_lock_try_acquire('new:' || :n, '30 s') AS tok \gset
SELECT fenced_lock_release('new:' || :n, :tok);
