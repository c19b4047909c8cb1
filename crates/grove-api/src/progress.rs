//! Progress of a command by its idempotency key (`GET /v1/progress?idempotency_key=K`):
//! the ledger status and, for a clone or fetch, the last progress snapshot the worker
//! wrote (ADR 25). Keys are scoped per user, so a caller can only name its own
//! commands; an unknown key answers 404.

use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use grove_core::transfer::TransferProgress;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, OpenApi, ToSchema};
use uuid::Uuid;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorResponse};
use crate::extract::QueryParams;
use crate::request::command_id;
use crate::AppState;

/// The progress route, merged into the API's router.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/progress", get(get_progress))
}

/// The progress part of the OpenAPI document, merged into [`crate::ApiDoc`].
#[derive(OpenApi)]
#[openapi(paths(get_progress))]
pub struct ProgressDoc;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProgressQuery {
    /// The idempotency key the command was submitted with.
    pub idempotency_key: String,
}

/// A command's status and its transfer progress.
#[derive(Debug, Serialize, ToSchema)]
pub struct CommandProgress {
    pub command_id: Uuid,
    /// The job kind (`ensure_repo_cache`, `acquire_workspace`, ...).
    pub kind: String,
    /// `queued`, `running`, `succeeded` or `failed`.
    pub status: String,
    /// The last snapshot of its clone or fetch; null before the first one (or for a
    /// command that transfers nothing).
    pub progress: Option<Progress>,
}

/// One snapshot of a clone's or fetch's progress, as git reports it.
#[derive(Debug, Serialize, ToSchema)]
pub struct Progress {
    /// `connecting`, `counting`, `compressing`, `receiving`, `resolving`, `checking`
    /// or `done`.
    pub phase: String,
    /// Objects of the current phase done and in total (0 when unknown).
    pub objects_done: u64,
    pub objects_total: u64,
    pub objects_received: u64,
    pub deltas_done: u64,
    pub deltas_total: u64,
    pub bytes_received: u64,
    /// The receive rate git last reported.
    pub bytes_per_sec: u64,
    /// Percent of the current phase, when known.
    pub percent: Option<u8>,
}

impl From<TransferProgress> for Progress {
    fn from(p: TransferProgress) -> Self {
        Self {
            phase: p.phase.as_str().to_string(),
            objects_done: p.objects_done,
            objects_total: p.objects_total,
            objects_received: p.objects_received,
            deltas_done: p.deltas_done,
            deltas_total: p.deltas_total,
            bytes_received: p.bytes_received,
            bytes_per_sec: p.bytes_per_sec,
            percent: p.percent,
        }
    }
}

/// A command's status and the progress of its clone or fetch.
#[utoipa::path(
    get,
    path = "/v1/progress",
    tag = "progress",
    params(ProgressQuery),
    responses(
        (status = 200, body = CommandProgress),
        (status = 400, body = ErrorResponse, description = "Invalid idempotency key"),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse, description = "No command of the caller has this key"),
    )
)]
pub async fn get_progress(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    QueryParams(q): QueryParams<ProgressQuery>,
) -> Result<Json<CommandProgress>, ApiError> {
    let id = command_id(&caller, Some(&q.idempotency_key))?;
    let mut conn = state.pool.acquire().await?;
    let found = grove_postgres::progress::read(&mut conn, id)
        .await?
        .ok_or_else(|| ApiError::not_found("no command with this idempotency key"))?;
    Ok(Json(CommandProgress {
        command_id: found.command_id,
        kind: found.kind,
        status: found.status.as_str().to_string(),
        progress: found.progress.map(Into::into),
    }))
}
