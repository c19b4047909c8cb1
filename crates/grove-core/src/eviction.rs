//! The eviction policy as pure data: an [`Inventory`] of one node in, an ordered [`Plan`] out.
//!
//! The seed's rule is that compute is cheap to recreate and repo clones are expensive, and
//! that agent work is never silently destroyed. [`plan`] turns that into three phases, always
//! in this order:
//!
//! 1. **Runtimes** (never touching a workspace): destroy runtimes whose workspace is gone
//!    (orphans) or whose health check failed, destroy runtimes stopped longer than
//!    [`EvictionPolicy::runtime_destroy_stopped_after_secs`], stop runtimes idle longer than
//!    [`EvictionPolicy::runtime_idle_stop_after_secs`]. A runtime whose workspace has a
//!    command in flight is left alone entirely.
//! 2. **Workspaces**, one queue in this order:
//!    - clean analysis, clean task, clean edit workspaces unused for longer than their
//!      mode's TTL — evicted whether or not the disk is under pressure;
//!    - only under pressure (usage above the high water mark at the start of the plan), and
//!      only while projected usage is still above the low water mark: clean analysis, task
//!      and edit workspaces still within their TTL, then dirty analysis (which should not
//!      exist, analysis being read-only), dirty task and dirty edit workspaces, the dirty ones
//!      with `preserve_dirty: true`.
//!
//!    Within each tier: least recently used first, ties by larger size, then by id.
//!    A workspace is never evicted while pinned, being created (or otherwise busy), with a
//!    command in flight or with a running runtime; under pressure, nor while used within
//!    [`EvictionPolicy::pressure_grace_secs`].
//! 3. **Repo caches**, only under pressure and only while still above low water after the
//!    two phases above: least recently used first (ties: larger size, then id), never one
//!    with a live workspace or one holding saved work of an evicted dirty workspace.
//!
//! Pressure accounting: the plan starts from [`Inventory::used_bytes`] (measured by the
//! caller) and subtracts the cached size of every workspace and repo cache it evicts;
//! runtime actions free 0 bytes. The plan is optimistic about its own earlier actions: a
//! runtime it stops no longer protects its workspace, and a repo cache whose workspaces it
//! evicts cleanly is no longer live. The executor must therefore re-check each action's
//! guards, under the workspace's lock, at the moment it performs it, and skip an action
//! whose guards no longer hold.
//!
//! All ages are whole seconds, `now - last_used_at` (0 when the timestamp is in the
//! future). Thresholds are strict: "older than 30 min" means more than 1800 s; the
//! pressure grace is the exception (used *within* the grace protects: `idle < grace`, so
//! a grace of 0 protects nothing).

use std::cmp::Reverse;
use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::model::{RepoCacheRow, RuntimeRow, WorkspaceMode, WorkspaceRow};
use crate::state::{RuntimeState, WorkspaceState};

const MINUTE: u64 = 60;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

/// The eviction policy of a node. Every field has a documented default; a configuration
/// may give any subset (`#[serde(default)]`), and unknown fields are refused so that a typo
/// does not silently leave a default in place. Call [`EvictionPolicy::validate`] when
/// loading a configuration; [`plan`] clamps nonsensical values rather than failing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvictionPolicy {
    /// A running runtime unused for longer than this is stopped. Default 30 min (1800 s).
    pub runtime_idle_stop_after_secs: u64,
    /// A stopped runtime stopped for longer than this is destroyed. Default 6 h (21600 s).
    pub runtime_destroy_stopped_after_secs: u64,
    /// How long a clean workspace is kept after its last use, per mode.
    pub workspace_ttl: WorkspaceTtls,
    /// Under disk pressure, a workspace or repo cache used less than this long ago is not
    /// evicted (an agent between two tool calls keeps its workspace). TTL evictions are not
    /// affected: every TTL is longer. Default 10 min (600 s); 0 disables the grace.
    pub pressure_grace_secs: u64,
    /// The disk budget of `$GROVE_HOME`. Default: half of the filesystem holding it.
    pub disk_budget: DiskBudget,
    /// Above this fraction of the budget, the node is under pressure. Default 0.85.
    pub high_water: f64,
    /// Under pressure, evict until usage is at or below this fraction of the budget.
    /// Default 0.70.
    pub low_water: f64,
}

impl Default for EvictionPolicy {
    fn default() -> Self {
        Self {
            runtime_idle_stop_after_secs: 30 * MINUTE,
            runtime_destroy_stopped_after_secs: 6 * HOUR,
            workspace_ttl: WorkspaceTtls::default(),
            pressure_grace_secs: 10 * MINUTE,
            disk_budget: DiskBudget::default(),
            high_water: 0.85,
            low_water: 0.70,
        }
    }
}

/// How long a clean workspace of each mode is kept after its last use. Edit workspaces hold
/// a conversation's work and are kept longest; analysis checkouts are recreated cheaply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkspaceTtls {
    /// Default 1 day (86400 s).
    pub analysis_secs: u64,
    /// Default 3 days (259200 s).
    pub task_secs: u64,
    /// Default 14 days (1209600 s).
    pub edit_secs: u64,
}

impl Default for WorkspaceTtls {
    fn default() -> Self {
        Self {
            analysis_secs: DAY,
            task_secs: 3 * DAY,
            edit_secs: 14 * DAY,
        }
    }
}

impl WorkspaceTtls {
    pub fn for_mode(&self, mode: WorkspaceMode) -> u64 {
        match mode {
            WorkspaceMode::Analysis => self.analysis_secs,
            WorkspaceMode::Task => self.task_secs,
            WorkspaceMode::Edit => self.edit_secs,
        }
    }
}

/// The disk budget of `$GROVE_HOME`: `{ bytes = N }` or `{ fraction = F }` of the total size
/// of the filesystem holding it ([`Inventory::filesystem_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum DiskBudget {
    Bytes(u64),
    Fraction(f64),
}

impl Default for DiskBudget {
    fn default() -> Self {
        Self::Fraction(0.5)
    }
}

impl DiskBudget {
    /// The budget in bytes, given the total size of the filesystem (used by fractions only).
    pub fn resolve(&self, filesystem_bytes: u64) -> u64 {
        match *self {
            Self::Bytes(bytes) => bytes,
            Self::Fraction(fraction) => fraction_of(filesystem_bytes, fraction),
        }
    }
}

/// A configuration [`EvictionPolicy::validate`] refuses.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    #[error(
        "water marks must satisfy 0 < low_water < high_water <= 1 (got low {low}, high {high})"
    )]
    WaterMarks { low: f64, high: f64 },
    #[error("a disk budget fraction must be in (0, 1] (got {0})")]
    BudgetFraction(f64),
    #[error("a disk budget of 0 bytes would evict everything")]
    ZeroBudget,
    #[error("{0} must be positive (0 would act on everything at once; there is no 'disabled')")]
    ZeroThreshold(&'static str),
}

impl EvictionPolicy {
    /// How stale a workspace's or cache's recorded last use may be without changing
    /// what a sweep decides soon after it (ADR 40): a quarter of the shortest age any
    /// workspace or cache is judged by (the pressure grace and the workspace TTLs). A use
    /// this recent still protects for at least three quarters of the grace; a grace of 0
    /// gives 0 (every use is recorded).
    pub fn use_staleness_bound_secs(&self) -> u64 {
        let t = &self.workspace_ttl;
        [
            self.pressure_grace_secs,
            t.analysis_secs,
            t.task_secs,
            t.edit_secs,
        ]
        .into_iter()
        .min()
        .unwrap_or(0)
            / 4
    }

    pub fn validate(&self) -> Result<(), PolicyError> {
        let (low, high) = (self.low_water, self.high_water);
        if !(low > 0.0 && low < high && high <= 1.0) {
            return Err(PolicyError::WaterMarks { low, high });
        }
        match self.disk_budget {
            DiskBudget::Bytes(0) => return Err(PolicyError::ZeroBudget),
            DiskBudget::Fraction(f) if !(f > 0.0 && f <= 1.0) => {
                return Err(PolicyError::BudgetFraction(f))
            }
            _ => {}
        }
        for (name, value) in [
            (
                "runtime_idle_stop_after_secs",
                self.runtime_idle_stop_after_secs,
            ),
            (
                "runtime_destroy_stopped_after_secs",
                self.runtime_destroy_stopped_after_secs,
            ),
            (
                "workspace_ttl.analysis_secs",
                self.workspace_ttl.analysis_secs,
            ),
            ("workspace_ttl.task_secs", self.workspace_ttl.task_secs),
            ("workspace_ttl.edit_secs", self.workspace_ttl.edit_secs),
        ] {
            if value == 0 {
                return Err(PolicyError::ZeroThreshold(name));
            }
        }
        Ok(())
    }

    /// The budget and water marks in bytes for a filesystem of this size.
    pub fn marks(&self, filesystem_bytes: u64) -> Marks {
        let budget_bytes = self.disk_budget.resolve(filesystem_bytes);
        let high = clamp_fraction(self.high_water);
        let low = clamp_fraction(self.low_water).min(high);
        Marks {
            budget_bytes,
            high_water_bytes: fraction_of(budget_bytes, high),
            low_water_bytes: fraction_of(budget_bytes, low),
        }
    }
}

/// The budget and its water marks, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marks {
    pub budget_bytes: u64,
    pub high_water_bytes: u64,
    pub low_water_bytes: u64,
}

fn clamp_fraction(f: f64) -> f64 {
    if f.is_nan() {
        1.0
    } else {
        f.clamp(0.0, 1.0)
    }
}

fn fraction_of(bytes: u64, fraction: f64) -> u64 {
    // Rounded, so that 1000 bytes at 0.85 is 850 and not 849 by float error; exact below 2^53.
    (bytes as f64 * clamp_fraction(fraction)).round() as u64
}

// ---------------------------------------------------------------------------------------
// Inventory

/// Everything [`plan`] looks at, for one node. It must be complete for the node: a runtime
/// whose workspace is missing from `workspaces` is treated as an orphan and destroyed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    /// The time the plan is made at; every age is measured from it.
    pub now: DateTime<Utc>,
    /// Bytes used under `$GROVE_HOME`, measured by the caller (not the sum of cached sizes).
    pub used_bytes: u64,
    /// Total size of the filesystem holding `$GROVE_HOME` (for a fractional budget).
    pub filesystem_bytes: u64,
    pub workspaces: Vec<WorkspaceItem>,
    pub runtimes: Vec<RuntimeItem>,
    pub repo_caches: Vec<RepoCacheItem>,
}

/// Where a workspace is in its life, as far as eviction cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceActivity {
    /// Its files exist and no job holds it: a candidate (`ready`, `released`).
    Ready,
    /// A job is evicting it (or, as the sweep decides, otherwise holds it): never a
    /// candidate, and it keeps its repo cache alive.
    Busy,
    /// Already evicted (a record kept for restore): ignored, and not a live workspace of its
    /// repo cache. Whether its saved work still needs the cache is
    /// [`RepoCacheItem::needed_by_saved_work`].
    Evicted,
}

impl WorkspaceActivity {
    /// What a workspace's state means to eviction.
    pub fn of(state: WorkspaceState) -> Self {
        match state {
            WorkspaceState::Ready | WorkspaceState::Released => Self::Ready,
            WorkspaceState::Evicting => Self::Busy,
            WorkspaceState::Evicted => Self::Evicted,
        }
    }
}

/// One workspace of the inventory. Whether it has a running runtime is derived from
/// [`Inventory::runtimes`], not stated here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceItem {
    pub id: Uuid,
    pub repo_cache_id: Uuid,
    pub mode: WorkspaceMode,
    pub state: WorkspaceActivity,
    pub dirty: bool,
    pub pinned_until: Option<DateTime<Utc>>,
    pub last_used_at: DateTime<Utc>,
    /// The cached size (the projection's `size_bytes`); what evicting it frees.
    pub size_bytes: u64,
    /// An exec of this workspace has started and not finished.
    pub command_in_flight: bool,
}

impl WorkspaceItem {
    pub fn from_row(row: &WorkspaceRow, command_in_flight: bool) -> Self {
        Self {
            id: row.id,
            repo_cache_id: row.repo_cache_id,
            mode: row.mode,
            state: WorkspaceActivity::of(row.state),
            dirty: row.dirty,
            pinned_until: row.pinned_until,
            last_used_at: row.last_used_at,
            size_bytes: u64::try_from(row.size_bytes).unwrap_or(0),
            command_in_flight,
        }
    }
}

/// Whether a runtime runs, and since when it is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RuntimeActivity {
    Running,
    Stopped { since: DateTime<Utc> },
}

/// One runtime of the inventory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeItem {
    pub id: Uuid,
    pub workspace_id: Uuid,
    pub state: RuntimeActivity,
    pub last_used_at: DateTime<Utc>,
    /// False only when a health check failed (decided by the caller, e.g. after repeated
    /// failures); a runtime that was not checked is healthy.
    pub healthy: bool,
}

impl RuntimeItem {
    /// `running` is running; `stopped` is stopped since the row's `updated_at` (the
    /// projection sets it at `runtime.stopped`).
    pub fn from_row(row: &RuntimeRow, healthy: bool) -> Self {
        let state = match row.state {
            RuntimeState::Stopped => RuntimeActivity::Stopped {
                since: row.updated_at,
            },
            RuntimeState::Running => RuntimeActivity::Running,
        };
        Self {
            id: row.id,
            workspace_id: row.workspace_id,
            state,
            last_used_at: row.last_used_at,
            healthy,
        }
    }
}

/// One repo cache of the inventory. Whether it has live workspaces is derived from
/// [`Inventory::workspaces`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepoCacheItem {
    pub id: Uuid,
    pub last_used_at: DateTime<Utc>,
    pub size_bytes: u64,
    /// The cache holds the saved-work ref of an evicted dirty workspace not yet restored
    /// or discarded.
    pub needed_by_saved_work: bool,
}

impl RepoCacheItem {
    pub fn from_row(row: &RepoCacheRow, needed_by_saved_work: bool) -> Self {
        Self {
            id: row.id,
            last_used_at: row.last_used_at,
            size_bytes: u64::try_from(row.size_bytes).unwrap_or(0),
            needed_by_saved_work,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Plan

/// A workspace's eviction tier: its mode and whether it is dirty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    CleanAnalysis,
    CleanTask,
    CleanEdit,
    DirtyAnalysis,
    DirtyTask,
    DirtyEdit,
}

impl Tier {
    pub fn of(mode: WorkspaceMode, dirty: bool) -> Self {
        match (mode, dirty) {
            (WorkspaceMode::Analysis, false) => Self::CleanAnalysis,
            (WorkspaceMode::Task, false) => Self::CleanTask,
            (WorkspaceMode::Edit, false) => Self::CleanEdit,
            (WorkspaceMode::Analysis, true) => Self::DirtyAnalysis,
            (WorkspaceMode::Task, true) => Self::DirtyTask,
            (WorkspaceMode::Edit, true) => Self::DirtyEdit,
        }
    }
    pub fn is_dirty(self) -> bool {
        matches!(
            self,
            Self::DirtyAnalysis | Self::DirtyTask | Self::DirtyEdit
        )
    }
    fn rank(self) -> u8 {
        self as u8
    }
}

/// What an action does to its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ActionKind {
    StopRuntime,
    DestroyRuntime,
    /// Delete the workspace's files; when `preserve_dirty`, first save its uncommitted
    /// changes (and keep the workspace if saving fails).
    EvictWorkspace {
        preserve_dirty: bool,
    },
    EvictRepoCache,
}

/// Disk usage at the moment a pressure eviction is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pressure {
    /// Projected usage before this action (the plan's start minus earlier evictions).
    pub used_bytes: u64,
    pub budget_bytes: u64,
    pub high_water_bytes: u64,
    pub low_water_bytes: u64,
}

/// Why an action is in the plan, with the values that triggered it (for its event).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Reason {
    /// A running runtime unused for longer than the threshold.
    IdleRuntime { idle_secs: u64, threshold_secs: u64 },
    /// A stopped runtime stopped for longer than the threshold.
    StoppedRuntime {
        stopped_secs: u64,
        threshold_secs: u64,
    },
    /// A runtime whose health check failed.
    UnhealthyRuntime,
    /// A runtime whose workspace is not in the inventory, or already evicted.
    OrphanRuntime,
    /// A (stopped) runtime destroyed because its workspace is evicted next.
    WorkspaceEvicted { workspace_id: Uuid },
    /// A clean workspace unused for longer than its mode's TTL.
    TtlExpired {
        tier: Tier,
        idle_secs: u64,
        ttl_secs: u64,
    },
    /// A workspace evicted because usage was above high water and is still above low water.
    DiskPressure {
        tier: Tier,
        idle_secs: u64,
        ttl_secs: u64,
        pressure: Pressure,
    },
    /// A repo cache evicted because usage was still above low water after the workspaces.
    RepoCachePressure { idle_secs: u64, pressure: Pressure },
}

/// One step of the plan, to be performed in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    pub kind: ActionKind,
    /// The runtime, workspace or repo cache, as `kind` says.
    pub id: Uuid,
    pub reason: Reason,
    /// The cached size of the target (0 for runtimes).
    pub bytes_freed: u64,
}

/// What protects a workspace or repo cache the plan would otherwise have evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Protection {
    /// Being created, restored or evicted by another job.
    Busy,
    CommandInFlight,
    RunningRuntime {
        runtime_id: Uuid,
    },
    Pinned {
        until: DateTime<Utc>,
    },
    /// Under pressure, used within the grace.
    RecentlyUsed {
        idle_secs: u64,
        grace_secs: u64,
    },
    /// A repo cache with this many live workspaces.
    LiveWorkspaces {
        count: u64,
    },
    /// A repo cache holding saved work of an evicted dirty workspace (including one this
    /// plan evicts).
    SavedWork,
}

/// The kind of a protected target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    Workspace,
    RepoCache,
}

/// A target the plan reached and would have evicted, but did not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocked {
    pub target: Target,
    pub id: Uuid,
    pub protection: Protection,
}

/// The result of [`plan`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub actions: Vec<Action>,
    /// Workspaces and repo caches the plan reached (TTL expired, or under pressure while
    /// still above low water) but left for a protection, in the order reached.
    pub blocked: Vec<Blocked>,
    pub marks: Marks,
    /// Usage at the start ([`Inventory::used_bytes`]).
    pub used_bytes: u64,
    /// Usage once every action has been performed.
    pub projected_used_bytes: u64,
    /// Usage was above high water at the start, so pressure evictions were planned.
    pub under_pressure: bool,
    /// Not under pressure, or the plan brings usage to low water or below.
    pub budget_met: bool,
    /// How far above low water the plan leaves usage (0 when `budget_met`).
    pub shortfall_bytes: u64,
}

impl Plan {
    pub fn bytes_freed(&self) -> u64 {
        self.actions.iter().map(|a| a.bytes_freed).sum()
    }
}

/// One workspace in the order eviction would take it (see [`workspace_queue`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueEntry {
    pub id: Uuid,
    pub tier: Tier,
    /// Clean and older than its TTL: goes at the next sweep, pressure or not.
    pub ttl_expired: bool,
    pub idle_secs: u64,
    pub size_bytes: u64,
    /// Why it would be skipped if reached now.
    pub protection: Option<Protection>,
}

fn age_secs(now: DateTime<Utc>, then: DateTime<Utc>) -> u64 {
    u64::try_from((now - then).num_seconds()).unwrap_or(0)
}

/// The outcome of the runtime phase: its actions and which runtimes remain per workspace.
struct RuntimePhase {
    actions: Vec<Action>,
    /// Workspace id → runtimes still running after the phase, by id.
    running: HashMap<Uuid, Vec<Uuid>>,
    /// Workspace id → runtimes not destroyed by the phase (running or stopped), by id.
    remaining: HashMap<Uuid, Vec<Uuid>>,
}

fn runtime_phase(
    policy: &EvictionPolicy,
    inv: &Inventory,
    live: &HashMap<Uuid, &WorkspaceItem>,
) -> RuntimePhase {
    // (group, reference time, id, action): destroys before stops, oldest first, then id.
    let mut planned: Vec<(u8, DateTime<Utc>, Uuid, Action)> = Vec::new();
    let mut running: HashMap<Uuid, Vec<Uuid>> = HashMap::new();
    let mut remaining: HashMap<Uuid, Vec<Uuid>> = HashMap::new();
    for rt in &inv.runtimes {
        let destroy = |reason| Action {
            kind: ActionKind::DestroyRuntime,
            id: rt.id,
            reason,
            bytes_freed: 0,
        };
        let decided = match live.get(&rt.workspace_id) {
            None => Some((0, rt.last_used_at, destroy(Reason::OrphanRuntime))),
            // Not idle, and nothing is done under a running command.
            Some(ws) if ws.command_in_flight => None,
            Some(_) if !rt.healthy => Some((1, rt.last_used_at, destroy(Reason::UnhealthyRuntime))),
            Some(_) => match rt.state {
                RuntimeActivity::Stopped { since } => {
                    let stopped_secs = age_secs(inv.now, since);
                    let threshold_secs = policy.runtime_destroy_stopped_after_secs;
                    (stopped_secs > threshold_secs).then(|| {
                        let reason = Reason::StoppedRuntime {
                            stopped_secs,
                            threshold_secs,
                        };
                        (2, since, destroy(reason))
                    })
                }
                RuntimeActivity::Running => {
                    let idle_secs = age_secs(inv.now, rt.last_used_at);
                    let threshold_secs = policy.runtime_idle_stop_after_secs;
                    (idle_secs > threshold_secs).then(|| {
                        let action = Action {
                            kind: ActionKind::StopRuntime,
                            id: rt.id,
                            reason: Reason::IdleRuntime {
                                idle_secs,
                                threshold_secs,
                            },
                            bytes_freed: 0,
                        };
                        (3, rt.last_used_at, action)
                    })
                }
            },
        };
        let destroyed = matches!(
            decided,
            Some((
                _,
                _,
                Action {
                    kind: ActionKind::DestroyRuntime,
                    ..
                }
            ))
        );
        let stopped = matches!(rt.state, RuntimeActivity::Stopped { .. }) || decided.is_some();
        if !destroyed {
            remaining.entry(rt.workspace_id).or_default().push(rt.id);
            if !stopped {
                running.entry(rt.workspace_id).or_default().push(rt.id);
            }
        }
        if let Some((group, at, action)) = decided {
            planned.push((group, at, rt.id, action));
        }
    }
    planned.sort_by_key(|p| (p.0, p.1, p.2));
    for ids in running.values_mut().chain(remaining.values_mut()) {
        ids.sort();
    }
    RuntimePhase {
        actions: planned.into_iter().map(|p| p.3).collect(),
        running,
        remaining,
    }
}

/// A workspace placed in the eviction queue.
struct Candidate<'a> {
    ws: &'a WorkspaceItem,
    tier: Tier,
    idle_secs: u64,
    ttl_secs: u64,
    ttl_expired: bool,
    protection: Option<Protection>,
}

impl Candidate<'_> {
    /// TTL-expired clean tiers first (0..=2), then, for pressure, the clean tiers within
    /// TTL (3..=5) and the dirty ones (6..=8).
    fn rank(&self) -> u8 {
        if self.ttl_expired {
            self.tier.rank()
        } else {
            3 + self.tier.rank()
        }
    }
}

fn workspace_candidates<'a>(
    policy: &EvictionPolicy,
    inv: &'a Inventory,
    running: &HashMap<Uuid, Vec<Uuid>>,
) -> Vec<Candidate<'a>> {
    let mut out: Vec<Candidate<'a>> = inv
        .workspaces
        .iter()
        .filter(|ws| ws.state != WorkspaceActivity::Evicted)
        .map(|ws| {
            let tier = Tier::of(ws.mode, ws.dirty);
            let idle_secs = age_secs(inv.now, ws.last_used_at);
            let ttl_secs = policy.workspace_ttl.for_mode(ws.mode);
            let ttl_expired = !ws.dirty && idle_secs > ttl_secs;
            let protection = if ws.state == WorkspaceActivity::Busy {
                Some(Protection::Busy)
            } else if ws.command_in_flight {
                Some(Protection::CommandInFlight)
            } else if let Some(&runtime_id) = running.get(&ws.id).and_then(|ids| ids.first()) {
                Some(Protection::RunningRuntime { runtime_id })
            } else if let Some(until) = ws.pinned_until.filter(|until| *until > inv.now) {
                Some(Protection::Pinned { until })
            } else if !ttl_expired && idle_secs < policy.pressure_grace_secs {
                Some(Protection::RecentlyUsed {
                    idle_secs,
                    grace_secs: policy.pressure_grace_secs,
                })
            } else {
                None
            };
            Candidate {
                ws,
                tier,
                idle_secs,
                ttl_secs,
                ttl_expired,
                protection,
            }
        })
        .collect();
    out.sort_by_key(|c| {
        (
            c.rank(),
            c.ws.last_used_at,
            Reverse(c.ws.size_bytes),
            c.ws.id,
        )
    });
    out
}

fn live_workspaces(inv: &Inventory) -> HashMap<Uuid, &WorkspaceItem> {
    inv.workspaces
        .iter()
        .filter(|ws| ws.state != WorkspaceActivity::Evicted)
        .map(|ws| (ws.id, ws))
        .collect()
}

/// The order in which eviction would take this node's live workspaces under unlimited
/// pressure, with what would protect each right now (after the runtime actions [`plan`]
/// would take first). For `grove workspace list` ("what goes next"); agrees with [`plan`].
pub fn workspace_queue(policy: &EvictionPolicy, inventory: &Inventory) -> Vec<QueueEntry> {
    let live = live_workspaces(inventory);
    let runtimes = runtime_phase(policy, inventory, &live);
    workspace_candidates(policy, inventory, &runtimes.running)
        .into_iter()
        .map(|c| QueueEntry {
            id: c.ws.id,
            tier: c.tier,
            ttl_expired: c.ttl_expired,
            idle_secs: c.idle_secs,
            size_bytes: c.ws.size_bytes,
            protection: c.protection,
        })
        .collect()
}

/// Plans one sweep of one node. Pure: the same policy and inventory give the same plan.
pub fn plan(policy: &EvictionPolicy, inventory: &Inventory) -> Plan {
    let inv = inventory;
    let marks = policy.marks(inv.filesystem_bytes);
    let under_pressure = inv.used_bytes > marks.high_water_bytes;
    let mut projected = inv.used_bytes;
    let pressure_at = |used_bytes| Pressure {
        used_bytes,
        budget_bytes: marks.budget_bytes,
        high_water_bytes: marks.high_water_bytes,
        low_water_bytes: marks.low_water_bytes,
    };

    // 1. Runtimes.
    let live = live_workspaces(inv);
    let runtimes = runtime_phase(policy, inv, &live);
    let mut actions = runtimes.actions;
    let mut blocked = Vec::new();

    // 2. Workspaces.
    let mut evicted: HashSet<Uuid> = HashSet::new();
    let mut saved_work_in: HashSet<Uuid> = HashSet::new();
    for c in workspace_candidates(policy, inv, &runtimes.running) {
        let reached = c.ttl_expired || (under_pressure && projected > marks.low_water_bytes);
        if !reached {
            // Candidates are ordered TTL-expired first and usage only falls: nothing after
            // this one is reached either.
            break;
        }
        if let Some(protection) = c.protection {
            blocked.push(Blocked {
                target: Target::Workspace,
                id: c.ws.id,
                protection,
            });
            continue;
        }
        for &runtime_id in runtimes.remaining.get(&c.ws.id).into_iter().flatten() {
            actions.push(Action {
                kind: ActionKind::DestroyRuntime,
                id: runtime_id,
                reason: Reason::WorkspaceEvicted {
                    workspace_id: c.ws.id,
                },
                bytes_freed: 0,
            });
        }
        let reason = if c.ttl_expired {
            Reason::TtlExpired {
                tier: c.tier,
                idle_secs: c.idle_secs,
                ttl_secs: c.ttl_secs,
            }
        } else {
            Reason::DiskPressure {
                tier: c.tier,
                idle_secs: c.idle_secs,
                ttl_secs: c.ttl_secs,
                pressure: pressure_at(projected),
            }
        };
        actions.push(Action {
            kind: ActionKind::EvictWorkspace {
                preserve_dirty: c.ws.dirty,
            },
            id: c.ws.id,
            reason,
            bytes_freed: c.ws.size_bytes,
        });
        projected = projected.saturating_sub(c.ws.size_bytes);
        evicted.insert(c.ws.id);
        if c.ws.dirty {
            saved_work_in.insert(c.ws.repo_cache_id);
        }
    }

    // 3. Repo caches.
    if under_pressure {
        let mut live_count: HashMap<Uuid, u64> = HashMap::new();
        for ws in live.values().filter(|ws| !evicted.contains(&ws.id)) {
            *live_count.entry(ws.repo_cache_id).or_default() += 1;
        }
        let mut caches: Vec<&RepoCacheItem> = inv.repo_caches.iter().collect();
        caches.sort_by_key(|rc| (rc.last_used_at, Reverse(rc.size_bytes), rc.id));
        for rc in caches {
            if projected <= marks.low_water_bytes {
                break;
            }
            let idle_secs = age_secs(inv.now, rc.last_used_at);
            let protection = match live_count.get(&rc.id) {
                Some(&count) if count > 0 => Some(Protection::LiveWorkspaces { count }),
                _ if rc.needed_by_saved_work || saved_work_in.contains(&rc.id) => {
                    Some(Protection::SavedWork)
                }
                _ if idle_secs < policy.pressure_grace_secs => Some(Protection::RecentlyUsed {
                    idle_secs,
                    grace_secs: policy.pressure_grace_secs,
                }),
                _ => None,
            };
            if let Some(protection) = protection {
                blocked.push(Blocked {
                    target: Target::RepoCache,
                    id: rc.id,
                    protection,
                });
                continue;
            }
            actions.push(Action {
                kind: ActionKind::EvictRepoCache,
                id: rc.id,
                reason: Reason::RepoCachePressure {
                    idle_secs,
                    pressure: pressure_at(projected),
                },
                bytes_freed: rc.size_bytes,
            });
            projected = projected.saturating_sub(rc.size_bytes);
        }
    }

    let shortfall_bytes = if under_pressure {
        projected.saturating_sub(marks.low_water_bytes)
    } else {
        0
    };
    Plan {
        actions,
        blocked,
        marks,
        used_bytes: inv.used_bytes,
        projected_used_bytes: projected,
        under_pressure,
        budget_met: shortfall_bytes == 0,
        shortfall_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    const M: u64 = MINUTE;
    const H: u64 = HOUR;
    const D: u64 = DAY;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap()
    }
    fn ago(secs: u64) -> DateTime<Utc> {
        now() - chrono::Duration::seconds(secs as i64)
    }
    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    /// (id, "clean task" | "dirty edit" | ..., idle secs, size, repo cache id, flags), flags
    /// among `pinned` (for another hour), `was-pinned` (until an hour ago), `in-flight`,
    /// `busy`, `evicted`.
    type Ws = (u128, &'static str, u64, u64, u128, &'static str);
    /// (id, workspace id, "running" | "stopped" [+ " unhealthy"], secs idle or stopped).
    type Rt = (u128, u128, &'static str, u64);
    /// (id, idle secs, size, needed by saved work).
    type Rc = (u128, u64, u64, bool);

    fn inventory(used: u64, workspaces: &[Ws], runtimes: &[Rt], caches: &[Rc]) -> Inventory {
        let workspaces = workspaces
            .iter()
            .map(|&(n, tier, idle, size, cache, flags)| {
                let (dirt, mode) = tier.split_once(' ').unwrap();
                let flags: Vec<&str> = flags.split_whitespace().collect();
                let pinned_until = if flags.contains(&"pinned") {
                    Some(now() + chrono::Duration::hours(1))
                } else if flags.contains(&"was-pinned") {
                    Some(ago(H))
                } else {
                    None
                };
                let state = if flags.contains(&"busy") {
                    WorkspaceActivity::Busy
                } else if flags.contains(&"evicted") {
                    WorkspaceActivity::Evicted
                } else {
                    WorkspaceActivity::Ready
                };
                WorkspaceItem {
                    id: id(n),
                    repo_cache_id: id(cache),
                    mode: WorkspaceMode::parse(mode).unwrap(),
                    state,
                    dirty: dirt == "dirty",
                    pinned_until,
                    last_used_at: ago(idle),
                    size_bytes: size,
                    command_in_flight: flags.contains(&"in-flight"),
                }
            })
            .collect();
        let runtimes = runtimes
            .iter()
            .map(|&(n, ws, state, secs)| RuntimeItem {
                id: id(n),
                workspace_id: id(ws),
                state: if state.starts_with("stopped") {
                    RuntimeActivity::Stopped { since: ago(secs) }
                } else {
                    RuntimeActivity::Running
                },
                last_used_at: ago(secs),
                healthy: !state.ends_with("unhealthy"),
            })
            .collect();
        let repo_caches = caches
            .iter()
            .map(|&(n, idle, size, needed)| RepoCacheItem {
                id: id(n),
                last_used_at: ago(idle),
                size_bytes: size,
                needed_by_saved_work: needed,
            })
            .collect();
        Inventory {
            now: now(),
            used_bytes: used,
            filesystem_bytes: 0,
            workspaces,
            runtimes,
            repo_caches,
        }
    }

    /// A budget of 1000 bytes: high water 850, low water 700.
    fn policy() -> EvictionPolicy {
        EvictionPolicy {
            disk_budget: DiskBudget::Bytes(1000),
            ..EvictionPolicy::default()
        }
    }

    fn short(action: &Action) -> (&'static str, u128) {
        let kind = match action.kind {
            ActionKind::StopRuntime => "stop",
            ActionKind::DestroyRuntime => "destroy",
            ActionKind::EvictWorkspace {
                preserve_dirty: false,
            } => "evict",
            ActionKind::EvictWorkspace {
                preserve_dirty: true,
            } => "preserve",
            ActionKind::EvictRepoCache => "evict cache",
        };
        (kind, action.id.as_u128())
    }

    /// Plans, asserts the exact ordered (kind, id) list and the invariants every plan
    /// keeps, and returns the plan for further checks.
    fn check(policy: &EvictionPolicy, inv: &Inventory, expected: &[(&str, u128)]) -> Plan {
        let plan = plan(policy, inv);
        let got: Vec<(&str, u128)> = plan.actions.iter().map(short).collect();
        assert_eq!(got, expected, "plan: {plan:#?}");
        // Runtime actions free nothing; every eviction frees its cached size.
        for a in &plan.actions {
            if matches!(a.kind, ActionKind::StopRuntime | ActionKind::DestroyRuntime) {
                assert_eq!(a.bytes_freed, 0);
            }
        }
        assert_eq!(
            plan.projected_used_bytes,
            inv.used_bytes.saturating_sub(plan.bytes_freed())
        );
        assert_eq!(plan.budget_met, plan.shortfall_bytes == 0);
        // Nothing protected is ever acted on.
        for b in &plan.blocked {
            assert!(plan.actions.iter().all(|a| a.id != b.id), "{b:?} acted on");
        }
        // The same inventory in another order gives the same plan.
        let mut reversed = inv.clone();
        reversed.workspaces.reverse();
        reversed.runtimes.reverse();
        reversed.repo_caches.reverse();
        assert_eq!(super::plan(policy, &reversed), plan);
        plan
    }

    fn blocked(plan: &Plan) -> Vec<(u128, Protection)> {
        plan.blocked
            .iter()
            .map(|b| (b.id.as_u128(), b.protection))
            .collect()
    }

    #[test]
    fn clean_workspaces_older_than_their_ttl_are_evicted_without_pressure() {
        let inv = inventory(
            100,
            &[
                (1, "clean analysis", 2 * D, 10, 90, ""),
                (2, "clean analysis", 12 * H, 10, 90, ""),
                (3, "clean task", 4 * D, 10, 90, ""),
                (4, "clean task", 2 * D, 10, 90, ""),
                (5, "clean edit", 15 * D, 10, 90, ""),
                (6, "clean edit", 10 * D, 10, 90, ""),
            ],
            &[],
            &[],
        );
        let plan = check(&policy(), &inv, &[("evict", 1), ("evict", 3), ("evict", 5)]);
        assert!(!plan.under_pressure);
        assert!(plan.budget_met);
        assert_eq!(plan.projected_used_bytes, 70);
    }

    #[test]
    fn a_workspace_exactly_at_its_ttl_stays_and_one_second_more_evicts_it() {
        let inv = inventory(
            0,
            &[
                (1, "clean analysis", D, 10, 90, ""),
                (2, "clean analysis", D + 1, 10, 90, ""),
                (3, "clean edit", 14 * D, 10, 90, ""),
                (4, "clean edit", 14 * D + 1, 10, 90, ""),
            ],
            &[],
            &[],
        );
        check(&policy(), &inv, &[("evict", 2), ("evict", 4)]);
    }

    #[test]
    fn tiers_go_in_the_seed_order_whatever_the_order_of_the_inventory() {
        let inv = inventory(
            2000,
            &[
                (1, "dirty edit", H, 100, 90, ""),
                (2, "dirty task", H, 100, 90, ""),
                (3, "clean edit", H, 100, 90, ""),
                (4, "clean task", H, 100, 90, ""),
                (5, "clean analysis", H, 100, 90, ""),
                (6, "clean edit", 20 * D, 100, 90, ""),
                (7, "clean task", 5 * D, 100, 90, ""),
                (8, "clean analysis", 3 * D, 100, 90, ""),
                (9, "dirty analysis", H, 100, 90, ""),
            ],
            &[],
            &[],
        );
        check(
            &policy(),
            &inv,
            &[
                ("evict", 8),
                ("evict", 7),
                ("evict", 6),
                ("evict", 5),
                ("evict", 4),
                ("evict", 3),
                ("preserve", 9),
                ("preserve", 2),
                ("preserve", 1),
            ],
        );
    }

    #[test]
    fn ttl_expired_workspaces_of_a_later_tier_go_before_fresh_ones_of_an_earlier_tier() {
        // Under pressure, a fresh clean analysis workspace only goes after every expired one.
        let inv = inventory(
            1000,
            &[
                (1, "clean analysis", H, 200, 90, ""),
                (2, "clean edit", 15 * D, 100, 90, ""),
            ],
            &[],
            &[],
        );
        check(&policy(), &inv, &[("evict", 2), ("evict", 1)]);
    }

    #[test]
    fn the_least_recently_used_goes_first_within_a_tier() {
        let inv = inventory(
            0,
            &[
                (1, "clean task", 4 * D, 10, 90, ""),
                (2, "clean task", 6 * D, 10, 90, ""),
                (3, "clean task", 5 * D, 10, 90, ""),
            ],
            &[],
            &[],
        );
        check(&policy(), &inv, &[("evict", 2), ("evict", 3), ("evict", 1)]);

        let inv = inventory(
            1000,
            &[
                (1, "dirty edit", 3 * H, 100, 90, ""),
                (2, "dirty edit", 5 * H, 100, 90, ""),
                (3, "dirty edit", 4 * H, 100, 90, ""),
            ],
            &[],
            &[],
        );
        check(
            &policy(),
            &inv,
            &[("preserve", 2), ("preserve", 3), ("preserve", 1)],
        );
    }

    #[test]
    fn equal_ages_are_broken_by_larger_size_first_then_by_id() {
        let inv = inventory(
            0,
            &[
                (3, "clean analysis", 2 * D, 10, 90, ""),
                (1, "clean analysis", 2 * D, 50, 90, ""),
                (2, "clean analysis", 2 * D, 10, 90, ""),
                (4, "clean analysis", 2 * D, 50, 90, ""),
            ],
            &[],
            &[],
        );
        check(
            &policy(),
            &inv,
            &[("evict", 1), ("evict", 4), ("evict", 2), ("evict", 3)],
        );
    }

    #[test]
    fn a_pinned_workspace_is_never_evicted_even_under_pressure_but_an_expired_pin_protects_nothing()
    {
        let inv = inventory(
            5000,
            &[
                (1, "clean analysis", 3 * D, 100, 90, "pinned"),
                (2, "dirty edit", 3 * D, 100, 90, "pinned"),
                (3, "clean task", 5 * D, 100, 90, "was-pinned"),
            ],
            &[],
            &[],
        );
        let plan = check(&policy(), &inv, &[("evict", 3)]);
        let until = now() + chrono::Duration::hours(1);
        assert_eq!(
            blocked(&plan),
            [
                (1, Protection::Pinned { until }),
                (2, Protection::Pinned { until })
            ]
        );
        assert!(!plan.budget_met);
    }

    #[test]
    fn a_workspace_with_a_running_runtime_is_never_evicted() {
        let inv = inventory(
            5000,
            &[
                (1, "clean analysis", 3 * D, 100, 90, ""),
                (2, "dirty edit", H, 100, 90, ""),
            ],
            &[(10, 1, "running", 5 * M), (11, 2, "running", 20 * M)],
            &[],
        );
        let plan = check(&policy(), &inv, &[]);
        assert_eq!(
            blocked(&plan),
            [
                (1, Protection::RunningRuntime { runtime_id: id(10) }),
                (2, Protection::RunningRuntime { runtime_id: id(11) })
            ]
        );
    }

    #[test]
    fn a_workspace_with_a_command_in_flight_is_never_evicted_nor_its_runtime_stopped() {
        let inv = inventory(
            5000,
            &[
                (1, "clean analysis", 3 * D, 100, 90, "in-flight"),
                (2, "clean task", 5 * D, 100, 90, "in-flight"),
            ],
            // A long command leaves its runtime "idle" and may fail health checks meanwhile.
            &[(10, 1, "running", 2 * H), (11, 2, "running unhealthy", H)],
            &[],
        );
        let plan = check(&policy(), &inv, &[]);
        assert_eq!(
            blocked(&plan),
            [
                (1, Protection::CommandInFlight),
                (2, Protection::CommandInFlight)
            ]
        );
    }

    #[test]
    fn a_workspace_being_created_is_never_evicted_and_keeps_its_repo_cache() {
        let inv = inventory(
            5000,
            &[(1, "clean analysis", 3 * D, 100, 90, "busy")],
            &[],
            &[(90, 10 * D, 500, false)],
        );
        let plan = check(&policy(), &inv, &[]);
        assert_eq!(
            plan.blocked,
            [
                Blocked {
                    target: Target::Workspace,
                    id: id(1),
                    protection: Protection::Busy
                },
                Blocked {
                    target: Target::RepoCache,
                    id: id(90),
                    protection: Protection::LiveWorkspaces { count: 1 }
                }
            ]
        );
    }

    #[test]
    fn dirty_workspaces_are_kept_without_pressure_however_old() {
        let inv = inventory(
            800,
            &[
                (1, "dirty task", 100 * D, 100, 90, ""),
                (2, "dirty edit", 100 * D, 100, 90, ""),
                (3, "dirty analysis", 100 * D, 100, 90, ""),
            ],
            &[],
            &[],
        );
        let plan = check(&policy(), &inv, &[]);
        assert!(plan.blocked.is_empty());
    }

    #[test]
    fn usage_between_the_water_marks_starts_no_pressure_eviction() {
        // 850 is at high water, not above it: only TTL evictions, even though above low water.
        let inv = inventory(
            850,
            &[
                (1, "clean analysis", 2 * D, 10, 90, ""),
                (2, "clean analysis", H, 100, 90, ""),
                (3, "dirty task", 10 * D, 100, 90, ""),
            ],
            &[],
            &[(91, 100 * D, 500, false)],
        );
        let plan = check(&policy(), &inv, &[("evict", 1)]);
        assert!(!plan.under_pressure);
        assert!(plan.budget_met);
        assert_eq!(plan.shortfall_bytes, 0);
    }

    #[test]
    fn under_pressure_dirty_task_goes_before_dirty_edit_and_both_are_preserved() {
        let inv = inventory(
            1000,
            &[
                (1, "dirty edit", 2 * D, 200, 90, ""),
                (2, "dirty task", H, 100, 90, ""),
            ],
            &[],
            &[],
        );
        let plan = check(&policy(), &inv, &[("preserve", 2), ("preserve", 1)]);
        assert!(plan.budget_met);
        assert_eq!(plan.projected_used_bytes, 700);
    }

    #[test]
    fn under_pressure_clean_workspaces_within_their_ttl_go_before_any_dirty_one() {
        let inv = inventory(
            900,
            &[
                (1, "dirty task", 30 * D, 500, 90, ""),
                (2, "clean edit", H, 100, 90, ""),
                (3, "clean analysis", 2 * H, 100, 90, ""),
            ],
            &[],
            &[],
        );
        check(&policy(), &inv, &[("evict", 3), ("evict", 2)]);
    }

    #[test]
    fn eviction_stops_as_soon_as_usage_is_at_low_water() {
        let many: Vec<Ws> = (1..=5)
            .map(|n| (n, "clean analysis", (10 - n as u64) * H, 100, 90, ""))
            .collect();
        let plan = check(
            &policy(),
            &inventory(900, &many, &[], &[]),
            &[("evict", 1), ("evict", 2)],
        );
        assert_eq!(plan.projected_used_bytes, 700);
        assert!(plan.budget_met);
    }

    #[test]
    fn a_big_least_recently_used_workspace_alone_can_bring_usage_to_low_water() {
        let inv = inventory(
            900,
            &[
                (1, "clean analysis", 5 * H, 300, 90, ""),
                (2, "clean analysis", 4 * H, 10, 90, ""),
                (3, "clean analysis", 3 * H, 10, 90, ""),
                (4, "dirty task", 10 * D, 10, 90, ""),
            ],
            &[],
            &[],
        );
        let plan = check(&policy(), &inv, &[("evict", 1)]);
        assert_eq!(plan.projected_used_bytes, 600);
    }

    #[test]
    fn ttl_evictions_count_towards_low_water_before_any_pressure_eviction() {
        let inv = inventory(
            900,
            &[
                (1, "clean edit", 20 * D, 250, 90, ""),
                (2, "clean analysis", H, 100, 90, ""),
            ],
            &[],
            &[],
        );
        check(&policy(), &inv, &[("evict", 1)]);
    }

    #[test]
    fn a_budget_that_cannot_be_met_evicts_everything_evictable_and_reports_the_shortfall() {
        let inv = inventory(
            2000,
            &[
                (1, "clean task", H, 300, 90, ""),
                (2, "dirty edit", H, 200, 91, ""),
                (3, "clean analysis", 3 * D, 400, 90, "pinned"),
            ],
            &[],
            &[(90, 10 * D, 100, false), (91, 20 * D, 100, false)],
        );
        let plan = check(&policy(), &inv, &[("evict", 1), ("preserve", 2)]);
        assert!(plan.under_pressure);
        assert!(!plan.budget_met);
        assert_eq!(plan.projected_used_bytes, 1500);
        assert_eq!(plan.shortfall_bytes, 800);
        let until = now() + chrono::Duration::hours(1);
        assert_eq!(
            blocked(&plan),
            [
                (3, Protection::Pinned { until }),
                (91, Protection::SavedWork),
                (90, Protection::LiveWorkspaces { count: 1 }),
            ]
        );
    }

    #[test]
    fn with_nothing_evictable_a_plan_under_pressure_is_empty_and_short() {
        let plan = check(&policy(), &inventory(1200, &[], &[], &[]), &[]);
        assert_eq!(plan.shortfall_bytes, 500);
        assert!(!plan.budget_met);
    }

    #[test]
    fn repo_caches_go_only_after_every_workspace_and_only_while_above_low_water() {
        let inv = inventory(
            1000,
            &[(1, "clean analysis", H, 100, 91, "")],
            &[],
            &[
                (90, 30 * D, 100, false),
                (91, 20 * D, 100, false),
                (92, 10 * D, 100, false),
                (93, 5 * D, 100, false),
            ],
        );
        // Cache 91's only workspace is evicted clean first, so 91 is no longer live.
        let plan = check(
            &policy(),
            &inv,
            &[("evict", 1), ("evict cache", 90), ("evict cache", 91)],
        );
        assert_eq!(plan.projected_used_bytes, 700);
    }

    #[test]
    fn repo_caches_are_taken_least_recently_used_first_then_larger_then_by_id() {
        let inv = inventory(
            2000,
            &[],
            &[],
            &[
                (93, 5 * D, 100, false),
                (92, 5 * D, 100, false),
                (91, 5 * D, 300, false),
                (90, 9 * D, 100, false),
            ],
        );
        check(
            &policy(),
            &inv,
            &[
                ("evict cache", 90),
                ("evict cache", 91),
                ("evict cache", 92),
                ("evict cache", 93),
            ],
        );
    }

    #[test]
    fn a_repo_cache_with_a_live_workspace_or_needed_saved_work_is_never_evicted() {
        let inv = inventory(
            5000,
            &[
                (1, "clean edit", H, 100, 90, "pinned"),
                (2, "dirty edit", H, 100, 92, ""),
                (3, "dirty task", 30 * D, 0, 93, "evicted"),
            ],
            &[],
            &[
                (90, 50 * D, 100, false),
                (91, 40 * D, 100, true),
                (92, 30 * D, 100, false),
                (93, 20 * D, 100, false),
                (94, 10 * D, 100, false),
            ],
        );
        // 92 gets saved work from this very plan; 93 only has an evicted record.
        let plan = check(
            &policy(),
            &inv,
            &[("preserve", 2), ("evict cache", 93), ("evict cache", 94)],
        );
        let until = now() + chrono::Duration::hours(1);
        assert_eq!(
            blocked(&plan),
            [
                (1, Protection::Pinned { until }),
                (90, Protection::LiveWorkspaces { count: 1 }),
                (91, Protection::SavedWork),
                (92, Protection::SavedWork),
            ]
        );
    }

    #[test]
    fn repo_caches_are_never_evicted_without_pressure() {
        let inv = inventory(800, &[], &[], &[(90, 365 * D, 500, false)]);
        check(&policy(), &inv, &[]);
    }

    #[test]
    fn runtimes_are_stopped_when_idle_and_destroyed_when_long_stopped_as_now_says() {
        let workspaces: Vec<Ws> = (1..=4).map(|n| (n, "clean edit", H, 100, 90, "")).collect();
        let runtimes = [
            (10, 1, "running", 30 * M),
            (11, 2, "running", 30 * M + 1),
            (12, 3, "stopped", 6 * H),
            (13, 4, "stopped", 6 * H + 1),
        ];
        let mut inv = inventory(100, &workspaces, &runtimes, &[]);
        check(&policy(), &inv, &[("destroy", 13), ("stop", 11)]);
        // Move the clock instead of sleeping: an hour later, every runtime is past its
        // threshold (oldest first), and the workspaces (within their TTL) are not touched.
        inv.now = now() + chrono::Duration::hours(1);
        check(
            &policy(),
            &inv,
            &[("destroy", 13), ("destroy", 12), ("stop", 11), ("stop", 10)],
        );
    }

    #[test]
    fn unhealthy_and_orphan_runtimes_are_destroyed_before_any_stop() {
        let inv = inventory(
            100,
            &[
                (1, "clean edit", H, 100, 90, ""),
                (2, "clean edit", H, 100, 90, ""),
                (3, "clean edit", H, 100, 90, "evicted"),
            ],
            &[
                (10, 1, "running unhealthy", M),
                (11, 99, "running", M),
                (12, 2, "running", 2 * H),
                (13, 3, "stopped", M),
                (14, 2, "stopped unhealthy", M),
            ],
            &[],
        );
        let plan = check(
            &policy(),
            &inv,
            &[
                ("destroy", 11),
                ("destroy", 13),
                ("destroy", 10),
                ("destroy", 14),
                ("stop", 12),
            ],
        );
        let reasons: Vec<Reason> = plan.actions.iter().map(|a| a.reason).collect();
        assert_eq!(
            reasons[..4],
            [
                Reason::OrphanRuntime,
                Reason::OrphanRuntime,
                Reason::UnhealthyRuntime,
                Reason::UnhealthyRuntime
            ]
        );
    }

    #[test]
    fn a_runtime_of_a_pinned_workspace_is_still_stopped_when_idle() {
        let inv = inventory(
            100,
            &[(1, "dirty edit", 2 * H, 100, 90, "pinned")],
            &[(10, 1, "running", 2 * H)],
            &[],
        );
        check(&policy(), &inv, &[("stop", 10)]);
    }

    #[test]
    fn a_workspace_whose_runtime_this_plan_stops_can_go_after_its_runtime_is_destroyed() {
        let inv = inventory(
            100,
            &[
                (1, "clean analysis", 3 * D, 100, 90, ""),
                (2, "clean task", 5 * D, 100, 90, ""),
            ],
            &[(10, 1, "running", 3 * D), (11, 2, "stopped", H)],
            &[],
        );
        let plan = check(
            &policy(),
            &inv,
            &[
                ("stop", 10),
                ("destroy", 10),
                ("evict", 1),
                ("destroy", 11),
                ("evict", 2),
            ],
        );
        assert_eq!(
            plan.actions[1].reason,
            Reason::WorkspaceEvicted {
                workspace_id: id(1)
            }
        );
    }

    #[test]
    fn reasons_carry_the_values_that_triggered_them() {
        let inv = inventory(
            1000,
            &[
                (1, "clean edit", 40 * M, 100, 92, "pinned"),
                (2, "clean edit", 7 * H, 100, 92, "pinned"),
                (3, "clean analysis", 2 * D, 100, 90, ""),
                (4, "dirty task", H, 150, 90, ""),
            ],
            &[(10, 1, "running", 40 * M), (11, 2, "stopped", 7 * H)],
            &[(90, 30 * D, 100, false), (91, 10 * D, 100, false)],
        );
        let plan = check(
            &policy(),
            &inv,
            &[
                ("destroy", 11),
                ("stop", 10),
                ("evict", 3),
                ("preserve", 4),
                ("evict cache", 91),
            ],
        );
        let pressure = |used_bytes| Pressure {
            used_bytes,
            budget_bytes: 1000,
            high_water_bytes: 850,
            low_water_bytes: 700,
        };
        let reasons: Vec<Reason> = plan.actions.iter().map(|a| a.reason).collect();
        assert_eq!(
            reasons,
            [
                Reason::StoppedRuntime {
                    stopped_secs: 7 * H,
                    threshold_secs: 6 * H
                },
                Reason::IdleRuntime {
                    idle_secs: 40 * M,
                    threshold_secs: 30 * M
                },
                Reason::TtlExpired {
                    tier: Tier::CleanAnalysis,
                    idle_secs: 2 * D,
                    ttl_secs: D
                },
                Reason::DiskPressure {
                    tier: Tier::DirtyTask,
                    idle_secs: H,
                    ttl_secs: 3 * D,
                    pressure: pressure(900)
                },
                Reason::RepoCachePressure {
                    idle_secs: 10 * D,
                    pressure: pressure(750)
                },
            ]
        );
        let bytes: Vec<u64> = plan.actions.iter().map(|a| a.bytes_freed).collect();
        assert_eq!(bytes, [0, 0, 100, 150, 100]);
        assert_eq!(plan.projected_used_bytes, 650);
        assert_eq!(
            serde_json::to_value(plan.actions[2]).unwrap(),
            serde_json::json!({
                "kind": {"kind": "evict_workspace", "preserve_dirty": false},
                "id": id(3),
                "reason": {"reason": "ttl_expired", "tier": "clean_analysis",
                           "idle_secs": 172800, "ttl_secs": 86400},
                "bytes_freed": 100
            })
        );
        let back: Plan = serde_json::from_value(serde_json::to_value(&plan).unwrap()).unwrap();
        assert_eq!(back, plan);
    }

    #[test]
    fn a_recorded_use_may_be_stale_by_a_quarter_of_the_shortest_judged_age() {
        let default = EvictionPolicy::default();
        assert_eq!(default.use_staleness_bound_secs(), 150, "600 s grace / 4");
        let short_ttl = EvictionPolicy {
            workspace_ttl: WorkspaceTtls {
                analysis_secs: 200,
                ..WorkspaceTtls::default()
            },
            ..EvictionPolicy::default()
        };
        assert_eq!(short_ttl.use_staleness_bound_secs(), 50);
        let no_grace = EvictionPolicy {
            pressure_grace_secs: 0,
            ..EvictionPolicy::default()
        };
        assert_eq!(no_grace.use_staleness_bound_secs(), 0, "every use recorded");
    }

    #[test]
    fn under_pressure_a_recently_used_workspace_is_kept_for_the_grace_period() {
        let inv = inventory(
            2000,
            &[
                (1, "clean analysis", 5 * M, 100, 90, ""),
                (2, "dirty edit", 9 * M, 100, 90, ""),
                (3, "clean task", 10 * M, 100, 90, ""),
            ],
            &[],
            &[(91, 5 * M, 100, false)],
        );
        let plan = check(&policy(), &inv, &[("evict", 3)]);
        let recent = |idle_secs| Protection::RecentlyUsed {
            idle_secs,
            grace_secs: 600,
        };
        assert_eq!(
            blocked(&plan),
            [(1, recent(300)), (2, recent(540)), (91, recent(300))]
        );
        let no_grace = EvictionPolicy {
            pressure_grace_secs: 0,
            ..policy()
        };
        check(
            &no_grace,
            &inv,
            &[
                ("evict", 1),
                ("evict", 3),
                ("preserve", 2),
                ("evict cache", 91),
            ],
        );
    }

    #[test]
    fn evicted_workspace_records_are_ignored() {
        let inv = inventory(
            5000,
            &[(1, "clean analysis", 10 * D, 100, 90, "evicted")],
            &[],
            &[],
        );
        let plan = check(&policy(), &inv, &[]);
        assert!(plan.blocked.is_empty());
        assert!(workspace_queue(&policy(), &inv).is_empty());
    }

    #[test]
    fn a_timestamp_in_the_future_counts_as_just_used() {
        let mut inv = inventory(0, &[(1, "clean analysis", 0, 100, 90, "")], &[], &[]);
        inv.workspaces[0].last_used_at = now() + chrono::Duration::days(5);
        check(&policy(), &inv, &[]);
        assert_eq!(workspace_queue(&policy(), &inv)[0].idle_secs, 0);
    }

    #[test]
    fn the_queue_lists_workspaces_in_the_order_the_plan_takes_them() {
        let inv = inventory(
            100_000,
            &[
                (1, "dirty edit", H, 100, 90, ""),
                (2, "clean task", 5 * D, 100, 90, ""),
                (3, "clean analysis", 5 * M, 100, 90, ""),
                (4, "clean edit", H, 100, 90, "pinned"),
                (5, "dirty task", 2 * H, 100, 90, ""),
            ],
            &[],
            &[],
        );
        let queue = workspace_queue(&policy(), &inv);
        let order: Vec<(u128, Tier, bool)> = queue
            .iter()
            .map(|q| (q.id.as_u128(), q.tier, q.ttl_expired))
            .collect();
        assert_eq!(
            order,
            [
                (2, Tier::CleanTask, true),
                (3, Tier::CleanAnalysis, false),
                (4, Tier::CleanEdit, false),
                (5, Tier::DirtyTask, false),
                (1, Tier::DirtyEdit, false),
            ]
        );
        assert!(matches!(
            queue[1].protection,
            Some(Protection::RecentlyUsed { .. })
        ));
        assert!(matches!(
            queue[2].protection,
            Some(Protection::Pinned { .. })
        ));
        check(
            &policy(),
            &inv,
            &[("evict", 2), ("preserve", 5), ("preserve", 1)],
        );
    }

    #[test]
    fn the_default_policy_carries_the_documented_values() {
        let p = EvictionPolicy::default();
        assert_eq!(p.runtime_idle_stop_after_secs, 1800);
        assert_eq!(p.runtime_destroy_stopped_after_secs, 21_600);
        assert_eq!(
            p.workspace_ttl,
            WorkspaceTtls {
                analysis_secs: 86_400,
                task_secs: 259_200,
                edit_secs: 1_209_600
            }
        );
        assert_eq!(p.pressure_grace_secs, 600);
        assert_eq!(p.disk_budget, DiskBudget::Fraction(0.5));
        assert_eq!((p.high_water, p.low_water), (0.85, 0.70));
        assert_eq!(p.validate(), Ok(()));
        assert_eq!(
            p.marks(1000),
            Marks {
                budget_bytes: 500,
                high_water_bytes: 425,
                low_water_bytes: 350
            }
        );
    }

    #[test]
    fn a_fractional_budget_is_resolved_against_the_filesystem_size() {
        let p = EvictionPolicy {
            disk_budget: DiskBudget::Fraction(0.1),
            ..EvictionPolicy::default()
        };
        let mut inv = inventory(900, &[(1, "clean analysis", H, 300, 90, "")], &[], &[]);
        inv.filesystem_bytes = 10_000;
        let plan = check(&p, &inv, &[("evict", 1)]);
        assert_eq!(plan.marks.budget_bytes, 1000);
        inv.filesystem_bytes = 100_000;
        check(&p, &inv, &[]);
    }

    #[test]
    fn a_partial_configuration_keeps_the_other_defaults_and_a_typo_is_refused() {
        let p: EvictionPolicy = serde_json::from_value(serde_json::json!({
            "disk_budget": {"bytes": 1000},
            "workspace_ttl": {"edit_secs": 600}
        }))
        .unwrap();
        assert_eq!(p.disk_budget, DiskBudget::Bytes(1000));
        assert_eq!(p.workspace_ttl.edit_secs, 600);
        assert_eq!(p.workspace_ttl.analysis_secs, DAY);
        assert_eq!(p.runtime_idle_stop_after_secs, 30 * MINUTE);
        assert!(serde_json::from_value::<EvictionPolicy>(
            serde_json::json!({"runtime_idle_stop_secs": 60})
        )
        .is_err());
        let d = EvictionPolicy::default();
        let back: EvictionPolicy =
            serde_json::from_value(serde_json::to_value(&d).unwrap()).unwrap();
        assert_eq!(back, d);
    }

    #[test]
    fn validation_refuses_inverted_water_marks_empty_budgets_and_zero_thresholds() {
        let ok = EvictionPolicy::default();
        let inverted = EvictionPolicy {
            high_water: 0.6,
            low_water: 0.7,
            ..ok.clone()
        };
        assert!(matches!(
            inverted.validate(),
            Err(PolicyError::WaterMarks { .. })
        ));
        let above_one = EvictionPolicy {
            high_water: 1.2,
            ..ok.clone()
        };
        assert!(above_one.validate().is_err());
        let nan = EvictionPolicy {
            low_water: f64::NAN,
            ..ok.clone()
        };
        assert!(nan.validate().is_err());
        for budget in [DiskBudget::Fraction(0.0), DiskBudget::Fraction(1.5)] {
            let p = EvictionPolicy {
                disk_budget: budget,
                ..ok.clone()
            };
            assert!(matches!(p.validate(), Err(PolicyError::BudgetFraction(_))));
        }
        let zero = EvictionPolicy {
            disk_budget: DiskBudget::Bytes(0),
            ..ok.clone()
        };
        assert_eq!(zero.validate(), Err(PolicyError::ZeroBudget));
        let zero_ttl = EvictionPolicy {
            workspace_ttl: WorkspaceTtls {
                task_secs: 0,
                ..WorkspaceTtls::default()
            },
            ..ok.clone()
        };
        assert_eq!(
            zero_ttl.validate(),
            Err(PolicyError::ZeroThreshold("workspace_ttl.task_secs"))
        );
        let no_grace = EvictionPolicy {
            pressure_grace_secs: 0,
            ..ok
        };
        assert_eq!(no_grace.validate(), Ok(()));
    }

    #[test]
    fn rows_map_to_inventory_items_by_their_typed_state() {
        let at = now();
        let mut row = WorkspaceRow {
            id: id(1),
            repo_cache_id: id(90),
            node: "n".into(),
            project_id: "p".into(),
            user_id: "u".into(),
            mode: WorkspaceMode::Task,
            conversation_id: None,
            task_id: Some("t".into()),
            base_ref: "main".into(),
            base_commit: "c".into(),
            branch_name: None,
            local_path: "/x".into(),
            state: WorkspaceState::Released,
            dirty: true,
            pinned_until: None,
            last_used_at: at,
            size_bytes: -5,
            capabilities: crate::model::Capabilities::from_mode(WorkspaceMode::Task),
            created_at: at,
            updated_at: at,
            size_measured_at: None,
            evicted_at: None,
            saved: None,
            history_ignored: false,
        };
        let item = WorkspaceItem::from_row(&row, true);
        assert_eq!(item.state, WorkspaceActivity::Ready);
        assert_eq!(item.size_bytes, 0);
        assert!(item.dirty && item.command_in_flight);
        for (state, expected) in [
            (WorkspaceState::Ready, WorkspaceActivity::Ready),
            (WorkspaceState::Evicting, WorkspaceActivity::Busy),
            (WorkspaceState::Evicted, WorkspaceActivity::Evicted),
        ] {
            row.state = state;
            assert_eq!(WorkspaceItem::from_row(&row, false).state, expected);
        }
        let mut rt = RuntimeRow {
            id: id(10),
            workspace_id: id(1),
            backend_kind: "local".into(),
            backend_runtime_id: "x".into(),
            image: None,
            state: RuntimeState::Stopped,
            last_started_at: None,
            last_used_at: ago(H),
            expires_at: None,
            created_at: ago(D),
            updated_at: ago(M),
        };
        assert_eq!(
            RuntimeItem::from_row(&rt, true).state,
            RuntimeActivity::Stopped { since: ago(M) }
        );
        rt.state = RuntimeState::Running;
        assert_eq!(
            RuntimeItem::from_row(&rt, true).state,
            RuntimeActivity::Running
        );
    }
}
