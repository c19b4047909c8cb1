-- Progress of a running clone or fetch (ADR 25): a snapshot the worker overwrites at
-- most twice a second while the command runs, read by `GET /v1/progress` and the CLI's
-- progress bar. Not an event: it says nothing the projections need, so replay stays
-- exact; it stays on the ledger row after the command ends (its last phase) and goes
-- with the row when the ledger is pruned.
ALTER TABLE grove.commands ADD COLUMN progress jsonb;
