//! `acquire_workspace`: the workspace of a key, created (from the node's repo cache, or
//! inside a remote provider), re-acquired, or restored when it was evicted.

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use grove_core::commands::{AcquireWorkspace, CommandResult};
use grove_core::decide::acquire::{acquire_step, AcquireStep};
use grove_core::error::CommandError;
use grove_core::events::{Correlation, Event};
use grove_core::inline::{reacquire_is_recent, reacquires_inline};
use grove_core::model::{branch_for, Capabilities, RepoCacheRow, WorkspaceMode, WorkspaceRow};
use grove_core::ports::{GitToken, RemoteWorkspaceRequest};
use grove_core::validate::RepoUrl;
use grove_postgres::folded::HeldRows;
use grove_postgres::locks::{lock_key, AdvisoryLock, LeaseCommit, LockScope};
use grove_postgres::rows;
use uuid::Uuid;

use super::repo_cache::cache_created;
use crate::context::{
    blocking, fold_cache, fold_workspace, store_error, Handled, JobContext, Reuse,
};

impl JobContext {
    pub async fn acquire_workspace(
        &self,
        c: &AcquireWorkspace,
        command_id: Uuid,
        token: Option<&GitToken>,
        at: DateTime<Utc>,
    ) -> Result<Handled, CommandError> {
        let correlation = acquire_correlation(c);
        let node = c
            .remote_placement()
            .map(str::to_string)
            .unwrap_or_else(|| self.config.node.clone());
        let key = c.key(&node);
        let mut key_lock = self
            .lock(LockScope::WorkspaceKey, &key.lock_string(), false)
            .await?;
        // Read on the lock's own connection: no second pool checkout.
        let existing = rows::workspace_by_key(key_lock.conn(), &key)
            .await
            .map_err(store_error)?;
        let dir_exists = existing
            .as_ref()
            .is_some_and(|row| PathBuf::from(&row.local_path).is_dir());
        let step = acquire_step(existing.as_ref(), &node, c.remote_placement(), dir_exists)?;
        match (step, existing) {
            (AcquireStep::Reacquire, Some(row)) => self.reacquired(row, key_lock, correlation, at),
            (AcquireStep::Restore, Some(row)) => {
                // An acquire of an evicted key restores it (same id, path and branch).
                let cmd_lock = self
                    .lock(LockScope::WorkspaceCommands, &row.id.to_string(), false)
                    .await?;
                let row = self.workspace(row.id).await?;
                self.restore_locked(row, command_id, token, at, vec![cmd_lock, key_lock])
                    .await
            }
            (AcquireStep::CreateRemote { provider }, _) => {
                let made = self
                    .acquire_remote(c, provider, command_id, token, at)
                    .await?;
                made.handled(key_lock, correlation, at)
            }
            // (A reacquire or a restore always has its row.)
            (AcquireStep::Create, _) | (AcquireStep::Reacquire | AcquireStep::Restore, None) => {
                let workspace_dir = self.layout.workspace_dir(&key);
                let made = self
                    .create_local(c, command_id, token, at, workspace_dir)
                    .await?;
                made.handled(key_lock, correlation, at)
            }
        }
    }

    /// A new workspace on this node: a checkout of the node's repo cache (ensured
    /// first) at `workspace_dir`.
    async fn create_local(
        &self,
        c: &AcquireWorkspace,
        command_id: Uuid,
        token: Option<&GitToken>,
        at: DateTime<Utc>,
        workspace_dir: PathBuf,
    ) -> Result<Made, CommandError> {
        let (cache, events, cache_lock) = self
            .ensure_cache(&c.repo_name, &c.repo_url, false, token, at, command_id)
            .await?;
        let branch = branch_for(c.mode, c.scope());
        let git = self.git.clone();
        let (cache_dir, ws_dir, base, br, upstream) = (
            PathBuf::from(&cache.local_path),
            workspace_dir.clone(),
            c.base_ref.clone(),
            branch.clone(),
            c.repo_url.clone(),
        );
        let report = blocking(move || {
            git.create_checkout(&grove_core::ports::CheckoutRequest {
                cache_dir: &cache_dir,
                workspace_dir: &ws_dir,
                base_ref: &base,
                branch: br.as_deref(),
                upstream_url: &upstream,
            })
        })
        .await?;
        let created = created(
            c,
            command_id,
            NewWorkspace {
                repo_cache_id: cache.id,
                node: self.config.node.clone(),
                base_commit: report.base_commit,
                branch_name: branch,
                local_path: workspace_dir.to_string_lossy().into_owned(),
                capabilities: Capabilities::from_mode(c.mode),
                size_bytes: report.size_bytes,
            },
        );
        let point = self.first_point(&created, &cache.local_path).await;
        Ok(Made {
            events: [events, vec![created], point.into_iter().collect()].concat(),
            locks: cache_lock.into_iter().collect(),
        })
    }

    /// The cheap case of an acquire, for running it inline (ADR 34): the key's
    /// workspace exists on this node, whole, so the queued handler would only re-acquire
    /// it. Decided on a read without a lock first (anything else costs no lock): a
    /// ready workspace whose use was recorded within the recent-use window is the
    /// answer as it stands (ADR 40); else decided again on the key's lock, as the queued
    /// handler takes it. `None` (the lock released) when it is not the cheap case, and
    /// the acquire takes the queue.
    pub(crate) async fn reacquire_inline(
        &self,
        c: &AcquireWorkspace,
        at: DateTime<Utc>,
    ) -> Result<Option<Reuse>, CommandError> {
        let node = &self.config.node;
        let key = c.key(node);
        let cheap = |row: Option<&WorkspaceRow>| {
            let dir_exists = row.is_some_and(|r| PathBuf::from(&r.local_path).is_dir());
            reacquires_inline(node, c, row, dir_exists)
        };
        let seen = {
            let mut conn = self.conn().await?;
            rows::workspace_by_key(&mut conn, &key)
                .await
                .map_err(store_error)?
        };
        let Some(seen) = seen.filter(|row| cheap(Some(row))) else {
            return Ok(None);
        };
        if reacquire_is_recent(&seen, at, self.config.eviction.recent_use_window()) {
            // A destroy holds the key's lock, an eviction the workspace's.
            let locks = vec![
                lock_key(LockScope::WorkspaceKey, &key.lock_string()),
                lock_key(LockScope::WorkspaceCommands, &seen.id.to_string()),
            ];
            let result = CommandResult::Workspace(seen);
            return Ok(Some(Reuse::Recent { result, locks }));
        }
        // Its one effect is its flushed commit, which the lease rides on (ADR 35).
        let mut key_lock = self
            .lock_with(
                LockScope::WorkspaceKey,
                &key.lock_string(),
                false,
                LeaseCommit::WithNextCommit,
            )
            .await?;
        let existing = match rows::workspace_by_key_versioned(key_lock.conn(), &key).await {
            Ok(row) => row,
            Err(e) => {
                key_lock.release().await.ok();
                return Err(store_error(e));
            }
        };
        match existing {
            Some((row, version)) if cheap(Some(&row)) => {
                // Its record folds onto the row read here (ADR 36).
                key_lock.hold(HeldRows::workspace(row.clone(), version));
                let correlation = acquire_correlation(c);
                self.reacquired(row, key_lock, correlation, at)
                    .map(|handled| Some(Reuse::Record(handled)))
            }
            // Changed while we waited for the lock (evicted, destroyed): the queue.
            _ => {
                key_lock.release().await.ok();
                Ok(None)
            }
        }
    }

    /// An acquire of a key whose workspace exists: `workspace.acquired`.
    fn reacquired(
        &self,
        row: WorkspaceRow,
        key_lock: AdvisoryLock,
        correlation: Correlation,
        at: DateTime<Utc>,
    ) -> Result<Handled, CommandError> {
        let events = vec![Event::WorkspaceAcquired {
            workspace_id: row.id,
        }];
        let row = fold_workspace(Some(row), &events, at)?;
        Ok(Handled {
            result: Ok(CommandResult::Workspace(row)),
            events,
            locks: vec![key_lock],
            correlation,
        })
    }

    /// Places a new workspace inside `provider` (ADR 15): the provider clones the
    /// repository into the user's and project's sandbox once (recorded as the
    /// provider's repo cache, node = provider) and the workspace as a clone of that;
    /// the workspace's node is the provider and its `local_path` the in-sandbox path.
    async fn acquire_remote(
        &self,
        c: &AcquireWorkspace,
        provider: &str,
        command_id: Uuid,
        token: Option<&GitToken>,
        at: DateTime<Utc>,
    ) -> Result<Made, CommandError> {
        let runtime = self.remote_provider(provider)?;
        let remote = runtime.workspaces().expect("checked by remote_provider");
        let url = RepoUrl::parse(&c.repo_url)?;
        let sandbox_lock = self
            .lock_sandbox(provider, &c.user_id, &c.project_id)
            .await?;
        let branch = branch_for(c.mode, c.scope());
        let request = RemoteWorkspaceRequest {
            user: c.user_id.clone(),
            project: c.project_id.clone(),
            scope: c.scope().to_string(),
            repo_name: c.repo_name.clone(),
            repo_url: url.as_str().to_string(),
            base_ref: c.base_ref.clone(),
            branch: branch.clone(),
        };
        let checkout = remote.ensure_workspace(&request, token).await?;
        let (cache, mut events, cache_lock) = self
            .remote_cache(
                c,
                provider,
                &url,
                &checkout.cache_path,
                command_id,
                token,
                at,
            )
            .await?;
        events.push(created(
            c,
            command_id,
            NewWorkspace {
                repo_cache_id: cache.id,
                node: provider.to_string(),
                base_commit: checkout.base_commit,
                branch_name: branch,
                local_path: checkout.path,
                // Workspaces of one (user, project) share the sandbox (ADR 15).
                capabilities: Capabilities {
                    isolated: false,
                    ..Capabilities::from_mode(c.mode)
                },
                size_bytes: 0,
            },
        ));
        Ok(Made {
            events,
            locks: vec![sandbox_lock, cache_lock],
        })
    }

    /// The repo cache row standing for `provider`'s clones of the repository (one per
    /// sandbox, at the same path under its home): one per (provider, identity), used
    /// or created, its lock held until the commit.
    #[allow(clippy::too_many_arguments)]
    async fn remote_cache(
        &self,
        c: &AcquireWorkspace,
        provider: &str,
        url: &RepoUrl,
        cache_path: &str,
        command_id: Uuid,
        token: Option<&GitToken>,
        at: DateTime<Utc>,
    ) -> Result<(RepoCacheRow, Vec<Event>, AdvisoryLock), CommandError> {
        let cache_lock = self
            .lock(
                LockScope::RepoCache,
                &format!("{provider}\u{0}{}", url.identity()),
                false,
            )
            .await?;
        let existing = {
            let mut conn = self.conn().await?;
            rows::repo_cache_by_identity(&mut conn, provider, url.identity())
                .await
                .map_err(store_error)?
        };
        let events = match &existing {
            Some(row) => vec![Event::RepoCacheUsed {
                repo_cache_id: row.id,
            }],
            None => vec![cache_created(
                Uuid::new_v5(&command_id, b"repo_cache"),
                provider,
                url,
                &c.repo_name,
                cache_path.to_string(),
                self.auth_scope(token).await?,
                0,
            )],
        };
        Ok((fold_cache(existing, &events, at), events, cache_lock))
    }
}

/// The correlation of an acquire's events: its user, project and scope.
fn acquire_correlation(c: &AcquireWorkspace) -> Correlation {
    Correlation {
        user_id: Some(c.user_id.clone()),
        project_id: Some(c.project_id.clone()),
        conversation_id: c.conversation_id.clone(),
        task_id: c.task_id.clone(),
    }
}

/// A workspace made by an acquire: its events (the repo cache's, then
/// `workspace.created`) and the locks beyond the key's to hold until they commit.
struct Made {
    events: Vec<Event>,
    locks: Vec<AdvisoryLock>,
}

impl Made {
    fn handled(
        self,
        key_lock: AdvisoryLock,
        correlation: Correlation,
        at: DateTime<Utc>,
    ) -> Result<Handled, CommandError> {
        let row = fold_workspace(None, &self.events, at)?;
        let mut locks = vec![key_lock];
        locks.extend(self.locks);
        Ok(Handled {
            result: Ok(CommandResult::Workspace(row)),
            events: self.events,
            locks,
            correlation,
        })
    }
}

/// Where and how a new workspace was made.
struct NewWorkspace {
    repo_cache_id: Uuid,
    node: String,
    base_commit: String,
    branch_name: Option<String>,
    local_path: String,
    capabilities: Capabilities,
    size_bytes: i64,
}

/// `workspace.created` for the acquire `c`, its id derived from the command id so a
/// retried attempt names the same workspace.
fn created(c: &AcquireWorkspace, command_id: Uuid, w: NewWorkspace) -> Event {
    Event::WorkspaceCreated {
        workspace_id: Uuid::new_v5(&command_id, b"workspace"),
        repo_cache_id: w.repo_cache_id,
        node: w.node,
        user_id: c.user_id.clone(),
        project_id: c.project_id.clone(),
        mode: c.mode,
        conversation_id: (c.mode == WorkspaceMode::Edit)
            .then(|| c.conversation_id.clone())
            .flatten(),
        task_id: (c.mode == WorkspaceMode::Task)
            .then(|| c.task_id.clone())
            .flatten(),
        base_ref: c.base_ref.clone(),
        base_commit: w.base_commit,
        branch_name: w.branch_name,
        local_path: w.local_path,
        capabilities: w.capabilities,
        size_bytes: w.size_bytes,
        history_ignored: c.history_ignored,
    }
}
