-- Workspace history (ADR 28).
-- A workspace's history events (its points, fork origin and prunings) by stream, so the
-- timeline and the newest point before each change are read without walking the rest of
-- the workspace's stream.
CREATE INDEX events_history ON grove.events (stream_id, stream_version)
    WHERE event_type IN ('workspace.snapshot_taken', 'workspace.forked', 'workspace.history_pruned');

-- A workspace whose points keep ignored files too (the acquire option its
-- `workspace.created` carries).
ALTER TABLE grove.sandbox_workspaces ADD COLUMN history_ignored boolean NOT NULL DEFAULT false;
