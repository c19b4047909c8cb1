-- A queued job's outcome ends its locks' leases in its own transaction (ADR 39).
-- grove.finish_claiming deletes the lease rows it checked once the outcome is written;
-- the worker then frees only the advisory locks, in one prepared statement, instead of
-- a transaction of its own that deleted each lease before the unlock. A check that
-- finds a lease gone writes nothing, as before, and deletes nothing; nothing is deleted
-- unless the outcome commits. grove.record_inline and grove.finish_folded (the inline
-- paths' usual records) keep their leases until their holder's release.

CREATE OR REPLACE FUNCTION grove.finish_claiming(
    p_keys bigint[], p_holders uuid[],
    p_command_id uuid, p_worker text, p_status text, p_result jsonb, p_error jsonb,
    p_job_status text, p_job_id text, p_queues text[], p_limit integer
) RETURNS TABLE (fenced boolean, recorded boolean, job_id text, queue text,
                 command_id uuid, action text, payload jsonb, prior_status text,
                 attempt integer, max_attempts integer, token text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_held integer;
BEGIN
    IF coalesce(array_length(p_keys, 1), 0) > 0 THEN
        SELECT count(*) INTO v_held FROM (
            SELECT l.key FROM grove.lock_leases l
              JOIN unnest(p_keys, p_holders) AS f(key, holder)
                ON l.key = f.key AND l.holder = f.holder
               FOR KEY SHARE OF l) held;
        IF v_held < array_length(p_keys, 1) THEN
            RETURN QUERY SELECT true, false, NULL::text, NULL::text, NULL::uuid, NULL::text,
                                NULL::jsonb, NULL::text, NULL::integer, NULL::integer,
                                NULL::text;
            RETURN;
        END IF;
    END IF;
    UPDATE grove.commands SET status = p_status, result = p_result, error = p_error,
           finished_at = now()
     WHERE command_id = p_command_id AND status = 'running' AND worker_id = p_worker;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, false, NULL::text, NULL::text, NULL::uuid, NULL::text,
                            NULL::jsonb, NULL::text, NULL::integer, NULL::integer, NULL::text;
        RETURN;
    END IF;
    UPDATE apalis.jobs SET status = p_job_status, done_at = now(), lock_by = NULL
     WHERE id = p_job_id;
    DELETE FROM grove.command_secrets WHERE command_id = p_command_id;
    -- The outcome ends its locks' leases (ADR 39): the holder only unlocks after.
    IF coalesce(array_length(p_keys, 1), 0) > 0 THEN
        DELETE FROM grove.lock_leases l USING unnest(p_keys, p_holders) AS f(key, holder)
         WHERE l.key = f.key AND l.holder = f.holder;
    END IF;
    RETURN QUERY SELECT false, true, NULL::text, NULL::text, NULL::uuid, NULL::text,
                        NULL::jsonb, NULL::text, NULL::integer, NULL::integer, NULL::text;
    IF p_limit > 0 AND coalesce(array_length(p_queues, 1), 0) > 0 THEN
        RETURN QUERY SELECT NULL::boolean, NULL::boolean, n.job_id, n.queue, n.command_id,
                            n.action, n.payload, n.prior_status, n.attempt, n.max_attempts,
                            n.token
                       FROM grove.claim_next(p_worker, p_queues, p_limit) n;
    END IF;
END;
$$;
