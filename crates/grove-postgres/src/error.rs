//! Errors of the Postgres layer, with SQLSTATEs translated to what callers act on.

/// A failure talking to Postgres.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A uniqueness or optimistic-concurrency conflict. Handling: reload and retry.
    #[error("conflict: {0}")]
    Conflict(String),
    /// A lock could not be taken within its timeout. Handling: 409 / exit 4.
    #[error("locked: {0}")]
    Locked(String),
    #[error("not found: {0}")]
    NotFound(String),
    /// Another attempt now holds the command. Handling: drop this attempt's outcome.
    #[error("superseded: {0}")]
    Superseded(String),
    /// A lock's lease is no longer this holder's (it lapsed while the database was away
    /// and another holder took it): writes made under that lock are refused. Handling:
    /// record the outcome without the state changes the lock guarded.
    #[error("fenced: {0}")]
    Fenced(String),
    /// A stored value could not be decoded (a bug or a hand-edited row).
    #[error("corrupt record: {0}")]
    Corrupt(String),
    #[error("database error: {0}")]
    Database(sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &e {
            match db.code().as_deref() {
                Some("23505") => return Self::Conflict(db.message().to_string()),
                Some("55P03") => return Self::Locked(db.message().to_string()),
                _ => {}
            }
        }
        Self::Database(e)
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        Self::Corrupt(e.to_string())
    }
}

impl StoreError {
    /// Whether the database connection itself failed (so a retry after reconnect may work).
    pub fn is_connection(&self) -> bool {
        matches!(
            self,
            Self::Database(sqlx::Error::Io(_))
                | Self::Database(sqlx::Error::PoolTimedOut)
                | Self::Database(sqlx::Error::PoolClosed)
        )
    }
}
