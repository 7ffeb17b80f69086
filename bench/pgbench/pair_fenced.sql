-- Lock + unlock pair: try_acquire + release of one of the client's own 1000
-- names, each call its own transaction. A NULL token (not granted) reaches
-- the release as '' and fails its bigint parameter; a refused release fails
-- the \set below. Either aborts the client, and benchlib fails the run.
\set n random(1, 1000)
SELECT fenced_lock_try_acquire('pair:' || :client_id || ':' || :n, '30 s') AS tok \gset
SELECT fenced_lock_release('pair:' || :client_id || ':' || :n, :tok) AS ok \gset
\if :ok
\else
\set refused 1 / 0
\endif
