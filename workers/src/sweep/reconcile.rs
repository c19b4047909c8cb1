//! The steps of a sweep before its plan: the trash emptied, interrupted evictions and
//! missing directories reconciled, stale sizes measured, runtimes health-checked.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use chrono::Utc;
use grove_core::error::CommandError;
use grove_core::events::{Correlation, Event, EvictionCause};
use grove_core::eviction::Target;
use grove_core::model::WorkspaceRow;
use grove_core::state::{RepoCacheState, RuntimeState, WorkspaceState};
use grove_core::sweep::{Reconciled, SweepReport};
use grove_postgres::locks::LockScope;
use grove_postgres::rows;
use tracing::warn;
use uuid::Uuid;

use super::inventory::NodeState;
use crate::context::{
    blocking, correlation_of, now, release_all, store_error, try_lock, JobContext,
};

pub(super) fn trash_dir(home: &Path) -> PathBuf {
    home.join("trash")
}

pub(super) fn trash_path(home: &Path, what: &str, id: Uuid) -> PathBuf {
    let nanos = Utc::now().timestamp_nanos_opt().unwrap_or(0);
    trash_dir(home).join(format!("{what}-{id}-{nanos:x}"))
}

impl JobContext {
    /// Removes what earlier evictions moved to the trash (the sweep lock is held, so no
    /// other sweep of this node is removing the same entries).
    pub(super) async fn empty_trash(&self) {
        let dir = trash_dir(self.home());
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let git = self.git.clone();
            let p = path.clone();
            if let Err(e) = blocking(move || git.remove_trash(&p)).await {
                warn!(path = %path.display(), error = %e.message, "could not empty a trash entry");
            }
        }
    }

    /// Finishes or rolls back interrupted evictions; records missing directories.
    pub(super) async fn reconcile(
        &self,
        command_id: Uuid,
        report: &mut SweepReport,
    ) -> Result<(), CommandError> {
        let (workspaces, caches) = {
            let mut conn = self.conn().await?;
            (
                rows::workspaces_of_node(&mut conn, &self.config.node)
                    .await
                    .map_err(store_error)?,
                rows::repo_caches_of_node(&mut conn, &self.config.node)
                    .await
                    .map_err(store_error)?,
            )
        };
        for ws in workspaces {
            let suspicious = ws.state == WorkspaceState::Evicting
                || (ws.state.has_files() && !Path::new(&ws.local_path).is_dir());
            if !suspicious {
                continue;
            }
            let Some(locks) = self.try_lock_workspace(&ws).await? else {
                continue;
            };
            let ws = self.workspace(ws.id).await;
            let result = match ws {
                Ok(ws) => self.reconcile_workspace(command_id, &ws, report).await,
                Err(_) => Ok(()),
            };
            release_all(locks).await;
            result?;
        }
        for cache in caches {
            if cache.state != RepoCacheState::Ready || Path::new(&cache.local_path).is_dir() {
                continue;
            }
            let Some(lock) = try_lock(
                &self.pool,
                LockScope::RepoCache,
                &format!("{}\u{0}{}", cache.node, cache.identity),
                false,
            )
            .await?
            else {
                continue;
            };
            let current = {
                let mut conn = self.conn().await?;
                rows::repo_cache(&mut conn, cache.id)
                    .await
                    .map_err(store_error)?
            };
            if let Some(current) = current
                .filter(|c| c.state == RepoCacheState::Ready && !Path::new(&c.local_path).is_dir())
            {
                self.record(
                    command_id,
                    Correlation::default(),
                    &[Event::RepoCacheEvicted {
                        repo_cache_id: current.id,
                        cause: EvictionCause::DirectoryMissing,
                        bytes_freed: 0,
                    }],
                )
                .await?;
                report.reconciled.push(Reconciled {
                    target: Target::RepoCache,
                    id: current.id,
                    what: "directory missing: recorded as evicted".into(),
                });
            }
            let _ = lock.release().await;
        }
        Ok(())
    }

    async fn reconcile_workspace(
        &self,
        command_id: Uuid,
        ws: &WorkspaceRow,
        report: &mut SweepReport,
    ) -> Result<(), CommandError> {
        let present = Path::new(&ws.local_path).is_dir();
        let (event, what) = match (ws.state, present) {
            (WorkspaceState::Evicting, true) => (
                Event::WorkspaceEvictionBlocked {
                    workspace_id: ws.id,
                    cause: Some(EvictionCause::Interrupted),
                    error: "an interrupted eviction was rolled back: the files were still in place"
                        .into(),
                    state: Some(WorkspaceState::Released),
                },
                "interrupted eviction rolled back",
            ),
            (WorkspaceState::Evicting, false) => (
                Event::WorkspaceEvicted {
                    workspace_id: ws.id,
                    cause: EvictionCause::Interrupted,
                    bytes_freed: ws.size_bytes,
                    saved: ws.saved.clone(),
                    omitted: Vec::new(),
                },
                "interrupted eviction finished",
            ),
            (WorkspaceState::Ready | WorkspaceState::Released, false) => (
                Event::WorkspaceEvicted {
                    workspace_id: ws.id,
                    cause: EvictionCause::DirectoryMissing,
                    bytes_freed: 0,
                    saved: None,
                    omitted: Vec::new(),
                },
                "directory missing: recorded as evicted",
            ),
            (WorkspaceState::Ready | WorkspaceState::Released, true)
            | (WorkspaceState::Evicted, _) => return Ok(()),
        };
        self.record(command_id, correlation_of(ws), &[event])
            .await?;
        report.reconciled.push(Reconciled {
            target: Target::Workspace,
            id: ws.id,
            what: what.into(),
        });
        Ok(())
    }

    /// Re-measures workspaces used since their last measurement (at most once per
    /// `measure_every` each).
    pub(super) async fn measure_stale(
        &self,
        command_id: Uuid,
        report: &mut SweepReport,
    ) -> Result<(), CommandError> {
        let workspaces = {
            let mut conn = self.conn().await?;
            rows::workspaces_of_node(&mut conn, &self.config.node)
                .await
                .map_err(store_error)?
        };
        let real_now = now();
        let every = chrono::Duration::from_std(self.config.eviction.measure_every)
            .unwrap_or(chrono::Duration::MAX);
        for ws in workspaces {
            if !ws.state.has_files() {
                continue;
            }
            let due = match ws.size_measured_at {
                None => true,
                Some(at) => ws.last_used_at > at && real_now - at >= every,
            };
            if !due {
                continue;
            }
            let git = self.git.clone();
            let dir = PathBuf::from(&ws.local_path);
            let Ok(size_bytes) = blocking(move || git.measure(&dir)).await else {
                continue;
            };
            self.record(
                command_id,
                correlation_of(&ws),
                &[Event::WorkspaceSizeMeasured {
                    workspace_id: ws.id,
                    size_bytes,
                }],
            )
            .await?;
            report.measured += 1;
        }
        Ok(())
    }

    /// Runtimes whose provider says they are unhealthy (local runtimes always are healthy).
    pub(super) async fn health_checks(&self, state: &NodeState) -> HashSet<Uuid> {
        let mut out = HashSet::new();
        for rt in state
            .runtimes
            .values()
            .filter(|r| r.state == RuntimeState::Running)
        {
            if let Some(provider) = self.runtimes.get(&rt.backend_kind) {
                if let Ok(false) = provider.healthy(&rt.backend_runtime_id).await {
                    out.insert(rt.id);
                }
            }
        }
        out
    }
}
