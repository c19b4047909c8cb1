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

/// `event_type IN (...)` of [`HISTORY_EVENTS`], as literals: the predicate of the
/// partial index `events_history` (a bound array would not use it).
fn history_types() -> String {
    let quoted: Vec<String> = HISTORY_EVENTS.iter().map(|t| format!("'{t}'")).collect();
    format!("event_type IN ({})", quoted.join(", "))
}

/// The history events of one workspace, oldest first.
pub async fn history_events(
    conn: &mut PgConnection,
    workspace_id: Uuid,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let sql = format!(
        "SELECT position, tx_id::text::bigint AS tx_id, stream_id, stream_version,
                event_type, event_version, payload, metadata, recorded_at
         FROM grove.events
         WHERE stream_id = $1 AND {}
         ORDER BY stream_version",
        history_types()
    );
    sqlx::query(trusted(sql))
        .bind(workspace_stream(workspace_id))
        .fetch_all(conn)
        .await?
        .iter()
        .map(event_from_row)
        .collect()
}

/// The snapshot of a workspace's newest point: its latest `workspace.snapshot_taken`,
/// or, for a fork with no point of its own yet, the point its `workspace.forked` names.
/// One index probe, however long the timeline (the timeline's last point is this one:
/// retention never drops the latest point, nor a fork's inherited ones).
pub async fn latest_point(
    conn: &mut PgConnection,
    workspace_id: Uuid,
) -> Result<Option<String>, StoreError> {
    let sql = format!(
        "SELECT payload->>'snapshot' FROM grove.events
         WHERE stream_id = $1 AND {} AND event_type <> 'workspace.history_pruned'
         ORDER BY stream_version DESC LIMIT 1",
        history_types()
    );
    let snapshot: Option<Option<String>> = sqlx::query_scalar(trusted(sql))
        .bind(workspace_stream(workspace_id))
        .fetch_optional(conn)
        .await?;
    Ok(snapshot.flatten())
}
