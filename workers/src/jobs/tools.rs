//! `tool`: one agent tool operation on a workspace (file and search tools through
//! `grove-tools`, git tools through the git port; remote workspaces in
//! `remote_tools`).

use std::path::PathBuf;

use grove_core::commands::{CommandResult, DEFAULT_MAX_OUTPUT_BYTES};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::events::Event;
use grove_core::model::WorkspaceRow;
use grove_core::placement::Placement;
use grove_core::ports::{CommitRequest, GitToken, PushRequest};
use grove_core::tools::{DiffAgainst, ToolOp, ToolOutput, ToolRequest};
use grove_postgres::rows;
use grove_tools::{ToolError, Workspace as ToolWorkspace};
use uuid::Uuid;

use crate::context::{blocking, correlation_of, internal, store_error, Handled, JobContext};

/// Largest patch a `git_diff` returns (the rest is cut and flagged).
pub const MAX_DIFF_BYTES: usize = DEFAULT_MAX_OUTPUT_BYTES as usize;
/// Log entries when a `git_log` does not say.
pub const DEFAULT_LOG_ENTRIES: usize = 20;

impl JobContext {
    /// One agent tool operation. Reads take the workspace's command lock shared, writes
    /// exclusive (as execs of kind `read` and `write` do). File and search operations
    /// run in `grove-tools` (every path resolved beneath the workspace root), git ones
    /// through `GitPort`. A file write is a `workspace.file_written` event (path, size,
    /// SHA-256; never the content), a commit `workspace.committed`, a push
    /// `workspace.pushed`; a write that changes whether the workspace is dirty adds
    /// `workspace.dirty_changed`, as a mutating exec does.
    pub async fn tool(
        &self,
        req: &ToolRequest,
        token: Option<&GitToken>,
    ) -> Result<Handled, CommandError> {
        let op = &req.op;
        let ws = self.workspace(req.workspace_id).await?;
        if op.is_write() && !ws.capabilities.writable {
            return Err(CommandError::new(
                ErrorKind::Rejected,
                format!(
                    "workspace {} is read-only ({} mode): {} is a write tool and is refused",
                    ws.id,
                    ws.mode.as_str(),
                    op.name()
                ),
            ));
        }
        if op.is_history() {
            return self.history_tool(req, token).await;
        }
        if Placement::of_node(&ws.node).is_remote() {
            return self.remote_tool(ws, op).await;
        }
        let (ws, lock) = self.lock_workspace(ws.id, !op.is_write()).await?;
        let output = match self.run_tool(&ws, op, token).await {
            Ok(output) => output,
            Err(e) => {
                lock.release().await.ok();
                return Err(e);
            }
        };
        let mut events = tool_events(ws.id, op, &output);
        if op.is_write() {
            events.extend(
                self.after_tool(&ws, op, super::history::PointPrefetch::default())
                    .await,
            );
        }
        Ok(Handled {
            result: Ok(CommandResult::Tool(output)),
            events,
            locks: vec![lock],
            correlation: correlation_of(&ws),
        })
    }

    /// Runs `op` on a local workspace the caller has locked (no events, no lock).
    pub(crate) async fn run_tool(
        &self,
        ws: &WorkspaceRow,
        op: &ToolOp,
        token: Option<&GitToken>,
    ) -> Result<ToolOutput, CommandError> {
        let dir = PathBuf::from(&ws.local_path);
        let writable = ws.capabilities.writable;
        // Paths given to git are checked against the root like every other path.
        let paths = match op {
            ToolOp::GitDiff { paths, .. } | ToolOp::GitCommit { paths, .. } => paths.clone(),
            _ => Vec::new(),
        };
        let checked = {
            let (dir, op) = (dir.clone(), op.clone());
            tokio::task::spawn_blocking(move || -> Result<_, ToolError> {
                let tools = ToolWorkspace::open(&dir, writable)?;
                if is_git_tool(&op) {
                    Ok((None, tools.check_paths(&paths)?))
                } else {
                    Ok((Some(tools.run(&op)?), Vec::new()))
                }
            })
            .await
            .map_err(|e| internal(format!("tool task failed: {e}")))?
            .map_err(CommandError::from)?
        };
        match checked {
            (Some(output), _) => Ok(output),
            (None, paths) => self.run_git_tool(ws, op, paths, token).await,
        }
    }

    /// A git tool through the git port, its paths already checked against the root.
    async fn run_git_tool(
        &self,
        ws: &WorkspaceRow,
        op: &ToolOp,
        paths: Vec<String>,
        token: Option<&GitToken>,
    ) -> Result<ToolOutput, CommandError> {
        let dir = PathBuf::from(&ws.local_path);
        let git = self.git.clone();
        let output = match op.clone() {
            ToolOp::GitStatus => ToolOutput::Status(blocking(move || git.status(&dir)).await?),
            ToolOp::GitDiff { against, .. } => {
                let against = match against {
                    DiffAgainst::Base => DiffAgainst::Ref(ws.base_commit.clone()),
                    other => other,
                };
                ToolOutput::Diff(
                    blocking(move || git.diff(&dir, &against, &paths, MAX_DIFF_BYTES)).await?,
                )
            }
            ToolOp::GitLog { max_count } => ToolOutput::Log {
                entries: blocking(move || git.log(&dir, max_count.unwrap_or(DEFAULT_LOG_ENTRIES)))
                    .await?,
            },
            ToolOp::GitCommit {
                message,
                author_name,
                author_email,
                ..
            } => {
                let committed = blocking(move || {
                    let author = author_name.as_deref().zip(author_email.as_deref());
                    git.commit(&CommitRequest {
                        workspace_dir: &dir,
                        message: &message,
                        paths: &paths,
                        author,
                    })
                })
                .await?;
                self.keep_git_owner(ws).await;
                ToolOutput::Committed(committed)
            }
            ToolOp::GitPush {
                branch,
                force_with_lease,
                expect,
                set_upstream,
            } => {
                let token = token.cloned();
                let url = self.recorded_url(ws).await?;
                let pushed = blocking(move || {
                    git.push(&PushRequest {
                        workspace_dir: &dir,
                        remote_url: &url,
                        branch: branch.as_deref(),
                        force_with_lease,
                        expect: expect.as_deref(),
                        set_upstream,
                        token: token.as_ref(),
                    })
                })
                .await?;
                self.keep_git_owner(ws).await;
                ToolOutput::Pushed(pushed)
            }
            other => return Err(internal(format!("{} is not a git tool", other.name()))),
        };
        Ok(output)
    }

    /// The URL grove recorded for the workspace's repository (its repo cache's
    /// upstream): the only place a push from the workspace goes.
    async fn recorded_url(&self, ws: &WorkspaceRow) -> Result<String, CommandError> {
        let mut conn = self.conn().await?;
        rows::repo_cache(&mut conn, ws.repo_cache_id)
            .await
            .map_err(store_error)?
            .map(|c| c.repo_url)
            .ok_or_else(|| {
                CommandError::new(
                    ErrorKind::NotFound,
                    format!("the repo cache of workspace {} is not recorded", ws.id),
                )
            })
    }

    /// A workspace handed to the sandbox user keeps its `.git` owned by that user after
    /// the worker (root) committed or pushed in it, so git inside the runtime still
    /// works. Failures are logged: the commit itself stands.
    pub(crate) async fn keep_git_owner(&self, ws: &WorkspaceRow) {
        use std::os::unix::fs::MetadataExt;
        let dir = PathBuf::from(&ws.local_path);
        let _ = tokio::task::spawn_blocking(move || {
            let Ok(meta) = std::fs::symlink_metadata(&dir) else {
                return;
            };
            let git_dir = dir.join(".git");
            let owned = std::fs::symlink_metadata(&git_dir)
                .is_ok_and(|g| (g.uid(), g.gid()) == (meta.uid(), meta.gid()));
            // SAFETY: geteuid has no preconditions and cannot fail.
            if meta.uid() == unsafe { libc::geteuid() } && owned {
                return;
            }
            if let Err(e) = grove_git::tree::chown_tree(&git_dir, meta.uid(), meta.gid()) {
                tracing::warn!(error = %e, "re-owning .git after a git tool failed");
            }
        })
        .await;
    }
}

fn is_git_tool(op: &ToolOp) -> bool {
    matches!(
        op,
        ToolOp::GitStatus
            | ToolOp::GitDiff { .. }
            | ToolOp::GitLog { .. }
            | ToolOp::GitCommit { .. }
            | ToolOp::GitPush { .. }
    )
}

/// The events of a tool's output: `workspace.file_written`, `workspace.committed` or
/// `workspace.pushed`; none for a read.
pub(crate) fn tool_events(workspace_id: Uuid, op: &ToolOp, output: &ToolOutput) -> Vec<Event> {
    let event = match output {
        ToolOutput::Written(w) => Event::WorkspaceFileWritten {
            workspace_id,
            path: w.path.clone(),
            op: op.name().to_string(),
            size_bytes: w.size_bytes,
            sha256: w.sha256.clone(),
            created: w.created,
        },
        ToolOutput::Committed(c) => Event::WorkspaceCommitted {
            workspace_id,
            commit: c.commit.clone(),
            branch: c.branch.clone(),
            files: c.files.clone(),
        },
        ToolOutput::Pushed(p) => Event::WorkspacePushed {
            workspace_id,
            branch: p.branch.clone(),
            commit: p.commit.clone(),
            previous: p.previous.clone(),
            forced: p.forced,
        },
        _ => return Vec::new(),
    };
    vec![event]
}
