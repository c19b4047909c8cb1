-- The job fast path (ADR 17): claiming and starting a job in one statement, and taking a
-- workspace's command lock and reading its row in one statement. Each replaces several
-- round trips (and, for the claim, one commit) per job.

-- Claims up to p_limit due jobs of p_queue for p_worker through apalis-postgres' own
-- claim (apalis.get_jobs, FOR UPDATE SKIP LOCKED) and starts each in the same
-- transaction: the ledger row is locked; a finished command only has its job closed
-- (a duplicate delivery); a job without a readable command id or ledger row is killed;
-- otherwise the ledger becomes `running` (attempts + 1, worker, started_at) and the job
-- `Running`. `action` is 'run' for a started command, 'closed' for a job that was only
-- closed. `prior_status` is the ledger status before the start: 'running' means an
-- earlier attempt started and never finished.
CREATE FUNCTION grove.claim_jobs(p_worker text, p_queue text, p_limit integer)
RETURNS TABLE (job_id text, queue text, command_id uuid, action text, payload jsonb,
               prior_status text, attempt integer, max_attempts integer, token text)
LANGUAGE plpgsql AS $$
DECLARE
    j record;
    c record;
    v_cid uuid;
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
        RETURN QUERY SELECT j.id, j.job_type, v_cid, 'run'::text, c.payload, c.status,
                            c.attempts + 1, c.max_attempts,
                            (SELECT s.token FROM grove.command_secrets s WHERE s.command_id = v_cid);
    END LOOP;
END;
$$;

-- Takes the advisory lock p_key (shared or exclusive), waiting at most p_timeout_ms, and
-- returns the workspace row p_id as it is once the lock is held (none if it is gone).
-- The lock is session-level: it outlives this statement and is freed by
-- pg_advisory_unlock(_shared) or the end of the session. The timeout is local to the
-- statement's own transaction.
CREATE FUNCTION grove.lock_workspace(p_key bigint, p_shared boolean, p_timeout_ms integer, p_id uuid)
RETURNS SETOF grove.sandbox_workspaces
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('lock_timeout', p_timeout_ms::text || 'ms', true);
    IF p_shared THEN
        PERFORM pg_advisory_lock_shared(p_key);
    ELSE
        PERFORM pg_advisory_lock(p_key);
    END IF;
    RETURN QUERY SELECT * FROM grove.sandbox_workspaces w WHERE w.id = p_id;
END;
$$;
