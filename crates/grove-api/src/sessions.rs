//! Interactive sessions over HTTP: start a persistent process in a workspace's local
//! runtime, write its stdin, poll its output, kill it.
//!
//! Sessions are runtime state held in this server's memory (the provider that started
//! them holds the child), not commands: they go through no queue, write no events and
//! end when this process ends. So only the server of the workspace's node can hold
//! them (another node's workspace answers 409), and only the local runtime is offered
//! here: a Docker session would need a runtime record (the orphan sweep removes
//! containers no record owns), which only a worker writes. A session is tied to the
//! workspace it was started in: another user's workspace, or a session of another
//! workspace, answers 404.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use grove_core::error::{CommandError, ErrorKind, RuntimeError};
use grove_core::model::WorkspaceRow;
use grove_core::ports::{
    Mount, NetworkPolicy, ResourceHints, RuntimeProvider, RuntimeRegistry, RuntimeSpec,
    SessionExit, SessionId, SessionInfo, SessionInput, SessionOutput, SessionRequest, Sessions,
};
use grove_postgres::rows;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorResponse};
use crate::extract::{parse_id, JsonBody, OptionalJsonBody};
use crate::request::visible_workspace;
use crate::AppState;

type St = State<Arc<AppState>>;

/// The runtime sessions are started in over HTTP.
pub const SESSION_RUNTIME: &str = "local";
/// The longest a poll waits for output.
pub const MAX_POLL_WAIT_MS: u64 = 30_000;

/// What the server needs to hold sessions: its node's runtime providers.
pub struct SessionHost {
    runtimes: RuntimeRegistry,
    node: String,
    /// Which workspace each session was started in.
    owners: Mutex<HashMap<SessionId, Uuid>>,
}

impl SessionHost {
    pub fn new(runtimes: RuntimeRegistry, node: impl Into<String>) -> Self {
        Self {
            runtimes,
            node: node.into(),
            owners: Mutex::default(),
        }
    }

    /// Kills every session this server started (a stopping server leaves none behind);
    /// returns how many it ended.
    pub async fn end_all(&self) -> usize {
        let ids: Vec<SessionId> = self.owners().drain().map(|(id, _)| id).collect();
        let Some(provider) = self.runtimes.get(SESSION_RUNTIME) else {
            return 0;
        };
        let Some(sessions) = provider.sessions() else {
            return 0;
        };
        let mut ended = 0;
        for id in &ids {
            if sessions.kill(id).await.is_ok() {
                ended += 1;
            }
        }
        ended
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Uuid>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartSessionRequest {
    /// The program and its arguments, e.g. `["sh"]`.
    #[schema(min_items = 1)]
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory relative to the workspace root.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Size of the output ring (newest bytes kept); default 1 MiB, at most 16 MiB.
    #[serde(default)]
    pub max_buffer_bytes: Option<usize>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteSessionRequest {
    /// Text for the session's stdin (at most 1 MiB).
    #[serde(default)]
    pub data: String,
    /// Close stdin after `data` (the process sees end of file).
    #[serde(default)]
    pub close: bool,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PollSessionRequest {
    /// Wait up to this long for output when there is none yet (at most 30000).
    #[serde(default)]
    #[schema(maximum = 30000)]
    pub wait_ms: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionEnd {
    /// As a shell reports it; 137 when killed; -1 when the runtime failed.
    pub exit_code: i32,
    pub killed: bool,
    pub error: Option<String>,
}

impl From<SessionExit> for SessionEnd {
    fn from(e: SessionExit) -> Self {
        Self {
            exit_code: e.exit_code,
            killed: e.killed,
            error: e.error,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct InteractiveSession {
    pub id: String,
    pub workspace_id: Uuid,
    pub runtime: String,
    pub argv: Vec<String>,
    pub max_buffer_bytes: usize,
    pub started_at: DateTime<Utc>,
    /// Everything it printed so far, kept or not.
    pub output_bytes: u64,
    /// Set once it ended.
    pub exit: Option<SessionEnd>,
}

impl InteractiveSession {
    fn new(workspace_id: Uuid, info: SessionInfo) -> Self {
        Self {
            id: info.id.to_string(),
            workspace_id,
            runtime: SESSION_RUNTIME.to_string(),
            argv: info.argv,
            max_buffer_bytes: info.max_buffer_bytes,
            started_at: info.started_at,
            output_bytes: info.output_bytes,
            exit: info.exit.map(Into::into),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionPoll {
    /// Output since the previous poll (stdout and stderr interleaved), UTF-8 (lossy).
    pub data: String,
    /// Position of the first byte of `data` in everything the session printed.
    pub offset: u64,
    /// Bytes printed since the previous poll that the ring no longer held.
    pub dropped_bytes: u64,
    /// Set once the process ended.
    pub exit: Option<SessionEnd>,
}

impl From<SessionOutput> for SessionPoll {
    fn from(o: SessionOutput) -> Self {
        Self {
            data: String::from_utf8_lossy(&o.data).into_owned(),
            offset: o.offset,
            dropped_bytes: o.dropped_bytes,
            exit: o.exit.map(Into::into),
        }
    }
}

fn runtime_error(e: RuntimeError) -> ApiError {
    ApiError::Command(CommandError::from(e))
}

fn host(state: &AppState) -> Result<&SessionHost, ApiError> {
    state.sessions.as_ref().ok_or_else(|| {
        ApiError::Command(CommandError::new(
            ErrorKind::Unavailable,
            "this server holds no interactive sessions",
        ))
    })
}

/// The workspace, if the caller may see it and its files are on this server's node.
async fn session_workspace<'s>(
    state: &'s AppState,
    caller: &Caller,
    id: &str,
) -> Result<(WorkspaceRow, &'s SessionHost, Arc<dyn RuntimeProvider>), ApiError> {
    let id = parse_id(id, "workspace")?;
    let ws = visible_workspace(state, caller, id).await?;
    let host = host(state)?;
    if ws.node != host.node {
        return Err(ApiError::Command(CommandError::new(
            ErrorKind::Conflict,
            format!(
                "workspace {} lives on node {}; its interactive sessions are held by that node's server",
                ws.id, ws.node
            ),
        )));
    }
    let provider = host
        .runtimes
        .get(SESSION_RUNTIME)
        .filter(|p| p.sessions().is_some())
        .ok_or_else(|| {
            ApiError::Command(CommandError::new(
                ErrorKind::Unavailable,
                "interactive sessions need the local runtime with OS isolation (bubblewrap), unavailable here",
            ))
        })?;
    Ok((ws, host, provider))
}

fn sessions_of(provider: &dyn RuntimeProvider) -> &dyn Sessions {
    provider.sessions().expect("checked by session_workspace")
}

/// The session `sid` of workspace `ws`, else 404.
fn owned_session(host: &SessionHost, ws: Uuid, sid: &str) -> Result<SessionId, ApiError> {
    let sid = SessionId::from(sid.to_string());
    match host.owners().get(&sid) {
        Some(owner) if *owner == ws => Ok(sid),
        _ => Err(ApiError::not_found(format!("session {sid} not found"))),
    }
}

/// Start an interactive session (a shell, a REPL) in the workspace's local runtime.
#[utoipa::path(
    post,
    path = "/v1/workspaces/{id}/sessions/interactive",
    tag = "interactive sessions",
    params(("id" = Uuid, Path, description = "The workspace id")),
    request_body = StartSessionRequest,
    responses(
        (status = 201, body = InteractiveSession),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
        (status = 409, body = ErrorResponse, description = "The workspace lives on another node"),
        (status = 422, body = ErrorResponse, description = "The runtime refused the command (argv, env, cwd)"),
        (status = 429, body = ErrorResponse, description = "Too many sessions running"),
        (status = 503, body = ErrorResponse, description = "No sandboxed runtime for sessions here"),
    )
)]
pub async fn start_session(
    State(state): St,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<StartSessionRequest>,
) -> Result<(StatusCode, Json<InteractiveSession>), ApiError> {
    let (ws, host, provider) = session_workspace(&state, &caller, &id).await?;
    let cache_dir = {
        let mut conn = state.pool.acquire().await?;
        rows::repo_cache(&mut conn, ws.repo_cache_id)
            .await?
            .map(|c| PathBuf::from(c.local_path))
    };
    let ws_dir = PathBuf::from(&ws.local_path);
    if let Some(id) = provider.sandbox_identity() {
        // As before an exec: the session's processes run as the sandbox identity, so
        // the workspace is handed over to it first (a no-op once it is).
        let dir = ws_dir.clone();
        tokio::task::spawn_blocking(move || grove_git::tree::hand_over(&dir, id.uid, id.gid))
            .await
            .map_err(|e| RuntimeError::Unavailable(format!("ownership task failed: {e}")))
            .and_then(|r| {
                r.map_err(|e| {
                    RuntimeError::Unavailable(format!(
                        "handing the workspace to the sandbox user failed: {e}"
                    ))
                })
            })
            .map_err(runtime_error)?;
    }
    let mut mounts = vec![Mount {
        source: ws_dir.clone(),
        target: ws_dir.clone(),
        writable: ws.capabilities.writable,
    }];
    if let Some(cache_dir) = cache_dir {
        // git inside the workspace reads the cache's objects through alternates.
        mounts.push(Mount {
            source: cache_dir.clone(),
            target: cache_dir,
            writable: false,
        });
    }
    let runtime_id = Uuid::new_v5(&ws.id, SESSION_RUNTIME.as_bytes());
    let spec = RuntimeSpec {
        image: None,
        workdir: ws_dir,
        mounts,
        env: Default::default(),
        resources: ResourceHints::default(),
        network: NetworkPolicy::None,
        labels: [
            ("grove.workspace".to_string(), ws.id.to_string()),
            ("grove.runtime".to_string(), runtime_id.to_string()),
        ]
        .into(),
    };
    let request = SessionRequest {
        argv: req.argv,
        cwd: req.cwd.map(PathBuf::from),
        env: req.env,
        mutating: ws.capabilities.writable,
        max_buffer_bytes: req.max_buffer_bytes,
    };
    let info = sessions_of(provider.as_ref())
        .start(spec, request)
        .await
        .map_err(runtime_error)?;
    {
        // Forget the owners of sessions the provider no longer remembers.
        let known: Vec<SessionId> = sessions_of(provider.as_ref())
            .list()
            .into_iter()
            .map(|i| i.id)
            .collect();
        let mut owners = host.owners();
        owners.retain(|s, _| known.contains(s));
        owners.insert(info.id.clone(), ws.id);
    }
    tracing::info!(workspace = %ws.id, session = %info.id, "interactive session started");
    Ok((
        StatusCode::CREATED,
        Json(InteractiveSession::new(ws.id, info)),
    ))
}

/// The workspace's interactive sessions held by this server (running, or ended and
/// not yet forgotten).
#[utoipa::path(
    get,
    path = "/v1/workspaces/{id}/sessions/interactive",
    tag = "interactive sessions",
    params(("id" = Uuid, Path, description = "The workspace id")),
    responses(
        (status = 200, body = Vec<InteractiveSession>),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
    )
)]
pub async fn list_sessions(
    State(state): St,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Vec<InteractiveSession>>, ApiError> {
    let (ws, host, provider) = session_workspace(&state, &caller, &id).await?;
    let mine: Vec<SessionId> = host
        .owners()
        .iter()
        .filter(|(_, w)| **w == ws.id)
        .map(|(s, _)| s.clone())
        .collect();
    let listed = sessions_of(provider.as_ref())
        .list()
        .into_iter()
        .filter(|i| mine.contains(&i.id))
        .map(|i| InteractiveSession::new(ws.id, i))
        .collect();
    Ok(Json(listed))
}

/// Write to a session's stdin (and close it with `close`).
#[utoipa::path(
    post,
    path = "/v1/workspaces/{id}/sessions/interactive/{session_id}/write",
    tag = "interactive sessions",
    params(
        ("id" = Uuid, Path, description = "The workspace id"),
        ("session_id" = String, Path, description = "The session id"),
    ),
    request_body = WriteSessionRequest,
    responses(
        (status = 204, description = "Queued for the session's stdin"),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
        (status = 422, body = ErrorResponse, description = "The session ended or its stdin is closed"),
    )
)]
pub async fn write_session(
    State(state): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
    JsonBody(req): JsonBody<WriteSessionRequest>,
) -> Result<StatusCode, ApiError> {
    let (ws, host, provider) = session_workspace(&state, &caller, &id).await?;
    let sid = owned_session(host, ws.id, &sid)?;
    sessions_of(provider.as_ref())
        .write(
            &sid,
            SessionInput {
                data: req.data.into_bytes(),
                close: req.close,
            },
        )
        .await
        .map_err(runtime_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Output since the previous poll; waits up to `wait_ms` for some when there is none.
#[utoipa::path(
    post,
    path = "/v1/workspaces/{id}/sessions/interactive/{session_id}/poll",
    tag = "interactive sessions",
    params(
        ("id" = Uuid, Path, description = "The workspace id"),
        ("session_id" = String, Path, description = "The session id"),
    ),
    request_body = PollSessionRequest,
    responses(
        (status = 200, body = SessionPoll),
        (status = 400, body = ErrorResponse),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
    )
)]
pub async fn poll_session(
    State(state): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
    OptionalJsonBody(req): OptionalJsonBody<PollSessionRequest>,
) -> Result<Json<SessionPoll>, ApiError> {
    let wait = req.wait_ms.unwrap_or(0);
    if wait > MAX_POLL_WAIT_MS {
        return Err(ApiError::invalid(format!(
            "wait_ms {wait} is more than {MAX_POLL_WAIT_MS}"
        )));
    }
    let (ws, host, provider) = session_workspace(&state, &caller, &id).await?;
    let sid = owned_session(host, ws.id, &sid)?;
    let out = sessions_of(provider.as_ref())
        .poll(&sid, Duration::from_millis(wait))
        .await
        .map_err(runtime_error)?;
    Ok(Json(out.into()))
}

/// Kill a session's processes; a later poll reports the exit. Killing an ended
/// session is fine.
#[utoipa::path(
    post,
    path = "/v1/workspaces/{id}/sessions/interactive/{session_id}/kill",
    tag = "interactive sessions",
    params(
        ("id" = Uuid, Path, description = "The workspace id"),
        ("session_id" = String, Path, description = "The session id"),
    ),
    responses(
        (status = 204, description = "Killed"),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
    )
)]
pub async fn kill_session(
    State(state): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let (ws, host, provider) = session_workspace(&state, &caller, &id).await?;
    let sid = owned_session(host, ws.id, &sid)?;
    sessions_of(provider.as_ref())
        .kill(&sid)
        .await
        .map_err(runtime_error)?;
    Ok(StatusCode::NO_CONTENT)
}
