-- Eviction: evicted workspaces keep their record (state 'evicted') with where their work
-- was saved, sizes are cached with the time they were measured, and the sweep finds the
-- commands in flight per workspace through an index.

ALTER TABLE grove.sandbox_workspaces
    ADD COLUMN size_measured_at timestamptz,
    ADD COLUMN evicted_at timestamptz,
    -- The saved work of an evicted workspace: the internal ref and commit in its repo
    -- cache, the HEAD it is restored at, and the patch artifact (null: no changes).
    ADD COLUMN saved_ref text,
    ADD COLUMN saved_commit text,
    ADD COLUMN saved_head text,
    ADD COLUMN saved_patch text,
    ADD CONSTRAINT sandbox_workspaces_saved_complete CHECK (
        (saved_ref IS NULL) = (saved_commit IS NULL) AND (saved_ref IS NULL) = (saved_head IS NULL)
    );

-- Rows written before this migration were only ever measured at creation, which is what
-- replaying their `workspace.created` event gives.
UPDATE grove.sandbox_workspaces SET size_measured_at = created_at;

-- "Is a command queued or running for this workspace?" for every workspace of a node.
CREATE INDEX commands_open_by_workspace ON grove.commands ((payload ->> 'workspace_id'))
    WHERE status IN ('queued', 'running');

-- Evicted records holding saved work, per repo cache (a cache they need is never evicted).
CREATE INDEX sandbox_workspaces_saved_by_cache ON grove.sandbox_workspaces (repo_cache_id)
    WHERE saved_ref IS NOT NULL;
CREATE INDEX sandbox_workspaces_node ON grove.sandbox_workspaces (node);
