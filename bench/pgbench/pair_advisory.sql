-- For scale: session advisory lock + unlock (in memory, nothing durable).
\set n random(1, 1000)
SELECT pg_advisory_lock(:client_id, :n);
SELECT pg_advisory_unlock(:client_id, :n);
