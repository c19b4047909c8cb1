-- A read's hold on a workspace's command lock (ADR 24): the shared advisory lock and
-- the workspace row, without a lease of its own. A read has no effect to fence: its
-- answer is given only if the lock's session is still there when it unlocks (a session
-- that ended, and with it the advisory lock, fails the unlock and the read answers
-- `unavailable`). It still waits, as a shared lease would, for an exclusive lease whose
-- holder lost its advisory lock (a database restart), so a read never runs beside a
-- writer that may still be writing. Writes nothing: its commit waits for no WAL flush.
CREATE FUNCTION grove.lock_workspace_read(p_key bigint, p_timeout_ms integer, p_id uuid)
RETURNS SETOF grove.sandbox_workspaces
LANGUAGE plpgsql AS $$
DECLARE
    v_until timestamptz := clock_timestamp() + make_interval(secs => p_timeout_ms / 1000.0);
    v_pause double precision := 0.02;
BEGIN
    PERFORM set_config('lock_timeout', p_timeout_ms::text || 'ms', true);
    PERFORM pg_advisory_lock_shared(p_key);
    WHILE EXISTS (SELECT 1 FROM grove.lock_leases l
                   WHERE l.key = p_key AND l.exclusive AND l.expires_at >= clock_timestamp()) LOOP
        IF clock_timestamp() >= v_until THEN
            RAISE EXCEPTION 'the lease of lock % is held by a holder that lost its connection', p_key
                USING ERRCODE = '55P03';
        END IF;
        PERFORM pg_sleep(v_pause);
        v_pause := least(v_pause * 2, 0.5);
    END LOOP;
    RETURN QUERY SELECT * FROM grove.sandbox_workspaces w WHERE w.id = p_id;
END;
$$;
