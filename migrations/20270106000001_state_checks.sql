-- The lifecycle states as a closed set in the database too (grove_core::state): a row can
-- only hold a state this release knows. NOT VALID: rows written before are not
-- rescanned at upgrade (the store's reader refuses an unknown one as corrupt); every new
-- or updated row is checked.
ALTER TABLE grove.sandbox_repo_caches
    ADD CONSTRAINT sandbox_repo_caches_state_known
    CHECK (state IN ('ready', 'evicted')) NOT VALID;
ALTER TABLE grove.sandbox_workspaces
    ADD CONSTRAINT sandbox_workspaces_state_known
    CHECK (state IN ('ready', 'released', 'evicting', 'evicted')) NOT VALID;
ALTER TABLE grove.sandbox_runtimes
    ADD CONSTRAINT sandbox_runtimes_state_known
    CHECK (state IN ('running', 'stopped')) NOT VALID;
