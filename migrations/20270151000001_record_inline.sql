-- An inline command recorded after its effect (ADR 31's write_file, ADR 34's reuses)
-- in one statement instead of three (ADR 35): the fence check of the holder's locks
-- (FOR KEY SHARE, as grove's check_fences takes it), the ledger row and claimed job of
-- grove.start_inline, and the outcome (the ledger row finished, the job closed, the
-- secret deleted, as the queue records an outcome). The caller appends the events and
-- commits in the same transaction.
--
-- Returns the job id and what happened: inserted false (the command id is taken:
-- nothing written), fenced true (a lease is gone: the caller rolls back), recorded
-- false (the row just inserted was not running: never expected).
CREATE FUNCTION grove.record_inline(
    p_command_id uuid,
    p_payload jsonb,
    p_queue text,
    p_worker text,
    p_max_attempts integer,
    p_keys bigint[],
    p_holders uuid[],
    p_status text,
    p_result jsonb,
    p_error jsonb,
    p_job_status text
) RETURNS TABLE (job_id text, inserted boolean, fenced boolean, recorded boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_job_id text;
    v_inserted boolean;
    v_held integer;
BEGIN
    SELECT count(*) INTO v_held FROM (
        SELECT l.key FROM grove.lock_leases l
          JOIN unnest(p_keys, p_holders) AS f(key, holder)
            ON l.key = f.key AND l.holder = f.holder
           FOR KEY SHARE OF l) held;
    IF v_held < coalesce(array_length(p_keys, 1), 0) THEN
        RETURN QUERY SELECT NULL::text, false, true, false;
        RETURN;
    END IF;
    SELECT s.job_id, s.inserted INTO v_job_id, v_inserted
      FROM grove.start_inline(p_command_id, p_payload, p_queue, p_worker, p_max_attempts) s;
    IF NOT v_inserted THEN
        RETURN QUERY SELECT v_job_id, false, false, false;
        RETURN;
    END IF;
    UPDATE grove.commands SET status = p_status, result = p_result, error = p_error,
           finished_at = now()
     WHERE command_id = p_command_id AND status = 'running' AND worker_id = p_worker;
    IF NOT FOUND THEN
        RETURN QUERY SELECT v_job_id, true, false, false;
        RETURN;
    END IF;
    UPDATE apalis.jobs SET status = p_job_status, done_at = now(), lock_by = NULL
     WHERE id = v_job_id;
    DELETE FROM grove.command_secrets WHERE command_id = p_command_id;
    RETURN QUERY SELECT v_job_id, true, false, true;
END;
$$;
