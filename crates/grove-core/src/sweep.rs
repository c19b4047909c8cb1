//! What one eviction sweep did: the report returned to its caller and recorded in the
//! `eviction.sweep_finished` event. Pure data; the sweep itself lives in the workers.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::eviction::{Action, Blocked, Marks, Target};

/// How many protected targets a report lists (a node with thousands of pinned
/// workspaces would otherwise write them all into every sweep's event).
pub const MAX_BLOCKED_IN_REPORT: usize = 100;

/// What started a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SweepTrigger {
    /// A tick of the node's schedule (`GROVE_EVICT_SCHEDULE`).
    Cron,
    /// An acquire that took the node's usage above its high water mark.
    OnDemand,
    /// `grove evict` or any other caller.
    #[default]
    Manual,
}

/// How one planned action ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionOutcome {
    /// Performed; its event is in the log.
    Done,
    /// Its guards no longer held when re-checked under the lock (used since the plan,
    /// locked by another job, pinned meanwhile, ...): nothing was changed.
    Skipped,
    /// Preserving the work failed: the workspace is kept (`workspace.eviction_blocked`).
    Blocked,
    /// The effect failed (a runtime provider or filesystem error); nothing was recorded
    /// as done.
    Failed,
}

/// One planned action and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionRecord {
    pub action: Action,
    pub outcome: ActionOutcome,
    /// Why it was skipped, blocked or failed.
    pub detail: Option<String>,
}

/// A record a sweep repaired before planning (an interrupted eviction, a missing directory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconciled {
    pub target: Target,
    pub id: Uuid,
    pub what: String,
}

/// The outcome of one sweep of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepReport {
    pub node: String,
    /// The clock the plans were made with (the command's override, else the worker's).
    pub now: DateTime<Utc>,
    /// The schedule tick this sweep belongs to (cron sweeps only).
    pub tick: Option<DateTime<Utc>>,
    pub trigger: SweepTrigger,
    /// Set when the sweep did nothing because another sweep of this node was running.
    pub skipped: Option<String>,
    pub marks: Marks,
    /// Usage (apparent bytes: cached sizes of live workspaces and repo caches plus the
    /// saved-work patches) when the first plan was made, and after the last action.
    pub used_bytes_before: u64,
    pub used_bytes_after: u64,
    pub under_pressure: bool,
    /// Usage ends at or below low water (or there was no pressure).
    pub budget_met: bool,
    pub shortfall_bytes: u64,
    /// Plans made: 1, plus one for each re-plan after a skipped or failed action.
    pub rounds: u32,
    /// Workspace and repo cache sizes re-measured before planning.
    pub measured: u32,
    pub reconciled: Vec<Reconciled>,
    pub actions: Vec<ActionRecord>,
    /// What the last plan reached but left for a protection (pinned, busy, ...): the
    /// first [`MAX_BLOCKED_IN_REPORT`], in the order reached; `blocked_total` counts all.
    pub blocked: Vec<Blocked>,
    #[serde(default)]
    pub blocked_total: u64,
    pub duration_ms: u64,
}

impl SweepReport {
    /// Bytes freed by the actions that were performed.
    pub fn bytes_freed(&self) -> u64 {
        self.actions
            .iter()
            .filter(|a| a.outcome == ActionOutcome::Done)
            .map(|a| a.action.bytes_freed)
            .sum()
    }
}
