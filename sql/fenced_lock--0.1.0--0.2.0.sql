-- fenced_lock 0.1.0 -> 0.2.0: session-bound leases, lease history, waiters
-- and counters views. Keeps every lease (live or not), its token, the token
-- sequence, guard triggers on user tables, and every privilege granted on
-- the functions and the view. Run by ALTER EXTENSION fenced_lock UPDATE.

\echo Use "ALTER EXTENSION fenced_lock UPDATE TO '0.2.0'" to load this file. \quit

-- 1. The lease table. 0.1.0's library reads a lease row into seven slots,
-- so a backend still running it must never see a row with more columns:
-- the records move to a new table (with the new column), and the old table
-- goes. Such a backend then fails cleanly ("the lease table ... is
-- missing") instead of misreading a row.
CREATE TABLE fenced_lock_internal.lease_records (
    name          text COLLATE "C" PRIMARY KEY,
    token         bigint      NOT NULL,
    holder        text,
    owner         regrole     NOT NULL,
    acquired_at   timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    ttl           interval    NOT NULL,
    session_bound boolean     NOT NULL DEFAULT false
) WITH (vacuum_truncate = false);  -- never shrinks: the library remembers where records are (docs/design.md, "Objects")
CREATE INDEX lease_records_expires_at ON fenced_lock_internal.lease_records (expires_at);
CREATE INDEX lease_records_session_bound ON fenced_lock_internal.lease_records (name) WHERE session_bound;
COMMENT ON TABLE fenced_lock_internal.lease_records IS
  'one record per lock name with a lease; written only by the fenced_lock functions';
INSERT INTO fenced_lock_internal.lease_records (name, token, holder, owner, acquired_at, expires_at, ttl, session_bound)
SELECT name, token, holder, owner, acquired_at, expires_at, ttl, false
  FROM fenced_lock_internal.leases;

-- 2. The history of ended leases starts empty; the leases of step 1 show
-- in fenced_lock_history from their records.
CREATE TABLE fenced_lock_internal.lease_history (
    token         bigint PRIMARY KEY,
    name          text COLLATE "C" NOT NULL,
    holder        text,
    owner         name        NOT NULL,
    session_bound boolean     NOT NULL,
    acquired_at   timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    ended_at      timestamptz NOT NULL,
    ended_by      text        NOT NULL,  -- release, expiry, force_release, session_end
    ended_by_role name
);
CREATE INDEX lease_history_ended_at ON fenced_lock_internal.lease_history (ended_at);
CREATE INDEX lease_history_name ON fenced_lock_internal.lease_history (name, token);
COMMENT ON TABLE fenced_lock_internal.lease_history IS
  'one row per lease that has ended, written in the transaction that ended it; written only by the fenced_lock functions';
SELECT pg_catalog.pg_extension_config_dump('fenced_lock_internal.lease_records', '');
SELECT pg_catalog.pg_extension_config_dump('fenced_lock_internal.lease_history', '');

-- 3. The acquires gain `session_bound`. A new signature is a new function:
-- create it, give it the privileges the old one had, drop the old one.
CREATE FUNCTION fenced_lock_try_acquire(name text, ttl interval DEFAULT '30 seconds', holder text DEFAULT NULL,
                                        session_bound boolean DEFAULT false)
RETURNS bigint LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_try_acquire';
COMMENT ON FUNCTION fenced_lock_try_acquire(text, interval, text, boolean) IS
  'grant a lease of name now and return its fencing token, or NULL if it cannot be granted without waiting';

CREATE FUNCTION fenced_lock_acquire(name text, ttl interval DEFAULT '30 seconds', wait interval DEFAULT NULL,
                                    holder text DEFAULT NULL, session_bound boolean DEFAULT false)
RETURNS bigint LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_acquire';
COMMENT ON FUNCTION fenced_lock_acquire(text, interval, interval, text, boolean) IS
  'wait (FIFO, at most wait; NULL: until granted) for a lease of name and return its fencing token; 55P03 when wait runs out';

REVOKE ALL ON FUNCTION fenced_lock_try_acquire(text, interval, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_acquire(text, interval, interval, text, boolean) FROM PUBLIC;

DO $copy_grants$
DECLARE
    pair record;
    g record;
BEGIN
    FOR pair IN
        SELECT 'fenced_lock_try_acquire(text,interval,text)'::pg_catalog.regprocedure AS old,
               'fenced_lock_try_acquire(text,interval,text,boolean)'::pg_catalog.regprocedure AS new
        UNION ALL
        SELECT 'fenced_lock_acquire(text,interval,interval,text)'::pg_catalog.regprocedure,
               'fenced_lock_acquire(text,interval,interval,text,boolean)'::pg_catalog.regprocedure
    LOOP
        FOR g IN
            SELECT a.grantee, a.is_grantable
              FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
             WHERE p.oid = pair.old AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
        LOOP
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s',
                pair.new,
                CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                     ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END,
                CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
    END LOOP;
END
$copy_grants$;

DROP FUNCTION fenced_lock_try_acquire(text, interval, text);
DROP FUNCTION fenced_lock_acquire(text, interval, interval, text);

-- 4. What the views call.
CREATE FUNCTION fenced_lock_internal.may_see_name(owner name)
RETURNS boolean LANGUAGE c STABLE PARALLEL SAFE AS 'MODULE_PATHNAME', 'fl_may_see_name';
CREATE FUNCTION fenced_lock_internal.session_alive(token bigint)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL RESTRICTED AS 'MODULE_PATHNAME', 'fl_session_alive';
CREATE FUNCTION fenced_lock_internal.waiters(OUT name text, OUT pid integer, OUT holder text, OUT owner oid,
                                             OUT waiting_since timestamptz, OUT "position" integer)
RETURNS SETOF record LANGUAGE c VOLATILE PARALLEL RESTRICTED AS 'MODULE_PATHNAME', 'fl_waiters_wrapper';
CREATE FUNCTION fenced_lock_internal.stats(OUT grants bigint, OUT renewals bigint, OUT releases bigint,
                                           OUT expiries bigint, OUT force_releases bigint, OUT session_ends bigint,
                                           OUT waits bigint, OUT wait_timeouts bigint, OUT fence_rejections bigint,
                                           OUT missing_tokens bigint, OUT preloaded boolean)
RETURNS SETOF record LANGUAGE c VOLATILE PARALLEL RESTRICTED AS 'MODULE_PATHNAME', 'fl_stats_wrapper';
GRANT EXECUTE ON FUNCTION fenced_lock_internal.may_see_name(name) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fenced_lock_internal.session_alive(bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fenced_lock_internal.waiters() TO PUBLIC;
GRANT EXECUTE ON FUNCTION fenced_lock_internal.stats() TO PUBLIC;

-- 5. The views. fenced_lock_leases is replaced in place (a new column at the
-- end), so that what was granted on it stays granted.
CREATE OR REPLACE VIEW fenced_lock_leases AS
SELECT l.name,
       CASE WHEN fenced_lock_internal.may_see(l.owner) THEN l.token END AS token,
       CASE WHEN fenced_lock_internal.may_see(l.owner) THEN l.holder END AS holder,
       l.owner,
       l.acquired_at,
       l.expires_at,
       l.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
         AND (NOT l.session_bound OR fenced_lock_internal.session_alive(l.token)) AS live,
       l.session_bound
  FROM fenced_lock_internal.lease_records l;

CREATE VIEW fenced_lock_waiters AS
SELECT w.name,
       w.pid,
       CASE WHEN fenced_lock_internal.may_see(w.owner::pg_catalog.regrole) THEN w.holder END AS holder,
       w.owner::pg_catalog.regrole AS owner,
       w.waiting_since,
       w."position"
  FROM fenced_lock_internal.waiters() w;
COMMENT ON VIEW fenced_lock_waiters IS
  'one row per waiting fenced_lock_acquire; position 1 is served next; holder shown to the owner''s members and operators only';

CREATE VIEW fenced_lock_history AS
SELECT h.name,
       CASE WHEN fenced_lock_internal.may_see_name(h.owner) THEN h.token END AS token,
       CASE WHEN fenced_lock_internal.may_see_name(h.owner) THEN h.holder END AS holder,
       h.owner,
       h.session_bound,
       h.acquired_at,
       h.expires_at,
       h.ended_at,
       h.ended_by,
       h.ended_by_role
  FROM fenced_lock_internal.lease_history h
UNION ALL
SELECT l.name,
       CASE WHEN fenced_lock_internal.may_see(l.owner) THEN l.token END,
       CASE WHEN fenced_lock_internal.may_see(l.owner) THEN l.holder END,
       pg_catalog.pg_get_userbyid(l.owner::pg_catalog.oid),
       l.session_bound,
       l.acquired_at,
       l.expires_at,
       NULL::timestamptz,
       NULL::text,
       NULL::name
  FROM fenced_lock_internal.lease_records l;
COMMENT ON VIEW fenced_lock_history IS
  'one row per lease granted and not yet aged out: ended leases kept fenced_lock.history_retention, and every lease record; token and holder shown to the owner''s members and operators only';

CREATE VIEW fenced_lock_stats AS
SELECT * FROM fenced_lock_internal.stats();
COMMENT ON VIEW fenced_lock_stats IS
  'counters since server start; NULL unless fenced_lock is in shared_preload_libraries';

REVOKE ALL ON fenced_lock_waiters, fenced_lock_history, fenced_lock_stats FROM PUBLIC;

-- 6. The old table goes last, once nothing refers to it.
ALTER EXTENSION fenced_lock DROP TABLE fenced_lock_internal.leases;
DROP TABLE fenced_lock_internal.leases;
