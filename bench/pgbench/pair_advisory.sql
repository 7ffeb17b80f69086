-- Session advisory lock and unlock of (client, n): in memory, for scale.
\set n random(1, 1000)
SELECT pg_advisory_lock(:client_id, :n);
SELECT pg_advisory_unlock(:client_id, :n) AS ok \gset
\if :ok
\else
\set refused 1 / 0
\endif
