-- grove's schema: the event log, the three projections, the command ledger and the
-- enqueue function. apalis-postgres owns the `apalis` schema (job rows, workers); grove
-- writes job rows through grove.enqueue so that the ledger and the job commit together.

-- The append-only event log. `position` is a global sequence (it may have gaps and its
-- order is the order of insertion, not of commit); readers that follow the log order by
-- (tx_id, position) and read only transactions older than the snapshot's xmin, so a
-- transaction that commits late is never skipped.
CREATE TABLE grove.events (
    position bigserial PRIMARY KEY,
    tx_id xid8 NOT NULL DEFAULT pg_current_xact_id(),
    stream_id text NOT NULL,
    stream_version bigint NOT NULL,
    event_type text NOT NULL,
    event_version integer NOT NULL,
    payload jsonb NOT NULL,
    metadata jsonb NOT NULL,
    command_id uuid NOT NULL,
    recorded_at timestamptz NOT NULL,
    CONSTRAINT events_stream_version_unique UNIQUE (stream_id, stream_version),
    CONSTRAINT events_stream_version_positive CHECK (stream_version > 0)
);
CREATE INDEX events_commit_order ON grove.events (tx_id, position);
CREATE INDEX events_command ON grove.events (command_id);

CREATE FUNCTION grove.forbid_event_mutation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'grove.events is append-only' USING ERRCODE = 'GRV01';
END;
$$;
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON grove.events
    FOR EACH ROW EXECUTE FUNCTION grove.forbid_event_mutation();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON grove.events
    FOR EACH STATEMENT EXECUTE FUNCTION grove.forbid_event_mutation();

-- Wakes followers (`grove events --follow`) at commit; they fall back to polling.
CREATE FUNCTION grove.notify_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('grove_events', '');
    RETURN NULL;
END;
$$;
CREATE TRIGGER events_notify AFTER INSERT ON grove.events
    FOR EACH STATEMENT EXECUTE FUNCTION grove.notify_events();

-- Projections. Every column is a function of the event log (timestamps come from the
-- events' recorded_at), so `grove replay --verify` can rebuild and compare them.
CREATE TABLE grove.sandbox_repo_caches (
    id uuid PRIMARY KEY,
    node text NOT NULL,
    identity text NOT NULL,
    repo_name text NOT NULL,
    repo_url text NOT NULL,
    provider text NOT NULL,
    provider_host text NOT NULL,
    local_path text NOT NULL,
    auth_scope_hash text,
    last_fetched_at timestamptz,
    last_used_at timestamptz NOT NULL,
    size_bytes bigint NOT NULL,
    state text NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE UNIQUE INDEX sandbox_repo_caches_identity ON grove.sandbox_repo_caches (node, identity);

CREATE TABLE grove.sandbox_workspaces (
    id uuid PRIMARY KEY,
    repo_cache_id uuid NOT NULL,
    node text NOT NULL,
    project_id text NOT NULL,
    user_id text NOT NULL,
    mode text NOT NULL CHECK (mode IN ('analysis', 'edit', 'task')),
    conversation_id text,
    task_id text,
    base_ref text NOT NULL,
    base_commit text NOT NULL,
    branch_name text,
    local_path text NOT NULL,
    state text NOT NULL,
    dirty boolean NOT NULL,
    pinned_until timestamptz,
    last_used_at timestamptz NOT NULL,
    size_bytes bigint NOT NULL,
    writable boolean NOT NULL,
    isolated boolean NOT NULL,
    persistent boolean NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE UNIQUE INDEX sandbox_workspaces_analysis_key ON grove.sandbox_workspaces
    (user_id, project_id, base_ref) WHERE mode = 'analysis';
CREATE UNIQUE INDEX sandbox_workspaces_edit_key ON grove.sandbox_workspaces
    (user_id, project_id, conversation_id) WHERE mode = 'edit';
CREATE UNIQUE INDEX sandbox_workspaces_task_key ON grove.sandbox_workspaces
    (user_id, project_id, task_id) WHERE mode = 'task';
CREATE INDEX sandbox_workspaces_user ON grove.sandbox_workspaces (user_id);
CREATE INDEX sandbox_workspaces_repo_cache ON grove.sandbox_workspaces (repo_cache_id);

CREATE TABLE grove.sandbox_runtimes (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    backend_kind text NOT NULL,
    backend_runtime_id text NOT NULL,
    image text,
    state text NOT NULL,
    last_started_at timestamptz,
    last_used_at timestamptz NOT NULL,
    expires_at timestamptz,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE UNIQUE INDEX sandbox_runtimes_workspace ON grove.sandbox_runtimes (workspace_id, backend_kind);

-- The command ledger: one row per command_id. It makes enqueue idempotent (a second
-- enqueue of the same id is a no-op) and records each command's outcome exactly once.
CREATE TABLE grove.commands (
    command_id uuid PRIMARY KEY,
    kind text NOT NULL,
    payload jsonb NOT NULL,
    queue text NOT NULL,
    job_id text NOT NULL,
    status text NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed')),
    attempts integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL,
    worker_id text,
    result jsonb,
    error jsonb,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz
);
CREATE INDEX commands_running ON grove.commands (worker_id) WHERE status = 'running';
CREATE INDEX commands_finished_at ON grove.commands (finished_at) WHERE finished_at IS NOT NULL;

-- Git tokens handed from a caller to the worker for one command. UNLOGGED: never in
-- the WAL, emptied by a crash; each row is deleted when its command finishes.
CREATE UNLOGGED TABLE grove.command_secrets (
    command_id uuid PRIMARY KEY,
    token text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Enqueues one command: a ledger row and a job row in the caller's transaction, or
-- nothing when the command_id is already known. Returns the job id and whether this
-- call inserted it. Any service sharing the database may call it in its own
-- transaction; a rollback enqueues nothing.
CREATE FUNCTION grove.enqueue(
    p_command_id uuid,
    p_payload jsonb,
    p_queue text,
    p_max_attempts integer DEFAULT NULL
) RETURNS TABLE (job_id text, inserted boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_job_id text;
BEGIN
    IF p_payload ->> 'command' IS NULL THEN
        RAISE EXCEPTION 'grove.enqueue: payload names no command' USING ERRCODE = '22023';
    END IF;
    -- An exec is never retried (a command may not be safe to run twice); every other
    -- command is idempotent and gets five attempts unless the caller says otherwise.
    p_max_attempts := coalesce(p_max_attempts, CASE WHEN p_payload ->> 'command' = 'exec' THEN 1 ELSE 5 END);
    v_job_id := apalis.generate_ulid();
    INSERT INTO grove.commands (command_id, kind, payload, queue, job_id, status, max_attempts)
    VALUES (p_command_id, p_payload ->> 'command', p_payload, p_queue, v_job_id, 'queued', p_max_attempts)
    ON CONFLICT (command_id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN QUERY SELECT c.job_id, false FROM grove.commands c WHERE c.command_id = p_command_id;
        RETURN;
    END IF;
    INSERT INTO apalis.jobs (job, id, job_type, status, attempts, max_attempts, run_at, priority, idempotency_key)
    VALUES (convert_to(jsonb_build_object('command_id', p_command_id)::text, 'UTF8'), v_job_id, p_queue,
            'Pending', 0, p_max_attempts, now(), 0, p_command_id::text);
    RETURN QUERY SELECT v_job_id, true;
END;
$$;
