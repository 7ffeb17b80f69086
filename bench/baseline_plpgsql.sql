-- BASELINE for the benchmark only: a hand-written PL/pgSQL lease table with
-- the same contract as fenced_lock's try_acquire/release, as a careful user
-- would write it without the extension. Not part of fenced_lock.
--
-- Same semantics as the extension:
--   - a transaction-level advisory lock per name orders every transition
--     (two-int key, its own first key 0x504C0001 so it never meets ours);
--   - expiry decided on clock_timestamp(), never now();
--   - tokens from a sequence, a new one per grant;
--   - a grant or release commits durably: synchronous_commit is forced on for
--     the transaction with set_config(..., true);
--   - the same holder re-acquiring its live lease gets the same token;
--   - release checks that the caller acts for the owner role (42501);
--   - records expired more than 60 s ago are reaped now and then by grants;
--   - state lives in its own schema that callers cannot write
--     (SECURITY DEFINER with a pinned search_path).

DROP SCHEMA IF EXISTS plpgsql_lease CASCADE;
CREATE SCHEMA plpgsql_lease;
REVOKE ALL ON SCHEMA plpgsql_lease FROM PUBLIC;

CREATE SEQUENCE plpgsql_lease.token_seq AS bigint MINVALUE 1 NO CYCLE;

CREATE TABLE plpgsql_lease.leases (
    name        text COLLATE "C" PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 512),
    token       bigint      NOT NULL CHECK (token > 0),
    holder      text,
    owner       regrole     NOT NULL,
    acquired_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    ttl         interval    NOT NULL
);
CREATE INDEX leases_expires_at ON plpgsql_lease.leases (expires_at);

CREATE FUNCTION plpgsql_lease.try_acquire(p_name text, p_ttl interval DEFAULT '30 seconds',
                                          p_holder text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cur   plpgsql_lease.leases;
    have  boolean;
    t     bigint;
    at_   timestamptz;
    -- In a SECURITY DEFINER function current_user is the definer; the
    -- caller is the session user (good enough for a baseline).
    me    regrole := session_user::regrole;
BEGIN
    IF p_name IS NULL OR p_ttl IS NULL THEN
        RAISE EXCEPTION 'plpgsql_lease: name and ttl must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF octet_length(p_name) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'plpgsql_lease: bad lock name' USING ERRCODE = '22023';
    END IF;
    IF p_ttl <= interval '0' OR p_ttl > interval '1 day' THEN
        RAISE EXCEPTION 'plpgsql_lease: ttl out of range' USING ERRCODE = '22023';
    END IF;

    PERFORM pg_advisory_xact_lock(1347223553, hashtext(p_name));
    at_ := clock_timestamp();
    SELECT * INTO cur FROM plpgsql_lease.leases WHERE name = p_name;
    have := FOUND;

    IF have AND cur.expires_at > at_ THEN
        IF p_holder IS NOT NULL AND cur.holder = p_holder AND pg_has_role(me, cur.owner, 'USAGE') THEN
            UPDATE plpgsql_lease.leases SET expires_at = at_ + p_ttl, ttl = p_ttl WHERE name = p_name;
            PERFORM set_config('synchronous_commit', 'on', true);
            RETURN cur.token;
        END IF;
        RETURN NULL;
    END IF;

    t := nextval('plpgsql_lease.token_seq');
    IF have THEN
        UPDATE plpgsql_lease.leases
           SET token = t, holder = p_holder, owner = me, acquired_at = at_,
               expires_at = at_ + p_ttl, ttl = p_ttl
         WHERE name = p_name;
    ELSE
        INSERT INTO plpgsql_lease.leases (name, token, holder, owner, acquired_at, expires_at, ttl)
        VALUES (p_name, t, p_holder, me, at_, at_ + p_ttl, p_ttl);
    END IF;
    PERFORM set_config('synchronous_commit', 'on', true);

    -- one grant in eight reaps up to 16 long-expired records
    IF random() < 0.125 THEN
        DELETE FROM plpgsql_lease.leases
         WHERE name IN (SELECT name FROM plpgsql_lease.leases
                         WHERE expires_at < at_ - interval '60 seconds'
                         ORDER BY expires_at LIMIT 16
                           FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN t;
END
$$;

CREATE FUNCTION plpgsql_lease.release(p_name text, p_token bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cur plpgsql_lease.leases;
BEGIN
    IF p_name IS NULL OR p_token IS NULL THEN
        RAISE EXCEPTION 'plpgsql_lease: name and token must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF p_token <= 0 THEN
        RAISE EXCEPTION 'plpgsql_lease: token must be > 0' USING ERRCODE = '22023';
    END IF;

    PERFORM pg_advisory_xact_lock(1347223553, hashtext(p_name));
    SELECT * INTO cur FROM plpgsql_lease.leases WHERE name = p_name;
    IF NOT FOUND OR cur.token <> p_token OR cur.expires_at <= clock_timestamp() THEN
        RETURN false;
    END IF;
    IF NOT pg_has_role(session_user::regrole, cur.owner, 'USAGE') THEN
        RAISE EXCEPTION 'plpgsql_lease: lease of % is owned by %', p_name, cur.owner
            USING ERRCODE = '42501';
    END IF;
    DELETE FROM plpgsql_lease.leases WHERE name = p_name AND token = p_token;
    PERFORM set_config('synchronous_commit', 'on', true);
    RETURN true;
END
$$;

REVOKE ALL ON FUNCTION plpgsql_lease.try_acquire(text, interval, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION plpgsql_lease.release(text, bigint) FROM PUBLIC;
