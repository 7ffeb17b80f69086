-- fenced_lock: leased named locks with fencing tokens (the install script of
-- the current version; sql/fenced_lock--A--B.sql update older installations
-- to it, and a test checks that both routes give the same objects).
--
-- Lease state lives in the private schema fenced_lock_internal, which ordinary
-- roles cannot use at all; they reach it only through the functions below,
-- which check who is calling (docs/design.md, "Objects" and "Security").

CREATE SCHEMA fenced_lock_internal;
REVOKE ALL ON SCHEMA fenced_lock_internal FROM PUBLIC;
COMMENT ON SCHEMA fenced_lock_internal IS 'fenced_lock private state: do not write directly';

-- Tokens: epoch (timeline - 1) in bits 47..62, a counter below (docs/design.md, "Tokens").
CREATE SEQUENCE fenced_lock_internal.token_seq AS bigint MINVALUE 1 NO CYCLE;

-- One record per lease granted and not yet cleaned up (live, or ended and
-- not yet reaped), keyed by (name, token): a name has one record per live
-- lease, several for shared leases and semaphore permits. 0.1.0 called the
-- table `leases` and 0.2.0 `lease_records` (one record per name); see the
-- update scripts. No CHECK constraints here or on the history: the
-- functions are the only writers and check every value first, and
-- PostgreSQL would re-read each constraint's expression on every write
-- they make (docs/design.md, "Speed").
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

-- One row per lease that has ended, written by the transaction that ended it
-- and kept fenced_lock.history_retention; leases that have not ended are their
-- records (the view shows both). Roles are kept by name: a log outlives the
-- roles it mentions.
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
    ended_by_role name,
    mode          text        NOT NULL DEFAULT 'exclusive',  -- exclusive, shared, permit
    permits       integer              DEFAULT 1             -- the semaphore's count; NULL for shared
);
CREATE INDEX lease_history_ended_at ON fenced_lock_internal.lease_history (ended_at);
CREATE INDEX lease_history_name ON fenced_lock_internal.lease_history (name, token);
COMMENT ON TABLE fenced_lock_internal.lease_history IS
  'one row per lease that has ended, written in the transaction that ended it; written only by the fenced_lock functions';

-- pg_dump keeps lease records, the history and the sequence position.
SELECT pg_catalog.pg_extension_config_dump('fenced_lock_internal.granted_leases', '');
SELECT pg_catalog.pg_extension_config_dump('fenced_lock_internal.lease_history', '');
SELECT pg_catalog.pg_extension_config_dump('fenced_lock_internal.token_seq', '');

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

CREATE FUNCTION fenced_lock_renew(name text, token bigint, ttl interval DEFAULT NULL)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_renew';
COMMENT ON FUNCTION fenced_lock_renew(text, bigint, interval) IS
  'extend the live lease token of name to now + ttl (NULL: its own ttl); false if it is not live';

CREATE FUNCTION fenced_lock_release(name text, token bigint)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_release';
COMMENT ON FUNCTION fenced_lock_release(text, bigint) IS
  'end the live lease token of name; false if it was not live';

CREATE FUNCTION fenced_lock_validate(name text, token bigint)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_validate';
COMMENT ON FUNCTION fenced_lock_validate(text, bigint) IS
  'is token the live lease of name right now';

CREATE FUNCTION fenced_lock_assert(name text, token bigint)
RETURNS void LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_assert';
COMMENT ON FUNCTION fenced_lock_assert(text, bigint) IS
  'raise FL001 unless token is the live lease of name; ordered with lease changes like the guard';

CREATE FUNCTION fenced_lock_force_release(name text)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_force_release';
COMMENT ON FUNCTION fenced_lock_force_release(text) IS
  'operators only: end whatever lease of name is live';

CREATE FUNCTION fenced_lock_guard()
RETURNS trigger LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_guard';
COMMENT ON FUNCTION fenced_lock_guard() IS
  'BEFORE ROW trigger: fenced_lock_guard(''name template with {column}'', ''token column'')';

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

-- Guards a DBA can see: protect a table in one call, see every guard and
-- whether it would work; an event trigger refuses, when it is created, a
-- guard that could never work, and an ALTER TABLE that would break one.
CREATE FUNCTION fenced_lock_protect(tbl regclass, template text, token_column name DEFAULT 'fence_token')
RETURNS void LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_protect';
COMMENT ON FUNCTION fenced_lock_protect(regclass, text, name) IS
  'guard tbl completely: the row guard fenced_lock_guard and the TRUNCATE guard fenced_lock_guard_truncate (on each partition too)';

CREATE FUNCTION fenced_lock_unprotect(tbl regclass)
RETURNS void LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_unprotect';
COMMENT ON FUNCTION fenced_lock_unprotect(regclass) IS
  'drop exactly the triggers fenced_lock_protect created on tbl and its partitions';

-- What the views call. PUBLIC may execute them (a view's reader needs that)
-- but cannot name them: it has no USAGE on fenced_lock_internal.
CREATE FUNCTION fenced_lock_internal.may_see(owner regrole)
RETURNS boolean LANGUAGE c STABLE PARALLEL SAFE AS 'MODULE_PATHNAME', 'fl_may_see';
CREATE FUNCTION fenced_lock_internal.may_see_name(owner name)
RETURNS boolean LANGUAGE c STABLE PARALLEL SAFE AS 'MODULE_PATHNAME', 'fl_may_see_name';
CREATE FUNCTION fenced_lock_internal.session_alive(token bigint)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL RESTRICTED AS 'MODULE_PATHNAME', 'fl_session_alive';
CREATE FUNCTION fenced_lock_internal.waiting(OUT name text, OUT pid integer, OUT holder text, OUT owner oid,
                                             OUT waiting_since timestamptz, OUT "position" integer,
                                             OUT mode text, OUT permits integer)
RETURNS SETOF record LANGUAGE c VOLATILE PARALLEL RESTRICTED AS 'MODULE_PATHNAME', 'fl_waiters_wrapper';
CREATE FUNCTION fenced_lock_internal.stats(OUT grants bigint, OUT renewals bigint, OUT releases bigint,
                                           OUT expiries bigint, OUT force_releases bigint, OUT session_ends bigint,
                                           OUT waits bigint, OUT wait_timeouts bigint, OUT fence_rejections bigint,
                                           OUT missing_tokens bigint, OUT preloaded boolean)
RETURNS SETOF record LANGUAGE c VOLATILE PARALLEL RESTRICTED AS 'MODULE_PATHNAME', 'fl_stats_wrapper';
CREATE FUNCTION fenced_lock_internal.stats_by_mode(OUT mode text, OUT grants bigint, OUT renewals bigint,
                                                   OUT releases bigint, OUT expiries bigint, OUT force_releases bigint,
                                                   OUT session_ends bigint, OUT waits bigint, OUT wait_timeouts bigint)
RETURNS SETOF record LANGUAGE c VOLATILE PARALLEL RESTRICTED AS 'MODULE_PATHNAME', 'fl_stats_by_mode_wrapper';

CREATE FUNCTION fenced_lock_internal.guard_state(tbl oid, trigger oid)
RETURNS TABLE (template text, token_column text, events text[], valid boolean, problem text)
LANGUAGE c STABLE PARALLEL RESTRICTED ROWS 1 AS 'MODULE_PATHNAME', 'fl_guard_state';
CREATE FUNCTION fenced_lock_internal.check_guards()
RETURNS event_trigger LANGUAGE c AS 'MODULE_PATHNAME', 'fl_check_guards';

CREATE VIEW fenced_lock_leases AS
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

CREATE VIEW fenced_lock_waiters AS
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

CREATE VIEW fenced_lock_stats AS
SELECT * FROM fenced_lock_internal.stats();
COMMENT ON VIEW fenced_lock_stats IS
  'counters since server start; NULL unless fenced_lock is in shared_preload_libraries';

CREATE VIEW fenced_lock_stats_by_mode AS
SELECT * FROM fenced_lock_internal.stats_by_mode();
COMMENT ON VIEW fenced_lock_stats_by_mode IS
  'the lease counters since server start, one row per mode; NULL unless fenced_lock is in shared_preload_libraries';

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

-- Attach-time validation: a guard that could never work is refused when it
-- is created, with the error its first write would raise; so is an ALTER
-- TABLE that breaks one (dropping, renaming or retyping a column it names).
-- It fires only for these three tags, so other DDL costs nothing.
CREATE EVENT TRIGGER fenced_lock_check_guards ON ddl_command_end
  WHEN TAG IN ('CREATE TRIGGER', 'ALTER TABLE', 'CREATE TABLE')
  EXECUTE FUNCTION fenced_lock_internal.check_guards();

-- Nothing is open to PUBLIC: grant what each role needs (docs/operations.md, "Granting access").
REVOKE ALL ON FUNCTION fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_acquire(text, interval, interval, text, boolean, boolean, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_try_acquire_all(text[], interval, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_acquire_all(text[], interval, interval, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_release_all(text[], bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_renew_all(text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_leader(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_proclaim(text, bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_protect(regclass, text, name) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_unprotect(regclass) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_internal.check_guards() FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_renew(text, bigint, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_release(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_validate(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_assert(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_force_release(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_guard() FROM PUBLIC;
REVOKE ALL ON fenced_lock_leases, fenced_lock_waiters, fenced_lock_history, fenced_lock_stats,
              fenced_lock_stats_by_mode, fenced_lock_guards FROM PUBLIC;
-- The views call these as the querying role; they only tell that role about itself.
GRANT EXECUTE ON FUNCTION fenced_lock_internal.may_see(regrole) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fenced_lock_internal.may_see_name(name) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fenced_lock_internal.session_alive(bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fenced_lock_internal.waiting() TO PUBLIC;
GRANT EXECUTE ON FUNCTION fenced_lock_internal.stats() TO PUBLIC;
GRANT EXECUTE ON FUNCTION fenced_lock_internal.stats_by_mode() TO PUBLIC;
GRANT EXECUTE ON FUNCTION fenced_lock_internal.guard_state(oid, oid) TO PUBLIC;
