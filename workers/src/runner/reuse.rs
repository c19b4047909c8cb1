//! Acquires and ensures whose decision is the cheap one, run by the process that
//! received them (ADR 34): the worker's side of
//! [`grove_core::inline::InlineWrites::reuse`].
//!
//! A warm acquire (the key's workspace exists, whole, on this node) and an ensure of a
//! cache fresh enough to need no fetch only record that they used what exists: both may
//! run again, so nothing is recorded before the decision. Where that use was recorded
//! within the recent-use window, not even that: the row is the answer (ADR 40).
//!
//! Otherwise, under the lock the queued handler takes (the key's, exclusive; the
//! cache's, shared), the handler's own decision code builds the events and the answer;
//! then one transaction on the lock's connection holds the fence check, the ledger row
//! and job and the outcome (one statement, `grove.record_inline`), then the events: the
//! commit path of an inline `write_file` ([`super::inline::record_write`]). Anything
//! else (a create, a restore, a fetch, a clone) records nothing here and answers
//! `None`: the caller submits the command to the queue under the same command id. So
//! does a command id already in the ledger, whose recorded outcome the queue's wait
//! answers.

use std::sync::Arc;

use grove_core::commands::{Command, CommandResult};
use grove_core::error::CommandError;
use grove_core::ports::GitToken;
use grove_postgres::locks::AdvisoryLock;
use grove_postgres::trace_context::TARGET;
use grove_postgres::{queue, StoreError};
use tracing::Instrument;
use uuid::Uuid;

use super::inline::{inline_metadata, record_write, Written};
use crate::context::{internal, now, store_error, Handled, JobContext, Reuse};

/// Runs [`reuse`] in a task of its own, so a caller that goes away does not stop it
/// between its lock and its commit.
pub(super) async fn spawned(
    deps: Arc<JobContext>,
    command_id: Uuid,
    command: Command,
    token: Option<GitToken>,
) -> Result<Option<CommandResult>, CommandError> {
    let span = tracing::trace_span!(target: TARGET, "grove.inline", command_id = %command_id, kind = command.kind());
    let task = async move { reuse(&deps, command_id, &command, token.as_ref()).await };
    tokio::spawn(task.instrument(span))
        .await
        .map_err(|e| internal(format!("an inline command's task failed: {e}")))?
}

/// The cheap case of `command`, decided and recorded; `None` when it takes the queue.
async fn reuse(
    deps: &JobContext,
    command_id: Uuid,
    command: &Command,
    token: Option<&GitToken>,
) -> Result<Option<CommandResult>, CommandError> {
    command.validate()?;
    // A local repository URL its submitter may not use is refused before anything, as
    // the queued handler refuses it.
    deps.check_repo_source(command, command_id).await?;
    let at = now();
    let reused = match command {
        Command::AcquireWorkspace(c) => deps.reacquire_inline(c, at).await?,
        Command::EnsureRepoCache(c) => deps.use_cache_inline(c, token, at).await?,
        _ => None,
    };
    match reused {
        Some(Reuse::Record(handled)) => commit(deps, command_id, command, handled).await,
        Some(Reuse::Recent { result, locks }) => recent(deps, command_id, result, &locks).await,
        None => Ok(None),
    }
}

/// A use recorded recently enough answers as the row stands (ADR 40), unless the
/// command id is in the ledger already (a retry answers its recorded outcome, and an
/// id used for another command is refused, both by the queue's path) or one of `locks`
/// is held exclusively (a destroy or an eviction under way, or the workspace's own
/// exec: the queue's handler waits for it under the key's lock, then decides).
async fn recent(
    deps: &JobContext,
    command_id: Uuid,
    result: CommandResult,
    locks: &[i64],
) -> Result<Option<CommandResult>, CommandError> {
    let free = queue::unrecorded_and_unlocked(&deps.pool, command_id, locks)
        .await
        .map_err(store_error)?;
    Ok(free.then_some(result))
}

/// Records a decided reuse in one commit on its lock's connection, fenced by that lock,
/// and frees the lock (announcing the outcome in the same round trip). `None` when the
/// command id was taken meanwhile: nothing was written.
async fn commit(
    deps: &JobContext,
    command_id: Uuid,
    command: &Command,
    handled: Handled,
) -> Result<Option<CommandResult>, CommandError> {
    let mut locks = handled.locks.into_iter();
    let Some(mut lock) = locks.next() else {
        return Err(internal("an inline reuse was decided without its lock"));
    };
    let written = Written {
        command_id,
        command,
        md: inline_metadata(deps, command_id, handled.correlation),
        outcome: handled.result,
        events: handled.events,
    };
    let recorded = record_retrying(deps, &written, &mut lock).await;
    for other in locks {
        match recorded {
            Ok(true) => other.release_soon(),
            _ => {
                let _ = other.release().await;
            }
        }
    }
    match recorded {
        Ok(true) => {
            lock.release_announcing_soon(command_id, !written.events.is_empty());
            written.outcome.map(Some)
        }
        Ok(false) => {
            lock.release().await.ok();
            Ok(None)
        }
        Err(e) => {
            lock.release().await.ok();
            Err(store_error(e))
        }
    }
}

/// [`record_write`], again when another append took the stream's next version first
/// (up to three tries, as the queue's outcome).
async fn record_retrying(
    deps: &JobContext,
    written: &Written<'_>,
    lock: &mut AdvisoryLock,
) -> Result<bool, StoreError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match record_write(deps, written, lock).await {
            Err(StoreError::Conflict(_)) if tries < 3 => continue,
            other => return other,
        }
    }
}
