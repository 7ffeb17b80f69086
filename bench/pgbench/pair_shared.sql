-- Shared lease pair (0.3.0): try_acquire(shared => true) + release of one of
-- the client's own 1000 names; the same checks as pair_fenced.sql.
\set n random(1, 1000)
SELECT fenced_lock_try_acquire('pair:' || :client_id || ':' || :n, '30 s', shared => true) AS tok \gset
SELECT fenced_lock_release('pair:' || :client_id || ':' || :n, :tok) AS ok \gset
\if :ok
\else
\set refused 1 / 0
\endif
