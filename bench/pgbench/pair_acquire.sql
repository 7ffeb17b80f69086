-- Exclusive pair with fenced_lock_acquire on the client's own name: the
-- counterpart of pair_permit.sql, 8 clients on 8 names instead of 8 permits
-- of one. A wait that ran out (NULL) or a refused release aborts the client.
SELECT fenced_lock_acquire('permit:' || :client_id, '30 s', '10 s') AS tok \gset
SELECT fenced_lock_release('permit:' || :client_id, :tok) AS ok \gset
\if :ok
\else
\set refused 1 / 0
\endif
