-- Leased locks with fencing (ADR 21). Every lock grove takes is still a session-level
-- advisory lock (waiting, queueing and the fast path stay Postgres'), and is also a
-- lease: a row that outlives the holder's connection. A database restart or a cut
-- connection frees the advisory lock at once, but not the lease: until it expires, no
-- other holder can take the lock, and the holder that lost its connection stops its
-- effect (kills the command) before that expiry (see ADR 21 for why no window remains).
--
-- One row per holder: several holders of a shared lock coexist; an exclusive one is
-- alone. `holder` is a fresh id per acquisition (the fencing identity writes check);
-- `token` rises with every acquisition, for the record.

CREATE TABLE grove.lock_leases (
    key bigint NOT NULL,
    holder uuid NOT NULL,
    exclusive boolean NOT NULL,
    token bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (key, holder)
);

CREATE SEQUENCE grove.lock_fence_tokens;

-- Takes the lease of p_key for p_holder once no live lease of another holder conflicts
-- with it (any for an exclusive lease; an exclusive one for a shared lease), waiting
-- until p_wait_until, then 55P03 (lock_not_available). The caller already holds the
-- advisory lock of p_key in the same mode: that serializes takers, so only a lease whose
-- holder lost its advisory lock (a restart, a cut connection) is ever waited for here.
-- Expired leases are removed on the way. The commit is synchronous: a lease the caller
-- was told it holds survives a crash of the database.
CREATE FUNCTION grove.lease_take(p_key bigint, p_holder uuid, p_exclusive boolean,
                                 p_lease_ms integer, p_wait_until timestamptz)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_token bigint;
    v_pause double precision := 0.02;
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);
    LOOP
        DELETE FROM grove.lock_leases WHERE key = p_key AND expires_at < clock_timestamp();
        EXIT WHEN NOT EXISTS (
            SELECT 1 FROM grove.lock_leases l
             WHERE l.key = p_key AND l.holder <> p_holder AND (p_exclusive OR l.exclusive));
        IF clock_timestamp() >= p_wait_until THEN
            RAISE EXCEPTION 'the lease of lock % is held by a holder that lost its connection', p_key
                USING ERRCODE = '55P03';
        END IF;
        PERFORM pg_sleep(v_pause);
        v_pause := least(v_pause * 2, 0.5);
    END LOOP;
    INSERT INTO grove.lock_leases (key, holder, exclusive, token, expires_at)
    VALUES (p_key, p_holder, p_exclusive, nextval('grove.lock_fence_tokens'),
            clock_timestamp() + make_interval(secs => p_lease_ms / 1000.0))
    ON CONFLICT (key, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at
    RETURNING token INTO v_token;
    RETURN v_token;
END;
$$;

-- The advisory lock p_key (shared or exclusive, waiting at most p_timeout_ms) and its
-- lease, in one statement. The timeout is local to the statement's transaction.
CREATE FUNCTION grove.lock_leased(p_key bigint, p_shared boolean, p_timeout_ms integer,
                                  p_holder uuid, p_lease_ms integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_until timestamptz := clock_timestamp() + make_interval(secs => p_timeout_ms / 1000.0);
BEGIN
    PERFORM set_config('lock_timeout', p_timeout_ms::text || 'ms', true);
    IF p_shared THEN
        PERFORM pg_advisory_lock_shared(p_key);
    ELSE
        PERFORM pg_advisory_lock(p_key);
    END IF;
    RETURN grove.lease_take(p_key, p_holder, NOT p_shared, p_lease_ms, v_until);
END;
$$;

-- grove.lock_workspace with the lease: the lock, its lease and the workspace row as it
-- is once both are held (none if the workspace is gone), in one statement.
CREATE FUNCTION grove.lock_workspace_leased(p_key bigint, p_shared boolean,
                                            p_timeout_ms integer, p_id uuid,
                                            p_holder uuid, p_lease_ms integer)
RETURNS SETOF grove.sandbox_workspaces
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM grove.lock_leased(p_key, p_shared, p_timeout_ms, p_holder, p_lease_ms);
    RETURN QUERY SELECT * FROM grove.sandbox_workspaces w WHERE w.id = p_id;
END;
$$;

-- Extends p_holder's lease of p_key by p_lease_ms from now, if it is still live.
-- Returns false when the lease is gone or expired: the holder must stop at once.
CREATE FUNCTION grove.lease_renew(p_key bigint, p_holder uuid, p_lease_ms integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);
    UPDATE grove.lock_leases
       SET expires_at = clock_timestamp() + make_interval(secs => p_lease_ms / 1000.0)
     WHERE key = p_key AND holder = p_holder AND expires_at >= clock_timestamp();
    RETURN FOUND;
END;
$$;
