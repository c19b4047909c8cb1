-- Indexes for the gauges `/metrics` reads at scrape time (crates/grove-postgres/src/fleet.rs):
-- open jobs per queue without touching finished ones, and workspaces and repo caches per
-- node and state with their sizes from the index alone.
CREATE INDEX IF NOT EXISTS grove_jobs_open_by_queue ON apalis.jobs (job_type, status, run_at)
    WHERE status IN ('Pending', 'Queued', 'Running');
CREATE INDEX sandbox_workspaces_node_state ON grove.sandbox_workspaces (node, state) INCLUDE (size_bytes);
CREATE INDEX sandbox_repo_caches_node_state ON grove.sandbox_repo_caches (node, state) INCLUDE (size_bytes);
