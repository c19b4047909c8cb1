-- The W3C traceparent of the span that enqueued a command, when the enqueuer exports
-- traces (ADR 30): read by the worker that claims the job, so its spans continue the
-- caller's trace. Not an event and not in the payload: replay is unaffected.
ALTER TABLE grove.commands ADD COLUMN trace_parent text;
