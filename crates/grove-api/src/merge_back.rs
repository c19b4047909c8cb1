//! Merge-back over HTTP: what a task workspace would bring into an edit workspace
//! (`GET /v1/workspaces/{id}/merge-back/{task_id}`), and bringing it
//! (`POST /v1/workspaces/{id}/merge-back`). Both workspaces must be visible to the
//! caller (404 otherwise, before anything is enqueued); the worker checks that they
//! belong to one user, project and repository. A conflict answers 409 with every
//! conflicting path in `error.paths`, the edit workspace unchanged.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use grove_core::commands::{self, Command, CommandResult};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::merge_back as core;
use serde::{Deserialize, Serialize};
use utoipa::{OpenApi, ToSchema};
use uuid::Uuid;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorResponse};
use crate::extract::{parse_id, JsonBody};
use crate::request::{command_id, visible_workspace};
use crate::AppState;

type St = State<Arc<AppState>>;

/// The merge-back routes, merged into the API's router.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/workspaces/{id}/merge-back", post(merge_back))
        .route(
            "/v1/workspaces/{id}/merge-back/{task_id}",
            get(merge_back_diff),
        )
}

/// The merge-back part of the OpenAPI document, merged into [`crate::ApiDoc`].
#[derive(OpenApi)]
#[openapi(paths(merge_back_diff, merge_back))]
pub struct MergeBackDoc;

/// How the task's commits reach the edit branch.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// A fast-forward when the edit branch has not moved since the task branched off,
    /// else a merge commit with both heads as parents.
    Merge,
    /// Each task commit the edit branch lacks, replayed in order as a new commit
    /// (author and message kept, `(cherry picked from commit <id>)` appended).
    #[serde(alias = "cherry-pick")]
    CherryPick,
}

impl From<Strategy> for core::MergeStrategy {
    fn from(s: Strategy) -> Self {
        match s {
            Strategy::Merge => Self::Merge,
            Strategy::CherryPick => Self::CherryPick,
        }
    }
}

impl From<core::MergeStrategy> for Strategy {
    fn from(s: core::MergeStrategy) -> Self {
        match s {
            core::MergeStrategy::Merge => Self::Merge,
            core::MergeStrategy::CherryPick => Self::CherryPick,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeBackRequest {
    /// The task workspace whose commits are brought in.
    pub task_workspace_id: Uuid,
    pub strategy: Strategy,
    /// The same key twice is one merge-back; the second call gets the first's outcome.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// A task commit the edit branch lacks.
#[derive(Debug, Serialize, ToSchema)]
pub struct BranchCommit {
    pub id: String,
    /// The first line of its message.
    pub summary: String,
    pub author_name: String,
    pub author_email: String,
    /// Author time, seconds since the epoch.
    pub time: i64,
}

impl From<core::BranchCommit> for BranchCommit {
    fn from(c: core::BranchCommit) -> Self {
        Self {
            id: c.id,
            summary: c.summary,
            author_name: c.author_name,
            author_email: c.author_email,
            time: c.time,
        }
    }
}

/// A file the task changed since the merge base.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChangedFile {
    pub path: String,
    /// `added`, `deleted`, `modified`, `renamed`, `copied` or `typechange`.
    pub status: String,
    /// The path before a rename or copy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old_path: Option<String>,
    pub insertions: u64,
    pub deletions: u64,
    pub binary: bool,
}

impl From<core::ChangedFile> for ChangedFile {
    fn from(f: core::ChangedFile) -> Self {
        Self {
            path: f.path,
            status: f.status,
            old_path: f.old_path,
            insertions: f.insertions,
            deletions: f.deletions,
            binary: f.binary,
        }
    }
}

/// What a merge-back would bring: the three-dot diff `edit...task`.
#[derive(Debug, Serialize, ToSchema)]
pub struct MergeBackDiff {
    pub edit_workspace_id: Uuid,
    pub task_workspace_id: Uuid,
    pub edit_branch: String,
    pub edit_head: String,
    pub task_branch: String,
    pub task_head: String,
    /// Null when the histories are unrelated.
    pub merge_base: Option<String>,
    /// Oldest first; at most 1000 (`commits_total` counts all).
    pub commits: Vec<BranchCommit>,
    pub commits_total: usize,
    /// Sorted by path; at most 5000 (`files_total` counts all).
    pub files: Vec<ChangedFile>,
    pub files_total: usize,
    pub insertions: u64,
    pub deletions: u64,
    /// A merge would be a fast-forward.
    pub fast_forward: bool,
    /// The task has nothing the edit branch lacks.
    pub up_to_date: bool,
    /// The task workspace has uncommitted changes; only commits are merged back.
    pub task_dirty: bool,
}

impl From<core::MergeBackDiff> for MergeBackDiff {
    fn from(d: core::MergeBackDiff) -> Self {
        Self {
            edit_workspace_id: d.edit_workspace_id,
            task_workspace_id: d.task_workspace_id,
            edit_branch: d.edit_branch,
            edit_head: d.edit_head,
            task_branch: d.task_branch,
            task_head: d.task_head,
            merge_base: d.merge_base,
            commits: d.commits.into_iter().map(Into::into).collect(),
            commits_total: d.commits_total,
            files: d.files.into_iter().map(Into::into).collect(),
            files_total: d.files_total,
            insertions: d.insertions,
            deletions: d.deletions,
            fast_forward: d.fast_forward,
            up_to_date: d.up_to_date,
            task_dirty: d.task_dirty,
        }
    }
}

/// What a merge-back did to the edit branch.
#[derive(Debug, Serialize, ToSchema)]
pub struct MergeBackResult {
    pub edit_workspace_id: Uuid,
    pub task_workspace_id: Uuid,
    pub strategy: Strategy,
    pub edit_branch: String,
    pub previous_head: String,
    /// Equal to `previous_head` when the edit branch was up to date.
    pub new_head: String,
    /// The task commits brought in, oldest first.
    pub commits: Vec<BranchCommit>,
    /// Commits made on the edit branch: the merge commit or the cherry-picked ones.
    pub created: Vec<String>,
    /// Cherry-picked task commits whose change the edit branch already had.
    pub skipped: Vec<String>,
    pub fast_forward: bool,
    pub up_to_date: bool,
    /// Paths that differ between the previous and the new head.
    pub files: Vec<String>,
}

impl From<core::MergeBackReport> for MergeBackResult {
    fn from(r: core::MergeBackReport) -> Self {
        Self {
            edit_workspace_id: r.edit_workspace_id,
            task_workspace_id: r.task_workspace_id,
            strategy: r.strategy.into(),
            edit_branch: r.edit_branch,
            previous_head: r.previous_head,
            new_head: r.new_head,
            commits: r.commits.into_iter().map(Into::into).collect(),
            created: r.created,
            skipped: r.skipped,
            fast_forward: r.fast_forward,
            up_to_date: r.up_to_date,
            files: r.files,
        }
    }
}

fn unexpected(what: &str) -> ApiError {
    ApiError::Command(CommandError::new(
        ErrorKind::Internal,
        format!("unexpected result for {what}"),
    ))
}

/// What a merge-back of a task workspace into this (edit) workspace would bring: the
/// task's commits the edit branch lacks and the files it changed. Changes nothing.
#[utoipa::path(
    get,
    path = "/v1/workspaces/{id}/merge-back/{task_id}",
    tag = "merge-back",
    params(
        ("id" = Uuid, Path, description = "The edit workspace (the target)"),
        ("task_id" = Uuid, Path, description = "The task workspace"),
    ),
    responses(
        (status = 200, body = MergeBackDiff),
        (status = 400, body = ErrorResponse, description = "Invalid id"),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse, description = "Either workspace is unknown or another user's"),
        (status = 409, body = ErrorResponse, description = "A workspace is evicted, or a lock timed out"),
        (status = 422, body = ErrorResponse, description = "The two cannot be merged: other users, projects or repositories, a read-only target, a source that is no task workspace"),
    )
)]
pub async fn merge_back_diff(
    State(state): St,
    caller: Caller,
    Path((id, task_id)): Path<(String, String)>,
) -> Result<Json<MergeBackDiff>, ApiError> {
    let edit = parse_id(&id, "workspace")?;
    let task = parse_id(&task_id, "workspace")?;
    visible_workspace(&state, &caller, edit).await?;
    visible_workspace(&state, &caller, task).await?;
    let command = Command::MergeBackDiff {
        edit_workspace_id: edit,
        task_workspace_id: task,
    };
    command.validate()?;
    match state.submit(&command, Uuid::now_v7(), None).await? {
        CommandResult::MergeBackDiff(d) => Ok(Json(d.into())),
        _ => Err(unexpected("merge-back diff")),
    }
}

/// Bring a task workspace's commits into this (edit) workspace's branch, by merge or
/// cherry-pick. The edit workspace must have no uncommitted changes to tracked files
/// (422 with the paths); untracked files are kept, unless the change would overwrite
/// one (a conflict). A conflict answers 409 with every conflicting path and leaves the
/// edit workspace exactly as it was.
#[utoipa::path(
    post,
    path = "/v1/workspaces/{id}/merge-back",
    tag = "merge-back",
    params(("id" = Uuid, Path, description = "The edit workspace (the target)")),
    request_body = MergeBackRequest,
    responses(
        (status = 200, body = MergeBackResult),
        (status = 400, body = ErrorResponse, description = "Invalid id or key, or the same workspace twice"),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse, description = "Either workspace is unknown or another user's"),
        (status = 409, body = ErrorResponse, description = "Conflict: `error.paths` lists every conflicting path and nothing changed; or a workspace is evicted, or a lock timed out"),
        (status = 422, body = ErrorResponse, description = "Refused: uncommitted changes in the edit workspace (`error.paths`), a read-only target, other users, projects or repositories, HEAD off its branch, a merge commit to cherry-pick"),
    )
)]
pub async fn merge_back(
    State(state): St,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<MergeBackRequest>,
) -> Result<Json<MergeBackResult>, ApiError> {
    let edit = parse_id(&id, "workspace")?;
    visible_workspace(&state, &caller, edit).await?;
    visible_workspace(&state, &caller, req.task_workspace_id).await?;
    let command = Command::MergeBack(commands::MergeBack {
        edit_workspace_id: edit,
        task_workspace_id: req.task_workspace_id,
        strategy: req.strategy.into(),
    });
    command.validate()?;
    let id = command_id(&caller, req.idempotency_key.as_deref())?;
    match state.submit(&command, id, None).await? {
        CommandResult::MergedBack(r) => Ok(Json(r.into())),
        _ => Err(unexpected("merge-back")),
    }
}
