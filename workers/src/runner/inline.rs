//! Write tools and execs run by the process that received them (ADR 31): the worker's
//! side of [`grove_core::inline::InlineWrites`], for the API server in the same process.
//!
//! The queued handler's code with its ledger row, workspace lock, fencing and outcome
//! recording; the enqueue and the claim are replaced by one insert of a started ledger
//! row and claimed job (`queue::start_inline`). An exec commits that row with its start
//! events before the command runs, and its outcome after: two flushed commits. An edit
//! that may not run twice (`create`, `str_replace`, `insert`) commits the row before the
//! edit and its outcome after: two. `write_file`, which may run again, commits the row,
//! its events and its outcome together after the write: one (the lock's statement also
//! reads whether the command id is known, which answers it without writing). The
//! lock is freed after the answer, in a task of its own. The command's trace
//! span, `grove.inline`, is a child of the request's (ADR 30). Every command runs in a
//! task of its own, so a caller that goes away does not stop it half-way.

use std::sync::Arc;

use futures::future::BoxFuture;
use grove_core::commands::{Command, CommandResult};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::events::{Correlation, Metadata};
use grove_core::inline::{is_inline_write, InlineWrites};
use grove_core::model::WorkspaceRow;
use grove_core::ports::GitToken;
use grove_core::tools::ToolRequest;
use grove_postgres::locks::{AdvisoryLock, LeaseCommit};
use grove_postgres::queue::{self, ClaimedJob};
use grove_postgres::trace_context::TARGET;
use tracing::Instrument;
use uuid::Uuid;

use super::metadata;
use super::outcome::{close_started_execs, finish_patiently, record_handled, Release};
use crate::context::{correlation_of, internal, now, store_error, Handled, JobContext};
use crate::jobs::exec::InlineExec;
use crate::jobs::tools::tool_events;

/// Runs write tools and execs of this worker's node's workspaces in the calling process.
pub struct InlineWriter {
    deps: Arc<JobContext>,
}

impl InlineWriter {
    pub fn new(deps: Arc<JobContext>) -> Self {
        Self { deps }
    }

    async fn spawned(
        &self,
        command_id: Uuid,
        command: Command,
    ) -> Result<Option<CommandResult>, CommandError> {
        let deps = self.deps.clone();
        // The request's trace goes on into the task: its locks and commits nest here.
        let span = tracing::trace_span!(target: TARGET, "grove.inline", command_id = %command_id, kind = command.kind());
        let task = async move { run(&deps, command_id, &command).await };
        tokio::spawn(task.instrument(span))
            .await
            .map_err(|e| internal(format!("an inline command's task failed: {e}")))?
    }
}

impl InlineWrites for InlineWriter {
    fn run<'a>(
        &'a self,
        command_id: Uuid,
        command: &'a Command,
    ) -> BoxFuture<'a, Result<Option<CommandResult>, CommandError>> {
        Box::pin(self.spawned(command_id, command.clone()))
    }

    fn reuse<'a>(
        &'a self,
        command_id: Uuid,
        command: &'a Command,
        token: Option<&'a GitToken>,
    ) -> BoxFuture<'a, Result<Option<CommandResult>, CommandError>> {
        let (command, token) = (command.clone(), token.cloned());
        Box::pin(super::reuse::spawned(
            self.deps.clone(),
            command_id,
            command,
            token,
        ))
    }
}

async fn run(
    deps: &JobContext,
    command_id: Uuid,
    command: &Command,
) -> Result<Option<CommandResult>, CommandError> {
    command.validate()?;
    match command {
        Command::Exec(e) => {
            let md = inline_metadata(deps, command_id, Correlation::default());
            match deps.exec_inline(e, command_id, command, &md).await? {
                InlineExec::Known => Ok(None),
                InlineExec::Started {
                    job,
                    handled,
                    in_flight,
                } => {
                    let answer = record(deps, &job, handled, true).await;
                    drop(in_flight);
                    answer.map(Some)
                }
            }
        }
        Command::Tool(t) if is_inline_write(&t.op) => tool(deps, command_id, command, t).await,
        other => Err(internal(format!("{} never runs inline", other.kind()))),
    }
}

pub(super) fn inline_metadata(
    deps: &JobContext,
    command_id: Uuid,
    correlation: Correlation,
) -> Metadata {
    Metadata {
        command_id,
        correlation,
        worker_id: deps.config.worker_id.clone(),
        node: deps.config.node.clone(),
    }
}

/// Records the outcome of a started command as the runner records a claimed job's (the
/// locks released after, a failure recorded with an exec's `exec.finished`), and
/// answers it. A failure to record leaves the ledger row `running` and hands the job
/// back: its next delivery ends it as `worker_lost`.
async fn record(
    deps: &JobContext,
    job: &ClaimedJob,
    handled: Result<Handled, CommandError>,
    exec: bool,
) -> Result<CommandResult, CommandError> {
    let (answer, recorded) = match handled {
        Ok(handled) => {
            let answer = handled.result.clone();
            (
                answer,
                record_handled(deps, job, handled, now(), None, Release::Soon)
                    .await
                    .map(drop),
            )
        }
        Err(e) => {
            let md = metadata(deps, job, Correlation::default());
            let events = if exec {
                close_started_execs(deps, job, "rejected").await
            } else {
                Ok(Vec::new())
            };
            let recorded = match events {
                Ok(events) => {
                    finish_patiently(deps, job, &Err(e.clone()), &events, &md, now(), &[]).await
                }
                Err(store) => Err(store),
            };
            (Err(e), recorded)
        }
    };
    if let Err(e) = recorded {
        tracing::warn!(command = %job.command_id, error = %e, "recording an inline command's outcome failed");
        let _ = queue::requeue(&deps.pool, &job.job_id).await;
        return Err(store_error(e));
    }
    answer
}

/// A file write tool, under the workspace's exclusive command lock: the ledger row
/// inserted under the lock (a retry of a known command id finds it and runs nothing),
/// the write, and its events and outcome.
async fn tool(
    deps: &JobContext,
    command_id: Uuid,
    command: &Command,
    req: &ToolRequest,
) -> Result<Option<CommandResult>, CommandError> {
    // The lease rides on the call's first flushed commit (ADR 33): an edit's ledger row
    // before the edit, a `write_file`'s one commit after the write.
    let commit = LeaseCommit::WithNextCommit;
    let (ws, mut lock, known) = if req.op.is_idempotent() {
        deps.lock_workspace_for(req.workspace_id, commit, command_id)
            .await?
    } else {
        let (ws, lock) = deps
            .lock_workspace_with(req.workspace_id, false, commit)
            .await?;
        (ws, lock, false)
    };
    if let Err(refused) = check_tool_target(deps, &ws, req) {
        lock.release().await.ok();
        return Err(refused);
    }
    if known {
        lock.release().await.ok();
        return Ok(None);
    }
    if req.op.is_idempotent() {
        return write_once(deps, command_id, command, req, ws, lock).await;
    }
    let queue_name = queue::node_queue(&deps.config.node);
    let started = queue::start_inline(
        lock.conn(),
        command_id,
        command,
        &queue_name,
        &deps.config.worker_id,
    )
    .await;
    let job = match started {
        Ok(Some(job)) => {
            lock.flushed_by_commit();
            job
        }
        Ok(None) => {
            lock.release().await.ok();
            return Ok(None);
        }
        Err(e) => {
            lock.release().await.ok();
            return Err(store_error(e));
        }
    };
    let in_flight = deps.in_flight(&job.job_id);
    let prefetch = deps.prefetch_point(&ws);
    let handled = match deps.run_tool(&ws, &req.op, None).await {
        Ok(output) => {
            let mut events = tool_events(ws.id, &req.op, &output);
            events.extend(deps.after_tool(&ws, &req.op, prefetch).await);
            Handled {
                result: Ok(CommandResult::Tool(output)),
                events,
                locks: vec![lock],
                correlation: correlation_of(&ws),
            }
        }
        Err(e) => Handled {
            result: Err(e),
            events: Vec::new(),
            locks: vec![lock],
            correlation: correlation_of(&ws),
        },
    };
    let answer = record(deps, &job, Ok(handled), false).await;
    drop(in_flight);
    answer.map(Some)
}

/// What the queued handler refuses under the lock: a workspace that left this node (a
/// transient conflict: the caller retries through the queue), a read-only one.
fn check_tool_target(
    deps: &JobContext,
    ws: &WorkspaceRow,
    req: &ToolRequest,
) -> Result<(), CommandError> {
    if ws.node != deps.config.node {
        return Err(CommandError::new(
            ErrorKind::Conflict,
            format!(
                "workspace {} is no longer on node {}",
                ws.id, deps.config.node
            ),
        )
        .transient());
    }
    if !ws.capabilities.writable {
        return Err(CommandError::new(
            ErrorKind::Rejected,
            format!(
                "workspace {} is read-only ({} mode): {} is a write tool and is refused",
                ws.id,
                ws.mode.as_str(),
                req.op.name()
            ),
        ));
    }
    Ok(())
}

/// An idempotent write (`write_file`), its ledger row, job, events and outcome in one
/// commit after the write: nothing is recorded before, so a process that dies leaves at
/// most the file written, which a retry writes again; no transaction is open while the
/// file is written and its point taken. A command id already known when the lock was
/// taken is answered from the ledger without writing (by [`tool`]); one that a queued
/// duplicate took meanwhile (while this one waited for the lock, or while it wrote) is
/// answered from its outcome too, the file written by both.
/// A failed write records nothing (as a refused route), so a retry runs again.
async fn write_once(
    deps: &JobContext,
    command_id: Uuid,
    command: &Command,
    req: &ToolRequest,
    ws: WorkspaceRow,
    mut lock: AdvisoryLock,
) -> Result<Option<CommandResult>, CommandError> {
    // The point's base is read on another connection while the file is written.
    let prefetch = deps.prefetch_point(&ws);
    let output = match deps.run_tool(&ws, &req.op, None).await {
        Ok(output) => output,
        Err(e) => {
            lock.release().await.ok();
            return Err(e);
        }
    };
    let mut events = tool_events(ws.id, &req.op, &output);
    events.extend(deps.after_tool(&ws, &req.op, prefetch).await);
    let written = Written {
        command_id,
        command,
        md: inline_metadata(deps, command_id, correlation_of(&ws)),
        outcome: Ok(CommandResult::Tool(output)),
        events,
    };
    let mut tries = 0;
    let recorded = loop {
        tries += 1;
        match record_write(deps, &written, &mut lock).await {
            // Another append to the workspace's stream took its next version first (as
            // for the queue's outcome, up to three tries).
            Err(grove_postgres::StoreError::Conflict(_)) if tries < 3 => continue,
            other => break other,
        }
    };
    match recorded {
        Ok(true) => {
            lock.release_announcing_soon(command_id, !written.events.is_empty());
            Ok(Some(written.outcome?))
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

/// A finished `write_file` (or a reuse, ADR 34), to record.
pub(super) struct Written<'a> {
    pub(super) command_id: Uuid,
    pub(super) command: &'a Command,
    pub(super) md: Metadata,
    pub(super) outcome: Result<CommandResult, CommandError>,
    pub(super) events: Vec<grove_core::events::Event>,
}

/// [`write_once`]'s one commit, on the lock's connection, fenced by the lock: false
/// (nothing written) when the command id was taken meanwhile. One statement when the
/// events fold onto the rows the lock holds (ADR 36), else a transaction.
pub(super) async fn record_write(
    deps: &JobContext,
    w: &Written<'_>,
    lock: &mut AdvisoryLock,
) -> Result<bool, grove_postgres::StoreError> {
    let fences = [lock.fence()];
    let queue_name = queue::node_queue(&deps.config.node);
    let worker = &deps.config.worker_id;
    let at = now();
    if let Some(folded) = lock.held_rows().fold(&w.events, &w.md, at)? {
        let recorded = queue::record_inline_folded(
            lock.conn(),
            w.command,
            &queue_name,
            worker,
            &w.outcome,
            (&folded, &w.events),
            &fences,
        )
        .await;
        match recorded {
            Ok(Some((_, version))) => {
                lock.absorb(folded, version);
                return Ok(true);
            }
            Ok(None) => return Ok(false),
            Err(e) if grove_postgres::folded::is_stale(&e) => lock.forget_rows(),
            Err(e) => return Err(e),
        }
    }
    let mut tx = sqlx::Connection::begin(lock.conn()).await?;
    let job = queue::record_inline(
        &mut tx,
        (w.command_id, w.command),
        &queue_name,
        worker,
        &w.outcome,
        &w.events,
        &w.md,
        at,
        &fences,
    )
    .await?;
    if job.is_none() {
        return Ok(false);
    }
    tx.commit().await?;
    lock.forget_rows();
    Ok(true)
}
