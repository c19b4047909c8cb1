-- The log's followers are woken after the commit, not by an insert trigger (ADR 36).
-- A NOTIFY inside a transaction that writes takes Postgres' database-wide notification
-- lock at commit and holds it through the WAL flush, so every commit that appended
-- events queued behind the others: the queue's throughput stayed flat however many
-- workers ran. The appenders now send NOTIFY grove_events in a statement of their own
-- after the commit (grove_postgres::store::announce_appended, and with a command's own
-- announcement), which writes no WAL and is not flushed. A notification lost between
-- the two only delays followers until their next poll, as before.
DROP TRIGGER events_notify ON grove.events;
DROP FUNCTION grove.notify_events();
