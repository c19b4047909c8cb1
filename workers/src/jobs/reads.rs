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

use crate::context::JobContext;

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
        let (ws, lock) = self.ctx.lock_workspace(workspace_id, true).await?;
        let output = if ws.node == self.ctx.config.node {
            self.ctx.run_tool(&ws, op, None).await
        } else {
            Err(CommandError::new(
                ErrorKind::Conflict,
                format!("workspace {workspace_id} is no longer on node {}", ws.node),
            )
            .transient())
        };
        lock.release().await.ok();
        output
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
