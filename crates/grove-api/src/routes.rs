//! The JSON resources: repo caches, sessions, workspaces, execs and workspace events.
//!
//! Every handler takes the [`Caller`] from the bearer token; the user of anything the
//! request creates is the caller's, never a field of the body. A workspace (and so a
//! session, an exec or an event stream) that is not the caller's answers 404, as if it
//! did not exist, unless the caller is an operator.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use grove_core::commands::{AcquireWorkspace, Command, CommandResult, EnsureRepoCache};
use grove_core::state::LedgerStatus;
use grove_postgres::{api_queries, reader, rows};
use uuid::Uuid;

use crate::auth::Caller;
use crate::dto::*;
use crate::error::{ApiError, ErrorResponse};
use crate::extract::{git_token, parse_id, JsonBody, OptionalJsonBody, QueryParams};
use crate::request::{command_id, exec_command, unexpected, visible_workspace};
use crate::AppState;

type St = State<Arc<AppState>>;

/// Ensure the repo cache of a repository exists (clone once).
#[utoipa::path(
    post,
    path = "/v1/repo-caches/ensure",
    tag = "repo caches",
    request_body = EnsureRepoCacheRequest,
    params(("X-Grove-Git-Token" = Option<String>, Header, description = "A git token for a private repository; used for this request only, never stored or echoed")),
    responses(
        (status = 200, body = EnsureRepoCacheResponse),
        (status = 400, body = ErrorResponse, description = "Invalid repo name, URL, ref or key"),
        (status = 401, body = ErrorResponse),
        (status = 409, body = ErrorResponse, description = "The idempotency key was used for another request"),
        (status = 503, body = ErrorResponse, description = "No worker took the job"),
    )
)]
pub async fn ensure_repo_cache(
    State(state): St,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(req): JsonBody<EnsureRepoCacheRequest>,
) -> Result<Json<EnsureRepoCacheResponse>, ApiError> {
    let token = git_token(&headers)?;
    if let Some(r) = &req.git_ref {
        grove_core::validate::validate_ref(r)?;
    }
    let command = Command::EnsureRepoCache(EnsureRepoCache {
        repo_name: req.repo_name,
        repo_url: req.repo_url,
        fetch: req.fetch,
    });
    command.validate()?;
    let id = command_id(&caller, req.idempotency_key.as_deref())?;
    match answer(&state, &command, id, token.as_deref()).await? {
        CommandResult::RepoCache(row) => Ok(Json(EnsureRepoCacheResponse {
            command_id: id,
            repo_cache: row.into(),
        })),
        _ => Err(unexpected("ensure_repo_cache")),
    }
}

/// Acquire a session: ensure the cache, then get or create the workspace of the key.
#[utoipa::path(
    post,
    path = "/v1/sessions",
    tag = "sessions",
    request_body = AcquireSessionRequest,
    params(("X-Grove-Git-Token" = Option<String>, Header, description = "A git token for a private repository; used for this request only, never stored or echoed")),
    responses(
        (status = 200, body = Session),
        (status = 400, body = ErrorResponse),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse, description = "The base ref does not exist"),
        (status = 409, body = ErrorResponse, description = "Locked, or the key lives on another node"),
        (status = 503, body = ErrorResponse),
    )
)]
pub async fn acquire_session(
    State(state): St,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(req): JsonBody<AcquireSessionRequest>,
) -> Result<Json<Session>, ApiError> {
    let token = git_token(&headers)?;
    let command = Command::AcquireWorkspace(AcquireWorkspace {
        user_id: caller.user_id.clone(),
        project_id: req.project_id,
        repo_name: req.repo_name,
        repo_url: req.repo_url,
        base_ref: req.base_ref,
        mode: req.mode.into(),
        conversation_id: req.conversation_id,
        task_id: req.task_id,
        runtime: req.runtime,
        history_ignored: req.history_ignored,
    });
    command.validate()?;
    let id = command_id(&caller, req.idempotency_key.as_deref())?;
    match answer(&state, &command, id, token.as_deref()).await? {
        CommandResult::Workspace(ws) => Ok(Json(Session {
            session_id: ws.id,
            command_id: id,
            workspace: ws.into(),
        })),
        _ => Err(unexpected("acquire_workspace")),
    }
}

/// An acquire's or an ensure's outcome: run in this process when it is the cheap case
/// on this server's node (ADR 34), else through the queue under the same command id.
async fn answer(
    state: &AppState,
    command: &Command,
    id: Uuid,
    token: Option<&str>,
) -> Result<CommandResult, ApiError> {
    match crate::tools::reuse_inline(state, id, command, token).await? {
        Some(result) => Ok(result),
        None => state.submit(command, id, token).await,
    }
}

/// Release a session: its runtime is hibernated (or destroyed); the workspace stays.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/release",
    tag = "sessions",
    params(("id" = Uuid, Path, description = "The session (workspace) id")),
    request_body(content = Option<ReleaseSessionRequest>, description = "Optional; default hibernates"),
    responses(
        (status = 200, body = Workspace),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
        (status = 409, body = ErrorResponse),
    )
)]
pub async fn release_session(
    State(state): St,
    caller: Caller,
    Path(id): Path<String>,
    OptionalJsonBody(req): OptionalJsonBody<ReleaseSessionRequest>,
) -> Result<Json<Workspace>, ApiError> {
    let id = parse_id(&id, "session")?;
    visible_workspace(&state, &caller, id).await?;
    let command = Command::ReleaseSession {
        workspace_id: id,
        destroy_runtime: req.destroy_runtime,
    };
    state.submit(&command, Uuid::now_v7(), None).await?;
    Ok(Json(visible_workspace(&state, &caller, id).await?.into()))
}

/// List workspaces: the caller's, or (operators) everyone's or one user's.
#[utoipa::path(
    get,
    path = "/v1/workspaces",
    tag = "workspaces",
    params(ListQuery),
    responses(
        (status = 200, body = WorkspaceList),
        (status = 401, body = ErrorResponse),
    )
)]
pub async fn list_workspaces(
    State(state): St,
    caller: Caller,
    QueryParams(q): QueryParams<ListQuery>,
) -> Result<Json<WorkspaceList>, ApiError> {
    let user = if caller.operator {
        q.user
    } else {
        Some(caller.user_id.clone())
    };
    let limit = q.limit.unwrap_or(DEFAULT_LIST_LIMIT);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid(format!(
            "invalid limit {limit}: expected 1 to 1000"
        )));
    }
    let after = q.cursor.as_deref().map(parse_cursor).transpose()?;
    let mut list = api_queries::workspace_page(&state.pool, user.as_deref(), after, limit).await?;
    let next_cursor = if list.len() > limit as usize {
        list.truncate(limit as usize);
        list.last().map(|w| cursor_of(w.created_at, w.id))
    } else {
        None
    };
    Ok(Json(WorkspaceList {
        workspaces: list.into_iter().map(Into::into).collect(),
        next_cursor,
    }))
}

/// The opaque cursor of a row: its creation time (microseconds) and id.
fn cursor_of(created_at: DateTime<Utc>, id: Uuid) -> String {
    format!("{:x}.{}", created_at.timestamp_micros(), id.simple())
}

fn parse_cursor(raw: &str) -> Result<(DateTime<Utc>, Uuid), ApiError> {
    raw.split_once('.')
        .and_then(|(t, id)| {
            let micros = i64::from_str_radix(t, 16).ok()?;
            Some((
                DateTime::from_timestamp_micros(micros)?,
                Uuid::try_parse(id).ok()?,
            ))
        })
        .ok_or_else(|| ApiError::invalid("invalid cursor: pass a next_cursor unchanged"))
}

/// One workspace.
#[utoipa::path(
    get,
    path = "/v1/workspaces/{id}",
    tag = "workspaces",
    params(("id" = Uuid, Path)),
    responses(
        (status = 200, body = Workspace),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
    )
)]
pub async fn get_workspace(
    State(state): St,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Workspace>, ApiError> {
    let id = parse_id(&id, "workspace")?;
    Ok(Json(visible_workspace(&state, &caller, id).await?.into()))
}

/// Destroy a workspace: its files, runtimes and saved work.
#[utoipa::path(
    delete,
    path = "/v1/workspaces/{id}",
    tag = "workspaces",
    params(("id" = Uuid, Path)),
    responses(
        (status = 204, description = "Destroyed"),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
        (status = 409, body = ErrorResponse),
    )
)]
pub async fn destroy_workspace(
    State(state): St,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id = parse_id(&id, "workspace")?;
    visible_workspace(&state, &caller, id).await?;
    let command = Command::DestroyWorkspace { workspace_id: id };
    state.submit(&command, Uuid::now_v7(), None).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Pin a workspace until a time (eviction never takes it), or unpin it.
#[utoipa::path(
    post,
    path = "/v1/workspaces/{id}/pin",
    tag = "workspaces",
    params(("id" = Uuid, Path)),
    request_body(content = Option<PinRequest>, description = "Optional; absent or `until: null` unpins"),
    responses(
        (status = 200, body = Workspace),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
        (status = 409, body = ErrorResponse),
    )
)]
pub async fn pin_workspace(
    State(state): St,
    caller: Caller,
    Path(id): Path<String>,
    OptionalJsonBody(req): OptionalJsonBody<PinRequest>,
) -> Result<Json<Workspace>, ApiError> {
    let id = parse_id(&id, "workspace")?;
    visible_workspace(&state, &caller, id).await?;
    let command = Command::PinWorkspace {
        workspace_id: id,
        until: req.until,
    };
    match state.submit(&command, Uuid::now_v7(), None).await? {
        CommandResult::Workspace(ws) => Ok(Json(ws.into())),
        _ => Ok(Json(visible_workspace(&state, &caller, id).await?.into())),
    }
}

/// Restore an evicted workspace: the same id, path and branch, with the work saved at
/// eviction (uncommitted changes included). A workspace that is not evicted is returned
/// as it is.
#[utoipa::path(
    post,
    path = "/v1/workspaces/{id}/restore",
    tag = "workspaces",
    params(
        ("id" = Uuid, Path),
        ("X-Grove-Git-Token" = Option<String>, Header, description = "A git token, when the repo cache must be cloned again from a private repository; used for this request only"),
    ),
    responses(
        (status = 200, body = Workspace),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
        (status = 409, body = ErrorResponse),
    )
)]
pub async fn restore_workspace(
    State(state): St,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Workspace>, ApiError> {
    let id = parse_id(&id, "workspace")?;
    let token = git_token(&headers)?;
    visible_workspace(&state, &caller, id).await?;
    let command = Command::RestoreWorkspace { workspace_id: id };
    match state
        .submit(&command, Uuid::now_v7(), token.as_deref())
        .await?
    {
        CommandResult::Workspace(ws) => Ok(Json(ws.into())),
        _ => Ok(Json(visible_workspace(&state, &caller, id).await?.into())),
    }
}

/// Run a command in the workspace and answer with its result once it has finished.
#[utoipa::path(
    post,
    path = "/v1/workspaces/{id}/exec",
    tag = "execs",
    params(("id" = Uuid, Path)),
    request_body = ExecRequest,
    responses(
        (status = 200, body = ExecResult, description = "The command ran (whatever its exit code)"),
        (status = 400, body = ErrorResponse),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
        (status = 409, body = ErrorResponse),
        (status = 422, body = ErrorResponse, description = "Refused (e.g. a write in a read-only workspace)"),
        (status = 429, body = ErrorResponse, description = "A resource limit was hit"),
        (status = 503, body = ErrorResponse, description = "No worker, or the runtime is unavailable"),
    )
)]
pub async fn exec(
    State(state): St,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<ExecRequest>,
) -> Result<Json<ExecResult>, ApiError> {
    let (exec_id, command, ws) = exec_command(&state, &caller, &id, req).await?;
    let inline = crate::tools::run_inline(&state, &ws, exec_id, &command).await?;
    let result = match inline {
        Some(result) => result,
        None => state.submit(&command, exec_id, None).await?,
    };
    match result {
        CommandResult::Exec(o) => Ok(Json(ExecResult::new(exec_id, o))),
        _ => Err(unexpected("exec")),
    }
}

/// An exec's state and, once finished, its result or error.
#[utoipa::path(
    get,
    path = "/v1/execs/{id}",
    tag = "execs",
    params(("id" = Uuid, Path, description = "The exec id (its command id)")),
    responses(
        (status = 200, body = ExecStatus),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
    )
)]
pub async fn get_exec(
    State(state): St,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ExecStatus>, ApiError> {
    let id = parse_id(&id, "exec")?;
    let not_found = || ApiError::not_found(format!("exec {id} not found"));
    let mut conn = state.pool.acquire().await?;
    let workspace_id = api_queries::exec_workspace_id(&mut conn, id)
        .await?
        .and_then(|w| Uuid::parse_str(&w).ok())
        .ok_or_else(not_found)?;
    // The owner is the workspace's; once it is destroyed, the user its events name.
    let owner = match rows::workspace(&mut conn, workspace_id).await? {
        Some(ws) => Some(ws.user_id),
        None => reader::events_of_command(&mut conn, id)
            .await?
            .into_iter()
            .find_map(|e| e.metadata.correlation.user_id),
    };
    if !(caller.operator || owner.is_some_and(|o| caller.can_see(&o))) {
        return Err(not_found());
    }
    let status = grove_postgres::queue::status(&mut conn, id)
        .await?
        .ok_or_else(not_found)?;
    let result = match status.result {
        Some(CommandResult::Exec(o)) => Some(ExecResult::new(id, o)),
        _ => None,
    };
    let error = status
        .error
        .filter(|_| status.status == LedgerStatus::Failed)
        .map(|e| ApiError::Command(e).body());
    Ok(Json(ExecStatus {
        exec_id: id,
        workspace_id,
        status: status.status.as_str().to_owned(),
        result,
        error,
    }))
}

/// The events of a workspace (its own stream and its runtimes'), a page at a time, or
/// followed as server-sent events with `follow=true`.
#[utoipa::path(
    get,
    path = "/v1/workspaces/{id}/events",
    tag = "events",
    params(("id" = Uuid, Path), EventsQuery),
    responses(
        (status = 200, description = "A page (`application/json`); with `follow=true`, server-sent events (`text/event-stream`) whose messages carry one `Event` each as JSON `data:`, with the position as their SSE id", content(
            (EventsPage = "application/json"),
            (Event = "text/event-stream")
        )),
        (status = 400, body = ErrorResponse),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
    )
)]
pub async fn workspace_events(
    State(state): St,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    QueryParams(q): QueryParams<EventsQuery>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id, "workspace")?;
    visible_workspace(&state, &caller, id).await?;
    // A reconnecting EventSource resumes after the last id it saw.
    let after = q.after.or_else(|| {
        headers
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
    });
    if q.follow {
        return Ok(crate::stream::follow_events(state, id, after).into_response());
    }
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 1000"));
    }
    let mut conn = state.pool.acquire().await?;
    let cursor = match after {
        Some(p) => reader::cursor_at(&mut conn, p).await?,
        None => reader::Cursor::default(),
    };
    let events = reader::read_workspace_after(&mut conn, cursor, id, limit).await?;
    let next_after = events.last().map(|e| e.position).or(after);
    Ok(Json(EventsPage {
        events: events.iter().map(Event::from).collect(),
        next_after,
    })
    .into_response())
}
