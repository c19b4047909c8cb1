//! MCP over HTTP (ADR 27): `/v1/workspaces/{id}/mcp` serves the workspace's agent tools
//! with the streamable HTTP transport (`grove_mcp::http_service`: stateless, JSON
//! answers). The caller is authenticated by the same bearer tokens and the workspace
//! checked against the same tenancy rule as every other route, before a byte reaches
//! the MCP server: another user's workspace answers 404 in the error envelope. The git
//! token for `git_push` and the pull request tools comes from `X-Grove-Git-Token`, the
//! runtime of `shell` from `?runtime=` (default `local`).

use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use grove_core::placement::RuntimeKind;
use grove_mcp::{GroveMcp, Target};
use serde::Deserialize;
use tower_service::Service;
use utoipa::OpenApi;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorResponse};
use crate::extract::{git_token, parse_id};
use crate::request::visible_workspace;
use crate::AppState;

/// The MCP route, merged into the API's router.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/workspaces/{id}/mcp", post(mcp))
}

/// The MCP part of the OpenAPI document, merged into [`crate::ApiDoc`].
#[derive(OpenApi)]
#[openapi(paths(mcp))]
pub struct McpDoc;

#[derive(Deserialize)]
pub struct McpQuery {
    /// The runtime the `shell` tool runs in.
    runtime: Option<String>,
}

/// The workspace's tools for MCP clients (the streamable HTTP transport, stateless):
/// POST one JSON-RPC message (`initialize`, `tools/list`, `tools/call`, ...), answered
/// with its JSON-RPC response (200, `application/json`), or 202 for a notification.
/// GET and DELETE answer 405 (in the error envelope, as every route): the server keeps no
/// session and sends nothing unasked.
#[utoipa::path(
    post,
    path = "/v1/workspaces/{id}/mcp",
    tag = "mcp",
    params(
        ("id" = Uuid, Path),
        ("runtime" = Option<String>, Query, description = "Where the `shell` tool runs: local (default), docker, daytona or e2b"),
        ("X-Grove-Git-Token" = Option<String>, Header, description = "A git token for git_push and the pull request tools; used for this request only"),
    ),
    request_body(content = Object, description = "One JSON-RPC 2.0 message of the Model Context Protocol", content_type = "application/json"),
    responses(
        (status = 200, body = Object, description = "The JSON-RPC response (a tool's failure is a result with `isError: true`)", content_type = "application/json"),
        (status = 202, description = "A notification or response from the client, accepted"),
        (status = 400, body = ErrorResponse, description = "Not a workspace id, or an unknown runtime"),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse, description = "No such workspace (or not the caller's)"),
        (status = 406, description = "The request does not accept application/json and text/event-stream"),
        (status = 415, description = "The body is not application/json"),
    ),
    security(("bearer" = []))
)]
pub async fn mcp(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<McpQuery>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    let workspace_id = parse_id(&id, "workspace")?;
    visible_workspace(&state, &caller, workspace_id).await?;
    let runtime = query.runtime.unwrap_or_else(|| "local".into());
    RuntimeKind::parse_named("runtime", &runtime).map_err(|e| ApiError::invalid(e.to_string()))?;
    let mut request = checked_json(request).await?;
    request.extensions_mut().insert(Arc::new(Target {
        workspace_id,
        runtime,
        git_token: git_token(&headers)?,
    }));
    let mut server = GroveMcp::per_request(state.pool.clone(), state.wait);
    if let Some(inline) = &state.inline {
        server = server
            .with_inline_reads(inline.clone())
            .with_inline_writes(inline.clone());
    }
    let response = grove_mcp::http_service(server)
        .call(request)
        .await
        .unwrap_or_else(|never| match never {})
        .map(axum::body::Body::new);
    typed_refusal(response).await
}

/// The request with its body read and checked to be one JSON value (within the API's
/// body limit and serde's nesting limit) before the transport parses it; anything else
/// is a typed 400.
async fn checked_json(request: Request) -> Result<Request, ApiError> {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, crate::extract::MAX_BODY_BYTES)
        .await
        .map_err(|_| {
            ApiError::Request(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "the body is over the API's limit".into(),
            )
        })?;
    serde_json::from_slice::<serde::de::IgnoredAny>(&bytes)
        .map_err(|e| ApiError::invalid(format!("the body is not one JSON value: {e}")))?;
    Ok(Request::from_parts(parts, axum::body::Body::from(bytes)))
}

/// The transport's own refusals (a missing `Accept`, a body that is not JSON-RPC) come
/// as plain text; they are answered in the API's error envelope, with the same status,
/// like every other refusal. JSON-RPC answers pass unchanged.
async fn typed_refusal(response: Response) -> Result<Response, ApiError> {
    let json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let status = response.status();
    if !status.is_client_error() || json {
        return Ok(response);
    }
    let body = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .unwrap_or_default();
    let text: String = String::from_utf8_lossy(&body).chars().take(200).collect();
    let text = text.trim();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("refused").to_string()
    } else {
        text.to_string()
    };
    Err(ApiError::Request(
        status,
        format!("MCP transport: {message}"),
    ))
}
