-- fenced_lock: try_acquire + release, each its own transaction.
-- Names from a per-client pool, so clients never contend.
\set n random(1, 1000)
SELECT fenced_lock_try_acquire('pair:' || :client_id || ':' || :n, '30 s') AS tok \gset
SELECT fenced_lock_release('pair:' || :client_id || ':' || :n, :tok);
