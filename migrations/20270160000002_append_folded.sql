-- A command's durable step in one statement (ADR 36): the events appended onto
-- projection rows the command already holds, folded by grove (Projections::apply) from
-- the version it read, instead of BEGIN, a locking read, an upsert per row, the insert
-- and COMMIT, each a round trip.
--
-- grove.append_folded(p_rows, events...) locks each row the fold read (FOR UPDATE) and
-- checks that its version is still the one the fold started from (its xmin; NULL: the
-- row did not exist); any other raises GRV02 and the caller appends the usual way. Then
-- it writes the folded rows (upserts and deletes) and inserts the events as
-- grove_postgres::store::append does, positions drawn after the row locks. Returns the
-- xmin the written rows now carry, for the command's next step.
--
-- p_rows: {"expect": [{"table", "id", "xmin"}], "upsert": {"<table>": [row, ...]},
--          "delete": [{"table", "id"}]}, every row keyed by its column names.
CREATE FUNCTION grove.append_folded(
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

    DELETE FROM grove.sandbox_repo_caches WHERE id IN (
        SELECT (d ->> 'id')::uuid FROM jsonb_array_elements(p_rows -> 'delete') d
         WHERE d ->> 'table' = 'sandbox_repo_caches');
    DELETE FROM grove.sandbox_workspaces WHERE id IN (
        SELECT (d ->> 'id')::uuid FROM jsonb_array_elements(p_rows -> 'delete') d
         WHERE d ->> 'table' = 'sandbox_workspaces');
    DELETE FROM grove.sandbox_runtimes WHERE id IN (
        SELECT (d ->> 'id')::uuid FROM jsonb_array_elements(p_rows -> 'delete') d
         WHERE d ->> 'table' = 'sandbox_runtimes');

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

    INSERT INTO grove.sandbox_runtimes
    SELECT r.* FROM jsonb_array_elements(p_rows -> 'upsert' -> 'sandbox_runtimes') j,
           LATERAL jsonb_populate_record(NULL::grove.sandbox_runtimes, j) r
    ON CONFLICT (id) DO UPDATE SET
        (workspace_id, backend_kind, backend_runtime_id, image, state, last_started_at,
         last_used_at, expires_at, created_at, updated_at)
      = (EXCLUDED.workspace_id, EXCLUDED.backend_kind, EXCLUDED.backend_runtime_id,
         EXCLUDED.image, EXCLUDED.state, EXCLUDED.last_started_at, EXCLUDED.last_used_at,
         EXCLUDED.expires_at, EXCLUDED.created_at, EXCLUDED.updated_at);

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

-- grove.record_inline and the append in one statement: nothing is appended when the
-- command id is taken or a lease is gone; a row that was not recorded raises (GRV03).
CREATE FUNCTION grove.record_inline_folded(
    p_command_id uuid, p_payload jsonb, p_queue text, p_worker text,
    p_max_attempts integer, p_keys bigint[], p_holders uuid[], p_status text,
    p_result jsonb, p_error jsonb, p_job_status text,
    p_rows jsonb, p_streams text[], p_types text[], p_versions integer[],
    p_payloads jsonb[], p_metadata jsonb, p_at timestamptz
) RETURNS TABLE (job_id text, inserted boolean, fenced boolean, row_xmin text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM grove.record_inline(p_command_id, p_payload, p_queue, p_worker,
        p_max_attempts, p_keys, p_holders, p_status, p_result, p_error, p_job_status);
    IF r.fenced OR NOT r.inserted THEN
        RETURN QUERY SELECT r.job_id, r.inserted, r.fenced, NULL::text;
        RETURN;
    END IF;
    IF NOT r.recorded THEN
        RAISE EXCEPTION 'grove.record_inline_folded: the ledger row just inserted was not running'
            USING ERRCODE = 'GRV03';
    END IF;
    RETURN QUERY SELECT r.job_id, true, false,
        grove.append_folded(p_rows, p_streams, p_types, p_versions, p_payloads, p_metadata,
                            p_command_id, p_at);
END;
$$;

-- grove.start_inline and the start events in one statement (an exec's start): nothing
-- is appended when the command id is taken.
CREATE FUNCTION grove.start_inline_folded(
    p_command_id uuid, p_payload jsonb, p_queue text, p_worker text,
    p_max_attempts integer,
    p_rows jsonb, p_streams text[], p_types text[], p_versions integer[],
    p_payloads jsonb[], p_metadata jsonb, p_at timestamptz
) RETURNS TABLE (job_id text, inserted boolean, row_xmin text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM grove.start_inline(p_command_id, p_payload, p_queue, p_worker,
                                            p_max_attempts);
    IF NOT r.inserted THEN
        RETURN QUERY SELECT r.job_id, false, NULL::text;
        RETURN;
    END IF;
    RETURN QUERY SELECT r.job_id, true,
        grove.append_folded(p_rows, p_streams, p_types, p_versions, p_payloads, p_metadata,
                            p_command_id, p_at);
END;
$$;

-- A started command's outcome and its events in one statement (an inline exec's end):
-- the fence check of its locks (FOR KEY SHARE, as check_fences), the ledger row finished
-- if this worker's attempt still owns it (as the queue's record_outcome), its job closed,
-- its secret deleted, and the append. fenced true or recorded false: nothing written.
CREATE FUNCTION grove.finish_folded(
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
    RETURN QUERY SELECT false, true,
        grove.append_folded(p_rows, p_streams, p_types, p_versions, p_payloads, p_metadata,
                            p_command_id, p_at);
END;
$$;
