-- Helpers shared by every spec in specs/. scripts/test-isolation.sh loads
-- this file once into the test database, after CREATE EXTENSION fenced_lock
-- and before the first spec runs. Specs create only their own tables and
-- data, and end each permutation with CALL iso_reset(...).
-- (Conventions: tests/isolation/README.md.)

-- Tokens differ from run to run, so specs keep them here, one row per
-- owner ('a', 'b', ...), and print comparisons, never the numbers.
CREATE TABLE iso_tokens (who text PRIMARY KEY, token bigint);

-- iso_try(sql): run the statement and return 'ok', or 'SQLSTATE: message'
-- with every token of iso_tokens replaced by its owner (<a>, <b>), a token
-- the caller's snapshot cannot see by <not in snapshot>, and "N ms" for
-- waited times. isolationtester itself prints only "ERROR:  message",
-- without the SQLSTATE. The error is caught in a subtransaction (a PL/pgSQL
-- exception block).
CREATE FUNCTION iso_try(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  msg text;
  t record;
BEGIN
  EXECUTE q;
  RETURN 'ok';
EXCEPTION WHEN OTHERS OR query_canceled THEN
  msg := SQLERRM;
  FOR t IN SELECT who, token FROM iso_tokens WHERE token IS NOT NULL LOOP
    msg := regexp_replace(msg, '((token|lease)( is)? )' || t.token || '\M', '\1<' || t.who || '>', 'g');
  END LOOP;
  msg := regexp_replace(msg, '((token|lease)( is)? )\d+', '\1<not in snapshot>', 'g');
  RETURN SQLSTATE || ': ' || regexp_replace(msg, '\d+ ms', 'N ms', 'g');
END $$;

-- iso_await(who, place): wait (at most 10 s) until session `who` (its
-- application_name) waits in fenced_lock_acquire: 'head' = holds the name's
-- queue lock and sleeps on its latch; 'in line' = waits for the queue lock.
-- Queue locks are advisory locks with classid 0x464C0002 = 1179385858
-- (docs/design.md, "Lock protocol").
CREATE FUNCTION iso_await(who text, place text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..1000 LOOP
    PERFORM pg_stat_clear_snapshot();
    IF EXISTS (SELECT FROM pg_stat_activity s JOIN pg_locks l USING (pid)
               WHERE s.datname = current_database() AND s.application_name = who
                 AND l.locktype = 'advisory' AND l.classid = 1179385858
                 AND (place = 'head' AND l.granted AND s.wait_event_type = 'Extension'
                      OR place = 'in line' AND NOT l.granted)) THEN
      RETURN who || ' waits ' || CASE place WHEN 'head' THEN 'at the head of the line' ELSE 'in line' END;
    END IF;
    PERFORM pg_sleep(0.01);
  END LOOP;
  RAISE EXCEPTION 'session % is not waiting (%)', who, place;
END $$;

-- iso_until(condition): wait (at most 10 s) until the SQL boolean
-- expression is true, reading the latest committed state each time; returns
-- true, or fails naming the condition.
CREATE FUNCTION iso_until(condition text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  ok boolean;
BEGIN
  FOR i IN 1..1000 LOOP
    PERFORM pg_stat_clear_snapshot();
    EXECUTE 'SELECT ' || condition INTO ok;
    IF ok THEN
      RETURN true;
    END IF;
    PERFORM pg_sleep(0.01);
  END LOOP;
  RAISE EXCEPTION 'still not true after 10 s: %', condition;
END $$;

-- iso_fenced_locks(): how many of fenced_lock's name, queue and lease locks
-- (classid 0x464C0001, 0x464C0002; objsubid 0x464E) anyone holds or awaits
-- right now; 0 once every transition, wait and guarded write is over.
CREATE FUNCTION iso_fenced_locks() RETURNS bigint LANGUAGE sql AS $$
  SELECT count(*) FROM pg_locks
   WHERE locktype = 'advisory' AND (classid IN (1179385857, 1179385858) OR objsubid = 17998)
$$;

-- iso_reset(names...): end of a permutation: forget its tokens and end every
-- lease of the given names, so that the next permutation starts afresh.
CREATE PROCEDURE iso_reset(VARIADIC names text[]) LANGUAGE plpgsql AS $$
BEGIN
  TRUNCATE iso_tokens;
  PERFORM fenced_lock_force_release(n) FROM unnest(names) AS n;
END $$;
