//! The events of a workspace's history (ADR 28): its points, its fork origin and its
//! prunings, in log order. `grove_core::history::timeline` folds them into points.

use grove_core::events::{workspace_stream, RecordedEvent};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::reader::event_from_row;
use crate::{trusted, StoreError};

/// The event types a timeline is folded from.
pub const HISTORY_EVENTS: [&str; 3] = [
    "workspace.snapshot_taken",
    "workspace.forked",
    "workspace.history_pruned",
];

/// The history events of one workspace, oldest first.
pub async fn history_events(
    conn: &mut PgConnection,
    workspace_id: Uuid,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let sql = "SELECT position, tx_id::text::bigint AS tx_id, stream_id, stream_version,
                      event_type, event_version, payload, metadata, recorded_at
               FROM grove.events
               WHERE stream_id = $1 AND event_type = ANY($2)
               ORDER BY position"
        .to_string();
    sqlx::query(trusted(sql))
        .bind(workspace_stream(workspace_id))
        .bind(&HISTORY_EVENTS[..])
        .fetch_all(conn)
        .await?
        .iter()
        .map(event_from_row)
        .collect()
}
