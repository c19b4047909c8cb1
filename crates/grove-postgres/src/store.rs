//! Appending events and updating the projections they change, in the caller's transaction.

use chrono::{DateTime, Utc};
use grove_core::events::{Event, Metadata};
use grove_core::projection::Reads;
use sqlx::{PgConnection, PgPool};

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

    // Every event in one statement: each stream's next versions follow its current
    // maximum (read under the row locks taken above) in the order of `events`, and the
    // rows are inserted in that order, so positions follow it too.
    let metadata_json = serde_json::to_value(metadata)?;
    let EventColumns {
        streams,
        types,
        versions,
        payloads,
    } = EventColumns::of(events);
    sqlx::query(
        "INSERT INTO grove.events (stream_id, stream_version, event_type, event_version, payload, metadata, command_id, recorded_at)
         SELECT e.stream_id,
                coalesce((SELECT max(x.stream_version) FROM grove.events x WHERE x.stream_id = e.stream_id), 0)
                    + row_number() OVER (PARTITION BY e.stream_id ORDER BY e.ord),
                e.event_type, e.event_version, e.payload, $5, $6, $7
         FROM unnest($1::text[], $2::text[], $3::integer[], $4::jsonb[])
              WITH ORDINALITY AS e(stream_id, event_type, event_version, payload, ord)
         ORDER BY e.ord",
    )
    .bind(&streams)
    .bind(&types)
    .bind(&versions)
    .bind(&payloads)
    .bind(&metadata_json)
    .bind(metadata.command_id)
    .bind(at)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Events as the column arrays their insert binds, in order.
#[derive(Debug)]
pub(crate) struct EventColumns {
    pub(crate) streams: Vec<String>,
    pub(crate) types: Vec<String>,
    pub(crate) versions: Vec<i32>,
    pub(crate) payloads: Vec<serde_json::Value>,
}

impl EventColumns {
    pub(crate) fn of(events: &[Event]) -> Self {
        let mut columns = Self {
            streams: Vec::with_capacity(events.len()),
            types: Vec::with_capacity(events.len()),
            versions: Vec::with_capacity(events.len()),
            payloads: Vec::with_capacity(events.len()),
        };
        for event in events {
            let (event_type, payload) = event.to_stored();
            columns.streams.push(event.stream_id());
            columns.types.push(event_type.to_string());
            columns.versions.push(event.version());
            columns.payloads.push(payload);
        }
        columns
    }
}

/// [`append`] of a fold onto rows the caller holds (ADR 36), in one statement outside any
/// transaction (`grove.append_folded`): returns the version the written rows now carry.
/// A held row changed since it was read is an error `folded::is_stale` tells apart,
/// and writes nothing.
pub async fn append_folded(
    conn: &mut PgConnection,
    folded: &crate::folded::FoldedAppend,
) -> Result<String, StoreError> {
    let query = sqlx::query("SELECT grove.append_folded($1, $2, $3, $4, $5, $6, $8, $7)");
    let version: String = folded
        .bind_without_command(query)
        .bind(folded.command_id())
        .fetch_one(conn)
        .await
        .and_then(|row| sqlx::Row::try_get(&row, 0))?;
    Ok(version)
}

/// The channel the log's followers LISTEN on (`grove events --follow`, the API's event
/// streams), woken after a commit that appended events.
pub const EVENTS_CHANNEL: &str = "grove_events";

/// Wakes the log's followers after a commit that appended events, in a statement of its
/// own (ADR 36): a NOTIFY inside the appending transaction would take Postgres'
/// database-wide notification lock at commit and hold it through the WAL flush, so
/// every appending commit would queue behind the others. Alone, the NOTIFY writes no
/// WAL. A notification lost here only delays followers until their next poll.
pub async fn announce_appended(conn: &mut PgConnection) {
    if let Err(e) = sqlx::query("SELECT pg_notify($1, '')")
        .bind(EVENTS_CHANNEL)
        .execute(conn)
        .await
    {
        tracing::warn!(error = %e, "announcing appended events failed; followers poll");
    }
}

/// [`announce_appended`] on a pool connection, in a task of its own, so a caller on a
/// latency-bound path (an exec's start) does not wait for it.
pub fn announce_appended_soon(pool: &PgPool) {
    let pool = pool.clone();
    tokio::spawn(async move {
        match pool.acquire().await {
            Ok(mut conn) => announce_appended(&mut conn).await,
            Err(e) => {
                tracing::warn!(error = %e, "announcing appended events failed; followers poll")
            }
        }
    });
}

/// Checks, inside the caller's transaction, that every lock in `fences` still holds its
/// lease, and ends those leases (ADR 39): deletes them, so no one can take them over
/// until the transaction ends, and once it commits each holder only frees its advisory
/// lock. A lease that expired but that no one took over still counts: nothing else ran
/// under the lock meanwhile, and its holder stopped its effect before the expiry.
/// [`StoreError::Fenced`] when one is gone: the caller writes nothing and rolls back,
/// so nothing is deleted unless its outcome commits.
pub async fn end_fences(
    conn: &mut PgConnection,
    fences: &[crate::locks::Fence],
) -> Result<(), StoreError> {
    if fences.is_empty() {
        return Ok(());
    }
    let keys: Vec<i64> = fences.iter().map(|f| f.key).collect();
    let holders: Vec<uuid::Uuid> = fences.iter().map(|f| f.holder).collect();
    let held: Vec<i64> = sqlx::query_scalar(
        "DELETE FROM grove.lock_leases l USING unnest($1::bigint[], $2::uuid[]) AS f(key, holder)
          WHERE l.key = f.key AND l.holder = f.holder
         RETURNING l.key",
    )
    .bind(&keys)
    .bind(&holders)
    .fetch_all(conn)
    .await?;
    if held.len() == fences.len() {
        Ok(())
    } else {
        Err(StoreError::Fenced(format!(
            "{} of {} locks lost their lease while the database was unreachable",
            fences.len() - held.len(),
            fences.len()
        )))
    }
}
