//! Job handlers: load state, take locks, perform the effect through a port, and return
//! the events (committed by the runner together with the outcome, locks still held).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use grove_core::commands::{
    is_remote_placement, AcquireWorkspace, CommandResult, EnsureRepoCache, Exec,
    DEFAULT_MAX_OUTPUT_BYTES,
};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::events::{Correlation, Event, Metadata};
use grove_core::layout::Layout;
use grove_core::model::{
    branch_for, to_db_precision, Capabilities, ExecKind, ExecOutcome, RepoCacheRow, WorkspaceMode,
    WorkspaceRow,
};
use grove_core::ports::{
    CommitRequest, ExecRequest, GitPort, GitToken, Mount, PushRequest, RemoteWorkspaceRequest,
    ResourceHints, RuntimeProvider, RuntimeRegistry, RuntimeSpec,
};
use grove_core::projection::Projections;
use grove_core::tools::{DiffAgainst, ToolOp, ToolOutput, ToolRequest};
use grove_core::validate::RepoUrl;
use grove_postgres::locks::{AdvisoryLock, LockScope};
use grove_postgres::{rows, store, StoreError};
use grove_tools::{ToolError, Workspace as ToolWorkspace};
use sqlx::PgPool;
use uuid::Uuid;

use crate::config::WorkerConfig;

mod remote_tools;

/// What a handler produced: the caller's result, the events to commit with it, and the
/// locks to release only after that commit.
pub struct Handled {
    /// The caller's result, or the failure to record (with `events`) for a command that
    /// failed after changing state, such as an exec the runtime rejected once started.
    pub result: Result<CommandResult, CommandError>,
    pub events: Vec<Event>,
    pub locks: Vec<AdvisoryLock>,
    pub correlation: Correlation,
}

/// The ports and settings every handler uses.
pub struct Deps {
    pub pool: PgPool,
    pub config: WorkerConfig,
    pub layout: Layout,
    pub git: Arc<dyn GitPort>,
    pub runtimes: RuntimeRegistry,
    /// The git platform for pull requests (`None`: not configured; those jobs fail as
    /// `unavailable`).
    pub platform: Option<Arc<dyn grove_core::platform::GitPlatformProvider>>,
    /// Jobs this worker is running now (so its own stale-lock sweep leaves them alone).
    pub inflight: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Token fingerprints under the deployment's secret, loaded on first use.
    pub fingerprint: tokio::sync::OnceCell<grove_core::fingerprint::Fingerprinter>,
}

/// Converts a store failure into the command-level error (transient: worth a retry).
pub fn store_error(e: StoreError) -> CommandError {
    match e {
        StoreError::Locked(m) => CommandError::new(ErrorKind::Conflict, m),
        StoreError::NotFound(m) => CommandError::new(ErrorKind::NotFound, m),
        StoreError::Conflict(m) => CommandError::new(ErrorKind::Conflict, m).transient(),
        other => {
            CommandError::new(ErrorKind::Unavailable, format!("database: {other}")).transient()
        }
    }
}

pub(crate) fn internal(msg: impl std::fmt::Display) -> CommandError {
    CommandError::new(ErrorKind::Internal, msg.to_string())
}

/// Runs a blocking git call off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, grove_core::error::GitError> + Send + 'static,
) -> Result<T, CommandError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| internal(format!("git task failed: {e}")))?
        .map_err(CommandError::from)
}

/// Now, at the precision Postgres stores (so replayed rows compare equal).
pub fn now() -> DateTime<Utc> {
    to_db_precision(Utc::now())
}

impl Deps {
    pub(crate) async fn lock(
        &self,
        scope: LockScope,
        value: &str,
        shared: bool,
    ) -> Result<AdvisoryLock, CommandError> {
        AdvisoryLock::acquire(&self.pool, scope, value, shared, self.config.lock_timeout)
            .await
            .map_err(store_error)
    }

    pub(crate) async fn conn(
        &self,
    ) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, CommandError> {
        self.pool.acquire().await.map_err(|e| store_error(e.into()))
    }

    pub(crate) async fn workspace(&self, id: Uuid) -> Result<WorkspaceRow, CommandError> {
        let mut conn = self.conn().await?;
        rows::workspace(&mut conn, id)
            .await
            .map_err(store_error)?
            .ok_or_else(|| {
                CommandError::new(ErrorKind::NotFound, format!("workspace {id} not found"))
            })
    }

    /// Takes the workspace's command lock, then reads its row: a workspace destroyed
    /// while we waited is reported as not found rather than used half-gone, and one
    /// evicted meanwhile (its files are gone) as a conflict that says how to get it back.
    pub(crate) async fn lock_workspace(
        &self,
        id: Uuid,
        shared: bool,
    ) -> Result<(WorkspaceRow, AdvisoryLock), CommandError> {
        let (ws, lock) = self.lock_workspace_any(id, shared).await?;
        if matches!(ws.state.as_str(), "evicted" | "evicting") {
            lock.release().await.ok();
            return Err(CommandError::new(
                ErrorKind::Conflict,
                format!(
                    "workspace {id} is evicted (its files were removed to free disk space); run `grove workspace restore {id}` or acquire it again"
                ),
            ));
        }
        Ok((ws, lock))
    }

    /// [`Self::lock_workspace`] that also accepts an evicted workspace (for destroy).
    pub(crate) async fn lock_workspace_any(
        &self,
        id: Uuid,
        shared: bool,
    ) -> Result<(WorkspaceRow, AdvisoryLock), CommandError> {
        // The lock and the row in one statement, on the lock's connection.
        let (lock, ws) =
            AdvisoryLock::acquire_workspace(&self.pool, id, shared, self.config.lock_timeout)
                .await
                .map_err(store_error)?;
        match ws {
            Some(ws) => match self.recover_merge_back(&ws).await {
                Ok(()) => Ok((ws, lock)),
                Err(e) => {
                    lock.release().await.ok();
                    Err(e)
                }
            },
            None => {
                lock.release().await.ok();
                Err(CommandError::new(
                    ErrorKind::NotFound,
                    format!("workspace {id} not found"),
                ))
            }
        }
    }

    async fn cache_by_identity(
        &self,
        identity: &str,
    ) -> Result<Option<RepoCacheRow>, CommandError> {
        let mut conn = self.conn().await?;
        rows::repo_cache_by_identity(&mut conn, &self.config.node, identity)
            .await
            .map_err(store_error)
    }

    /// Ensures the repo cache on this node: clones if absent, fetches if asked or stale.
    /// Returns the row as it will be after `events` commit, and the lock (if one was
    /// needed) that must be held until then.
    pub(crate) async fn ensure_cache(
        &self,
        repo_name: &str,
        repo_url: &str,
        fetch: bool,
        token: Option<&GitToken>,
        at: DateTime<Utc>,
    ) -> Result<(RepoCacheRow, Vec<Event>, Option<AdvisoryLock>), CommandError> {
        let url = RepoUrl::parse(repo_url)?;
        let node = &self.config.node;
        let existing = self.cache_by_identity(url.identity()).await?;
        let stale = |row: &RepoCacheRow| {
            row.last_fetched_at
                .is_none_or(|t| (at - t).to_std().unwrap_or_default() > self.config.cache_freshness)
        };
        // A cache cloned with credentials is served to a caller with other (or no)
        // credentials only after a fetch with theirs succeeds: the fetch is the access check.
        let scope = self.auth_scope(token).await?;
        let foreign =
            |row: &RepoCacheRow| row.auth_scope_hash.is_some() && row.auth_scope_hash != scope;
        let usable = |row: &RepoCacheRow| {
            !fetch
                && !stale(row)
                && !foreign(row)
                && row.state != "evicted"
                && PathBuf::from(&row.local_path).is_dir()
        };
        if existing.as_ref().is_some_and(usable) {
            // Shared: concurrent users of a fresh cache do not wait for each other, and an
            // eviction sweep (exclusive) cannot delete it while a checkout reads it.
            let shared = self
                .lock(
                    LockScope::RepoCache,
                    &format!("{node}\u{0}{}", url.identity()),
                    true,
                )
                .await?;
            match self.cache_by_identity(url.identity()).await {
                Ok(Some(row)) if usable(&row) => {
                    let events = vec![Event::RepoCacheUsed {
                        repo_cache_id: row.id,
                    }];
                    return Ok((fold_cache(Some(row), &events, at), events, Some(shared)));
                }
                Ok(_) => {
                    // Evicted while we waited: clone it again below.
                    shared.release().await.ok();
                }
                Err(e) => {
                    shared.release().await.ok();
                    return Err(e);
                }
            }
        }
        let lock = self
            .lock(
                LockScope::RepoCache,
                &format!("{node}\u{0}{}", url.identity()),
                false,
            )
            .await?;
        // Another worker may have created or fetched it while we waited.
        let existing = self.cache_by_identity(url.identity()).await?;
        let cache_dir = self.layout.repo_cache_dir(url.identity());
        let must_fetch = match &existing {
            Some(row) => fetch || stale(row) || foreign(row),
            None => false,
        };
        let git = self.git.clone();
        let (u, d, t) = (repo_url.to_string(), cache_dir.clone(), token.cloned());
        let report = blocking(move || git.ensure_cache(&u, &d, t.as_ref(), must_fetch)).await?;
        let events = match &existing {
            Some(row) if report.fetched => vec![Event::RepoCacheFetched {
                repo_cache_id: row.id,
                size_bytes: report.size_bytes,
            }],
            Some(row) => vec![Event::RepoCacheUsed {
                repo_cache_id: row.id,
            }],
            None => vec![Event::RepoCacheCreated {
                repo_cache_id: Uuid::now_v7(),
                node: node.clone(),
                identity: url.identity().to_string(),
                repo_name: repo_name.to_string(),
                repo_url: url.as_str().to_string(),
                provider: if url.is_local() {
                    "local".into()
                } else {
                    "git".into()
                },
                provider_host: url.host().to_string(),
                local_path: cache_dir.to_string_lossy().into_owned(),
                auth_scope_hash: scope.clone(),
                size_bytes: report.size_bytes,
            }],
        };
        Ok((fold_cache(existing, &events, at), events, Some(lock)))
    }

    pub async fn ensure_repo_cache(
        &self,
        c: &EnsureRepoCache,
        token: Option<&GitToken>,
        at: DateTime<Utc>,
    ) -> Result<Handled, CommandError> {
        let (row, events, lock) = self
            .ensure_cache(&c.repo_name, &c.repo_url, c.fetch, token, at)
            .await?;
        Ok(Handled {
            result: Ok(CommandResult::RepoCache(row)),
            events,
            locks: lock.into_iter().collect(),
            correlation: Correlation::default(),
        })
    }

    pub async fn acquire_workspace(
        &self,
        c: &AcquireWorkspace,
        command_id: Uuid,
        token: Option<&GitToken>,
        at: DateTime<Utc>,
    ) -> Result<Handled, CommandError> {
        let correlation = Correlation {
            user_id: Some(c.user_id.clone()),
            project_id: Some(c.project_id.clone()),
            conversation_id: c.conversation_id.clone(),
            task_id: c.task_id.clone(),
        };
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
        if let Some(row) = existing {
            if row.node != node {
                let place = if is_remote_placement(&row.node) {
                    format!("inside {0}; acquire it with --runtime {0}", row.node)
                } else if c.remote_placement().is_some() {
                    format!("on node {}; acquire it without --runtime {node}", row.node)
                } else {
                    format!("on node {}; acquire it there", row.node)
                };
                return Err(CommandError::new(
                    ErrorKind::Conflict,
                    format!("workspace {} lives {place}", row.id),
                ));
            }
            if is_remote_placement(&row.node) {
                // Its files are in the provider's sandbox: nothing to check on this host.
                return self.reacquired(row, key_lock, correlation, at);
            }
            if matches!(row.state.as_str(), "evicted" | "evicting") {
                // An acquire of an evicted key restores it (same id, path and branch).
                let cmd_lock = self
                    .lock(LockScope::WorkspaceCommands, &row.id.to_string(), false)
                    .await?;
                let row = self.workspace(row.id).await?;
                return self
                    .restore_locked(row, token, at, vec![cmd_lock, key_lock])
                    .await;
            }
            if !PathBuf::from(&row.local_path).is_dir() {
                return Err(internal(format!(
                    "workspace {} has a record but its directory is missing; destroy it and acquire again",
                    row.id
                )));
            }
            return self.reacquired(row, key_lock, correlation, at);
        }
        if let Some(provider) = c.remote_placement() {
            return self
                .acquire_remote(c, provider, command_id, token, at, key_lock, correlation)
                .await;
        }
        let (cache, mut events, cache_lock) = self
            .ensure_cache(&c.repo_name, &c.repo_url, false, token, at)
            .await?;
        let workspace_dir = self.layout.workspace_dir(&key);
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
        // Derived from the command id so a retried attempt names the same workspace.
        let workspace_id = Uuid::new_v5(&command_id, b"workspace");
        events.push(Event::WorkspaceCreated {
            workspace_id,
            repo_cache_id: cache.id,
            node: self.config.node.clone(),
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
            base_commit: report.base_commit,
            branch_name: branch,
            local_path: workspace_dir.to_string_lossy().into_owned(),
            capabilities: Capabilities::from_mode(c.mode),
            size_bytes: report.size_bytes,
        });
        let row = fold_workspace(None, &events, at).ok_or_else(|| internal("fold lost the row"))?;
        let mut locks = vec![key_lock];
        locks.extend(cache_lock);
        Ok(Handled {
            result: Ok(CommandResult::Workspace(row)),
            events,
            locks,
            correlation,
        })
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
        let row =
            fold_workspace(Some(row), &events, at).ok_or_else(|| internal("fold lost the row"))?;
        Ok(Handled {
            result: Ok(CommandResult::Workspace(row)),
            events,
            locks: vec![key_lock],
            correlation,
        })
    }

    /// The remote provider holding workspaces under `name`, as configured here.
    fn remote_provider(&self, name: &str) -> Result<Arc<dyn RuntimeProvider>, CommandError> {
        let provider = self.runtimes.get(name).ok_or_else(|| {
            CommandError::new(
                ErrorKind::Unavailable,
                format!(
                    "runtime {name:?} is not configured on this worker (configured: {})",
                    self.runtimes.kinds().join(", ")
                ),
            )
        })?;
        if provider.workspaces().is_none() {
            return Err(CommandError::new(
                ErrorKind::Rejected,
                format!("runtime {name} cannot hold workspaces"),
            ));
        }
        Ok(provider)
    }

    /// The lock over the sandbox of (provider, user, project): held while a workspace
    /// is made in it or removed from it, so one sandbox is created per pair and the
    /// last destroy deletes it without racing an acquire.
    async fn lock_sandbox(
        &self,
        provider: &str,
        user: &str,
        project: &str,
    ) -> Result<AdvisoryLock, CommandError> {
        self.lock(
            LockScope::SandboxPlacement,
            &format!("{provider}\u{0}{user}\u{0}{project}"),
            false,
        )
        .await
    }

    /// Places a new workspace inside `provider` (ADR 15): the provider clones the
    /// repository into the user's and project's sandbox once (recorded as the
    /// provider's repo cache, node = provider) and the workspace as a clone of that;
    /// the workspace's node is the provider and its `local_path` the in-sandbox path.
    #[allow(clippy::too_many_arguments)]
    async fn acquire_remote(
        &self,
        c: &AcquireWorkspace,
        provider: &str,
        command_id: Uuid,
        token: Option<&GitToken>,
        at: DateTime<Utc>,
        key_lock: AdvisoryLock,
        correlation: Correlation,
    ) -> Result<Handled, CommandError> {
        let runtime = self.remote_provider(provider)?;
        let remote = runtime.workspaces().expect("checked by remote_provider");
        let url = RepoUrl::parse(&c.repo_url)?;
        let sandbox_lock = self
            .lock_sandbox(provider, &c.user_id, &c.project_id)
            .await?;
        let branch = branch_for(c.mode, c.scope());
        let checkout = remote
            .ensure_workspace(
                &RemoteWorkspaceRequest {
                    user: c.user_id.clone(),
                    project: c.project_id.clone(),
                    scope: c.scope().to_string(),
                    repo_name: c.repo_name.clone(),
                    repo_url: url.as_str().to_string(),
                    base_ref: c.base_ref.clone(),
                    branch: branch.clone(),
                },
                token,
            )
            .await?;
        // One repo cache row per (provider, identity) stands for the provider's clones
        // of the repository (one per sandbox, at the same path under its home).
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
        let mut events = match &existing {
            Some(row) => vec![Event::RepoCacheUsed {
                repo_cache_id: row.id,
            }],
            None => vec![Event::RepoCacheCreated {
                repo_cache_id: Uuid::new_v5(&command_id, b"repo_cache"),
                node: provider.to_string(),
                identity: url.identity().to_string(),
                repo_name: c.repo_name.clone(),
                repo_url: url.as_str().to_string(),
                provider: if url.is_local() {
                    "local".into()
                } else {
                    "git".into()
                },
                provider_host: url.host().to_string(),
                local_path: checkout.cache_path.clone(),
                auth_scope_hash: self.auth_scope(token).await?,
                size_bytes: 0,
            }],
        };
        let cache = fold_cache(existing, &events, at);
        let workspace_id = Uuid::new_v5(&command_id, b"workspace");
        events.push(Event::WorkspaceCreated {
            workspace_id,
            repo_cache_id: cache.id,
            node: provider.to_string(),
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
            base_commit: checkout.base_commit,
            branch_name: branch,
            local_path: checkout.path,
            // Workspaces of one (user, project) share the sandbox (ADR 15).
            capabilities: Capabilities {
                isolated: false,
                ..Capabilities::from_mode(c.mode)
            },
            size_bytes: 0,
        });
        let row = fold_workspace(None, &events, at).ok_or_else(|| internal("fold lost the row"))?;
        Ok(Handled {
            result: Ok(CommandResult::Workspace(row)),
            events,
            locks: vec![key_lock, sandbox_lock, cache_lock],
            correlation,
        })
    }

    pub async fn exec(
        &self,
        e: &Exec,
        command_id: Uuid,
        metadata: &Metadata,
    ) -> Result<Handled, CommandError> {
        // With the kind given, the lock's mode is known before the row is: the lock and
        // the row come in one statement, and the refusals below are checked under it.
        let (ws, early_lock) = match e.kind {
            Some(kind) => {
                let (ws, lock) = self
                    .lock_workspace(e.workspace_id, !kind.is_mutating())
                    .await?;
                (ws, Some(lock))
            }
            None => (self.workspace(e.workspace_id).await?, None),
        };
        let correlation = correlation_of(&ws);
        let metadata = &Metadata {
            correlation: correlation.clone(),
            ..metadata.clone()
        };
        let kind = e.kind.unwrap_or(if ws.capabilities.writable {
            ExecKind::Write
        } else {
            ExecKind::Read
        });
        // A workspace placed in a remote provider runs there only, and a remote runtime
        // reaches no host workspace: a mismatch is refused before anything is recorded.
        let remote = is_remote_placement(&ws.node);
        let provider = self.runtimes.get(&e.runtime);
        let refusal = if kind.is_mutating() && !ws.capabilities.writable {
            Some(CommandError::new(
                ErrorKind::Rejected,
                format!(
                    "workspace {} is read-only ({} mode): {:?} commands are refused",
                    ws.id,
                    ws.mode.as_str(),
                    kind
                ),
            ))
        } else if remote && e.runtime != ws.node {
            Some(CommandError::new(
                ErrorKind::Rejected,
                format!(
                    "workspace {} lives inside {1}: run its commands with --runtime {1}, not {2}",
                    ws.id, ws.node, e.runtime
                ),
            ))
        } else if !remote && is_remote_placement(&e.runtime) {
            Some(CommandError::new(
                ErrorKind::Rejected,
                format!(
                    "workspace {} lives on node {}: runtime {2} runs only workspaces placed in it (acquire with --runtime {2})",
                    ws.id, ws.node, e.runtime
                ),
            ))
        } else if provider.is_none() {
            Some(CommandError::new(
                ErrorKind::Unavailable,
                format!(
                    "runtime {:?} is not configured on this worker (configured: {})",
                    e.runtime,
                    self.runtimes.kinds().join(", ")
                ),
            ))
        } else {
            None
        };
        let remote_network = match refusal {
            Some(refusal) => Err(refusal),
            None if remote => self
                .remote_provider(&ws.node)
                .map(|p| Some(p.workspaces().map(|w| w.network()))),
            None => Ok(None),
        };
        let remote_network = match remote_network {
            Ok(network) => network,
            Err(refusal) => {
                if let Some(lock) = early_lock {
                    lock.release().await.ok();
                }
                return Err(refusal);
            }
        };
        let provider = provider.expect("checked above");
        // Capabilities never change, so the kind chosen above still holds; without an
        // early lock the row is re-read under the lock for its current state (dirty,
        // existence).
        let (ws, mut lock) = match early_lock {
            Some(lock) => (ws, lock),
            None => self.lock_workspace(ws.id, !kind.is_mutating()).await?,
        };
        // The reads and the start events go through the lock's connection (one pool
        // checkout for the whole exec).
        let existing = rows::runtimes_of(lock.conn(), ws.id)
            .await
            .map_err(store_error)?
            .into_iter()
            .find(|r| r.backend_kind == provider.kind());
        let runtime_id = existing
            .as_ref()
            .map(|r| r.id)
            .unwrap_or_else(|| Uuid::new_v5(&ws.id, provider.kind().as_bytes()));
        let ws_dir = PathBuf::from(&ws.local_path);
        let cache_dir = if remote {
            // The sandbox's own clone: nothing of the host is mounted.
            None
        } else {
            rows::repo_cache(lock.conn(), ws.repo_cache_id)
                .await
                .map_err(store_error)?
                .map(|c| PathBuf::from(c.local_path))
        };
        // The local runtime builds a fresh sandbox per exec, so a read command gets a
        // read-only view even of a writable workspace; a long-lived container keeps the
        // mount it was created with, so it gets the workspace's own writability.
        let per_exec_sandbox = provider.kind() == "local" && !remote;
        let mut mounts = vec![Mount {
            source: ws_dir.clone(),
            target: ws_dir.clone(),
            writable: ws.capabilities.writable && (kind.is_mutating() || !per_exec_sandbox),
        }];
        if let Some(cache_dir) = cache_dir {
            // git inside the workspace reads the cache's objects through alternates.
            mounts.push(Mount {
                source: cache_dir.clone(),
                target: cache_dir,
                writable: false,
            });
        }
        let spec = RuntimeSpec {
            image: self
                .config
                .docker_image
                .clone()
                .filter(|_| provider.kind() == "docker"),
            workdir: ws_dir.clone(),
            mounts,
            env: Default::default(),
            resources: ResourceHints::default(),
            // A remote sandbox keeps the network it was created with for cloning.
            network: e.network.or(remote_network.flatten()).unwrap_or_default(),
            labels: [
                ("grove.workspace".to_string(), ws.id.to_string()),
                ("grove.runtime".to_string(), runtime_id.to_string()),
            ]
            .into(),
        };
        let mut spec = spec;
        if remote {
            // The sandbox of a remote workspace is its user's and project's.
            spec.labels
                .insert("grove.user".to_string(), ws.user_id.clone());
            spec.labels
                .insert("grove.project".to_string(), ws.project_id.clone());
        }
        let mut start_events = match &existing {
            Some(r) if r.state == "running" => vec![],
            _ => vec![Event::RuntimeStarted {
                runtime_id,
                workspace_id: ws.id,
                backend_kind: provider.kind().to_string(),
                backend_runtime_id: provider.backend_id(&spec),
                image: spec.image.clone(),
            }],
        };
        // Recorded before the runtime is created or the command runs: a container made
        // by this exec is then never mistaken for an orphan, and a worker that dies
        // mid-command leaves the trace that ends it as worker_lost.
        start_events.push(Event::ExecStarted {
            exec_id: command_id,
            workspace_id: ws.id,
            runtime_id,
            kind,
            argv: e.argv.clone(),
            env_keys: e.env.keys().cloned().collect(),
            timeout_ms: e.timeout_ms,
        });
        {
            let mut tx = sqlx::Connection::begin(lock.conn())
                .await
                .map_err(|e| store_error(e.into()))?;
            store::append(&mut tx, &start_events, metadata, now())
                .await
                .map_err(store_error)?;
            tx.commit().await.map_err(|e| store_error(e.into()))?;
        }
        let started = Instant::now();
        let request = ExecRequest {
            argv: e.argv.clone(),
            cwd: e.cwd.as_ref().map(PathBuf::from),
            env: e.env.clone(),
            timeout: e.timeout_ms.map(Duration::from_millis),
            stdin: e.stdin.clone(),
            max_output_bytes: Some(e.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT_BYTES) as usize),
            mutating: kind.is_mutating(),
        };
        if let Some(id) = provider
            .sandbox_identity()
            .filter(|_| ws.capabilities.writable)
        {
            // Commands run as the unprivileged sandbox identity, so a writable workspace
            // is handed over to it (once; later execs find it already owned).
            let dir = ws_dir.clone();
            tokio::task::spawn_blocking(move || grove_git::tree::hand_over(&dir, id.uid, id.gid))
                .await
                .map_err(|e| internal(format!("ownership task failed: {e}")))?
                .map_err(|e| {
                    internal(format!(
                        "handing the workspace to the sandbox user failed: {e}"
                    ))
                })?;
        }
        // A caller streaming this exec asked, with the enqueue, for its output.
        let relay = grove_postgres::output::relay_requested(lock.conn(), command_id)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "could not tell whether to relay exec output");
                false
            });
        let backend_id = provider.backend_id(&spec);
        let run = async {
            match provider.create(spec).await {
                Ok(runtime) if relay => {
                    crate::relay::exec_relayed(
                        runtime.as_ref(),
                        request,
                        self.pool.clone(),
                        command_id,
                    )
                    .await
                }
                Ok(runtime) => runtime.exec(request).await,
                Err(e) => Err(e),
            }
        };
        // Fencing (ADR 21): if the lock's lease cannot be renewed (the database is
        // away), the command is stopped before the lease can expire. Dropping `run`
        // kills its process group in every runtime.
        let fence_lost = lock.fence_lost();
        let outcome = tokio::select! {
            biased;
            _ = fence_lost => None,
            outcome = run => Some(outcome),
        };
        let Some(outcome) = outcome else {
            let fenced = self
                .fenced_exec(
                    provider.as_ref(),
                    &backend_id,
                    runtime_id,
                    &ws,
                    command_id,
                    started,
                )
                .await;
            return Ok(Handled {
                locks: vec![lock],
                correlation,
                ..fenced
            });
        };
        let duration_ms = started.elapsed().as_millis() as u64;
        let mut events = Vec::new();
        let result = match outcome {
            Ok(r) => {
                events.push(Event::ExecFinished {
                    exec_id: command_id,
                    workspace_id: ws.id,
                    runtime_id,
                    outcome: "completed".into(),
                    exit_code: Some(r.exit_code),
                    timed_out: r.timed_out,
                    truncated: r.truncated,
                    duration_ms,
                    stdout_bytes: r.stdout.len() as u64,
                    stderr_bytes: r.stderr.len() as u64,
                });
                Ok(ExecOutcome {
                    exit_code: r.exit_code,
                    stdout: String::from_utf8_lossy(&r.stdout).into_owned(),
                    stderr: String::from_utf8_lossy(&r.stderr).into_owned(),
                    timed_out: r.timed_out,
                    truncated: r.truncated,
                    duration_ms,
                })
            }
            Err(err) => {
                let outcome = match err {
                    grove_core::error::RuntimeError::ResourceLimit(_) => "resource_limit",
                    _ => "rejected",
                };
                events.push(Event::ExecFinished {
                    exec_id: command_id,
                    workspace_id: ws.id,
                    runtime_id,
                    outcome: outcome.into(),
                    exit_code: None,
                    timed_out: false,
                    truncated: false,
                    duration_ms,
                    stdout_bytes: 0,
                    stderr_bytes: 0,
                });
                Err(CommandError::from(err))
            }
        };
        // The host's git cannot see a remote workspace: its `dirty` is not tracked.
        if kind.is_mutating() && !remote {
            let git = self.git.clone();
            let dir = ws_dir.clone();
            if let Ok(dirty) = blocking(move || git.is_dirty(&dir)).await {
                if dirty != ws.dirty {
                    events.push(Event::WorkspaceDirtyChanged {
                        workspace_id: ws.id,
                        dirty,
                    });
                }
            }
        }
        match result {
            Ok(outcome) => Ok(Handled {
                result: Ok(CommandResult::Exec(outcome)),
                events,
                locks: vec![lock],
                correlation,
            }),
            // The rejection is recorded with its finish event, in the outcome's transaction.
            Err(err) => Ok(Handled {
                result: Err(err),
                events,
                locks: vec![lock],
                correlation,
            }),
        }
    }

    /// The end of an exec stopped because its lock's lease was lost. The command's
    /// processes were killed as its future dropped; a long-lived runtime (a container, a
    /// remote sandbox) is also destroyed, bounded by the lease's margin, so nothing of
    /// the command can still run when another holder takes the lock.
    async fn fenced_exec(
        &self,
        provider: &dyn RuntimeProvider,
        backend_id: &str,
        runtime_id: Uuid,
        ws: &WorkspaceRow,
        command_id: Uuid,
        started: Instant,
    ) -> Handled {
        let margin = grove_postgres::locks::lease_margin(grove_postgres::locks::lease_length());
        tracing::warn!(command = %command_id, workspace = %ws.id, "the workspace lock's lease was lost (database unreachable): the command was stopped");
        let mut events = vec![Event::ExecFinished {
            exec_id: command_id,
            workspace_id: ws.id,
            runtime_id,
            outcome: "fenced".into(),
            exit_code: None,
            timed_out: false,
            truncated: false,
            duration_ms: started.elapsed().as_millis() as u64,
            stdout_bytes: 0,
            stderr_bytes: 0,
        }];
        if provider.kind() != "local" {
            match tokio::time::timeout(margin, provider.destroy(backend_id)).await {
                Ok(Ok(())) | Ok(Err(grove_core::error::RuntimeError::NotFound(_))) => {
                    events.push(Event::RuntimeDestroyed {
                        runtime_id,
                        reason: "its exec's workspace lock was lost".into(),
                    })
                }
                Ok(Err(e)) => {
                    tracing::warn!(runtime = %runtime_id, error = %e, "destroying a fenced exec's runtime failed")
                }
                Err(_) => {
                    tracing::warn!(runtime = %runtime_id, "destroying a fenced exec's runtime timed out")
                }
            }
        }
        Handled {
            result: Err(CommandError::new(
                ErrorKind::Unavailable,
                "the database was unreachable for longer than the workspace lock's lease: the command was stopped (it may have run in part) so that no other command could run in the workspace at the same time",
            )),
            events,
            locks: Vec::new(),
            correlation: correlation_of(ws),
        }
    }

    /// Stops (or destroys) the runtimes of a workspace and marks it released.
    pub async fn release(
        &self,
        workspace_id: Uuid,
        destroy_runtime: bool,
    ) -> Result<Handled, CommandError> {
        let (ws, mut lock) = self.lock_workspace(workspace_id, false).await?;
        let mut events = self
            .runtime_events(lock.conn(), ws.id, destroy_runtime, "session released")
            .await?;
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
        let (ws, mut lock) = self.lock_workspace(workspace_id, false).await?;
        let reason = if destroy {
            "destroy requested"
        } else {
            "hibernate requested"
        };
        let events = self
            .runtime_events(lock.conn(), ws.id, destroy, reason)
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
    /// The runtimes are read on `conn`, the connection of the workspace's lock.
    async fn runtime_events(
        &self,
        conn: &mut sqlx::PgConnection,
        workspace_id: Uuid,
        destroy: bool,
        reason: &str,
    ) -> Result<Vec<Event>, CommandError> {
        let runtimes = rows::runtimes_of(conn, workspace_id)
            .await
            .map_err(store_error)?;
        let mut events = Vec::new();
        for r in runtimes {
            if !destroy && r.state != "running" {
                continue;
            }
            // A runtime of a provider this worker lacks is still recorded as gone: its
            // backend is left to that provider's orphan sweep.
            if let Some(provider) = self.runtimes.get(&r.backend_kind) {
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
        // finishes before the destroy or starts after it and creates afresh.
        let key = self.workspace(workspace_id).await?.key();
        let key_lock = self
            .lock(LockScope::WorkspaceKey, &key.lock_string(), false)
            .await?;
        let (ws, mut lock) = self.lock_workspace_any(workspace_id, false).await?;
        if is_remote_placement(&ws.node) {
            return self.destroy_remote(ws, vec![lock, key_lock]).await;
        }
        let mut events = self
            .runtime_events(lock.conn(), ws.id, true, "workspace destroyed")
            .await?;
        let git = self.git.clone();
        let dir = PathBuf::from(&ws.local_path);
        blocking(move || git.remove_checkout(&dir)).await?;
        self.discard_saved_work(&ws).await;
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
}

impl Deps {
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
}

/// Refuses an operation that needs the workspace's files on this host when the
/// workspace lives inside a remote provider (ADR 15: exec is the way in for now).
pub(crate) fn host_only(ws: &WorkspaceRow, what: &str) -> Result<(), CommandError> {
    if is_remote_placement(&ws.node) {
        return Err(not_yet(ws, what));
    }
    Ok(())
}

fn not_yet(ws: &WorkspaceRow, what: &str) -> CommandError {
    CommandError::new(
        ErrorKind::Rejected,
        format!(
            "{what} is not available on a {0} workspace yet (workspace {1} lives inside the {0} sandbox; run commands in it with exec --runtime {0})",
            ws.node, ws.id
        ),
    )
}

/// Largest patch a `git_diff` returns (the rest is cut and flagged).
pub const MAX_DIFF_BYTES: usize = DEFAULT_MAX_OUTPUT_BYTES as usize;
/// Log entries when a `git_log` does not say.
pub const DEFAULT_LOG_ENTRIES: usize = 20;

impl Deps {
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
        if is_remote_placement(&ws.node) {
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
        let mut events = Vec::new();
        match &output {
            ToolOutput::Written(w) => events.push(Event::WorkspaceFileWritten {
                workspace_id: ws.id,
                path: w.path.clone(),
                op: op.name().to_string(),
                size_bytes: w.size_bytes,
                sha256: w.sha256.clone(),
                created: w.created,
            }),
            ToolOutput::Committed(c) => events.push(Event::WorkspaceCommitted {
                workspace_id: ws.id,
                commit: c.commit.clone(),
                branch: c.branch.clone(),
                files: c.files.clone(),
            }),
            ToolOutput::Pushed(p) => events.push(Event::WorkspacePushed {
                workspace_id: ws.id,
                branch: p.branch.clone(),
                commit: p.commit.clone(),
                previous: p.previous.clone(),
                forced: p.forced,
            }),
            _ => {}
        }
        if op.is_write() {
            let git = self.git.clone();
            let dir = PathBuf::from(&ws.local_path);
            if let Ok(dirty) = blocking(move || git.is_dirty(&dir)).await {
                if dirty != ws.dirty {
                    events.push(Event::WorkspaceDirtyChanged {
                        workspace_id: ws.id,
                        dirty,
                    });
                }
            }
        }
        Ok(Handled {
            result: Ok(CommandResult::Tool(output)),
            events,
            locks: vec![lock],
            correlation: correlation_of(&ws),
        })
    }

    async fn run_tool(
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
        let paths = match checked {
            (Some(output), _) => return Ok(output),
            (None, paths) => paths,
        };
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
    async fn keep_git_owner(&self, ws: &WorkspaceRow) {
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

pub fn correlation_of(ws: &WorkspaceRow) -> Correlation {
    Correlation {
        user_id: Some(ws.user_id.clone()),
        project_id: Some(ws.project_id.clone()),
        conversation_id: ws.conversation_id.clone(),
        task_id: ws.task_id.clone(),
    }
}

fn fold_cache(existing: Option<RepoCacheRow>, events: &[Event], at: DateTime<Utc>) -> RepoCacheRow {
    let mut p = Projections::default();
    let mut id = None;
    if let Some(row) = existing {
        id = Some(row.id);
        p.repo_caches.insert(row.id, row);
    }
    for e in events {
        if let Event::RepoCacheCreated { repo_cache_id, .. } = e {
            id = Some(*repo_cache_id);
        }
        p.apply(e, at);
    }
    id.and_then(|id| p.repo_caches.remove(&id))
        .expect("a cache event always names the cache")
}

pub(crate) fn fold_workspace(
    existing: Option<WorkspaceRow>,
    events: &[Event],
    at: DateTime<Utc>,
) -> Option<WorkspaceRow> {
    let mut p = Projections::default();
    let mut id = None;
    if let Some(row) = existing {
        id = Some(row.id);
        p.workspaces.insert(row.id, row);
    }
    for e in events {
        if let Event::WorkspaceCreated { workspace_id, .. } = e {
            id = Some(*workspace_id);
        }
        p.apply(e, at);
    }
    id.and_then(|id| p.workspaces.remove(&id))
}
