//! The worker loop: claim jobs, run handlers, record outcomes, heartbeat, recover orphans.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use grove_core::commands::Command;
use grove_core::error::{CommandError, ErrorKind};
use grove_core::events::{Correlation, Event, Metadata};
use grove_core::ports::GitToken;
use grove_postgres::queue::{self, ClaimedJob, Start};
use grove_postgres::StoreError;
use sqlx::postgres::PgListener;
use tokio::sync::{Notify, Semaphore};
use tracing::{debug, info, warn};

use crate::handlers::{correlation_of, now, Deps, Handled};

/// What one step of the worker did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A job was claimed and carried through to its recorded outcome.
    Done,
    /// No job was due.
    EmptyQueue,
}

/// A worker process's engine.
pub struct Worker {
    deps: Arc<Deps>,
    queues: Vec<String>,
}

impl Worker {
    pub fn new(deps: Deps) -> Self {
        // Its node's queue, then the queue of each remote provider configured here (the
        // jobs of workspaces placed in it, ADR 15), then the shared one.
        let mut queues = vec![queue::node_queue(&deps.config.node)];
        for kind in deps.runtimes.kinds() {
            if deps
                .runtimes
                .get(kind)
                .is_some_and(|p| p.workspaces().is_some())
            {
                queues.push(queue::provider_queue(kind));
            }
        }
        queues.push(queue::shared_queue());
        Self {
            deps: Arc::new(deps),
            queues,
        }
    }

    pub fn deps(&self) -> &Deps {
        &self.deps
    }

    /// Registers this worker so it may lock jobs (`apalis.jobs.lock_by` references it).
    pub async fn register(&self) -> Result<(), StoreError> {
        queue::register_worker(&self.deps.pool, &self.deps.config.worker_id, &self.queues).await
    }

    /// Claims and runs at most one job, to completion. Tests drive the queue with it.
    pub async fn try_execute_job(&self) -> Result<Outcome, StoreError> {
        for q in &self.queues {
            let jobs =
                queue::claim_and_start(&self.deps.pool, &self.deps.config.worker_id, q, 1).await?;
            if let Some((job, start)) = jobs.into_iter().next() {
                run_job(self.deps.clone(), job, start).await;
                return Ok(Outcome::Done);
            }
        }
        Ok(Outcome::EmptyQueue)
    }

    /// Runs until `shutdown` resolves, then stops claiming and waits for jobs in flight.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), StoreError> {
        let deps = self.deps.clone();
        let cfg = deps.config.clone();
        self.register().await?;
        info!(worker = %cfg.worker_id, node = %cfg.node, concurrency = cfg.concurrency, "worker started");

        let wake = Arc::new(Notify::new());
        let maintenance = tokio::spawn(maintain(deps.clone(), wake.clone(), self.queues.clone()));
        let listener = tokio::spawn(listen(deps.pool.clone(), wake.clone()));
        let eviction_schedule = tokio::spawn(crate::eviction::cron_loop(deps.clone()));
        let d = deps.clone();
        tokio::spawn(async move {
            d.recover_journals().await;
            d.move_saved_work_out_of_caches().await
        });

        let permits = Arc::new(Semaphore::new(cfg.concurrency));
        tokio::pin!(shutdown);
        loop {
            // Claim (and start) as many jobs as there are free slots, queue by queue.
            let mut claimed_any = false;
            for q in &self.queues {
                let free = permits.available_permits();
                if free == 0 {
                    break;
                }
                match queue::claim_and_start(&deps.pool, &cfg.worker_id, q, free as i32).await {
                    Ok(jobs) => {
                        for (job, start) in jobs {
                            claimed_any = true;
                            let permit = permits
                                .clone()
                                .acquire_owned()
                                .await
                                .expect("semaphore open");
                            let deps = deps.clone();
                            let wake = wake.clone();
                            tokio::spawn(async move {
                                run_job(deps, job, start).await;
                                drop(permit);
                                // A slot is free: look for more work at once.
                                wake.notify_one();
                            });
                        }
                    }
                    Err(e) => {
                        warn!(error = %e, "claiming jobs failed; retrying");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
            if claimed_any && permits.available_permits() > 0 {
                continue;
            }
            tokio::select! {
                _ = &mut shutdown => break,
                _ = wake.notified() => {}
                _ = tokio::time::sleep(cfg.poll_every) => {}
            }
        }
        info!("worker stopping: waiting for jobs in flight");
        let _ = permits.acquire_many(cfg.concurrency as u32).await;
        maintenance.abort();
        listener.abort();
        eviction_schedule.abort();
        Ok(())
    }
}

/// Wakes the claim loop on every job insert; reconnects by itself when Postgres restarts.
async fn listen(pool: sqlx::PgPool, wake: Arc<Notify>) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                debug!(error = %e, "listener connect failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if let Err(e) = listener.listen(queue::JOB_INSERT_CHANNEL).await {
            debug!(error = %e, "LISTEN failed");
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        // A fresh subscription may have missed notifications: look once.
        wake.notify_one();
        loop {
            match listener.try_recv().await {
                Ok(Some(_)) => wake.notify_one(),
                // The connection dropped; try_recv reconnects on the next call, but the
                // channel subscription is re-established explicitly to be safe.
                Ok(None) => break,
                Err(e) => {
                    debug!(error = %e, "listener failed");
                    break;
                }
            }
        }
    }
}

/// Heartbeats, orphan recovery and pruning, on their schedules.
async fn maintain(deps: Arc<Deps>, wake: Arc<Notify>, queues: Vec<String>) {
    let cfg = &deps.config;
    let mut tick = tokio::time::interval(cfg.heartbeat_every);
    let mut last_prune = std::time::Instant::now() - Duration::from_secs(3600);
    // Due at once: a worker's first tick sweeps what a crash left behind.
    let mut last_orphan_sweep = std::time::Instant::now() - ORPHAN_SWEEP_EVERY;
    loop {
        tick.tick().await;
        match queue::heartbeat(&deps.pool, &cfg.worker_id).await {
            Err(e) => {
                warn!(error = %e, "heartbeat failed");
                continue;
            }
            // Our row is gone (pruned while we were cut off): register again.
            Ok(false) => {
                let _ = queue::register_worker(&deps.pool, &cfg.worker_id, &queues).await;
            }
            Ok(true) => {}
        }
        let inflight: Vec<String> = deps
            .inflight
            .lock()
            .expect("inflight set")
            .iter()
            .cloned()
            .collect();
        match queue::requeue_abandoned(&deps.pool, &cfg.worker_id, &inflight, cfg.worker_lost_after)
            .await
        {
            Ok(0) => {}
            Ok(n) => {
                info!(
                    jobs = n,
                    "handed back jobs this worker holds but no longer runs"
                );
                wake.notify_one();
            }
            Err(e) => warn!(error = %e, "sweeping abandoned jobs failed"),
        }
        match queue::recover_orphans(&deps.pool, cfg.worker_lost_after).await {
            Ok(0) => {}
            Ok(n) => {
                info!(jobs = n, "recovered jobs of a lost worker");
                wake.notify_one();
            }
            Err(e) => warn!(error = %e, "orphan recovery failed"),
        }
        if last_orphan_sweep.elapsed() > ORPHAN_SWEEP_EVERY {
            last_orphan_sweep = std::time::Instant::now();
            sweep_orphans(&deps).await;
        }
        if last_prune.elapsed() > Duration::from_secs(3600) {
            last_prune = std::time::Instant::now();
            if let Err(e) = queue::prune(&deps.pool, cfg.prune_after).await {
                warn!(error = %e, "pruning failed");
            }
        }
    }
}

/// How often each worker looks for runtimes that no record owns.
const ORPHAN_SWEEP_EVERY: Duration = Duration::from_secs(60);
/// Runtimes younger than this are spared: their record may not be committed yet.
const ORPHAN_GRACE: Duration = Duration::from_secs(30);

/// Removes backend runtimes (containers) that no runtime record owns, recording each
/// removal as a `runtime.destroyed` event with reason `orphan`.
async fn sweep_orphans(deps: &Deps) {
    for kind in deps.runtimes.kinds() {
        let Some(provider) = deps.runtimes.get(kind) else {
            continue;
        };
        let owned = match sqlx::query_scalar::<_, uuid::Uuid>(
            "SELECT id FROM grove.sandbox_runtimes WHERE backend_kind = $1",
        )
        .bind(kind)
        .fetch_all(&deps.pool)
        .await
        {
            Ok(ids) => ids.into_iter().map(|id| id.to_string()).collect(),
            Err(e) => {
                warn!(error = %e, "orphan sweep: reading runtime records failed");
                continue;
            }
        };
        let removed = match provider.sweep_orphans(&owned, ORPHAN_GRACE).await {
            Ok(removed) => removed,
            Err(e) => {
                warn!(runtime = kind, error = %e, "orphan sweep failed");
                continue;
            }
        };
        let events: Vec<Event> = removed
            .iter()
            .filter_map(|id| uuid::Uuid::parse_str(id).ok())
            .map(|runtime_id| Event::RuntimeDestroyed {
                runtime_id,
                reason: "orphan: no runtime record owns it".into(),
            })
            .collect();
        if events.is_empty() {
            continue;
        }
        info!(
            runtime = kind,
            removed = events.len(),
            "removed orphaned runtimes"
        );
        let md = Metadata {
            command_id: uuid::Uuid::now_v7(),
            correlation: Correlation::default(),
            worker_id: deps.config.worker_id.clone(),
            node: deps.config.node.clone(),
        };
        let recorded = async {
            let mut tx = deps.pool.begin().await?;
            grove_postgres::store::append(&mut tx, &events, &md, now()).await?;
            tx.commit().await?;
            Ok::<_, StoreError>(())
        }
        .await;
        if let Err(e) = recorded {
            warn!(error = %e, "recording orphan removals failed");
        }
    }
}

fn metadata(deps: &Deps, job: &ClaimedJob, correlation: Correlation) -> Metadata {
    Metadata {
        command_id: job.command_id,
        correlation,
        worker_id: deps.config.worker_id.clone(),
        node: deps.config.node.clone(),
    }
}

/// Carries one claimed job to its recorded outcome. Database failures on the way leave
/// the job to orphan recovery (it stays locked by us until our heartbeat stops) or to
/// the retry the next delivery makes.
async fn run_job(deps: Arc<Deps>, job: ClaimedJob, start: Start) {
    deps.inflight
        .lock()
        .expect("inflight set")
        .insert(job.job_id.clone());
    if let Err(e) = run_job_inner(&deps, &job, start).await {
        // The outcome could not be recorded (typically Postgres went away). The ledger
        // row is left as it is: the next delivery of this job then sees an attempt that
        // started and never finished, and re-runs it if it is idempotent or ends it as
        // worker_lost if it is an exec. The job row is handed back here if the
        // database answers, else by the next sweep of our own stale jobs.
        warn!(command = %job.command_id, error = %e, "recording a job's outcome failed");
        let _ = queue::requeue(&deps.pool, &job.job_id).await;
    }
    deps.inflight
        .lock()
        .expect("inflight set")
        .remove(&job.job_id);
}

/// Runs a job that `queue::claim_and_start` claimed and started.
async fn run_job_inner(deps: &Deps, job: &ClaimedJob, start: Start) -> Result<(), StoreError> {
    let Start::Run {
        command,
        attempt,
        max_attempts,
        resumed,
        token,
    } = start
    else {
        return Ok(());
    };
    let at = now();
    if resumed && !command.is_idempotent() {
        return finish_worker_lost(deps, job, &command).await;
    }
    if resumed && attempt > max_attempts {
        // Every attempt so far died with its worker: stop redelivering it.
        let md = metadata(deps, job, Correlation::default());
        let err = CommandError::new(
            ErrorKind::WorkerLost,
            format!(
                "the worker running this command stopped {} times; giving up",
                attempt - 1
            ),
        );
        return queue::finish(
            &deps.pool,
            job,
            &deps.config.worker_id,
            &Err(err),
            &[],
            &md,
            at,
        )
        .await;
    }
    let outcome = match command.validate() {
        Err(e) => Err(CommandError::from(e)),
        Ok(()) => handle(deps, job, &command, token.map(GitToken::new), at).await,
    };
    match outcome {
        Ok(handled) => {
            let md = metadata(deps, job, handled.correlation);
            // Rows in results were folded at `at`; an exec's finish happens after its
            // start events, so it is stamped now.
            let at = if matches!(command, Command::Exec(_)) {
                now()
            } else {
                at
            };
            let mut locks = handled.locks.into_iter();
            // On the first lock's connection when there is one (no further checkout),
            // announced in the round trip that frees that lock, after the commit.
            match locks.next() {
                Some(mut first) => {
                    let res = queue::finish_on(
                        first.conn(),
                        job,
                        &deps.config.worker_id,
                        &handled.result,
                        &handled.events,
                        &md,
                        at,
                    )
                    .await;
                    let _ = match res {
                        Ok(true) => first.release_announcing(job.command_id).await,
                        _ => first.release().await,
                    };
                    for lock in locks {
                        let _ = lock.release().await;
                    }
                    res.map(|_| ())
                }
                None => {
                    queue::finish(
                        &deps.pool,
                        job,
                        &deps.config.worker_id,
                        &handled.result,
                        &handled.events,
                        &md,
                        at,
                    )
                    .await
                }
            }
        }
        Err(e) if e.transient && attempt < max_attempts => {
            let delay = queue::backoff(attempt);
            info!(command = %job.command_id, attempt, delay_ms = delay.as_millis() as u64, error = %e.message, "retrying later");
            queue::retry_later(&deps.pool, job, &e, delay).await
        }
        Err(e) => {
            let md = metadata(deps, job, Correlation::default());
            queue::finish(
                &deps.pool,
                job,
                &deps.config.worker_id,
                &Err(e),
                &[],
                &md,
                at,
            )
            .await
        }
    }
}

/// An exec whose earlier attempt's worker died is not run again: a command may not be
/// safe to run twice. It ends as failed with `worker_lost`, which the caller can retry.
async fn finish_worker_lost(
    deps: &Deps,
    job: &ClaimedJob,
    command: &Command,
) -> Result<(), StoreError> {
    let Command::Exec(exec) = command else {
        // Any other command that is not safe to repeat (a tool's edit, commit or push)
        // left no start events: it only fails, and the caller decides.
        let workspace = match command.workspace_id() {
            Some(id) => {
                let mut conn = deps.pool.acquire().await?;
                grove_postgres::rows::workspace(&mut conn, id).await?
            }
            None => None,
        };
        let correlation = workspace.as_ref().map(correlation_of).unwrap_or_default();
        let err = CommandError::new(
            ErrorKind::WorkerLost,
            "the worker running this command stopped before it finished; the command was not re-run (check the workspace before retrying)",
        );
        return queue::finish(
            &deps.pool,
            job,
            &deps.config.worker_id,
            &Err(err),
            &[],
            &metadata(deps, job, correlation),
            now(),
        )
        .await;
    };
    let mut conn = deps.pool.acquire().await?;
    let ws = grove_postgres::rows::workspace(&mut conn, exec.workspace_id).await?;
    let started = grove_postgres::reader::events_of_command(&mut conn, job.command_id).await?;
    drop(conn);
    let mut events = Vec::new();
    for e in &started {
        if let Event::ExecStarted {
            workspace_id,
            runtime_id,
            ..
        } = &e.event
        {
            events.push(Event::ExecFinished {
                exec_id: job.command_id,
                workspace_id: *workspace_id,
                runtime_id: *runtime_id,
                outcome: "worker_lost".into(),
                exit_code: None,
                timed_out: false,
                truncated: false,
                duration_ms: 0,
                stdout_bytes: 0,
                stderr_bytes: 0,
            });
        }
    }
    if ws.is_none() {
        events.clear();
    }
    // The lost command may still be running inside a long-lived runtime (a container
    // outlives the worker that exec'd into it): destroy that runtime so nothing of the
    // command survives. The workspace stays; the next exec creates a fresh runtime.
    let runtime_ids: Vec<uuid::Uuid> = events
        .iter()
        .filter_map(|e| match e {
            Event::ExecFinished { runtime_id, .. } => Some(*runtime_id),
            _ => None,
        })
        .collect();
    if let Some(ws) = &ws {
        let mut conn = deps.pool.acquire().await?;
        let runtimes = grove_postgres::rows::runtimes_of(&mut conn, ws.id).await?;
        drop(conn);
        for r in runtimes.into_iter().filter(|r| runtime_ids.contains(&r.id)) {
            let Some(provider) = deps.runtimes.get(&r.backend_kind) else {
                continue;
            };
            match provider.destroy(&r.backend_runtime_id).await {
                Ok(()) | Err(grove_core::error::RuntimeError::NotFound(_)) => {
                    events.push(Event::RuntimeDestroyed {
                        runtime_id: r.id,
                        reason: "worker lost during an exec".into(),
                    });
                }
                Err(e) => {
                    warn!(runtime = %r.id, error = %e, "destroying the runtime of a lost exec failed")
                }
            }
        }
    }
    let correlation = ws.as_ref().map(correlation_of).unwrap_or_default();
    let md = metadata(deps, job, correlation);
    let err = CommandError::new(
        ErrorKind::WorkerLost,
        "the worker running this command stopped before it finished; the command was not re-run",
    );
    queue::finish(
        &deps.pool,
        job,
        &deps.config.worker_id,
        &Err(err),
        &events,
        &md,
        now(),
    )
    .await
}

async fn handle(
    deps: &Deps,
    job: &ClaimedJob,
    command: &Command,
    token: Option<GitToken>,
    at: chrono::DateTime<chrono::Utc>,
) -> Result<Handled, CommandError> {
    match command {
        Command::EnsureRepoCache(c) => deps.ensure_repo_cache(c, token.as_ref(), at).await,
        Command::AcquireWorkspace(c) => {
            let handled = deps
                .acquire_workspace(c, job.command_id, token.as_ref(), at)
                .await;
            if let Ok(h) = &handled {
                crate::eviction::after_acquire(deps, h).await;
            }
            handled
        }
        Command::Exec(e) => {
            let md = metadata(deps, job, Correlation::default());
            deps.exec(e, job.command_id, &md).await
        }
        Command::ReleaseSession {
            workspace_id,
            destroy_runtime,
        } => deps.release(*workspace_id, *destroy_runtime).await,
        Command::HibernateRuntime { workspace_id } => {
            deps.runtimes_down(*workspace_id, false).await
        }
        Command::DestroyRuntime { workspace_id } => deps.runtimes_down(*workspace_id, true).await,
        Command::DestroyWorkspace { workspace_id } => deps.destroy_workspace(*workspace_id).await,
        Command::EvictSweep(c) => deps.evict_sweep(c, job.command_id).await,
        Command::RestoreWorkspace { workspace_id } => {
            deps.restore_workspace(*workspace_id, token.as_ref(), at)
                .await
        }
        Command::ReleaseScope(c) => deps.release_scope(c, job.command_id).await,
        Command::PinWorkspace {
            workspace_id,
            until,
        } => deps.pin_workspace(*workspace_id, *until, at).await,
        Command::Tool(t) => deps.tool(t, token.as_ref()).await,
        Command::CreatePullRequest(c) => deps.create_pull_request(c, token.as_ref()).await,
        Command::CommentPullRequest(c) => deps.comment_pull_request(c, token.as_ref()).await,
        Command::MergeBack(m) => deps.merge_back(m).await,
        Command::MergeBackDiff {
            edit_workspace_id,
            task_workspace_id,
        } => {
            deps.merge_back_diff(*edit_workspace_id, *task_workspace_id)
                .await
        }
        _ => Err(CommandError::new(
            ErrorKind::Rejected,
            "unknown command kind",
        )),
    }
}
