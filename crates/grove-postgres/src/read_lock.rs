//! A read's hold on a workspace's command lock (ADR 24): the shared advisory lock and
//! the row in one statement (`grove.lock_workspace_read`), with no lease row. A read
//! has no effect to fence, so instead of a lease (a synchronous commit to take it, a
//! renewer, a delete) its answer is tied to the lock's session: [`ReadLock::release`]
//! fails when the session ended while the read ran (a database restart, a cut
//! connection), and the caller then answers an error instead of what it read, which a
//! writer may have changed once the lock was gone.

use std::time::Duration;

use grove_core::model::WorkspaceRow;
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::time::Instant;
use tracing::Instrument;
use uuid::Uuid;

use crate::locks::{busy, lock_key, lock_span, millis, waited, LockScope};
use crate::{rows, StoreError};

/// A held shared command lock of one workspace, without a lease. Dropping it unreleased
/// closes its session, which frees the lock.
pub struct ReadLock {
    conn: Option<PoolConnection<Postgres>>,
    key: i64,
}

impl ReadLock {
    /// Waits up to `timeout` for workspace `id`'s shared command lock (and for any
    /// exclusive lease left by a holder that lost its lock), then reads its row; `None`
    /// when the workspace is gone (the lock is held either way).
    pub async fn acquire_workspace(
        pool: &PgPool,
        id: Uuid,
        timeout: Duration,
    ) -> Result<(Self, Option<WorkspaceRow>), StoreError> {
        let scope = LockScope::WorkspaceCommands;
        let key = lock_key(scope, &id.to_string());
        let mut lock = Self {
            conn: Some(pool.acquire().await?),
            key,
        };
        let started = Instant::now();
        let row = sqlx::query("SELECT * FROM grove.lock_workspace_read($1, $2, $3)")
            .bind(key)
            .bind(millis(timeout))
            .bind(id)
            .fetch_optional(lock.conn())
            .instrument(lock_span(scope, true))
            .await;
        waited(scope, &row, started);
        let row = row.map_err(|e| busy(e, scope, timeout))?;
        let row = row.as_ref().map(rows::workspace_from_row).transpose()?;
        Ok((lock, row))
    }

    fn conn(&mut self) -> &mut sqlx::PgConnection {
        self.conn
            .as_deref_mut()
            .expect("a held lock has its connection")
    }

    /// Frees the lock. An error means the lock may have been lost while it was held:
    /// what was read under it must not be answered.
    pub async fn release(mut self) -> Result<(), StoreError> {
        let key = self.key;
        let unlocked: Result<bool, sqlx::Error> =
            sqlx::query_scalar("SELECT pg_advisory_unlock_shared($1)")
                .bind(key)
                .fetch_one(self.conn())
                .await;
        match unlocked {
            Ok(true) => {
                // Unlocked cleanly: the connection goes back to the pool.
                drop(self.conn.take());
                Ok(())
            }
            // The session no longer held it: answered as the database being away.
            Ok(false) => Err(StoreError::Database(sqlx::Error::Protocol(
                "the workspace's read lock was lost while it was held".into(),
            ))),
            Err(e) => Err(e.into()),
        }
    }
}

impl Drop for ReadLock {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // Not released: close the session so Postgres frees the lock with it.
            drop(conn.detach());
        }
    }
}
