//! Server-sent event streams: an exec's output while it runs, and a workspace's events.
//!
//! Each stream is fed by a task that writes into a small channel; when the client goes
//! away the channel closes and the task stops at its next send. Closing a stream never
//! cancels anything: an exec whose client left runs to completion and records its
//! result, which `GET /v1/execs/{id}` returns.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use grove_core::commands::CommandResult;
use grove_core::ports::StreamKind;
use grove_postgres::{output, reader, submit};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::auth::Caller;
use crate::dto::{Event, ExecFinished, ExecOutput, ExecRequest, ExecStarted, ExecStreamData};
use crate::error::{ApiError, ErrorResponse};
use crate::extract::JsonBody;
use crate::AppState;

type Tx = mpsc::Sender<Result<SseEvent, Infallible>>;

fn sse(
    rx: mpsc::Receiver<Result<SseEvent, Infallible>>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

fn json_event(name: &str, data: &impl serde::Serialize) -> SseEvent {
    SseEvent::default()
        .event(name)
        .json_data(data)
        .unwrap_or_else(|_| SseEvent::default().event(name).data("{}"))
}

/// Run a command in the workspace, streaming its output as server-sent events while it
/// runs: `started` (`{"exec_id"}`), then `output` events (`ExecOutput`, SSE id = the
/// chunk's sequence number) as the command writes, then `finished` (`ExecFinished`) or
/// `error` (`ErrorResponse`).
#[utoipa::path(
    post,
    path = "/v1/workspaces/{id}/exec/stream",
    tag = "execs",
    params(("id" = uuid::Uuid, Path)),
    request_body = ExecRequest,
    responses(
        (status = 200, content_type = "text/event-stream", body = ExecStreamData, description = "Server-sent events; the schema is that of each message's `data:` (JSON): `started` (ExecStarted), `output` (ExecOutput, SSE id = chunk sequence), then one `finished` (ExecFinished) or `error` (ErrorResponse)"),
        (status = 400, body = ErrorResponse),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
        (status = 503, body = ErrorResponse),
    )
)]
pub async fn exec_stream(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<ExecRequest>,
) -> Result<Response, ApiError> {
    let (exec_id, command, _) = crate::request::exec_command(&state, &caller, &id, req).await?;
    // Subscribed before the enqueue: neither output nor the outcome can be missed.
    let done = state.notifier.subscribe(exec_id);
    let more = state.notifier.subscribe(exec_id);
    submit::enqueue_with(&state.pool, &command, exec_id, None, true).await?;
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(relay_exec(state, exec_id, done, more, tx));
    Ok(sse(rx).into_response())
}

/// Keeps a character that a chunk boundary split in two for the next chunk.
#[derive(Default)]
struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    fn push(&mut self, data: &[u8]) -> String {
        self.pending.extend_from_slice(data);
        let keep_from = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            // An incomplete character at the end waits for its remaining bytes.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let text = String::from_utf8_lossy(&self.pending[..keep_from]).into_owned();
        self.pending.drain(..keep_from);
        text
    }
    fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

async fn relay_exec(
    state: Arc<AppState>,
    exec_id: Uuid,
    mut done: crate::notify::Subscription,
    mut more: crate::notify::Subscription,
    tx: Tx,
) {
    if tx
        .send(Ok(json_event("started", &ExecStarted { exec_id })))
        .await
        .is_err()
    {
        return;
    }
    let mut relay = Relay {
        state: state.clone(),
        exec_id,
        after: 0,
        stdout: Utf8Carry::default(),
        stderr: Utf8Carry::default(),
    };
    let wait = submit::wait(&state.pool, exec_id, &mut done, state.wait);
    tokio::pin!(wait);
    let outcome = loop {
        tokio::select! {
            outcome = &mut wait => break outcome,
            _ = more.changed_or(Duration::from_millis(250)) => {
                if !relay.drain(&tx).await {
                    return;
                }
            }
        }
    };
    // The worker appends all output before the outcome commits: this drain is complete.
    if !relay.drain(&tx).await {
        return;
    }
    for (stream, carry) in [("stdout", &mut relay.stdout), ("stderr", &mut relay.stderr)] {
        let text = carry.finish();
        if !text.is_empty() {
            let out = ExecOutput {
                stream: stream.into(),
                text,
            };
            let _ = tx.send(Ok(json_event("output", &out))).await;
        }
    }
    let last = match outcome {
        Ok(CommandResult::Exec(o)) => json_event(
            "finished",
            &ExecFinished {
                exec_id,
                exit_code: o.exit_code,
                timed_out: o.timed_out,
                truncated: o.truncated,
                duration_ms: o.duration_ms,
            },
        ),
        Ok(_) => json_event(
            "error",
            &ErrorResponse {
                error: ApiError::invalid("unexpected result for exec").body(),
            },
        ),
        Err(e) => {
            let e = ApiError::from(e);
            if let ApiError::Store(s) = &e {
                tracing::error!(error = %s, %exec_id, "streaming exec failed on the database");
            }
            json_event("error", &ErrorResponse { error: e.body() })
        }
    };
    let _ = tx.send(Ok(last)).await;
}

struct Relay {
    state: Arc<AppState>,
    exec_id: Uuid,
    after: i32,
    stdout: Utf8Carry,
    stderr: Utf8Carry,
}

impl Relay {
    /// Sends every chunk not sent yet. False when the client is gone.
    async fn drain(&mut self, tx: &Tx) -> bool {
        loop {
            let chunks = {
                let Ok(mut conn) = self.state.pool.acquire().await else {
                    return true;
                };
                match output::read_after(&mut conn, self.exec_id, self.after, 256).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, exec_id = %self.exec_id, "reading relayed output failed");
                        return true;
                    }
                }
            };
            if chunks.is_empty() {
                return true;
            }
            for c in chunks {
                self.after = c.seq;
                let (name, carry) = match c.stream {
                    StreamKind::Stdout => ("stdout", &mut self.stdout),
                    StreamKind::Stderr => ("stderr", &mut self.stderr),
                };
                let text = carry.push(&c.data);
                if text.is_empty() {
                    continue;
                }
                let event = json_event(
                    "output",
                    &ExecOutput {
                        stream: name.into(),
                        text,
                    },
                )
                .id(c.seq.to_string());
                if tx.send(Ok(event)).await.is_err() {
                    return false;
                }
            }
        }
    }
}

/// Follows a workspace's events as server-sent events (SSE id = position), from `after`
/// on, until the client leaves, the workspace is destroyed or the server stops.
pub fn follow_events(state: Arc<AppState>, workspace_id: Uuid, after: Option<i64>) -> Response {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut log = state.notifier.events();
        let mut cursor = None;
        loop {
            let Ok(mut conn) = state.pool.acquire().await else {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            };
            let current = match cursor {
                Some(c) => c,
                None => match after {
                    Some(p) => match reader::cursor_at(&mut conn, p).await {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::warn!(error = %e, "following workspace events failed; retrying");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            continue;
                        }
                    },
                    None => reader::Cursor::default(),
                },
            };
            cursor = Some(current);
            let batch =
                match reader::read_workspace_after(&mut conn, current, workspace_id, 500).await {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::warn!(error = %e, "following workspace events failed; retrying");
                        Vec::new()
                    }
                };
            drop(conn);
            let full = batch.len() == 500;
            for e in &batch {
                cursor = Some(reader::Cursor::after(e));
                let data = SseEvent::default()
                    .id(e.position.to_string())
                    .json_data(Event::from(e))
                    .unwrap_or_default();
                if tx.send(Ok(data)).await.is_err() {
                    return;
                }
                if e.event_type == "workspace.destroyed" {
                    return;
                }
            }
            if !full {
                // Woken by the log's insert notification; the timeout is the fallback
                // (and re-reads transactions that were still open below xmin).
                tokio::select! {
                    _ = tx.closed() => return,
                    // The server is stopping: end the stream (the client resumes with
                    // Last-Event-ID elsewhere or after the restart).
                    _ = state.stopped() => return,
                    _ = tokio::time::timeout(Duration::from_millis(500), log.changed()) => {}
                }
            }
        }
    });
    sse(rx).into_response()
}
