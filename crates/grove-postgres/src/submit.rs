//! Submitting a command as a caller does: route it to a queue, enqueue it, wait for its outcome.
//!
//! Shared by every caller that waits (the CLI, the HTTP API). What wakes a waiting
//! caller is a [`Wakeup`]: the CLI LISTENs on [`queue::DONE_CHANNEL`] with a connection of
//! its own, a server shares one listener among all its requests. Either way the ledger
//! row is the truth and is polled as a fallback, so a lost notification only delays.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use grove_core::commands::{Command, CommandResult};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::state::LedgerStatus;
use sqlx::postgres::PgListener;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::trace_context::TARGET;
use crate::{queue, rows, StoreError};

/// Why a submitted command did not produce a result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The command failed, or was refused before it ran (unknown workspace, no worker
    /// took it, an id reused for another command). Handling: map `kind` to the exit
    /// code or HTTP status; do not retry as-is.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// Postgres could not be reached or answered with an error. Handling: 500 / exit 1.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for SubmitError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

/// How long a caller waits.
#[derive(Debug, Clone, Copy)]
pub struct WaitOptions {
    /// A job still unclaimed after this long is withdrawn ("start a worker"); a claimed
    /// job whose workers all stopped heart-beating for this long is left and reported.
    pub claim_timeout: Duration,
    /// The polling fallback between notifications.
    pub poll_every: Duration,
}

impl Default for WaitOptions {
    fn default() -> Self {
        Self {
            claim_timeout: Duration::from_secs(10),
            poll_every: Duration::from_millis(250),
        }
    }
}

impl WaitOptions {
    /// The defaults, with `GROVE_CLAIM_TIMEOUT` (seconds) when set.
    pub fn from_env() -> Self {
        let mut opts = Self::default();
        if let Some(t) = std::env::var("GROVE_CLAIM_TIMEOUT")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|t| t.is_finite() && *t >= 0.0)
        {
            opts.claim_timeout = Duration::from_secs_f64(t);
        }
        opts
    }
}

/// What wakes a caller waiting on a command. Implementations must have subscribed
/// before the command was enqueued, so its notification cannot be missed.
pub trait Wakeup: Send {
    /// Returns when `command_id` may have progressed, or after `max` at the latest.
    fn wait(&mut self, command_id: Uuid, max: Duration) -> BoxFuture<'_, ()>;
}

/// A listener of one's own, LISTENing on [`queue::DONE_CHANNEL`] (the CLI's form).
/// Notifications of other commands are skipped: only this command's outcome (or `max`)
/// ends the wait, so a busy system does not make the caller re-read its row for every
/// command that finishes.
impl Wakeup for PgListener {
    fn wait(&mut self, command_id: Uuid, max: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let ours = command_id.to_string();
            let _ = tokio::time::timeout(max, async {
                loop {
                    match self.try_recv().await {
                        Ok(Some(n)) if n.payload() != ours => continue,
                        // Ours, or the connection dropped (a notification may have been
                        // lost with it): read the row.
                        _ => return,
                    }
                }
            })
            .await;
        })
    }
}

/// The queue a command belongs on: its workspace's node (or remote provider), the
/// provider's queue for an acquire placing a new workspace in one, or the shared queue
/// when the command creates something new on a node (any worker may place it). See
/// ADR 06 and ADR 15.
pub async fn route(pool: &PgPool, command: &Command) -> Result<String, SubmitError> {
    let mut conn = pool.acquire().await?;
    route_on(&mut conn, command).await
}

/// [`route`] on a connection the caller holds.
async fn route_on(conn: &mut PgConnection, command: &Command) -> Result<String, SubmitError> {
    if let Some(id) = command.workspace_id() {
        let ws = rows::workspace(&mut *conn, id).await?.ok_or_else(|| {
            CommandError::new(ErrorKind::NotFound, format!("workspace {id} not found"))
        })?;
        return Ok(queue::placement_queue(&ws.node));
    }
    if let Command::EvictSweep(c) = command {
        return Ok(queue::node_queue(&c.node));
    }
    if let Command::AcquireWorkspace(c) = command {
        if let Some(ws) = rows::workspace_by_key(&mut *conn, &c.key("")).await? {
            return Ok(queue::placement_queue(&ws.node));
        }
        if let Some(provider) = c.remote_placement() {
            // Only a worker with that provider configured can place it.
            return Ok(queue::provider_queue(provider));
        }
    }
    Ok(queue::shared_queue())
}

/// Routes and enqueues `command` under `command_id` (once per id), with its git token
/// if any. An id already used for a different command is a conflict: the ledger would
/// otherwise answer with the other command's outcome.
pub async fn enqueue(
    pool: &PgPool,
    command: &Command,
    command_id: Uuid,
    token: Option<&str>,
) -> Result<(), SubmitError> {
    enqueue_with(pool, command, command_id, token, false)
        .await
        .map(|_| ())
}

/// [`enqueue`], asking in the same transaction, when `relay_output`, for the exec's
/// output to be relayed while it runs ([`crate::output`]). Returns whether this call
/// enqueued the command (false: the id was known, its outcome may already be there).
///
/// One pool checkout for the routing read and the enqueue. Without a token or a relay
/// the enqueue is a single call of `grove.enqueue`, atomic on its own, so it needs no
/// explicit transaction (two round trips fewer).
///
/// Runs in a `grove.enqueue` span; with traces exported, the span's context goes on the
/// ledger row in the enqueue's transaction.
#[tracing::instrument(
    target = TARGET, name = "grove.enqueue", level = "trace", skip_all,
    fields(command_id = %command_id, kind = command.kind())
)]
pub async fn enqueue_with(
    pool: &PgPool,
    command: &Command,
    command_id: Uuid,
    token: Option<&str>,
    relay_output: bool,
) -> Result<bool, SubmitError> {
    let trace_parent = crate::trace_context::current();
    let mut conn = pool.acquire().await?;
    let queue_name = route_on(&mut conn, command).await?;
    let inserted = if token.is_none() && !relay_output && trace_parent.is_none() {
        queue::enqueue(&mut conn, command_id, command, &queue_name, None)
            .await?
            .1
    } else {
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        if relay_output {
            crate::output::request_relay(&mut tx, command_id).await?;
        }
        let (_, inserted) =
            queue::enqueue(&mut tx, command_id, command, &queue_name, token).await?;
        if let (true, Some(tp)) = (inserted, &trace_parent) {
            queue::set_trace_parent(&mut tx, command_id, tp).await?;
        }
        tx.commit().await?;
        inserted
    };
    if !inserted {
        same_command(&mut conn, command_id, command).await?;
    }
    Ok(inserted)
}

/// Refuses a command id that the ledger already holds for a different command (an
/// id found taken by an enqueue). Ledger payloads never change, so this read needs no
/// transaction with the enqueue that found the id taken.
pub async fn same_command(
    conn: &mut PgConnection,
    command_id: Uuid,
    command: &Command,
) -> Result<(), SubmitError> {
    let stored: Option<serde_json::Value> =
        sqlx::query_scalar("SELECT payload FROM grove.commands WHERE command_id = $1")
            .bind(command_id)
            .fetch_optional(&mut *conn)
            .await?;
    let ours = serde_json::to_value(command).map_err(StoreError::from)?;
    if stored.is_some_and(|s| s != ours) {
        return Err(CommandError::new(
            ErrorKind::Conflict,
            format!("command id {command_id} was already used for a different command"),
        )
        .into());
    }
    Ok(())
}

/// Waits for the outcome of an enqueued command.
///
/// If no worker claims the job within the claim timeout it is withdrawn and the error
/// says to start one; if it was claimed but no worker is alive any more, the caller
/// stops waiting (the job stays queued for the next worker). While the database is
/// unreachable (a restart, a cut connection) the caller reconnects and waits on, for up
/// to [`OUTAGE_PATIENCE`], then stops with a message that says so.
pub async fn wait(
    pool: &PgPool,
    command_id: Uuid,
    wake: &mut dyn Wakeup,
    opts: WaitOptions,
) -> Result<CommandResult, SubmitError> {
    let started = Instant::now();
    let mut outage: Option<Instant> = None;
    loop {
        match wait_step(pool, command_id, started, opts).await {
            Ok(Some(done)) => return done,
            Ok(None) => {
                outage = None;
                wake.wait(command_id, opts.poll_every).await;
            }
            Err(e) if is_outage(&e) => {
                let since = *outage.get_or_insert_with(Instant::now);
                if since.elapsed() >= OUTAGE_PATIENCE {
                    return Err(CommandError::new(
                        ErrorKind::Unavailable,
                        format!(
                            "the database has been unreachable for {} s while waiting for command {command_id} ({e}); the command may still finish: wait for it again with --command-id {command_id}",
                            since.elapsed().as_secs()
                        ),
                    )
                    .into());
                }
                tracing::debug!(error = %e, "the database is unreachable; waiting for it to return");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// How long a waiting caller rides out a database outage (reconnecting) before it
/// gives up with a message that says the command may still finish.
pub const OUTAGE_PATIENCE: Duration = Duration::from_secs(120);

/// Whether an error means the database is away for now (a restart, a cut connection,
/// a server starting up), so that waiting and reconnecting may work.
pub fn is_outage(e: &StoreError) -> bool {
    match e {
        StoreError::Database(
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::Protocol(_)
            | sqlx::Error::Tls(_),
        ) => true,
        StoreError::Database(sqlx::Error::Database(db)) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
        _ => false,
    }
}

/// One look at a waited-for command: `Some` with its outcome (or a refusal) when the
/// wait is over, `None` to wait on.
async fn wait_step(
    pool: &PgPool,
    command_id: Uuid,
    started: Instant,
    opts: WaitOptions,
) -> Result<Option<Result<CommandResult, SubmitError>>, StoreError> {
    {
        let status = {
            let mut conn = pool.acquire().await?;
            queue::status(&mut conn, command_id).await?
        };
        let Some(status) = status else {
            return Ok(Some(Err(CommandError::new(
                ErrorKind::Internal,
                format!("command {command_id} vanished from the ledger"),
            )
            .into())));
        };
        if status.is_finished() {
            if let Some(err) = status
                .error
                .filter(|_| status.status == LedgerStatus::Failed)
            {
                return Ok(Some(Err(err.into())));
            }
            return Ok(Some(Ok(status.result.unwrap_or(CommandResult::Done))));
        }
        let late = started.elapsed() > opts.claim_timeout;
        if late && status.status == LedgerStatus::Queued && status.attempts == 0 {
            // A job on a remote provider's queue waits for a worker with that provider.
            let queue: Option<String> = sqlx::query_scalar(
                "SELECT j.job_type FROM grove.commands c JOIN apalis.jobs j ON j.id = c.job_id
                 WHERE c.command_id = $1",
            )
            .bind(command_id)
            .fetch_optional(pool)
            .await
            .ok()
            .flatten();
            let secs = opts.claim_timeout.as_secs();
            let reason = match queue.as_deref().and_then(|q| q.strip_prefix("grove:provider:")) {
                Some(provider) => format!(
                    "no grove worker with the {provider} runtime configured took the job within {secs} s; start one with `grove worker` and the {provider} settings in its environment"
                ),
                None => format!(
                    "no grove worker took the job within {secs} s; start one with `grove worker`"
                ),
            };
            if queue::cancel_unclaimed(pool, command_id, &reason).await? {
                return Ok(Some(Err(
                    CommandError::new(ErrorKind::Unavailable, reason).into()
                )));
            }
        }
        if late && queue::live_workers(pool, opts.claim_timeout).await? == 0 {
            // Claimed once, but every worker is gone: say so rather than wait forever.
            // The job stays queued and its outcome is recorded when a worker returns.
            return Ok(Some(Err(CommandError::new(
                ErrorKind::Unavailable,
                format!(
                    "no grove worker is alive to finish command {command_id}; start one with `grove worker` (the outcome will be recorded then)"
                ),
            )
            .into())));
        }
        Ok(None)
    }
}

/// Enqueues `command` (once per command id; a fresh UUIDv7 when `None`) and waits for
/// its outcome. `wake` must already be subscribed.
pub async fn submit(
    pool: &PgPool,
    command: &Command,
    command_id: Option<Uuid>,
    token: Option<&str>,
    wake: &mut dyn Wakeup,
    opts: WaitOptions,
) -> Result<CommandResult, SubmitError> {
    let command_id = command_id.unwrap_or_else(Uuid::now_v7);
    let inserted = enqueue_with(pool, command, command_id, token, false).await?;
    if inserted {
        // Just enqueued: its row cannot be finished yet, so the first read waits for
        // the outcome's notification (or the polling interval) instead of being made
        // at once for nothing.
        wake.wait(command_id, opts.poll_every).await;
    }
    wait(pool, command_id, wake, opts).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_connections_are_outages_and_answers_are_not() {
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(is_outage(&StoreError::Database(sqlx::Error::Io(reset))));
        assert!(is_outage(&StoreError::Database(sqlx::Error::PoolTimedOut)));
        assert!(!is_outage(&StoreError::Database(sqlx::Error::RowNotFound)));
        assert!(!is_outage(&StoreError::Locked("busy".into())));
        assert!(!is_outage(&StoreError::Fenced("lost".into())));
    }
}
