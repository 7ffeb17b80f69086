-- The same pair on the hand-written PL/pgSQL lease table (baseline_plpgsql.sql).
\set n random(1, 1000)
SELECT plpgsql_lease.try_acquire('pair:' || :client_id || ':' || :n, '30 s') AS tok \gset
SELECT plpgsql_lease.release('pair:' || :client_id || ':' || :n, :tok) AS ok \gset
\if :ok
\else
\set refused 1 / 0
\endif
