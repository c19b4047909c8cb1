//! Read tools answered inline (ADR 24): the worker's side of
//! [`grove_core::inline::InlineReads`], for the API server in the same process. The
//! same handler code as a queued `tool` of a read, without the ledger row, the claim or
//! an event: the workspace's shared command lock, its row re-read under the lock, the
//! tool run by `grove-tools` or the git port beneath the workspace root.

use std::sync::Arc;

use futures::future::BoxFuture;
use grove_core::error::{CommandError, ErrorKind};
use grove_core::inline::InlineReads;
use grove_core::tools::{ToolOp, ToolOutput};
use uuid::Uuid;

use grove_core::model::WorkspaceRow;
use grove_postgres::read_lock::ReadLock;

use crate::context::{store_error, JobContext};
use crate::jobs::evicted;

/// Answers read tools of this worker's node's workspaces in the calling process.
pub struct InlineReader {
    ctx: Arc<JobContext>,
}

impl InlineReader {
    pub fn new(ctx: Arc<JobContext>) -> Self {
        Self { ctx }
    }

    async fn run(&self, workspace_id: Uuid, op: &ToolOp) -> Result<ToolOutput, CommandError> {
        if op.is_write() {
            return Err(CommandError::new(
                ErrorKind::Internal,
                format!(
                    "{} changes the workspace: it is never answered inline",
                    op.name()
                ),
            ));
        }
        let (lock, ws) =
            ReadLock::acquire_workspace(&self.ctx.pool, workspace_id, self.ctx.config.lock_timeout)
                .await
                .map_err(store_error)?;
        // A merge-back a dead worker left half-done (looked for under the lock, so none
        // can be left between the look and the read) is finished first, a write, under
        // the leased lock, as a queued read would.
        if self.ctx.journal_path(workspace_id).exists() {
            lock.release().await.ok();
            let (ws, lock) = self.ctx.lock_workspace(workspace_id, true).await?;
            let output = self.on_this_node(&ws, op).await;
            lock.release().await.ok();
            return output;
        }
        let output = match ws {
            Some(ws) if ws.state.has_files() => self.on_this_node(&ws, op).await,
            Some(_) => Err(evicted(workspace_id)),
            None => Err(CommandError::new(
                ErrorKind::NotFound,
                format!("workspace {workspace_id} not found"),
            )),
        };
        // What was read is answered only if the lock held throughout.
        lock.release().await.map_err(store_error)?;
        output
    }

    async fn on_this_node(
        &self,
        ws: &WorkspaceRow,
        op: &ToolOp,
    ) -> Result<ToolOutput, CommandError> {
        if ws.node == self.ctx.config.node {
            self.ctx.run_tool(ws, op, None).await
        } else {
            Err(CommandError::new(
                ErrorKind::Conflict,
                format!("workspace {} is no longer on node {}", ws.id, ws.node),
            )
            .transient())
        }
    }
}

impl InlineReads for InlineReader {
    fn node(&self) -> &str {
        &self.ctx.config.node
    }

    fn read<'a>(
        &'a self,
        workspace_id: Uuid,
        op: &'a ToolOp,
    ) -> BoxFuture<'a, Result<ToolOutput, CommandError>> {
        Box::pin(self.run(workspace_id, op))
    }
}
