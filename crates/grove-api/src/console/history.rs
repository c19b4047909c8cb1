//! A workspace's history in the console (ADR 28, 29): a step's diff (its point against
//! the previous one), and the operators' rewind and fork, each a form that leads to a
//! confirmation page whose second POST submits the tool command.
//!
//! The diff is the `history_diff` tool submitted through the queue as the API submits
//! it; its file names and contents are the workspace's (attacker-written) and reach the
//! page only through the escaping templates, cut at [`SHOWN_DIFF_BYTES`]. Rewind and
//! fork are submitted with the signed-in operator recorded as their requester
//! (`grove_postgres::console_actions`). Every POST is checked in the same order: origin,
//! CSRF token, operator role, then the workspace's visibility (404 as a missing one).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Html;
use axum::Form;
use grove_core::commands::{Command, CommandResult};
use grove_core::history::ChangedFile;
use grove_core::tools::{ToolOp, ToolOutput, ToolRequest};
use grove_postgres::console_actions;
use minijinja::context;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::pages::{page, parse_workspace_id, v, visible};
use super::session::{check_origin, Viewer};
use super::timeline::Points;
use super::ConsoleError;
use crate::error::ApiError;
use crate::AppState;

type St = State<Arc<AppState>>;

/// Patch bytes a diff page shows; the rest is one `history_diff` call away.
pub const SHOWN_DIFF_BYTES: usize = 256 * 1024;
/// Changed files a diff page lists.
pub const SHOWN_FILES: usize = 1000;

/// One line of a unified diff, with its kind for the stylesheet.
#[derive(Serialize)]
struct PatchLine {
    /// `file`, `meta`, `hunk`, `add`, `del` or `ctx`.
    kind: &'static str,
    text: String,
}

fn patch_lines(patch: &str) -> Vec<PatchLine> {
    patch
        .lines()
        .map(|line| {
            let kind = if line.starts_with("diff --git") {
                "file"
            } else if line.starts_with("+++") || line.starts_with("---") {
                "meta"
            } else if line.starts_with("@@") {
                "hunk"
            } else if line.starts_with('+') {
                "add"
            } else if line.starts_with('-') {
                "del"
            } else {
                "ctx"
            };
            PatchLine {
                kind,
                text: line.to_owned(),
            }
        })
        .collect()
}

/// `text` cut to at most `max` bytes at a character boundary; whether it was cut.
fn cut(text: &str, max: usize) -> (&str, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let at = (0..=max)
        .rev()
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    (&text[..at], true)
}

/// A point number from the path: anything else is no point (404).
fn parse_point(raw: &str) -> Result<u64, ConsoleError> {
    raw.parse::<u64>()
        .ok()
        .filter(|_| raw.len() < 20)
        .ok_or(ConsoleError::NotFound)
}

async fn points_of(state: &AppState, id: Uuid) -> Result<Points, ConsoleError> {
    let mut conn = state.pool.acquire().await?;
    let events = grove_postgres::history::history_events(&mut conn, id).await?;
    Ok(Points::of(&events))
}

/// Runs a history tool on the workspace through the queue, as the API's tool route does.
async fn run_tool(
    state: &AppState,
    workspace_id: Uuid,
    op: ToolOp,
    requested_by: Option<&str>,
) -> Result<ToolOutput, ConsoleError> {
    let command = Command::Tool(ToolRequest { workspace_id, op });
    command
        .validate()
        .map_err(|e| ConsoleError::BadRequest(e.to_string()))?;
    let command_id = Uuid::now_v7();
    let result = match requested_by {
        None => state.submit(&command, command_id, None).await?,
        Some(who) => {
            let mut wake = state.notifier.subscribe(command_id);
            console_actions::submit_requested(
                &state.pool,
                &command,
                command_id,
                who,
                &mut wake,
                state.wait,
            )
            .await
            .map_err(ApiError::from)?
        }
    };
    match result {
        CommandResult::Tool(output) => Ok(output),
        _ => Err(unexpected("a history tool")),
    }
}

/// A command answered with a result of another kind (a bug): 500 `internal`.
fn unexpected(what: &str) -> ConsoleError {
    ApiError::from(grove_core::error::CommandError::new(
        grove_core::error::ErrorKind::Internal,
        format!("unexpected result for {what}"),
    ))
    .into()
}

/// A step's diff as the page shows it: bounded.
#[derive(Serialize, Default)]
struct DiffView {
    /// The first [`SHOWN_FILES`] changed files.
    files: Vec<ChangedFile>,
    files_total: usize,
    /// The first [`SHOWN_DIFF_BYTES`] of the patch, a line each.
    lines: Vec<PatchLine>,
    patch_bytes: usize,
    /// Cut here, at [`SHOWN_DIFF_BYTES`].
    cut_here: bool,
    /// Cut by the tool, at its own limit.
    cut_by_tool: bool,
}

impl DiffView {
    fn of(mut files: Vec<ChangedFile>, patch: &str, truncated: bool) -> Self {
        let files_total = files.len();
        files.truncate(SHOWN_FILES);
        let (shown, cut_here) = cut(patch, SHOWN_DIFF_BYTES);
        DiffView {
            files,
            files_total,
            lines: patch_lines(shown),
            patch_bytes: patch.len(),
            cut_here,
            cut_by_tool: truncated,
        }
    }
}

/// The `history_diff` tool from point `from` to point `to`.
async fn diff_between(
    state: &AppState,
    id: Uuid,
    from: u64,
    to: u64,
) -> Result<DiffView, ConsoleError> {
    let op = ToolOp::HistoryDiff {
        since: from.to_string(),
        until: Some(to.to_string()),
    };
    match run_tool(state, id, op, None).await? {
        ToolOutput::HistoryDiff {
            files,
            patch,
            truncated,
            ..
        } => Ok(DiffView::of(files, &patch, truncated)),
        _ => Err(unexpected("history_diff")),
    }
}

/// A step's diff: point `n` against the point before it, as a file list and a unified
/// diff (cut at [`SHOWN_DIFF_BYTES`]).
pub async fn point_diff(
    State(state): St,
    viewer: Viewer,
    Path((raw, n)): Path<(String, String)>,
) -> Result<Html<String>, ConsoleError> {
    let id = parse_workspace_id(&raw)?;
    let n = parse_point(&n)?;
    let ws = visible(&state, &viewer, id).await?;
    let points = points_of(&state, id).await?;
    let previous = points.previous(n);
    let diff = match previous {
        Some(p) => diff_between(&state, id, p, n).await?,
        None => DiffView::default(),
    };
    page(
        &viewer,
        "point_diff.html",
        context! {
            nav => "workspaces", ws => v(&ws), number => n, previous,
            live => points.is_live(n), diff => v(&diff),
            shown_bytes => SHOWN_DIFF_BYTES, shown_files => SHOWN_FILES,
        },
    )
}

/// The first form of a rewind or fork.
#[derive(Deserialize)]
pub struct ActionForm {
    #[serde(default)]
    csrf: String,
    /// A fork's new scope (conversation or task id).
    #[serde(default)]
    scope: Option<String>,
}

/// Origin, CSRF token, role, then the workspace: what every action POST checks first.
async fn action_checks(
    state: &AppState,
    viewer: &Viewer,
    headers: &HeaderMap,
    form: &ActionForm,
    raw: &str,
    n: &str,
) -> Result<(grove_core::model::WorkspaceRow, u64), ConsoleError> {
    check_origin(headers)?;
    viewer.check_csrf(&form.csrf)?;
    viewer.require_operator()?;
    let id = parse_workspace_id(raw)?;
    let n = parse_point(n)?;
    Ok((visible(state, viewer, id).await?, n))
}

fn fork_scope(form: &ActionForm) -> Result<String, ConsoleError> {
    let scope = form.scope.as_deref().unwrap_or("").trim().to_owned();
    grove_core::validate::validate_branch_scope_id("scope", &scope)
        .map_err(|e| ConsoleError::BadRequest(e.to_string()))?;
    Ok(scope)
}

/// What a confirmation page says an action will do.
fn confirm_page(
    viewer: &Viewer,
    ws: &grove_core::model::WorkspaceRow,
    action: &str,
    n: u64,
    scope: Option<&str>,
) -> Result<Html<String>, ConsoleError> {
    page(
        viewer,
        "confirm.html",
        context! { nav => "workspaces", ws => v(ws), action, number => n, scope },
    )
}

/// Rewind, step 1: what it will do, and the button that does it.
pub async fn rewind_ask(
    State(state): St,
    viewer: Viewer,
    headers: HeaderMap,
    Path((raw, n)): Path<(String, String)>,
    Form(form): Form<ActionForm>,
) -> Result<Html<String>, ConsoleError> {
    let (ws, n) = action_checks(&state, &viewer, &headers, &form, &raw, &n).await?;
    confirm_page(&viewer, &ws, "rewind", n, None)
}

/// Fork, step 1: the new scope checked, what it will do, and the button that does it.
pub async fn fork_ask(
    State(state): St,
    viewer: Viewer,
    headers: HeaderMap,
    Path((raw, n)): Path<(String, String)>,
    Form(form): Form<ActionForm>,
) -> Result<Html<String>, ConsoleError> {
    let (ws, n) = action_checks(&state, &viewer, &headers, &form, &raw, &n).await?;
    let scope = fork_scope(&form)?;
    confirm_page(&viewer, &ws, "fork", n, Some(&scope))
}

/// Rewind, step 2: the `rewind` tool as the operator; the new point, or a typed error.
pub async fn rewind_confirm(
    State(state): St,
    viewer: Viewer,
    headers: HeaderMap,
    Path((raw, n)): Path<(String, String)>,
    Form(form): Form<ActionForm>,
) -> Result<Html<String>, ConsoleError> {
    let (ws, n) = action_checks(&state, &viewer, &headers, &form, &raw, &n).await?;
    let op = ToolOp::Rewind {
        point: n.to_string(),
    };
    let who = viewer.caller.user_id.clone();
    let out = run_tool(&state, ws.id, op, Some(&who)).await?;
    page(
        &viewer,
        "done.html",
        context! { nav => "workspaces", ws => v(&ws), action => "rewind", out => v(&out) },
    )
}

/// Fork, step 2: the `fork` tool as the operator; a link to the new workspace.
pub async fn fork_confirm(
    State(state): St,
    viewer: Viewer,
    headers: HeaderMap,
    Path((raw, n)): Path<(String, String)>,
    Form(form): Form<ActionForm>,
) -> Result<Html<String>, ConsoleError> {
    let (ws, n) = action_checks(&state, &viewer, &headers, &form, &raw, &n).await?;
    let scope = fork_scope(&form)?;
    let op = ToolOp::Fork {
        point: n.to_string(),
        scope: scope.clone(),
    };
    let who = viewer.caller.user_id.clone();
    let out = run_tool(&state, ws.id, op, Some(&who)).await?;
    page(
        &viewer,
        "done.html",
        context! { nav => "workspaces", ws => v(&ws), action => "fork", scope, out => v(&out) },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_lines_are_classified_and_cut_at_a_character_boundary() {
        let kinds: Vec<&str> =
            patch_lines("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n same\n")
                .iter()
                .map(|l| l.kind)
                .collect();
        assert_eq!(kinds, ["file", "meta", "meta", "hunk", "del", "add", "ctx"]);
        let text = "é".repeat(10);
        let (shown, was_cut) = cut(&text, 5);
        assert!(was_cut && shown == "éé");
        assert_eq!(cut("short", 5), ("short", false));
    }

    #[test]
    fn a_diff_view_lists_a_bounded_number_of_files_and_counts_them_all() {
        let files: Vec<ChangedFile> = (0..SHOWN_FILES + 5)
            .map(|i| ChangedFile {
                path: format!("f{i}"),
                status: "added".into(),
            })
            .collect();
        let view = DiffView::of(files, "+x\n", true);
        assert_eq!(view.files.len(), SHOWN_FILES);
        assert_eq!(view.files_total, SHOWN_FILES + 5);
        assert!(view.cut_by_tool && !view.cut_here);
    }

    #[test]
    fn a_commands_typed_error_keeps_its_kind_and_status() {
        use grove_core::error::{CommandError, ErrorKind};
        let page =
            |kind, msg: &str| ConsoleError::from(ApiError::from(CommandError::new(kind, msg)));
        let busy = page(
            ErrorKind::Conflict,
            "workspace w is running another command",
        );
        assert_eq!(busy.status(), axum::http::StatusCode::CONFLICT);
        assert_eq!(
            busy.to_string(),
            "conflict: workspace w is running another command"
        );
        let unknown = page(ErrorKind::NotFound, "point \"9\" is not in the history");
        assert_eq!(unknown.status(), axum::http::StatusCode::NOT_FOUND);
        assert!(unknown.to_string().starts_with("not_found: "));
    }

    #[test]
    fn a_point_in_a_path_is_a_plain_number() {
        assert_eq!(parse_point("12").ok(), Some(12));
        for bad in ["", "-1", "1a", "99999999999999999999999", "abc"] {
            assert!(
                matches!(parse_point(bad), Err(ConsoleError::NotFound)),
                "{bad}"
            );
        }
    }
}
