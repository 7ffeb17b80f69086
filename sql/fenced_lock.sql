-- fenced_lock: leased named locks with fencing tokens.
--
-- Lease state lives in the private schema fenced_lock_internal, which ordinary
-- roles cannot use at all; they reach it only through the functions below,
-- which check who is calling (see src/store.rs).

CREATE SCHEMA fenced_lock_internal;
REVOKE ALL ON SCHEMA fenced_lock_internal FROM PUBLIC;
COMMENT ON SCHEMA fenced_lock_internal IS 'fenced_lock private state: do not write directly';

-- Tokens: epoch (timeline - 1) in bits 47..62, a counter below (src/token.rs).
CREATE SEQUENCE fenced_lock_internal.token_seq AS bigint MINVALUE 1 NO CYCLE;

CREATE TABLE fenced_lock_internal.leases (
    name        text COLLATE "C" PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 512),
    token       bigint      NOT NULL CHECK (token > 0),
    holder      text,
    owner       regrole     NOT NULL,
    acquired_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    ttl         interval    NOT NULL
);
CREATE INDEX leases_expires_at ON fenced_lock_internal.leases (expires_at);
COMMENT ON TABLE fenced_lock_internal.leases IS
  'one record per lock name with a lease; written only by the fenced_lock functions';

-- pg_dump keeps lease records and the sequence position.
SELECT pg_catalog.pg_extension_config_dump('fenced_lock_internal.leases', '');
SELECT pg_catalog.pg_extension_config_dump('fenced_lock_internal.token_seq', '');

CREATE FUNCTION fenced_lock_try_acquire(name text, ttl interval DEFAULT '30 seconds', holder text DEFAULT NULL)
RETURNS bigint LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_try_acquire';
COMMENT ON FUNCTION fenced_lock_try_acquire(text, interval, text) IS
  'grant a lease of name now and return its fencing token, or NULL if another lease is live';

CREATE FUNCTION fenced_lock_acquire(name text, ttl interval DEFAULT '30 seconds', wait interval DEFAULT NULL, holder text DEFAULT NULL)
RETURNS bigint LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fl_acquire';
COMMENT ON FUNCTION fenced_lock_acquire(text, interval, interval, text) IS
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

CREATE FUNCTION fenced_lock_internal.may_see(owner regrole)
RETURNS boolean LANGUAGE c STABLE PARALLEL SAFE AS 'MODULE_PATHNAME', 'fl_may_see';

CREATE VIEW fenced_lock_leases AS
SELECT l.name,
       CASE WHEN fenced_lock_internal.may_see(l.owner) THEN l.token END AS token,
       CASE WHEN fenced_lock_internal.may_see(l.owner) THEN l.holder END AS holder,
       l.owner,
       l.acquired_at,
       l.expires_at,
       l.expires_at > pg_catalog.clock_timestamp() AS live
  FROM fenced_lock_internal.leases l;
COMMENT ON VIEW fenced_lock_leases IS
  'one row per lock name with a lease record; token and holder shown to the owner''s members and operators only';

-- Nothing is open to PUBLIC: grant what each role needs (README, "Granting access").
REVOKE ALL ON FUNCTION fenced_lock_try_acquire(text, interval, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_acquire(text, interval, interval, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_renew(text, bigint, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_release(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_validate(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_assert(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_force_release(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION fenced_lock_guard() FROM PUBLIC;
REVOKE ALL ON fenced_lock_leases FROM PUBLIC;
-- The view calls this as the querying role; it only tells that role about itself.
GRANT EXECUTE ON FUNCTION fenced_lock_internal.may_see(regrole) TO PUBLIC;
