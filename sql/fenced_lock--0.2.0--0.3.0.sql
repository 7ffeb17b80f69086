-- fenced_lock 0.2.0 -> 0.3.0: shared leases and semaphores (several leases
-- of a name live at once), several names at once, leader election,
-- renew_all. Keeps every lease (live or not), its token, the token sequence,
-- guard triggers on user tables, the history, and every privilege granted
-- on the functions and views. Run by ALTER EXTENSION fenced_lock UPDATE.

\echo Use "ALTER EXTENSION fenced_lock UPDATE TO '0.3.0'" to load this file. \quit

-- 1. The lease table. 0.2.0's library reads one record per name (its
-- primary key is the name), so a backend still running it must never see a
-- table with several records of a name: the records move to a new table,
-- keyed by (name, token), and the old table goes. Such a backend then fails
-- cleanly ("the lease table ... is missing") instead of misjudging a name.
CREATE TABLE fenced_lock_internal.granted_leases (
    name          text COLLATE "C" NOT NULL,
    token         bigint      NOT NULL,
    holder        text,
    owner         regrole     NOT NULL,
    acquired_at   timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    ttl           interval    NOT NULL,
    session_bound boolean     NOT NULL DEFAULT false,
    shared        boolean     NOT NULL DEFAULT false,  -- a shared lease
    permits       integer     NOT NULL DEFAULT 1,      -- the semaphore's count (1: exclusive)
    pid           integer,                             -- the backend of a session-bound lease
    value         text,                                -- published with fenced_lock_proclaim
    PRIMARY KEY (name, token)
) WITH (vacuum_truncate = false);  -- never shrinks: the library remembers where records are (docs/design.md, "Objects")
CREATE INDEX granted_leases_session_bound ON fenced_lock_internal.granted_leases (token) WHERE session_bound;
CREATE INDEX granted_leases_holder ON fenced_lock_internal.granted_leases (holder) WHERE holder IS NOT NULL;
COMMENT ON TABLE fenced_lock_internal.granted_leases IS
  'one record per lease granted and not yet cleaned up; written only by the fenced_lock functions';

INSERT INTO fenced_lock_internal.granted_leases
       (name, token, holder, owner, acquired_at, expires_at, ttl, session_bound, shared, permits, pid, value)
SELECT name, token, holder, owner, acquired_at, expires_at, ttl, session_bound, false, 1, NULL, NULL
  FROM fenced_lock_internal.lease_records;
SELECT pg_catalog.pg_extension_config_dump('fenced_lock_internal.granted_leases', '');

-- 2. The history says each lease's mode; everything before 0.3.0 was exclusive.
ALTER TABLE fenced_lock_internal.lease_history
  ADD COLUMN mode    text    NOT NULL DEFAULT 'exclusive',  -- exclusive, shared, permit
  ADD COLUMN permits integer          DEFAULT 1;            -- the semaphore's count; NULL for shared

-- 3. The acquires gain `shared` and `permits`. A new signature is a new
-- function: create it, give it the privileges the old one had, drop the old one.
CREATE FUNCTION fenced_lock_try_acquire(name text, ttl interval DEFAULT '30 seconds', holder text DEFAULT NULL,
                                        session_bound boolean DEFAULT false, shared boolean DEFAULT false,
                                        permits integer DEFAULT 1)
RETURNS bigint LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_try_acquire';
COMMENT ON FUNCTION fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer) IS
  'grant a lease of name now and return its fencing token, or NULL if it cannot be granted without waiting';

CREATE FUNCTION fenced_lock_acquire(name text, ttl interval DEFAULT '30 seconds', wait interval DEFAULT NULL,
                                    holder text DEFAULT NULL, session_bound boolean DEFAULT false,
                                    shared boolean DEFAULT false, permits integer DEFAULT 1)
RETURNS bigint LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_acquire';
COMMENT ON FUNCTION fenced_lock_acquire(text, interval, interval, text, boolean, boolean, integer) IS
  'wait (FIFO, at most wait; NULL: until granted) for a lease of name and return its fencing token; 55P03 when wait runs out';

REVOKE ALL ON FUNCTION fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_acquire(text, interval, interval, text, boolean, boolean, integer) FROM PUBLIC;

DO $copy_grants$
DECLARE
    pair record;
    g record;
BEGIN
    FOR pair IN
        SELECT 'fenced_lock_try_acquire(text,interval,text,boolean)'::pg_catalog.regprocedure AS old,
               'fenced_lock_try_acquire(text,interval,text,boolean,boolean,integer)'::pg_catalog.regprocedure AS new
        UNION ALL
        SELECT 'fenced_lock_acquire(text,interval,interval,text,boolean)'::pg_catalog.regprocedure,
               'fenced_lock_acquire(text,interval,interval,text,boolean,boolean,integer)'::pg_catalog.regprocedure
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

DROP FUNCTION fenced_lock_try_acquire(text, interval, text, boolean);
DROP FUNCTION fenced_lock_acquire(text, interval, interval, text, boolean);

-- 4. Several names at once, renew_all, leader election: new, granted to nobody.
CREATE FUNCTION fenced_lock_try_acquire_all(names text[], ttl interval DEFAULT '30 seconds', holder text DEFAULT NULL,
                                            session_bound boolean DEFAULT false)
RETURNS bigint[] LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_try_acquire_all';
COMMENT ON FUNCTION fenced_lock_try_acquire_all(text[], interval, text, boolean) IS
  'grant a lease of every name now (tokens in the order of names), or none and return NULL';

CREATE FUNCTION fenced_lock_acquire_all(names text[], ttl interval DEFAULT '30 seconds', wait interval DEFAULT NULL,
                                        holder text DEFAULT NULL, session_bound boolean DEFAULT false)
RETURNS bigint[] LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_acquire_all';
COMMENT ON FUNCTION fenced_lock_acquire_all(text[], interval, interval, text, boolean) IS
  'wait (FIFO per name, at most wait in all) until a lease of every name is granted; tokens in the order of names; 55P03 grants none';

CREATE FUNCTION fenced_lock_release_all(names text[], tokens bigint[])
RETURNS integer LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_release_all';
COMMENT ON FUNCTION fenced_lock_release_all(text[], bigint[]) IS
  'release each lease tokens[i] of names[i]; how many were live and are released';

CREATE FUNCTION fenced_lock_renew_all(holder text, ttl interval DEFAULT NULL)
RETURNS integer LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_renew_all';
COMMENT ON FUNCTION fenced_lock_renew_all(text, interval) IS
  'renew every live lease of the calling role with this holder (NULL: every lease bound to this session); how many';

CREATE FUNCTION fenced_lock_leader(name text)
RETURNS TABLE (holder text, token bigint, acquired_at timestamptz, expires_at timestamptz, value text)
LANGUAGE c VOLATILE PARALLEL RESTRICTED ROWS 1 AS 'MODULE_PATHNAME', 'fl_leader';
COMMENT ON FUNCTION fenced_lock_leader(text) IS
  'the live exclusive lease of name and the value its holder proclaimed, or no row';

CREATE FUNCTION fenced_lock_proclaim(name text, token bigint, value text)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_proclaim';
COMMENT ON FUNCTION fenced_lock_proclaim(text, bigint, text) IS
  'the holder of the live exclusive lease token publishes value for fenced_lock_leader; false unless it is that holder';

REVOKE ALL ON FUNCTION fenced_lock_try_acquire_all(text[], interval, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_acquire_all(text[], interval, interval, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_release_all(text[], bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_renew_all(text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_leader(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_proclaim(text, bigint, text) FROM PUBLIC;

-- 4b. Guards a DBA can see.
CREATE FUNCTION fenced_lock_protect(tbl regclass, template text, token_column name DEFAULT 'fence_token')
RETURNS void LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_protect';
COMMENT ON FUNCTION fenced_lock_protect(regclass, text, name) IS
  'guard tbl completely: the row guard fenced_lock_guard and the TRUNCATE guard fenced_lock_guard_truncate (on each partition too)';

CREATE FUNCTION fenced_lock_unprotect(tbl regclass)
RETURNS void LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_unprotect';
COMMENT ON FUNCTION fenced_lock_unprotect(regclass) IS
  'drop exactly the triggers fenced_lock_protect created on tbl and its partitions';

REVOKE ALL ON FUNCTION fenced_lock_protect(regclass, text, name) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_unprotect(regclass) FROM PUBLIC;

-- 5. What the views call: the waiters with their mode, the counters by mode.
CREATE FUNCTION fenced_lock_internal.waiting(OUT name text, OUT pid integer, OUT holder text, OUT owner oid,
                                             OUT waiting_since timestamptz, OUT "position" integer,
                                             OUT mode text, OUT permits integer)
RETURNS SETOF record LANGUAGE c VOLATILE PARALLEL RESTRICTED AS 'MODULE_PATHNAME', 'fl_waiters_wrapper';
CREATE FUNCTION fenced_lock_internal.stats_by_mode(OUT mode text, OUT grants bigint, OUT renewals bigint,
                                                   OUT releases bigint, OUT expiries bigint, OUT force_releases bigint,
                                                   OUT session_ends bigint, OUT waits bigint, OUT wait_timeouts bigint)
RETURNS SETOF record LANGUAGE c VOLATILE PARALLEL RESTRICTED AS 'MODULE_PATHNAME', 'fl_stats_by_mode_wrapper';
GRANT EXECUTE ON FUNCTION fenced_lock_internal.waiting() TO PUBLIC;
CREATE FUNCTION fenced_lock_internal.guard_state(tbl oid, trigger oid)
RETURNS TABLE (template text, token_column text, events text[], valid boolean, problem text)
LANGUAGE c STABLE PARALLEL RESTRICTED ROWS 1 AS 'MODULE_PATHNAME', 'fl_guard_state';
CREATE FUNCTION fenced_lock_internal.check_guards()
RETURNS event_trigger LANGUAGE c AS 'MODULE_PATHNAME', 'fl_check_guards';
GRANT EXECUTE ON FUNCTION fenced_lock_internal.stats_by_mode() TO PUBLIC;
GRANT EXECUTE ON FUNCTION fenced_lock_internal.guard_state(oid, oid) TO PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_internal.check_guards() FROM PUBLIC;

-- 6. The views are replaced in place (new columns at the end), so that what
-- was granted on them stays granted.
CREATE OR REPLACE VIEW fenced_lock_leases AS
SELECT l.name,
       CASE WHEN fenced_lock_internal.may_see(l.owner) THEN l.token END AS token,
       CASE WHEN fenced_lock_internal.may_see(l.owner) THEN l.holder END AS holder,
       l.owner,
       l.acquired_at,
       l.expires_at,
       l.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
         AND (NOT l.session_bound OR fenced_lock_internal.session_alive(l.token)) AS live,
       l.session_bound,
       CASE WHEN l.shared THEN 'shared' WHEN l.permits OPERATOR(pg_catalog.>) 1 THEN 'permit'
            ELSE 'exclusive' END AS mode,
       CASE WHEN NOT l.shared THEN l.permits END AS permits,
       CASE WHEN l.session_bound AND fenced_lock_internal.may_see(l.owner)
             AND fenced_lock_internal.session_alive(l.token) THEN l.pid END AS pid
  FROM fenced_lock_internal.granted_leases l;
COMMENT ON VIEW fenced_lock_leases IS
  'one row per lease granted and not yet cleaned up; token, holder and pid shown to the owner''s members and operators only';

CREATE OR REPLACE VIEW fenced_lock_waiters AS
SELECT w.name,
       w.pid,
       CASE WHEN fenced_lock_internal.may_see(w.owner::pg_catalog.regrole) THEN w.holder END AS holder,
       w.owner::pg_catalog.regrole AS owner,
       w.waiting_since,
       w."position",
       w.mode,
       w.permits
  FROM fenced_lock_internal.waiting() w;
COMMENT ON VIEW fenced_lock_waiters IS
  'one row per waiting fenced_lock_acquire; position 1 is served next; holder shown to the owner''s members and operators only';

CREATE OR REPLACE VIEW fenced_lock_history AS
SELECT h.name,
       CASE WHEN fenced_lock_internal.may_see_name(h.owner) THEN h.token END AS token,
       CASE WHEN fenced_lock_internal.may_see_name(h.owner) THEN h.holder END AS holder,
       h.owner,
       h.session_bound,
       h.acquired_at,
       h.expires_at,
       h.ended_at,
       h.ended_by,
       h.ended_by_role,
       h.mode,
       h.permits
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
       NULL::name,
       CASE WHEN l.shared THEN 'shared' WHEN l.permits OPERATOR(pg_catalog.>) 1 THEN 'permit' ELSE 'exclusive' END,
       CASE WHEN NOT l.shared THEN l.permits END
  FROM fenced_lock_internal.granted_leases l;
COMMENT ON VIEW fenced_lock_history IS
  'one row per lease granted and not yet aged out: ended leases kept fenced_lock.history_retention, and every lease record; token and holder shown to the owner''s members and operators only';

CREATE VIEW fenced_lock_stats_by_mode AS
SELECT * FROM fenced_lock_internal.stats_by_mode();
COMMENT ON VIEW fenced_lock_stats_by_mode IS
  'the lease counters since server start, one row per mode; NULL unless fenced_lock is in shared_preload_libraries';

REVOKE ALL ON fenced_lock_stats_by_mode FROM PUBLIC;

CREATE VIEW fenced_lock_guards AS
SELECT t.tgrelid::pg_catalog.regclass AS "table",
       t.tgname AS "trigger",
       g.template,
       g.token_column,
       g.events,
       g.valid,
       g.problem
  FROM pg_catalog.pg_trigger t
  JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) t.tgfoid
 CROSS JOIN LATERAL fenced_lock_internal.guard_state(t.tgrelid, t.oid) g
 WHERE p.prosrc OPERATOR(pg_catalog.=) 'fl_guard'
   AND pg_catalog.has_table_privilege(t.tgrelid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER');
COMMENT ON VIEW fenced_lock_guards IS
  'one row per guard trigger of a table the querying role has a privilege on, with what it covers and what is wrong with it';

REVOKE ALL ON fenced_lock_guards FROM PUBLIC;

-- Attach-time validation: a guard that could never work is refused when it
-- is created, with the error its first write would raise; so is an ALTER
-- TABLE that breaks one (dropping, renaming or retyping a column it names).
-- It fires only for these three tags, so other DDL costs nothing.
CREATE EVENT TRIGGER fenced_lock_check_guards ON ddl_command_end
  WHEN TAG IN ('CREATE TRIGGER', 'ALTER TABLE', 'CREATE TABLE')
  EXECUTE FUNCTION fenced_lock_internal.check_guards();

-- 7. What nothing refers to any more goes last.
DROP FUNCTION fenced_lock_internal.waiters();
ALTER EXTENSION fenced_lock DROP TABLE fenced_lock_internal.lease_records;
DROP TABLE fenced_lock_internal.lease_records;
