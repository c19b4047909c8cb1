//! Locks shared across every worker: repo cache creation, workspace creation, and
//! commands on a workspace (shared for reads, exclusive for writes).
//!
//! A lock is a session-level advisory lock on one pooled connection (Postgres queues the
//! waiters) plus a lease (`grove.lock_leases`) that outlives that connection (ADR 21).
//! The connection is idle (not in a transaction) while git or a command runs, so it
//! stalls neither vacuum nor readers. A task renews the lease every third of its length;
//! if it cannot before a local deadline that falls a margin before the lease's expiry,
//! the lock reports itself lost ([`AdvisoryLock::fence_lost`]) and its holder stops the
//! effect, so no other holder can start while it still runs. Writes made under the lock
//! check that its lease is still this holder's ([`AdvisoryLock::fence`]).

use std::sync::OnceLock;
use std::time::Duration;

use grove_core::model::WorkspaceRow;
use sha2::{Digest, Sha256};
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres, Row};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;
use uuid::Uuid;

use crate::{rows, trusted, StoreError};

/// What a lock protects; part of the key so namespaces never collide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockScope {
    /// Creation of the repo cache of one normalized identity on one node.
    RepoCache,
    /// Creation of the workspace of one uniqueness key.
    WorkspaceKey,
    /// Commands (and lifecycle changes) on one workspace.
    WorkspaceCommands,
    /// The eviction sweep of one node: one at a time per node.
    NodeSweep,
    /// The sandbox of one (provider, user, project) holding remote workspaces: its
    /// creation, a clone into it, and its deletion with the last workspace (ADR 15).
    SandboxPlacement,
}

impl LockScope {
    fn tag(self) -> &'static str {
        match self {
            Self::RepoCache => "repo_cache",
            Self::WorkspaceKey => "workspace_key",
            Self::WorkspaceCommands => "workspace_commands",
            Self::NodeSweep => "node_sweep",
            Self::SandboxPlacement => "sandbox_placement",
        }
    }
}

/// The 64-bit advisory lock key of a scope and value.
pub fn lock_key(scope: LockScope, value: &str) -> i64 {
    let mut h = Sha256::new();
    h.update(scope.tag().as_bytes());
    h.update([0u8]);
    h.update(value.as_bytes());
    let d = h.finalize();
    i64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

/// The lease length when `GROVE_LOCK_LEASE_MS` is unset.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// How long a lock's lease lasts: `GROVE_LOCK_LEASE_MS` (at least 1000), else 10 s.
/// Read once per process.
pub fn lease_length() -> Duration {
    static LEASE: OnceLock<Duration> = OnceLock::new();
    *LEASE.get_or_init(|| {
        std::env::var("GROVE_LOCK_LEASE_MS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|ms| Duration::from_millis(ms.max(1000)))
            .unwrap_or(DEFAULT_LEASE)
    })
}

/// How long before the lease's expiry a holder that could not renew gives up: a
/// quarter of the lease, the time its effect has to stop.
pub fn lease_margin(lease: Duration) -> Duration {
    lease / 4
}

/// A lock's fencing identity: one acquisition of one key. Writes made under the lock
/// check that it still holds the lease (the functions that record an outcome, and
/// [`crate::store::end_fences`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub key: i64,
    pub holder: Uuid,
}

/// When the commit that takes a lock's lease reaches disk (ADR 33).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseCommit {
    /// Before the lock is reported taken (a synchronous commit, ADR 21): for holders
    /// whose effect may start at once.
    Flushed,
    /// With the holder's next flushed commit: the WAL is flushed in order, so any later
    /// synchronous commit makes the lease durable too (the WAL writer flushes it within
    /// a few hundred milliseconds anyway). The holder makes a flushed commit on the
    /// lock's connection, or calls [`AdvisoryLock::make_durable`], before any effect
    /// outside the database: if the database dies before that commit, the lock's
    /// connection dies with it, the commit fails and the effect never starts.
    WithNextCommit,
}

/// The lease of a held lock and the task that renews it.
struct Lease {
    lost: watch::Receiver<bool>,
    renewer: tokio::task::JoinHandle<()>,
}

/// A held lock: the advisory lock and its lease. Release it with
/// [`AdvisoryLock::release`]; dropping it closes the connection instead, which frees the
/// advisory lock, and removes the lease in the background.
pub struct AdvisoryLock {
    conn: Option<PoolConnection<Postgres>>,
    pool: PgPool,
    fence: Fence,
    shared: bool,
    /// Whether the statement that takes the lease succeeded (so a row may exist even
    /// when renewing it never started).
    taken: bool,
    /// Whether the lease is known to be on disk (its own synchronous commit, or a
    /// synchronous renewal since); see [`LeaseCommit`].
    flushed: bool,
    lease: Option<Lease>,
    /// The workspace row read with a workspace lock, and the rows its holder wrote
    /// since, at their versions (ADR 36): what the holder's next append folds onto.
    held: crate::folded::HeldRows,
    /// Whether a recorded outcome deleted the lease in its own transaction (ADR 39):
    /// the release then only frees the advisory lock.
    ended: bool,
}

pub(crate) fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis().max(1)).unwrap_or(i32::MAX)
}

/// The trace span of one lock wait (ADR 30).
pub(crate) fn lock_span(scope: LockScope, shared: bool) -> tracing::Span {
    tracing::trace_span!(target: crate::trace_context::TARGET, "grove.lock", scope = scope.tag(), shared)
}

/// Records how long a lock statement waited, and whether it got the lock.
pub(crate) fn waited<T>(scope: LockScope, taken: &Result<T, sqlx::Error>, started: Instant) {
    let outcome = match taken {
        Ok(_) => "acquired",
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03") => "busy",
        Err(_) => "error",
    };
    crate::telemetry::lock_waited(scope.tag(), outcome, started.elapsed());
}

pub(crate) fn busy(e: sqlx::Error, scope: LockScope, timeout: Duration) -> StoreError {
    match StoreError::from(e) {
        StoreError::Locked(_) => StoreError::Locked(format!(
            "{} is busy (waited {} ms)",
            scope.tag(),
            timeout.as_millis()
        )),
        other => other,
    }
}

impl AdvisoryLock {
    /// A guard that owns a fresh pool connection: from here an early return closes that
    /// connection (Drop), so a lock taken just as the wait timed out cannot stay behind.
    async fn checkout(pool: &PgPool, key: i64, shared: bool) -> Result<Self, StoreError> {
        let conn = pool.acquire().await?;
        Ok(Self {
            conn: Some(conn),
            pool: pool.clone(),
            fence: Fence {
                key,
                holder: Uuid::new_v4(),
            },
            shared,
            taken: false,
            flushed: true,
            lease: None,
            held: Default::default(),
            ended: false,
        })
    }

    /// Waits up to `timeout` for the lock and its lease; [`StoreError::Locked`] when it
    /// stays taken.
    pub async fn acquire(
        pool: &PgPool,
        scope: LockScope,
        value: &str,
        shared: bool,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        Self::acquire_with(pool, scope, value, shared, timeout, LeaseCommit::Flushed).await
    }

    /// [`Self::acquire`] with the lease's commit flushed as `commit` says.
    pub async fn acquire_with(
        pool: &PgPool,
        scope: LockScope,
        value: &str,
        shared: bool,
        timeout: Duration,
        commit: LeaseCommit,
    ) -> Result<Self, StoreError> {
        let key = lock_key(scope, value);
        let mut guard = Self::checkout(pool, key, shared).await?;
        let started = Instant::now();
        let flush = commit == LeaseCommit::Flushed;
        let taken = sqlx::query("SELECT grove.lock_leased($1, $2, $3, $4, $5, $6)")
            .bind(key)
            .bind(shared)
            .bind(millis(timeout))
            .bind(guard.fence.holder)
            .bind(millis(lease_length()))
            .bind(flush)
            .execute(guard.conn())
            .instrument(lock_span(scope, shared))
            .await;
        waited(scope, &taken, started);
        taken.map_err(|e| busy(e, scope, timeout))?;
        guard.taken = true;
        guard.flushed = flush;
        guard.keep_lease(started).await?;
        Ok(guard)
    }

    /// Takes the command lock of workspace `id` (as [`Self::acquire`] with
    /// [`LockScope::WorkspaceCommands`]) and reads the workspace's row once it is held,
    /// in one statement (`grove.lock_workspace_leased`). The row is `None` when the
    /// workspace is gone; the lock is held either way.
    pub async fn acquire_workspace(
        pool: &PgPool,
        id: Uuid,
        shared: bool,
        timeout: Duration,
    ) -> Result<(Self, Option<WorkspaceRow>), StoreError> {
        Self::acquire_workspace_with(pool, id, shared, timeout, LeaseCommit::Flushed).await
    }

    /// [`Self::acquire_workspace`] with the lease's commit flushed as `commit` says.
    pub async fn acquire_workspace_with(
        pool: &PgPool,
        id: Uuid,
        shared: bool,
        timeout: Duration,
        commit: LeaseCommit,
    ) -> Result<(Self, Option<WorkspaceRow>), StoreError> {
        let (lock, ws, _) =
            Self::acquire_workspace_inner(pool, id, shared, timeout, commit, None).await?;
        Ok((lock, ws))
    }

    /// [`Self::acquire_workspace_with`] (exclusive) for a command that may be in the
    /// ledger already: also whether `command_id` is, read in the same statement. Read
    /// with the statement's snapshot, taken before the lock: a command recorded while
    /// this one waited for the lock reads as unknown (its caller then finds it taken
    /// when it records, as for any duplicate that raced it).
    pub async fn acquire_workspace_for(
        pool: &PgPool,
        id: Uuid,
        timeout: Duration,
        commit: LeaseCommit,
        command_id: Uuid,
    ) -> Result<(Self, Option<WorkspaceRow>, bool), StoreError> {
        Self::acquire_workspace_inner(pool, id, false, timeout, commit, Some(command_id)).await
    }

    async fn acquire_workspace_inner(
        pool: &PgPool,
        id: Uuid,
        shared: bool,
        timeout: Duration,
        commit: LeaseCommit,
        command_id: Option<Uuid>,
    ) -> Result<(Self, Option<WorkspaceRow>, bool), StoreError> {
        let scope = LockScope::WorkspaceCommands;
        let key = lock_key(scope, &id.to_string());
        let mut guard = Self::checkout(pool, key, shared).await?;
        let started = Instant::now();
        let flush = commit == LeaseCommit::Flushed;
        // The row's version (xmin) is read with the statement's snapshot, taken before
        // the lock: never newer than the row, so at worst an append folded onto it finds
        // it stale and appends the usual way.
        let row = sqlx::query(
            "SELECT w.*, (SELECT x.xmin::text FROM grove.sandbox_workspaces x WHERE x.id = w.id) AS row_xmin,
                    $8::uuid IS NOT NULL
                        AND EXISTS (SELECT 1 FROM grove.commands c WHERE c.command_id = $8) AS known
               FROM grove.lock_workspace_leased($1, $2, $3, $4, $5, $6, $7) w",
        )
                .bind(key)
                .bind(shared)
                .bind(millis(timeout))
                .bind(id)
                .bind(guard.fence.holder)
                .bind(millis(lease_length()))
                .bind(flush)
                .bind(command_id)
                .fetch_optional(guard.conn())
                .instrument(lock_span(scope, shared))
                .await;
        waited(scope, &row, started);
        let row = row.map_err(|e| busy(e, scope, timeout))?;
        guard.taken = true;
        guard.flushed = flush;
        let ws = row.as_ref().map(rows::workspace_from_row).transpose()?;
        if let (Some(r), Some(ws)) = (&row, &ws) {
            let version: Option<String> = r.try_get("row_xmin")?;
            if let Some(version) = version {
                guard.held = crate::folded::HeldRows::workspace(ws.clone(), version);
            }
        }
        let known = match &row {
            Some(r) => r.try_get("known")?,
            None => false,
        };
        guard.keep_lease(started).await?;
        Ok((guard, ws, known))
    }

    /// Starts renewing the lease just taken. Its expiry was set by the database at some
    /// moment after `started`, so `started + lease - margin` falls at least the margin
    /// before it. A long wait for the lock would leave little of that: then the lease is
    /// renewed once first, from a fresh start.
    async fn keep_lease(&mut self, started: Instant) -> Result<(), StoreError> {
        let lease = lease_length();
        let mut since = started;
        if started.elapsed() > lease_margin(lease) / 2 {
            since = Instant::now();
            let fence = self.fence;
            if !renew(self.conn(), fence, lease).await? {
                return Err(StoreError::Locked(
                    "the lock's lease lapsed as it was taken".into(),
                ));
            }
            self.flushed = true;
        }
        let (tx, rx) = watch::channel(false);
        let deadline = since + lease - lease_margin(lease);
        let renewer = tokio::spawn(renew_until_lost(
            self.pool.clone(),
            self.fence,
            lease,
            deadline,
            tx,
        ));
        self.lease = Some(Lease { lost: rx, renewer });
        Ok(())
    }

    /// Makes a lease taken with [`LeaseCommit::WithNextCommit`] durable now (a
    /// synchronous renewal, one flushed commit), for a holder about to act outside the
    /// database before any flushed commit of its own. Nothing to do for a flushed lease.
    pub async fn make_durable(&mut self) -> Result<(), StoreError> {
        if self.flushed {
            return Ok(());
        }
        let fence = self.fence;
        if !renew(self.conn(), fence, lease_length()).await? {
            return Err(StoreError::Fenced("the lock's lease is gone".into()));
        }
        self.flushed = true;
        Ok(())
    }

    /// Records that a synchronous commit on this lock's connection made the lease
    /// durable with it (see [`LeaseCommit::WithNextCommit`]).
    pub fn flushed_by_commit(&mut self) {
        self.flushed = true;
    }

    /// This lock's fencing identity, for the writes made under it.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// Whether the lease is lost (could not be renewed in time, or was taken over).
    pub fn is_lost(&self) -> bool {
        self.lease.as_ref().is_some_and(|l| *l.lost.borrow())
    }

    /// Resolves once the lease is lost: the holder must stop its effect at once (it has
    /// the margin, a quarter of the lease, before another holder may start). Never
    /// resolves while the lease is kept.
    pub fn fence_lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let rx = self.lease.as_ref().map(|l| l.lost.clone());
        async move {
            let Some(mut rx) = rx else {
                return std::future::pending().await;
            };
            loop {
                if *rx.borrow_and_update() {
                    return;
                }
                if rx.changed().await.is_err() {
                    if *rx.borrow() {
                        return;
                    }
                    return std::future::pending().await;
                }
            }
        }
    }

    /// The connection that holds the lock, for reads and writes made while holding it
    /// (no second pool checkout). It must be left outside a transaction.
    pub fn conn(&mut self) -> &mut PgConnection {
        self.conn
            .as_deref_mut()
            .expect("a held lock has its connection")
    }

    /// The rows this lock's holder holds (ADR 36), to fold its next append onto.
    pub fn held_rows(&self) -> &crate::folded::HeldRows {
        &self.held
    }

    /// Holds `rows`, read under this lock at their versions, in place of any held.
    pub fn hold(&mut self, rows: crate::folded::HeldRows) {
        self.held = rows;
    }

    /// Holds the runtime `id` with the workspace (see [`crate::folded::HeldRows::hold_runtime`]).
    pub fn hold_runtime(&mut self, id: Uuid, row: Option<(grove_core::model::RuntimeRow, String)>) {
        self.held.hold_runtime(id, row);
    }

    /// Takes in what an append folded onto [`Self::held_rows`] wrote.
    pub fn absorb(&mut self, folded: crate::folded::FoldedAppend, version: String) {
        self.held.absorb(folded, version);
    }

    /// Forgets the held rows (an append the usual way changed them).
    pub fn forget_rows(&mut self) {
        self.held = Default::default();
    }

    /// Records that an outcome committed under this lock deleted its lease (ADR 39,
    /// `queue::finish_fenced`): renewing stops, and the release frees only the advisory
    /// lock. Call it only once that commit succeeded; the lock stays held until it is
    /// released (or dropped: its session closes).
    pub fn lease_ended(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease.renewer.abort();
        }
        self.taken = false;
        self.ended = true;
    }

    /// Frees the lock and returns the connection to the pool.
    pub async fn release(self) -> Result<(), StoreError> {
        self.release_inner(None).await
    }

    /// Frees the lock and, in the same round trip, announces that `command_id`'s outcome
    /// is recorded (`NOTIFY grove_command_done`; see `queue::announce`), and wakes the
    /// log's followers when it `appended` events. Only after the outcome committed.
    pub async fn release_announcing(
        self,
        command_id: Uuid,
        appended: bool,
    ) -> Result<(), StoreError> {
        self.release_inner(Some((command_id, appended))).await
    }

    /// [`Self::release_announcing`] in a task of its own, for a holder that answers its
    /// caller as soon as its outcome is committed: the caller does not wait for the
    /// unlock's round trip; a command of the same lock taken meanwhile waits for the
    /// unlock as for any holder. A task dropped before it ran (its runtime shutting
    /// down) drops the lock: its session closes and its lease expires by itself.
    pub fn release_announcing_soon(self, command_id: Uuid, appended: bool) {
        self.release_soon_inner(Some((command_id, appended)));
    }

    /// [`Self::release`] in a task of its own (see [`Self::release_announcing_soon`]).
    pub fn release_soon(self) {
        self.release_soon_inner(None);
    }

    fn release_soon_inner(self, announce: Option<(Uuid, bool)>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            if let Err(e) = self.release_inner(announce).await {
                tracing::debug!(error = %e, "releasing a lock after its answer failed");
            }
        });
    }

    async fn release_inner(mut self, announce: Option<(Uuid, bool)>) -> Result<(), StoreError> {
        let Some(mut conn) = self.conn.take() else {
            return Ok(());
        };
        let lease = self.lease.take();
        if let Some(lease) = &lease {
            lease.renewer.abort();
        }
        if self.ended {
            return self.unlock_only(conn, announce).await;
        }
        let function = if self.shared {
            "pg_advisory_unlock_shared"
        } else {
            "pg_advisory_unlock"
        };
        // One round trip, as in `acquire`. A UUID's text form is hex digits and dashes.
        let announce = announce
            .map(|(id, appended)| {
                let events = if appended {
                    format!("SELECT pg_notify('{}', ''); ", crate::store::EVENTS_CHANNEL)
                } else {
                    String::new()
                };
                format!(
                    "SELECT pg_notify('{}', '{id}'); {events}",
                    crate::queue::DONE_CHANNEL
                )
            })
            .unwrap_or_default();
        // The lease's removal commits before the advisory lock is freed, so the next
        // holder, woken by the unlock, finds no lease in its way. That commit need not
        // wait for its WAL flush: lost in a crash, the lease only lingers until it
        // expires, and any later synchronous commit (the next holder's lease) flushes it.
        let Fence { key, holder } = self.fence;
        let sql = trusted(format!(
            "BEGIN; SET LOCAL synchronous_commit = off; \
             DELETE FROM grove.lock_leases WHERE key = {key} AND holder = '{holder}'; COMMIT; \
             {announce}SELECT {function}({key}); RESET lock_timeout"
        ));
        let unlocked = sqlx::raw_sql(sql)
            .execute(&mut *conn)
            .await
            .map(|_| ())
            .map_err(StoreError::from);
        // Released here, one way or the other: Drop has nothing left to do.
        self.taken = false;
        match unlocked {
            // Unlocked cleanly: dropping the pooled connection returns it to the pool.
            Ok(()) => Ok(()),
            Err(e) => {
                // The lock may still be held: close the session rather than pool it,
                // and remove the lease through another connection.
                drop(conn.detach());
                forget_lease(&self.pool, self.fence);
                Err(e)
            }
        }
    }
}

impl AdvisoryLock {
    /// The release of a lock whose lease its outcome ended (ADR 39): one prepared
    /// statement frees the advisory lock and sends the announcements, which Postgres
    /// delivers when that statement commits.
    async fn unlock_only(
        mut self,
        mut conn: PoolConnection<Postgres>,
        announce: Option<(Uuid, bool)>,
    ) -> Result<(), StoreError> {
        self.ended = false;
        let sql = match (self.shared, announce) {
            (false, None) => "SELECT pg_advisory_unlock($1)",
            (true, None) => "SELECT pg_advisory_unlock_shared($1)",
            (false, Some((_, false))) => "SELECT pg_notify($2, $3), pg_advisory_unlock($1)",
            (true, Some((_, false))) => "SELECT pg_notify($2, $3), pg_advisory_unlock_shared($1)",
            (false, Some((_, true))) => {
                "SELECT pg_notify($2, $3), pg_notify($4, ''), pg_advisory_unlock($1)"
            }
            (true, Some((_, true))) => {
                "SELECT pg_notify($2, $3), pg_notify($4, ''), pg_advisory_unlock_shared($1)"
            }
        };
        let mut query = sqlx::query(sql).bind(self.fence.key);
        if let Some((id, appended)) = announce {
            query = query.bind(crate::queue::DONE_CHANNEL).bind(id.to_string());
            if appended {
                query = query.bind(crate::store::EVENTS_CHANNEL);
            }
        }
        match query.execute(&mut *conn).await {
            Ok(_) => Ok(()),
            Err(e) => {
                // The lock may still be held: close the session rather than pool it.
                drop(conn.detach());
                Err(e.into())
            }
        }
    }
}

impl Drop for AdvisoryLock {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // Not released: close the session so Postgres frees the lock with it.
            drop(conn.detach());
        }
        if let Some(lease) = self.lease.take() {
            lease.renewer.abort();
        }
        if std::mem::take(&mut self.taken) {
            forget_lease(&self.pool, self.fence);
        }
    }
}

/// Removes a lease in the background (best effort: if the database is away, the lease
/// expires by itself).
fn forget_lease(pool: &PgPool, fence: Fence) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let pool = pool.clone();
    handle.spawn(async move {
        let _ = sqlx::query("DELETE FROM grove.lock_leases WHERE key = $1 AND holder = $2")
            .bind(fence.key)
            .bind(fence.holder)
            .execute(&pool)
            .await;
    });
}

/// Extends the lease by `lease` from now; `false` when it is gone or expired.
async fn renew(conn: &mut PgConnection, fence: Fence, lease: Duration) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar("SELECT grove.lease_renew($1, $2, $3)")
        .bind(fence.key)
        .bind(fence.holder)
        .bind(millis(lease))
        .fetch_one(conn)
        .await?)
}

/// Renews the lease every third of its length (every quarter second while the database
/// does not answer) until a renewal reports it gone or `deadline` passes without one;
/// then reports it lost. Each successful renewal moves the deadline to its own start
/// plus the lease minus the margin: the database set the new expiry after that start.
async fn renew_until_lost(
    pool: PgPool,
    fence: Fence,
    lease: Duration,
    mut deadline: Instant,
    lost: watch::Sender<bool>,
) {
    let every = lease / 3;
    let mut next = Instant::now() + every;
    loop {
        tokio::time::sleep_until(next.min(deadline)).await;
        if Instant::now() >= deadline {
            break;
        }
        let started = Instant::now();
        let attempt = async {
            let mut conn = pool.acquire().await?;
            renew(&mut conn, fence, lease).await
        };
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Ok(true)) => {
                deadline = started + lease - lease_margin(lease);
                next = started + every;
            }
            Ok(Ok(false)) => {
                tracing::warn!(
                    key = fence.key,
                    "a lock's lease was lost: stopping its holder"
                );
                let _ = lost.send(true);
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(key = fence.key, error = %e, "renewing a lock's lease failed; retrying");
                next = Instant::now() + Duration::from_millis(250);
            }
            Err(_) => break,
        }
    }
    tracing::warn!(
        key = fence.key,
        "a lock's lease could not be renewed before its deadline (database unreachable): stopping its holder"
    );
    let _ = lost.send(true);
}
