//! Progress of a running clone or fetch on its ledger row (`grove.commands.progress`):
//! written by the worker while the command runs, read by the API and the CLI. Not an
//! event, so replay never sees it (ADR 25).

use grove_core::state::{LedgerStatus, UnknownState};
use grove_core::transfer::TransferProgress;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use crate::StoreError;

/// A command's status and its last progress snapshot, if it reported one.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandProgress {
    pub command_id: Uuid,
    pub kind: String,
    pub status: LedgerStatus,
    pub progress: Option<TransferProgress>,
}

/// Overwrites the progress of `command_id` while it runs; false when the command is not
/// (or no longer) running, so a late write never lands on a finished command.
pub async fn record(
    pool: &PgPool,
    command_id: Uuid,
    progress: &TransferProgress,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE grove.commands SET progress = $2 WHERE command_id = $1 AND status = $3",
    )
    .bind(command_id)
    .bind(serde_json::to_value(progress)?)
    .bind(LedgerStatus::Running.as_str())
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The status and progress of `command_id`; `None` when there is no such command.
pub async fn read(
    conn: &mut PgConnection,
    command_id: Uuid,
) -> Result<Option<CommandProgress>, StoreError> {
    let row = sqlx::query(
        "SELECT command_id, kind, status, progress FROM grove.commands WHERE command_id = $1",
    )
    .bind(command_id)
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let status: String = row.try_get("status")?;
    let progress: Option<serde_json::Value> = row.try_get("progress")?;
    Ok(Some(CommandProgress {
        command_id: row.try_get("command_id")?,
        kind: row.try_get("kind")?,
        status: status
            .parse()
            .map_err(|e: UnknownState| StoreError::Corrupt(e.to_string()))?,
        progress: progress.map(serde_json::from_value).transpose()?,
    }))
}
