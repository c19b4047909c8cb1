//! The domain model: workspace modes, capabilities, and the rows of the three projections.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::validate::ValidationError;

use crate::state::{RepoCacheState, RuntimeState, WorkspaceState};

/// What a workspace is for; decides its key, its branch and its capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceMode {
    /// A clean, read-only checkout of `base_ref`, keyed by (user, project, base_ref).
    Analysis,
    /// A writable checkout on `agent/edits-<conversation>`, keyed by (user, project, conversation).
    Edit,
    /// A writable checkout on `agent/task-<task>`, keyed by (user, project, task).
    Task,
}

impl WorkspaceMode {
    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        match raw {
            "analysis" => Ok(Self::Analysis),
            "edit" => Ok(Self::Edit),
            "task" => Ok(Self::Task),
            other => Err(ValidationError::Mode(other.chars().take(40).collect())),
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Analysis => "analysis",
            Self::Edit => "edit",
            Self::Task => "task",
        }
    }
}

/// What a workspace allows, derived from its mode in exactly one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Commands and tools may change files.
    pub writable: bool,
    /// Changes stay in this workspace: no other workspace shares its directory or branch.
    pub isolated: bool,
    /// The files outlive any runtime attached to the workspace.
    pub persistent: bool,
}

impl Capabilities {
    pub fn from_mode(mode: WorkspaceMode) -> Self {
        match mode {
            WorkspaceMode::Analysis => Self {
                writable: false,
                isolated: true,
                persistent: true,
            },
            WorkspaceMode::Edit | WorkspaceMode::Task => Self {
                writable: true,
                isolated: true,
                persistent: true,
            },
        }
    }
}

/// How a command may touch its workspace; decides which lock it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecKind {
    /// Inspection only (rg, cat, ls, git status): runs concurrently with other reads.
    Read,
    /// File edits, git commit, formatters: exclusive.
    Write,
    /// Package managers: exclusive, and the class that may ask for network.
    Install,
    /// Tests write build artifacts, so they are exclusive too.
    Test,
}

impl ExecKind {
    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        match raw {
            "read" => Ok(Self::Read),
            "write" => Ok(Self::Write),
            "install" => Ok(Self::Install),
            "test" => Ok(Self::Test),
            other => Err(ValidationError::ExecKind(other.chars().take(40).collect())),
        }
    }
    /// Whether the command may change files (and so takes the exclusive lock).
    pub fn is_mutating(self) -> bool {
        !matches!(self, Self::Read)
    }
}

/// The uniqueness key of a workspace, as the seed defines it per mode.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkspaceKey {
    /// Where a new workspace of this key would be placed (not part of the key itself).
    pub node: String,
    pub user_id: String,
    pub project_id: String,
    pub mode: WorkspaceMode,
    /// base_ref for analysis, conversation id for edit, task id for task.
    pub scope: String,
}

impl WorkspaceKey {
    /// A stable string for lock keys and paths. The node is not part of it: a key names
    /// one workspace across all nodes.
    pub fn lock_string(&self) -> String {
        format!(
            "{}\u{0}{}\u{0}{}\u{0}{}",
            self.user_id,
            self.project_id,
            self.mode.as_str(),
            self.scope
        )
    }
}

/// The branch a workspace of this mode works on.
pub fn branch_for(mode: WorkspaceMode, scope: &str) -> Option<String> {
    match mode {
        WorkspaceMode::Analysis => None,
        WorkspaceMode::Edit => Some(format!("agent/edits-{scope}")),
        WorkspaceMode::Task => Some(format!("agent/task-{scope}")),
    }
}

/// A row of `sandbox_repo_caches`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepoCacheRow {
    pub id: Uuid,
    pub node: String,
    pub identity: String,
    pub repo_name: String,
    pub repo_url: String,
    pub provider: String,
    pub provider_host: String,
    pub local_path: String,
    pub auth_scope_hash: Option<String>,
    pub last_fetched_at: Option<DateTime<Utc>>,
    pub last_used_at: DateTime<Utc>,
    pub size_bytes: i64,
    pub state: RepoCacheState,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A row of `sandbox_workspaces`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceRow {
    pub id: Uuid,
    pub repo_cache_id: Uuid,
    pub node: String,
    pub project_id: String,
    pub user_id: String,
    pub mode: WorkspaceMode,
    pub conversation_id: Option<String>,
    pub task_id: Option<String>,
    pub base_ref: String,
    pub base_commit: String,
    pub branch_name: Option<String>,
    pub local_path: String,
    pub state: WorkspaceState,
    pub dirty: bool,
    pub pinned_until: Option<DateTime<Utc>>,
    pub last_used_at: DateTime<Utc>,
    pub size_bytes: i64,
    pub capabilities: Capabilities,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// When `size_bytes` was last measured (creation, a sweep's re-measurement, a restore).
    #[serde(default)]
    pub size_measured_at: Option<DateTime<Utc>>,
    /// When the workspace was evicted (state `evicting` or `evicted`); `None` otherwise.
    #[serde(default)]
    pub evicted_at: Option<DateTime<Utc>>,
    /// Where the work of an evicted workspace was saved; `None` when there was nothing to
    /// save (clean, and HEAD still at `base_commit`) or the workspace is live.
    #[serde(default)]
    pub saved: Option<SavedWork>,
    /// Its history points keep ignored files too, up to a budget (ADR 28).
    #[serde(default)]
    pub history_ignored: bool,
}

/// The work of an evicted workspace, kept in its repo cache so it can be restored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedWork {
    /// The ref naming `commit`: [`SAVED_STORE_REF`] in the workspace's private store
    /// (`$GROVE_HOME/saved/<user>/<workspace id>/`), or, for work saved before stores
    /// existed and not yet migrated, `refs/grove/saved/<workspace id>` in the repo cache.
    pub ref_name: String,
    /// The commit the ref points at: the working tree (tracked and untracked files, not
    /// ignored ones) as a commit whose parent is `head_commit`, or `head_commit` itself
    /// when the tree had no uncommitted changes.
    pub commit: String,
    /// The workspace's HEAD at eviction: its branch is restored at this commit.
    pub head_commit: String,
    /// The binary-safe patch of the uncommitted changes against `head_commit` (in the
    /// store: `work.patch`); `None` when there were none.
    pub patch_path: Option<String>,
}

impl SavedWork {
    /// Whether the saved commit carries uncommitted changes on top of HEAD.
    pub fn has_changes(&self) -> bool {
        self.commit != self.head_commit
    }
    /// Whether this work is still in the shared repo cache (saved before private
    /// stores existed): the worker moves it out at start.
    pub fn in_cache(&self) -> bool {
        self.ref_name.starts_with(LEGACY_SAVED_REF_PREFIX)
    }
}

/// The internal ref that held a workspace's saved work in its repo cache before saved
/// work moved to private stores; only the migration out of caches still reads it.
pub fn saved_ref_name(workspace_id: uuid::Uuid) -> String {
    format!("{LEGACY_SAVED_REF_PREFIX}{workspace_id}")
}

/// Where saved work lived in a shared repo cache (migrated out at worker start).
pub const LEGACY_SAVED_REF_PREFIX: &str = "refs/grove/saved/";

/// The ref, inside a workspace's private saved-work store, naming the working-tree
/// snapshot.
pub const SAVED_STORE_REF: &str = "refs/grove/work";

impl WorkspaceRow {
    pub fn key(&self) -> WorkspaceKey {
        let scope = match self.mode {
            WorkspaceMode::Analysis => self.base_ref.clone(),
            WorkspaceMode::Edit => self.conversation_id.clone().unwrap_or_default(),
            WorkspaceMode::Task => self.task_id.clone().unwrap_or_default(),
        };
        WorkspaceKey {
            node: self.node.clone(),
            user_id: self.user_id.clone(),
            project_id: self.project_id.clone(),
            mode: self.mode,
            scope,
        }
    }
}

/// A row of `sandbox_runtimes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeRow {
    pub id: Uuid,
    pub workspace_id: Uuid,
    pub backend_kind: String,
    pub backend_runtime_id: String,
    pub image: Option<String>,
    pub state: RuntimeState,
    pub last_started_at: Option<DateTime<Utc>>,
    pub last_used_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The result of one command, as the CLI and API return it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutcome {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
    pub truncated: bool,
    pub duration_ms: u64,
}

impl ExecOutcome {
    /// What a command killed at its time limit reports, as `timeout(1)` does.
    pub const TIMED_OUT_EXIT_CODE: i32 = 124;

    /// The exit code the CLI exits with and the MCP `shell` tool reports: 124 for a
    /// command that timed out (whatever signal ended it), else the command's own.
    pub fn reported_exit_code(&self) -> i32 {
        if self.timed_out {
            Self::TIMED_OUT_EXIT_CODE
        } else {
            self.exit_code
        }
    }
}

/// Truncates a timestamp to the microsecond precision Postgres stores, so that a value
/// written and read back compares equal (projections replay to identical rows).
pub fn to_db_precision(at: DateTime<Utc>) -> DateTime<Utc> {
    use chrono::{SubsecRound, Timelike};
    let micros = at.nanosecond() / 1_000;
    at.trunc_subsecs(0) + chrono::Duration::microseconds(i64::from(micros))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_follow_the_mode() {
        assert!(!Capabilities::from_mode(WorkspaceMode::Analysis).writable);
        assert!(Capabilities::from_mode(WorkspaceMode::Edit).writable);
        assert!(Capabilities::from_mode(WorkspaceMode::Task).writable);
    }

    #[test]
    fn branches_follow_the_seed_naming() {
        assert_eq!(
            branch_for(WorkspaceMode::Edit, "c1").unwrap(),
            "agent/edits-c1"
        );
        assert_eq!(
            branch_for(WorkspaceMode::Task, "t1").unwrap(),
            "agent/task-t1"
        );
        assert_eq!(branch_for(WorkspaceMode::Analysis, "main"), None);
    }

    #[test]
    fn unknown_modes_are_refused() {
        assert!(WorkspaceMode::parse("admin").is_err());
        assert_eq!(WorkspaceMode::parse("edit").unwrap(), WorkspaceMode::Edit);
    }
}
