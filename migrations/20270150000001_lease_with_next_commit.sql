-- Any lock's lease may ride on its holder's next flushed commit (ADR 33, ADR 35):
-- grove.lock_leased with the p_flush of grove.lock_workspace_leased, for the key and
-- cache locks of a warm acquire and of a second ensure, whose only effects are in the
-- database and come in one flushed commit after the lock.
CREATE FUNCTION grove.lock_leased(p_key bigint, p_shared boolean, p_timeout_ms integer,
                                  p_holder uuid, p_lease_ms integer, p_flush boolean)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_taken bigint;
BEGIN
    v_taken := grove.lock_leased(p_key, p_shared, p_timeout_ms, p_holder, p_lease_ms);
    -- grove.lease_take set synchronous_commit on for this transaction; the last
    -- setting wins.
    IF NOT p_flush THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN v_taken;
END;
$$;
