//! Advisory locks shared across every worker: repo cache creation, workspace creation,
//! and commands on a workspace (shared for reads, exclusive for writes).
//!
//! A lock lives on one pooled connection for the length of an effect. That connection is
//! idle (not in a transaction) while git or a command runs, so it stalls neither vacuum
//! nor readers; if the worker dies, the connection drops and Postgres frees the lock.

use std::time::Duration;

use grove_core::model::WorkspaceRow;
use sha2::{Digest, Sha256};
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};
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

/// A held advisory lock. Release it with [`AdvisoryLock::release`]; dropping it closes
/// the connection instead, which also frees the lock.
pub struct AdvisoryLock {
    conn: Option<PoolConnection<Postgres>>,
    key: i64,
    shared: bool,
}

impl AdvisoryLock {
    /// Waits up to `timeout` for the lock; [`StoreError::Locked`] when it stays taken.
    pub async fn acquire(
        pool: &PgPool,
        scope: LockScope,
        value: &str,
        shared: bool,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let key = lock_key(scope, value);
        let conn = pool.acquire().await?;
        // From here the guard owns the connection: on any early return its Drop detaches
        // and closes it, so a lock taken just as the wait timed out cannot stay behind.
        let mut guard = Self {
            conn: Some(conn),
            key,
            shared,
        };
        let conn = guard.conn.as_mut().expect("connection present");
        // One round trip: both statements in one simple-protocol message. Only numbers
        // this function computed are formatted in.
        let function = if shared {
            "pg_advisory_lock_shared"
        } else {
            "pg_advisory_lock"
        };
        let sql = trusted(format!(
            "SET lock_timeout = {}; SELECT {function}({key})",
            timeout.as_millis().max(1)
        ));
        match sqlx::raw_sql(sql).execute(&mut **conn).await {
            Ok(_) => Ok(guard),
            Err(e) => match StoreError::from(e) {
                StoreError::Locked(_) => Err(StoreError::Locked(format!(
                    "{} is busy (waited {} ms)",
                    scope.tag(),
                    timeout.as_millis()
                ))),
                other => Err(other),
            },
        }
    }

    /// Takes the command lock of workspace `id` (as [`Self::acquire`] with
    /// [`LockScope::WorkspaceCommands`]) and reads the workspace's row once it is held,
    /// in one statement (`grove.lock_workspace`). The row is `None` when the workspace
    /// is gone; the lock is held either way.
    pub async fn acquire_workspace(
        pool: &PgPool,
        id: Uuid,
        shared: bool,
        timeout: Duration,
    ) -> Result<(Self, Option<WorkspaceRow>), StoreError> {
        let scope = LockScope::WorkspaceCommands;
        let key = lock_key(scope, &id.to_string());
        let conn = pool.acquire().await?;
        // As in `acquire`: from here an early return closes the connection.
        let mut guard = Self {
            conn: Some(conn),
            key,
            shared,
        };
        let conn = guard.conn.as_mut().expect("connection present");
        let row = sqlx::query("SELECT * FROM grove.lock_workspace($1, $2, $3, $4)")
            .bind(key)
            .bind(shared)
            .bind(i32::try_from(timeout.as_millis().max(1)).unwrap_or(i32::MAX))
            .bind(id)
            .fetch_optional(&mut **conn)
            .await;
        match row {
            Ok(row) => {
                let row = row.as_ref().map(rows::workspace_from_row).transpose()?;
                Ok((guard, row))
            }
            Err(e) => match StoreError::from(e) {
                StoreError::Locked(_) => Err(StoreError::Locked(format!(
                    "{} is busy (waited {} ms)",
                    scope.tag(),
                    timeout.as_millis()
                ))),
                other => Err(other),
            },
        }
    }

    /// The connection that holds the lock, for reads and writes made while holding it
    /// (no second pool checkout). It must be left outside a transaction.
    pub fn conn(&mut self) -> &mut PgConnection {
        self.conn
            .as_deref_mut()
            .expect("a held lock has its connection")
    }

    /// Frees the lock and returns the connection to the pool.
    pub async fn release(self) -> Result<(), StoreError> {
        self.release_inner(None).await
    }

    /// Frees the lock and, in the same round trip, announces that `command_id`'s outcome
    /// is recorded (`NOTIFY grove_command_done`; see `queue::announce`). Only after the
    /// outcome committed.
    pub async fn release_announcing(self, command_id: Uuid) -> Result<(), StoreError> {
        self.release_inner(Some(command_id)).await
    }

    async fn release_inner(mut self, announce: Option<Uuid>) -> Result<(), StoreError> {
        let Some(mut conn) = self.conn.take() else {
            return Ok(());
        };
        let function = if self.shared {
            "pg_advisory_unlock_shared"
        } else {
            "pg_advisory_unlock"
        };
        // One round trip, as in `acquire`. A UUID's text form is hex digits and dashes.
        let announce = announce
            .map(|id| {
                format!(
                    "SELECT pg_notify('{}', '{id}'); ",
                    crate::queue::DONE_CHANNEL
                )
            })
            .unwrap_or_default();
        let sql = trusted(format!(
            "{announce}SELECT {function}({}); RESET lock_timeout",
            self.key
        ));
        let unlocked = sqlx::raw_sql(sql)
            .execute(&mut *conn)
            .await
            .map(|_| ())
            .map_err(StoreError::from);
        match unlocked {
            // Unlocked cleanly: dropping the pooled connection returns it to the pool.
            Ok(()) => Ok(()),
            Err(e) => {
                // The lock may still be held: close the session rather than pool it.
                drop(conn.detach());
                Err(e)
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
    }
}
