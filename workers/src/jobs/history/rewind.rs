//! `rewind`, `undo` and `fork`: a workspace's files, HEAD and branch put back to a
//! point (the state discarded kept as a point first), or a new workspace made at one.

use grove_core::commands::CommandResult;
use grove_core::error::{CommandError, ErrorKind};
use grove_core::events::Event;
use grove_core::history::{Operation, Point};
use grove_core::model::{branch_for, WorkspaceRow};
use grove_core::ports::GitToken;
use grove_core::tools::ToolOutput;
use grove_postgres::locks::AdvisoryLock;
use grove_postgres::rows;
use uuid::Uuid;

use super::{fork_acquire, point_of, snapshot_event, Paths};
use crate::context::{blocking, fold_workspace, now, store_error, JobContext};

impl JobContext {
    /// Rewinds to `target` (`None`: undo, the point before the latest).
    pub(super) async fn rewind(
        &self,
        ws: &WorkspaceRow,
        target: Option<&str>,
    ) -> Result<(ToolOutput, Vec<Event>), CommandError> {
        let points = self.timeline(ws.id).await?;
        let to = match target {
            Some(raw) => self.resolve(ws, &points, raw)?.clone(),
            None => undo_target(ws, &points)?,
        };
        let last = points.last().expect("a resolved point is in the timeline");
        let paths = self.history_paths(ws).await?;
        let now_snap = self.take(ws, &paths, Some(last.snapshot.clone())).await?;
        let mut events = Vec::new();
        let mut next = last.number + 1;
        let changed = now_snap.changes != Default::default()
            || now_snap.head != last.head
            || now_snap.branch != last.branch;
        let kept = changed.then_some(next);
        let now_id = now_snap.id.clone();
        if changed {
            events.push(snapshot_event(ws.id, now_snap, Operation::BeforeRewind));
            next += 1;
        }
        let report = self
            .apply_rewind(ws.id, &paths, &now_id, &to.snapshot, None)
            .await?;
        self.keep_git_owner(ws).await;
        // With ignored files kept, what the point after holds depends on the budget and
        // on ignored files neither point had: a walk decides, as for any other change.
        let after = if ws.history_ignored {
            self.take(ws, &paths, Some(now_id)).await?
        } else {
            report.point
        };
        let dirty = after.dirty;
        let event = snapshot_event(
            ws.id,
            after,
            Operation::Rewind {
                to: to.snapshot.clone(),
            },
        );
        let point = point_of(&event, next);
        events.push(event);
        if dirty != ws.dirty {
            events.push(Event::WorkspaceDirtyChanged {
                workspace_id: ws.id,
                dirty,
            });
        }
        Ok((
            ToolOutput::Rewound {
                to: to.number,
                point,
                kept,
                files_written: report.files_written,
                files_removed: report.files_removed,
            },
            events,
        ))
    }

    async fn apply_rewind(
        &self,
        workspace_id: Uuid,
        paths: &Paths,
        now: &str,
        to: &str,
        branch: Option<String>,
    ) -> Result<grove_core::history::RewindReport, CommandError> {
        let git = self.git.clone();
        let (store, workspace, cache) = (
            paths.store.clone(),
            paths.workspace.clone(),
            paths.cache.clone(),
        );
        let (now, to) = (now.to_string(), to.to_string());
        blocking(move || {
            let paths = Paths {
                store,
                workspace,
                cache,
            };
            git.rewind(&paths.borrow(), workspace_id, &now, &to, branch.as_deref())
        })
        .await
    }

    /// A new workspace under `scope` whose files, HEAD and history up to the point equal
    /// the source's there; the source is only read.
    pub(super) async fn fork(
        &self,
        ws: &WorkspaceRow,
        raw: &str,
        scope: &str,
        token: Option<&GitToken>,
    ) -> Result<(ToolOutput, Vec<Event>, Vec<AdvisoryLock>), CommandError> {
        let points = self.timeline(ws.id).await?;
        let at_point = self.resolve(ws, &points, raw)?.clone();
        let cache = {
            let mut conn = self.conn().await?;
            rows::repo_cache(&mut conn, ws.repo_cache_id)
                .await
                .map_err(store_error)?
                .ok_or_else(|| super::not_found(format!("the repo cache of workspace {}", ws.id)))?
        };
        let acquire = fork_acquire(ws, cache.repo_name.clone(), cache.repo_url.clone(), scope);
        let key = acquire.key(&self.config.node);
        {
            let mut conn = self.conn().await?;
            if rows::workspace_by_key(&mut conn, &key)
                .await
                .map_err(store_error)?
                .is_some()
            {
                return Err(CommandError::new(
                    ErrorKind::Conflict,
                    format!(
                        "a workspace with scope {scope:?} already exists; fork under a new one"
                    ),
                ));
            }
        }
        let made = self
            .acquire_workspace(&acquire, Uuid::new_v4(), token, now())
            .await?;
        let Ok(CommandResult::Workspace(row)) = &made.result else {
            return Err(crate::context::internal(
                "the fork's acquire made no workspace",
            ));
        };
        // The checkout's own first point is where the fork's rewind starts; the fork's
        // timeline is the source's up to the point instead.
        let mut first = None;
        let mut events = Vec::new();
        for event in &made.events {
            match event {
                Event::WorkspaceSnapshotTaken { snapshot, .. } => first = Some(snapshot.clone()),
                other => events.push(other.clone()),
            }
        }
        let fork_row = row.clone();
        let mut locks = made.locks;
        let dirty = match self.fill_fork(ws, &fork_row, &at_point, first).await {
            Ok(dirty) => dirty,
            Err(e) => {
                self.discard_fork(&fork_row).await;
                for lock in locks.drain(..) {
                    lock.release().await.ok();
                }
                return Err(e);
            }
        };
        events.push(Event::WorkspaceForked {
            workspace_id: fork_row.id,
            source_workspace_id: ws.id,
            snapshot: at_point.snapshot.clone(),
            number: at_point.number,
        });
        // The rewind's point tells whether the fork's files differ from its HEAD: no
        // `git status` walk.
        if dirty != fold_workspace(None, &events, now())?.dirty {
            events.push(Event::WorkspaceDirtyChanged {
                workspace_id: fork_row.id,
                dirty,
            });
        }
        let output = ToolOutput::Forked {
            workspace_id: fork_row.id,
            branch: fork_row.branch_name.clone(),
            local_path: fork_row.local_path.clone(),
            point: at_point.number,
        };
        Ok((output, events, locks))
    }

    /// Puts the source's history into the fork's store and the fork's files, HEAD and
    /// (its own) branch at the point, from the checkout's first point `first` (a point
    /// of the checkout is taken when there is none). Returns whether the fork's files
    /// differ from its HEAD.
    async fn fill_fork(
        &self,
        source: &WorkspaceRow,
        fork: &WorkspaceRow,
        at_point: &Point,
        first: Option<String>,
    ) -> Result<bool, CommandError> {
        let paths = self.history_paths(fork).await?;
        let git = self.git.clone();
        let (from, to) = (self.history_dir(source), paths.store.clone());
        // The fork's own store (its checkout's point, whose private index matches its
        // files) gets the source's points: its next point hashes only what changed.
        blocking(move || git.copy_history(&from, &to)).await?;
        let now = match first {
            Some(id) => id,
            None => self.take(fork, &paths, None).await?.id,
        };
        let branch = branch_for(fork.mode, scope_of(fork)).map(|b| format!("refs/heads/{b}"));
        let report = self
            .apply_rewind(fork.id, &paths, &now, &at_point.snapshot, branch)
            .await?;
        Ok(report.point.dirty)
    }

    /// Removes a fork that could not be filled (its checkout and store).
    async fn discard_fork(&self, fork: &WorkspaceRow) {
        let git = self.git.clone();
        let (dir, store) = (
            std::path::PathBuf::from(&fork.local_path),
            self.history_dir(fork),
        );
        let _ = blocking(move || {
            git.remove_checkout(&dir)?;
            git.discard_history(&store)
        })
        .await;
    }
}

fn scope_of(ws: &WorkspaceRow) -> &str {
    ws.conversation_id
        .as_deref()
        .or(ws.task_id.as_deref())
        .unwrap_or("")
}

/// The point before the latest change: the point before the latest one, or, when the
/// latest is a rewind, the point before the one it rewound to (so a second undo goes
/// further back instead of redoing). A typed error when there is none.
fn undo_target(ws: &WorkspaceRow, points: &[Point]) -> Result<Point, CommandError> {
    let mut end = points.len();
    if let Some(Point {
        operation: Operation::Rewind { to },
        ..
    }) = points.last()
    {
        end = points
            .iter()
            .rposition(|p| p.snapshot == *to)
            .map_or(end, |i| i + 1);
    }
    match points[..end] {
        [.., ref before, _] => Ok(before.clone()),
        _ => Err(CommandError::new(
            ErrorKind::Conflict,
            format!("workspace {} has no earlier point to undo to", ws.id),
        )),
    }
}
