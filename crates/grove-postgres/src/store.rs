//! Appending events and updating the projections they change, in the caller's transaction.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use grove_core::events::{Event, Metadata};
use grove_core::projection::Reads;
use sqlx::PgConnection;

use crate::rows::{self, LIVE};
use crate::StoreError;

/// Appends `events` (all recorded at `at`) and folds them into the live projections.
///
/// The rows the events touch are locked (`FOR UPDATE`) before any event position is
/// drawn, so two transactions that touch one row get positions in the order they were
/// serialized; replay folds in position order and so reproduces the live rows. Each
/// stream's next version is read under that lock; a concurrent writer that slipped past
/// it hits the `(stream_id, stream_version)` unique constraint and gets
/// [`StoreError::Conflict`] (optimistic concurrency).
pub async fn append(
    conn: &mut PgConnection,
    events: &[Event],
    metadata: &Metadata,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    if events.is_empty() {
        return Ok(());
    }
    let reads = Reads::of(events);
    let mut projections = rows::load_for_update(conn, &reads).await?;
    for event in events {
        projections.apply(event, at);
    }
    let touched = projections.take_touched();
    rows::write_touched(conn, LIVE, &projections, &touched).await?;

    let metadata_json = serde_json::to_value(metadata)?;
    let mut versions: HashMap<String, i64> = HashMap::new();
    for event in events {
        let stream = event.stream_id();
        let next = match versions.get(&stream) {
            Some(v) => v + 1,
            None => {
                let current: Option<i64> = sqlx::query_scalar(
                    "SELECT max(stream_version) FROM grove.events WHERE stream_id = $1",
                )
                .bind(&stream)
                .fetch_one(&mut *conn)
                .await?;
                current.unwrap_or(0) + 1
            }
        };
        let (event_type, payload) = event.to_stored();
        sqlx::query(
            "INSERT INTO grove.events (stream_id, stream_version, event_type, event_version, payload, metadata, command_id, recorded_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&stream)
        .bind(next)
        .bind(event_type)
        .bind(event.version())
        .bind(payload)
        .bind(&metadata_json)
        .bind(metadata.command_id)
        .bind(at)
        .execute(&mut *conn)
        .await?;
        versions.insert(stream, next);
    }
    Ok(())
}
