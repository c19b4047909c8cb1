//! The actions of an eviction plan carried out, each under its locks (taken without
//! waiting long) after its guards are checked again: runtimes stopped or destroyed,
//! workspaces saved and moved to the trash, repo caches moved to the trash.

use std::path::{Path, PathBuf};

use grove_core::error::CommandError;
use grove_core::events::{Correlation, Event, EvictionCause};
use grove_core::eviction::{Action, ActionKind, Reason};
use grove_core::model::{RuntimeRow, SavedWork, WorkspaceRow};
use grove_core::ports::SaveWorkRequest;
use grove_core::state::{RepoCacheState, RuntimeState};
use grove_core::sweep::ActionOutcome;
use grove_postgres::locks::LockScope;
use grove_postgres::rows;
use tracing::{info, warn};
use uuid::Uuid;

use super::inventory::{describe, is_live, NodeState};
use super::reconcile::{trash_dir, trash_path};
use crate::context::{
    blocking, correlation_of, release_all, store_error, store_path, try_lock, JobContext,
};

/// How one action ended, before it is put in the report.
pub(super) struct Ended {
    pub(super) outcome: ActionOutcome,
    pub(super) detail: Option<String>,
    /// Leave the target out of the re-plans of this sweep (false: only its record was
    /// stale, and the re-plan sees it as it is now).
    pub(super) exclude: bool,
}

impl Ended {
    pub(super) fn done() -> Self {
        Self {
            outcome: ActionOutcome::Done,
            detail: None,
            exclude: true,
        }
    }
    pub(super) fn skipped(why: impl Into<String>) -> Self {
        Self {
            outcome: ActionOutcome::Skipped,
            detail: Some(why.into()),
            exclude: true,
        }
    }
    pub(super) fn blocked(why: impl Into<String>) -> Self {
        Self {
            outcome: ActionOutcome::Blocked,
            detail: Some(why.into()),
            exclude: true,
        }
    }
    pub(super) fn failed(why: impl Into<String>) -> Self {
        Self {
            outcome: ActionOutcome::Failed,
            detail: Some(why.into()),
            exclude: true,
        }
    }
}

impl JobContext {
    async fn open_commands_for(
        &self,
        workspace_id: Uuid,
        except: Uuid,
    ) -> Result<bool, CommandError> {
        let mut conn = self.conn().await?;
        let open = rows::workspaces_with_open_commands(&mut conn, Some(except))
            .await
            .map_err(store_error)?;
        Ok(open.contains(&workspace_id))
    }

    async fn pause(&self) {
        if let Some(p) = self.config.eviction.test_pause {
            tokio::time::sleep(p).await;
        }
    }

    pub(super) async fn perform(
        &self,
        command_id: Uuid,
        action: &Action,
        state: &NodeState,
    ) -> Result<Ended, CommandError> {
        match action.kind {
            ActionKind::StopRuntime | ActionKind::DestroyRuntime => {
                self.runtime_action(command_id, action, state).await
            }
            ActionKind::EvictWorkspace { preserve_dirty } => {
                self.evict_workspace(command_id, action, preserve_dirty, state)
                    .await
            }
            ActionKind::EvictRepoCache => self.evict_cache(command_id, action, state).await,
        }
    }

    async fn runtime_action(
        &self,
        command_id: Uuid,
        action: &Action,
        state: &NodeState,
    ) -> Result<Ended, CommandError> {
        let Some(planned) = state.runtimes.get(&action.id) else {
            return Ok(Ended::skipped("runtime not in the inventory"));
        };
        let Some(lock) = try_lock(
            &self.pool,
            LockScope::WorkspaceCommands,
            &planned.workspace_id.to_string(),
            false,
        )
        .await?
        else {
            return Ok(Ended::skipped("the workspace is locked by another job"));
        };
        let result = match self.runtime_guard(command_id, action, planned).await {
            Ok(Ok(current)) => self.runtime_down(command_id, action, &current, state).await,
            Ok(Err(ended)) => Ok(ended),
            Err(e) => Err(e),
        };
        let _ = lock.release().await;
        result
    }

    /// The runtime's current record if the action's guards still hold, else why not.
    async fn runtime_guard(
        &self,
        command_id: Uuid,
        action: &Action,
        planned: &RuntimeRow,
    ) -> Result<Result<RuntimeRow, Ended>, CommandError> {
        let current = {
            let mut conn = self.conn().await?;
            rows::runtime(&mut conn, action.id)
                .await
                .map_err(store_error)?
        };
        let skip = |why: &str| Ok(Err(Ended::skipped(why)));
        let Some(current) = current else {
            return skip("the runtime is gone");
        };
        if current.last_used_at != planned.last_used_at {
            return skip("the runtime was used since the plan");
        }
        let orphan = matches!(action.reason, Reason::OrphanRuntime);
        if !orphan
            && self
                .open_commands_for(current.workspace_id, command_id)
                .await?
        {
            return skip("a command on its workspace is queued or running");
        }
        match action.reason {
            Reason::IdleRuntime { .. } if current.state != RuntimeState::Running => {
                return skip("the runtime is no longer running");
            }
            Reason::StoppedRuntime { .. }
                if current.state != RuntimeState::Stopped
                    || current.updated_at != planned.updated_at =>
            {
                return skip("the runtime changed since the plan");
            }
            Reason::WorkspaceEvicted { .. } if current.state == RuntimeState::Running => {
                return skip("the runtime is running");
            }
            Reason::OrphanRuntime => {
                let ws = {
                    let mut conn = self.conn().await?;
                    rows::workspace(&mut conn, current.workspace_id)
                        .await
                        .map_err(store_error)?
                };
                if ws.is_some_and(|w| is_live(w.state)) {
                    return skip("its workspace exists");
                }
            }
            _ => {}
        }
        Ok(Ok(current))
    }

    /// Stops or destroys `current` through its provider and records it.
    async fn runtime_down(
        &self,
        command_id: Uuid,
        action: &Action,
        current: &RuntimeRow,
        state: &NodeState,
    ) -> Result<Ended, CommandError> {
        let destroy = action.kind == ActionKind::DestroyRuntime;
        if let Some(provider) = self.runtimes.get(&current.backend_kind) {
            let effect = if destroy {
                provider.destroy(&current.backend_runtime_id).await
            } else {
                provider.stop(&current.backend_runtime_id).await
            };
            match effect {
                Ok(()) | Err(grove_core::error::RuntimeError::NotFound(_)) => {}
                Err(e) => return Ok(Ended::failed(e.to_string())),
            }
        }
        let reason = format!("eviction: {}", describe(&action.reason));
        let event = if destroy {
            Event::RuntimeDestroyed {
                runtime_id: current.id,
                reason,
            }
        } else {
            Event::RuntimeStopped {
                runtime_id: current.id,
                reason,
            }
        };
        let correlation = state
            .workspaces
            .get(&current.workspace_id)
            .map(correlation_of)
            .unwrap_or_default();
        self.record(command_id, correlation, &[event]).await?;
        Ok(Ended::done())
    }

    async fn evict_workspace(
        &self,
        command_id: Uuid,
        action: &Action,
        preserve_dirty: bool,
        state: &NodeState,
    ) -> Result<Ended, CommandError> {
        let Some(planned) = state.workspaces.get(&action.id) else {
            return Ok(Ended::skipped("workspace not in the inventory"));
        };
        let Some(locks) = self.try_lock_workspace(planned).await? else {
            return Ok(Ended::skipped("the workspace is locked by another job"));
        };
        let result = self
            .evict_locked(command_id, action, preserve_dirty, planned, state)
            .await;
        // The directory is in the trash and the record says evicted: unlock, then delete.
        let trash = match &result {
            Ok((_, trash)) => trash.clone(),
            Err(_) => None,
        };
        release_all(locks).await;
        if let Some(trash) = trash {
            let git = self.git.clone();
            let t = trash.clone();
            if let Err(e) = blocking(move || git.remove_trash(&t)).await {
                warn!(path = %trash.display(), error = %e.message, "could not empty the trash; the next sweep will");
            }
        }
        result.map(|(ended, _)| ended)
    }

    async fn evict_locked(
        &self,
        command_id: Uuid,
        action: &Action,
        preserve_dirty: bool,
        planned: &WorkspaceRow,
        state: &NodeState,
    ) -> Result<(Ended, Option<PathBuf>), CommandError> {
        let ws = match self.evict_guard(command_id, planned, state).await? {
            Ok(ws) => ws,
            Err(ended) => return Ok((ended, None)),
        };
        let cause = EvictionCause::Policy(action.reason);
        // A merge-back a dead worker left half-done is settled before anything is saved.
        self.recover_merge_back(&ws).await?;
        let dirty = match self.dirty_now(command_id, &ws).await? {
            Ok(dirty) => dirty,
            Err(error) => return self.blocked(command_id, &ws, cause, error).await,
        };
        if dirty && !preserve_dirty {
            // The record said clean: re-plan with what git says (its tier changed).
            let mut ended =
                Ended::skipped("it has uncommitted changes the plan did not know of (re-planned)");
            ended.exclude = false;
            return Ok((ended, None));
        }
        let saved = if ws.capabilities.writable || dirty {
            match self.save_work(&ws, action, state).await {
                Ok(saved) => saved,
                Err(error) => return self.blocked(command_id, &ws, cause, error).await,
            }
        } else {
            (None, Vec::new())
        };
        let moved = self.move_to_trash(command_id, &ws, cause, saved).await?;
        self.drop_tracker(ws.id).await;
        if moved.1.is_some() {
            info!(workspace = %ws.id, reason = %describe(&action.reason), "workspace evicted");
        }
        Ok(moved)
    }

    /// The workspace's current row if the eviction's guards still hold, else why not.
    async fn evict_guard(
        &self,
        command_id: Uuid,
        planned: &WorkspaceRow,
        state: &NodeState,
    ) -> Result<Result<WorkspaceRow, Ended>, CommandError> {
        let skip = |why: &str| Ok(Err(Ended::skipped(why)));
        let Ok(ws) = self.workspace(planned.id).await else {
            return skip("the workspace is gone");
        };
        if !ws.state.has_files() {
            return skip("its state changed since the plan");
        }
        if ws.last_used_at != planned.last_used_at {
            return skip("it was used since the plan");
        }
        if ws
            .pinned_until
            .is_some_and(|until| until > state.inventory.now)
        {
            return skip("it was pinned since the plan");
        }
        let runtimes = {
            let mut conn = self.conn().await?;
            rows::runtimes_of(&mut conn, ws.id)
                .await
                .map_err(store_error)?
        };
        if !runtimes.is_empty() {
            return skip("it still has a runtime");
        }
        if self.open_commands_for(ws.id, command_id).await? {
            return skip("a command on it is queued or running");
        }
        if !Path::new(&ws.local_path).is_dir() {
            // Nothing to delete: the reconcile step of the next sweep records it.
            return skip("its directory is missing");
        }
        Ok(Ok(ws))
    }

    /// Dirtiness is git's answer now, not the record's (recorded when it differs);
    /// the inner error says why git could not tell.
    async fn dirty_now(
        &self,
        command_id: Uuid,
        ws: &WorkspaceRow,
    ) -> Result<Result<bool, String>, CommandError> {
        let git = self.git.clone();
        let dir = PathBuf::from(&ws.local_path);
        let dirty = match blocking(move || git.is_dirty(&dir)).await {
            Ok(dirty) => dirty,
            Err(e) => {
                return Ok(Err(format!(
                    "cannot tell whether it is dirty: {}",
                    e.message
                )))
            }
        };
        if dirty != ws.dirty {
            let event = Event::WorkspaceDirtyChanged {
                workspace_id: ws.id,
                dirty,
            };
            self.record(command_id, correlation_of(ws), &[event])
                .await?;
        }
        Ok(Ok(dirty))
    }

    /// Saves the workspace's work (ref and patch) into its private store; the error
    /// says why it could not be.
    async fn save_work(
        &self,
        ws: &WorkspaceRow,
        action: &Action,
        state: &NodeState,
    ) -> Result<(Option<SavedWork>, Vec<String>), String> {
        let cache = state
            .caches
            .get(&ws.repo_cache_id)
            .filter(|c| c.state == RepoCacheState::Ready && Path::new(&c.local_path).is_dir());
        let Some(cache) = cache else {
            return Err("its repo cache is missing, so its work cannot be saved".into());
        };
        let git = self.git.clone();
        let cache_dir = PathBuf::from(&cache.local_path);
        let (ws_dir, store, base, budget) = (
            PathBuf::from(&ws.local_path),
            store_path(self.home(), ws),
            ws.base_commit.clone(),
            self.config.eviction.ignored_budget_bytes,
        );
        let message = format!(
            "grove: work of workspace {} saved before eviction\n\n{}",
            ws.id,
            describe(&action.reason)
        );
        let saved = blocking(move || {
            git.save_work(&SaveWorkRequest {
                workspace_dir: &ws_dir,
                cache_dir: &cache_dir,
                store_dir: &store,
                ignored_budget_bytes: budget,
                base_commit: &base,
                message: &message,
            })
        })
        .await;
        match saved {
            Ok(report) => Ok((report.saved, report.omitted)),
            Err(e) => Err(format!("saving its work failed: {}", e.message)),
        }
    }

    /// `workspace.evicting`, the directory renamed into the trash, `workspace.evicted`
    /// (a failed rename is `workspace.eviction_blocked`, nothing deleted). Returns the
    /// trash entry to delete once the locks are released.
    async fn move_to_trash(
        &self,
        command_id: Uuid,
        ws: &WorkspaceRow,
        cause: EvictionCause,
        (saved, omitted): (Option<SavedWork>, Vec<String>),
    ) -> Result<(Ended, Option<PathBuf>), CommandError> {
        let correlation = correlation_of(ws);
        let evicting = Event::WorkspaceEvicting {
            workspace_id: ws.id,
            cause,
            saved: saved.clone(),
            omitted: omitted.clone(),
        };
        self.record(command_id, correlation.clone(), &[evicting])
            .await?;
        self.pause().await;
        let trash = trash_path(self.home(), "ws", ws.id);
        let moved = std::fs::create_dir_all(trash_dir(self.home()))
            .and_then(|()| std::fs::rename(&ws.local_path, &trash));
        if let Err(e) = moved {
            // Nothing was deleted: back to where it was.
            let back = Event::WorkspaceEvictionBlocked {
                workspace_id: ws.id,
                cause: Some(cause),
                error: format!("moving the workspace to the trash failed: {e}"),
                state: Some(ws.state),
            };
            self.record(command_id, correlation, &[back]).await?;
            let ended = Ended::blocked(format!("moving it to the trash failed: {e}"));
            return Ok((ended, None));
        }
        self.pause().await;
        let evicted = Event::WorkspaceEvicted {
            workspace_id: ws.id,
            cause,
            bytes_freed: ws.size_bytes,
            saved,
            omitted,
        };
        self.record(command_id, correlation, &[evicted]).await?;
        Ok((Ended::done(), Some(trash)))
    }

    async fn blocked(
        &self,
        command_id: Uuid,
        ws: &WorkspaceRow,
        cause: EvictionCause,
        error: String,
    ) -> Result<(Ended, Option<PathBuf>), CommandError> {
        warn!(workspace = %ws.id, %error, "eviction blocked; the workspace is kept");
        self.record(
            command_id,
            correlation_of(ws),
            &[Event::WorkspaceEvictionBlocked {
                workspace_id: ws.id,
                cause: Some(cause),
                error: error.clone(),
                state: None,
            }],
        )
        .await?;
        Ok((Ended::blocked(error), None))
    }

    async fn evict_cache(
        &self,
        command_id: Uuid,
        action: &Action,
        state: &NodeState,
    ) -> Result<Ended, CommandError> {
        let Some(planned) = state.caches.get(&action.id) else {
            return Ok(Ended::skipped("repo cache not in the inventory"));
        };
        let Some(lock) = try_lock(
            &self.pool,
            LockScope::RepoCache,
            &format!("{}\u{0}{}", planned.node, planned.identity),
            false,
        )
        .await?
        else {
            return Ok(Ended::skipped("the repo cache is in use"));
        };
        let result: Result<(Ended, Option<PathBuf>), CommandError> = async {
            let (current, (live, saved)) = {
                let mut conn = self.conn().await?;
                (
                    rows::repo_cache(&mut conn, planned.id)
                        .await
                        .map_err(store_error)?,
                    rows::cache_dependents(&mut conn, planned.id)
                        .await
                        .map_err(store_error)?,
                )
            };
            let Some(current) = current else {
                return Ok((Ended::skipped("the repo cache is gone"), None));
            };
            if current.state != RepoCacheState::Ready || current.last_used_at != planned.last_used_at {
                return Ok((Ended::skipped("the repo cache was used since the plan"), None));
            }
            if live > 0 {
                return Ok((Ended::skipped("the repo cache has live workspaces"), None));
            }
            if saved > 0 {
                return Ok((Ended::skipped("the repo cache holds saved work"), None));
            }
            let dir = PathBuf::from(&current.local_path);
            let trash = trash_path(self.home(), "cache", current.id);
            let moved = std::fs::create_dir_all(trash_dir(self.home()))
                .and_then(|()| std::fs::rename(&dir, &trash));
            if let Err(e) = moved {
                return Ok((Ended::failed(format!("moving it to the trash failed: {e}")), None));
            }
            self.record(
                command_id,
                Correlation::default(),
                &[Event::RepoCacheEvicted {
                    repo_cache_id: current.id,
                    cause: EvictionCause::Policy(action.reason),
                    bytes_freed: current.size_bytes,
                }],
            )
            .await?;
            info!(repo_cache = %current.id, reason = %describe(&action.reason), "repo cache evicted");
            Ok((Ended::done(), Some(trash)))
        }
        .await;
        let _ = lock.release().await;
        let (ended, trash) = result?;
        if let Some(trash) = trash {
            let git = self.git.clone();
            let t = trash.clone();
            if let Err(e) = blocking(move || git.remove_trash(&t)).await {
                warn!(path = %trash.display(), error = %e.message, "could not empty the trash; the next sweep will");
            }
        }
        Ok(ended)
    }
}
