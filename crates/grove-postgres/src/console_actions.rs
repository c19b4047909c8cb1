//! The operator console's actions on a workspace (ADR 29): a command enqueued with a
//! row of `grove.command_requesters` naming who asked for it, in the same transaction,
//! and the read of those rows for the timeline.

use std::collections::HashMap;

use grove_core::commands::{Command, CommandResult};
use sqlx::{PgPool, Row};
use uuid::Uuid;

use crate::queue;
use crate::submit::{self, SubmitError, WaitOptions, Wakeup};
use crate::StoreError;

/// How the console names itself in `grove.command_requesters.via`.
pub const VIA_CONSOLE: &str = "console";

/// Enqueues `command` under `command_id` with `requested_by` recorded as its requester
/// (only when this call inserted it: a known id keeps what it had), and waits for its
/// outcome as [`submit::submit`] does. `wake` must already be subscribed.
pub async fn submit_requested(
    pool: &PgPool,
    command: &Command,
    command_id: Uuid,
    requested_by: &str,
    wake: &mut dyn Wakeup,
    opts: WaitOptions,
) -> Result<CommandResult, SubmitError> {
    let queue_name = submit::route(pool, command).await?;
    let trace_parent = crate::trace_context::current();
    let mut tx = pool.begin().await?;
    let (_, inserted) = queue::enqueue(&mut tx, command_id, command, &queue_name, None).await?;
    if inserted {
        sqlx::query(
            "INSERT INTO grove.command_requesters (command_id, requested_by, via)
             VALUES ($1, $2, $3)",
        )
        .bind(command_id)
        .bind(requested_by)
        .bind(VIA_CONSOLE)
        .execute(&mut *tx)
        .await?;
        if let Some(tp) = &trace_parent {
            queue::set_trace_parent(&mut tx, command_id, tp).await?;
        }
    }
    tx.commit().await?;
    if !inserted {
        submit::same_command(&mut *pool.acquire().await?, command_id, command).await?;
    } else {
        wake.wait(command_id, opts.poll_every).await;
    }
    submit::wait(pool, command_id, wake, opts).await
}

/// Who asked for these commands from the console (those that have a row), by id.
pub async fn requesters(
    pool: &PgPool,
    command_ids: &[Uuid],
) -> Result<HashMap<Uuid, String>, StoreError> {
    if command_ids.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = sqlx::query(
        "SELECT command_id, requested_by FROM grove.command_requesters
         WHERE command_id = ANY($1)",
    )
    .bind(command_ids)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("command_id")?, r.try_get("requested_by")?)))
        .collect()
}
