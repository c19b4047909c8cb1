//! A claimed job carried to its recorded outcome: the handler run (a panic caught), the
//! outcome and its events committed with the locks still held (patiently while the
//! database is away, fenced by the locks' leases), retries, and the end of a job whose
//! worker was lost.

use std::sync::Arc;
use std::time::Duration;

use grove_core::commands::Command;
use grove_core::error::{CommandError, ErrorKind};
use grove_core::events::{Correlation, Event, Metadata};
use grove_core::ports::GitToken;
use grove_postgres::locks::{AdvisoryLock, Fence};
use grove_postgres::queue::{self, ClaimedJob, Start};
use grove_postgres::StoreError;
use tracing::{debug, info, warn, Instrument};

use super::{handle, metadata};
use crate::context::{correlation_of, now, Handled, JobContext};

/// Carries one claimed job to its recorded outcome. Database failures on the way leave
/// the job to orphan recovery (it stays locked by us until our heartbeat stops) or to
/// the retry the next delivery makes. A handler that panics ends its job as failed
/// with `internal` (retried later when its kind is idempotent and attempts remain);
/// either way the job leaves the in-flight set.
/// Returns the jobs claimed in its outcome's transaction when `chain` is open (ADR 33):
/// started, in the in-flight set already, for the caller to run next.
pub(super) async fn run_job(
    deps: Arc<JobContext>,
    job: ClaimedJob,
    start: Start,
    chain: Option<&Chain>,
) -> Vec<(ClaimedJob, Start)> {
    use futures::FutureExt;
    let mut next = Vec::new();
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
    let span = crate::trace::job_span(&deps.pool, &job).await;
    let claim = chain.and_then(Chain::claim);
    let ran = std::panic::AssertUnwindSafe(
        run_job_inner(&deps, &job, start, claim.as_ref()).instrument(span),
    )
    .catch_unwind()
    .await;
    match ran {
        Ok(Ok(claimed)) => next = claimed,
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
    let mut inflight = deps.inflight.lock().expect("inflight set");
    // The next jobs are this worker's from their claim's commit: in flight before this
    // one leaves, so no sweep of our own stale jobs ever sees them unowned.
    for (next_job, _) in &next {
        inflight.insert(next_job.job_id.clone());
    }
    inflight.remove(&job.job_id);
    drop(inflight);
    next
}

/// Where a worker's job tasks claim their next job, in the transaction of the outcome
/// they record (ADR 33): the worker's queues in its order, while it is not stopping.
pub(crate) struct Chain {
    pub(crate) queues: Vec<String>,
    pub(crate) open: std::sync::atomic::AtomicBool,
}

impl Chain {
    pub(crate) fn new(queues: Vec<String>) -> Self {
        Self {
            queues,
            open: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// One job, unless the worker is stopping.
    fn claim(&self) -> Option<queue::NextClaim<'_>> {
        self.open
            .load(std::sync::atomic::Ordering::Acquire)
            .then_some(queue::NextClaim {
                queues: &self.queues,
                limit: 1,
            })
    }
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
pub(super) async fn close_started_execs(
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
/// Returns the jobs claimed with its outcome (`next`).
async fn run_job_inner(
    deps: &JobContext,
    job: &ClaimedJob,
    start: Start,
    next: Option<&queue::NextClaim<'_>>,
) -> Result<Vec<(ClaimedJob, Start)>, StoreError> {
    let Start::Run {
        command,
        attempt,
        max_attempts,
        resumed,
        token,
    } = start
    else {
        return Ok(Vec::new());
    };
    let at = now();
    if resumed && !command.is_idempotent() {
        return finish_worker_lost(deps, job, &command)
            .await
            .map(|()| Vec::new());
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
        .await
        .map(|()| Vec::new());
    }
    let outcome = match command.validate() {
        Err(e) => Err(CommandError::from(e)),
        Ok(()) => {
            handle(deps, job, &command, token.map(GitToken::new), at)
                .instrument(crate::trace::effect_span(job))
                .await
        }
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
            record_handled(deps, job, handled, at, next, Release::Now).await
        }
        Err(e) if e.transient && attempt < max_attempts => {
            let delay = queue::backoff(attempt);
            info!(command = %job.command_id, attempt, delay_ms = delay.as_millis() as u64, error = %e.message, "retrying later");
            queue::retry_later(&deps.pool, job, &e, delay)
                .await
                .map(|()| Vec::new())
        }
        Err(e) => {
            let md = metadata(deps, job, Correlation::default());
            // An exec whose start was recorded before it failed is closed too.
            let events = match command {
                Command::Exec(_) => close_started_execs(deps, job, "rejected").await?,
                _ => Vec::new(),
            };
            finish_patiently(deps, job, &Err(e), &events, &md, at, &[])
                .await
                .map(|()| Vec::new())
        }
    }
}

/// When [`record_handled`] frees the first lock, once the outcome is recorded.
#[derive(Clone, Copy)]
pub(super) enum Release {
    /// Before it returns (the queue: a worker stopping waits for its jobs, unlocks
    /// included).
    Now,
    /// In a task of its own ([`AdvisoryLock::release_announcing_soon`]): an inline
    /// command answers its caller without waiting for the unlock.
    Soon,
}

/// Records a handled job's outcome with its events, its locks still held, and frees
/// the locks after (an outcome recorded by `queue::finish_claiming` ended their leases,
/// ADR 39, so each is only unlocked). First on the first lock's connection (no further
/// checkout), announced in the round trip that frees that lock, claiming the worker's
/// `next` jobs in the same transaction (ADR 33); if that connection failed (the
/// database restarted while the effect ran), through [`finish_patiently`], which claims
/// nothing. Every write checks that the locks still hold their leases. Returns the jobs
/// claimed.
pub(super) async fn record_handled(
    deps: &JobContext,
    job: &ClaimedJob,
    handled: Handled,
    at: chrono::DateTime<chrono::Utc>,
    next: Option<&queue::NextClaim<'_>>,
    release: Release,
) -> Result<Vec<(ClaimedJob, Start)>, StoreError> {
    let md = metadata(deps, job, handled.correlation);
    let fences: Vec<Fence> = handled.locks.iter().map(|l| l.fence()).collect();
    let mut locks = handled.locks.into_iter();
    let done = queue::Outcome {
        job,
        worker_id: &deps.config.worker_id,
        outcome: &handled.result,
        events: &handled.events,
        metadata: &md,
        at,
    };
    let Some(mut first) = locks.next() else {
        return record_unlocked(deps, &done, next).await;
    };
    let (fast, ends_leases) = match finish_folded(&mut first, &done, &fences, next).await {
        Some(finished) => (finished, false),
        None => (
            queue::finish_claiming(first.conn(), &done, &fences, next).await,
            true,
        ),
    };
    // An outcome recorded by `finish_claiming` deleted every lock's lease in its commit
    // (ADR 39): no lock renews it any more, and each is then only unlocked.
    let mut rest: Vec<AdvisoryLock> = locks.collect();
    if ends_leases && matches!(&fast, Ok(f) if f.recorded) {
        first.lease_ended();
        rest.iter_mut().for_each(AdvisoryLock::lease_ended);
    }
    let res = match fast {
        Ok(finished) => {
            let appended = !done.events.is_empty();
            match (finished.recorded, release) {
                (true, Release::Soon) => first.release_announcing_soon(job.command_id, appended),
                (true, Release::Now) => {
                    let _ = first.release_announcing(job.command_id, appended).await;
                }
                (false, _) => {
                    let _ = first.release().await;
                }
            }
            Ok(finished.next)
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
            res.map(|()| Vec::new())
        }
    };
    for lock in rest {
        match release {
            Release::Soon if res.is_ok() => lock.release_soon(),
            _ => {
                let _ = lock.release().await;
            }
        }
    }
    res
}

/// The outcome in one statement, its events folded onto the rows the first lock holds
/// (ADR 36), when it claims no next job. `None` when it does not fold (no next claim
/// possible that way, a row not held, or one changed since it was read): the caller
/// records the usual way.
async fn finish_folded(
    first: &mut AdvisoryLock,
    done: &queue::Outcome<'_>,
    fences: &[Fence],
    next: Option<&queue::NextClaim<'_>>,
) -> Option<Result<queue::Finished, StoreError>> {
    if next.is_some() {
        return None;
    }
    let folded = first
        .held_rows()
        .fold(done.events, done.metadata, done.at)
        .ok()??;
    match queue::finish_folded(first.conn(), done, &folded, fences).await {
        Ok(Some(version)) => {
            first.absorb(folded, version);
            Some(Ok(queue::Finished {
                recorded: true,
                next: Vec::new(),
            }))
        }
        Ok(None) => Some(Ok(queue::Finished::default())),
        Err(e) if grove_postgres::folded::is_stale(&e) => {
            first.forget_rows();
            None
        }
        Err(e) => Some(Err(e)),
    }
}

/// [`record_handled`] for a job that holds no lock: once on a pool connection with the
/// next claim, else through [`finish_patiently`].
async fn record_unlocked(
    deps: &JobContext,
    done: &queue::Outcome<'_>,
    next: Option<&queue::NextClaim<'_>>,
) -> Result<Vec<(ClaimedJob, Start)>, StoreError> {
    let fast = async {
        let mut conn = deps.pool.acquire().await?;
        let finished = queue::finish_claiming(&mut conn, done, &[], next).await?;
        if finished.recorded {
            queue::announce(&mut conn, done.job.command_id, !done.events.is_empty()).await;
        }
        Ok::<_, StoreError>(finished.next)
    };
    match fast.await {
        Ok(next) => Ok(next),
        Err(e) => {
            debug!(command = %done.job.command_id, error = %e, "recording an outcome failed; retrying patiently");
            let (job, result, events, md) = (done.job, done.outcome, done.events, done.metadata);
            finish_patiently(deps, job, result, events, md, done.at, &[])
                .await
                .map(|()| Vec::new())
        }
    }
}

/// How long a worker keeps trying to record an outcome while the database is away.
const OUTCOME_PATIENCE: Duration = Duration::from_secs(600);

/// Records an outcome through the pool, retrying with capped backoff (0.1 s doubling
/// to 5 s, a warning every 10 s) while the database cannot be reached, for up to
/// [`OUTCOME_PATIENCE`]: a command that finished while the database was away keeps its
/// outcome. If a lock's lease was lost meanwhile (another holder may have run since),
/// the outcome is recorded without the state changes the lock guarded: only its
/// `exec.finished` and `runtime.destroyed` events are kept.
pub(super) async fn finish_patiently(
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
                // A fence that dropped every event only wakes followers to re-read.
                queue::announce(&mut conn, job.command_id, !events.is_empty()).await;
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
