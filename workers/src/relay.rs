//! Relaying a streaming exec's output to Postgres while the command runs (ADR 09).
//!
//! The command runs through [`Runtime::exec_stream`]; every output chunk is handed to a
//! writer task, which appends it to `grove.exec_output` (coalescing what piled up while
//! the previous insert ran), and the chunks are also collected into the result exactly
//! as [`collect_exec`] does for a plain exec. The exec's result is returned only after
//! the writer has appended everything, so a reader that sees the command finished in
//! the ledger has already been able to read all of its output.

use grove_core::error::RuntimeError;
use grove_core::ports::{collect_exec, ExecChunk, ExecRequest, ExecResult, Runtime, StreamKind};
use grove_postgres::output;
use sqlx::PgPool;
use tokio::sync::mpsc;
use uuid::Uuid;

/// Largest chunk the writer appends in one row; more output makes more rows.
const MAX_ROW_BYTES: usize = 64 * 1024;

/// Runs `req` on `runtime`, relaying its output for `exec_id`, and returns its result.
pub async fn exec_relayed(
    runtime: &dyn Runtime,
    req: ExecRequest,
    pool: PgPool,
    exec_id: Uuid,
) -> Result<ExecResult, RuntimeError> {
    use futures::StreamExt;
    let stream = runtime.exec_stream(req).await?;
    let (tx, rx) = mpsc::unbounded_channel::<(StreamKind, Vec<u8>)>();
    let writer = tokio::spawn(write_chunks(pool, exec_id, rx));
    let teed = stream.inspect(move |item| {
        if let Ok(ExecChunk::Output { stream, data }) = item {
            // The writer only stops when the channel closes; a send cannot fail before.
            let _ = tx.send((*stream, data.clone()));
        }
    });
    // `collect_exec` consumes the stream and with it the sender, which ends the writer.
    let result = collect_exec(Box::pin(teed)).await;
    if let Err(e) = writer.await {
        tracing::warn!(%exec_id, error = %e, "exec output relay task failed");
    }
    result
}

/// Appends chunks as they arrive; a chunk that arrives while an insert runs is merged
/// with its neighbours of the same stream. Relay failures are logged and the rest of
/// the output dropped: the command and its result do not depend on the relay.
async fn write_chunks(
    pool: PgPool,
    exec_id: Uuid,
    mut rx: mpsc::UnboundedReceiver<(StreamKind, Vec<u8>)>,
) {
    let mut seq = 0;
    let mut pending: Option<(StreamKind, Vec<u8>)> = None;
    let mut failed = false;
    loop {
        let (stream, mut data) = match pending.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        while data.len() < MAX_ROW_BYTES {
            match rx.try_recv() {
                Ok((s, more)) if s == stream => data.extend_from_slice(&more),
                Ok(other) => {
                    pending = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        if failed {
            continue;
        }
        seq += 1;
        if let Err(e) = output::append(&pool, exec_id, seq, stream, &data).await {
            tracing::warn!(%exec_id, error = %e, "relaying exec output failed; the rest is not relayed");
            failed = true;
        }
    }
}
