-- Commands run inline by the process that received them (ADR 31): a write tool or an
-- exec of a workspace on the receiving server's node runs in the request's task, not
-- through a claim. Its ledger row is inserted already started (`running`, attempt 1,
-- this worker) together with a job row already claimed by this worker (`Running`,
-- locked by it), so every path that ends a started command works unchanged: the outcome
-- is recorded by the same conditional update as a queued job's, and if the process
-- dies, orphan recovery hands the job back and its next delivery finds the ledger row
-- `running` (an exec or an edit ends as `worker_lost`, never re-run; an idempotent
-- write runs again). Nothing is inserted when the command id is already known (a retry,
-- or the same command on the queue path): the caller then waits for that outcome.
--
-- The job's run_at lies a moment after now(): apalis' insert trigger announces only due
-- jobs, and this one is claimed already, so no worker is woken for it. It is long past
-- by the time a lost worker's job is handed back.
CREATE FUNCTION grove.start_inline(
    p_command_id uuid,
    p_payload jsonb,
    p_queue text,
    p_worker text,
    p_max_attempts integer
) RETURNS TABLE (job_id text, inserted boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_job_id text;
BEGIN
    IF p_payload ->> 'command' IS NULL THEN
        RAISE EXCEPTION 'grove.start_inline: payload names no command' USING ERRCODE = '22023';
    END IF;
    v_job_id := apalis.generate_ulid();
    INSERT INTO grove.commands (command_id, kind, payload, queue, job_id, status, attempts,
                                max_attempts, worker_id, started_at)
    VALUES (p_command_id, p_payload ->> 'command', p_payload, p_queue, v_job_id, 'running', 1,
            p_max_attempts, p_worker, now())
    ON CONFLICT (command_id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN QUERY SELECT c.job_id, false FROM grove.commands c WHERE c.command_id = p_command_id;
        RETURN;
    END IF;
    INSERT INTO apalis.jobs (job, id, job_type, status, attempts, max_attempts, run_at, priority,
                             idempotency_key, lock_by, lock_at)
    VALUES (convert_to(jsonb_build_object('command_id', p_command_id)::text, 'UTF8'), v_job_id,
            p_queue, 'Running', 1, p_max_attempts, now() + interval '1 millisecond', 0,
            p_command_id::text, p_worker, now());
    RETURN QUERY SELECT v_job_id, true;
END;
$$;
