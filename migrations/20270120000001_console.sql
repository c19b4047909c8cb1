-- The operator console (ADR 29): indexes for its filtered, paged reads of the event log
-- and the ledger, and the last result of `replay --verify` as the console ran it.

-- The Events page filters the log by type and by time, newest first, a page at a time.
CREATE INDEX events_type_position ON grove.events (event_type, position);
CREATE INDEX events_recorded_at ON grove.events (recorded_at);

-- The Fleet page: failures of the last hour and the most recent ones.
CREATE INDEX commands_failed_at ON grove.commands (finished_at) WHERE status = 'failed';

-- The Workspaces page: searched and paged by last use, per node for the disk chart.
CREATE INDEX sandbox_workspaces_last_used ON grove.sandbox_workspaces (last_used_at DESC, id);

-- The last `replay --verify` the console ran (one row per run; the page shows the newest).
CREATE TABLE grove.replay_verifications (
    id bigserial PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    requested_by text NOT NULL,
    events bigint,
    diffs integer,
    -- The first differences, as the CLI prints them; an error, when the run failed.
    report text
);
