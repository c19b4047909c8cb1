//! Request helpers every route module shares: the command id of a request, the tenancy
//! check on a workspace, and the exec command a request describes.
//!
//! They sit below the route modules (`routes`, `stream`, `tools`, `sessions`, `pulls`,
//! `merge_back`), which all import from here and never from each other. They are plain
//! functions rather than extractors: each handler calls them after its body has been
//! read, so the order of the checks (body first, then 404) stays what the document and
//! the clients see.

use grove_core::commands::{Command, Exec};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::idempotency;
use grove_core::model::WorkspaceRow;
use grove_postgres::rows;
use uuid::Uuid;

use crate::auth::Caller;
use crate::dto::ExecRequest;
use crate::error::ApiError;
use crate::extract::parse_id;
use crate::AppState;

/// The command id of a request: derived from its idempotency key in the caller's scope,
/// else fresh.
pub(crate) fn command_id(caller: &Caller, key: Option<&str>) -> Result<Uuid, ApiError> {
    match key {
        None => Ok(Uuid::now_v7()),
        Some(k) => {
            idempotency::validate_key(k)?;
            Ok(idempotency::command_id_for_key(
                &idempotency::user_scope(&caller.user_id),
                k,
            ))
        }
    }
}

/// The workspace `id`, if the caller may see it; otherwise 404.
pub(crate) async fn visible_workspace(
    state: &AppState,
    caller: &Caller,
    id: Uuid,
) -> Result<WorkspaceRow, ApiError> {
    let mut conn = state.pool.acquire().await?;
    match rows::workspace(&mut conn, id).await? {
        Some(ws) if caller.can_see(&ws.user_id) => Ok(ws),
        _ => Err(ApiError::not_found(format!("workspace {id} not found"))),
    }
}

/// The error of a command that answered with a result of another kind (a bug).
pub(crate) fn unexpected(what: &str) -> ApiError {
    ApiError::Command(CommandError::new(
        ErrorKind::Internal,
        format!("unexpected result for {what}"),
    ))
}

/// Builds the exec command of a request on a workspace the caller may see.
pub(crate) async fn exec_command(
    state: &AppState,
    caller: &Caller,
    raw_id: &str,
    req: ExecRequest,
) -> Result<(Uuid, Command, WorkspaceRow), ApiError> {
    let workspace_id = parse_id(raw_id, "workspace")?;
    let ws = visible_workspace(state, caller, workspace_id).await?;
    let id = command_id(caller, req.idempotency_key.as_deref())?;
    let command = Command::Exec(Exec {
        workspace_id,
        runtime: req.runtime.unwrap_or_else(|| "local".into()),
        argv: req.argv,
        env: req.env,
        cwd: req.cwd,
        stdin: req.stdin.map(String::into_bytes),
        timeout_ms: req.timeout_ms,
        max_output_bytes: req.max_output_bytes,
        kind: req.kind.map(Into::into),
        network: req.network.map(Into::into),
        keep_output: req.keep_output.unwrap_or(true),
    });
    command.validate()?;
    Ok((id, command, ws))
}
