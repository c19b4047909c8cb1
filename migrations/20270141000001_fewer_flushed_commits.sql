-- Fewer flushed commits per call and per job (ADR 33).
--
-- 1. A lease whose commit rides on the holder's next flushed commit. grove.lease_take
--    commits synchronously (ADR 21): a lease a holder was told it has survives a crash.
--    A holder whose first effect outside the database comes after a flushed commit of
--    its own anyway (an exec's start events, an edit's ledger row) does not need that
--    flush: the WAL is flushed in order, so the later synchronous commit makes the
--    lease durable with it, and if the database dies before that commit the lock's
--    connection dies with it, the commit fails and the effect never starts. With
--    p_flush false the lease's commit does not wait for its WAL flush.

CREATE FUNCTION grove.lock_workspace_leased(p_key bigint, p_shared boolean,
                                            p_timeout_ms integer, p_id uuid,
                                            p_holder uuid, p_lease_ms integer,
                                            p_flush boolean)
RETURNS SETOF grove.sandbox_workspaces
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM grove.lock_leased(p_key, p_shared, p_timeout_ms, p_holder, p_lease_ms);
    -- grove.lease_take set synchronous_commit on for this transaction; the last
    -- setting wins.
    IF NOT p_flush THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN QUERY SELECT * FROM grove.sandbox_workspaces w WHERE w.id = p_id;
END;
$$;

-- 2. The claim, with the job row written once (apalis.get_jobs' query inlined: the job
--    goes from `Pending` straight to `Running`, or to `Done`/`Killed` when it is only
--    closed, instead of `Queued` first), over several queues in order in one statement,
--    and able to run inside another transaction: a worker finishing a job claims its
--    next one in the outcome's transaction (ADR 33), so that claim is flushed by the
--    outcome's commit. Per job as grove.claim_jobs (ADR 17): the ledger row is locked; a
--    finished command only has its job closed (a duplicate delivery); a job without a
--    readable command id or ledger row is killed; otherwise the ledger becomes
--    `running` (attempts + 1, worker, started_at) and the job `Running`, locked by the
--    worker. Leaves synchronous_commit alone.
CREATE FUNCTION grove.claim_next(p_worker text, p_queues text[], p_limit integer)
RETURNS TABLE (job_id text, queue text, command_id uuid, action text, payload jsonb,
               prior_status text, attempt integer, max_attempts integer, token text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q text;
    j record;
    c record;
    v_cid uuid;
    v_left integer := p_limit;
BEGIN
    FOREACH q IN ARRAY p_queues LOOP
        EXIT WHEN v_left <= 0;
        FOR j IN
            SELECT a.id, a.job_type, a.idempotency_key
              FROM apalis.jobs a
             WHERE (a.status = 'Pending' OR (a.status = 'Failed' AND a.attempts < a.max_attempts))
               AND a.run_at < now() AND a.job_type = q
             ORDER BY a.priority DESC, a.run_at ASC
             LIMIT v_left
               FOR UPDATE SKIP LOCKED
        LOOP
            v_left := v_left - 1;
            -- grove.enqueue keys every job by its command id.
            v_cid := CASE WHEN j.idempotency_key ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'
                          THEN j.idempotency_key::uuid END;
            SELECT cm.payload, cm.status, cm.attempts, cm.max_attempts INTO c
              FROM grove.commands cm WHERE cm.command_id = v_cid FOR UPDATE;
            IF NOT FOUND THEN
                UPDATE apalis.jobs SET status = 'Killed', done_at = now(), lock_by = NULL,
                       last_result = '{"Err": "no ledger row"}'::jsonb
                 WHERE id = j.id;
                RETURN QUERY SELECT j.id, j.job_type, v_cid, 'closed'::text, NULL::jsonb,
                                    NULL::text, NULL::integer, NULL::integer, NULL::text;
                CONTINUE;
            END IF;
            IF c.status IN ('succeeded', 'failed') THEN
                UPDATE apalis.jobs
                   SET status = CASE WHEN c.status = 'succeeded' THEN 'Done' ELSE 'Killed' END,
                       done_at = now(), lock_by = NULL
                 WHERE id = j.id;
                RETURN QUERY SELECT j.id, j.job_type, v_cid, 'closed'::text, NULL::jsonb,
                                    c.status, c.attempts, c.max_attempts, NULL::text;
                CONTINUE;
            END IF;
            UPDATE grove.commands SET status = 'running', attempts = c.attempts + 1,
                   worker_id = p_worker, started_at = now()
             WHERE command_id = v_cid;
            UPDATE apalis.jobs SET status = 'Running', attempts = c.attempts + 1,
                   lock_by = p_worker, lock_at = now()
             WHERE id = j.id;
            RETURN QUERY SELECT j.id, j.job_type, v_cid, 'run'::text, c.payload, c.status,
                                c.attempts + 1, c.max_attempts,
                                (SELECT s.token FROM grove.command_secrets s WHERE s.command_id = v_cid);
        END LOOP;
    END LOOP;
END;
$$;

-- grove.claim_jobs on grove.claim_next, as a statement of its own: its commit does not
-- wait for the WAL flush when every command it started may run again (ADR 17).
CREATE OR REPLACE FUNCTION grove.claim_jobs(p_worker text, p_queue text, p_limit integer)
RETURNS TABLE (job_id text, queue text, command_id uuid, action text, payload jsonb,
               prior_status text, attempt integer, max_attempts integer, token text)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    v_retryable boolean := true;
BEGIN
    FOR r IN SELECT * FROM grove.claim_next(p_worker, ARRAY[p_queue], p_limit) LOOP
        v_retryable := v_retryable AND (r.action <> 'run' OR r.max_attempts > 1);
        job_id := r.job_id; queue := r.queue; command_id := r.command_id;
        action := r.action; payload := r.payload; prior_status := r.prior_status;
        attempt := r.attempt; max_attempts := r.max_attempts; token := r.token;
        RETURN NEXT;
    END LOOP;
    IF v_retryable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
END;
$$;
