-- acquire_all of 2 names (0.3.0), all or nothing, then release_all: both
-- must be given back. A NULL (not all granted) fails release_all's bigint[]
-- parameter; a count other than 2 fails the \set. Either aborts the client.
\set n random(1, 1000)
SELECT fenced_lock_try_acquire_all(ARRAY['all:' || :client_id || ':' || :n || ':1',
                                         'all:' || :client_id || ':' || :n || ':2'], '30 s') AS toks \gset
SELECT fenced_lock_release_all(ARRAY['all:' || :client_id || ':' || :n || ':1',
                                     'all:' || :client_id || ':' || :n || ':2'], :toks) AS released \gset
\if :released = 2
\else
\set refused 1 / 0
\endif
