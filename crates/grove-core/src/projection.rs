//! The pure fold from events to projection rows, shared by live writes and replay.
//!
//! Live handlers load the rows an event touches, fold the new events over them and
//! write the result back in the same transaction; `grove replay` folds the whole log
//! over empty state. Because both use [`Projections::apply`], a replay can only differ
//! from the live tables if a row was changed outside the event log.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::events::Event;
use crate::model::{RepoCacheRow, RuntimeRow, WorkspaceRow};
use crate::state::{RepoCacheState, RuntimeState, WorkspaceState};

/// Rows of the three projections, keyed by id, plus the ids an `apply` touched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Projections {
    pub repo_caches: BTreeMap<Uuid, RepoCacheRow>,
    pub workspaces: BTreeMap<Uuid, WorkspaceRow>,
    pub runtimes: BTreeMap<Uuid, RuntimeRow>,
    /// Ids whose row was inserted, updated or deleted since the last [`Projections::take_touched`].
    pub touched: Touched,
}

/// The ids an apply changed, per table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Touched {
    pub repo_caches: BTreeSet<Uuid>,
    pub workspaces: BTreeSet<Uuid>,
    pub runtimes: BTreeSet<Uuid>,
}

/// The ids of rows an event reads or writes, so a live handler knows what to load.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reads {
    pub repo_caches: Vec<Uuid>,
    pub workspaces: Vec<Uuid>,
    pub runtimes: Vec<Uuid>,
}

impl Reads {
    pub fn of(events: &[Event]) -> Self {
        let mut reads = Self::default();
        for event in events {
            match event {
                Event::RepoCacheCreated { repo_cache_id, .. }
                | Event::RepoCacheFetched { repo_cache_id, .. }
                | Event::RepoCacheUsed { repo_cache_id }
                | Event::RepoCacheSizeMeasured { repo_cache_id, .. }
                | Event::RepoCacheEvicted { repo_cache_id, .. } => {
                    reads.repo_caches.push(*repo_cache_id)
                }
                Event::WorkspaceCreated { workspace_id, .. }
                | Event::WorkspaceAcquired { workspace_id }
                | Event::WorkspaceReleased { workspace_id }
                | Event::WorkspaceDirtyChanged { workspace_id, .. }
                | Event::WorkspaceDestroyed { workspace_id }
                | Event::WorkspaceSizeMeasured { workspace_id, .. }
                | Event::WorkspacePinned { workspace_id, .. }
                | Event::WorkspaceEvicting { workspace_id, .. }
                | Event::WorkspaceEvicted { workspace_id, .. }
                | Event::WorkspaceEvictionBlocked { workspace_id, .. }
                | Event::WorkspaceRestored { workspace_id, .. }
                | Event::WorkspaceSavedWorkMoved { workspace_id, .. }
                | Event::WorkspaceMergeBackRecovered { workspace_id, .. }
                | Event::WorkspaceFileWritten { workspace_id, .. }
                | Event::WorkspaceCommitted { workspace_id, .. }
                | Event::WorkspacePushed { workspace_id, .. }
                | Event::WorkspaceMergedBack { workspace_id, .. }
                | Event::WorkspaceMergeBackConflicted { workspace_id, .. }
                | Event::WorkspacePullRequestOpened { workspace_id, .. }
                | Event::WorkspacePullRequestCommented { workspace_id, .. }
                | Event::WorkspaceSnapshotTaken { workspace_id, .. }
                | Event::WorkspaceForked { workspace_id, .. }
                | Event::WorkspaceHistoryPruned { workspace_id, .. } => {
                    reads.workspaces.push(*workspace_id)
                }
                Event::SweepFinished { .. } => {}
                Event::ExecStarted {
                    workspace_id,
                    runtime_id,
                    ..
                }
                | Event::ExecFinished {
                    workspace_id,
                    runtime_id,
                    ..
                } => {
                    reads.workspaces.push(*workspace_id);
                    reads.runtimes.push(*runtime_id);
                }
                Event::RuntimeStarted { runtime_id, .. }
                | Event::RuntimeStopped { runtime_id, .. }
                | Event::RuntimeDestroyed { runtime_id, .. } => reads.runtimes.push(*runtime_id),
            }
        }
        reads
    }
}

impl Projections {
    /// Takes the set of touched ids, leaving it empty.
    pub fn take_touched(&mut self) -> Touched {
        std::mem::take(&mut self.touched)
    }

    /// Folds one event recorded at `at` into the rows.
    pub fn apply(&mut self, event: &Event, at: DateTime<Utc>) {
        match event.clone() {
            Event::RepoCacheCreated {
                repo_cache_id,
                node,
                identity,
                repo_name,
                repo_url,
                provider,
                provider_host,
                local_path,
                auth_scope_hash,
                size_bytes,
            } => {
                self.repo_caches.insert(
                    repo_cache_id,
                    RepoCacheRow {
                        id: repo_cache_id,
                        node,
                        identity,
                        repo_name,
                        repo_url,
                        provider,
                        provider_host,
                        local_path,
                        auth_scope_hash,
                        last_fetched_at: Some(at),
                        last_used_at: at,
                        size_bytes,
                        state: RepoCacheState::Ready,
                        created_at: at,
                        updated_at: at,
                    },
                );
                self.touched.repo_caches.insert(repo_cache_id);
            }
            Event::RepoCacheFetched {
                repo_cache_id,
                size_bytes,
            } => {
                if let Some(row) = self.repo_caches.get_mut(&repo_cache_id) {
                    row.last_fetched_at = Some(at);
                    row.last_used_at = at;
                    row.size_bytes = size_bytes;
                    // A fetch of an evicted cache is its re-clone.
                    row.state = RepoCacheState::Ready;
                    row.updated_at = at;
                    self.touched.repo_caches.insert(repo_cache_id);
                }
            }
            Event::RepoCacheUsed { repo_cache_id } => {
                if let Some(row) = self.repo_caches.get_mut(&repo_cache_id) {
                    row.last_used_at = at;
                    row.updated_at = at;
                    self.touched.repo_caches.insert(repo_cache_id);
                }
            }
            Event::WorkspaceCreated {
                workspace_id,
                repo_cache_id,
                node,
                user_id,
                project_id,
                mode,
                conversation_id,
                task_id,
                base_ref,
                base_commit,
                branch_name,
                local_path,
                capabilities,
                size_bytes,
                history_ignored,
            } => {
                self.workspaces.insert(
                    workspace_id,
                    WorkspaceRow {
                        id: workspace_id,
                        repo_cache_id,
                        node,
                        project_id,
                        user_id,
                        mode,
                        conversation_id,
                        task_id,
                        base_ref,
                        base_commit,
                        branch_name,
                        local_path,
                        state: WorkspaceState::Ready,
                        dirty: false,
                        pinned_until: None,
                        last_used_at: at,
                        size_bytes,
                        capabilities,
                        created_at: at,
                        updated_at: at,
                        size_measured_at: Some(at),
                        evicted_at: None,
                        saved: None,
                        history_ignored,
                    },
                );
                self.touched.workspaces.insert(workspace_id);
            }
            Event::WorkspaceAcquired { workspace_id } => {
                self.update_workspace(workspace_id, at, |row| row.state = WorkspaceState::Ready);
            }
            Event::WorkspaceReleased { workspace_id } => {
                self.update_workspace(workspace_id, at, |row| row.state = WorkspaceState::Released);
            }
            Event::WorkspaceDirtyChanged {
                workspace_id,
                dirty,
            } => {
                self.update_workspace(workspace_id, at, |row| row.dirty = dirty);
            }
            // A tool's write, commit or push is a use of the workspace; whether it left
            // the workspace dirty is a `workspace.dirty_changed` of its own (as for an exec).
            // Opening or commenting on a pull request is a use too, and changes nothing else.
            Event::WorkspaceFileWritten { workspace_id, .. }
            | Event::WorkspaceCommitted { workspace_id, .. }
            | Event::WorkspacePushed { workspace_id, .. }
            | Event::WorkspaceMergedBack { workspace_id, .. }
            | Event::WorkspacePullRequestOpened { workspace_id, .. }
            | Event::WorkspacePullRequestCommented { workspace_id, .. }
            | Event::WorkspaceSnapshotTaken { workspace_id, .. }
            | Event::WorkspaceForked { workspace_id, .. } => {
                self.update_workspace(workspace_id, at, |_| {});
            }
            // History points live in the store and the log, not in a projection row.
            Event::WorkspaceHistoryPruned { .. } => {}
            // A conflicted merge-back left the workspace exactly as it was; a recovered
            // one is where its journal put it, which no column records.
            Event::WorkspaceMergeBackConflicted { .. }
            | Event::WorkspaceMergeBackRecovered { .. } => {}
            Event::WorkspaceSavedWorkMoved {
                workspace_id,
                saved,
                ..
            } => self.change_workspace(workspace_id, at, |row| row.saved = Some(saved)),
            Event::WorkspaceDestroyed { workspace_id } => {
                self.workspaces.remove(&workspace_id);
                self.touched.workspaces.insert(workspace_id);
            }
            Event::ExecStarted {
                workspace_id,
                runtime_id,
                ..
            }
            | Event::ExecFinished {
                workspace_id,
                runtime_id,
                ..
            } => {
                self.update_workspace(workspace_id, at, |_| {});
                if let Some(row) = self.runtimes.get_mut(&runtime_id) {
                    row.last_used_at = at;
                    row.updated_at = at;
                    self.touched.runtimes.insert(runtime_id);
                }
            }
            Event::RuntimeStarted {
                runtime_id,
                workspace_id,
                backend_kind,
                backend_runtime_id,
                image,
            } => {
                let created_at = self
                    .runtimes
                    .get(&runtime_id)
                    .map(|r| r.created_at)
                    .unwrap_or(at);
                self.runtimes.insert(
                    runtime_id,
                    RuntimeRow {
                        id: runtime_id,
                        workspace_id,
                        backend_kind,
                        backend_runtime_id,
                        image,
                        state: RuntimeState::Running,
                        last_started_at: Some(at),
                        last_used_at: at,
                        expires_at: None,
                        created_at,
                        updated_at: at,
                    },
                );
                self.touched.runtimes.insert(runtime_id);
            }
            Event::RuntimeStopped { runtime_id, .. } => {
                if let Some(row) = self.runtimes.get_mut(&runtime_id) {
                    row.state = RuntimeState::Stopped;
                    row.updated_at = at;
                    self.touched.runtimes.insert(runtime_id);
                }
            }
            Event::RuntimeDestroyed { runtime_id, .. } => {
                self.runtimes.remove(&runtime_id);
                self.touched.runtimes.insert(runtime_id);
            }
            Event::WorkspaceSizeMeasured {
                workspace_id,
                size_bytes,
            } => self.change_workspace(workspace_id, at, |row| {
                row.size_bytes = size_bytes;
                row.size_measured_at = Some(at);
            }),
            Event::WorkspacePinned {
                workspace_id,
                until,
            } => self.change_workspace(workspace_id, at, |row| row.pinned_until = until),
            Event::WorkspaceEvicting {
                workspace_id,
                saved,
                ..
            } => self.change_workspace(workspace_id, at, |row| {
                row.state = WorkspaceState::Evicting;
                row.evicted_at = Some(at);
                row.saved = saved;
            }),
            Event::WorkspaceEvicted {
                workspace_id,
                saved,
                ..
            } => self.change_workspace(workspace_id, at, |row| {
                row.state = WorkspaceState::Evicted;
                row.evicted_at = Some(at);
                row.saved = saved;
                // Its files take no space any more; `dirty` keeps saying whether it had
                // uncommitted changes (now in `saved`).
                row.size_bytes = 0;
                row.size_measured_at = Some(at);
            }),
            Event::WorkspaceEvictionBlocked {
                workspace_id,
                state,
                ..
            } => self.change_workspace(workspace_id, at, |row| {
                if let Some(state) = state {
                    row.state = state;
                    row.evicted_at = None;
                    row.saved = None;
                }
            }),
            Event::WorkspaceRestored {
                workspace_id,
                dirty,
                size_bytes,
                ..
            } => self.update_workspace(workspace_id, at, |row| {
                row.state = WorkspaceState::Ready;
                row.dirty = dirty;
                row.size_bytes = size_bytes;
                row.size_measured_at = Some(at);
                row.evicted_at = None;
                row.saved = None;
            }),
            Event::RepoCacheSizeMeasured {
                repo_cache_id,
                size_bytes,
            } => {
                if let Some(row) = self.repo_caches.get_mut(&repo_cache_id) {
                    row.size_bytes = size_bytes;
                    row.updated_at = at;
                    self.touched.repo_caches.insert(repo_cache_id);
                }
            }
            Event::RepoCacheEvicted { repo_cache_id, .. } => {
                if let Some(row) = self.repo_caches.get_mut(&repo_cache_id) {
                    row.state = RepoCacheState::Evicted;
                    row.size_bytes = 0;
                    row.updated_at = at;
                    self.touched.repo_caches.insert(repo_cache_id);
                }
            }
            Event::SweepFinished { .. } => {}
        }
    }

    /// Changes a workspace row without counting as a use (`last_used_at` is kept).
    fn change_workspace(&mut self, id: Uuid, at: DateTime<Utc>, f: impl FnOnce(&mut WorkspaceRow)) {
        if let Some(row) = self.workspaces.get_mut(&id) {
            f(row);
            row.updated_at = at;
            self.touched.workspaces.insert(id);
        }
    }

    fn update_workspace(&mut self, id: Uuid, at: DateTime<Utc>, f: impl FnOnce(&mut WorkspaceRow)) {
        if let Some(row) = self.workspaces.get_mut(&id) {
            f(row);
            row.last_used_at = at;
            row.updated_at = at;
            self.touched.workspaces.insert(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Capabilities, WorkspaceMode};

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).unwrap()
    }

    fn created(id: Uuid) -> Event {
        Event::WorkspaceCreated {
            workspace_id: id,
            repo_cache_id: Uuid::nil(),
            node: "local".into(),
            user_id: "u".into(),
            project_id: "p".into(),
            mode: WorkspaceMode::Edit,
            conversation_id: Some("c".into()),
            task_id: None,
            base_ref: "main".into(),
            base_commit: "abc".into(),
            branch_name: Some("agent/edits-c".into()),
            local_path: "/g/w".into(),
            capabilities: Capabilities::from_mode(WorkspaceMode::Edit),
            size_bytes: 10,
            history_ignored: false,
        }
    }

    #[test]
    fn given_a_created_workspace_when_dirtied_then_the_row_is_dirty_and_used() {
        let id = Uuid::from_u128(1);
        let mut p = Projections::default();
        p.apply(&created(id), at(1));
        p.apply(
            &Event::WorkspaceDirtyChanged {
                workspace_id: id,
                dirty: true,
            },
            at(2),
        );
        let row = &p.workspaces[&id];
        assert!(row.dirty);
        assert_eq!(row.created_at, at(1));
        assert_eq!(row.last_used_at, at(2));
        assert_eq!(
            p.take_touched().workspaces.into_iter().collect::<Vec<_>>(),
            vec![id]
        );
    }

    #[test]
    fn given_a_workspace_when_a_tool_writes_a_file_then_it_is_used_but_dirtiness_is_its_own_event()
    {
        let id = Uuid::from_u128(1);
        let mut p = Projections::default();
        p.apply(&created(id), at(1));
        p.take_touched();
        let written = Event::WorkspaceFileWritten {
            workspace_id: id,
            path: "src/lib.rs".into(),
            op: "str_replace".into(),
            size_bytes: 3,
            sha256: "ab".into(),
            created: false,
        };
        p.apply(&written, at(5));
        let row = &p.workspaces[&id];
        assert_eq!(row.last_used_at, at(5));
        assert_eq!(row.updated_at, at(5));
        assert!(!row.dirty);
        assert_eq!(Reads::of(&[written]).workspaces, vec![id]);
        assert_eq!(p.take_touched().workspaces.len(), 1);
        // A write to a workspace that is gone changes nothing.
        let mut empty = Projections::default();
        empty.apply(
            &Event::WorkspaceCommitted {
                workspace_id: id,
                commit: "c".into(),
                branch: None,
                files: vec![],
            },
            at(6),
        );
        assert!(empty.workspaces.is_empty() && empty.take_touched().workspaces.is_empty());
    }

    #[test]
    fn destroying_a_workspace_removes_its_row_but_not_its_runtime_history() {
        let id = Uuid::from_u128(1);
        let rt = Uuid::from_u128(2);
        let mut p = Projections::default();
        p.apply(&created(id), at(1));
        p.apply(
            &Event::RuntimeStarted {
                runtime_id: rt,
                workspace_id: id,
                backend_kind: "local".into(),
                backend_runtime_id: "local".into(),
                image: None,
            },
            at(2),
        );
        p.apply(
            &Event::RuntimeStopped {
                runtime_id: rt,
                reason: "release".into(),
            },
            at(3),
        );
        assert_eq!(p.runtimes[&rt].state, RuntimeState::Stopped);
        p.apply(&Event::WorkspaceDestroyed { workspace_id: id }, at(4));
        assert!(p.workspaces.is_empty());
        assert_eq!(Reads::of(&[created(id)]).workspaces, vec![id]);
    }

    #[test]
    fn an_evicted_workspace_keeps_its_record_with_the_saved_work_and_a_restore_brings_it_back() {
        let id = Uuid::from_u128(1);
        let mut p = Projections::default();
        p.apply(&created(id), at(1));
        assert_eq!(p.workspaces[&id].size_measured_at, Some(at(1)));
        p.apply(
            &Event::WorkspaceSizeMeasured {
                workspace_id: id,
                size_bytes: 500,
            },
            at(2),
        );
        p.apply(
            &Event::WorkspacePinned {
                workspace_id: id,
                until: Some(at(100)),
            },
            at(3),
        );
        let row = &p.workspaces[&id];
        assert_eq!((row.size_bytes, row.pinned_until), (500, Some(at(100))));
        assert_eq!(
            row.last_used_at,
            at(1),
            "measuring and pinning are not uses"
        );
        let saved = crate::model::SavedWork {
            ref_name: crate::model::saved_ref_name(id),
            commit: "c2".into(),
            head_commit: "c1".into(),
            patch_path: Some("/g/saved/x.patch".into()),
        };
        p.apply(
            &Event::WorkspaceEvicting {
                workspace_id: id,
                cause: crate::events::EvictionCause::DirectoryMissing,
                saved: Some(saved.clone()),
                omitted: vec![],
            },
            at(4),
        );
        assert_eq!(p.workspaces[&id].state, WorkspaceState::Evicting);
        p.apply(
            &Event::WorkspaceEvicted {
                workspace_id: id,
                cause: crate::events::EvictionCause::Interrupted,
                bytes_freed: 500,
                saved: Some(saved.clone()),
                omitted: vec!["ignored file big.bin (9 bytes): over the budget".into()],
            },
            at(5),
        );
        let row = &p.workspaces[&id];
        assert_eq!(row.state, WorkspaceState::Evicted);
        assert_eq!(row.size_bytes, 0);
        assert_eq!(row.saved.as_ref(), Some(&saved));
        assert_eq!(row.evicted_at, Some(at(5)));
        let moved = crate::model::SavedWork {
            ref_name: crate::model::SAVED_STORE_REF.into(),
            patch_path: Some("/g/saved/u/x/work.patch".into()),
            ..saved.clone()
        };
        p.apply(
            &Event::WorkspaceSavedWorkMoved {
                workspace_id: id,
                repo_cache_id: Uuid::from_u128(9),
                from_ref: crate::model::saved_ref_name(id),
                saved: moved.clone(),
            },
            at(5),
        );
        let row = &p.workspaces[&id];
        assert_eq!(row.saved.as_ref(), Some(&moved));
        assert!(!moved.in_cache() && saved.in_cache());
        assert_eq!(
            (row.state, row.last_used_at),
            (WorkspaceState::Evicted, at(1))
        );
        p.apply(
            &Event::WorkspaceRestored {
                workspace_id: id,
                head_commit: "c1".into(),
                saved: Some(saved),
                dirty: true,
                size_bytes: 600,
            },
            at(6),
        );
        let row = &p.workspaces[&id];
        assert_eq!(row.state, WorkspaceState::Ready);
        assert!(row.dirty && row.saved.is_none() && row.evicted_at.is_none());
        assert_eq!((row.size_bytes, row.last_used_at), (600, at(6)));
    }

    #[test]
    fn a_rolled_back_eviction_returns_to_the_given_state_and_a_blocked_one_changes_nothing() {
        let id = Uuid::from_u128(1);
        let mut p = Projections::default();
        p.apply(&created(id), at(1));
        let before = p.workspaces[&id].clone();
        p.apply(
            &Event::WorkspaceEvictionBlocked {
                workspace_id: id,
                cause: None,
                error: "disk full".into(),
                state: None,
            },
            at(2),
        );
        assert_eq!(p.workspaces[&id].state, before.state);
        p.apply(
            &Event::WorkspaceEvicting {
                workspace_id: id,
                cause: crate::events::EvictionCause::DirectoryMissing,
                saved: None,
                omitted: vec![],
            },
            at(3),
        );
        p.apply(
            &Event::WorkspaceEvictionBlocked {
                workspace_id: id,
                cause: None,
                error: "interrupted".into(),
                state: Some(WorkspaceState::Released),
            },
            at(4),
        );
        let row = &p.workspaces[&id];
        assert_eq!(row.state, WorkspaceState::Released);
        assert_eq!(row.evicted_at, None);
    }
}
