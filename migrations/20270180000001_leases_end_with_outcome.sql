-- A recorded outcome ends its locks' leases in its own transaction (ADR 39). The
-- functions that record an outcome under fences (grove.record_inline, and through it
-- grove.record_inline_folded; grove.finish_folded; grove.finish_claiming) delete the
-- lease rows they checked once the outcome is written. Their holder then frees only
-- the advisory lock: one prepared statement instead of a transaction of its own that
-- deleted the lease. A check that finds a lease gone writes nothing, as before, and
-- deletes nothing. Nothing is deleted unless the outcome commits.

CREATE OR REPLACE FUNCTION grove.record_inline(
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
    IF p_payload ->> 'command' IS NULL THEN
        RAISE EXCEPTION 'grove.record_inline: payload names no command' USING ERRCODE = '22023';
    END IF;
    v_job_id := apalis.generate_ulid();
    INSERT INTO grove.commands (command_id, kind, payload, queue, job_id, status, attempts,
                                max_attempts, worker_id, started_at, result, error,
                                finished_at)
    VALUES (p_command_id, p_payload ->> 'command', p_payload, p_queue, v_job_id, p_status, 1,
            p_max_attempts, p_worker, now(), p_result, p_error, now())
    ON CONFLICT (command_id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN QUERY SELECT c.job_id, false, false, false
                       FROM grove.commands c WHERE c.command_id = p_command_id;
        RETURN;
    END IF;
    -- Not yet due, as grove.start_inline's: the insert trigger announces nothing.
    INSERT INTO apalis.jobs (job, id, job_type, status, attempts, max_attempts, run_at, priority,
                             idempotency_key, lock_by, lock_at, done_at)
    VALUES (convert_to(jsonb_build_object('command_id', p_command_id)::text, 'UTF8'), v_job_id,
            p_queue, p_job_status, 1, p_max_attempts, now() + interval '1 millisecond', 0,
            p_command_id::text, NULL, now(), now());
    DELETE FROM grove.command_secrets WHERE command_id = p_command_id;
    -- The outcome ends its locks' leases (ADR 39): the holder only unlocks after.
    DELETE FROM grove.lock_leases l USING unnest(p_keys, p_holders) AS f(key, holder)
     WHERE l.key = f.key AND l.holder = f.holder;
    RETURN QUERY SELECT v_job_id, true, false, true;
END;
$$;

CREATE OR REPLACE FUNCTION grove.finish_folded(
    p_keys bigint[], p_holders uuid[],
    p_command_id uuid, p_worker text, p_status text, p_result jsonb, p_error jsonb,
    p_job_status text, p_job_id text,
    p_rows jsonb, p_streams text[], p_types text[], p_versions integer[],
    p_payloads jsonb[], p_metadata jsonb, p_at timestamptz
) RETURNS TABLE (fenced boolean, recorded boolean, row_xmin text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_held integer;
BEGIN
    SELECT count(*) INTO v_held FROM (
        SELECT l.key FROM grove.lock_leases l
          JOIN unnest(p_keys, p_holders) AS f(key, holder)
            ON l.key = f.key AND l.holder = f.holder
           FOR KEY SHARE OF l) held;
    IF v_held < coalesce(array_length(p_keys, 1), 0) THEN
        RETURN QUERY SELECT true, false, NULL::text;
        RETURN;
    END IF;
    UPDATE grove.commands SET status = p_status, result = p_result, error = p_error,
           finished_at = now()
     WHERE command_id = p_command_id AND status = 'running' AND worker_id = p_worker;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, false, NULL::text;
        RETURN;
    END IF;
    UPDATE apalis.jobs SET status = p_job_status, done_at = now(), lock_by = NULL
     WHERE id = p_job_id;
    DELETE FROM grove.command_secrets WHERE command_id = p_command_id;
    -- The outcome ends its locks' leases (ADR 39): the holder only unlocks after.
    DELETE FROM grove.lock_leases l USING unnest(p_keys, p_holders) AS f(key, holder)
     WHERE l.key = f.key AND l.holder = f.holder;
    RETURN QUERY SELECT false, true,
        grove.append_folded(p_rows, p_streams, p_types, p_versions, p_payloads, p_metadata,
                            p_command_id, p_at);
END;
$$;

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
    DELETE FROM grove.lock_leases l USING unnest(p_keys, p_holders) AS f(key, holder)
     WHERE l.key = f.key AND l.holder = f.holder;
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
