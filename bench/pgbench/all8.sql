-- acquire_all of 8 names (0.3.0), then release_all; the checks of all2.sql.
\set n random(1, 1000)
SELECT fenced_lock_try_acquire_all(ARRAY[
    'all:' || :client_id || ':' || :n || ':1',
    'all:' || :client_id || ':' || :n || ':2',
    'all:' || :client_id || ':' || :n || ':3',
    'all:' || :client_id || ':' || :n || ':4',
    'all:' || :client_id || ':' || :n || ':5',
    'all:' || :client_id || ':' || :n || ':6',
    'all:' || :client_id || ':' || :n || ':7',
    'all:' || :client_id || ':' || :n || ':8'], '30 s') AS toks \gset
SELECT fenced_lock_release_all(ARRAY[
    'all:' || :client_id || ':' || :n || ':1',
    'all:' || :client_id || ':' || :n || ':2',
    'all:' || :client_id || ':' || :n || ':3',
    'all:' || :client_id || ':' || :n || ':4',
    'all:' || :client_id || ':' || :n || ':5',
    'all:' || :client_id || ':' || :n || ':6',
    'all:' || :client_id || ':' || :n || ':7',
    'all:' || :client_id || ':' || :n || ':8'], :toks) AS released \gset
\if :released = 8
\else
\set refused 1 / 0
\endif
