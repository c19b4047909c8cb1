//! The reads only the HTTP API makes: a page of workspaces, and the workspace an exec ran in.
//!
//! Moved here from `grove-api` so that SQL text lives in this crate alone; the API
//! calls these functions and owns the tenancy decisions around them.

use chrono::{DateTime, Utc};
use grove_core::model::WorkspaceRow;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::rows::{workspace_from_row, WORKSPACE_COLUMNS};
use crate::{trusted, StoreError};

/// Up to `limit + 1` workspaces after `after`, by (created_at, id), of one user or of
/// everyone: a row created while a client pages lands after every row it has seen, so
/// pages never skip or repeat a row. The extra row tells the caller another page exists.
pub async fn workspace_page(
    pool: &PgPool,
    user: Option<&str>,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: u32,
) -> Result<Vec<WorkspaceRow>, StoreError> {
    let sql = format!(
        "SELECT {WORKSPACE_COLUMNS} FROM grove.sandbox_workspaces \
         WHERE ($1::text IS NULL OR user_id = $1) \
           AND ($2::timestamptz IS NULL OR (created_at, id) > ($2, $3)) \
         ORDER BY created_at, id LIMIT $4"
    );
    sqlx::query(trusted(sql))
        .bind(user)
        .bind(after.map(|a| a.0))
        .bind(after.map(|a| a.1))
        .bind(i64::from(limit) + 1)
        .fetch_all(pool)
        .await?
        .iter()
        .map(workspace_from_row)
        .collect()
}

/// The `workspace_id` field of an exec command's payload, as the ledger holds it: `None`
/// when no exec has that command id (or its payload names no workspace). The text is
/// returned unparsed; the caller decides what an unreadable id means.
pub async fn exec_workspace_id(
    conn: &mut PgConnection,
    exec_id: Uuid,
) -> Result<Option<String>, StoreError> {
    let found: Option<Option<String>> = sqlx::query_scalar(
        "SELECT payload ->> 'workspace_id' FROM grove.commands WHERE command_id = $1 AND kind = 'exec'",
    )
    .bind(exec_id)
    .fetch_optional(conn)
    .await?;
    Ok(found.flatten())
}
