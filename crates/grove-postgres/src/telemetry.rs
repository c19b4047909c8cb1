//! The queue's Prometheus instruments, in the process-wide default registry: jobs
//! enqueued, started and finished (by kind and outcome), job durations, lock waits, and
//! what the committed outcomes say about execs and evictions.
//!
//! Counters live in the process that did the work (an API server counts what it
//! enqueued, a worker what it ran); labels are closed sets (job kinds, error kinds, lock
//! scopes, exec outcomes) or operator-chosen names (queues, which name nodes), never a
//! user, repository, path or id. Nothing here is read back by grove: `/metrics`
//! (grove-api) gathers the registry.

use std::sync::LazyLock;
use std::time::Duration;

use grove_core::commands::CommandResult;
use grove_core::error::CommandError;
use grove_core::events::Event;
use grove_core::eviction::ActionKind;
use grove_core::sweep::ActionOutcome;
use prometheus::{register_histogram_vec, register_int_counter_vec, HistogramVec, IntCounterVec};

/// Bucket bounds (seconds) shared by every duration histogram: 1 ms to 10 min.
pub const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

macro_rules! counter {
    ($name:literal, $help:literal, $labels:expr) => {
        LazyLock::new(|| {
            register_int_counter_vec!($name, $help, $labels).expect("a metric name registered once")
        })
    };
}

macro_rules! histogram {
    ($name:literal, $help:literal, $labels:expr) => {
        LazyLock::new(|| {
            register_histogram_vec!($name, $help, $labels, DURATION_BUCKETS.to_vec())
                .expect("a metric name registered once")
        })
    };
}

static ENQUEUED: LazyLock<IntCounterVec> = counter!(
    "grove_jobs_enqueued_total",
    "Commands enqueued by this process (a repeated command id is not counted).",
    &["kind", "queue"]
);
static STARTED: LazyLock<IntCounterVec> = counter!(
    "grove_jobs_started_total",
    "Jobs this process claimed and started (each attempt).",
    &["kind", "queue"]
);
static FINISHED: LazyLock<IntCounterVec> = counter!(
    "grove_jobs_finished_total",
    "Job attempts whose outcome this process recorded: succeeded, retried, or the error kind.",
    &["kind", "outcome"]
);
static JOB_SECONDS: LazyLock<HistogramVec> = histogram!(
    "grove_job_duration_seconds",
    "From claim to recorded outcome, per attempt.",
    &["kind", "result"]
);
static EXECS: LazyLock<IntCounterVec> = counter!(
    "grove_execs_finished_total",
    "Execs finished (exec.finished committed), by outcome and exit status.",
    &["outcome", "exit"]
);
static EXEC_SECONDS: LazyLock<HistogramVec> = histogram!(
    "grove_exec_duration_seconds",
    "The command's own run time, as exec.finished records it.",
    &["outcome"]
);
static LOCK_WAIT: LazyLock<HistogramVec> = histogram!(
    "grove_lock_wait_seconds",
    "Time spent waiting for an advisory lock and its lease.",
    &["scope", "outcome"]
);
static EVICTIONS: LazyLock<IntCounterVec> = counter!(
    "grove_eviction_actions_total",
    "Eviction sweep actions, by action and how they ended.",
    &["action", "outcome"]
);
static FREED: LazyLock<IntCounterVec> = counter!(
    "grove_eviction_freed_bytes_total",
    "Bytes freed by eviction actions that were done (the targets' cached sizes).",
    &["action"]
);

/// A command was enqueued for the first time.
pub(crate) fn enqueued(kind: &str, queue: &str) {
    ENQUEUED.with_label_values(&[kind, queue]).inc();
}

/// A claimed job is about to run.
pub(crate) fn started(kind: &str, queue: &str) {
    STARTED.with_label_values(&[kind, queue]).inc();
}

/// A lock wait ended: `acquired`, `busy` (timed out) or `error`.
pub(crate) fn lock_waited(scope: &str, outcome: &str, waited: Duration) {
    LOCK_WAIT
        .with_label_values(&[scope, outcome])
        .observe(waited.as_secs_f64());
}

/// An attempt was put back for a retry.
pub(crate) fn retried(kind: &str, ran_for: Duration) {
    FINISHED.with_label_values(&[kind, "retried"]).inc();
    JOB_SECONDS
        .with_label_values(&[kind, "retried"])
        .observe(ran_for.as_secs_f64());
}

/// An outcome was committed with `events`.
pub(crate) fn finished(
    kind: &str,
    outcome: &Result<CommandResult, CommandError>,
    events: &[Event],
    ran_for: Duration,
) {
    let (label, result) = match outcome {
        Ok(_) => ("succeeded", "succeeded"),
        Err(e) => (e.kind.as_str(), "failed"),
    };
    FINISHED.with_label_values(&[kind, label]).inc();
    JOB_SECONDS
        .with_label_values(&[kind, result])
        .observe(ran_for.as_secs_f64());
    for event in events {
        observe_event(event);
    }
}

/// The exec outcomes `exec.finished` records; anything else counts as `other`.
const EXEC_OUTCOMES: &[&str] = &[
    "completed",
    "timed_out",
    "killed",
    "worker_lost",
    "rejected",
    "internal_error",
];

fn observe_event(event: &Event) {
    match event {
        Event::ExecFinished {
            outcome,
            exit_code,
            duration_ms,
            ..
        } => {
            let outcome = EXEC_OUTCOMES
                .iter()
                .find(|o| **o == outcome.as_str())
                .copied()
                .unwrap_or("other");
            let exit = match exit_code {
                Some(0) => "zero",
                Some(_) => "nonzero",
                None => "none",
            };
            EXECS.with_label_values(&[outcome, exit]).inc();
            EXEC_SECONDS
                .with_label_values(&[outcome])
                .observe(*duration_ms as f64 / 1000.0);
        }
        Event::SweepFinished { report, .. } => {
            for record in &report.actions {
                let action = action_label(record.action.kind);
                let outcome = outcome_label(record.outcome);
                EVICTIONS.with_label_values(&[action, outcome]).inc();
                if outcome == "done" {
                    FREED
                        .with_label_values(&[action])
                        .inc_by(record.action.bytes_freed);
                }
            }
        }
        _ => {}
    }
}

fn action_label(kind: ActionKind) -> &'static str {
    match kind {
        ActionKind::StopRuntime => "stop_runtime",
        ActionKind::DestroyRuntime => "destroy_runtime",
        ActionKind::EvictWorkspace { .. } => "evict_workspace",
        ActionKind::EvictRepoCache => "evict_repo_cache",
    }
}

fn outcome_label(outcome: ActionOutcome) -> &'static str {
    match outcome {
        ActionOutcome::Done => "done",
        ActionOutcome::Skipped => "skipped",
        ActionOutcome::Blocked => "blocked",
        ActionOutcome::Failed => "failed",
    }
}
