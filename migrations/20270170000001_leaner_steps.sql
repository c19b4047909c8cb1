-- Fewer statements in each durable step (ADR 37). Every step is its own transaction, so
-- each statement a step's functions run pays its executor start (relation and index
-- locks, a plan run) and each PL/pgSQL expression its first-in-transaction setup.
--
-- 1. grove.record_inline (a write_file, warm acquire or second ensure recorded in one
--    commit) inserts the ledger row and the job row already in their final state,
--    instead of inserting them `running` through grove.start_inline and updating both.
--    The rows are the ones the update path left; nothing else reads the middle state,
--    which never committed.
-- 2. grove.append_folded skips the deletes and upserts whose lists are empty (a step
--    usually writes one workspace row and nothing else).
-- 3. apalis.jobs loses two indexes that repeat others (unique_job_id repeats jobs_pkey,
--    lidx repeats idx_apalis_jobs_lock_by): every job insert and every non-HOT update
--    maintained both copies. grove runs none of apalis' own queries.
-- 4. apalis' insert trigger is invoked only for rows that are due (its function announced
--    only those): an inline job, inserted claimed and not yet due, no longer calls it.

DROP INDEX IF EXISTS apalis.unique_job_id;
DROP INDEX IF EXISTS apalis.lidx;

DROP TRIGGER IF EXISTS notify_workers ON apalis.jobs;
CREATE TRIGGER notify_workers AFTER INSERT ON apalis.jobs
    FOR EACH ROW WHEN (NEW.run_at <= now()) EXECUTE FUNCTION apalis.notify_new_jobs();

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
    RETURN QUERY SELECT v_job_id, true, false, true;
END;
$$;

CREATE OR REPLACE FUNCTION grove.append_folded(
    p_rows jsonb,
    p_streams text[],
    p_types text[],
    p_versions integer[],
    p_payloads jsonb[],
    p_metadata jsonb,
    p_command_id uuid,
    p_at timestamptz
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    e jsonb;
    v_xmin text;
BEGIN
    -- The step's commit is the one that makes it durable, whatever the session's default.
    PERFORM set_config('synchronous_commit', 'on', true);
    FOR e IN SELECT * FROM jsonb_array_elements(p_rows -> 'expect') LOOP
        CASE e ->> 'table'
        WHEN 'sandbox_repo_caches' THEN
            SELECT xmin::text INTO v_xmin FROM grove.sandbox_repo_caches
             WHERE id = (e ->> 'id')::uuid FOR UPDATE;
        WHEN 'sandbox_workspaces' THEN
            SELECT xmin::text INTO v_xmin FROM grove.sandbox_workspaces
             WHERE id = (e ->> 'id')::uuid FOR UPDATE;
        WHEN 'sandbox_runtimes' THEN
            SELECT xmin::text INTO v_xmin FROM grove.sandbox_runtimes
             WHERE id = (e ->> 'id')::uuid FOR UPDATE;
        ELSE
            RAISE EXCEPTION 'grove.append_folded: unknown table %', e ->> 'table'
                USING ERRCODE = '22023';
        END CASE;
        IF v_xmin IS DISTINCT FROM e ->> 'xmin' THEN
            RAISE EXCEPTION 'grove.append_folded: % % changed since it was read',
                e ->> 'table', e ->> 'id' USING ERRCODE = 'GRV02';
        END IF;
    END LOOP;

    IF jsonb_array_length(p_rows -> 'delete') > 0 THEN
        DELETE FROM grove.sandbox_repo_caches WHERE id IN (
            SELECT (d ->> 'id')::uuid FROM jsonb_array_elements(p_rows -> 'delete') d
             WHERE d ->> 'table' = 'sandbox_repo_caches');
        DELETE FROM grove.sandbox_workspaces WHERE id IN (
            SELECT (d ->> 'id')::uuid FROM jsonb_array_elements(p_rows -> 'delete') d
             WHERE d ->> 'table' = 'sandbox_workspaces');
        DELETE FROM grove.sandbox_runtimes WHERE id IN (
            SELECT (d ->> 'id')::uuid FROM jsonb_array_elements(p_rows -> 'delete') d
             WHERE d ->> 'table' = 'sandbox_runtimes');
    END IF;

    IF jsonb_array_length(p_rows -> 'upsert' -> 'sandbox_repo_caches') > 0 THEN
        INSERT INTO grove.sandbox_repo_caches
        SELECT r.* FROM jsonb_array_elements(p_rows -> 'upsert' -> 'sandbox_repo_caches') j,
               LATERAL jsonb_populate_record(NULL::grove.sandbox_repo_caches, j) r
        ON CONFLICT (id) DO UPDATE SET
            (node, identity, repo_name, repo_url, provider, provider_host, local_path,
             auth_scope_hash, last_fetched_at, last_used_at, size_bytes, state, created_at,
             updated_at)
          = (EXCLUDED.node, EXCLUDED.identity, EXCLUDED.repo_name, EXCLUDED.repo_url,
             EXCLUDED.provider, EXCLUDED.provider_host, EXCLUDED.local_path,
             EXCLUDED.auth_scope_hash, EXCLUDED.last_fetched_at, EXCLUDED.last_used_at,
             EXCLUDED.size_bytes, EXCLUDED.state, EXCLUDED.created_at, EXCLUDED.updated_at);
    END IF;

    IF jsonb_array_length(p_rows -> 'upsert' -> 'sandbox_workspaces') > 0 THEN
        INSERT INTO grove.sandbox_workspaces
        SELECT r.* FROM jsonb_array_elements(p_rows -> 'upsert' -> 'sandbox_workspaces') j,
               LATERAL jsonb_populate_record(NULL::grove.sandbox_workspaces, j) r
        ON CONFLICT (id) DO UPDATE SET
            (repo_cache_id, node, project_id, user_id, mode, conversation_id, task_id,
             base_ref, base_commit, branch_name, local_path, state, dirty, pinned_until,
             last_used_at, size_bytes, writable, isolated, persistent, created_at, updated_at,
             size_measured_at, evicted_at, saved_ref, saved_commit, saved_head, saved_patch,
             history_ignored)
          = (EXCLUDED.repo_cache_id, EXCLUDED.node, EXCLUDED.project_id, EXCLUDED.user_id,
             EXCLUDED.mode, EXCLUDED.conversation_id, EXCLUDED.task_id, EXCLUDED.base_ref,
             EXCLUDED.base_commit, EXCLUDED.branch_name, EXCLUDED.local_path, EXCLUDED.state,
             EXCLUDED.dirty, EXCLUDED.pinned_until, EXCLUDED.last_used_at,
             EXCLUDED.size_bytes, EXCLUDED.writable, EXCLUDED.isolated, EXCLUDED.persistent,
             EXCLUDED.created_at, EXCLUDED.updated_at, EXCLUDED.size_measured_at,
             EXCLUDED.evicted_at, EXCLUDED.saved_ref, EXCLUDED.saved_commit,
             EXCLUDED.saved_head, EXCLUDED.saved_patch, EXCLUDED.history_ignored);
    END IF;

    IF jsonb_array_length(p_rows -> 'upsert' -> 'sandbox_runtimes') > 0 THEN
        INSERT INTO grove.sandbox_runtimes
        SELECT r.* FROM jsonb_array_elements(p_rows -> 'upsert' -> 'sandbox_runtimes') j,
               LATERAL jsonb_populate_record(NULL::grove.sandbox_runtimes, j) r
        ON CONFLICT (id) DO UPDATE SET
            (workspace_id, backend_kind, backend_runtime_id, image, state, last_started_at,
             last_used_at, expires_at, created_at, updated_at)
          = (EXCLUDED.workspace_id, EXCLUDED.backend_kind, EXCLUDED.backend_runtime_id,
             EXCLUDED.image, EXCLUDED.state, EXCLUDED.last_started_at, EXCLUDED.last_used_at,
             EXCLUDED.expires_at, EXCLUDED.created_at, EXCLUDED.updated_at);
    END IF;

    INSERT INTO grove.events (stream_id, stream_version, event_type, event_version, payload,
                              metadata, command_id, recorded_at)
    SELECT e.stream_id,
           coalesce((SELECT max(x.stream_version) FROM grove.events x
                      WHERE x.stream_id = e.stream_id), 0)
               + row_number() OVER (PARTITION BY e.stream_id ORDER BY e.ord),
           e.event_type, e.event_version, e.payload, p_metadata, p_command_id, p_at
      FROM unnest(p_streams, p_types, p_versions, p_payloads)
           WITH ORDINALITY AS e(stream_id, event_type, event_version, payload, ord)
     ORDER BY e.ord;

    RETURN (pg_current_xact_id() :: text :: bigint % 4294967296) :: text;
END;
$$;


-- A queued job's outcome that appends no events, and the worker's next claim, in one
-- statement (its own transaction, flushed at commit as any outcome): the fence check of
-- its locks (FOR KEY SHARE, as check_fences), the ledger row finished if this worker's
-- attempt still owns it and its job closed and secret deleted (as the queue's
-- record_outcome), then grove.claim_next. Instead of BEGIN, the fence check, the
-- outcome, the claim and COMMIT, each a round trip.
--
-- The first row says what happened (fenced: a lease is gone and nothing was written;
-- recorded false: another attempt owns the command and nothing was written); each
-- further row is a claimed job, as grove.claim_next returns it.
CREATE FUNCTION grove.finish_claiming(
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
