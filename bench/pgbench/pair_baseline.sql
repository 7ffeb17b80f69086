-- The hand-written PL/pgSQL lease table (bench/baseline_plpgsql.sql), same shape.
\set n random(1, 1000)
SELECT plpgsql_lease.try_acquire('pair:' || :client_id || ':' || :n, '30 s') AS tok \gset
SELECT plpgsql_lease.release('pair:' || :client_id || ':' || :n, :tok);
