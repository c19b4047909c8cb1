//! The event catalogue: every state change of grove, with its envelope and metadata.
//!
//! `docs/events.md` lists the same catalogue with the projection columns each event
//! changes; keep the two in step. Events are versioned: a change to a payload's shape
//! bumps [`Event::version`] and the fold keeps reading the old shape.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::model::{Capabilities, ExecKind, WorkspaceMode};

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
    #[serde(rename = "runtime.stopped")]
    RuntimeStopped { runtime_id: Uuid, reason: String },
    #[serde(rename = "runtime.destroyed")]
    RuntimeDestroyed { runtime_id: Uuid, reason: String },
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
        }
    }
    /// The stream this event is appended to.
    pub fn stream_id(&self) -> String {
        match self {
            Self::RepoCacheCreated { repo_cache_id, .. }
            | Self::RepoCacheFetched { repo_cache_id, .. }
            | Self::RepoCacheUsed { repo_cache_id } => repo_cache_stream(*repo_cache_id),
            Self::WorkspaceCreated { workspace_id, .. }
            | Self::WorkspaceAcquired { workspace_id }
            | Self::WorkspaceReleased { workspace_id }
            | Self::WorkspaceDirtyChanged { workspace_id, .. }
            | Self::WorkspaceDestroyed { workspace_id }
            | Self::ExecStarted { workspace_id, .. }
            | Self::ExecFinished { workspace_id, .. } => workspace_stream(*workspace_id),
            Self::RuntimeStarted { runtime_id, .. }
            | Self::RuntimeStopped { runtime_id, .. }
            | Self::RuntimeDestroyed { runtime_id, .. } => runtime_stream(*runtime_id),
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
