-- The floor: two minimal durable single-row commits (insert a row, delete it).
\set n random(1, 1000)
INSERT INTO bench_floor (name, token) VALUES ('pair:' || :client_id || ':' || :n, 1);
DELETE FROM bench_floor WHERE name = 'pair:' || :client_id || ':' || :n;
