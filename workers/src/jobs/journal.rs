//! Merge-back journals: where a merge-back records its progress, and the recovery of
//! one a dead worker left half-done, before any other command touches the workspace
//! (on the next lock of it, or at worker start).

use std::path::PathBuf;

use grove_core::error::CommandError;
use grove_core::events::Event;
use grove_core::model::WorkspaceRow;
use uuid::Uuid;

use crate::context::{blocking, correlation_of, release_all, JobContext};

impl JobContext {
    /// Where a merge-back into `workspace_id` keeps its journal: under `$GROVE_HOME`,
    /// never inside the workspace (the agent writes there).
    pub(crate) fn journal_path(&self, workspace_id: Uuid) -> PathBuf {
        self.layout
            .root()
            .join("journals")
            .join(format!("{workspace_id}.json"))
    }

    /// Finishes or undoes a merge-back a dead worker left half-done in `ws`, before any
    /// other command touches it (callers hold its command lock), and records
    /// `workspace.merge_back_recovered`. A failure refuses the command: running it on a
    /// half-switched tree would be worse.
    pub(crate) async fn recover_merge_back(&self, ws: &WorkspaceRow) -> Result<(), CommandError> {
        let journal = self.journal_path(ws.id);
        if !journal.exists() {
            return Ok(());
        }
        let git = self.git.clone();
        let dir = PathBuf::from(&ws.local_path);
        let recovered = blocking(move || git.recover_journal(&journal, &dir)).await?;
        let Some(r) = recovered else {
            return Ok(());
        };
        let event = Event::WorkspaceMergeBackRecovered {
            workspace_id: ws.id,
            outcome: if r.rolled_forward {
                "rolled_forward"
            } else {
                "rolled_back"
            }
            .into(),
            previous_head: r.previous_head,
            new_head: r.new_head,
            head: r.head,
        };
        let command_id = Uuid::now_v7();
        self.record(command_id, correlation_of(ws), &[event]).await
    }

    /// At worker start: recovers every journal a dead worker left under
    /// `$GROVE_HOME/journals` whose workspace lock is free (a busy one belongs to a live
    /// merge-back, or is recovered by the next command that locks it).
    pub async fn recover_journals(&self) {
        let dir = self.layout.root().join("journals");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let id = name
                .to_str()
                .and_then(|n| n.strip_suffix(".json"))
                .and_then(|n| Uuid::parse_str(n).ok());
            let Some(id) = id else { continue };
            let Ok(ws) = self.workspace(id).await else {
                continue;
            };
            if ws.node != self.config.node {
                continue;
            }
            match self.try_lock_workspace(&ws).await {
                Ok(Some(locks)) => {
                    if let Err(e) = self.recover_merge_back(&ws).await {
                        tracing::error!(workspace = %id, error = %e.message, "recovering an interrupted merge-back failed");
                    }
                    release_all(locks).await;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(workspace = %id, error = %e.message, "cannot lock a workspace to recover its merge-back")
                }
            }
        }
    }
}
