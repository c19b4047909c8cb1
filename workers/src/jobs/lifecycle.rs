//! The lifecycle of a workspace after its acquire: `release_session`,
//! `hibernate_runtime` / `destroy_runtime` (its runtimes down), `pin_workspace`, and
//! `destroy_workspace` (on this node or inside a remote provider).

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use grove_core::commands::CommandResult;
use grove_core::error::CommandError;
use grove_core::events::Event;
use grove_core::model::WorkspaceRow;
use grove_core::placement::Placement;
use grove_core::state::RuntimeState;
use grove_postgres::locks::{AdvisoryLock, LeaseCommit, LockScope};
use grove_postgres::rows;
use uuid::Uuid;

use crate::context::{blocking, correlation_of, fold_workspace, store_error, Handled, JobContext};

impl JobContext {
    /// Stops (or destroys) the runtimes of a workspace and marks it released.
    pub async fn release(
        &self,
        workspace_id: Uuid,
        destroy_runtime: bool,
    ) -> Result<Handled, CommandError> {
        let (ws, mut lock) = self.lock_workspace(workspace_id, false).await?;
        let mut events = self
            .runtime_events(&mut lock, ws.id, destroy_runtime, "session released")
            .await?;
        self.drop_tracker(ws.id).await;
        events.push(Event::WorkspaceReleased {
            workspace_id: ws.id,
        });
        Ok(Handled {
            result: Ok(CommandResult::Done),
            events,
            locks: vec![lock],
            correlation: correlation_of(&ws),
        })
    }

    /// Stops or destroys the runtimes of a workspace; the workspace itself is untouched.
    pub async fn runtimes_down(
        &self,
        workspace_id: Uuid,
        destroy: bool,
    ) -> Result<Handled, CommandError> {
        // Its lease rides on the outcome's commit unless a runtime must be stopped first
        // (`runtime_events` makes it durable before that effect; ADR 33).
        let (ws, mut lock) = self
            .lock_workspace_with(workspace_id, false, LeaseCommit::WithNextCommit)
            .await?;
        let reason = if destroy {
            "destroy requested"
        } else {
            "hibernate requested"
        };
        let events = self
            .runtime_events(&mut lock, ws.id, destroy, reason)
            .await?;
        Ok(Handled {
            result: Ok(CommandResult::Done),
            events,
            locks: vec![lock],
            correlation: correlation_of(&ws),
        })
    }

    /// Stops or destroys each runtime of a workspace through its provider (the local
    /// runtime has nothing to stop: one process tree per exec) and returns the events.
    /// The runtimes are read on the connection of the workspace's lock, whose lease is
    /// made durable before the first provider call.
    async fn runtime_events(
        &self,
        lock: &mut AdvisoryLock,
        workspace_id: Uuid,
        destroy: bool,
        reason: &str,
    ) -> Result<Vec<Event>, CommandError> {
        let runtimes = rows::runtimes_of(lock.conn(), workspace_id)
            .await
            .map_err(store_error)?;
        let mut events = Vec::new();
        for r in runtimes {
            if !destroy && r.state != RuntimeState::Running {
                continue;
            }
            // A runtime of a provider this worker lacks is still recorded as gone: its
            // backend is left to that provider's orphan sweep.
            if let Some(provider) = self.runtimes.get(&r.backend_kind) {
                lock.make_durable().await.map_err(store_error)?;
                let effect = if destroy {
                    provider.destroy(&r.backend_runtime_id).await
                } else {
                    provider.stop(&r.backend_runtime_id).await
                };
                match effect {
                    // Already gone (removed by hand or by an orphan sweep): the record
                    // catches up with the backend.
                    Ok(()) | Err(grove_core::error::RuntimeError::NotFound(_)) => {}
                    Err(e) => return Err(CommandError::from(e)),
                }
            }
            events.push(if destroy {
                Event::RuntimeDestroyed {
                    runtime_id: r.id,
                    reason: reason.into(),
                }
            } else {
                Event::RuntimeStopped {
                    runtime_id: r.id,
                    reason: reason.into(),
                }
            });
        }
        Ok(events)
    }

    pub async fn destroy_workspace(&self, workspace_id: Uuid) -> Result<Handled, CommandError> {
        // The key lock first (as acquire takes it), so an acquire of the same key either
        // finishes before the destroy or starts after it and creates afresh (an acquire
        // answered from the row, ADR 40, checks that no one holds this lock).
        let key = self.workspace(workspace_id).await?.key();
        let key_lock = self
            .lock(LockScope::WorkspaceKey, &key.lock_string(), false)
            .await?;
        let (ws, mut lock) = self.lock_workspace_any(workspace_id, false).await?;
        if Placement::of_node(&ws.node).is_remote() {
            return self.destroy_remote(ws, vec![lock, key_lock]).await;
        }
        let mut events = self
            .runtime_events(&mut lock, ws.id, true, "workspace destroyed")
            .await?;
        let git = self.git.clone();
        let dir = PathBuf::from(&ws.local_path);
        blocking(move || git.remove_checkout(&dir)).await?;
        self.discard_saved_work(&ws).await;
        self.discard_workspace_history(&ws).await;
        events.push(Event::WorkspaceDestroyed {
            workspace_id: ws.id,
        });
        Ok(Handled {
            result: Ok(CommandResult::Done),
            events,
            locks: vec![lock, key_lock],
            correlation: correlation_of(&ws),
        })
    }

    /// Destroys a workspace placed in a remote provider: its clone inside the sandbox is
    /// removed (the sandbox's clone of the repository stays), its runtime records end
    /// without stopping the sandbox the user's other workspaces share, and when it was
    /// the last workspace of its (user, project) there the sandbox is deleted.
    async fn destroy_remote(
        &self,
        ws: WorkspaceRow,
        mut locks: Vec<AdvisoryLock>,
    ) -> Result<Handled, CommandError> {
        let provider = self.remote_provider(&ws.node)?;
        let remote = provider.workspaces().expect("checked by remote_provider");
        locks.push(
            self.lock_sandbox(&ws.node, &ws.user_id, &ws.project_id)
                .await?,
        );
        remote
            .remove_workspace(&ws.user_id, &ws.project_id, &ws.local_path)
            .await?;
        let others = {
            let mut conn = self.conn().await?;
            rows::workspaces(&mut conn, Some(&ws.user_id))
                .await
                .map_err(store_error)?
                .into_iter()
                .filter(|o| o.id != ws.id && o.node == ws.node && o.project_id == ws.project_id)
                .count()
        };
        if others == 0 {
            tracing::info!(provider = %ws.node, user = %ws.user_id, project = %ws.project_id, "last remote workspace destroyed: deleting its sandbox");
            remote.delete_sandbox(&ws.user_id, &ws.project_id).await?;
        }
        let mut events: Vec<Event> = {
            let mut conn = self.conn().await?;
            rows::runtimes_of(&mut conn, ws.id)
                .await
                .map_err(store_error)?
        }
        .into_iter()
        .map(|r| Event::RuntimeDestroyed {
            runtime_id: r.id,
            reason: "workspace destroyed".into(),
        })
        .collect();
        events.push(Event::WorkspaceDestroyed {
            workspace_id: ws.id,
        });
        Ok(Handled {
            result: Ok(CommandResult::Done),
            events,
            locks,
            correlation: correlation_of(&ws),
        })
    }

    /// `pin_workspace`: records the pin under the workspace's command lock.
    pub async fn pin_workspace(
        &self,
        workspace_id: Uuid,
        until: Option<DateTime<Utc>>,
        at: DateTime<Utc>,
    ) -> Result<Handled, CommandError> {
        let (ws, lock) = self.lock_workspace(workspace_id, false).await?;
        let correlation = correlation_of(&ws);
        let events = vec![Event::WorkspacePinned {
            workspace_id: ws.id,
            until,
        }];
        let row = fold_workspace(Some(ws), &events, at);
        Ok(Handled {
            result: row.map(CommandResult::Workspace),
            events,
            locks: vec![lock],
            correlation,
        })
    }
}
