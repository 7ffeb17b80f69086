-- Floor, one durable commit: the row is inserted and flushed (the session
-- runs with synchronous_commit off, through PGOPTIONS; the statement turns it
-- on for its own transaction), then deleted in a commit that is not waited
-- for. A DELETE that missed its row fails the next INSERT of that name
-- (duplicate key), which aborts the client.
\set n random(1, 1000)
INSERT INTO bench_floor (name, token)
  SELECT 'pair:' || :client_id || ':' || :n, 1 FROM (SELECT set_config('synchronous_commit', 'on', true)) durable;
DELETE FROM bench_floor WHERE name = 'pair:' || :client_id || ':' || :n;
