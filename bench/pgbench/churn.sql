-- Churn: grants of ever new names with a 1 s ttl, never released, left to expire.
\set n random(1, 1000000000000)
SELECT fenced_lock_try_acquire('churn:' || :n, '1 s');
