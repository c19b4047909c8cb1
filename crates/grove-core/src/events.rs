//! The event catalogue: every state change of grove, with its envelope and metadata.
//!
//! `docs/events.md` lists the same catalogue with the projection columns each event
//! changes; keep the two in step. Events are versioned: a change to a payload's shape
//! bumps [`Event::version`] and the fold keeps reading the old shape.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::eviction::Reason;
use crate::history::{FileCounts, Operation};
use crate::merge_back::MergeStrategy;
use crate::model::{Capabilities, ExecKind, SavedWork, WorkspaceMode};
use crate::state::WorkspaceState;
use crate::sweep::SweepReport;

/// The stream a repo cache's events belong to.
pub fn repo_cache_stream(id: Uuid) -> String {
    format!("repo_cache:{id}")
}
/// The stream a workspace's events (including its execs) belong to.
pub fn workspace_stream(id: Uuid) -> String {
    format!("workspace:{id}")
}
/// The stream a runtime's events belong to.
pub fn runtime_stream(id: Uuid) -> String {
    format!("runtime:{id}")
}
/// The stream of one eviction sweep (named by its command id).
pub fn sweep_stream(id: Uuid) -> String {
    format!("sweep:{id}")
}

/// Why a sweep acted on a runtime, a workspace or a repo cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cause", rename_all = "snake_case")]
pub enum EvictionCause {
    /// Planned by `grove_core::eviction::plan`: the planner's reason, carrying the policy
    /// values that triggered it (thresholds, TTLs, budget and water marks in bytes).
    Policy(Reason),
    /// The record said the files exist but its directory was gone when a sweep looked.
    DirectoryMissing,
    /// An eviction interrupted by a crash after its directory was moved to the trash,
    /// finished by the next sweep (or acquire).
    Interrupted,
}

/// One state change. The serde tag is the stored `event_type`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[non_exhaustive]
pub enum Event {
    #[serde(rename = "repo_cache.created")]
    RepoCacheCreated {
        repo_cache_id: Uuid,
        node: String,
        identity: String,
        repo_name: String,
        repo_url: String,
        provider: String,
        provider_host: String,
        local_path: String,
        auth_scope_hash: Option<String>,
        size_bytes: i64,
    },
    #[serde(rename = "repo_cache.fetched")]
    RepoCacheFetched {
        repo_cache_id: Uuid,
        size_bytes: i64,
    },
    #[serde(rename = "repo_cache.used")]
    RepoCacheUsed { repo_cache_id: Uuid },
    #[serde(rename = "workspace.created")]
    WorkspaceCreated {
        workspace_id: Uuid,
        repo_cache_id: Uuid,
        node: String,
        user_id: String,
        project_id: String,
        mode: WorkspaceMode,
        conversation_id: Option<String>,
        task_id: Option<String>,
        base_ref: String,
        base_commit: String,
        branch_name: Option<String>,
        local_path: String,
        capabilities: Capabilities,
        size_bytes: i64,
        /// Its history points keep ignored files too, up to a budget (ADR 28); absent:
        /// they do not.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        history_ignored: bool,
    },
    #[serde(rename = "workspace.acquired")]
    WorkspaceAcquired { workspace_id: Uuid },
    #[serde(rename = "workspace.released")]
    WorkspaceReleased { workspace_id: Uuid },
    #[serde(rename = "workspace.dirty_changed")]
    WorkspaceDirtyChanged { workspace_id: Uuid, dirty: bool },
    #[serde(rename = "workspace.destroyed")]
    WorkspaceDestroyed { workspace_id: Uuid },
    #[serde(rename = "exec.started")]
    ExecStarted {
        exec_id: Uuid,
        workspace_id: Uuid,
        runtime_id: Uuid,
        kind: ExecKind,
        argv: Vec<String>,
        /// Only the names: values may be secrets.
        env_keys: Vec<String>,
        timeout_ms: Option<u64>,
    },
    #[serde(rename = "exec.finished")]
    ExecFinished {
        exec_id: Uuid,
        workspace_id: Uuid,
        runtime_id: Uuid,
        /// `completed`, `rejected` or `worker_lost`.
        outcome: String,
        exit_code: Option<i32>,
        timed_out: bool,
        truncated: bool,
        duration_ms: u64,
        stdout_bytes: u64,
        stderr_bytes: u64,
    },
    #[serde(rename = "runtime.started")]
    RuntimeStarted {
        runtime_id: Uuid,
        workspace_id: Uuid,
        backend_kind: String,
        backend_runtime_id: String,
        image: Option<String>,
    },
    /// `reason` is free text; a sweep's says `eviction: ` and the values that triggered it
    /// (the same action, structured, is in the sweep's `eviction.sweep_finished`).
    #[serde(rename = "runtime.stopped")]
    RuntimeStopped { runtime_id: Uuid, reason: String },
    #[serde(rename = "runtime.destroyed")]
    RuntimeDestroyed { runtime_id: Uuid, reason: String },
    /// A sweep measured a workspace's apparent size (its last use was after the last
    /// measurement). Not a use: `last_used_at` is unchanged.
    #[serde(rename = "workspace.size_measured")]
    WorkspaceSizeMeasured { workspace_id: Uuid, size_bytes: i64 },
    /// The workspace is pinned until `until` (`None` unpins): eviction never takes it.
    #[serde(rename = "workspace.pinned")]
    WorkspacePinned {
        workspace_id: Uuid,
        until: Option<DateTime<Utc>>,
    },
    /// A sweep saved the workspace's work (if any) and is about to delete its files.
    #[serde(rename = "workspace.evicting")]
    WorkspaceEvicting {
        workspace_id: Uuid,
        cause: EvictionCause,
        saved: Option<SavedWork>,
        /// What the save deliberately left out (ignored files over the budget, ...),
        /// one line each: what, and why.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        omitted: Vec<String>,
    },
    /// The workspace's files are gone; the record stays so it can be restored.
    #[serde(rename = "workspace.evicted")]
    WorkspaceEvicted {
        workspace_id: Uuid,
        cause: EvictionCause,
        /// The cached size the eviction freed (apparent bytes).
        bytes_freed: i64,
        /// Where the work was saved: the workspace's private store (ref, commit, patch).
        saved: Option<SavedWork>,
        /// What the save deliberately left out, as in `workspace.evicting`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        omitted: Vec<String>,
    },
    /// Work an older version saved in the shared repo cache (`from_ref`) was moved
    /// into the workspace's private store, and the cache's ref deleted.
    #[serde(rename = "workspace.saved_work_moved")]
    WorkspaceSavedWorkMoved {
        workspace_id: Uuid,
        repo_cache_id: Uuid,
        from_ref: String,
        saved: SavedWork,
    },
    /// A merge-back interrupted by a crash was finished (`rolled_forward`) or undone
    /// (`rolled_back`) from its journal: the workspace's HEAD, index and files are all
    /// at `head`. Changes no projection.
    #[serde(rename = "workspace.merge_back_recovered")]
    WorkspaceMergeBackRecovered {
        workspace_id: Uuid,
        outcome: String,
        previous_head: String,
        new_head: String,
        head: String,
    },
    /// An eviction did not happen and the files are untouched: preserving the work
    /// failed, or an interrupted eviction was rolled back. `state`, when set, is the state
    /// the workspace returns to.
    #[serde(rename = "workspace.eviction_blocked")]
    WorkspaceEvictionBlocked {
        workspace_id: Uuid,
        cause: Option<EvictionCause>,
        error: String,
        state: Option<WorkspaceState>,
    },
    /// An evicted workspace was checked out again at its path, branch and saved state.
    #[serde(rename = "workspace.restored")]
    WorkspaceRestored {
        workspace_id: Uuid,
        /// The commit HEAD was restored at.
        head_commit: String,
        /// What was restored from (`None`: the base commit, nothing had been saved).
        saved: Option<SavedWork>,
        dirty: bool,
        size_bytes: i64,
    },
    /// A sweep re-measured a repo cache (after saving work into it).
    #[serde(rename = "repo_cache.size_measured")]
    RepoCacheSizeMeasured {
        repo_cache_id: Uuid,
        size_bytes: i64,
    },
    /// A sweep deleted a repo cache's directory; the record stays (state `evicted`) and
    /// the next ensure or acquire clones it again.
    #[serde(rename = "repo_cache.evicted")]
    RepoCacheEvicted {
        repo_cache_id: Uuid,
        cause: EvictionCause,
        bytes_freed: i64,
    },
    /// One eviction sweep of one node finished: what it planned, did, skipped and why.
    /// Changes no projection.
    #[serde(rename = "eviction.sweep_finished")]
    SweepFinished { sweep_id: Uuid, report: SweepReport },
    /// A tool wrote a file of the workspace (`create`, `str_replace`, `insert`,
    /// `write_file`). The content is never recorded, only what identifies it.
    #[serde(rename = "workspace.file_written")]
    WorkspaceFileWritten {
        workspace_id: Uuid,
        /// Relative to the workspace root.
        path: String,
        /// The tool that wrote it.
        op: String,
        size_bytes: u64,
        /// SHA-256 of the new content, lowercase hex.
        sha256: String,
        /// The file did not exist before.
        created: bool,
    },
    /// The `git_commit` tool made a commit in the workspace.
    #[serde(rename = "workspace.committed")]
    WorkspaceCommitted {
        workspace_id: Uuid,
        commit: String,
        branch: Option<String>,
        files: Vec<String>,
    },
    /// The `git_push` tool pushed a branch of the workspace to its `origin`.
    #[serde(rename = "workspace.pushed")]
    WorkspacePushed {
        workspace_id: Uuid,
        branch: String,
        commit: String,
        previous: Option<String>,
        forced: bool,
    },
    /// A merge-back brought a task workspace's commits into this (edit) workspace's
    /// branch: its working tree and index are at `new_head`.
    #[serde(rename = "workspace.merged_back")]
    WorkspaceMergedBack {
        workspace_id: Uuid,
        task_workspace_id: Uuid,
        strategy: MergeStrategy,
        branch: String,
        previous_head: String,
        new_head: String,
        /// The task commits brought in, oldest first.
        commits: Vec<String>,
        /// Commits made on the branch (the merge commit, or the cherry-picked ones).
        created: Vec<String>,
        fast_forward: bool,
    },
    /// A merge-back conflicted and changed nothing in this (edit) workspace.
    #[serde(rename = "workspace.merge_back_conflicted")]
    WorkspaceMergeBackConflicted {
        workspace_id: Uuid,
        task_workspace_id: Uuid,
        strategy: MergeStrategy,
        /// Every conflicting path, relative to the workspace root.
        paths: Vec<String>,
        /// For a cherry-pick: the task commit that did not apply.
        commit: Option<String>,
    },
    /// A pull request was opened on the git platform from the workspace's branch (job
    /// `create_pull_request`). Never carries the token.
    #[serde(rename = "workspace.pull_request_opened")]
    WorkspacePullRequestOpened {
        workspace_id: Uuid,
        /// The platform (`github`).
        platform: String,
        /// `owner/name` on the platform.
        repo: String,
        number: u64,
        /// The pull request's web page.
        url: String,
        head: String,
        base: String,
        title: String,
        draft: bool,
    },
    /// A comment was made on a pull request of the workspace's repository (job
    /// `comment_pull_request`). The comment's text is not recorded.
    #[serde(rename = "workspace.pull_request_commented")]
    WorkspacePullRequestCommented {
        workspace_id: Uuid,
        platform: String,
        repo: String,
        number: u64,
        comment_id: u64,
        /// The comment's web page.
        url: String,
    },
    /// A point of the workspace's history: its files, HEAD and branch after a change,
    /// recorded in its private history store (ADR 28). Appended with the event of the
    /// change it follows (`exec.finished`, `workspace.file_written`, ...), in the same
    /// transaction.
    #[serde(rename = "workspace.snapshot_taken")]
    WorkspaceSnapshotTaken {
        workspace_id: Uuid,
        /// The snapshot's id (a commit of the history store).
        snapshot: String,
        head: String,
        branch: Option<String>,
        operation: Operation,
        changes: FileCounts,
        /// Ignored files left out over the workspace's budget (absent: none).
        #[serde(default, skip_serializing_if = "is_zero")]
        ignored_omitted: u32,
    },
    /// The workspace was made by `fork` from `source_workspace_id` at its point
    /// `number` (snapshot `snapshot`); its timeline starts with the source's points up
    /// to that one. Follows the new workspace's `workspace.created`.
    #[serde(rename = "workspace.forked")]
    WorkspaceForked {
        workspace_id: Uuid,
        source_workspace_id: Uuid,
        snapshot: String,
        number: u64,
    },
    /// The eviction sweep dropped points of the workspace's history by its retention
    /// policy (the snapshot ids dropped).
    #[serde(rename = "workspace.history_pruned")]
    WorkspaceHistoryPruned {
        workspace_id: Uuid,
        dropped: Vec<String>,
    },
}

impl Event {
    /// The schema version of this event's payload.
    pub fn version(&self) -> i32 {
        1
    }
    /// The stored `event_type` string.
    pub fn event_type(&self) -> &'static str {
        match self {
            Self::RepoCacheCreated { .. } => "repo_cache.created",
            Self::RepoCacheFetched { .. } => "repo_cache.fetched",
            Self::RepoCacheUsed { .. } => "repo_cache.used",
            Self::WorkspaceCreated { .. } => "workspace.created",
            Self::WorkspaceAcquired { .. } => "workspace.acquired",
            Self::WorkspaceReleased { .. } => "workspace.released",
            Self::WorkspaceDirtyChanged { .. } => "workspace.dirty_changed",
            Self::WorkspaceDestroyed { .. } => "workspace.destroyed",
            Self::ExecStarted { .. } => "exec.started",
            Self::ExecFinished { .. } => "exec.finished",
            Self::RuntimeStarted { .. } => "runtime.started",
            Self::RuntimeStopped { .. } => "runtime.stopped",
            Self::RuntimeDestroyed { .. } => "runtime.destroyed",
            Self::WorkspaceSizeMeasured { .. } => "workspace.size_measured",
            Self::WorkspacePinned { .. } => "workspace.pinned",
            Self::WorkspaceEvicting { .. } => "workspace.evicting",
            Self::WorkspaceEvicted { .. } => "workspace.evicted",
            Self::WorkspaceEvictionBlocked { .. } => "workspace.eviction_blocked",
            Self::WorkspaceRestored { .. } => "workspace.restored",
            Self::WorkspaceSavedWorkMoved { .. } => "workspace.saved_work_moved",
            Self::WorkspaceMergeBackRecovered { .. } => "workspace.merge_back_recovered",
            Self::RepoCacheSizeMeasured { .. } => "repo_cache.size_measured",
            Self::RepoCacheEvicted { .. } => "repo_cache.evicted",
            Self::SweepFinished { .. } => "eviction.sweep_finished",
            Self::WorkspaceFileWritten { .. } => "workspace.file_written",
            Self::WorkspaceCommitted { .. } => "workspace.committed",
            Self::WorkspacePushed { .. } => "workspace.pushed",
            Self::WorkspaceMergedBack { .. } => "workspace.merged_back",
            Self::WorkspaceMergeBackConflicted { .. } => "workspace.merge_back_conflicted",
            Self::WorkspacePullRequestOpened { .. } => "workspace.pull_request_opened",
            Self::WorkspacePullRequestCommented { .. } => "workspace.pull_request_commented",
            Self::WorkspaceSnapshotTaken { .. } => "workspace.snapshot_taken",
            Self::WorkspaceForked { .. } => "workspace.forked",
            Self::WorkspaceHistoryPruned { .. } => "workspace.history_pruned",
        }
    }
    /// The stream this event is appended to.
    pub fn stream_id(&self) -> String {
        match self {
            Self::RepoCacheCreated { repo_cache_id, .. }
            | Self::RepoCacheFetched { repo_cache_id, .. }
            | Self::RepoCacheUsed { repo_cache_id }
            | Self::RepoCacheSizeMeasured { repo_cache_id, .. }
            | Self::RepoCacheEvicted { repo_cache_id, .. } => repo_cache_stream(*repo_cache_id),
            Self::WorkspaceCreated { workspace_id, .. }
            | Self::WorkspaceAcquired { workspace_id }
            | Self::WorkspaceReleased { workspace_id }
            | Self::WorkspaceDirtyChanged { workspace_id, .. }
            | Self::WorkspaceDestroyed { workspace_id }
            | Self::WorkspaceSizeMeasured { workspace_id, .. }
            | Self::WorkspacePinned { workspace_id, .. }
            | Self::WorkspaceEvicting { workspace_id, .. }
            | Self::WorkspaceEvicted { workspace_id, .. }
            | Self::WorkspaceEvictionBlocked { workspace_id, .. }
            | Self::WorkspaceRestored { workspace_id, .. }
            | Self::WorkspaceSavedWorkMoved { workspace_id, .. }
            | Self::WorkspaceMergeBackRecovered { workspace_id, .. }
            | Self::ExecStarted { workspace_id, .. }
            | Self::ExecFinished { workspace_id, .. }
            | Self::WorkspaceFileWritten { workspace_id, .. }
            | Self::WorkspaceCommitted { workspace_id, .. }
            | Self::WorkspacePushed { workspace_id, .. }
            | Self::WorkspaceMergedBack { workspace_id, .. }
            | Self::WorkspaceMergeBackConflicted { workspace_id, .. }
            | Self::WorkspacePullRequestOpened { workspace_id, .. }
            | Self::WorkspacePullRequestCommented { workspace_id, .. }
            | Self::WorkspaceSnapshotTaken { workspace_id, .. }
            | Self::WorkspaceForked { workspace_id, .. }
            | Self::WorkspaceHistoryPruned { workspace_id, .. } => workspace_stream(*workspace_id),
            Self::RuntimeStarted { runtime_id, .. }
            | Self::RuntimeStopped { runtime_id, .. }
            | Self::RuntimeDestroyed { runtime_id, .. } => runtime_stream(*runtime_id),
            Self::SweepFinished { sweep_id, .. } => sweep_stream(*sweep_id),
        }
    }
    /// Splits into the stored `(event_type, payload)` pair.
    pub fn to_stored(&self) -> (&'static str, serde_json::Value) {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        let data = value
            .get_mut("data")
            .map(serde_json::Value::take)
            .unwrap_or(serde_json::Value::Null);
        (self.event_type(), data)
    }
    /// Rebuilds an event from its stored `(event_type, payload)` pair.
    pub fn from_stored(
        event_type: &str,
        payload: serde_json::Value,
    ) -> Result<Self, serde_json::Error> {
        serde_json::from_value(serde_json::json!({ "type": event_type, "data": payload }))
    }
}

/// For `skip_serializing_if`: a count that is zero is left out of the payload.
fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Who and what an event was about, for operators and for tenancy filters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Correlation {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
}

/// Metadata every event carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    pub command_id: Uuid,
    pub correlation: Correlation,
    pub worker_id: String,
    pub node: String,
}

/// An event as read back from the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedEvent {
    /// Global position (a sequence; gaps are possible, order of commit is not implied).
    pub position: i64,
    /// The writing transaction's id: readers order by `(tx_id, position)`.
    pub tx_id: i64,
    pub stream_id: String,
    pub stream_version: i64,
    pub event_type: String,
    pub event_version: i32,
    pub event: Event,
    pub metadata: Metadata,
    pub recorded_at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_their_stored_form() {
        let event = Event::WorkspaceDirtyChanged {
            workspace_id: Uuid::nil(),
            dirty: true,
        };
        let (ty, payload) = event.to_stored();
        assert_eq!(ty, "workspace.dirty_changed");
        assert_eq!(payload["dirty"], true);
        assert_eq!(Event::from_stored(ty, payload).unwrap(), event);
    }
}
