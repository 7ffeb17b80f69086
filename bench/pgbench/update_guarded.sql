-- One UPDATE per transaction on the client's own row of the guarded table,
-- under the lease acquired in advance for it (token = base + client_id).
\set tok :base + :client_id
UPDATE bench_guarded SET v = v + 1, fence_token = :tok WHERE id = :client_id;
