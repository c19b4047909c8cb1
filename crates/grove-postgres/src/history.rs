//! The events of a workspace's history (ADR 28): its points, its fork origin and its
//! prunings, in log order. `grove_core::history::timeline` folds them into points.

use grove_core::events::{workspace_stream, RecordedEvent};
use sqlx::{PgConnection, Row};
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

/// What a new point of a workspace builds on, read in one round trip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointBase {
    /// The local path of the workspace's repo cache (`None`: no such cache row).
    pub cache_path: Option<String>,
    /// The snapshot of the workspace's newest point (`None`: it has none).
    pub latest: Option<String>,
}

/// The snapshot of a workspace's newest point: its latest `workspace.snapshot_taken`,
/// or, for a fork with no point of its own yet, the point its `workspace.forked` names.
/// One index probe, however long the timeline (the timeline's last point is this one:
/// retention never drops the latest point, nor a fork's inherited ones). Read with the
/// local path of the repo cache `repo_cache_id`, which a point's objects go to.
pub async fn point_base(
    conn: &mut PgConnection,
    workspace_id: Uuid,
    repo_cache_id: Uuid,
) -> Result<PointBase, StoreError> {
    let sql = format!(
        "SELECT (SELECT local_path FROM grove.sandbox_repo_caches WHERE id = $2) AS cache_path,
                (SELECT payload->>'snapshot' FROM grove.events
                  WHERE stream_id = $1 AND {} AND event_type <> 'workspace.history_pruned'
                  ORDER BY stream_version DESC LIMIT 1) AS latest",
        history_types()
    );
    let row = sqlx::query(trusted(sql))
        .bind(workspace_stream(workspace_id))
        .bind(repo_cache_id)
        .fetch_one(conn)
        .await?;
    Ok(PointBase {
        cache_path: row.try_get("cache_path")?,
        latest: row.try_get("latest")?,
    })
}
