//! Pure decisions of the job handlers: each takes what a handler loaded (rows, whether
//! a directory exists, what this worker serves) and returns a plan value or a refusal.
//! The handler then acts on the plan and records it ("load, decide, act, record"); the
//! eviction planner ([`crate::eviction::plan`]) is the largest of these.

pub mod acquire;
pub mod exec;
pub mod restore;

#[cfg(test)]
pub(crate) mod fixtures {
    use chrono::Utc;
    use uuid::Uuid;

    use crate::model::{Capabilities, WorkspaceMode, WorkspaceRow};

    /// A workspace row of `mode` on `node` in `state`.
    pub fn row(mode: WorkspaceMode, node: &str, state: &str) -> WorkspaceRow {
        let now = Utc::now();
        WorkspaceRow {
            id: Uuid::from_u128(7),
            repo_cache_id: Uuid::nil(),
            node: node.into(),
            project_id: "p".into(),
            user_id: "u".into(),
            mode,
            conversation_id: None,
            task_id: None,
            base_ref: "main".into(),
            base_commit: "0".repeat(40),
            branch_name: crate::model::branch_for(mode, "s"),
            local_path: "/x".into(),
            state: state.parse().expect("a known workspace state"),
            dirty: false,
            pinned_until: None,
            last_used_at: now,
            size_bytes: 0,
            capabilities: Capabilities::from_mode(mode),
            created_at: now,
            updated_at: now,
            size_measured_at: None,
            evicted_at: None,
            saved: None,
            history_ignored: false,
        }
    }
}
