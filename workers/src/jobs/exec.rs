//! `exec`: one command in a runtime over a workspace, its start recorded before it runs,
//! its output relayed while it runs when a caller streams it, and fenced by the
//! workspace lock's lease. Load, decide (`grove_core::decide::exec`), act, record. An
//! exec run inline by the receiving process (ADR 31) starts its ledger row with its
//! start events, in the same commit.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use grove_core::commands::{Command, CommandResult, Exec, DEFAULT_MAX_OUTPUT_BYTES};
use grove_core::decide::exec::{check_exec, exec_kind};
use grove_core::error::{CommandError, ErrorKind, RuntimeError};
use grove_core::events::{Event, Metadata};
use grove_core::model::{ExecKind, ExecOutcome, RuntimeRow, WorkspaceRow};
use grove_core::placement::Placement;
use grove_core::ports::{
    ExecRequest, ExecResult, Mount, NetworkPolicy, ResourceHints, RuntimeProvider, RuntimeSpec,
};
use grove_core::state::RuntimeState;
use grove_postgres::locks::{AdvisoryLock, LeaseCommit};
use grove_postgres::queue::{self, ClaimedJob};
use grove_postgres::{rows, store};
use uuid::Uuid;

use crate::context::{correlation_of, internal, now, store_error, Handled, InFlight, JobContext};

/// An exec's lease is flushed by its start's commit, which precedes every effect (the
/// runtime's creation, the command): one flushed commit fewer per exec (ADR 33).
const START_COMMITS_LEASE: LeaseCommit = LeaseCommit::WithNextCommit;

/// An exec decided and locked, before its start is recorded.
struct Prepared {
    ws: WorkspaceRow,
    lock: AdvisoryLock,
    kind: ExecKind,
    provider: Arc<dyn RuntimeProvider>,
    /// The workspace lives inside a remote provider.
    remote: bool,
    runtime_id: Uuid,
    /// The workspace's runtime record of this provider, if there is one.
    existing: Option<RuntimeRow>,
    spec: RuntimeSpec,
}

/// How an inline exec (ADR 31) began: started (its ledger row, job and start events in
/// one commit, then run), or not run at all because its command id was already known.
// Made once per inline exec and matched at once: boxing the outcome would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum InlineExec {
    /// The command id is already in the ledger: nothing ran, the lock is released.
    Known,
    /// The start committed; the command ran (or failed after its start) and the
    /// handled outcome awaits recording on the job.
    Started {
        job: ClaimedJob,
        handled: Result<Handled, CommandError>,
        /// Keeps the job in the worker's in-flight set until its outcome is recorded.
        in_flight: InFlight,
    },
}

impl JobContext {
    pub async fn exec(
        &self,
        e: &Exec,
        command_id: Uuid,
        metadata: &Metadata,
    ) -> Result<Handled, CommandError> {
        let mut prepared = self.prepare_exec(e).await?;
        let start_events = start_events(e, command_id, &prepared);
        let metadata = &Metadata {
            correlation: correlation_of(&prepared.ws),
            ..metadata.clone()
        };
        // Recorded before the runtime is created or the command runs: a container made
        // by this exec is then never mistaken for an orphan, and a worker that dies
        // mid-command leaves the trace that ends it as worker_lost.
        record_on(&self.pool, &mut prepared.lock, &start_events, metadata).await?;
        self.run_started(e, command_id, prepared, true).await
    }

    /// An exec run by the process that received it (ADR 31): decided and locked as a
    /// queued one, then its ledger row and job (`queue::start_inline`) and its start
    /// events in one commit, on the lock's connection, before the runtime is created or
    /// the command runs. A refusal before that commit records nothing (as a route's
    /// refusal); a workspace that left this node answers a transient conflict.
    pub async fn exec_inline(
        &self,
        e: &Exec,
        command_id: Uuid,
        command: &Command,
        metadata: &Metadata,
    ) -> Result<InlineExec, CommandError> {
        let mut prepared = self.prepare_exec(e).await?;
        if prepared.ws.node != self.config.node {
            let node = prepared.ws.node.clone();
            prepared.lock.release().await.ok();
            return Err(CommandError::new(
                ErrorKind::Conflict,
                format!("workspace {} is no longer on node {}", e.workspace_id, node),
            )
            .transient());
        }
        let start_events = start_events(e, command_id, &prepared);
        let metadata = &Metadata {
            correlation: correlation_of(&prepared.ws),
            ..metadata.clone()
        };
        let queue = queue::node_queue(&self.config.node);
        let started = start_inline_on(
            &self.pool,
            &mut prepared.lock,
            (command_id, command, &queue, &self.config.worker_id),
            &start_events,
            metadata,
        )
        .await;
        let job = match started {
            Ok(Some(job)) => job,
            Ok(None) => {
                prepared.lock.release().await.ok();
                return Ok(InlineExec::Known);
            }
            Err(err) => {
                prepared.lock.release().await.ok();
                return Err(err);
            }
        };
        let in_flight = self.in_flight(&job.job_id);
        let handled = self.run_started(e, command_id, prepared, false).await;
        Ok(InlineExec::Started {
            job,
            handled,
            in_flight,
        })
    }

    /// Runs an exec whose start is recorded: hands the workspace over, runs the command
    /// fenced by the lock's lease (relaying its output when `may_relay` and a caller
    /// asked), and builds its outcome and `exec.finished` (with the dirty check and
    /// history point of a mutating command).
    async fn run_started(
        &self,
        e: &Exec,
        command_id: Uuid,
        prepared: Prepared,
        may_relay: bool,
    ) -> Result<Handled, CommandError> {
        let Prepared {
            ws,
            lock,
            kind,
            provider,
            remote,
            runtime_id,
            spec,
            ..
        } = prepared;
        let correlation = correlation_of(&ws);
        let started = Instant::now();
        self.hand_over(provider.as_ref(), &ws).await?;
        // A caller streaming this exec asked, with the enqueue, for its output.
        let mut lock = lock;
        let relay = may_relay
            && grove_postgres::output::relay_requested(lock.conn(), command_id)
                .await
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "could not tell whether to relay exec output");
                    false
                });
        let backend_id = provider.backend_id(&spec);
        let request = exec_request(e, kind);
        // A mutating command's point base is read while the command runs.
        let prefetch = if kind.is_mutating() && !remote {
            self.prefetch_point(&ws)
        } else {
            Default::default()
        };
        let outcome = self
            .run_fenced(
                &lock,
                &*provider,
                spec,
                request,
                relay.then_some(command_id),
            )
            .await;
        let finish = Finish {
            command_id,
            runtime_id,
            started,
        };
        let Some(outcome) = outcome else {
            return Ok(self
                .fenced_exec(&*provider, &backend_id, &ws, &finish, lock)
                .await);
        };
        let (result, mut events) = finish.of(&ws, outcome);
        // The host's git cannot see a remote workspace: its `dirty` is not tracked.
        if kind.is_mutating() && !remote {
            events.extend(self.after_exec(&ws, &e.argv, &events, prefetch).await);
        }
        Ok(Handled {
            result: result.map(CommandResult::Exec),
            events,
            locks: vec![lock],
            correlation,
        })
    }

    /// Creates the runtime and runs the command, relaying its output as the command
    /// `relay` when asked. Fencing (ADR 21): if the lock's lease cannot be renewed (the
    /// database is away), the command is stopped before the lease can expire (`None`).
    /// Dropping the run kills its process group in every runtime.
    async fn run_fenced(
        &self,
        lock: &AdvisoryLock,
        provider: &dyn RuntimeProvider,
        spec: RuntimeSpec,
        request: ExecRequest,
        relay: Option<Uuid>,
    ) -> Option<Result<ExecResult, RuntimeError>> {
        let run = async {
            match provider.create(spec).await {
                Ok(runtime) => match relay {
                    Some(command_id) => {
                        let pool = self.pool.clone();
                        crate::relay::exec_relayed(runtime.as_ref(), request, pool, command_id)
                            .await
                    }
                    None => runtime.exec(request).await,
                },
                Err(e) => Err(e),
            }
        };
        let fence_lost = lock.fence_lost();
        tokio::select! {
            biased;
            _ = fence_lost => None,
            outcome = run => Some(outcome),
        }
    }

    /// Loads the workspace, decides the exec's kind and whether it may run, and takes
    /// the workspace lock; builds the runtime's spec under it.
    async fn prepare_exec(&self, e: &Exec) -> Result<Prepared, CommandError> {
        // With the kind given, the lock's mode is known before the row is: the lock and
        // the row come in one statement, and the refusals below are checked under it.
        let (ws, early_lock) = match e.kind {
            Some(kind) => {
                let (ws, lock) = self
                    .lock_workspace_with(e.workspace_id, !kind.is_mutating(), START_COMMITS_LEASE)
                    .await?;
                (ws, Some(lock))
            }
            None => (self.workspace(e.workspace_id).await?, None),
        };
        let kind = exec_kind(e.kind, &ws);
        let remote = Placement::of_node(&ws.node).is_remote();
        let network = check_exec(&ws, kind, &e.runtime, &self.runtimes.kinds())
            .and_then(|()| self.remote_network(&ws, remote));
        let network = match network {
            Ok(network) => network,
            Err(refusal) => {
                if let Some(lock) = early_lock {
                    lock.release().await.ok();
                }
                return Err(refusal);
            }
        };
        let provider = self
            .runtimes
            .get(&e.runtime)
            .expect("checked by check_exec");
        // Capabilities never change, so the kind chosen above still holds; without an
        // early lock the row is re-read under the lock for its current state (dirty,
        // existence).
        let (ws, mut lock) = match early_lock {
            Some(lock) => (ws, lock),
            None => {
                self.lock_workspace_with(ws.id, !kind.is_mutating(), START_COMMITS_LEASE)
                    .await?
            }
        };
        let existing = self.runtime_of(&mut lock, &ws, provider.as_ref()).await?;
        let runtime_id = existing
            .as_ref()
            .map(|r| r.id)
            .unwrap_or_else(|| Uuid::new_v5(&ws.id, provider.kind().as_bytes()));
        if existing.is_none() {
            lock.hold_runtime(runtime_id, None);
        }
        let place = ExecSite {
            ws: &ws,
            kind,
            remote,
            runtime_id,
        };
        let spec = self
            .exec_spec(&mut lock, &place, e, provider.as_ref(), network)
            .await?;
        Ok(Prepared {
            ws,
            lock,
            kind,
            provider,
            remote,
            runtime_id,
            existing,
            spec,
        })
    }

    /// The network a remote workspace's sandbox was created with (it keeps it for
    /// cloning); `None` for a host workspace.
    fn remote_network(
        &self,
        ws: &WorkspaceRow,
        remote: bool,
    ) -> Result<Option<NetworkPolicy>, CommandError> {
        if !remote {
            return Ok(None);
        }
        let provider = self.remote_provider(&ws.node)?;
        Ok(provider.workspaces().map(|w| w.network()))
    }

    /// The workspace's runtime of `provider`, if one is recorded (read on the lock's
    /// connection: one pool checkout for the whole exec).
    async fn runtime_of(
        &self,
        lock: &mut AdvisoryLock,
        ws: &WorkspaceRow,
        provider: &dyn RuntimeProvider,
    ) -> Result<Option<RuntimeRow>, CommandError> {
        let found = rows::runtimes_of_versioned(lock.conn(), ws.id)
            .await
            .map_err(store_error)?
            .into_iter()
            .find(|(r, _)| r.backend_kind == provider.kind());
        // Held with the lock, so the start events fold onto it (ADR 36).
        if let Some((row, version)) = &found {
            lock.hold_runtime(row.id, Some((row.clone(), version.clone())));
        }
        Ok(found.map(|(row, _)| row))
    }

    /// The runtime's spec: the workspace mounted (and its repo cache, read-only, for a
    /// host workspace), the image if the provider runs the default one, the labels.
    async fn exec_spec(
        &self,
        lock: &mut AdvisoryLock,
        place: &ExecSite<'_>,
        e: &Exec,
        provider: &dyn RuntimeProvider,
        remote_network: Option<NetworkPolicy>,
    ) -> Result<RuntimeSpec, CommandError> {
        let ws = place.ws;
        let cache_dir = if place.remote {
            // The sandbox's own clone: nothing of the host is mounted.
            None
        } else {
            rows::repo_cache(lock.conn(), ws.repo_cache_id)
                .await
                .map_err(store_error)?
                .map(|c| PathBuf::from(c.local_path))
        };
        let ws_dir = PathBuf::from(&ws.local_path);
        let mut spec = RuntimeSpec {
            image: self
                .config
                .docker_image
                .clone()
                .filter(|_| provider.uses_default_image()),
            workdir: ws_dir.clone(),
            mounts: mounts(place, provider, ws_dir, cache_dir),
            env: Default::default(),
            resources: ResourceHints::default(),
            // A remote sandbox keeps the network it was created with for cloning.
            network: e.network.or(remote_network).unwrap_or_default(),
            labels: [
                ("grove.workspace".to_string(), ws.id.to_string()),
                ("grove.runtime".to_string(), place.runtime_id.to_string()),
            ]
            .into(),
        };
        if place.remote {
            // The sandbox of a remote workspace is its user's and project's.
            spec.labels
                .insert("grove.user".to_string(), ws.user_id.clone());
            spec.labels
                .insert("grove.project".to_string(), ws.project_id.clone());
        }
        Ok(spec)
    }

    /// Commands run as the provider's unprivileged sandbox identity, if it states one,
    /// so the workspace is handed over to it (once; later execs find it already owned).
    /// Read-only ones too: git refuses a repository another user owns, and the
    /// read-only mount, not ownership, is what keeps an analysis workspace unchanged.
    async fn hand_over(
        &self,
        provider: &dyn RuntimeProvider,
        ws: &WorkspaceRow,
    ) -> Result<(), CommandError> {
        let Some(id) = provider.sandbox_identity() else {
            return Ok(());
        };
        let dir = PathBuf::from(&ws.local_path);
        tokio::task::spawn_blocking(move || grove_git::tree::hand_over(&dir, id.uid, id.gid))
            .await
            .map_err(|e| internal(format!("ownership task failed: {e}")))?
            .map_err(|e| {
                internal(format!(
                    "handing the workspace to the sandbox user failed: {e}"
                ))
            })
    }

    /// The end of an exec stopped because its lock's lease was lost. The command's
    /// processes were killed as its future dropped; a long-lived runtime (a container, a
    /// remote sandbox) is also destroyed, bounded by the lease's margin, so nothing of
    /// the command can still run when another holder takes the lock.
    async fn fenced_exec(
        &self,
        provider: &dyn RuntimeProvider,
        backend_id: &str,
        ws: &WorkspaceRow,
        finish: &Finish,
        lock: AdvisoryLock,
    ) -> Handled {
        let (command_id, runtime_id) = (finish.command_id, finish.runtime_id);
        let margin = grove_postgres::locks::lease_margin(grove_postgres::locks::lease_length());
        tracing::warn!(command = %command_id, workspace = %ws.id, "the workspace lock's lease was lost (database unreachable): the command was stopped");
        let mut events = vec![finish.failed(ws, "fenced")];
        if !provider.sandbox_per_exec() {
            match tokio::time::timeout(margin, provider.destroy(backend_id)).await {
                Ok(Ok(())) | Ok(Err(RuntimeError::NotFound(_))) => {
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
            locks: vec![lock],
            correlation: correlation_of(ws),
        }
    }
}

/// Where an exec runs: its workspace, class, placement and runtime record.
struct ExecSite<'a> {
    ws: &'a WorkspaceRow,
    kind: ExecKind,
    remote: bool,
    runtime_id: Uuid,
}

/// The workspace's mount, and the repo cache's (read-only: git inside the workspace
/// reads the cache's objects through alternates). A runtime that builds a sandbox per
/// exec gives a read command a read-only view even of a writable workspace; a
/// long-lived one keeps the mount it was created with, so it gets the workspace's own
/// writability.
fn mounts(
    place: &ExecSite<'_>,
    provider: &dyn RuntimeProvider,
    ws_dir: PathBuf,
    cache_dir: Option<PathBuf>,
) -> Vec<Mount> {
    let per_exec_sandbox = provider.sandbox_per_exec() && !place.remote;
    let writable = place.ws.capabilities.writable;
    let mut mounts = vec![Mount {
        source: ws_dir.clone(),
        target: ws_dir,
        writable: writable && (place.kind.is_mutating() || !per_exec_sandbox),
    }];
    if let Some(cache_dir) = cache_dir {
        mounts.push(Mount {
            source: cache_dir.clone(),
            target: cache_dir,
            writable: false,
        });
    }
    mounts
}

/// `runtime.started` unless the runtime is already running, then `exec.started`.
fn start_events(e: &Exec, command_id: Uuid, p: &Prepared) -> Vec<Event> {
    let (ws, provider, spec, runtime_id) = (&p.ws, &p.provider, &p.spec, p.runtime_id);
    let mut events = match &p.existing {
        Some(r) if r.state == RuntimeState::Running => vec![],
        _ => vec![Event::RuntimeStarted {
            runtime_id,
            workspace_id: ws.id,
            backend_kind: provider.kind().to_string(),
            backend_runtime_id: provider.backend_id(spec),
            image: spec.image.clone(),
        }],
    };
    events.push(Event::ExecStarted {
        exec_id: command_id,
        workspace_id: ws.id,
        runtime_id,
        kind: p.kind,
        argv: e.argv.clone(),
        env_keys: e.env.keys().cloned().collect(),
        timeout_ms: e.timeout_ms,
    });
    events
}

/// An inline exec's start (ADR 31): its ledger row and claimed job
/// (`queue::start_inline`) and its start events, in one transaction on the lock's
/// connection. `None` (nothing written) when the command id is already known.
async fn start_inline_on(
    pool: &sqlx::PgPool,
    lock: &mut AdvisoryLock,
    (command_id, command, queue_name, worker): (Uuid, &Command, &str, &str),
    events: &[Event],
    metadata: &Metadata,
) -> Result<Option<ClaimedJob>, CommandError> {
    if let Some(started) =
        start_folded(lock, (command, queue_name, worker), events, metadata).await?
    {
        store::announce_appended_soon(pool);
        return Ok(started);
    }
    let mut tx = sqlx::Connection::begin(lock.conn())
        .await
        .map_err(|e| store_error(e.into()))?;
    let job = queue::start_inline(&mut tx, command_id, command, queue_name, worker)
        .await
        .map_err(store_error)?;
    let Some(job) = job else {
        tx.rollback().await.map_err(|e| store_error(e.into()))?;
        return Ok(None);
    };
    store::append(&mut tx, events, metadata, now())
        .await
        .map_err(store_error)?;
    tx.commit().await.map_err(|e| store_error(e.into()))?;
    lock.flushed_by_commit();
    lock.forget_rows();
    store::announce_appended_soon(pool);
    Ok(Some(job))
}

/// [`start_inline_on`] in one statement, its start events folded onto the rows the lock
/// holds (ADR 36). `None` when they do not fold (a row not held, or changed since it was
/// read): then the start is written the usual way.
async fn start_folded(
    lock: &mut AdvisoryLock,
    (command, queue_name, worker): (&Command, &str, &str),
    events: &[Event],
    metadata: &Metadata,
) -> Result<Option<Option<ClaimedJob>>, CommandError> {
    let Some(folded) = lock
        .held_rows()
        .fold(events, metadata, now())
        .map_err(store_error)?
    else {
        return Ok(None);
    };
    match queue::start_inline_folded(lock.conn(), command, queue_name, worker, &folded).await {
        Ok(Some((job, version))) => {
            lock.flushed_by_commit();
            lock.absorb(folded, version);
            Ok(Some(Some(job)))
        }
        Ok(None) => Ok(Some(None)),
        Err(e) if grove_postgres::folded::is_stale(&e) => {
            lock.forget_rows();
            Ok(None)
        }
        Err(e) => Err(store_error(e)),
    }
}

/// Commits `events` in a transaction on the lock's connection, and wakes the log's
/// followers after.
async fn record_on(
    pool: &sqlx::PgPool,
    lock: &mut AdvisoryLock,
    events: &[Event],
    metadata: &Metadata,
) -> Result<(), CommandError> {
    if let Some(folded) = lock
        .held_rows()
        .fold(events, metadata, now())
        .map_err(store_error)?
    {
        match store::append_folded(lock.conn(), &folded).await {
            Ok(version) => {
                lock.flushed_by_commit();
                lock.absorb(folded, version);
                store::announce_appended_soon(pool);
                return Ok(());
            }
            Err(e) if grove_postgres::folded::is_stale(&e) => lock.forget_rows(),
            Err(e) => return Err(store_error(e)),
        }
    }
    let mut tx = sqlx::Connection::begin(lock.conn())
        .await
        .map_err(|e| store_error(e.into()))?;
    store::append(&mut tx, events, metadata, now())
        .await
        .map_err(store_error)?;
    tx.commit().await.map_err(|e| store_error(e.into()))?;
    lock.flushed_by_commit();
    lock.forget_rows();
    store::announce_appended_soon(pool);
    Ok(())
}

fn exec_request(e: &Exec, kind: ExecKind) -> ExecRequest {
    ExecRequest {
        argv: e.argv.clone(),
        cwd: e.cwd.as_ref().map(PathBuf::from),
        env: e.env.clone(),
        timeout: e.timeout_ms.map(Duration::from_millis),
        stdin: e.stdin.clone(),
        max_output_bytes: Some(e.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT_BYTES) as usize),
        mutating: kind.is_mutating(),
    }
}

/// The `exec.finished` of one exec.
struct Finish {
    command_id: Uuid,
    runtime_id: Uuid,
    started: Instant,
}

impl Finish {
    /// The caller's outcome and `exec.finished`: `completed` with the command's exit,
    /// else `resource_limit` or `rejected` (recorded with the failure).
    fn of(
        &self,
        ws: &WorkspaceRow,
        outcome: Result<ExecResult, RuntimeError>,
    ) -> (Result<ExecOutcome, CommandError>, Vec<Event>) {
        let r = match outcome {
            Ok(r) => r,
            Err(err) => {
                let outcome = match err {
                    RuntimeError::ResourceLimit(_) => "resource_limit",
                    _ => "rejected",
                };
                return (Err(err.into()), vec![self.failed(ws, outcome)]);
            }
        };
        let duration_ms = self.started.elapsed().as_millis() as u64;
        let event = Event::ExecFinished {
            exec_id: self.command_id,
            workspace_id: ws.id,
            runtime_id: self.runtime_id,
            outcome: "completed".into(),
            exit_code: Some(r.exit_code),
            timed_out: r.timed_out,
            truncated: r.truncated,
            duration_ms,
            stdout_bytes: r.stdout.len() as u64,
            stderr_bytes: r.stderr.len() as u64,
        };
        let outcome = ExecOutcome {
            exit_code: r.exit_code,
            stdout: String::from_utf8_lossy(&r.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&r.stderr).into_owned(),
            timed_out: r.timed_out,
            truncated: r.truncated,
            duration_ms,
        };
        (Ok(outcome), vec![event])
    }

    /// `exec.finished` with `outcome` and no exit.
    fn failed(&self, ws: &WorkspaceRow, outcome: &str) -> Event {
        Event::ExecFinished {
            exec_id: self.command_id,
            workspace_id: ws.id,
            runtime_id: self.runtime_id,
            outcome: outcome.into(),
            exit_code: None,
            timed_out: false,
            truncated: false,
            duration_ms: self.started.elapsed().as_millis() as u64,
            stdout_bytes: 0,
            stderr_bytes: 0,
        }
    }
}
