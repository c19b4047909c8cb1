//! Submitting a command: route it to a queue, enqueue it, and wait for its outcome.

use std::time::{Duration, Instant};

use anyhow::Result;
use grove_core::commands::{Command, CommandResult};
use grove_core::error::{CommandError, ErrorKind};
use grove_postgres::{queue, rows};
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use uuid::Uuid;

/// How long a job may wait unclaimed before the CLI withdraws it and says to start a worker.
fn claim_timeout() -> Duration {
    std::env::var("GROVE_CLAIM_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .map(Duration::from_secs_f64)
        .unwrap_or(Duration::from_secs(10))
}

/// The queue a command belongs on: its workspace's node, or the shared queue when the
/// command creates something new (any worker may place it).
async fn route(pool: &PgPool, command: &Command) -> Result<String> {
    let mut conn = pool.acquire().await?;
    if let Some(id) = command.workspace_id() {
        let ws = rows::workspace(&mut conn, id).await?.ok_or_else(|| {
            CommandError::new(ErrorKind::NotFound, format!("workspace {id} not found"))
        })?;
        return Ok(queue::node_queue(&ws.node));
    }
    if let Command::EvictSweep(c) = command {
        return Ok(queue::node_queue(&c.node));
    }
    if let Command::AcquireWorkspace(c) = command {
        if let Some(ws) = rows::workspace_by_key(&mut conn, &c.key("")).await? {
            return Ok(queue::node_queue(&ws.node));
        }
    }
    Ok(queue::shared_queue())
}

/// Enqueues `command` (once per command id) and waits for its outcome.
pub async fn submit(
    pool: &PgPool,
    command: &Command,
    command_id: Option<Uuid>,
    token: Option<&str>,
) -> Result<CommandResult> {
    let command_id = command_id.unwrap_or_else(Uuid::now_v7);
    let queue_name = route(pool, command).await?;
    // Subscribe before enqueueing so the outcome's notification cannot be missed.
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(queue::DONE_CHANNEL).await?;
    {
        let mut tx = pool.begin().await?;
        queue::enqueue(&mut tx, command_id, command, &queue_name, token).await?;
        tx.commit().await?;
    }
    wait(pool, &mut listener, command_id).await
}

async fn wait(pool: &PgPool, listener: &mut PgListener, command_id: Uuid) -> Result<CommandResult> {
    let started = Instant::now();
    let claim_timeout = claim_timeout();
    loop {
        let status = {
            let mut conn = pool.acquire().await?;
            queue::status(&mut conn, command_id).await?
        };
        let Some(status) = status else {
            anyhow::bail!("command {command_id} vanished from the ledger");
        };
        if status.is_finished() {
            if let Some(err) = status.error.filter(|_| status.status == "failed") {
                return Err(err.into());
            }
            return Ok(status.result.unwrap_or(CommandResult::Done));
        }
        if status.status == "queued" && status.attempts == 0 && started.elapsed() > claim_timeout {
            let reason = format!(
                "no grove worker took the job within {} s; start one with `grove worker`",
                claim_timeout.as_secs()
            );
            if queue::cancel_unclaimed(pool, command_id, &reason).await? {
                return Err(CommandError::new(ErrorKind::Unavailable, reason).into());
            }
        }
        if started.elapsed() > claim_timeout && queue::live_workers(pool, claim_timeout).await? == 0
        {
            // Claimed once, but every worker is gone: say so rather than wait forever.
            // The job stays queued and its outcome is recorded when a worker returns.
            return Err(CommandError::new(
                ErrorKind::Unavailable,
                format!(
                    "no grove worker is alive to finish command {command_id}; start one with `grove worker` (the outcome will be recorded then)"
                ),
            )
            .into());
        }
        // The notification wakes us at once; the timeout is the polling fallback.
        let _ = tokio::time::timeout(Duration::from_millis(250), listener.try_recv()).await;
    }
}
