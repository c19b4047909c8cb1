//! The worker loop: claim jobs, run handlers, record outcomes, heartbeat, recover orphans.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use grove_core::commands::Command;
use grove_core::error::{CommandError, ErrorKind};
use grove_core::events::{Correlation, Event, Metadata};
use grove_core::ports::GitToken;
use grove_postgres::locks::Fence;
use grove_postgres::queue::{self, ClaimedJob, Start};
use grove_postgres::StoreError;
use sqlx::postgres::PgListener;
use tokio::sync::{Notify, Semaphore};
use tracing::{debug, info, warn};

use crate::context::{correlation_of, now, Handled, JobContext};

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
        let eviction_schedule = tokio::spawn(crate::sweep::schedule::cron_loop(deps.clone()));
        let d = deps.clone();
        tokio::spawn(async move {
            d.recover_journals().await;
            d.move_saved_work_out_of_caches().await
        });

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
                            running.spawn(async move {
                                run_job(deps, job, start).await;
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

/// Carries one claimed job to its recorded outcome. Database failures on the way leave
/// the job to orphan recovery (it stays locked by us until our heartbeat stops) or to
/// the retry the next delivery makes. A handler that panics ends its job as failed
/// with `internal` (retried later when its kind is idempotent and attempts remain);
/// either way the job leaves the in-flight set.
async fn run_job(deps: Arc<JobContext>, job: ClaimedJob, start: Start) {
    use futures::FutureExt;
    deps.inflight
        .lock()
        .expect("inflight set")
        .insert(job.job_id.clone());
    let attempt = match &start {
        Start::Run {
            command,
            attempt,
            max_attempts,
            ..
        } => Some((command.is_idempotent(), *attempt, *max_attempts)),
        Start::AlreadyFinished => None,
    };
    let ran = std::panic::AssertUnwindSafe(run_job_inner(&deps, &job, start))
        .catch_unwind()
        .await;
    match ran {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            // The outcome could not be recorded even after waiting for the database.
            // The ledger row is left as it is: the next delivery of this job then sees
            // an attempt that started and never finished, and re-runs it if it is
            // idempotent or ends it as worker_lost if it is an exec. The job row is
            // handed back here if the database answers, else by the next sweep of our
            // own stale jobs.
            warn!(command = %job.command_id, error = %e, "recording a job's outcome failed");
            let _ = queue::requeue(&deps.pool, &job.job_id).await;
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".into());
            tracing::error!(command = %job.command_id, job = %job.job_id, panic = %what, "a job handler panicked");
            if let Some(attempt) = attempt {
                if let Err(e) = finish_panicked(&deps, &job, attempt).await {
                    warn!(command = %job.command_id, error = %e, "recording a panicked job's failure failed");
                    let _ = queue::requeue(&deps.pool, &job.job_id).await;
                }
            }
        }
    }
    deps.inflight
        .lock()
        .expect("inflight set")
        .remove(&job.job_id);
}

/// Ends a job whose handler panicked: a retry later for an idempotent kind with
/// attempts left, else failed with `internal`, and an exec it started is finished as
/// `internal_error`. The locks the handler held were freed as its future unwound.
async fn finish_panicked(
    deps: &JobContext,
    job: &ClaimedJob,
    (idempotent, attempt, max_attempts): (bool, i32, i32),
) -> Result<(), StoreError> {
    let err = CommandError::new(
        ErrorKind::Internal,
        "an internal error stopped this command; the worker logged it with the command id",
    );
    if idempotent && attempt < max_attempts {
        return queue::retry_later(&deps.pool, job, &err, queue::backoff(attempt)).await;
    }
    let events = close_started_execs(deps, job, "internal_error").await?;
    let md = metadata(deps, job, Correlation::default());
    finish_patiently(deps, job, &Err(err), &events, &md, now(), &[]).await
}

/// `exec.finished` (with `outcome`) for each `exec.started` the command committed: for
/// an exec that failed without a handled outcome after its start was recorded (a
/// panic, or the database going away right after the start committed).
async fn close_started_execs(
    deps: &JobContext,
    job: &ClaimedJob,
    outcome: &str,
) -> Result<Vec<Event>, StoreError> {
    let mut conn = deps.pool.acquire().await?;
    let started = grove_postgres::reader::events_of_command(&mut conn, job.command_id).await?;
    drop(conn);
    Ok(started
        .iter()
        .filter_map(|e| match &e.event {
            Event::ExecStarted {
                workspace_id,
                runtime_id,
                ..
            } => Some(Event::ExecFinished {
                exec_id: job.command_id,
                workspace_id: *workspace_id,
                runtime_id: *runtime_id,
                outcome: outcome.into(),
                exit_code: None,
                timed_out: false,
                truncated: false,
                duration_ms: 0,
                stdout_bytes: 0,
                stderr_bytes: 0,
            }),
            _ => None,
        })
        .collect())
}

/// Runs a job that `queue::claim_and_start` claimed and started.
async fn run_job_inner(
    deps: &JobContext,
    job: &ClaimedJob,
    start: Start,
) -> Result<(), StoreError> {
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
            // An exec's finish happens after its start events, so it is stamped now;
            // rows in other results were folded at `at`.
            let at = if matches!(command, Command::Exec(_)) {
                now()
            } else {
                at
            };
            record_handled(deps, job, handled, at).await
        }
        Err(e) if e.transient && attempt < max_attempts => {
            let delay = queue::backoff(attempt);
            info!(command = %job.command_id, attempt, delay_ms = delay.as_millis() as u64, error = %e.message, "retrying later");
            queue::retry_later(&deps.pool, job, &e, delay).await
        }
        Err(e) => {
            let md = metadata(deps, job, Correlation::default());
            // An exec whose start was recorded before it failed is closed too.
            let events = match command {
                Command::Exec(_) => close_started_execs(deps, job, "rejected").await?,
                _ => Vec::new(),
            };
            finish_patiently(deps, job, &Err(e), &events, &md, at, &[]).await
        }
    }
}

/// Records a handled job's outcome with its events, its locks still held, and frees
/// the locks after. First on the first lock's connection (no further checkout),
/// announced in the round trip that frees that lock; if that connection failed (the
/// database restarted while the effect ran), through [`finish_patiently`]. Every write
/// checks that the locks still hold their leases.
async fn record_handled(
    deps: &JobContext,
    job: &ClaimedJob,
    handled: Handled,
    at: chrono::DateTime<chrono::Utc>,
) -> Result<(), StoreError> {
    let md = metadata(deps, job, handled.correlation);
    let fences: Vec<Fence> = handled.locks.iter().map(|l| l.fence()).collect();
    let mut locks = handled.locks.into_iter();
    let Some(mut first) = locks.next() else {
        return finish_patiently(deps, job, &handled.result, &handled.events, &md, at, &[]).await;
    };
    let fast = queue::finish_fenced(
        first.conn(),
        job,
        &deps.config.worker_id,
        &handled.result,
        &handled.events,
        &md,
        at,
        &fences,
    )
    .await;
    let res = match fast {
        Ok(recorded) => {
            let _ = if recorded {
                first.release_announcing(job.command_id).await
            } else {
                first.release().await
            };
            Ok(())
        }
        Err(e) => {
            debug!(command = %job.command_id, error = %e, "recording on the lock's connection failed; retrying on others");
            let res = finish_patiently(
                deps,
                job,
                &handled.result,
                &handled.events,
                &md,
                at,
                &fences,
            )
            .await;
            let _ = first.release().await;
            res
        }
    };
    for lock in locks {
        let _ = lock.release().await;
    }
    res
}

/// How long a worker keeps trying to record an outcome while the database is away.
const OUTCOME_PATIENCE: Duration = Duration::from_secs(600);

/// Records an outcome through the pool, retrying with capped backoff (0.1 s doubling
/// to 5 s, a warning every 10 s) while the database cannot be reached, for up to
/// [`OUTCOME_PATIENCE`]: a command that finished while the database was away keeps its
/// outcome. If a lock's lease was lost meanwhile (another holder may have run since),
/// the outcome is recorded without the state changes the lock guarded: only its
/// `exec.finished` and `runtime.destroyed` events are kept.
async fn finish_patiently(
    deps: &JobContext,
    job: &ClaimedJob,
    result: &Result<grove_core::commands::CommandResult, CommandError>,
    events: &[Event],
    md: &Metadata,
    at: chrono::DateTime<chrono::Utc>,
    fences: &[Fence],
) -> Result<(), StoreError> {
    let worker = &deps.config.worker_id;
    let give_up = std::time::Instant::now() + OUTCOME_PATIENCE;
    let mut pause = Duration::from_millis(100);
    let mut warned: Option<std::time::Instant> = None;
    loop {
        let attempt = async {
            let mut conn = deps.pool.acquire().await?;
            let recorded = match queue::finish_fenced(
                &mut conn, job, worker, result, events, md, at, fences,
            )
            .await
            {
                Err(StoreError::Fenced(why)) => {
                    warn!(command = %job.command_id, %why, "recording the outcome without the changes its locks guarded");
                    let kept: Vec<Event> = events
                        .iter()
                        .filter(|e| {
                            matches!(
                                e,
                                Event::ExecFinished { .. } | Event::RuntimeDestroyed { .. }
                            )
                        })
                        .cloned()
                        .collect();
                    queue::finish_on(&mut conn, job, worker, result, &kept, md, at).await?
                }
                other => other?,
            };
            if recorded {
                queue::announce(&mut conn, job.command_id).await;
            }
            Ok::<_, StoreError>(())
        };
        match attempt.await {
            Ok(()) => return Ok(()),
            Err(e @ StoreError::Database(_)) if std::time::Instant::now() < give_up => {
                if warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    warn!(command = %job.command_id, error = %e, "the database is unreachable; holding the outcome and retrying");
                    warned = Some(std::time::Instant::now());
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// An exec whose earlier attempt's worker died is not run again: a command may not be
/// safe to run twice. It ends as failed with `worker_lost`, which the caller can retry.
async fn finish_worker_lost(
    deps: &JobContext,
    job: &ClaimedJob,
    command: &Command,
) -> Result<(), StoreError> {
    let Command::Exec(exec) = command else {
        return finish_lost_command(deps, job, command).await;
    };
    let ws = {
        let mut conn = deps.pool.acquire().await?;
        grove_postgres::rows::workspace(&mut conn, exec.workspace_id).await?
    };
    let mut events = match &ws {
        Some(_) => close_started_execs(deps, job, "worker_lost").await?,
        None => Vec::new(),
    };
    if let Some(ws) = &ws {
        let destroyed = destroy_lost_runtimes(deps, ws, &events).await?;
        events.extend(destroyed);
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

/// Any other command that is not safe to repeat (a tool's edit, commit or push) left no
/// start events: it only fails, and the caller decides.
async fn finish_lost_command(
    deps: &JobContext,
    job: &ClaimedJob,
    command: &Command,
) -> Result<(), StoreError> {
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
    queue::finish(
        &deps.pool,
        job,
        &deps.config.worker_id,
        &Err(err),
        &[],
        &metadata(deps, job, correlation),
        now(),
    )
    .await
}

/// The lost command may still be running inside a long-lived runtime (a container
/// outlives the worker that exec'd into it): the runtimes its `finished` events name
/// are destroyed so nothing of the command survives, each a `runtime.destroyed`. The
/// workspace stays; the next exec creates a fresh runtime.
async fn destroy_lost_runtimes(
    deps: &JobContext,
    ws: &grove_core::model::WorkspaceRow,
    finished: &[Event],
) -> Result<Vec<Event>, StoreError> {
    let runtime_ids: Vec<uuid::Uuid> = finished
        .iter()
        .filter_map(|e| match e {
            Event::ExecFinished { runtime_id, .. } => Some(*runtime_id),
            _ => None,
        })
        .collect();
    let runtimes = {
        let mut conn = deps.pool.acquire().await?;
        grove_postgres::rows::runtimes_of(&mut conn, ws.id).await?
    };
    let mut events = Vec::new();
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
    Ok(events)
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
        Command::EnsureRepoCache(c) => deps.ensure_repo_cache(c, token.as_ref(), at).await,
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
    }
}
