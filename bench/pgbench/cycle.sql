-- The whole cycle, three transactions: acquire, one guarded write, release.
SELECT fenced_lock_try_acquire('cycle:' || :client_id, '30 s') AS tok \gset
UPDATE bench_cycle SET v = v + 1, fence_token = :tok WHERE id = :client_id;
SELECT fenced_lock_release('cycle:' || :client_id, :tok);
