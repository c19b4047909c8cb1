//! The shared context of every job: the ports and settings ([`JobContext`]), what a
//! handler returns ([`Handled`]), locks and rows, the fold of events into rows, and
//! recording events.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use grove_core::commands::CommandResult;
use grove_core::error::{CommandError, ErrorKind};
use grove_core::events::{Correlation, Event, Metadata};
use grove_core::layout::Layout;
use grove_core::model::{to_db_precision, RepoCacheRow, WorkspaceRow};
use grove_core::ports::{GitPort, RuntimeRegistry};
use grove_core::projection::Projections;
use grove_postgres::locks::{AdvisoryLock, LeaseCommit, LockScope};
use grove_postgres::{rows, store, StoreError};
use sqlx::PgPool;
use uuid::Uuid;

use crate::config::WorkerConfig;

/// What a handler produced: the caller's result, the events to commit with it, and the
/// locks to release only after that commit.
pub struct Handled {
    /// The caller's result, or the failure to record (with `events`) for a command that
    /// failed after changing state, such as an exec the runtime rejected once started.
    pub result: Result<CommandResult, CommandError>,
    pub events: Vec<Event>,
    pub locks: Vec<AdvisoryLock>,
    pub correlation: Correlation,
}

/// The cheap case of a warm acquire or an ensure (ADR 34, ADR 40).
pub enum Reuse {
    /// A use recorded recently enough (ADR 40): the answer is the row as it stands,
    /// with nothing recorded and no lock held, if none of `locks` (advisory lock keys:
    /// those a destroy or an eviction of it holds) is held exclusively right now.
    Recent {
        result: CommandResult,
        locks: Vec<i64>,
    },
    /// A use to record: the handler's events and answer, under its lock (ADR 34).
    Record(Handled),
}

/// The ports and settings every handler uses.
pub struct JobContext {
    pub pool: PgPool,
    pub config: WorkerConfig,
    pub layout: Layout,
    pub git: Arc<dyn GitPort>,
    pub runtimes: RuntimeRegistry,
    /// The git platform for pull requests (`None`: not configured; those jobs fail as
    /// `unavailable`).
    pub platform: Option<Arc<dyn grove_core::platform::GitPlatformProvider>>,
    /// Jobs this worker is running now (so its own stale-lock sweep leaves them alone).
    pub inflight: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// Token fingerprints under the deployment's secret, loaded on first use.
    pub fingerprint: tokio::sync::OnceCell<grove_core::fingerprint::Fingerprinter>,
}

/// A job kept in the worker's in-flight set while the guard lives: for a command run
/// inline (ADR 31), whose job no claim loop tracks. The worker's sweep of its own stale
/// jobs leaves it alone meanwhile; a process that dies leaves it to orphan recovery.
pub struct InFlight {
    set: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    job_id: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut set) = self.set.lock() {
            set.remove(&self.job_id);
        }
    }
}

impl JobContext {
    /// Puts `job_id` in the in-flight set until the returned guard drops.
    pub fn in_flight(&self, job_id: &str) -> InFlight {
        self.inflight
            .lock()
            .expect("inflight set")
            .insert(job_id.to_string());
        InFlight {
            set: self.inflight.clone(),
            job_id: job_id.to_string(),
        }
    }
}

/// Converts a store failure into the command-level error (transient: worth a retry).
pub fn store_error(e: StoreError) -> CommandError {
    match e {
        StoreError::Locked(m) => CommandError::new(ErrorKind::Conflict, m),
        StoreError::NotFound(m) => CommandError::new(ErrorKind::NotFound, m),
        StoreError::Conflict(m) => CommandError::new(ErrorKind::Conflict, m).transient(),
        other => {
            CommandError::new(ErrorKind::Unavailable, format!("database: {other}")).transient()
        }
    }
}

pub(crate) fn internal(msg: impl std::fmt::Display) -> CommandError {
    CommandError::new(ErrorKind::Internal, msg.to_string())
}

/// Runs a blocking git call off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, grove_core::error::GitError> + Send + 'static,
) -> Result<T, CommandError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| internal(format!("git task failed: {e}")))?
        .map_err(CommandError::from)
}

/// Now, at the precision Postgres stores (so replayed rows compare equal).
pub fn now() -> DateTime<Utc> {
    to_db_precision(Utc::now())
}

impl JobContext {
    pub(crate) async fn lock(
        &self,
        scope: LockScope,
        value: &str,
        shared: bool,
    ) -> Result<AdvisoryLock, CommandError> {
        self.lock_with(scope, value, shared, LeaseCommit::Flushed)
            .await
    }

    /// [`Self::lock`] with the lease's commit flushed as `commit` says: a holder taking
    /// [`LeaseCommit::WithNextCommit`] makes a flushed commit before any effect outside
    /// the database.
    pub(crate) async fn lock_with(
        &self,
        scope: LockScope,
        value: &str,
        shared: bool,
        commit: LeaseCommit,
    ) -> Result<AdvisoryLock, CommandError> {
        let timeout = self.config.lock_timeout;
        AdvisoryLock::acquire_with(&self.pool, scope, value, shared, timeout, commit)
            .await
            .map_err(store_error)
    }

    pub(crate) async fn conn(
        &self,
    ) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, CommandError> {
        self.pool.acquire().await.map_err(|e| store_error(e.into()))
    }

    pub(crate) async fn workspace(&self, id: Uuid) -> Result<WorkspaceRow, CommandError> {
        let mut conn = self.conn().await?;
        rows::workspace(&mut conn, id)
            .await
            .map_err(store_error)?
            .ok_or_else(|| {
                CommandError::new(ErrorKind::NotFound, format!("workspace {id} not found"))
            })
    }
}

impl JobContext {
    /// `workspace.dirty_changed` when git's answer now differs from the record (after a
    /// command that may have written). A failed check changes nothing.
    pub(crate) async fn dirty_change(&self, ws: &WorkspaceRow) -> Option<Event> {
        let git = self.git.clone();
        let dir = PathBuf::from(&ws.local_path);
        let dirty = blocking(move || git.is_dirty(&dir)).await.ok()?;
        (dirty != ws.dirty).then_some(Event::WorkspaceDirtyChanged {
            workspace_id: ws.id,
            dirty,
        })
    }
}

/// How long a sweep (or a start-up recovery) waits for a lock before skipping: it never
/// queues behind a command.
pub const TRY_LOCK: Duration = Duration::from_millis(500);

/// A lock taken without waiting long; `None` when another job holds it.
pub(crate) async fn try_lock(
    pool: &PgPool,
    scope: LockScope,
    value: &str,
    shared: bool,
) -> Result<Option<AdvisoryLock>, CommandError> {
    match AdvisoryLock::acquire(pool, scope, value, shared, TRY_LOCK).await {
        Ok(lock) => Ok(Some(lock)),
        Err(StoreError::Locked(_)) => Ok(None),
        Err(e) => Err(store_error(e)),
    }
}

pub(crate) async fn release_all(locks: Vec<AdvisoryLock>) {
    for lock in locks {
        let _ = lock.release().await;
    }
}

impl JobContext {
    pub(crate) fn home(&self) -> &Path {
        self.layout.root()
    }

    fn metadata_for(&self, command_id: Uuid, correlation: Correlation) -> Metadata {
        Metadata {
            command_id,
            correlation,
            worker_id: self.config.worker_id.clone(),
            node: self.config.node.clone(),
        }
    }

    /// Appends events in their own short transaction (a sweep commits as it goes).
    pub(crate) async fn record(
        &self,
        command_id: Uuid,
        correlation: Correlation,
        events: &[Event],
    ) -> Result<(), CommandError> {
        let md = self.metadata_for(command_id, correlation);
        let mut tx = self.pool.begin().await.map_err(|e| store_error(e.into()))?;
        store::append(&mut tx, events, &md, now())
            .await
            .map_err(store_error)?;
        tx.commit().await.map_err(|e| store_error(e.into()))?;
        store::announce_appended_soon(&self.pool);
        Ok(())
    }

    /// The key lock, then the command lock (the order acquire and destroy use), each
    /// without waiting long. `None` when either is held.
    pub(crate) async fn try_lock_workspace(
        &self,
        ws: &WorkspaceRow,
    ) -> Result<Option<Vec<AdvisoryLock>>, CommandError> {
        let Some(key) = try_lock(
            &self.pool,
            LockScope::WorkspaceKey,
            &ws.key().lock_string(),
            false,
        )
        .await?
        else {
            return Ok(None);
        };
        match try_lock(
            &self.pool,
            LockScope::WorkspaceCommands,
            &ws.id.to_string(),
            false,
        )
        .await
        {
            Ok(Some(cmd)) => Ok(Some(vec![cmd, key])),
            Ok(None) => {
                let _ = key.release().await;
                Ok(None)
            }
            Err(e) => {
                let _ = key.release().await;
                Err(e)
            }
        }
    }
}

/// The private saved-work store of a workspace: `$GROVE_HOME/saved/<user>/<id>/`.
pub fn store_path(home: &Path, ws: &WorkspaceRow) -> PathBuf {
    grove_core::layout::Layout::new(home).saved_dir(&ws.user_id, ws.id)
}

pub fn correlation_of(ws: &WorkspaceRow) -> Correlation {
    Correlation {
        user_id: Some(ws.user_id.clone()),
        project_id: Some(ws.project_id.clone()),
        conversation_id: ws.conversation_id.clone(),
        task_id: ws.task_id.clone(),
    }
}

/// `events` applied, at `at`, to projections seeded by `seed`.
fn fold(seed: impl FnOnce(&mut Projections), events: &[Event], at: DateTime<Utc>) -> Projections {
    let mut p = Projections::default();
    seed(&mut p);
    for e in events {
        p.apply(e, at);
    }
    p
}

/// The repo cache row `events` leave: the one they create, else `existing`.
pub(crate) fn fold_cache(
    existing: Option<RepoCacheRow>,
    events: &[Event],
    at: DateTime<Utc>,
) -> RepoCacheRow {
    let created = events.iter().rev().find_map(|e| match e {
        Event::RepoCacheCreated { repo_cache_id, .. } => Some(*repo_cache_id),
        _ => None,
    });
    let id = created.or(existing.as_ref().map(|r| r.id));
    let mut p = fold(
        |p| {
            if let Some(row) = existing {
                p.repo_caches.insert(row.id, row);
            }
        },
        events,
        at,
    );
    id.and_then(|id| p.repo_caches.remove(&id))
        .expect("a cache event always names the cache")
}

/// The workspace row `events` leave: the one they create, else `existing`.
pub(crate) fn fold_workspace(
    existing: Option<WorkspaceRow>,
    events: &[Event],
    at: DateTime<Utc>,
) -> Result<WorkspaceRow, CommandError> {
    let created = events.iter().rev().find_map(|e| match e {
        Event::WorkspaceCreated { workspace_id, .. } => Some(*workspace_id),
        _ => None,
    });
    let id = created.or(existing.as_ref().map(|r| r.id));
    let mut p = fold(
        |p| {
            if let Some(row) = existing {
                p.workspaces.insert(row.id, row);
            }
        },
        events,
        at,
    );
    id.and_then(|id| p.workspaces.remove(&id))
        .ok_or_else(|| internal("fold lost the row"))
}
