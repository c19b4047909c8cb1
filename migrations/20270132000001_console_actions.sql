-- Who asked for a command from the operator console (ADR 29). The console's rewind and
-- fork act on a workspace as the signed-in user (an operator may act on another
-- user's workspace); their events carry the workspace's correlation like every other
-- command's, and this row names the requester next to the ledger row. Written in the
-- enqueue's transaction, only when that transaction inserted the command; it goes with
-- its ledger row.
CREATE TABLE grove.command_requesters (
    command_id uuid PRIMARY KEY REFERENCES grove.commands (command_id) ON DELETE CASCADE,
    requested_by text NOT NULL,
    via text NOT NULL
);
