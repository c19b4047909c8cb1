-- Fewer index entries per job row (ADR 39). Every update of an apalis.jobs row is a
-- non-HOT update (its status is in an index predicate), so it adds an entry to every
-- index of the table; a queued job's row is updated twice (claim, outcome). A WAL
-- profile of jobs_throughput (pg_waldump, per relation) put these two indexes at about
-- a fifth of a job's WAL:
--
-- 1. idx_jobs_idempotency_key (job_type, idempotency_key), UNIQUE: grove never looks a
--    job up by it and never inserts with ON CONFLICT on it. A command's single job is
--    guaranteed by the ledger (grove.commands' primary key, checked before the job row
--    is inserted by grove.enqueue and grove.record_inline); the job carries the command
--    id only for the claim to read.
-- 2. idx_apalis_jobs_lock_by (lock_by) held an entry for every finished job (lock_by
--    NULL). Every query by lock_by (the orphan recovery, a worker's stale jobs, the
--    workers' prune and the foreign key's checks) asks for one worker's id, which a
--    partial index over the locked rows answers.

DROP INDEX IF EXISTS apalis.idx_jobs_idempotency_key;
DROP INDEX IF EXISTS apalis.idx_apalis_jobs_lock_by;
CREATE INDEX jobs_locked_by ON apalis.jobs (lock_by) WHERE lock_by IS NOT NULL;
