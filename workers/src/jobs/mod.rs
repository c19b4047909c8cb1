//! One module per job kind (or small family of kinds), each owning its handler over the
//! shared [`JobContext`]; the runner dispatches to them with one `match` over `Command`.
//! Shared here: locking a workspace for a command, and refusing host-only operations
//! on a workspace placed in a remote provider.

use std::sync::Arc;

use grove_core::error::{CommandError, ErrorKind};
use grove_core::model::WorkspaceRow;
use grove_core::placement::Placement;
use grove_core::ports::RuntimeProvider;
use grove_postgres::locks::{AdvisoryLock, LeaseCommit, LockScope};
use uuid::Uuid;

use crate::context::{store_error, JobContext};

pub mod acquire;
pub mod exec;
pub mod history;
pub mod journal;
pub mod lifecycle;
pub mod merge_back;
pub mod pulls;
pub mod reads;
mod remote_tools;
pub mod repo_cache;
pub mod restore;
pub mod scope;
pub mod tools;

/// The answer to a command on workspace `id` whose files were evicted.
pub(crate) fn evicted(id: Uuid) -> CommandError {
    CommandError::new(
        ErrorKind::Conflict,
        format!(
            "workspace {id} is evicted (its files were removed to free disk space); run `grove workspace restore {id}` or acquire it again"
        ),
    )
}

impl JobContext {
    /// Takes the workspace's command lock, then reads its row: a workspace destroyed
    /// while we waited is reported as not found rather than used half-gone, and one
    /// evicted meanwhile (its files are gone) as a conflict that says how to get it back.
    pub(crate) async fn lock_workspace(
        &self,
        id: Uuid,
        shared: bool,
    ) -> Result<(WorkspaceRow, AdvisoryLock), CommandError> {
        self.lock_workspace_with(id, shared, LeaseCommit::Flushed)
            .await
    }

    /// [`Self::lock_workspace`] with the lease's commit flushed as `commit` says: a
    /// holder taking [`LeaseCommit::WithNextCommit`] makes a flushed commit on the
    /// lock's connection (or `make_durable`) before any effect outside the database.
    pub(crate) async fn lock_workspace_with(
        &self,
        id: Uuid,
        shared: bool,
        commit: LeaseCommit,
    ) -> Result<(WorkspaceRow, AdvisoryLock), CommandError> {
        let (ws, lock, _) = self
            .lock_workspace_checked(id, shared, commit, None)
            .await?;
        Ok((ws, lock))
    }

    /// [`Self::lock_workspace_with`] (exclusive) for a command that runs without a
    /// ledger row until it records: also whether `command_id` is in the ledger already,
    /// from the same statement (see `AdvisoryLock::acquire_workspace_for`).
    pub(crate) async fn lock_workspace_for(
        &self,
        id: Uuid,
        commit: LeaseCommit,
        command_id: Uuid,
    ) -> Result<(WorkspaceRow, AdvisoryLock, bool), CommandError> {
        self.lock_workspace_checked(id, false, commit, Some(command_id))
            .await
    }

    async fn lock_workspace_checked(
        &self,
        id: Uuid,
        shared: bool,
        commit: LeaseCommit,
        command_id: Option<Uuid>,
    ) -> Result<(WorkspaceRow, AdvisoryLock, bool), CommandError> {
        let (ws, lock, known) = self
            .lock_workspace_any_with(id, shared, commit, command_id)
            .await?;
        if !ws.state.has_files() {
            lock.release().await.ok();
            return Err(evicted(id));
        }
        Ok((ws, lock, known))
    }

    /// [`Self::lock_workspace`] that also accepts an evicted workspace (for destroy).
    pub(crate) async fn lock_workspace_any(
        &self,
        id: Uuid,
        shared: bool,
    ) -> Result<(WorkspaceRow, AdvisoryLock), CommandError> {
        let (ws, lock, _) = self
            .lock_workspace_any_with(id, shared, LeaseCommit::Flushed, None)
            .await?;
        Ok((ws, lock))
    }

    async fn lock_workspace_any_with(
        &self,
        id: Uuid,
        shared: bool,
        commit: LeaseCommit,
        command_id: Option<Uuid>,
    ) -> Result<(WorkspaceRow, AdvisoryLock, bool), CommandError> {
        // The lock and the row in one statement, on the lock's connection.
        let timeout = self.config.lock_timeout;
        let taken = match command_id {
            Some(command_id) => {
                AdvisoryLock::acquire_workspace_for(&self.pool, id, timeout, commit, command_id)
                    .await
            }
            None => AdvisoryLock::acquire_workspace_with(&self.pool, id, shared, timeout, commit)
                .await
                .map(|(lock, ws)| (lock, ws, false)),
        };
        let (mut lock, ws, known) = taken.map_err(store_error)?;
        // Recovering an interrupted merge-back is an effect on the workspace's files:
        // its lease must be on disk first.
        if ws.is_some() && self.journal_path(id).exists() {
            if let Err(e) = lock.make_durable().await {
                lock.release().await.ok();
                return Err(store_error(e));
            }
        }
        match ws {
            Some(ws) => match self.recover_merge_back(&ws).await {
                Ok(()) => Ok((ws, lock, known)),
                Err(e) => {
                    lock.release().await.ok();
                    Err(e)
                }
            },
            None => {
                lock.release().await.ok();
                Err(CommandError::new(
                    ErrorKind::NotFound,
                    format!("workspace {id} not found"),
                ))
            }
        }
    }

    /// The remote provider holding workspaces under `name`, as configured here.
    fn remote_provider(&self, name: &str) -> Result<Arc<dyn RuntimeProvider>, CommandError> {
        let provider = self.runtimes.get(name).ok_or_else(|| {
            CommandError::new(
                ErrorKind::Unavailable,
                format!(
                    "runtime {name:?} is not configured on this worker (configured: {})",
                    self.runtimes.kinds().join(", ")
                ),
            )
        })?;
        if provider.workspaces().is_none() {
            return Err(CommandError::new(
                ErrorKind::Rejected,
                format!("runtime {name} cannot hold workspaces"),
            ));
        }
        Ok(provider)
    }

    /// The lock over the sandbox of (provider, user, project): held while a workspace
    /// is made in it or removed from it, so one sandbox is created per pair and the
    /// last destroy deletes it without racing an acquire.
    async fn lock_sandbox(
        &self,
        provider: &str,
        user: &str,
        project: &str,
    ) -> Result<AdvisoryLock, CommandError> {
        self.lock(
            LockScope::SandboxPlacement,
            &format!("{provider}\u{0}{user}\u{0}{project}"),
            false,
        )
        .await
    }
}

/// Refuses an operation that needs the workspace's files on this host when the
/// workspace lives inside a remote provider (ADR 15: exec is the way in for now).
pub(crate) fn host_only(ws: &WorkspaceRow, what: &str) -> Result<(), CommandError> {
    if Placement::of_node(&ws.node).is_remote() {
        return Err(not_yet(ws, what));
    }
    Ok(())
}

fn not_yet(ws: &WorkspaceRow, what: &str) -> CommandError {
    CommandError::new(
        ErrorKind::Rejected,
        format!(
            "{what} is not available on a {0} workspace yet (workspace {1} lives inside the {0} sandbox; run commands in it with exec --runtime {0})",
            ws.node, ws.id
        ),
    )
}
