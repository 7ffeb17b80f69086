-- Semaphore permit pair (0.3.0): every client takes one of 8 permits of the
-- same name, each with its own token, and gives it back.
SELECT fenced_lock_acquire('permits', '30 s', '10 s', permits => 8) AS tok \gset
SELECT fenced_lock_release('permits', :tok) AS ok \gset
\if :ok
\else
\set refused 1 / 0
\endif
