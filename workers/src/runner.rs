//! The worker loop: claim jobs, run handlers, record outcomes, heartbeat, recover orphans.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use grove_core::commands::Command;
use grove_core::error::CommandError;
use grove_core::events::{Correlation, Event, Metadata};
use grove_core::ports::GitToken;
use grove_postgres::output;
use grove_postgres::queue::{self, ClaimedJob};
use grove_postgres::StoreError;
use sqlx::postgres::PgListener;
use tokio::sync::{Notify, Semaphore};
use tracing::{debug, info, warn};

use crate::context::{now, Handled, JobContext};

mod inline;
mod outcome;
mod reuse;
pub use inline::InlineWriter;
use outcome::{run_job, Chain};

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
    deps: Arc<JobContext>,
    queues: Vec<String>,
}

impl Worker {
    pub fn new(deps: JobContext) -> Self {
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

    pub fn deps(&self) -> &JobContext {
        &self.deps
    }

    /// Read tools of this node's workspaces, answered in this process (ADR 24).
    pub fn inline_reads(&self) -> Arc<dyn grove_core::inline::InlineReads> {
        Arc::new(crate::jobs::reads::InlineReader::new(self.deps.clone()))
    }

    /// Write tools and execs of this node's workspaces, run in this process (ADR 31).
    pub fn inline_writes(&self) -> Arc<dyn grove_core::inline::InlineWrites> {
        Arc::new(InlineWriter::new(self.deps.clone()))
    }

    /// Registers this worker so it may lock jobs (`apalis.jobs.lock_by` references it).
    pub async fn register(&self) -> Result<(), StoreError> {
        let cfg = &self.deps.config;
        queue::register_worker(&self.deps.pool, &cfg.worker_id, &self.queues).await?;
        queue::record_concurrency(&self.deps.pool, &cfg.worker_id, cfg.concurrency).await
    }

    /// Claims and runs at most one job, to completion. Tests drive the queue with it.
    pub async fn try_execute_job(&self) -> Result<Outcome, StoreError> {
        for q in &self.queues {
            let jobs =
                queue::claim_and_start(&self.deps.pool, &self.deps.config.worker_id, q, 1).await?;
            if let Some((job, start)) = jobs.into_iter().next() {
                run_job(self.deps.clone(), job, start, None).await;
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
        let eviction_schedule = tokio::spawn(crate::sweep::schedule::cron_loop(deps.clone()));
        let d = deps.clone();
        tokio::spawn(async move {
            d.recover_journals().await;
            d.move_saved_work_out_of_caches().await
        });

        let chain = Arc::new(Chain::new(self.queues.clone()));
        let permits = Arc::new(Semaphore::new(cfg.concurrency));
        let mut claim_failures = Backoff::default();
        let mut running = tokio::task::JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            while running.try_join_next().is_some() {}
            // Claim (and start) as many jobs as there are free slots, queue by queue.
            let mut claimed_any = false;
            let mut pause = None;
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
                            let chain = chain.clone();
                            running.spawn(async move {
                                // Each outcome claims this slot's next job in its own
                                // transaction (ADR 33): the task runs jobs until none
                                // is due.
                                let mut next = vec![(job, start)];
                                while let Some((job, start)) = next.pop() {
                                    let claimed =
                                        run_job(deps.clone(), job, start, Some(&chain)).await;
                                    next.extend(claimed);
                                }
                                drop(permit);
                                // A slot is free: look for more work at once.
                                wake.notify_one();
                            });
                        }
                    }
                    Err(e) => {
                        pause = Some(claim_failures.failed(&e));
                        break;
                    }
                }
                claim_failures.succeeded();
            }
            if claimed_any && permits.available_permits() > 0 {
                continue;
            }
            tokio::select! {
                _ = &mut shutdown => break,
                _ = wake.notified() => {}
                _ = tokio::time::sleep(pause.unwrap_or(cfg.poll_every)) => {}
            }
        }
        // Outcomes recorded from here claim nothing more.
        chain
            .open
            .store(false, std::sync::atomic::Ordering::Release);
        self.stop(running).await;
        maintenance.abort();
        listener.abort();
        eviction_schedule.abort();
        Ok(())
    }
}

/// How long a stopping worker lets its jobs in flight run: `GROVE_SHUTDOWN_GRACE_MS`,
/// else 20 s.
pub fn shutdown_grace() -> Duration {
    std::env::var("GROVE_SHUTDOWN_GRACE_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
        .unwrap_or(Duration::from_secs(20))
}

impl Worker {
    /// Lets the jobs in flight finish within [`shutdown_grace`]; then stops the rest
    /// (their commands are killed as their futures drop, their locks freed) and hands
    /// their jobs back to the queue, where another worker takes them up (an exec
    /// among them ends as `worker_lost`, since it may have run in part).
    async fn stop(&self, mut running: tokio::task::JoinSet<()>) {
        let grace = shutdown_grace();
        info!(
            jobs = running.len(),
            grace_ms = grace.as_millis() as u64,
            "worker stopping: waiting for jobs in flight"
        );
        let drained = tokio::time::timeout(grace, async {
            while running.join_next().await.is_some() {}
        })
        .await
        .is_ok();
        if drained {
            return;
        }
        running.abort_all();
        while running.join_next().await.is_some() {}
        let left: Vec<String> = self
            .deps
            .inflight
            .lock()
            .expect("inflight set")
            .drain()
            .collect();
        for job in &left {
            if let Err(e) = queue::requeue(&self.deps.pool, job).await {
                warn!(job = %job, error = %e, "handing a job back failed; orphan recovery will");
            }
        }
        warn!(
            jobs = left.len(),
            "stopped jobs still running after the grace and handed them back"
        );
    }
}

/// Capped exponential backoff for a claim loop whose database is unreachable: 0.2 s
/// doubling to 10 s, and one warning per interval of [`Backoff::SAY_EVERY`] rather
/// than one per failed claim.
#[derive(Default)]
struct Backoff {
    pause: Option<Duration>,
    said: Option<std::time::Instant>,
    failures: u64,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(200);
    const CAP: Duration = Duration::from_secs(10);
    const SAY_EVERY: Duration = Duration::from_secs(30);

    /// Counts a failed claim; returns how long to wait before the next.
    fn failed(&mut self, e: &StoreError) -> Duration {
        self.failures += 1;
        let pause = self.pause.map_or(Self::FIRST, |p| (p * 2).min(Self::CAP));
        self.pause = Some(pause);
        if self.said.is_none_or(|t| t.elapsed() >= Self::SAY_EVERY) {
            warn!(error = %e, failures = self.failures, retry_in_ms = pause.as_millis() as u64, "claiming jobs failed (database unreachable?); retrying with backoff");
            self.said = Some(std::time::Instant::now());
        }
        pause
    }

    fn succeeded(&mut self) {
        if self.failures > 0 {
            info!(failures = self.failures, "claiming jobs works again");
        }
        *self = Self::default();
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
async fn maintain(deps: Arc<JobContext>, wake: Arc<Notify>, queues: Vec<String>) {
    let cfg = &deps.config;
    let mut tick = tokio::time::interval(cfg.heartbeat_every);
    let mut last_prune = std::time::Instant::now() - Duration::from_secs(3600);
    // Due at once: a worker's first tick sweeps what a crash left behind.
    let mut last_orphan_sweep = std::time::Instant::now() - ORPHAN_SWEEP_EVERY;
    // Since when our heartbeats have gone through without a break. Another worker's
    // silence proves it lost only if we could have heard it all along: after a
    // database outage every worker is equally stale, so none recovers another's jobs
    // until it has itself been connected for the whole bound again.
    let mut connected_since: Option<std::time::Instant> = None;
    loop {
        tick.tick().await;
        match queue::heartbeat(&deps.pool, &cfg.worker_id).await {
            Err(e) => {
                if connected_since.take().is_some() {
                    warn!(error = %e, "heartbeat failed");
                }
                continue;
            }
            // Our row is gone (pruned while we were cut off): register again.
            Ok(false) => {
                let _ = queue::register_worker(&deps.pool, &cfg.worker_id, &queues).await;
            }
            Ok(true) => {}
        }
        let connected_for = connected_since
            .get_or_insert_with(std::time::Instant::now)
            .elapsed();
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
        let recovered = if connected_for >= cfg.worker_lost_after {
            queue::recover_orphans(&deps.pool, cfg.worker_lost_after).await
        } else {
            Ok(0)
        };
        match recovered {
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
            if let Err(e) = output::prune_kept(&deps.pool, cfg.output_retention).await {
                warn!(error = %e, "pruning kept exec output failed");
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
async fn sweep_orphans(deps: &JobContext) {
    for kind in deps.runtimes.kinds() {
        let Some(provider) = deps.runtimes.get(kind) else {
            continue;
        };
        let owned =
            match grove_postgres::worker_queries::runtime_ids_of_kind(&deps.pool, kind).await {
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
            grove_postgres::store::announce_appended_soon(&deps.pool);
            Ok::<_, StoreError>(())
        }
        .await;
        if let Err(e) = recorded {
            warn!(error = %e, "recording orphan removals failed");
        }
    }
}

fn metadata(deps: &JobContext, job: &ClaimedJob, correlation: Correlation) -> Metadata {
    Metadata {
        command_id: job.command_id,
        correlation,
        worker_id: deps.config.worker_id.clone(),
        node: deps.config.node.clone(),
    }
}

async fn handle(
    deps: &JobContext,
    job: &ClaimedJob,
    command: &Command,
    token: Option<GitToken>,
    at: chrono::DateTime<chrono::Utc>,
) -> Result<Handled, CommandError> {
    // A local repository URL its submitter may not use is refused before any effect.
    deps.check_repo_source(command, job.command_id).await?;
    // A test hook, compiled into debug builds only: the fault suite injects a panic into
    // the handler of one command kind.
    #[cfg(debug_assertions)]
    if std::env::var("GROVE_TEST_PANIC_ON").is_ok_and(|k| k == command.kind()) {
        panic!("injected panic (GROVE_TEST_PANIC_ON={})", command.kind());
    }
    match command {
        Command::EnsureRepoCache(c) => {
            deps.ensure_repo_cache(c, job.command_id, token.as_ref(), at)
                .await
        }
        Command::AcquireWorkspace(c) => {
            let handled = deps
                .acquire_workspace(c, job.command_id, token.as_ref(), at)
                .await;
            if let Ok(h) = &handled {
                crate::sweep::schedule::after_acquire(deps, h).await;
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
            deps.restore_workspace(*workspace_id, job.command_id, token.as_ref(), at)
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
    }
}
