//! The command queue: grove's ledger on top of apalis-postgres' job table.
//!
//! apalis-postgres owns `apalis.jobs` / `apalis.workers`, the claim function
//! (`apalis.get_jobs`, `FOR UPDATE SKIP LOCKED`) and the insert notification. grove adds,
//! in `grove.commands`: idempotent enqueue by command_id, outcome recording in the same
//! transaction as the command's events, retry with a backoff stored in the job's
//! `run_at` (so it survives restarts), recovery of jobs whose worker stopped
//! heart-beating, and pruning. See docs/adr/01-queue.md.

use std::time::Duration;

use chrono::{DateTime, Utc};
use grove_core::commands::{Command, CommandResult};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::events::{Event, Metadata};
use grove_core::placement::Placement;
use grove_core::state::{LedgerStatus, UnknownState};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use crate::trace_context::TARGET;
use crate::{store, StoreError};

/// The notification channel a command's outcome is announced on (payload: command_id).
pub const DONE_CHANNEL: &str = "grove_command_done";
/// The channel apalis-postgres notifies on when a job row is inserted.
pub const JOB_INSERT_CHANNEL: &str = "apalis::job::insert";
/// `apalis.workers.worker_type` of grove workers.
pub const WORKER_TYPE: &str = "grove";

/// The queue for jobs that any worker may take (placing new caches and workspaces).
pub fn shared_queue() -> String {
    "grove:shared".to_string()
}
/// The queue of one node: jobs on workspaces whose files live there.
pub fn node_queue(node: &str) -> String {
    format!("grove:node:{node}")
}
/// The queue of one remote provider (`daytona`, `e2b`): jobs on workspaces placed in
/// it, and acquires that place one there. Every worker with the provider configured
/// listens on it, whatever its node (ADR 15).
pub fn provider_queue(provider: &str) -> String {
    format!("grove:provider:{provider}")
}
/// The queue of the jobs on a workspace whose `node` is `placement`: its node's queue,
/// or its provider's queue when it is placed in a remote provider.
pub fn placement_queue(placement: &str) -> String {
    match Placement::of_node(placement) {
        Placement::Remote(provider) => provider_queue(provider.as_str()),
        Placement::Node(node) => node_queue(node),
    }
}

/// How many times a kind of command is tried before it fails for good.
pub fn max_attempts(command: &Command) -> i32 {
    if command.is_idempotent() {
        5
    } else {
        1
    }
}

/// The wait before attempt `attempt + 1`: 1 s, 2 s, 4 s, ... capped at 60 s.
pub fn backoff(attempt: i32) -> Duration {
    let exp = attempt.clamp(1, 7) - 1;
    Duration::from_secs((1u64 << exp).min(60))
}

/// A command's state as its caller sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandStatus {
    pub command_id: Uuid,
    pub kind: String,
    pub status: LedgerStatus,
    pub attempts: i32,
    pub job_status: Option<String>,
    pub result: Option<CommandResult>,
    pub error: Option<CommandError>,
}

impl CommandStatus {
    pub fn is_finished(&self) -> bool {
        self.status.is_finished()
    }
}

/// The ledger status of a finished command, as stored.
fn finished_status(succeeded: bool) -> &'static str {
    if succeeded {
        LedgerStatus::Succeeded.as_str()
    } else {
        LedgerStatus::Failed.as_str()
    }
}

/// Enqueues a command (idempotent by `command_id`). A `token` is kept in the unlogged
/// secrets table for this command only, never in the job or ledger payload.
pub async fn enqueue(
    conn: &mut PgConnection,
    command_id: Uuid,
    command: &Command,
    queue: &str,
    token: Option<&str>,
) -> Result<(String, bool), StoreError> {
    let payload = serde_json::to_value(command)?;
    let row = sqlx::query("SELECT job_id, inserted FROM grove.enqueue($1, $2, $3, $4)")
        .bind(command_id)
        .bind(payload)
        .bind(queue)
        .bind(max_attempts(command))
        .fetch_one(&mut *conn)
        .await?;
    let job_id: String = row.try_get("job_id")?;
    let inserted: bool = row.try_get("inserted")?;
    if inserted {
        crate::telemetry::enqueued(command.kind(), queue);
        if let Some(token) = token {
            sqlx::query("INSERT INTO grove.command_secrets (command_id, token) VALUES ($1, $2)")
                .bind(command_id)
                .bind(token)
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok((job_id, inserted))
}

/// Keeps the enqueuing span's `traceparent` on a command's ledger row (ADR 30); in the
/// enqueue's transaction, so no worker claims the job before it is there.
pub async fn set_trace_parent(
    conn: &mut PgConnection,
    command_id: Uuid,
    traceparent: &str,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE grove.commands SET trace_parent = $2 WHERE command_id = $1")
        .bind(command_id)
        .bind(traceparent)
        .execute(conn)
        .await?;
    Ok(())
}

/// The `traceparent` a command was enqueued under, if any.
pub async fn trace_parent(pool: &PgPool, command_id: Uuid) -> Result<Option<String>, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT trace_parent FROM grove.commands WHERE command_id = $1")
            .bind(command_id)
            .fetch_optional(pool)
            .await?
            .flatten(),
    )
}

/// Whether an answer that records nothing may be given now (ADR 40): the ledger does
/// not hold `command_id` (a retry, or an id used for another command), and no one holds
/// or waits for any of the advisory locks `lock_keys` exclusively (each is taken shared
/// and dropped within this one statement).
pub async fn unrecorded_and_unlocked(
    pool: &PgPool,
    command_id: Uuid,
    lock_keys: &[i64],
) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT NOT EXISTS (SELECT 1 FROM grove.commands WHERE command_id = $1)
            AND coalesce((SELECT bool_and(pg_try_advisory_xact_lock_shared(k))
                          FROM unnest($2::int8[]) AS k), true)",
    )
    .bind(command_id)
    .bind(lock_keys)
    .fetch_one(pool)
    .await?)
}

/// Reads a command's status from the ledger.
pub async fn status(
    conn: &mut PgConnection,
    command_id: Uuid,
) -> Result<Option<CommandStatus>, StoreError> {
    let row = sqlx::query(
        "SELECT c.command_id, c.kind, c.status, c.attempts, c.result, c.error, j.status AS job_status
         FROM grove.commands c LEFT JOIN apalis.jobs j ON j.id = c.job_id
         WHERE c.command_id = $1",
    )
    .bind(command_id)
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let result: Option<serde_json::Value> = row.try_get("result")?;
    let error: Option<serde_json::Value> = row.try_get("error")?;
    Ok(Some(CommandStatus {
        command_id: row.try_get("command_id")?,
        kind: row.try_get("kind")?,
        status: {
            let text: String = row.try_get("status")?;
            text.parse()
                .map_err(|e: UnknownState| StoreError::Corrupt(e.to_string()))?
        },
        attempts: row.try_get("attempts")?,
        job_status: row.try_get("job_status")?,
        result: result.map(serde_json::from_value).transpose()?,
        error: error.map(serde_json::from_value).transpose()?,
    }))
}

/// Withdraws a command that no worker has claimed yet. Returns false if a worker has it.
pub async fn cancel_unclaimed(
    pool: &PgPool,
    command_id: Uuid,
    reason: &str,
) -> Result<bool, StoreError> {
    let mut tx = pool.begin().await?;
    let deleted = sqlx::query(
        "DELETE FROM apalis.jobs j USING grove.commands c
         WHERE c.command_id = $1 AND j.id = c.job_id AND j.status = 'Pending' AND c.status = 'queued' AND c.attempts = 0",
    )
    .bind(command_id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if deleted == 0 {
        return Ok(false);
    }
    let error = CommandError::new(ErrorKind::Unavailable, reason);
    finish_ledger(&mut tx, command_id, None, Some(&error)).await?;
    tx.commit().await?;
    Ok(true)
}

/// Registers (or re-registers) a worker in `apalis.workers`.
pub async fn register_worker(
    pool: &PgPool,
    worker_id: &str,
    queues: &[String],
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO apalis.workers (id, worker_type, storage_name, layers, last_seen)
         VALUES ($1, $2, $3, '', now())
         ON CONFLICT (id) DO UPDATE SET last_seen = now(), storage_name = EXCLUDED.storage_name",
    )
    .bind(worker_id)
    .bind(WORKER_TYPE)
    .bind(queues.join(","))
    .execute(pool)
    .await?;
    Ok(())
}

/// Records how many jobs a registered worker runs at once, for the console's Fleet page
/// (kept in `apalis.workers.layers`, which grove does not otherwise use).
pub async fn record_concurrency(
    pool: &PgPool,
    worker_id: &str,
    concurrency: usize,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE apalis.workers SET layers = $2 WHERE id = $1")
        .bind(worker_id)
        .bind(format!("concurrency={concurrency}"))
        .execute(pool)
        .await?;
    Ok(())
}

/// Records that a worker is alive. False when its row is gone (it must register again).
pub async fn heartbeat(pool: &PgPool, worker_id: &str) -> Result<bool, StoreError> {
    let n = sqlx::query("UPDATE apalis.workers SET last_seen = now() WHERE id = $1")
        .bind(worker_id)
        .execute(pool)
        .await?
        .rows_affected();
    Ok(n > 0)
}

/// Whether any grove worker heart-beat within `within`.
pub async fn live_workers(pool: &PgPool, within: Duration) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM apalis.workers WHERE worker_type = $1 AND last_seen > now() - make_interval(secs => $2)",
    )
    .bind(WORKER_TYPE)
    .bind(within.as_secs_f64())
    .fetch_one(pool)
    .await?)
}

/// Puts back in the queue every job held by a worker silent for longer than `stale`.
/// Returns how many jobs were recovered. Idempotent jobs run again; an exec's next
/// delivery finds its ledger row `running` and ends it as `worker_lost`.
pub async fn recover_orphans(pool: &PgPool, stale: Duration) -> Result<u64, StoreError> {
    let n = sqlx::query(
        "UPDATE apalis.jobs j
         SET status = 'Pending', lock_by = NULL, lock_at = NULL,
             last_result = '{\"Err\": \"worker stopped heart-beating\"}'::jsonb
         FROM apalis.workers w
         WHERE j.lock_by = w.id AND j.status IN ('Queued', 'Running')
           AND w.last_seen < now() - make_interval(secs => $1)",
    )
    .bind(stale.as_secs_f64())
    .execute(pool)
    .await?
    .rows_affected();
    if n > 0 {
        // Wake idle workers: the recovered jobs are not new inserts, so apalis' trigger
        // does not announce them.
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(JOB_INSERT_CHANNEL)
            .execute(pool)
            .await?;
    }
    Ok(n)
}

/// Deletes finished jobs and ledger rows older than `older_than`, and workers not seen
/// for as long. The ledger's dedupe window is therefore `older_than`.
pub async fn prune(pool: &PgPool, older_than: Duration) -> Result<u64, StoreError> {
    let secs = older_than.as_secs_f64();
    let jobs = sqlx::query(
        "DELETE FROM apalis.jobs WHERE status IN ('Done', 'Killed') AND done_at < now() - make_interval(secs => $1)",
    )
    .bind(secs)
    .execute(pool)
    .await?
    .rows_affected();
    sqlx::query(
        "DELETE FROM grove.commands WHERE status IN ('succeeded', 'failed') AND finished_at < now() - make_interval(secs => $1)",
    )
    .bind(secs)
    .execute(pool)
    .await?;
    sqlx::query(
        "DELETE FROM apalis.workers w WHERE last_seen < now() - make_interval(secs => $1)
         AND NOT EXISTS (SELECT 1 FROM apalis.jobs j WHERE j.lock_by = w.id)",
    )
    .bind(secs)
    .execute(pool)
    .await?;
    // Relayed exec output is only for callers watching the exec as it runs.
    crate::output::prune(pool, Duration::from_secs(3600)).await?;
    Ok(jobs)
}

/// A job claimed by this worker.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    pub job_id: String,
    pub queue: String,
    pub command_id: Uuid,
    /// The command's kind (`unknown` for a job closed at its claim), for the metrics.
    pub kind: &'static str,
    /// When the claim returned it: the start of the attempt's duration.
    pub claimed_at: std::time::Instant,
    /// When the claim's statement was sent and when it answered (the claim's span).
    pub claim_window: (std::time::SystemTime, std::time::SystemTime),
}

/// Claims up to `limit` due jobs of `queue` for `worker_id` and starts each, in one
/// statement and one transaction (`grove.claim_jobs`): the claim, then, per job, what
/// starting means: the ledger row locked, marked `running` with `attempts + 1` and this
/// worker, the job `Running`, the token (if any) read. A job whose command already has
/// its outcome (a duplicate delivery) or that has no ledger row comes back closed, as
/// [`Start::AlreadyFinished`].
pub async fn claim_and_start(
    pool: &PgPool,
    worker_id: &str,
    queue: &str,
    limit: i32,
) -> Result<Vec<(ClaimedJob, Start)>, StoreError> {
    let began = std::time::SystemTime::now();
    let mut conn = pool.acquire().await?;
    let rows = sqlx::query(
        "SELECT job_id, queue, command_id, action, payload, prior_status, attempt, max_attempts, token
         FROM grove.claim_jobs($1, $2, $3)",
    )
    .bind(worker_id)
    .bind(queue)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    let claim_window = (began, std::time::SystemTime::now());
    starts(&mut conn, rows, claim_window).await
}

/// A worker's next claim, made in the transaction of the outcome it records (ADR 33):
/// up to `limit` due jobs of `queues`, in that order, for the recording worker.
#[derive(Debug, Clone, Copy)]
pub struct NextClaim<'a> {
    pub queues: &'a [String],
    pub limit: i32,
}

/// `grove.claim_next` in the caller's open transaction: the claim and the start of each
/// job, committed (and flushed) with that transaction.
async fn claim_in(
    tx: &mut PgConnection,
    worker_id: &str,
    next: &NextClaim<'_>,
) -> Result<Vec<sqlx::postgres::PgRow>, StoreError> {
    if next.limit <= 0 || next.queues.is_empty() {
        return Ok(Vec::new());
    }
    Ok(sqlx::query(
        "SELECT job_id, queue, command_id, action, payload, prior_status, attempt, max_attempts, token
         FROM grove.claim_next($1, $2, $3)",
    )
    .bind(worker_id)
    .bind(next.queues)
    .bind(next.limit)
    .fetch_all(tx)
    .await?)
}

/// The claimed jobs of committed claim rows. A payload this worker cannot read fails
/// its command for good, on `conn` (outside a transaction).
async fn starts(
    conn: &mut PgConnection,
    rows: Vec<sqlx::postgres::PgRow>,
    claim_window: (std::time::SystemTime, std::time::SystemTime),
) -> Result<Vec<(ClaimedJob, Start)>, StoreError> {
    let mut jobs = Vec::with_capacity(rows.len());
    for row in rows {
        let command_id: Option<Uuid> = row.try_get("command_id")?;
        let mut job = ClaimedJob {
            job_id: row.try_get("job_id")?,
            queue: row.try_get("queue")?,
            command_id: command_id.unwrap_or_default(),
            kind: "unknown",
            claimed_at: std::time::Instant::now(),
            claim_window,
        };
        let action: String = row.try_get("action")?;
        if action != "run" {
            jobs.push((job, Start::AlreadyFinished));
            continue;
        }
        let command: Command = match serde_json::from_value(row.try_get("payload")?) {
            Ok(c) => c,
            Err(e) => {
                // A payload this worker cannot read will never become readable by
                // retrying: fail it for good instead of redelivering it forever.
                let error = CommandError::new(
                    ErrorKind::InvalidInput,
                    format!("undecodable command payload: {e}"),
                );
                let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                finish_ledger(&mut tx, job.command_id, None, Some(&error)).await?;
                close_job(&mut tx, &job.job_id, false).await?;
                tx.commit().await?;
                jobs.push((job, Start::AlreadyFinished));
                continue;
            }
        };
        job.kind = command.kind();
        crate::telemetry::started(job.kind, &job.queue);
        let prior: String = row.try_get("prior_status")?;
        let start = Start::Run {
            command,
            attempt: row.try_get("attempt")?,
            max_attempts: row.try_get("max_attempts")?,
            resumed: prior == "running",
            token: row.try_get("token")?,
        };
        jobs.push((job, start));
    }
    Ok(jobs)
}

/// What a worker should do with a claimed job.
#[derive(Debug)]
// Made once per job and moved straight into the handler: boxing the command would buy
// nothing.
#[allow(clippy::large_enum_variant)]
pub enum Start {
    /// Run the command. `resumed` is true when an earlier attempt started and never
    /// finished (its worker died).
    Run {
        command: Command,
        attempt: i32,
        max_attempts: i32,
        resumed: bool,
        token: Option<String>,
    },
    /// The command already has its outcome (a duplicate delivery): just close the job.
    AlreadyFinished,
}

async fn close_job(
    conn: &mut PgConnection,
    job_id: &str,
    succeeded: bool,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE apalis.jobs SET status = $2, done_at = now(), lock_by = NULL WHERE id = $1",
    )
    .bind(job_id)
    .bind(if succeeded { "Done" } else { "Killed" })
    .execute(conn)
    .await?;
    Ok(())
}

async fn finish_ledger(
    conn: &mut PgConnection,
    command_id: Uuid,
    result: Option<&CommandResult>,
    error: Option<&CommandError>,
) -> Result<(), StoreError> {
    // The outcome, the secret's deletion and the notification in one statement (one
    // round trip); the notification is delivered only if the transaction commits.
    sqlx::query(
        "WITH ledger AS (
             UPDATE grove.commands SET status = $2, result = $3, error = $4, finished_at = now()
             WHERE command_id = $1
         ), secret AS (
             DELETE FROM grove.command_secrets WHERE command_id = $1
         )
         SELECT pg_notify($5, $1::text)",
    )
    .bind(command_id)
    .bind(finished_status(error.is_none()))
    .bind(result.map(serde_json::to_value).transpose()?)
    .bind(error.map(serde_json::to_value).transpose()?)
    .bind(DONE_CHANNEL)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The outcome, the job's close and the secret's deletion, in one statement, only if
/// `worker_id` still holds the attempt (the ledger row is `running` and names it).
/// Returns whether it did. The notification is sent after the commit ([`announce`]).
async fn record_outcome<'c>(
    conn: impl sqlx::PgExecutor<'c>,
    job: &ClaimedJob,
    worker_id: &str,
    outcome: &Result<CommandResult, CommandError>,
) -> Result<bool, StoreError> {
    let recorded = sqlx::query(
        "WITH ledger AS (
             UPDATE grove.commands SET status = $2, result = $3, error = $4, finished_at = now()
             WHERE command_id = $1 AND status = 'running' AND worker_id = $5
             RETURNING command_id
         ), job AS (
             UPDATE apalis.jobs SET status = $6, done_at = now(), lock_by = NULL
             WHERE id = $7 AND EXISTS (SELECT 1 FROM ledger)
         ), secret AS (
             DELETE FROM grove.command_secrets
             WHERE command_id = $1 AND EXISTS (SELECT 1 FROM ledger)
         )
         SELECT ledger.command_id FROM ledger",
    )
    .bind(job.command_id)
    .bind(finished_status(outcome.is_ok()))
    .bind(
        outcome
            .as_ref()
            .ok()
            .map(serde_json::to_value)
            .transpose()?,
    )
    .bind(
        outcome
            .as_ref()
            .err()
            .map(serde_json::to_value)
            .transpose()?,
    )
    .bind(worker_id)
    .bind(if outcome.is_ok() { "Done" } else { "Killed" })
    .bind(&job.job_id)
    .fetch_optional(conn)
    .await?;
    Ok(recorded.is_some())
}

/// Records a command's outcome: its events, projections, ledger row and job, in one
/// transaction. Retries the transaction on a stream-version conflict (three tries).
///
/// Only the worker that holds the attempt records it: one declared lost by mistake must
/// not overwrite the outcome of the attempt that replaced it. The ledger row is updated
/// first, under that condition, so the row lock is taken before the projection rows (as
/// before) and an outcome that is not ours appends nothing. Without events the whole
/// outcome is that one statement, its own transaction.
pub async fn finish(
    pool: &PgPool,
    job: &ClaimedJob,
    worker_id: &str,
    outcome: &Result<CommandResult, CommandError>,
    events: &[Event],
    metadata: &Metadata,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    let mut conn = pool.acquire().await?;
    if finish_on(&mut conn, job, worker_id, outcome, events, metadata, at).await? {
        announce(&mut conn, job.command_id, !events.is_empty()).await;
    }
    Ok(())
}

/// [`finish`] on a connection the caller holds (outside a transaction), without the
/// announcement: returns whether the outcome was recorded (false: another attempt owns
/// the command), and the caller must then [`announce`] it. The worker records an
/// outcome on the connection of the job's first lock and announces it in the round
/// trip that frees that lock (`AdvisoryLock::release_announcing`), so a job costs one
/// pool checkout for its lock, its reads and its outcome.
pub async fn finish_on(
    conn: &mut PgConnection,
    job: &ClaimedJob,
    worker_id: &str,
    outcome: &Result<CommandResult, CommandError>,
    events: &[Event],
    metadata: &Metadata,
    at: DateTime<Utc>,
) -> Result<bool, StoreError> {
    finish_fenced(conn, job, worker_id, outcome, events, metadata, at, &[]).await
}

/// [`finish_on`] for an outcome reached under locks: it commits only if every lock in
/// `fences` still holds its lease, else [`StoreError::Fenced`] and nothing is written.
/// Its commit ends those leases (`store::end_fences`, ADR 39): each holder then only
/// frees its advisory lock ([`crate::locks::AdvisoryLock::lease_ended`]).
#[allow(clippy::too_many_arguments)]
pub async fn finish_fenced(
    conn: &mut PgConnection,
    job: &ClaimedJob,
    worker_id: &str,
    outcome: &Result<CommandResult, CommandError>,
    events: &[Event],
    metadata: &Metadata,
    at: DateTime<Utc>,
    fences: &[crate::locks::Fence],
) -> Result<bool, StoreError> {
    let done = Outcome {
        job,
        worker_id,
        outcome,
        events,
        metadata,
        at,
    };
    Ok(finish_claiming(conn, &done, fences, None).await?.recorded)
}

/// A finished job's outcome, as [`finish_fenced`] records it.
pub struct Outcome<'a> {
    pub job: &'a ClaimedJob,
    pub worker_id: &'a str,
    pub outcome: &'a Result<CommandResult, CommandError>,
    pub events: &'a [Event],
    pub metadata: &'a Metadata,
    pub at: DateTime<Utc>,
}

/// What [`finish_claiming`] did: whether the outcome was recorded, and the jobs claimed
/// in its transaction (started, this worker's to run).
#[derive(Debug, Default)]
pub struct Finished {
    pub recorded: bool,
    pub next: Vec<(ClaimedJob, Start)>,
}

/// [`finish_fenced`] that also claims the worker's next jobs (`next`) in the outcome's
/// transaction (ADR 33): one flushed commit records this job and starts the next. A
/// claim in an outcome that is not recorded (another attempt owns the command, a lost
/// lease) is rolled back with it.
#[tracing::instrument(
    target = TARGET, name = "grove.commit", level = "trace", skip_all,
    fields(command_id = %done.job.command_id, events = done.events.len())
)]
pub async fn finish_claiming(
    conn: &mut PgConnection,
    done: &Outcome<'_>,
    fences: &[crate::locks::Fence],
    next: Option<&NextClaim<'_>>,
) -> Result<Finished, StoreError> {
    let job = done.job;
    let superseded = || {
        tracing::warn!(command = %job.command_id, "outcome not recorded: another attempt owns the command");
        Ok(Finished::default())
    };
    if done.events.is_empty() && fences.is_empty() && next.is_none() {
        if !record_outcome(&mut *conn, job, done.worker_id, done.outcome).await? {
            return superseded();
        }
        crate::telemetry::finished(
            job.kind,
            done.outcome,
            done.events,
            job.claimed_at.elapsed(),
        );
        return Ok(Finished {
            recorded: true,
            next: Vec::new(),
        });
    }
    if done.events.is_empty() {
        return finish_claiming_plain(conn, done, fences, next).await;
    }
    let mut tries = 0;
    let (rows, began) = loop {
        tries += 1;
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let began = std::time::SystemTime::now();
        let written = record_with_events(&mut tx, done, fences, next).await;
        if let Ok(Some(rows)) = written {
            tx.commit().await?;
            break (rows, began);
        }
        // Rolled back now, not when the connection is next used: its row locks (the
        // leases it deleted, the ledger row) would hold up a retry made through another
        // connection, and the holder's own release.
        let _ = tx.rollback().await;
        match written {
            Ok(_) => return superseded(),
            Err(StoreError::Conflict(_)) if tries < 3 => continue,
            Err(e) => return Err(e),
        }
    };
    crate::telemetry::finished(
        job.kind,
        done.outcome,
        done.events,
        job.claimed_at.elapsed(),
    );
    Ok(Finished {
        recorded: true,
        next: claimed(conn, rows, began).await,
    })
}

/// The writes of [`finish_claiming`] with events, in its transaction: the leases ended,
/// the outcome, the events, the next claim. `None` when another attempt owns the
/// command (nothing written).
async fn record_with_events(
    tx: &mut PgConnection,
    done: &Outcome<'_>,
    fences: &[crate::locks::Fence],
    next: Option<&NextClaim<'_>>,
) -> Result<Option<Vec<sqlx::postgres::PgRow>>, StoreError> {
    store::end_fences(&mut *tx, fences).await?;
    if !record_outcome(&mut *tx, done.job, done.worker_id, done.outcome).await? {
        return Ok(None);
    }
    store::append(&mut *tx, done.events, done.metadata, done.at).await?;
    match next {
        Some(next) => claim_in(tx, done.worker_id, next).await.map(Some),
        None => Ok(Some(Vec::new())),
    }
}

/// The jobs an outcome's commit claimed, started ([`starts`]); none when they cannot be
/// read (the outcome is committed whatever happens here: claimed jobs this worker cannot
/// take up are handed back by its sweep of its own stale jobs).
async fn claimed(
    conn: &mut PgConnection,
    rows: Vec<sqlx::postgres::PgRow>,
    began: std::time::SystemTime,
) -> Vec<(ClaimedJob, Start)> {
    starts(conn, rows, (began, std::time::SystemTime::now()))
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "reading the jobs claimed with an outcome failed");
            Vec::new()
        })
}

/// [`finish_claiming`] for an outcome that appends no events (ADR 37): the fence
/// check, the outcome and the next claim in one statement, `grove.finish_claiming`,
/// which is its own transaction.
async fn finish_claiming_plain(
    conn: &mut PgConnection,
    done: &Outcome<'_>,
    fences: &[crate::locks::Fence],
    next: Option<&NextClaim<'_>>,
) -> Result<Finished, StoreError> {
    let job = done.job;
    let args = OutcomeArgs::of(done.outcome, fences)?;
    let (queues, limit) = next.map_or((&[][..], 0), |n| (n.queues, n.limit));
    let began = std::time::SystemTime::now();
    let query = sqlx::query(
        "SELECT fenced, recorded, job_id, queue, command_id, action, payload, prior_status,
                attempt, max_attempts, token
           FROM grove.finish_claiming($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    );
    let mut rows = args
        .bind_finish(query, done)
        .bind(queues)
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?
        .into_iter();
    let first = rows
        .next()
        .ok_or_else(|| StoreError::Corrupt("grove.finish_claiming returned no row".into()))?;
    if first.try_get::<bool, _>("fenced")? {
        return Err(lease_lost());
    }
    if !first.try_get::<bool, _>("recorded")? {
        tracing::warn!(command = %job.command_id, "outcome not recorded: another attempt owns the command");
        return Ok(Finished::default());
    }
    crate::telemetry::finished(
        job.kind,
        done.outcome,
        done.events,
        job.claimed_at.elapsed(),
    );
    Ok(Finished {
        recorded: true,
        next: claimed(conn, rows.collect(), began).await,
    })
}

/// Announces a recorded outcome on [`DONE_CHANNEL`], in a statement of its own after the
/// outcome committed. A NOTIFY inside the outcome's transaction would take Postgres'
/// database-wide notification lock at commit and hold it through the WAL flush, so the
/// commits of all finishing workers would queue behind each other; alone, the NOTIFY
/// writes no WAL and is not flushed. A notification lost here (the worker died between
/// the two) only delays the caller until its next poll of the ledger. When the outcome
/// `appended` events, the log's followers are woken in the same statement
/// (`store::EVENTS_CHANNEL`, ADR 36).
pub async fn announce(conn: &mut PgConnection, command_id: Uuid, appended: bool) {
    let query = if appended {
        sqlx::query("SELECT pg_notify($1, $2), pg_notify($3, '')")
    } else {
        sqlx::query("SELECT pg_notify($1, $2)")
    };
    let query = query.bind(DONE_CHANNEL).bind(command_id.to_string());
    let query = if appended {
        query.bind(store::EVENTS_CHANNEL)
    } else {
        query
    };
    if let Err(e) = query.execute(conn).await {
        tracing::warn!(command = %command_id, error = %e, "announcing an outcome failed; waiting callers poll");
    }
}

/// Puts a failed attempt back in the queue, due after `delay` (stored in the job row,
/// so the backoff holds across restarts).
pub async fn retry_later(
    pool: &PgPool,
    job: &ClaimedJob,
    error: &CommandError,
    delay: Duration,
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("UPDATE grove.commands SET status = 'queued', error = $2, worker_id = NULL WHERE command_id = $1")
        .bind(job.command_id)
        .bind(serde_json::to_value(error)?)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "UPDATE apalis.jobs SET status = 'Pending', lock_by = NULL, lock_at = NULL,
             run_at = now() + make_interval(secs => $2), last_result = $3
         WHERE id = $1",
    )
    .bind(&job.job_id)
    .bind(delay.as_secs_f64())
    .bind(serde_json::json!({ "Err": error.message }))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    crate::telemetry::retried(job.kind, job.claimed_at.elapsed());
    Ok(())
}

/// Hands a job back to the queue (status `Pending`, unlocked), leaving its ledger row as
/// it is. Used when a worker could not record an outcome.
pub async fn requeue(pool: &PgPool, job_id: &str) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE apalis.jobs SET status = 'Pending', lock_by = NULL, lock_at = NULL WHERE id = $1 AND status IN ('Queued', 'Running')",
    )
    .bind(job_id)
    .execute(pool)
    .await?;
    Ok(())
}

/// Hands back jobs locked by `worker_id` for longer than `older_than` that it no longer
/// runs (not in `inflight`): e.g. when recording an outcome failed while the database
/// was away. Jobs claimed a moment ago are left alone by the age bound.
pub async fn requeue_abandoned(
    pool: &PgPool,
    worker_id: &str,
    inflight: &[String],
    older_than: Duration,
) -> Result<u64, StoreError> {
    Ok(sqlx::query(
        "UPDATE apalis.jobs SET status = 'Pending', lock_by = NULL, lock_at = NULL
         WHERE lock_by = $1 AND status IN ('Queued', 'Running') AND id <> ALL($2)
           AND lock_at < now() - make_interval(secs => $3)",
    )
    .bind(worker_id)
    .bind(inflight)
    .bind(older_than.as_secs_f64())
    .execute(pool)
    .await?
    .rows_affected())
}

/// Starts a command that the receiving process runs inline (ADR 31), in the caller's
/// transaction: its ledger row `running` (attempt 1, `worker_id`) and its job row
/// already claimed by `worker_id` (`grove.start_inline`). `None` when the command id is
/// already known: nothing was inserted, and the caller waits for that command's outcome.
/// Committed before the effect (an exec, an edit), the `running` row is what ends the
/// command as `worker_lost` if the process dies; committed with the outcome (an
/// idempotent write), the row is only ever seen finished.
pub async fn start_inline(
    conn: &mut PgConnection,
    command_id: Uuid,
    command: &Command,
    queue: &str,
    worker_id: &str,
) -> Result<Option<ClaimedJob>, StoreError> {
    let began = std::time::SystemTime::now();
    let row = sqlx::query("SELECT job_id, inserted FROM grove.start_inline($1, $2, $3, $4, $5)")
        .bind(command_id)
        .bind(serde_json::to_value(command)?)
        .bind(queue)
        .bind(worker_id)
        .bind(max_attempts(command))
        .fetch_one(&mut *conn)
        .await?;
    if !row.try_get::<bool, _>("inserted")? {
        return Ok(None);
    }
    Ok(Some(started_inline(
        &row, command_id, command, queue, began,
    )?))
}

/// [`record_inline`] with its events folded onto rows the caller holds (ADR 36), in one
/// statement outside any transaction (`grove.record_inline_folded`): its commit is the
/// record's one flushed commit. `None` when the command id is taken (nothing written);
/// else the job and the version the written rows now carry. A held row changed since
/// it was read is an error [`crate::folded::is_stale`] tells apart, and writes nothing.
#[allow(clippy::too_many_arguments)]
pub async fn record_inline_folded(
    conn: &mut PgConnection,
    command: &Command,
    queue: &str,
    worker_id: &str,
    outcome: &Result<CommandResult, CommandError>,
    (folded, events): (&crate::folded::FoldedAppend, &[Event]),
    fences: &[crate::locks::Fence],
) -> Result<Option<(ClaimedJob, String)>, StoreError> {
    let command_id = folded.command_id();
    let began = std::time::SystemTime::now();
    let args = OutcomeArgs::of(outcome, fences)?;
    let query = sqlx::query(
        "SELECT job_id, inserted, fenced, row_xmin FROM grove.record_inline_folded(
             $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)",
    );
    let query = args.bind_record(query, (command_id, command, queue, worker_id))?;
    let row = folded
        .bind_without_command(query)
        .fetch_one(&mut *conn)
        .await?;
    if row.try_get::<bool, _>("fenced")? {
        return Err(lease_lost());
    }
    if !row.try_get::<bool, _>("inserted")? {
        return Ok(None);
    }
    let version: String = row.try_get("row_xmin")?;
    let job = started_inline(&row, command_id, command, queue, began)?;
    crate::telemetry::finished(job.kind, outcome, events, job.claimed_at.elapsed());
    Ok(Some((job, version)))
}

/// [`finish_fenced`] with the events folded onto rows the caller holds (ADR 36), in one
/// statement outside any transaction (`grove.finish_folded`), claiming nothing. `None`
/// when another attempt owns the command (nothing written); else the version the written
/// rows now carry. A lost lease is [`StoreError::Fenced`]; a stale held row as in
/// [`record_inline_folded`]; both write nothing.
#[tracing::instrument(
    target = TARGET, name = "grove.commit", level = "trace", skip_all,
    fields(command_id = %done.job.command_id, events = done.events.len())
)]
pub async fn finish_folded(
    conn: &mut PgConnection,
    done: &Outcome<'_>,
    folded: &crate::folded::FoldedAppend,
    fences: &[crate::locks::Fence],
) -> Result<Option<String>, StoreError> {
    let job = done.job;
    let outcome = done.outcome;
    let args = OutcomeArgs::of(outcome, fences)?;
    let query = sqlx::query(
        "SELECT fenced, recorded, row_xmin FROM grove.finish_folded(
             $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
    );
    let query = args.bind_finish(query, done);
    let row = folded
        .bind_without_command(query)
        .fetch_one(&mut *conn)
        .await?;
    if row.try_get::<bool, _>("fenced")? {
        return Err(lease_lost());
    }
    if !row.try_get::<bool, _>("recorded")? {
        tracing::warn!(command = %job.command_id, "outcome not recorded: another attempt owns the command");
        return Ok(None);
    }
    crate::telemetry::finished(job.kind, outcome, done.events, job.claimed_at.elapsed());
    Ok(Some(row.try_get("row_xmin")?))
}

/// [`start_inline`] with its start events folded onto rows the caller holds (ADR 36),
/// in one statement outside any transaction (`grove.start_inline_folded`). `None` when
/// the command id is taken (nothing written); else the job and the version the written
/// rows now carry; a stale held row as in [`record_inline_folded`].
pub async fn start_inline_folded(
    conn: &mut PgConnection,
    command: &Command,
    queue: &str,
    worker_id: &str,
    folded: &crate::folded::FoldedAppend,
) -> Result<Option<(ClaimedJob, String)>, StoreError> {
    let command_id = folded.command_id();
    let began = std::time::SystemTime::now();
    let query = sqlx::query(
        "SELECT job_id, inserted, row_xmin FROM grove.start_inline_folded(
             $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(command_id)
    .bind(serde_json::to_value(command)?)
    .bind(queue)
    .bind(worker_id)
    .bind(max_attempts(command));
    let row = folded
        .bind_without_command(query)
        .fetch_one(&mut *conn)
        .await?;
    if !row.try_get::<bool, _>("inserted")? {
        return Ok(None);
    }
    let version: String = row.try_get("row_xmin")?;
    let job = started_inline(&row, command_id, command, queue, began)?;
    Ok(Some((job, version)))
}

/// The claimed job of an inline command whose ledger row `row` (`job_id`) inserted.
fn started_inline(
    row: &sqlx::postgres::PgRow,
    command_id: Uuid,
    command: &Command,
    queue: &str,
    began: std::time::SystemTime,
) -> Result<ClaimedJob, StoreError> {
    crate::telemetry::started(command.kind(), queue);
    Ok(ClaimedJob {
        job_id: row.try_get("job_id")?,
        queue: queue.to_string(),
        command_id,
        kind: command.kind(),
        claimed_at: std::time::Instant::now(),
        claim_window: (began, std::time::SystemTime::now()),
    })
}

/// An outcome and the fences it is recorded under, as the ledger functions' arguments.
struct OutcomeArgs {
    keys: Vec<i64>,
    holders: Vec<Uuid>,
    status: &'static str,
    result: Option<serde_json::Value>,
    error: Option<serde_json::Value>,
    job_status: &'static str,
}

impl OutcomeArgs {
    fn of(
        outcome: &Result<CommandResult, CommandError>,
        fences: &[crate::locks::Fence],
    ) -> Result<Self, StoreError> {
        Ok(Self {
            keys: fences.iter().map(|f| f.key).collect(),
            holders: fences.iter().map(|f| f.holder).collect(),
            status: finished_status(outcome.is_ok()),
            result: outcome
                .as_ref()
                .ok()
                .map(serde_json::to_value)
                .transpose()?,
            error: outcome
                .as_ref()
                .err()
                .map(serde_json::to_value)
                .transpose()?,
            job_status: if outcome.is_ok() { "Done" } else { "Killed" },
        })
    }

    /// The nine arguments `grove.finish_folded` and `grove.finish_claiming` begin with:
    /// the fences, then the outcome of `done`'s job by its worker.
    fn bind_finish<'q>(
        &'q self,
        query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
        done: &'q Outcome<'_>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        query
            .bind(&self.keys)
            .bind(&self.holders)
            .bind(done.job.command_id)
            .bind(done.worker_id)
            .bind(self.status)
            .bind(&self.result)
            .bind(&self.error)
            .bind(self.job_status)
            .bind(&done.job.job_id)
    }

    /// `grove.record_inline`'s eleven arguments (the first of the folded variant's).
    fn bind_record<'q>(
        &'q self,
        query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
        (command_id, command, queue, worker_id): (Uuid, &Command, &'q str, &'q str),
    ) -> Result<sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>, StoreError>
    {
        Ok(query
            .bind(command_id)
            .bind(serde_json::to_value(command)?)
            .bind(queue)
            .bind(worker_id)
            .bind(max_attempts(command))
            .bind(&self.keys)
            .bind(&self.holders)
            .bind(self.status)
            .bind(&self.result)
            .bind(&self.error)
            .bind(self.job_status))
    }
}

/// What a ledger function's `fenced` means.
fn lease_lost() -> StoreError {
    StoreError::Fenced("a lock lost its lease while the database was unreachable".into())
}

/// A command the receiving process ran inline and that may run again (ADR 31's
/// `write_file`, ADR 34's reuses), recorded after its effect in the caller's open
/// transaction: the fence check, [`start_inline`] and the outcome in one statement
/// (`grove.record_inline`), then its events. `None` when the command id was taken
/// meanwhile (nothing written); [`StoreError::Fenced`] when a lease is gone. The
/// caller commits.
#[allow(clippy::too_many_arguments)]
pub async fn record_inline(
    tx: &mut PgConnection,
    command: (Uuid, &Command),
    queue: &str,
    worker_id: &str,
    outcome: &Result<CommandResult, CommandError>,
    events: &[Event],
    metadata: &Metadata,
    at: DateTime<Utc>,
    fences: &[crate::locks::Fence],
) -> Result<Option<ClaimedJob>, StoreError> {
    let (command_id, command) = command;
    let began = std::time::SystemTime::now();
    let args = OutcomeArgs::of(outcome, fences)?;
    let query = sqlx::query(
        "SELECT job_id, inserted, fenced, recorded
           FROM grove.record_inline($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    );
    let row = args
        .bind_record(query, (command_id, command, queue, worker_id))?
        .fetch_one(&mut *tx)
        .await?;
    if row.try_get::<bool, _>("fenced")? {
        return Err(lease_lost());
    }
    if !row.try_get::<bool, _>("inserted")? {
        return Ok(None);
    }
    if !row.try_get::<bool, _>("recorded")? {
        return Err(StoreError::Corrupt(
            "an inline command's own ledger row was not running".into(),
        ));
    }
    let job = started_inline(&row, command_id, command, queue, began)?;
    store::append(&mut *tx, events, metadata, at).await?;
    crate::telemetry::finished(job.kind, outcome, events, job.claimed_at.elapsed());
    Ok(Some(job))
}
