-- The claim's durability (ADR 17). Claiming and starting a job is one of the two commits
-- a job makes, and the WAL flush it waits for is most of a short job's cost. When every
-- command claimed may run again (more than one attempt: the idempotent kinds), the claim
-- commits without waiting for that flush: if Postgres loses it in a crash, the job is
-- `Pending` and the ledger `queued` again, and the command runs again, which it is made
-- to bear; the worker that ran it cannot record its outcome (the ledger no longer names
-- it). The WAL is flushed, the claim with it, by the next synchronous commit (the
-- outcome's at the latest) or by the WAL writer within a few hundred milliseconds. A
-- claim that includes a single-attempt command (an exec, a tool edit, a pull request)
-- stays synchronous: its `running` ledger row is what ends a redelivery as
-- `worker_lost` instead of running it twice.

CREATE OR REPLACE FUNCTION grove.claim_jobs(p_worker text, p_queue text, p_limit integer)
RETURNS TABLE (job_id text, queue text, command_id uuid, action text, payload jsonb,
               prior_status text, attempt integer, max_attempts integer, token text)
LANGUAGE plpgsql AS $$
DECLARE
    j record;
    c record;
    v_cid uuid;
    v_retryable boolean := true;
BEGIN
    FOR j IN SELECT g.id, g.job_type, g.idempotency_key FROM apalis.get_jobs(p_worker, p_queue, p_limit) g LOOP
        -- grove.enqueue keys every job by its command id.
        v_cid := CASE WHEN j.idempotency_key ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'
                      THEN j.idempotency_key::uuid END;
        SELECT cm.payload, cm.status, cm.attempts, cm.max_attempts INTO c
        FROM grove.commands cm WHERE cm.command_id = v_cid FOR UPDATE;
        IF NOT FOUND THEN
            UPDATE apalis.jobs SET status = 'Killed', done_at = now(), lock_by = NULL,
                   last_result = '{"Err": "no ledger row"}'::jsonb
            WHERE id = j.id;
            RETURN QUERY SELECT j.id, j.job_type, v_cid, 'closed'::text, NULL::jsonb, NULL::text,
                                NULL::integer, NULL::integer, NULL::text;
            CONTINUE;
        END IF;
        IF c.status IN ('succeeded', 'failed') THEN
            UPDATE apalis.jobs SET status = CASE WHEN c.status = 'succeeded' THEN 'Done' ELSE 'Killed' END,
                   done_at = now(), lock_by = NULL
            WHERE id = j.id;
            RETURN QUERY SELECT j.id, j.job_type, v_cid, 'closed'::text, NULL::jsonb, c.status,
                                c.attempts, c.max_attempts, NULL::text;
            CONTINUE;
        END IF;
        UPDATE grove.commands SET status = 'running', attempts = c.attempts + 1,
               worker_id = p_worker, started_at = now()
        WHERE grove.commands.command_id = v_cid;
        UPDATE apalis.jobs SET status = 'Running', attempts = c.attempts + 1 WHERE id = j.id;
        v_retryable := v_retryable AND c.max_attempts > 1;
        RETURN QUERY SELECT j.id, j.job_type, v_cid, 'run'::text, c.payload, c.status,
                            c.attempts + 1, c.max_attempts,
                            (SELECT s.token FROM grove.command_secrets s WHERE s.command_id = v_cid);
    END LOOP;
    -- A claim of commands that may run again (more than one attempt: idempotent ones)
    -- commits without waiting for its WAL flush; see the header.
    IF v_retryable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
END;
$$;
