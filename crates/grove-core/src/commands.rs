//! The job kinds (commands) callers enqueue, their validation and their results.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::merge_back::{MergeBackDiff, MergeBackReport, MergeStrategy};
use crate::model::{
    ExecKind, ExecOutcome, RepoCacheRow, WorkspaceKey, WorkspaceMode, WorkspaceRow,
};
use crate::placement::{Placement, RuntimeKind};
use crate::platform::{
    validate_body, validate_number, validate_title, PullRequest, PullRequestComment,
};
use crate::ports::NetworkPolicy;
use crate::tools::{ToolOutput, ToolRequest};
use crate::validate::{
    validate_branch_scope_id, validate_command, validate_env, validate_owner_id, validate_ref,
    RepoName, RepoUrl, ValidationError,
};

/// Largest stdin a command may carry through the queue.
pub const MAX_STDIN_BYTES: usize = 1024 * 1024;
/// Default and largest output cap of an exec.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 1024 * 1024;
pub const MAX_OUTPUT_BYTES: u64 = 16 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnsureRepoCache {
    pub repo_name: String,
    pub repo_url: String,
    /// Fetch even when the cache is fresh.
    #[serde(default)]
    pub fetch: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireWorkspace {
    pub user_id: String,
    pub project_id: String,
    pub repo_name: String,
    pub repo_url: String,
    pub base_ref: String,
    pub mode: WorkspaceMode,
    pub conversation_id: Option<String>,
    pub task_id: Option<String>,
    /// Where the workspace lives: `None` (or `local`, `docker`: runtimes that mount
    /// host paths) on the node of the worker that places it, `daytona` or `e2b` inside that provider's sandbox of the user and
    /// project (ADR 15). Absent in payloads written before placement existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// A new workspace's history points keep ignored files too, up to
    /// `GROVE_HISTORY_IGNORED_BUDGET_BYTES` each (ADR 28). Fixed when the workspace is
    /// created: acquiring an existing one does not change it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub history_ignored: bool,
}

impl AcquireWorkspace {
    /// The remote provider this acquire places the workspace in, if any (`None`,
    /// `local` and `docker` all mean the worker's node).
    pub fn remote_placement(&self) -> Option<&str> {
        self.runtime
            .as_deref()
            .filter(|r| Placement::of_node(r).is_remote())
    }
    /// The scope part of the uniqueness key.
    pub fn scope(&self) -> &str {
        match self.mode {
            WorkspaceMode::Analysis => &self.base_ref,
            WorkspaceMode::Edit => self.conversation_id.as_deref().unwrap_or(""),
            WorkspaceMode::Task => self.task_id.as_deref().unwrap_or(""),
        }
    }
    pub fn key(&self, node: &str) -> WorkspaceKey {
        WorkspaceKey {
            node: node.to_string(),
            user_id: self.user_id.clone(),
            project_id: self.project_id.clone(),
            mode: self.mode,
            scope: self.scope().to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exec {
    pub workspace_id: Uuid,
    /// Runtime provider name (`local`).
    pub runtime: String,
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    #[serde(default)]
    pub stdin: Option<Vec<u8>>,
    pub timeout_ms: Option<u64>,
    pub max_output_bytes: Option<u64>,
    /// `None`: `write` on a writable workspace, `read` on a read-only one.
    pub kind: Option<ExecKind>,
    /// `None` means [`NetworkPolicy::None`]; broader access only on explicit request.
    #[serde(default)]
    pub network: Option<NetworkPolicy>,
    /// `false`: the output is not kept for the console's timeline (it reaches the caller
    /// and is pruned from the ledger within the hour). Absent from payloads when `true`.
    #[serde(default = "keep_output_default", skip_serializing_if = "is_true")]
    pub keep_output: bool,
}

fn keep_output_default() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// One eviction sweep of one node (job `evict_sweep`, on that node's queue).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictSweep {
    /// The node whose `$GROVE_HOME` is swept; only a worker of that node takes it.
    pub node: String,
    /// The schedule tick this sweep belongs to (cron sweeps: the command id is derived
    /// from `(node, tick)`, so every worker of the node enqueues the same one).
    #[serde(default)]
    pub tick: Option<DateTime<Utc>>,
    /// A clock override for the plan (ages, TTLs, idle times). Refused unless the worker
    /// runs with `GROVE_ALLOW_CLOCK_OVERRIDE=1`: it exists so tests need not sleep.
    #[serde(default)]
    pub now: Option<DateTime<Utc>>,
    #[serde(default)]
    pub trigger: crate::sweep::SweepTrigger,
}

/// Everything of one conversation or one task in one call (job `release_scope`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseScope {
    pub user_id: String,
    /// Limits the release to one project; `None`: every project of the user.
    #[serde(default)]
    pub project_id: Option<String>,
    /// Exactly one of `conversation_id` (edit workspaces) and `task_id` (task workspaces).
    #[serde(default)]
    pub conversation_id: Option<String>,
    #[serde(default)]
    pub task_id: Option<String>,
    /// Destroy the workspaces (files, runtimes, saved work) instead of releasing them.
    #[serde(default)]
    pub destroy_workspaces: bool,
}

/// Brings a task workspace's commits into a writable (edit) workspace of the same user,
/// project and repository (job `merge_back`, on the edit workspace's node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeBack {
    pub edit_workspace_id: Uuid,
    pub task_workspace_id: Uuid,
    pub strategy: MergeStrategy,
}

/// Opens a pull request from the workspace's branch (job `create_pull_request`). The
/// repository is the workspace's (from its repo cache URL), the head its branch; the
/// token travels beside the command (ADR 05), never in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatePullRequest {
    pub workspace_id: Uuid,
    /// The branch to merge into; `None`: the workspace's base ref.
    #[serde(default)]
    pub base: Option<String>,
    pub title: String,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub draft: bool,
}

/// Comments on a pull request of the workspace's repository (job `comment_pull_request`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommentPullRequest {
    pub workspace_id: Uuid,
    pub number: u64,
    pub body: String,
}

/// A command, as stored in the job payload and the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Command {
    EnsureRepoCache(EnsureRepoCache),
    AcquireWorkspace(AcquireWorkspace),
    Exec(Exec),
    ReleaseSession {
        workspace_id: Uuid,
        destroy_runtime: bool,
    },
    HibernateRuntime {
        workspace_id: Uuid,
    },
    DestroyRuntime {
        workspace_id: Uuid,
    },
    DestroyWorkspace {
        workspace_id: Uuid,
    },
    EvictSweep(EvictSweep),
    /// Checks an evicted workspace out again (same id, path and branch) with its saved work.
    RestoreWorkspace {
        workspace_id: Uuid,
    },
    ReleaseScope(ReleaseScope),
    /// Pins a workspace until a time (`None` unpins): eviction never takes a pinned one.
    PinWorkspace {
        workspace_id: Uuid,
        until: Option<DateTime<Utc>>,
    },
    /// One agent tool operation (text editor, files, search, git) on a workspace.
    Tool(ToolRequest),
    /// Brings a task workspace's commits into an edit workspace's branch.
    MergeBack(MergeBack),
    /// Reads what a merge-back would bring (commits and changed files); changes nothing.
    MergeBackDiff {
        edit_workspace_id: Uuid,
        task_workspace_id: Uuid,
    },
    CreatePullRequest(CreatePullRequest),
    CommentPullRequest(CommentPullRequest),
}

impl Command {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::EnsureRepoCache(_) => "ensure_repo_cache",
            Self::AcquireWorkspace(_) => "acquire_workspace",
            Self::Exec(_) => "exec",
            Self::ReleaseSession { .. } => "release_session",
            Self::HibernateRuntime { .. } => "hibernate_runtime",
            Self::DestroyRuntime { .. } => "destroy_runtime",
            Self::DestroyWorkspace { .. } => "destroy_workspace",
            Self::EvictSweep(_) => "evict_sweep",
            Self::RestoreWorkspace { .. } => "restore_workspace",
            Self::ReleaseScope(_) => "release_scope",
            Self::PinWorkspace { .. } => "pin_workspace",
            Self::Tool(_) => "tool",
            Self::MergeBack(_) => "merge_back",
            Self::MergeBackDiff { .. } => "merge_back_diff",
            Self::CreatePullRequest(_) => "create_pull_request",
            Self::CommentPullRequest(_) => "comment_pull_request",
        }
    }

    /// Whether running the command twice is safe, so a job whose worker died is retried.
    /// An exec is not: it ends as `worker_lost` instead of running behind the caller's back.
    pub fn is_idempotent(&self) -> bool {
        match self {
            Self::Exec(_) => false,
            Self::Tool(t) => t.op.is_idempotent(),
            // It makes commits: a delivery that finds it running ends as worker_lost.
            Self::MergeBack(_) => false,
            // Opening a pull request or commenting twice makes two (or a refusal): one
            // attempt, and a lost worker's job ends as `worker_lost`.
            Self::CreatePullRequest(_) | Self::CommentPullRequest(_) => false,
            _ => true,
        }
    }

    /// The workspace this command acts on, if it names one.
    pub fn workspace_id(&self) -> Option<Uuid> {
        match self {
            Self::Exec(e) => Some(e.workspace_id),
            Self::Tool(t) => Some(t.workspace_id),
            // The target: the job runs on its node (the task must live there too).
            Self::MergeBack(m) => Some(m.edit_workspace_id),
            Self::MergeBackDiff {
                edit_workspace_id, ..
            } => Some(*edit_workspace_id),
            Self::CreatePullRequest(c) => Some(c.workspace_id),
            Self::CommentPullRequest(c) => Some(c.workspace_id),
            Self::ReleaseSession { workspace_id, .. }
            | Self::HibernateRuntime { workspace_id }
            | Self::DestroyRuntime { workspace_id }
            | Self::DestroyWorkspace { workspace_id }
            | Self::RestoreWorkspace { workspace_id }
            | Self::PinWorkspace { workspace_id, .. } => Some(*workspace_id),
            _ => None,
        }
    }

    /// Checks every untrusted field. Called by callers before enqueue and by the worker
    /// again on receipt (a job row may have been written by other means).
    pub fn validate(&self) -> Result<(), ValidationError> {
        match self {
            Self::EnsureRepoCache(c) => {
                RepoName::parse(&c.repo_name)?;
                RepoUrl::parse(&c.repo_url)?;
            }
            Self::AcquireWorkspace(c) => {
                validate_owner_id("user", &c.user_id)?;
                validate_owner_id("project", &c.project_id)?;
                RepoName::parse(&c.repo_name)?;
                RepoUrl::parse(&c.repo_url)?;
                validate_ref(&c.base_ref)?;
                if let Some(r) = &c.runtime {
                    RuntimeKind::parse_named("workspace runtime", r)?;
                }
                match c.mode {
                    WorkspaceMode::Analysis => {}
                    WorkspaceMode::Edit => validate_branch_scope_id(
                        "conversation",
                        c.conversation_id.as_deref().ok_or_else(|| {
                            ValidationError::Request("edit mode needs --conversation".into())
                        })?,
                    )?,
                    WorkspaceMode::Task => validate_branch_scope_id(
                        "task",
                        c.task_id.as_deref().ok_or_else(|| {
                            ValidationError::Request("task mode needs --task".into())
                        })?,
                    )?,
                }
            }
            Self::Exec(e) => {
                validate_command(&e.argv)?;
                if e.timeout_ms == Some(0) {
                    return Err(ValidationError::Request(
                        "timeout_ms must be at least 1 (leave it out for the default)".into(),
                    ));
                }
                for (k, v) in &e.env {
                    validate_env(k, v)?;
                }
                RuntimeKind::parse_named("runtime", &e.runtime)?;
                if let Some(cwd) = &e.cwd {
                    if cwd.contains('\0')
                        || cwd.starts_with('/')
                        || cwd.split('/').any(|s| s == "..")
                    {
                        return Err(ValidationError::Request(
                            "cwd must be a relative path inside the workspace".into(),
                        ));
                    }
                }
                if e.stdin.as_ref().is_some_and(|s| s.len() > MAX_STDIN_BYTES) {
                    return Err(ValidationError::Request("stdin exceeds 1 MiB".into()));
                }
                if e.max_output_bytes.is_some_and(|m| m > MAX_OUTPUT_BYTES) {
                    return Err(ValidationError::Request("max output exceeds 16 MiB".into()));
                }
            }
            Self::EvictSweep(c) => {
                validate_owner_id("node", &c.node)?;
                // The sweep deletes host directories; a remote provider has none.
                if Placement::of_node(&c.node).is_remote() {
                    return Err(ValidationError::Request(format!(
                        "{} is a remote runtime, not a node: its workspaces are not swept",
                        c.node
                    )));
                }
            }
            Self::Tool(t) => t.op.validate()?,
            Self::CreatePullRequest(c) => {
                if let Some(base) = &c.base {
                    validate_ref(base)?;
                }
                validate_title(&c.title)?;
                if let Some(body) = &c.body {
                    validate_body("pull request body", body)?;
                }
            }
            Self::CommentPullRequest(c) => {
                validate_number(c.number)?;
                if c.body.trim().is_empty() {
                    return Err(ValidationError::Request(
                        "a comment must not be empty".into(),
                    ));
                }
                validate_body("comment", &c.body)?;
            }
            Self::ReleaseScope(c) => {
                validate_owner_id("user", &c.user_id)?;
                if let Some(p) = &c.project_id {
                    validate_owner_id("project", p)?;
                }
                match (&c.conversation_id, &c.task_id) {
                    (Some(conv), None) => validate_branch_scope_id("conversation", conv)?,
                    (None, Some(task)) => validate_branch_scope_id("task", task)?,
                    _ => {
                        return Err(ValidationError::Request(
                            "release needs exactly one of --conversation and --task".into(),
                        ))
                    }
                }
            }
            Self::MergeBack(MergeBack {
                edit_workspace_id,
                task_workspace_id,
                ..
            })
            | Self::MergeBackDiff {
                edit_workspace_id,
                task_workspace_id,
            } => {
                if edit_workspace_id == task_workspace_id {
                    return Err(ValidationError::Request(
                        "a workspace cannot be merged back into itself".into(),
                    ));
                }
            }
            Self::ReleaseSession { .. }
            | Self::HibernateRuntime { .. }
            | Self::DestroyRuntime { .. }
            | Self::DestroyWorkspace { .. }
            | Self::RestoreWorkspace { .. }
            | Self::PinWorkspace { .. } => {}
        }
        Ok(())
    }
}

/// What a successful command returns to its caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CommandResult {
    RepoCache(RepoCacheRow),
    Workspace(WorkspaceRow),
    Exec(ExecOutcome),
    Sweep(crate::sweep::SweepReport),
    Released(ReleaseReport),
    Tool(ToolOutput),
    MergeBackDiff(MergeBackDiff),
    MergedBack(MergeBackReport),
    PullRequest(PullRequest),
    PullRequestComment(PullRequestComment),
    Done,
}

/// What a `release_scope` did, per workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseReport {
    /// Released (runtimes stopped, files kept).
    pub released: Vec<Uuid>,
    /// Destroyed (with `destroy_workspaces`).
    pub destroyed: Vec<Uuid>,
    /// Evicted workspaces left as they are (nothing runs; their saved work is kept).
    pub already_evicted: Vec<Uuid>,
    /// Workspaces of another node: a `release_session` or `destroy_workspace` command was
    /// enqueued on that node's queue, with this command id.
    pub delegated: Vec<(Uuid, Uuid)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquire(mode: WorkspaceMode) -> AcquireWorkspace {
        AcquireWorkspace {
            user_id: "u".into(),
            project_id: "p".into(),
            repo_name: "o/r".into(),
            repo_url: "file:///tmp/r".into(),
            base_ref: "main".into(),
            mode,
            conversation_id: Some("c1".into()),
            task_id: None,
            runtime: None,
            history_ignored: false,
        }
    }

    #[test]
    fn an_acquire_names_a_known_placement_or_none() {
        for ok in [
            None,
            Some("local"),
            Some("docker"),
            Some("daytona"),
            Some("e2b"),
        ] {
            let mut c = acquire(WorkspaceMode::Edit);
            c.runtime = ok.map(String::from);
            assert!(Command::AcquireWorkspace(c).validate().is_ok(), "{ok:?}");
        }
        for bad in ["podman", "Daytona", "", "e2b/../x"] {
            let mut c = acquire(WorkspaceMode::Edit);
            c.runtime = Some(bad.into());
            assert!(
                Command::AcquireWorkspace(c).validate().is_err(),
                "{bad:?} must be refused"
            );
        }
    }

    #[test]
    fn an_acquire_payload_from_before_placement_still_reads() {
        let old = serde_json::json!({
            "command": "acquire_workspace", "user_id": "u", "project_id": "p",
            "repo_name": "o/r", "repo_url": "file:///tmp/r", "base_ref": "main",
            "mode": "edit", "conversation_id": "c1", "task_id": null
        });
        let c: Command = serde_json::from_value(old.clone()).unwrap();
        assert_eq!(c, Command::AcquireWorkspace(acquire(WorkspaceMode::Edit)));
        // And a host acquire still writes the payload it always wrote.
        assert_eq!(serde_json::to_value(&c).unwrap(), old);
    }

    #[test]
    fn a_task_acquire_without_a_task_id_is_refused() {
        assert!(Command::AcquireWorkspace(acquire(WorkspaceMode::Task))
            .validate()
            .is_err());
        assert!(Command::AcquireWorkspace(acquire(WorkspaceMode::Edit))
            .validate()
            .is_ok());
    }

    #[test]
    fn an_exec_with_a_zero_timeout_is_invalid_input() {
        let exec = |timeout_ms| {
            Command::Exec(Exec {
                workspace_id: Uuid::nil(),
                runtime: "local".into(),
                argv: vec!["true".into()],
                env: Default::default(),
                cwd: None,
                stdin: None,
                timeout_ms,
                max_output_bytes: None,
                kind: None,
                network: None,
                keep_output: true,
            })
        };
        let err = exec(Some(0)).validate().unwrap_err();
        assert!(err.to_string().contains("timeout_ms"), "{err}");
        assert!(exec(Some(1)).validate().is_ok());
        assert!(exec(None).validate().is_ok());
    }

    #[test]
    fn commands_round_trip_through_json_with_their_kind() {
        // An exec has a field named `kind`: the tag must not collide with it.
        let exec = Command::Exec(Exec {
            workspace_id: Uuid::nil(),
            runtime: "local".into(),
            argv: vec!["true".into()],
            env: Default::default(),
            cwd: None,
            stdin: None,
            timeout_ms: None,
            max_output_bytes: None,
            kind: Some(ExecKind::Read),
            network: None,
            keep_output: true,
        });
        let json = serde_json::to_value(&exec).unwrap();
        assert_eq!(json["command"], "exec");
        assert_eq!(serde_json::from_value::<Command>(json).unwrap(), exec);
        let cmd = Command::DestroyWorkspace {
            workspace_id: Uuid::nil(),
        };
        let json = serde_json::to_value(&cmd).unwrap();
        assert_eq!(json["command"], "destroy_workspace");
        assert_eq!(serde_json::from_value::<Command>(json).unwrap(), cmd);
    }
}
