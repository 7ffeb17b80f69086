-- Install the extension; every later file uses it.
CREATE EXTENSION fenced_lock;
\dx fenced_lock

-- What several files share, defined once here.
-- dblink: a second session, standing in for another client.
CREATE EXTENSION dblink;
-- regress_conninfo(): a connection string to this database, as the session user.
CREATE FUNCTION regress_conninfo() RETURNS text LANGUAGE sql AS $$
  SELECT format('host=%s port=%s dbname=%s user=%s',
                coalesce(host(inet_server_addr()), split_part(current_setting('unix_socket_directories'), ',', 1)),
                current_setting('port'), current_database(), session_user)
$$;
-- regress_until(condition): wait (at most 10 s) until the SQL boolean
-- expression is true, reading the latest committed state each time; true,
-- or an error naming the condition.
CREATE FUNCTION regress_until(condition text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  ok boolean;
BEGIN
  FOR i IN 1..1000 LOOP
    EXECUTE 'SELECT ' || condition INTO ok;
    IF ok THEN
      RETURN true;
    END IF;
    PERFORM pg_sleep(0.01);
  END LOOP;
  RAISE EXCEPTION 'still not true after 10 s: %', condition;
END $$;
