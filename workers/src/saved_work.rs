//! Moving saved work out of shared repo caches into private per-workspace stores.
//!
//! Work evicted by an older version sits in the repo cache as `refs/grove/saved/<id>`,
//! and the cache is mounted into every sandbox of that repository. At start, a worker
//! moves each such record of its node into the workspace's private store (under the
//! workspace's key and command locks, skipping a busy one until the next start),
//! records `workspace.saved_work_moved`, and only then deletes the cache's ref. Saved
//! refs that no record needs any more (restored or destroyed workspaces, or a crash
//! after the event) are deleted too. Idempotent: a second run finds nothing to do.

use std::collections::HashMap;
use std::path::PathBuf;

use grove_core::error::CommandError;
use grove_core::events::Event;
use grove_core::model::{RepoCacheRow, WorkspaceRow, LEGACY_SAVED_REF_PREFIX};
use grove_core::state::RepoCacheState;
use grove_postgres::rows;
use tracing::{info, warn};
use uuid::Uuid;

use crate::context::{blocking, correlation_of, release_all, store_error, store_path, JobContext};
use crate::sweep::SWEEP_NAMESPACE;

/// What one run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MoveReport {
    pub moved: usize,
    pub busy: usize,
    pub failed: usize,
    pub refs_dropped: usize,
}

impl JobContext {
    /// Moves every workspace's saved work of this node out of its repo cache.
    pub async fn move_saved_work_out_of_caches(&self) -> Result<MoveReport, CommandError> {
        let (workspaces, caches) = {
            let mut conn = self.conn().await?;
            let node = &self.config.node;
            (
                rows::workspaces_of_node(&mut conn, node)
                    .await
                    .map_err(store_error)?,
                rows::repo_caches_of_node(&mut conn, node)
                    .await
                    .map_err(store_error)?,
            )
        };
        let caches: HashMap<Uuid, RepoCacheRow> = caches.into_iter().map(|c| (c.id, c)).collect();
        let mut report = MoveReport::default();
        for ws in workspaces
            .iter()
            .filter(|w| w.saved.as_ref().is_some_and(|s| s.in_cache()))
        {
            let Some(cache) = caches.get(&ws.repo_cache_id) else {
                continue;
            };
            match self.move_one(ws, cache).await {
                Ok(true) => report.moved += 1,
                Ok(false) => report.busy += 1,
                Err(e) => {
                    warn!(workspace = %ws.id, error = %e.message, "could not move saved work out of the repo cache; the next start retries");
                    report.failed += 1;
                }
            }
        }
        report.refs_dropped = self.drop_unneeded_refs(caches.values()).await;
        if report != MoveReport::default() {
            info!(?report, "saved work moved out of shared repo caches");
        }
        Ok(report)
    }

    /// `Ok(false)`: the workspace was busy (left for the next start).
    async fn move_one(
        &self,
        planned: &WorkspaceRow,
        cache: &RepoCacheRow,
    ) -> Result<bool, CommandError> {
        let Some(locks) = self.try_lock_workspace(planned).await? else {
            return Ok(false);
        };
        let result = self.move_locked(planned.id, cache).await;
        release_all(locks).await;
        result.map(|()| true)
    }

    async fn move_locked(&self, id: Uuid, cache: &RepoCacheRow) -> Result<(), CommandError> {
        let ws = self.workspace(id).await?;
        let Some(saved) = ws.saved.clone().filter(|s| s.in_cache()) else {
            return Ok(());
        };
        let git = self.git.clone();
        let (cache_dir, store, branch, from) = (
            PathBuf::from(&cache.local_path),
            store_path(self.home(), &ws),
            ws.branch_name.clone(),
            saved.clone(),
        );
        let moved = blocking(move || {
            git.move_saved_out_of_cache(&cache_dir, &from, branch.as_deref(), &store)
        })
        .await?;
        let command_id = Uuid::new_v5(&SWEEP_NAMESPACE, format!("saved-moved\0{id}").as_bytes());
        self.record(
            command_id,
            correlation_of(&ws),
            &[Event::WorkspaceSavedWorkMoved {
                workspace_id: ws.id,
                repo_cache_id: cache.id,
                from_ref: saved.ref_name.clone(),
                saved: moved,
            }],
        )
        .await?;
        let git = self.git.clone();
        let (cache_dir, name) = (PathBuf::from(&cache.local_path), saved.ref_name);
        blocking(move || git.drop_cache_ref(&cache_dir, &name)).await?;
        if let Some(patch) = saved.patch_path {
            let _ = std::fs::remove_file(patch);
        }
        Ok(())
    }

    /// Deletes `refs/grove/saved/*` refs no record still reads from the cache.
    async fn drop_unneeded_refs<'a>(
        &self,
        caches: impl Iterator<Item = &'a RepoCacheRow>,
    ) -> usize {
        let mut dropped = 0;
        for cache in caches.filter(|c| c.state == RepoCacheState::Ready) {
            let git = self.git.clone();
            let dir = PathBuf::from(&cache.local_path);
            let Ok(names) = blocking(move || git.cache_saved_refs(&dir)).await else {
                continue;
            };
            for name in names {
                let id = name
                    .strip_prefix(LEGACY_SAVED_REF_PREFIX)
                    .and_then(|s| Uuid::parse_str(s).ok());
                let needed = match id {
                    Some(id) => match self.workspace(id).await {
                        Ok(ws) => ws.saved.as_ref().is_some_and(|s| s.in_cache()),
                        Err(e) => e.kind != grove_core::error::ErrorKind::NotFound,
                    },
                    None => false,
                };
                if needed {
                    continue;
                }
                let git = self.git.clone();
                let dir = PathBuf::from(&cache.local_path);
                if blocking(move || git.drop_cache_ref(&dir, &name))
                    .await
                    .is_ok()
                {
                    dropped += 1;
                }
            }
        }
        dropped
    }
}
