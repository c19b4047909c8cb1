//! Pull requests of a workspace: open one from its branch, read one, comment on one.
//!
//! Opening and commenting are commands (`create_pull_request`, `comment_pull_request`)
//! submitted like every state change, with the token of `X-Grove-Git-Token` handed to
//! `grove.command_secrets` (ADR 05). Reading is no job: it asks the platform directly
//! with the request's token, which is then dropped (ADR 14). The repository is always
//! the workspace's; another user's workspace answers 404 before anything happens.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use grove_core::commands::{
    Command, CommandResult, CommentPullRequest as CommentCommand,
    CreatePullRequest as CreateCommand,
};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::platform::{self, PullRequest as CorePullRequest};
use grove_core::ports::GitToken;
use grove_postgres::rows;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorResponse};
use crate::extract::{git_token, parse_id, JsonBody};
use crate::request::{command_id, visible_workspace};
use crate::AppState;

type St = State<Arc<AppState>>;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePullRequestRequest {
    /// One line.
    pub title: String,
    #[serde(default)]
    pub body: Option<String>,
    /// The branch to merge into (default: the workspace's base ref). The head is always
    /// the workspace's branch, pushed first.
    #[serde(default)]
    pub base: Option<String>,
    #[serde(default)]
    pub draft: bool,
    /// The same key twice (for the same caller) is one command: one pull request.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommentRequest {
    pub body: String,
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// A pull request as the platform reports it.
#[derive(Debug, Serialize, ToSchema)]
pub struct PullRequest {
    /// `owner/name` on the platform.
    pub repo: String,
    pub number: u64,
    /// `open` or `closed`.
    pub state: String,
    pub title: String,
    /// The branch with the changes (the workspace's).
    pub head: String,
    pub head_sha: Option<String>,
    pub base: String,
    /// The pull request's web page.
    pub url: String,
    pub draft: bool,
    pub merged: bool,
}

impl From<CorePullRequest> for PullRequest {
    fn from(p: CorePullRequest) -> Self {
        Self {
            repo: p.repo,
            number: p.number,
            state: p.state.as_str().to_string(),
            title: p.title,
            head: p.head,
            head_sha: p.head_sha,
            base: p.base,
            url: p.url,
            draft: p.draft,
            merged: p.merged,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PullRequestCreated {
    pub command_id: Uuid,
    pub pull_request: PullRequest,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CommentCreated {
    pub command_id: Uuid,
    pub repo: String,
    pub number: u64,
    pub comment_id: u64,
    /// The comment's web page.
    pub url: String,
}

fn required_token(headers: &HeaderMap, what: &str) -> Result<String, ApiError> {
    git_token(headers)?.ok_or_else(|| {
        ApiError::invalid(format!(
            "{what} needs a platform token in the X-Grove-Git-Token header"
        ))
    })
}

fn parse_number(raw: &str) -> Result<u64, ApiError> {
    let n = raw.parse::<u64>().map_err(|_| {
        ApiError::invalid(format!(
            "invalid pull request number {:?}: expected a positive integer",
            raw.chars().take(40).collect::<String>()
        ))
    })?;
    platform::validate_number(n)?;
    Ok(n)
}

fn unexpected(what: &str) -> ApiError {
    ApiError::Command(CommandError::new(
        ErrorKind::Internal,
        format!("unexpected result for {what}"),
    ))
}

/// Open a pull request from the workspace's branch (push it first).
#[utoipa::path(
    post,
    path = "/v1/workspaces/{id}/pulls",
    tag = "pull requests",
    request_body = CreatePullRequestRequest,
    params(
        ("id" = Uuid, Path),
        ("X-Grove-Git-Token" = String, Header, description = "A token of the git platform (GitHub) that may open pull requests; used for this request only, never stored past it or echoed"),
    ),
    responses(
        (status = 201, body = PullRequestCreated),
        (status = 400, body = ErrorResponse, description = "Invalid title, body, base, or no token"),
        (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse, description = "The platform refused the token"),
        (status = 404, body = ErrorResponse, description = "No such workspace, or the platform does not know the repository"),
        (status = 422, body = ErrorResponse, description = "The platform refused it (e.g. a pull request already exists for the branch), or the workspace is read-only or its repository is not on the platform"),
        (status = 429, body = ErrorResponse, description = "The platform's rate limit"),
        (status = 503, body = ErrorResponse, description = "No worker, or the platform is unavailable"),
    )
)]
pub async fn create_pull_request(
    State(state): St,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<CreatePullRequestRequest>,
) -> Result<(StatusCode, Json<PullRequestCreated>), ApiError> {
    let workspace_id = parse_id(&id, "workspace")?;
    visible_workspace(&state, &caller, workspace_id).await?;
    let token = required_token(&headers, "opening a pull request")?;
    let command = Command::CreatePullRequest(CreateCommand {
        workspace_id,
        base: req.base,
        title: req.title,
        body: req.body,
        draft: req.draft,
    });
    command.validate()?;
    let id = command_id(&caller, req.idempotency_key.as_deref())?;
    match state.submit(&command, id, Some(&token)).await? {
        CommandResult::PullRequest(pr) => Ok((
            StatusCode::CREATED,
            Json(PullRequestCreated {
                command_id: id,
                pull_request: pr.into(),
            }),
        )),
        _ => Err(unexpected("create_pull_request")),
    }
}

/// Read a pull request of the workspace's repository (asks the platform; no job).
#[utoipa::path(
    get,
    path = "/v1/workspaces/{id}/pulls/{number}",
    tag = "pull requests",
    params(
        ("id" = Uuid, Path),
        ("number" = u64, Path, minimum = 1, description = "The pull request number"),
        ("X-Grove-Git-Token" = Option<String>, Header, description = "A platform token, for a private repository; used for this request only"),
    ),
    responses(
        (status = 200, body = PullRequest),
        (status = 400, body = ErrorResponse),
        (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
        (status = 422, body = ErrorResponse, description = "The workspace's repository is not on the platform"),
        (status = 429, body = ErrorResponse),
        (status = 503, body = ErrorResponse, description = "The platform is unavailable or not configured"),
    )
)]
pub async fn get_pull_request(
    State(state): St,
    caller: Caller,
    headers: HeaderMap,
    Path((id, number)): Path<(String, String)>,
) -> Result<Json<PullRequest>, ApiError> {
    let workspace_id = parse_id(&id, "workspace")?;
    let ws = visible_workspace(&state, &caller, workspace_id).await?;
    let number = parse_number(&number)?;
    let token = git_token(&headers)?.map(GitToken::new);
    let platform = state.platform.as_deref().ok_or_else(|| {
        ApiError::Command(CommandError::new(
            ErrorKind::Unavailable,
            "no git platform is configured on this server (see GROVE_GITHUB_API_URL)",
        ))
    })?;
    let cache = {
        let mut conn = state.pool.acquire().await?;
        rows::repo_cache(&mut conn, ws.repo_cache_id).await?
    }
    .ok_or_else(|| ApiError::not_found(format!("the repo cache of workspace {} is gone", ws.id)))?;
    let repo = platform
        .locate(&cache.repo_url)
        .map_err(CommandError::from)?;
    let pr = platform
        .get_pull_request(&repo, number, token.as_ref())
        .await
        .map_err(CommandError::from)?;
    Ok(Json(pr.into()))
}

/// Comment on a pull request of the workspace's repository.
#[utoipa::path(
    post,
    path = "/v1/workspaces/{id}/pulls/{number}/comments",
    tag = "pull requests",
    request_body = CommentRequest,
    params(
        ("id" = Uuid, Path),
        ("number" = u64, Path, minimum = 1, description = "The pull request number"),
        ("X-Grove-Git-Token" = String, Header, description = "A platform token that may comment; used for this request only, never stored past it or echoed"),
    ),
    responses(
        (status = 201, body = CommentCreated),
        (status = 400, body = ErrorResponse),
        (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
        (status = 422, body = ErrorResponse),
        (status = 429, body = ErrorResponse),
        (status = 503, body = ErrorResponse),
    )
)]
pub async fn comment_pull_request(
    State(state): St,
    caller: Caller,
    headers: HeaderMap,
    Path((id, number)): Path<(String, String)>,
    JsonBody(req): JsonBody<CommentRequest>,
) -> Result<(StatusCode, Json<CommentCreated>), ApiError> {
    let workspace_id = parse_id(&id, "workspace")?;
    visible_workspace(&state, &caller, workspace_id).await?;
    let number = parse_number(&number)?;
    let token = required_token(&headers, "commenting on a pull request")?;
    let command = Command::CommentPullRequest(CommentCommand {
        workspace_id,
        number,
        body: req.body,
    });
    command.validate()?;
    let id = command_id(&caller, req.idempotency_key.as_deref())?;
    match state.submit(&command, id, Some(&token)).await? {
        CommandResult::PullRequestComment(c) => Ok((
            StatusCode::CREATED,
            Json(CommentCreated {
                command_id: id,
                repo: c.repo,
                number: c.number,
                comment_id: c.comment_id,
                url: c.url,
            }),
        )),
        _ => Err(unexpected("comment_pull_request")),
    }
}
