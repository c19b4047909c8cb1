-- The data boundary: operator grants for local repository URLs, and the deployment's
-- secret for keyed token fingerprints (ADR 22).

-- A command the operator submitted from the host's CLI, which may therefore name a local
-- repository outside the allow-list (never inside $GROVE_HOME). Written by the CLI in
-- the transaction that enqueues the command, bound to the URL it names, and read by the
-- worker that handles it. The HTTP API, MCP and grove.enqueue never write it. Deleted
-- with its ledger row.
CREATE TABLE grove.operator_grants (
    command_id uuid PRIMARY KEY REFERENCES grove.commands (command_id) ON DELETE CASCADE,
    repo_url text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Secrets of this deployment, shared by every worker on every node. `auth_scope` keys
-- the HMAC of git tokens (`auth_scope_hash`); the first worker to need it generates it.
-- Only grove's own role reads this schema.
CREATE TABLE grove.instance_keys (
    name text PRIMARY KEY,
    key bytea NOT NULL CHECK (octet_length(key) = 32),
    created_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON grove.operator_grants, grove.instance_keys FROM PUBLIC;
