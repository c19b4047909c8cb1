//! Reading and following the event log in an order that never skips a late commit.
//!
//! Positions come from a sequence drawn at insert time, so a transaction can commit
//! events with a smaller position after a reader has moved past it. Readers therefore
//! order by `(tx_id, position)` and read only events of transactions below a horizon
//! (`HORIZON`): the oldest transaction still running in *this* database (or, with
//! none, the snapshot's `xmax`). Every transaction below it has committed or aborted or
//! belongs to another database, which cannot write `grove.events`; every transaction
//! still to commit here has a larger `tx_id` than the cursor can have reached.
//!
//! The snapshot's `xmin` alone (the horizon before) is cluster-wide: a transaction
//! holding an xid in any other database of the cluster held every reader back, so an
//! acquire answered and a read of its events right after could come back empty for as
//! long as that transaction lasted.

use grove_core::events::{Event, Metadata, RecordedEvent};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use crate::{trusted, StoreError};

/// Where a reader stands: the `(tx_id, position)` of the last event it has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    pub tx_id: i64,
    pub position: i64,
}

impl Cursor {
    pub fn after(event: &RecordedEvent) -> Self {
        Self {
            tx_id: event.tx_id,
            position: event.position,
        }
    }
}

/// The commit-safe horizon of the statement's snapshot: the smallest xid the snapshot
/// sees as running (`pg_snapshot_xip`) that is not the xid of a backend connected to
/// another database, else the snapshot's `xmax`. `pg_stat_activity` shows every
/// backend's database and xid to every role; an xid it does not place in another
/// database (ours, a prepared transaction, a backend that ended meanwhile) holds the
/// horizon as the `xmin` did, so the answer errs only towards waiting. Backend xids are
/// 32-bit: a running xid8 is matched by its low 32 bits, unique among running ones.
/// The other databases' xids are looked up once per statement (an init plan, skipped
/// when nothing runs), and none of them is null, so `<> ALL` never answers null.
const HORIZON: &str = "(SELECT coalesce(min(x), pg_snapshot_xmax(pg_current_snapshot()))
    FROM pg_snapshot_xip(pg_current_snapshot()) AS x
    WHERE (x::text::numeric % 4294967296)::bigint <> ALL (ARRAY(
        SELECT a.backend_xid::text::bigint FROM pg_stat_activity a
        WHERE a.backend_xid IS NOT NULL AND a.datid IS NOT NULL
          AND a.datid <> (SELECT oid FROM pg_database WHERE datname = current_database()))))";

const EVENT_COLUMNS: &str = "position, tx_id::text::bigint AS tx_id, stream_id, stream_version, event_type, event_version, payload, metadata, recorded_at";

pub fn event_from_row(row: &PgRow) -> Result<RecordedEvent, StoreError> {
    let event_type: String = row.try_get("event_type")?;
    let payload: serde_json::Value = row.try_get("payload")?;
    let metadata: serde_json::Value = row.try_get("metadata")?;
    Ok(RecordedEvent {
        position: row.try_get("position")?,
        tx_id: row.try_get("tx_id")?,
        stream_id: row.try_get("stream_id")?,
        stream_version: row.try_get("stream_version")?,
        event: Event::from_stored(&event_type, payload)?,
        event_type,
        event_version: row.try_get("event_version")?,
        metadata: serde_json::from_value::<Metadata>(metadata)?,
        recorded_at: row.try_get("recorded_at")?,
    })
}

/// The cursor at the event at `position`, so reading resumes with the events after it
/// in commit-safe order (`--after POSITION`). An unknown position starts from the beginning.
pub async fn cursor_at(conn: &mut PgConnection, position: i64) -> Result<Cursor, StoreError> {
    let tx: Option<i64> =
        sqlx::query_scalar("SELECT tx_id::text::bigint FROM grove.events WHERE position = $1")
            .bind(position)
            .fetch_optional(conn)
            .await?;
    Ok(tx
        .map(|tx_id| Cursor { tx_id, position })
        .unwrap_or_default())
}

/// Reads up to `limit` events after `cursor`, optionally of one stream.
pub async fn read_after(
    conn: &mut PgConnection,
    cursor: Cursor,
    stream: Option<&str>,
    limit: i64,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let sql = format!(
        "SELECT {EVENT_COLUMNS} FROM grove.events
         WHERE (tx_id, position) > ($1::text::xid8, $2)
           AND tx_id < {HORIZON}
           AND ($3::text IS NULL OR stream_id = $3)
         ORDER BY tx_id, position
         LIMIT $4"
    );
    sqlx::query(trusted(sql))
        .bind(cursor.tx_id.to_string())
        .bind(cursor.position)
        .bind(stream)
        .bind(limit)
        .fetch_all(conn)
        .await?
        .iter()
        .map(event_from_row)
        .collect()
}

/// The events a command produced, in order.
pub async fn events_of_command(
    conn: &mut PgConnection,
    command_id: uuid::Uuid,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let sql =
        format!("SELECT {EVENT_COLUMNS} FROM grove.events WHERE command_id = $1 ORDER BY position");
    sqlx::query(trusted(sql))
        .bind(command_id)
        .fetch_all(conn)
        .await?
        .iter()
        .map(event_from_row)
        .collect()
}

/// Reads up to `limit` events of one workspace after `cursor`, in the same commit-safe
/// order as [`read_after`]: its own stream and the streams of the runtimes its execs ran
/// in (each `exec.started` of the workspace names its runtime).
pub async fn read_workspace_after(
    conn: &mut PgConnection,
    cursor: Cursor,
    workspace_id: uuid::Uuid,
    limit: i64,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let sql = format!(
        "SELECT {EVENT_COLUMNS} FROM grove.events
         WHERE (tx_id, position) > ($1::text::xid8, $2)
           AND tx_id < {HORIZON}
           AND (stream_id = $3 OR stream_id IN (
                SELECT 'runtime:' || (s.payload ->> 'runtime_id') FROM grove.events s
                WHERE s.stream_id = $3 AND s.event_type = 'exec.started'))
         ORDER BY tx_id, position
         LIMIT $4"
    );
    sqlx::query(trusted(sql))
        .bind(cursor.tx_id.to_string())
        .bind(cursor.position)
        .bind(grove_core::events::workspace_stream(workspace_id))
        .bind(limit)
        .fetch_all(conn)
        .await?
        .iter()
        .map(event_from_row)
        .collect()
}
