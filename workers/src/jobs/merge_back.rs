//! Merge-back handlers: the diff between a task workspace and an edit workspace (a
//! read), and bringing the task's commits into the edit branch (jobs `merge_back_diff`
//! and `merge_back`, on the edit workspace's node).
//!
//! Locks: the `workspace_commands` lock of both workspaces, always taken in ascending
//! order of workspace id whichever role each plays, so two merge-backs between the same
//! pair in opposite directions cannot deadlock. The target's is exclusive for a
//! merge-back (it changes files, index and branch, like a write exec) and shared for a
//! diff; the task's is shared for both (it is only read, concurrently with its reads).

use std::path::PathBuf;

use grove_core::commands::{CommandResult, MergeBack};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::events::Event;
use grove_core::history::Operation;
use grove_core::merge_back::{check_pair, MergeBackError};
use grove_core::model::WorkspaceRow;
use grove_core::ports::MergeBackRequest;
use grove_postgres::locks::AdvisoryLock;
use uuid::Uuid;

use crate::context::{correlation_of, internal, release_all, Handled, JobContext};

impl JobContext {
    /// Locks both workspaces (ascending id order), re-reads their rows under the locks
    /// and checks they may be merged. On any failure the locks taken are released.
    async fn lock_merge_pair(
        &self,
        edit_id: Uuid,
        task_id: Uuid,
        edit_exclusive: bool,
    ) -> Result<(WorkspaceRow, WorkspaceRow, Vec<AdvisoryLock>), CommandError> {
        if edit_id == task_id {
            return Err(CommandError::new(
                ErrorKind::InvalidInput,
                "a workspace cannot be merged back into itself",
            ));
        }
        // Refuse a read-only target before waiting for any lock, as write tools do.
        let edit = self.workspace(edit_id).await?;
        let task = self.workspace(task_id).await?;
        super::host_only(&edit, "merge-back")?;
        super::host_only(&task, "merge-back")?;
        check_pair(&edit, &task)?;
        let mut order = [(edit_id, !edit_exclusive), (task_id, true)];
        order.sort_by_key(|(id, _)| *id);
        let mut locks = Vec::new();
        let mut rows = Vec::new();
        for (id, shared) in order {
            match self.lock_workspace(id, shared).await {
                Ok((row, lock)) => {
                    rows.push(row);
                    locks.push(lock);
                }
                Err(e) => {
                    release_all(locks).await;
                    return Err(e);
                }
            }
        }
        let pick = |id: Uuid| rows.iter().find(|r| r.id == id).cloned();
        let (Some(edit), Some(task)) = (pick(edit_id), pick(task_id)) else {
            release_all(locks).await;
            return Err(internal("a locked workspace row went missing"));
        };
        if let Err(e) = check_pair(&edit, &task) {
            release_all(locks).await;
            return Err(e);
        }
        Ok((edit, task, locks))
    }

    /// What a merge-back of `task_id` into `edit_id` would bring. Appends no events.
    pub async fn merge_back_diff(
        &self,
        edit_id: Uuid,
        task_id: Uuid,
    ) -> Result<Handled, CommandError> {
        let (edit, task, locks) = self.lock_merge_pair(edit_id, task_id, false).await?;
        let git = self.git.clone();
        let (ed, eb, td, tb) = paths_of(&edit, &task);
        let result = run_git(move || {
            git.merge_back_diff(&MergeBackRequest {
                edit_dir: &ed,
                edit_branch: &eb,
                task_dir: &td,
                task_branch: &tb,
                journal: None,
            })
        })
        .await;
        let mut diff = match result {
            Ok(d) => d,
            Err(e) => {
                release_all(locks).await;
                return Err(e.into());
            }
        };
        diff.edit_workspace_id = edit.id;
        diff.task_workspace_id = task.id;
        Ok(Handled {
            result: Ok(CommandResult::MergeBackDiff(diff)),
            events: Vec::new(),
            locks,
            correlation: correlation_of(&edit),
        })
    }

    /// Brings the task's commits into the edit branch. A clean result is
    /// `workspace.merged_back` (plus `workspace.dirty_changed` if that changed, and the
    /// history point of the merged tree, ADR 28); a
    /// conflict fails the command as `conflict` with the paths and is recorded as
    /// `workspace.merge_back_conflicted`, the target untouched; an up-to-date target
    /// appends nothing.
    pub async fn merge_back(&self, m: &MergeBack) -> Result<Handled, CommandError> {
        let (edit, task, locks) = self
            .lock_merge_pair(m.edit_workspace_id, m.task_workspace_id, true)
            .await?;
        let correlation = correlation_of(&edit);
        let git = self.git.clone();
        let (ed, eb, td, tb) = paths_of(&edit, &task);
        let strategy = m.strategy;
        let journal = self.journal_path(edit.id);
        let result = run_git(move || {
            git.merge_back(
                &MergeBackRequest {
                    edit_dir: &ed,
                    edit_branch: &eb,
                    task_dir: &td,
                    task_branch: &tb,
                    journal: Some(&journal),
                },
                strategy,
            )
        })
        .await;
        let mut report = match result {
            Ok(r) => r,
            Err(MergeBackError::Conflict { paths, commit }) => {
                let event = Event::WorkspaceMergeBackConflicted {
                    workspace_id: edit.id,
                    task_workspace_id: task.id,
                    strategy,
                    paths: paths.clone(),
                    commit: commit.clone(),
                };
                return Ok(Handled {
                    result: Err(MergeBackError::Conflict { paths, commit }.into()),
                    events: vec![event],
                    locks,
                    correlation,
                });
            }
            Err(e) => {
                release_all(locks).await;
                return Err(e.into());
            }
        };
        report.edit_workspace_id = edit.id;
        report.task_workspace_id = task.id;
        let mut events = Vec::new();
        if report.new_head != report.previous_head {
            // Files and objects were written by the worker: a workspace handed to the
            // sandbox user stays that user's.
            self.keep_tree_owner(&edit).await;
            events.push(Event::WorkspaceMergedBack {
                workspace_id: edit.id,
                task_workspace_id: task.id,
                strategy,
                branch: report.edit_branch.clone(),
                previous_head: report.previous_head.clone(),
                new_head: report.new_head.clone(),
                commits: report.commits.iter().map(|c| c.id.clone()).collect(),
                created: report.created.clone(),
                fast_forward: report.fast_forward,
            });
            let operation = Operation::MergeBack {
                task_workspace_id: task.id,
                commits: u32::try_from(report.commits.len()).unwrap_or(u32::MAX),
                fast_forward: report.fast_forward,
            };
            events.extend(self.after_change(&edit, operation).await);
        }
        Ok(Handled {
            result: Ok(CommandResult::MergedBack(report)),
            events,
            locks,
            correlation,
        })
    }

    /// Gives every entry of a workspace to the owner of its root when the worker wrote
    /// into a workspace it does not own (one handed to the sandbox user). Failures are
    /// logged: the merge itself stands.
    async fn keep_tree_owner(&self, ws: &WorkspaceRow) {
        use std::os::unix::fs::MetadataExt;
        let dir = PathBuf::from(&ws.local_path);
        let _ = tokio::task::spawn_blocking(move || {
            let Ok(meta) = std::fs::symlink_metadata(&dir) else {
                return;
            };
            // SAFETY: geteuid has no preconditions and cannot fail.
            if meta.uid() == unsafe { libc::geteuid() } {
                return;
            }
            if let Err(e) = grove_git::tree::chown_tree(&dir, meta.uid(), meta.gid()) {
                tracing::warn!(error = %e, "re-owning a workspace after a merge-back failed");
            }
        })
        .await;
    }
}

fn paths_of(edit: &WorkspaceRow, task: &WorkspaceRow) -> (PathBuf, String, PathBuf, String) {
    (
        PathBuf::from(&edit.local_path),
        edit.branch_name.clone().unwrap_or_default(),
        PathBuf::from(&task.local_path),
        task.branch_name.clone().unwrap_or_default(),
    )
}

/// Runs a blocking merge-back call off the async threads.
async fn run_git<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, MergeBackError> + Send + 'static,
) -> Result<T, MergeBackError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        MergeBackError::Git(grove_core::error::GitError::Other(format!(
            "git task failed: {e}"
        )))
    })?
}
