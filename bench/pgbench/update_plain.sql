-- The same UPDATE on the same table without the guard trigger.
\set tok :base + :client_id
UPDATE bench_plain SET v = v + 1, fence_token = :tok WHERE id = :client_id;
