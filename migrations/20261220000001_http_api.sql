-- The HTTP API and provision-on-parse: command ids derived from idempotency keys, an
-- enqueue of ensure_repo_cache for services that share this database, and the relay
-- of a streaming exec's output from the worker that runs it to the server that serves it.

-- The command id of an idempotency key in a scope: a version-8 UUID made of the first
-- 16 bytes of SHA-256('grove.idempotency' 0 scope 0 key). Must agree with
-- grove_core::idempotency::command_id_for_key (an e2e test compares them).
CREATE FUNCTION grove.command_id_for_key(p_scope text, p_key text) RETURNS uuid
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    h bytea := substring(sha256(
        convert_to('grove.idempotency', 'UTF8') || '\x00'::bytea ||
        convert_to(p_scope, 'UTF8') || '\x00'::bytea ||
        convert_to(p_key, 'UTF8')) FROM 1 FOR 16);
BEGIN
    h := set_byte(h, 6, (get_byte(h, 6) & 15) | 128);
    h := set_byte(h, 8, (get_byte(h, 8) & 63) | 128);
    RETURN encode(h, 'hex')::uuid;
END;
$$;

-- Provision-on-parse: enqueues ensure_repo_cache in the caller's transaction (a rollback
-- enqueues nothing) under the command id of the key in scope 'sql', so the same key
-- committed twice is one job and one clone. Repo name and URL are checked by the worker
-- (an invalid one fails the command as invalid_input); a key reused for another
-- repository raises unique_violation rather than answer with the other one's outcome.
-- The outcome is in grove.commands (status, result, error) under the returned id, and
-- is announced by NOTIFY grove_command_done.
CREATE FUNCTION grove.enqueue_ensure_repo_cache(
    p_idempotency_key text,
    p_repo_name text,
    p_repo_url text
) RETURNS TABLE (command_id uuid, job_id text, inserted boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
    v_payload jsonb;
    v_stored jsonb;
BEGIN
    IF p_idempotency_key IS NULL OR octet_length(p_idempotency_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'grove.enqueue_ensure_repo_cache: the idempotency key must be 1 to 255 bytes'
            USING ERRCODE = '22023';
    END IF;
    IF p_repo_name IS NULL OR p_repo_url IS NULL THEN
        RAISE EXCEPTION 'grove.enqueue_ensure_repo_cache: repo name and URL are required'
            USING ERRCODE = '22023';
    END IF;
    v_id := grove.command_id_for_key('sql', p_idempotency_key);
    v_payload := jsonb_build_object('command', 'ensure_repo_cache', 'repo_name', p_repo_name,
                                    'repo_url', p_repo_url, 'fetch', false);
    SELECT c.payload INTO v_stored FROM grove.commands c WHERE c.command_id = v_id;
    IF FOUND AND v_stored <> v_payload THEN
        RAISE EXCEPTION 'grove.enqueue_ensure_repo_cache: idempotency key already used for another repository'
            USING ERRCODE = '23505';
    END IF;
    RETURN QUERY SELECT v_id, e.job_id, e.inserted
        FROM grove.enqueue(v_id, v_payload, 'grove:shared') AS e;
END;
$$;

-- Streaming execs: a caller that wants an exec's output while it runs asks for a relay
-- (a row here, written with the enqueue); the worker running the exec then appends the
-- output to grove.exec_output as it comes. UNLOGGED like command_secrets: output is
-- transient (the full result is in the ledger) and never needs the WAL.
CREATE UNLOGGED TABLE grove.exec_relays (
    exec_id uuid PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE UNLOGGED TABLE grove.exec_output (
    exec_id uuid NOT NULL,
    seq integer NOT NULL CHECK (seq > 0),
    stream text NOT NULL CHECK (stream IN ('stdout', 'stderr')),
    data bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (exec_id, seq)
);
CREATE INDEX exec_output_created_at ON grove.exec_output (created_at);

-- Wakes readers of an exec's output at commit (payload: the exec id); they also poll.
CREATE FUNCTION grove.notify_exec_output() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('grove_exec_output', NEW.exec_id::text);
    RETURN NULL;
END;
$$;
CREATE TRIGGER exec_output_notify AFTER INSERT ON grove.exec_output
    FOR EACH ROW EXECUTE FUNCTION grove.notify_exec_output();
