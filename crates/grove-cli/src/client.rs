//! Submitting a command from the CLI: `grove_postgres::submit` with a listener of its own.
//! The CLI is the operator's tool: a command naming a local repository goes in with the
//! operator's grant (`grove_postgres::boundary`), which the HTTP API, MCP and SQL
//! callers cannot give.

use anyhow::Result;
use grove_core::commands::{Command, CommandResult};
use grove_postgres::queue;
use grove_postgres::submit::{self, SubmitError, WaitOptions};
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use uuid::Uuid;

/// Enqueues `command` (once per command id) and waits for its outcome. A command's
/// failure comes back as a `CommandError`, which `main` maps to its exit code.
pub async fn submit(
    pool: &PgPool,
    command: &Command,
    command_id: Option<Uuid>,
    token: Option<&str>,
) -> Result<CommandResult> {
    // Subscribe before enqueueing so the outcome's notification cannot be missed.
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(queue::DONE_CHANNEL).await?;
    let opts = WaitOptions::from_env();
    let outcome = if grove_core::local_repo::names_local_repo(command) {
        grove_postgres::boundary::submit_as_operator(
            pool,
            command,
            command_id,
            token,
            &mut listener,
            opts,
        )
        .await
    } else {
        submit::submit(pool, command, command_id, token, &mut listener, opts).await
    };
    match outcome {
        Ok(result) => Ok(result),
        Err(SubmitError::Command(e)) => Err(e.into()),
        Err(e) => Err(e.into()),
    }
}
