-- The same UPDATE on the same table with a no-op C row trigger
-- (noop_trigger.c): what any row trigger costs.
\set tok :base + :client_id
UPDATE bench_noop SET v = v + 1, fence_token = :tok WHERE id = :client_id;
