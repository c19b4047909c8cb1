//! The output relay of streaming execs: the worker appends chunks, any server reads them.
//!
//! A caller asks for the relay when it enqueues the exec ([`request_relay`], same
//! transaction); the worker that runs the exec checks [`relay_requested`] and, if so,
//! appends the output as it comes ([`append`]), each row announced on
//! [`OUTPUT_CHANNEL`]. Readers page by sequence number ([`read_after`]). Rows are
//! transient (UNLOGGED tables) and pruned an hour after they were written. See ADR 09.

use grove_core::ports::StreamKind;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use crate::StoreError;

/// Notified (payload: the exec id) when output of an exec was appended.
pub const OUTPUT_CHANNEL: &str = "grove_exec_output";

/// One piece of relayed output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputChunk {
    /// 1, 2, 3, ... per exec, in the order the worker received the output.
    pub seq: i32,
    pub stream: StreamKind,
    pub data: Vec<u8>,
}

/// Asks the worker that will run `exec_id` to relay its output. Call in the enqueue's
/// transaction (or before it): the worker looks once, when the exec starts.
pub async fn request_relay(conn: &mut PgConnection, exec_id: Uuid) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO grove.exec_relays (exec_id) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(exec_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Whether a caller asked for the output of `exec_id` to be relayed.
pub async fn relay_requested<'c>(
    conn: impl sqlx::PgExecutor<'c>,
    exec_id: Uuid,
) -> Result<bool, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM grove.exec_relays WHERE exec_id = $1)")
            .bind(exec_id)
            .fetch_one(conn)
            .await?,
    )
}

/// Appends one chunk (its own short transaction; notifies at commit).
pub async fn append(
    pool: &PgPool,
    exec_id: Uuid,
    seq: i32,
    stream: StreamKind,
    data: &[u8],
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO grove.exec_output (exec_id, seq, stream, data) VALUES ($1, $2, $3, $4)",
    )
    .bind(exec_id)
    .bind(seq)
    .bind(stream_name(stream))
    .bind(data)
    .execute(pool)
    .await?;
    Ok(())
}

/// Up to `limit` chunks of `exec_id` with a sequence number above `after`, in order.
pub async fn read_after(
    conn: &mut PgConnection,
    exec_id: Uuid,
    after: i32,
    limit: i64,
) -> Result<Vec<OutputChunk>, StoreError> {
    let rows = sqlx::query(
        "SELECT seq, stream, data FROM grove.exec_output WHERE exec_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
    )
    .bind(exec_id)
    .bind(after)
    .bind(limit)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|r| {
            let stream: String = r.try_get("stream")?;
            Ok(OutputChunk {
                seq: r.try_get("seq")?,
                stream: match stream.as_str() {
                    "stdout" => StreamKind::Stdout,
                    "stderr" => StreamKind::Stderr,
                    other => return Err(StoreError::Corrupt(format!("output stream {other:?}"))),
                },
                data: r.try_get("data")?,
            })
        })
        .collect()
}

/// Deletes relay requests and output older than `older_than`.
pub async fn prune(pool: &PgPool, older_than: std::time::Duration) -> Result<u64, StoreError> {
    let secs = older_than.as_secs_f64();
    let n = sqlx::query(
        "DELETE FROM grove.exec_output WHERE created_at < now() - make_interval(secs => $1)",
    )
    .bind(secs)
    .execute(pool)
    .await?
    .rows_affected();
    sqlx::query(
        "DELETE FROM grove.exec_relays WHERE created_at < now() - make_interval(secs => $1)",
    )
    .bind(secs)
    .execute(pool)
    .await?;
    Ok(n)
}

/// How long the output of an exec that asked not to be kept (`keep_output: false`)
/// stays on its ledger row: long enough for its caller to collect the result.
pub const UNKEPT_OUTPUT_WINDOW: std::time::Duration = std::time::Duration::from_secs(3600);

/// Blanks the stdout and stderr of exec results on the ledger that finished more than
/// `retention` ago (or [`UNKEPT_OUTPUT_WINDOW`] ago, for an exec whose request asked not
/// to keep its output), marking them `output_pruned`. The rest of the result (exit code,
/// duration) stays until the ledger row itself is pruned. Returns how many were blanked.
pub async fn prune_kept(pool: &PgPool, retention: std::time::Duration) -> Result<u64, StoreError> {
    let n = sqlx::query(
        "UPDATE grove.commands
         SET result = result || '{\"stdout\": \"\", \"stderr\": \"\", \"output_pruned\": true}'::jsonb
         WHERE kind = 'exec' AND result IS NOT NULL AND NOT (result ? 'output_pruned')
           AND finished_at < now() - make_interval(secs => CASE
               WHEN payload ->> 'keep_output' = 'false' THEN $2 ELSE $1 END)",
    )
    .bind(retention.as_secs_f64())
    .bind(UNKEPT_OUTPUT_WINDOW.as_secs_f64().min(retention.as_secs_f64()))
    .execute(pool)
    .await?
    .rows_affected();
    Ok(n)
}

fn stream_name(stream: StreamKind) -> &'static str {
    match stream {
        StreamKind::Stdout => "stdout",
        StreamKind::Stderr => "stderr",
    }
}
