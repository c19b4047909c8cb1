//! `restore_workspace`: an evicted workspace checked out again from its repo cache and
//! its saved work (same id, path and branch), a point of its history after it; and the saved work of a destroyed
//! workspace discarded.

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use grove_core::commands::CommandResult;
use grove_core::decide::restore::{restore_step, RestoreStep};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::events::{Event, EvictionCause};
use grove_core::history::Operation;
use grove_core::model::{saved_ref_name, RepoCacheRow, WorkspaceRow};
use grove_core::ports::{CheckoutReport, GitToken, RestoreRequest};
use grove_core::state::WorkspaceState;
use grove_postgres::locks::{AdvisoryLock, LockScope};
use grove_postgres::rows;
use tracing::{info, warn};
use uuid::Uuid;

use crate::context::{
    blocking, correlation_of, fold_workspace, release_all, store_error, store_path, Handled,
    JobContext,
};

impl JobContext {
    /// `restore_workspace`: checks an evicted workspace out again, under its key lock and
    /// its command lock.
    pub async fn restore_workspace(
        &self,
        workspace_id: Uuid,
        command_id: Uuid,
        token: Option<&GitToken>,
        at: DateTime<Utc>,
    ) -> Result<Handled, CommandError> {
        let ws = self.workspace(workspace_id).await?;
        // A remote workspace is never evicted, so never restored.
        super::host_only(&ws, "restore")?;
        let key_lock = self
            .lock(LockScope::WorkspaceKey, &ws.key().lock_string(), false)
            .await?;
        let cmd_lock = match self
            .lock(LockScope::WorkspaceCommands, &ws.id.to_string(), false)
            .await
        {
            Ok(l) => l,
            Err(e) => {
                let _ = key_lock.release().await;
                return Err(e);
            }
        };
        let locks = vec![cmd_lock, key_lock];
        let ws = match self.workspace(workspace_id).await {
            Ok(ws) => ws,
            Err(e) => {
                release_all(locks).await;
                return Err(e);
            }
        };
        self.restore_locked(ws, command_id, token, at, locks).await
    }

    /// Restores `ws` (its key and command locks held, passed in `locks`). A workspace
    /// that is not evicted is returned as it is; one left `evicting` by a crash is
    /// rolled back if its files are in place, else restored from its saved work.
    pub(crate) async fn restore_locked(
        &self,
        ws: WorkspaceRow,
        command_id: Uuid,
        token: Option<&GitToken>,
        at: DateTime<Utc>,
        mut locks: Vec<AdvisoryLock>,
    ) -> Result<Handled, CommandError> {
        let correlation = correlation_of(&ws);
        let dir = PathBuf::from(&ws.local_path);
        let step = restore_step(
            &ws,
            &self.config.node,
            dir.is_dir(),
            dir.join(".git").is_dir(),
        );
        let events = match step {
            Ok(RestoreStep::Unchanged) => {
                return Ok(Handled {
                    result: Ok(CommandResult::Workspace(ws)),
                    events: Vec::new(),
                    locks,
                    correlation,
                })
            }
            Ok(RestoreStep::RollBack) => Ok(vec![Event::WorkspaceEvictionBlocked {
                workspace_id: ws.id,
                cause: Some(EvictionCause::Interrupted),
                error: "an interrupted eviction was rolled back: the files were still in place"
                    .into(),
                state: Some(WorkspaceState::Ready),
            }]),
            Ok(RestoreStep::Rebuild { reuse_checkout }) => {
                match self
                    .rebuild(&ws, command_id, token, at, reuse_checkout, &mut locks)
                    .await
                {
                    Ok(mut events) => {
                        events.extend(self.point_after_restore(&ws, &events, at).await);
                        Ok(events)
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        let events = match events {
            Ok(events) => events,
            Err(e) => {
                release_all(locks).await;
                return Err(e);
            }
        };
        let row = fold_workspace(Some(ws), &events, at);
        Ok(Handled {
            result: row.map(CommandResult::Workspace),
            events,
            locks,
            correlation,
        })
    }

    /// The history point of a restored checkout (ADR 28): the workspace's timeline,
    /// whose store eviction kept, continues with the files as restored. With history
    /// off, nothing (`workspace.restored` already says whether it is dirty).
    async fn point_after_restore(
        &self,
        ws: &WorkspaceRow,
        events: &[Event],
        at: DateTime<Utc>,
    ) -> Vec<Event> {
        if !self.config.history {
            return Vec::new();
        }
        match fold_workspace(Some(ws.clone()), events, at) {
            Ok(restored) => self.after_change(&restored, Operation::Restore).await,
            Err(_) => Vec::new(),
        }
    }

    /// Checks `ws` out again from its repo cache (cloned again if it was evicted; its
    /// lock joins `locks`) and its saved work; with `reuse_checkout`, keeps the finished
    /// checkout already at its path. Returns the cache's events and `workspace.restored`.
    async fn rebuild(
        &self,
        ws: &WorkspaceRow,
        command_id: Uuid,
        token: Option<&GitToken>,
        at: DateTime<Utc>,
        reuse_checkout: bool,
        locks: &mut Vec<AdvisoryLock>,
    ) -> Result<Vec<Event>, CommandError> {
        let cache = {
            let mut conn = self.conn().await?;
            rows::repo_cache(&mut conn, ws.repo_cache_id)
                .await
                .map_err(store_error)?
        };
        let cache = cache.ok_or_else(|| {
            let msg = format!("the repo cache record of workspace {} is gone", ws.id);
            CommandError::new(ErrorKind::NotFound, msg)
        })?;
        let (cache, mut events, cache_lock) = self
            .ensure_cache(
                &cache.repo_name,
                &cache.repo_url,
                false,
                token,
                at,
                command_id,
            )
            .await?;
        locks.extend(cache_lock);
        let head = ws
            .saved
            .as_ref()
            .map(|s| s.head_commit.clone())
            .unwrap_or_else(|| ws.base_commit.clone());
        let work = ws
            .saved
            .as_ref()
            .filter(|s| s.has_changes())
            .map(|s| s.commit.clone());
        let report = self
            .restore_checkout(ws, &cache, &head, work.clone(), reuse_checkout)
            .await?;
        events.push(Event::WorkspaceRestored {
            workspace_id: ws.id,
            head_commit: head,
            saved: ws.saved.clone(),
            dirty: work.is_some(),
            size_bytes: report.size_bytes,
        });
        info!(workspace = %ws.id, "workspace restored");
        Ok(events)
    }

    /// The checkout of `ws` rebuilt at its path from `cache` at `head`, with the saved
    /// `work` on top; or, with `reuse_checkout`, the one already there measured.
    async fn restore_checkout(
        &self,
        ws: &WorkspaceRow,
        cache: &RepoCacheRow,
        head: &str,
        work: Option<String>,
        reuse_checkout: bool,
    ) -> Result<CheckoutReport, CommandError> {
        let git = self.git.clone();
        let upstream = cache.repo_url.clone();
        // Work saved by this version is in the private store, with everything it kept.
        let store = ws
            .saved
            .as_ref()
            .filter(|s| !s.in_cache())
            .map(|_| store_path(self.home(), ws));
        let (cache_dir, ws_dir, base_ref, base_commit, branch, h) = (
            PathBuf::from(&cache.local_path),
            PathBuf::from(&ws.local_path),
            ws.base_ref.clone(),
            ws.base_commit.clone(),
            ws.branch_name.clone(),
            head.to_string(),
        );
        blocking(move || {
            if reuse_checkout {
                return git.measure(&ws_dir).map(|size_bytes| CheckoutReport {
                    base_commit: base_commit.clone(),
                    size_bytes,
                });
            }
            git.restore_checkout(&RestoreRequest {
                cache_dir: &cache_dir,
                workspace_dir: &ws_dir,
                base_ref: &base_ref,
                base_commit: &base_commit,
                branch: branch.as_deref(),
                head_commit: &h,
                work_commit: work.as_deref(),
                upstream_url: &upstream,
                store_dir: store.as_deref(),
            })
        })
        .await
    }

    /// Deletes a destroyed workspace's private store (and a saved-work ref an older
    /// version left in the cache). Best effort: a leftover is only disk space.
    pub(crate) async fn discard_saved_work(&self, ws: &WorkspaceRow) {
        let cache = match self.conn().await {
            Ok(mut conn) => rows::repo_cache(&mut conn, ws.repo_cache_id)
                .await
                .ok()
                .flatten(),
            Err(_) => None,
        };
        let git = self.git.clone();
        let cache_dir = cache
            .map(|c| PathBuf::from(c.local_path))
            .unwrap_or_default();
        let (ref_name, store) = (saved_ref_name(ws.id), store_path(self.home(), ws));
        if let Err(e) =
            blocking(move || git.discard_saved_work(&cache_dir, &ref_name, &store)).await
        {
            warn!(workspace = %ws.id, error = %e.message, "could not discard the saved work of a destroyed workspace");
        }
    }
}
