//! `release_scope`: every workspace of a conversation (edit) or a task (task) of a user
//! released or destroyed; those of another node delegated to that node's queue.

use grove_core::commands::{Command, CommandResult, ReleaseReport, ReleaseScope};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::events::Correlation;
use grove_core::model::{WorkspaceMode, WorkspaceRow};
use grove_postgres::{queue, rows};
use uuid::Uuid;

use crate::context::{release_all, store_error, Handled, JobContext};

impl JobContext {
    /// `release_scope`: every workspace of a conversation (edit) or task (task) of a user,
    /// released (runtimes stopped) or destroyed. Each is committed as it is done; those of
    /// another node get a command on that node's queue.
    pub async fn release_scope(
        &self,
        c: &ReleaseScope,
        command_id: Uuid,
    ) -> Result<Handled, CommandError> {
        let (mode, scope) = match (&c.conversation_id, &c.task_id) {
            (Some(conv), None) => (WorkspaceMode::Edit, conv.clone()),
            (None, Some(task)) => (WorkspaceMode::Task, task.clone()),
            _ => {
                return Err(CommandError::new(
                    ErrorKind::InvalidInput,
                    "release needs exactly one of a conversation and a task",
                ))
            }
        };
        let workspaces: Vec<WorkspaceRow> = {
            let mut conn = self.conn().await?;
            rows::workspaces(&mut conn, Some(&c.user_id))
                .await
                .map_err(store_error)?
        }
        .into_iter()
        .filter(|w| w.mode == mode)
        .filter(|w| c.project_id.as_ref().is_none_or(|p| &w.project_id == p))
        .filter(|w| match mode {
            WorkspaceMode::Edit => w.conversation_id.as_deref() == Some(scope.as_str()),
            _ => w.task_id.as_deref() == Some(scope.as_str()),
        })
        .collect();
        let mut report = ReleaseReport::default();
        for ws in workspaces {
            if ws.node != self.config.node {
                let child = self.delegate(&ws, c.destroy_workspaces, command_id).await?;
                report.delegated.push((ws.id, child));
                continue;
            }
            let evicted = !ws.state.has_files();
            if evicted && !c.destroy_workspaces {
                report.already_evicted.push(ws.id);
                continue;
            }
            let handled = if c.destroy_workspaces {
                self.destroy_workspace(ws.id).await?
            } else {
                self.release(ws.id, false).await?
            };
            let recorded = self
                .record(command_id, handled.correlation.clone(), &handled.events)
                .await;
            release_all(handled.locks).await;
            recorded?;
            if c.destroy_workspaces {
                report.destroyed.push(ws.id);
            } else {
                report.released.push(ws.id);
            }
        }
        Ok(Handled {
            result: Ok(CommandResult::Released(report)),
            events: Vec::new(),
            locks: Vec::new(),
            correlation: Correlation {
                user_id: Some(c.user_id.clone()),
                project_id: c.project_id.clone(),
                conversation_id: c.conversation_id.clone(),
                task_id: c.task_id.clone(),
            },
        })
    }

    /// Puts the release (or destroy) of `ws`, a workspace of another node, on that
    /// node's queue as a child command; returns its id.
    async fn delegate(
        &self,
        ws: &WorkspaceRow,
        destroy: bool,
        command_id: Uuid,
    ) -> Result<Uuid, CommandError> {
        let child = Uuid::new_v5(&command_id, ws.id.as_bytes());
        let command = if destroy {
            Command::DestroyWorkspace {
                workspace_id: ws.id,
            }
        } else {
            Command::ReleaseSession {
                workspace_id: ws.id,
                destroy_runtime: false,
            }
        };
        let mut tx = self.pool.begin().await.map_err(|e| store_error(e.into()))?;
        queue::enqueue(
            &mut tx,
            child,
            &command,
            &queue::placement_queue(&ws.node),
            None,
        )
        .await
        .map_err(store_error)?;
        tx.commit().await.map_err(|e| store_error(e.into()))?;
        Ok(child)
    }
}
