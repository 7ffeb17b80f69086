-- Floor, two durable commits: insert the row, delete it, both flushed.
\set n random(1, 1000)
INSERT INTO bench_floor (name, token) VALUES ('pair:' || :client_id || ':' || :n, 1);
DELETE FROM bench_floor WHERE name = 'pair:' || :client_id || ':' || :n;
