//! Reads answered in the process that receives them (ADR 24): the port a worker
//! offers to the API server it shares a process with.
//!
//! A read tool (view, read_file, list_dir, search, git status/diff/log) changes
//! nothing, so it needs no ledger row, no event and no queue: the receiving process
//! runs it directly when the workspace lives on its node, under the workspace's shared
//! command lock and with the same path rules as the queued handler. Every other call,
//! and every read of a workspace on another node or in a remote provider, goes through
//! the queue as before.
//!
//! Writes and execs (ADR 31): a file write tool or an exec of a workspace on the
//! receiving process's node also runs in that process ([`InlineWrites`]), with its
//! ledger row, the workspace's exclusive lock and fencing as the queued handler takes
//! them, in the fewest flushed commits that keep the queue's guarantees.
//!
//! Reuses (ADR 34): an acquire whose key's workspace exists, whole, on the receiving
//! process's node, and an ensure of a cache fresh enough to need no fetch, also run
//! there ([`InlineWrites::reuse`]): one commit of ledger row, job, events and outcome.
//! Every other acquire or ensure (a create, a restore, a fetch, a remote placement)
//! takes the queue under the same command id.

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use uuid::Uuid;

use crate::commands::{AcquireWorkspace, Command, CommandResult};
use crate::decide::acquire::{acquire_step, AcquireStep};
use crate::error::CommandError;
use crate::model::WorkspaceRow;
use crate::placement::Placement;
use crate::ports::GitToken;
use crate::state::WorkspaceState;
use crate::tools::{ToolOp, ToolOutput};

/// Runs read tools against workspaces of one node, in the calling process.
pub trait InlineReads: Send + Sync {
    /// The node whose workspaces this process holds.
    fn node(&self) -> &str;

    /// Runs `op` (a read: `!op.is_write()`) against the workspace under its shared
    /// command lock; the workspace is re-read under the lock, so one evicted or
    /// destroyed meanwhile answers as the queued handler would.
    fn read<'a>(
        &'a self,
        workspace_id: Uuid,
        op: &'a ToolOp,
    ) -> BoxFuture<'a, Result<ToolOutput, CommandError>>;
}

/// Runs write tools and execs of one node's workspaces in the calling process (ADR 31).
pub trait InlineWrites: Send + Sync {
    /// Runs `command` (one that [`runs_inline`] accepts) under `command_id`: its ledger
    /// row, the workspace's exclusive command lock (the row re-read under it), the
    /// effect, and its events and outcome. `Ok(None)` when the command id is already in
    /// the ledger (a retry, or the same command on the queue path): nothing ran, and the
    /// caller waits for that command's recorded outcome as a queue caller does.
    fn run<'a>(
        &'a self,
        command_id: Uuid,
        command: &'a Command,
    ) -> BoxFuture<'a, Result<Option<CommandResult>, CommandError>>;

    /// Runs `command` (one that [`reuses_inline`] accepts) under `command_id` when its
    /// decision, taken under the queued handler's lock, is the cheap one
    /// ([`reacquires_inline`]; an ensure of a cache that needs no fetch): its ledger
    /// row, job, events and outcome in one commit. `Ok(None)` when it is not (nothing
    /// was recorded, the command takes the queue) or when the command id is already in
    /// the ledger; either way the caller submits it to the queue under the same id.
    /// `token` is the caller's git token, which decides whether a cache cloned with
    /// credentials may be reused without a fetch.
    fn reuse<'a>(
        &'a self,
        command_id: Uuid,
        command: &'a Command,
        token: Option<&'a GitToken>,
    ) -> BoxFuture<'a, Result<Option<CommandResult>, CommandError>>;
}

/// Whether `command` may be offered to [`InlineWrites::reuse`]: an acquire that asks
/// for no remote placement, or an ensure that asks for no fetch. Whether it does run
/// inline is decided under the lock.
pub fn reuses_inline(command: &Command) -> bool {
    match command {
        Command::AcquireWorkspace(c) => c.remote_placement().is_none(),
        Command::EnsureRepoCache(c) => !c.fetch,
        _ => false,
    }
}

/// Whether the acquire `c`, served by a process of `node`, is the cheap case that runs
/// inline: the key's workspace `existing` lives on that node (not in a remote
/// provider), has its files and its directory (`dir_exists`), so the queued handler
/// would only re-acquire it. A create, a restore and every refusal take the queue.
pub fn reacquires_inline(
    node: &str,
    c: &AcquireWorkspace,
    existing: Option<&WorkspaceRow>,
    dir_exists: bool,
) -> bool {
    c.remote_placement().is_none()
        && existing.is_some_and(
            |ws| matches!(Placement::of_node(&ws.node), Placement::Node(n) if n == node),
        )
        && matches!(
            acquire_step(existing, node, None, dir_exists),
            Ok(AcquireStep::Reacquire)
        )
}

/// Whether a use of a workspace or cache last recorded at `last_used_at` is recent
/// enough at `at` that a warm acquire or ensure answers without recording another
/// (ADR 40): younger than `window` (a clock that went back counts as age 0). A `window`
/// of zero records every use.
pub fn use_is_recent(last_used_at: DateTime<Utc>, at: DateTime<Utc>, window: Duration) -> bool {
    let age = (at - last_used_at).to_std().unwrap_or_default();
    age < window
}

/// Whether a warm acquire of `ws` (which [`reacquires_inline`] accepts) answers from its
/// row without recording (ADR 40): the workspace is `ready` (a released one turns ready
/// only by a recorded acquire) and its last recorded use is recent ([`use_is_recent`]).
pub fn reacquire_is_recent(ws: &WorkspaceRow, at: DateTime<Utc>, window: Duration) -> bool {
    ws.state == WorkspaceState::Ready && use_is_recent(ws.last_used_at, at, window)
}

/// Whether `op` is a file write tool that runs inline (ADR 31): `create`,
/// `str_replace`, `insert`, `write_file`. Git and history tools keep the queue.
pub fn is_inline_write(op: &ToolOp) -> bool {
    matches!(
        op,
        ToolOp::Create { .. }
            | ToolOp::StrReplace { .. }
            | ToolOp::Insert { .. }
            | ToolOp::WriteFile { .. }
    )
}

/// Whether `command` on `ws` may run inline in a process serving `node`: a file write
/// tool or an exec of a workspace whose files are on that node (a read-only workspace's
/// refusal is then the inline handler's, as the queued one's would be). Anything else (another node's or a remote provider's workspace, an evicted one,
/// every other command) takes the queue.
pub fn runs_inline(node: &str, ws: &WorkspaceRow, command: &Command) -> bool {
    let local = ws.state.has_files()
        && matches!(Placement::of_node(&ws.node), Placement::Node(n) if n == node);
    local
        && match command {
            Command::Tool(t) => t.workspace_id == ws.id && is_inline_write(&t.op),
            Command::Exec(e) => e.workspace_id == ws.id,
            _ => false,
        }
}

/// Whether `op` on `ws` may be answered inline by a process serving `node`: a read,
/// of a workspace whose files are on that node. Anything else takes the queue.
pub fn answers_inline(node: &str, ws: &WorkspaceRow, op: &ToolOp) -> bool {
    !op.is_write()
        && !op.is_history()
        && ws.state.has_files()
        && matches!(Placement::of_node(&ws.node), Placement::Node(n) if n == node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::fixtures::row;
    use crate::model::WorkspaceMode;
    use crate::tools::ToolRequest;

    #[test]
    fn only_file_writes_and_execs_of_this_nodes_workspaces_run_inline() {
        let ws = |node: &str, state: &str| row(WorkspaceMode::Edit, node, state);
        let here = ws("n1", "ready");
        let tool = |op: ToolOp| {
            Command::Tool(ToolRequest {
                workspace_id: here.id,
                op,
            })
        };
        let write = tool(ToolOp::WriteFile {
            path: "a".into(),
            content: "b".into(),
        });
        let edit = tool(ToolOp::StrReplace {
            path: "a".into(),
            old_str: "b".into(),
            new_str: "c".into(),
        });
        let commit = tool(ToolOp::GitCommit {
            message: "m".into(),
            paths: vec![],
            author_name: None,
            author_email: None,
        });
        let undo = tool(ToolOp::Undo);
        let read = tool(ToolOp::GitStatus);
        let exec = Command::Exec(crate::commands::Exec {
            workspace_id: here.id,
            runtime: "local".into(),
            argv: vec!["true".into()],
            env: Default::default(),
            cwd: None,
            stdin: None,
            timeout_ms: None,
            max_output_bytes: None,
            kind: None,
            network: None,
            keep_output: true,
        });
        assert!(runs_inline("n1", &here, &write));
        assert!(runs_inline("n1", &here, &edit));
        assert!(runs_inline("n1", &here, &exec));
        for (command, why) in [(&commit, "git tool"), (&undo, "history"), (&read, "read")] {
            assert!(!runs_inline("n1", &here, command), "{why}");
        }
        for (node, ws_node, state) in [
            ("n1", "n2", "ready"),
            ("n1", "n1", "evicted"),
            ("daytona", "daytona", "ready"),
        ] {
            let other = ws(ws_node, state);
            assert!(
                !runs_inline(node, &other, &write),
                "{node} {ws_node} {state}"
            );
            assert!(
                !runs_inline(node, &other, &exec),
                "{node} {ws_node} {state}"
            );
        }
        // A command naming another workspace than the row checked never runs inline.
        let mut elsewhere = ws("n1", "ready");
        elsewhere.id = Uuid::from_u128(8);
        assert!(!runs_inline("n1", &elsewhere, &write));
    }

    fn acquire(runtime: Option<&str>) -> AcquireWorkspace {
        AcquireWorkspace {
            user_id: "u".into(),
            project_id: "p".into(),
            repo_name: "o/r".into(),
            repo_url: "https://example.com/o/r.git".into(),
            base_ref: "main".into(),
            mode: WorkspaceMode::Edit,
            conversation_id: Some("s".into()),
            task_id: None,
            runtime: runtime.map(Into::into),
            history_ignored: false,
        }
    }

    #[test]
    fn only_acquires_without_remote_placement_and_ensures_without_fetch_are_offered() {
        let ensure = |fetch| {
            Command::EnsureRepoCache(crate::commands::EnsureRepoCache {
                repo_name: "o/r".into(),
                repo_url: "https://example.com/o/r.git".into(),
                fetch,
            })
        };
        assert!(reuses_inline(&ensure(false)));
        assert!(!reuses_inline(&ensure(true)), "a fetch asked for");
        for runtime in [None, Some("local"), Some("docker")] {
            assert!(
                reuses_inline(&Command::AcquireWorkspace(acquire(runtime))),
                "{runtime:?}"
            );
        }
        for runtime in ["daytona", "e2b"] {
            let c = Command::AcquireWorkspace(acquire(Some(runtime)));
            assert!(!reuses_inline(&c), "{runtime}");
        }
        let pin = Command::PinWorkspace {
            workspace_id: Uuid::nil(),
            until: None,
        };
        assert!(!reuses_inline(&pin));
    }

    #[test]
    fn only_an_acquire_of_a_whole_workspace_on_this_node_reacquires_inline() {
        let ws = |node: &str, state: &str| row(WorkspaceMode::Edit, node, state);
        // (served node, recorded (node, state), directory exists, placement, inline?)
        let cases = [
            ("n1", Some(("n1", "ready")), true, None, true),
            ("n1", Some(("n1", "released")), true, None, true),
            ("n1", Some(("n1", "ready")), true, Some("docker"), true),
            // A create, a restore, a refusal: the queue.
            ("n1", None, false, None, false),
            ("n1", Some(("n1", "evicted")), false, None, false),
            ("n1", Some(("n1", "evicting")), true, None, false),
            ("n1", Some(("n1", "ready")), false, None, false),
            ("n1", Some(("n2", "ready")), true, None, false),
            // Remote placements, asked for or recorded.
            ("n1", Some(("n1", "ready")), true, Some("e2b"), false),
            (
                "daytona",
                Some(("daytona", "ready")),
                false,
                Some("daytona"),
                false,
            ),
            ("daytona", Some(("daytona", "ready")), true, None, false),
        ];
        for (node, recorded, dir, runtime, want) in cases {
            let existing = recorded.map(|(n, s)| ws(n, s));
            assert_eq!(
                reacquires_inline(node, &acquire(runtime), existing.as_ref(), dir),
                want,
                "{node} {recorded:?} dir={dir} {runtime:?}"
            );
        }
    }

    #[test]
    fn a_warm_acquire_answers_unrecorded_only_for_a_ready_workspace_used_within_the_window() {
        let at = chrono::Utc::now();
        let minute = Duration::from_secs(60);
        let used = |state: &str, ago_secs: i64| {
            let mut ws = row(WorkspaceMode::Edit, "n1", state);
            ws.last_used_at = at - chrono::Duration::seconds(ago_secs);
            ws
        };
        assert!(reacquire_is_recent(&used("ready", 5), at, minute));
        assert!(
            reacquire_is_recent(&used("ready", -30), at, minute),
            "clock went back"
        );
        assert!(
            !reacquire_is_recent(&used("ready", 60), at, minute),
            "window is strict"
        );
        assert!(!reacquire_is_recent(&used("ready", 3600), at, minute));
        assert!(
            !reacquire_is_recent(&used("released", 5), at, minute),
            "turns ready"
        );
        assert!(
            !reacquire_is_recent(&used("ready", 0), at, Duration::ZERO),
            "0: record"
        );
    }

    #[test]
    fn only_reads_of_ready_workspaces_on_this_node_answer_inline() {
        let read = ToolOp::GitStatus;
        let write = ToolOp::WriteFile {
            path: "a".into(),
            content: "b".into(),
        };
        let edit = |node: &str, state: &str| row(WorkspaceMode::Edit, node, state);
        // (node served, workspace's node, state, op, inline?)
        let cases = [
            ("n1", "n1", "ready", &read, true),
            ("n1", "n1", "released", &read, true),
            ("n1", "n1", "ready", &write, false),
            (
                "n1",
                "n1",
                "ready",
                &ToolOp::History {
                    offset: None,
                    limit: None,
                },
                false,
            ),
            ("n1", "n2", "ready", &read, false),
            ("n1", "n1", "evicted", &read, false),
            ("n1", "n1", "evicting", &read, false),
            ("daytona", "daytona", "ready", &read, false),
            ("e2b", "e2b", "ready", &read, false),
        ];
        for (node, ws_node, state, op, want) in cases {
            assert_eq!(
                answers_inline(node, &edit(ws_node, state), op),
                want,
                "{node} {ws_node} {state} {}",
                op.name()
            );
        }
    }
}
