//! Eviction: the node sweep around `grove_core::eviction::plan`, restore, per-conversation
//! release, pinning, and the schedule that enqueues one sweep per node and tick.
//!
//! # The sweep (`evict_sweep`)
//!
//! One sweep of a node at a time (advisory lock `node_sweep`, taken without waiting: a
//! second sweep returns at once, `skipped`). In order:
//!
//! 1. **Trash**: empties `$GROVE_HOME/trash/`, where earlier evictions moved directories.
//! 2. **Reconcile**: a workspace left `evicting` by a crash is rolled back (its directory
//!    is still at its path: `workspace.eviction_blocked`, back to `released`) or rolled
//!    forward (the directory was already moved: `workspace.evicted`, cause
//!    `interrupted`); a `ready`/`released` workspace or a `ready` repo cache whose
//!    directory is gone is recorded as evicted (cause `directory_missing`).
//! 3. **Measure**: workspaces used since their size was measured, and measured longer
//!    than `GROVE_EVICT_MEASURE_EVERY` ago, are measured again (`workspace.size_measured`,
//!    apparent bytes). Nothing else walks the tree: usage is the sum of cached sizes.
//! 4. **Plan and act**, up to [`MAX_ROUNDS`] times: the inventory is read from the
//!    projections and the ledger (commands queued or running per workspace), `plan`
//!    orders the actions, and each is carried out under its locks — taken without
//!    waiting long ([`TRY_LOCK`]) — after its guards are checked again; an action whose
//!    guards no longer hold is skipped (the rest of the plan still runs: a skip only
//!    leaves usage higher than projected), and once the plan is through, the node is
//!    re-planned without the skipped targets.
//! 5. **Report**: `eviction.sweep_finished`, with every action and how it ended.
//!
//! A workspace is evicted under its key lock and its command lock (the order acquire
//! and destroy use): dirtiness is decided by git at that moment; its work is saved
//! (ref and patch); `workspace.evicting` is committed; the directory is renamed into
//! the trash (atomic: it is whole at its path or whole in the trash); `workspace.evicted`
//! is committed; the trash entry is removed. A crash at any point leaves either a
//! complete directory or a record that says `evicting`, which the next sweep (or an
//! acquire of the key) finishes; an `evicting` workspace is `Busy` to the planner, and
//! execs refuse it.
//!
//! # Usage and budget
//!
//! `used_bytes` is the sum of the cached apparent sizes of the node's live workspaces and
//! repo caches plus the size of `$GROVE_HOME/saved/` (patch artifacts, walked: they are
//! few). The private Postgres cluster under `$GROVE_HOME/postgres`, if any, is not
//! counted. `filesystem_bytes` (for a fractional budget) is `statvfs` of `$GROVE_HOME`.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use futures::StreamExt;
use grove_core::commands::{Command, CommandResult, EvictSweep, ReleaseReport, ReleaseScope};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::events::{Correlation, Event, EvictionCause, Metadata};
use grove_core::eviction::{
    plan, Action, ActionKind, DiskBudget, EvictionPolicy, Inventory, Plan, Reason, RepoCacheItem,
    RuntimeItem, Target, WorkspaceItem, WorkspaceState,
};
use grove_core::model::{saved_ref_name, RepoCacheRow, RuntimeRow, WorkspaceMode, WorkspaceRow};
use grove_core::ports::{GitToken, RestoreRequest, SaveWorkRequest};
use grove_core::sweep::{ActionOutcome, ActionRecord, Reconciled, SweepReport, SweepTrigger};
use grove_postgres::locks::{AdvisoryLock, LockScope};
use grove_postgres::{queue, rows, store, StoreError};
use sqlx::PgPool;
use tracing::{info, warn};
use uuid::Uuid;

use crate::handlers::{blocking, correlation_of, fold_workspace, now, store_error, Deps, Handled};

/// The documented default schedule: every 5 minutes, at second 0 (cron with seconds).
pub const DEFAULT_SCHEDULE: &str = "0 */5 * * * *";
/// Default for `GROVE_EVICT_MEASURE_EVERY`: a used workspace is re-measured at most this often.
pub const DEFAULT_MEASURE_EVERY: Duration = Duration::from_secs(600);
/// Plans per sweep at most (the first, plus re-plans after skipped or failed actions).
pub const MAX_ROUNDS: u32 = 8;
/// How long a sweep waits for a lock before skipping the action: it never queues
/// behind a command.
pub const TRY_LOCK: Duration = Duration::from_millis(500);
/// Namespace of the command ids derived for scheduled and on-demand sweeps.
pub const SWEEP_NAMESPACE: Uuid = Uuid::from_u128(0x8d6e_2f3a_51c4_4b0e_9f27_6772_6f76_6565);

/// Eviction settings of a worker (see README "Configuration").
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionSettings {
    pub policy: EvictionPolicy,
    /// Cron expression (with seconds) of the node's sweeps; `None` disables them.
    pub schedule: Option<String>,
    pub measure_every: Duration,
    /// Accept `EvictSweep.now` (a clock override, for tests).
    pub allow_clock_override: bool,
    /// Test-only (`GROVE_TEST_EVICT_PAUSE_MS`): a pause after each step of a workspace
    /// eviction, so a test can kill the worker in the middle of one.
    pub test_pause: Option<Duration>,
    /// `GROVE_EVICT_IGNORED_BUDGET_BYTES`: ignored files kept per saved workspace, in
    /// total bytes; the rest are named in the eviction's events.
    pub ignored_budget_bytes: u64,
}

/// Default for `GROVE_EVICT_IGNORED_BUDGET_BYTES` (64 MiB).
pub const DEFAULT_IGNORED_BUDGET: u64 = 64 << 20;

impl Default for EvictionSettings {
    fn default() -> Self {
        Self {
            policy: EvictionPolicy::default(),
            schedule: Some(DEFAULT_SCHEDULE.to_string()),
            measure_every: DEFAULT_MEASURE_EVERY,
            allow_clock_override: false,
            test_pause: None,
            ignored_budget_bytes: DEFAULT_IGNORED_BUDGET,
        }
    }
}

impl EvictionSettings {
    /// Reads the settings from the process environment.
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// Reads the settings through `get` (the environment, or a map in tests):
    /// `GROVE_EVICT_POLICY` (a JSON file of `EvictionPolicy`, any subset of fields), then
    /// the single-value variables on top of it.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let mut s = Self::default();
        if let Some(path) = get("GROVE_EVICT_POLICY") {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("GROVE_EVICT_POLICY {path}: {e}"))?;
            s.policy = serde_json::from_str(&text)
                .map_err(|e| format!("GROVE_EVICT_POLICY {path}: {e}"))?;
        }
        if let Some(v) = get("GROVE_DISK_BUDGET") {
            s.policy.disk_budget = parse_budget(&v)?;
        }
        let fraction = |name: &str, v: String| {
            v.trim()
                .parse::<f64>()
                .map_err(|_| format!("{name}: expected a fraction like 0.85, got {v:?}"))
        };
        if let Some(v) = get("GROVE_HIGH_WATER") {
            s.policy.high_water = fraction("GROVE_HIGH_WATER", v)?;
        }
        if let Some(v) = get("GROVE_LOW_WATER") {
            s.policy.low_water = fraction("GROVE_LOW_WATER", v)?;
        }
        let secs = |name: &str, v: String| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| format!("{name}: expected whole seconds, got {v:?}"))
        };
        for (name, field) in [
            (
                "GROVE_RUNTIME_IDLE_STOP_AFTER",
                &mut s.policy.runtime_idle_stop_after_secs,
            ),
            (
                "GROVE_RUNTIME_DESTROY_STOPPED_AFTER",
                &mut s.policy.runtime_destroy_stopped_after_secs,
            ),
            (
                "GROVE_TTL_ANALYSIS",
                &mut s.policy.workspace_ttl.analysis_secs,
            ),
            ("GROVE_TTL_TASK", &mut s.policy.workspace_ttl.task_secs),
            ("GROVE_TTL_EDIT", &mut s.policy.workspace_ttl.edit_secs),
            ("GROVE_PRESSURE_GRACE", &mut s.policy.pressure_grace_secs),
        ] {
            if let Some(v) = get(name) {
                *field = secs(name, v)?;
            }
        }
        s.policy
            .validate()
            .map_err(|e| format!("eviction policy: {e}"))?;
        if let Some(v) = get("GROVE_EVICT_SCHEDULE") {
            s.schedule = match v.trim() {
                "off" | "none" | "disabled" => None,
                expr => {
                    cron::Schedule::from_str(expr)
                        .map_err(|e| format!("GROVE_EVICT_SCHEDULE {expr:?}: {e}"))?;
                    Some(expr.to_string())
                }
            };
        }
        if let Some(v) = get("GROVE_EVICT_MEASURE_EVERY") {
            s.measure_every = Duration::from_secs(secs("GROVE_EVICT_MEASURE_EVERY", v)?);
        }
        if let Some(v) = get("GROVE_EVICT_IGNORED_BUDGET_BYTES") {
            s.ignored_budget_bytes = parse_budget(&v).and_then(|b| match b {
                DiskBudget::Bytes(n) => Ok(n),
                _ => Err(format!(
                    "GROVE_EVICT_IGNORED_BUDGET_BYTES: expected bytes (like 67108864 or 64MiB), got {v:?}"
                )),
            })?;
        }
        s.allow_clock_override = get("GROVE_ALLOW_CLOCK_OVERRIDE").is_some_and(|v| v == "1");
        if let Some(v) = get("GROVE_TEST_EVICT_PAUSE_MS") {
            s.test_pause =
                Some(Duration::from_millis(v.trim().parse().map_err(|_| {
                    format!("GROVE_TEST_EVICT_PAUSE_MS: bad value {v:?}")
                })?));
        }
        Ok(s)
    }
}

/// `GROVE_DISK_BUDGET`: bytes (`500000000`, `20G`, `512MiB`), a fraction of the
/// filesystem (`0.5`), or a percentage (`50%`).
pub fn parse_budget(raw: &str) -> Result<DiskBudget, String> {
    let v = raw.trim();
    let bad = || {
        format!("GROVE_DISK_BUDGET: expected bytes (e.g. 20G), a fraction (0.5) or a percentage (50%), got {raw:?}")
    };
    if let Some(p) = v.strip_suffix('%') {
        let p: f64 = p.trim().parse().map_err(|_| bad())?;
        return Ok(DiskBudget::Fraction(p / 100.0));
    }
    if v.contains('.') {
        return Ok(DiskBudget::Fraction(v.parse().map_err(|_| bad())?));
    }
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (digits, unit) = v.split_at(split);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "ki" | "kib" => 1 << 10,
        "mi" | "mib" => 1 << 20,
        "gi" | "gib" => 1 << 30,
        "ti" | "tib" => 1 << 40,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).map(DiskBudget::Bytes).ok_or_else(bad)
}

/// The command id of the scheduled sweep of `node` at `tick`: every worker of the node
/// derives the same one, so the ledger keeps one sweep per tick.
pub fn cron_command_id(node: &str, tick: DateTime<Utc>) -> Uuid {
    Uuid::new_v5(
        &SWEEP_NAMESPACE,
        format!("cron\0{node}\0{}", tick.timestamp()).as_bytes(),
    )
}

/// The command id of an on-demand sweep of `node`: one per minute at most.
pub fn on_demand_command_id(node: &str, at: DateTime<Utc>) -> Uuid {
    Uuid::new_v5(
        &SWEEP_NAMESPACE,
        format!("on_demand\0{node}\0{}", at.timestamp() / 60).as_bytes(),
    )
}

/// The private saved-work store of a workspace: `$GROVE_HOME/saved/<user>/<id>/`.
pub fn store_path(home: &Path, ws: &WorkspaceRow) -> PathBuf {
    grove_core::layout::Layout::new(home).saved_dir(&ws.user_id, ws.id)
}

fn trash_dir(home: &Path) -> PathBuf {
    home.join("trash")
}

fn trash_path(home: &Path, what: &str, id: Uuid) -> PathBuf {
    let nanos = Utc::now().timestamp_nanos_opt().unwrap_or(0);
    trash_dir(home).join(format!("{what}-{id}-{nanos:x}"))
}

/// Total bytes of the filesystem holding `path` (`statvfs`), 0 when unknown.
pub fn filesystem_bytes(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return 0;
    };
    // SAFETY: statvfs writes into the zeroed struct we own; `c` is a valid C string.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return 0;
        }
        (st.f_blocks as u64).saturating_mul(st.f_frsize as u64)
    }
}

fn size(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn is_live(state: &str) -> bool {
    state != "evicted"
}

// ---------------------------------------------------------------------------------------
// The inventory: read-only, shared with the CLI (`grove evict --dry-run`, `workspace list`).

/// A node's records and the inventory built from them.
#[derive(Debug, Clone)]
pub struct NodeState {
    pub inventory: Inventory,
    pub workspaces: HashMap<Uuid, WorkspaceRow>,
    pub runtimes: HashMap<Uuid, RuntimeRow>,
    pub caches: HashMap<Uuid, RepoCacheRow>,
}

/// Reads everything the planner needs for one node. `except` is the sweep's own command
/// (not "in flight" for anything); `unhealthy` lists runtimes whose health check failed.
pub async fn load_node(
    pool: &PgPool,
    node: &str,
    home: &Path,
    now: DateTime<Utc>,
    except: Option<Uuid>,
    unhealthy: &HashSet<Uuid>,
) -> Result<NodeState, StoreError> {
    let mut conn = pool.acquire().await?;
    let workspaces = rows::workspaces_of_node(&mut conn, node).await?;
    let runtimes = rows::runtimes_of_node(&mut conn, node).await?;
    let caches = rows::repo_caches_of_node(&mut conn, node).await?;
    let in_flight: HashSet<Uuid> = rows::workspaces_with_open_commands(&mut conn, except)
        .await?
        .into_iter()
        .collect();
    drop(conn);
    let saved_in: HashSet<Uuid> = workspaces
        .iter()
        .filter(|w| !is_live(&w.state) || w.state == "evicting")
        .filter(|w| w.saved.is_some())
        .map(|w| w.repo_cache_id)
        .collect();
    let saved_bytes = grove_git::tree::tree_size(&home.join("saved"))
        .map(|n| i64::try_from(n).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let used_bytes = workspaces
        .iter()
        .filter(|w| is_live(&w.state))
        .map(|w| size(w.size_bytes))
        .chain(
            caches
                .iter()
                .filter(|c| c.state != "evicted")
                .map(|c| size(c.size_bytes)),
        )
        .sum::<u64>()
        + size(saved_bytes);
    let inventory = Inventory {
        now,
        used_bytes,
        filesystem_bytes: filesystem_bytes(home),
        workspaces: workspaces
            .iter()
            .map(|w| WorkspaceItem::from_row(w, in_flight.contains(&w.id)))
            .collect(),
        runtimes: runtimes
            .iter()
            .map(|r| RuntimeItem::from_row(r, !unhealthy.contains(&r.id)))
            .collect(),
        repo_caches: caches
            .iter()
            .filter(|c| c.state != "evicted")
            .map(|c| RepoCacheItem::from_row(c, saved_in.contains(&c.id)))
            .collect(),
    };
    Ok(NodeState {
        inventory,
        workspaces: workspaces.into_iter().map(|w| (w.id, w)).collect(),
        runtimes: runtimes.into_iter().map(|r| (r.id, r)).collect(),
        caches: caches.into_iter().map(|c| (c.id, c)).collect(),
    })
}

/// Human text for a planner reason, with its values (for `runtime.*` reasons and logs).
pub fn describe(reason: &Reason) -> String {
    match *reason {
        Reason::IdleRuntime {
            idle_secs,
            threshold_secs,
        } => format!("idle for {idle_secs} s (threshold {threshold_secs} s)"),
        Reason::StoppedRuntime {
            stopped_secs,
            threshold_secs,
        } => format!("stopped for {stopped_secs} s (threshold {threshold_secs} s)"),
        Reason::UnhealthyRuntime => "health check failed".into(),
        Reason::OrphanRuntime => "its workspace is gone or evicted".into(),
        Reason::WorkspaceEvicted { workspace_id } => {
            format!("its workspace {workspace_id} is evicted next")
        }
        Reason::TtlExpired {
            tier,
            idle_secs,
            ttl_secs,
        } => format!("{tier:?} unused for {idle_secs} s (ttl {ttl_secs} s)"),
        Reason::DiskPressure {
            tier,
            idle_secs,
            pressure,
            ..
        } => format!(
            "disk pressure: {} bytes used > low water {} (high water {}, budget {}); {tier:?} unused for {idle_secs} s",
            pressure.used_bytes, pressure.low_water_bytes, pressure.high_water_bytes, pressure.budget_bytes
        ),
        Reason::RepoCachePressure {
            idle_secs,
            pressure,
        } => format!(
            "disk pressure: {} bytes used > low water {} (budget {}); unused for {idle_secs} s",
            pressure.used_bytes, pressure.low_water_bytes, pressure.budget_bytes
        ),
    }
}

// ---------------------------------------------------------------------------------------
// The sweep.

/// How one action ended, before it is put in the report.
struct Ended {
    outcome: ActionOutcome,
    detail: Option<String>,
    /// Leave the target out of the re-plans of this sweep (false: only its record was
    /// stale, and the re-plan sees it as it is now).
    exclude: bool,
}

impl Ended {
    fn done() -> Self {
        Self {
            outcome: ActionOutcome::Done,
            detail: None,
            exclude: true,
        }
    }
    fn skipped(why: impl Into<String>) -> Self {
        Self {
            outcome: ActionOutcome::Skipped,
            detail: Some(why.into()),
            exclude: true,
        }
    }
    fn blocked(why: impl Into<String>) -> Self {
        Self {
            outcome: ActionOutcome::Blocked,
            detail: Some(why.into()),
            exclude: true,
        }
    }
    fn failed(why: impl Into<String>) -> Self {
        Self {
            outcome: ActionOutcome::Failed,
            detail: Some(why.into()),
            exclude: true,
        }
    }
}

/// A lock taken without waiting long; `None` when another job holds it.
async fn try_lock(
    pool: &PgPool,
    scope: LockScope,
    value: &str,
    shared: bool,
) -> Result<Option<AdvisoryLock>, CommandError> {
    match AdvisoryLock::acquire(pool, scope, value, shared, TRY_LOCK).await {
        Ok(lock) => Ok(Some(lock)),
        Err(StoreError::Locked(_)) => Ok(None),
        Err(e) => Err(store_error(e)),
    }
}

pub(crate) async fn release_all(locks: Vec<AdvisoryLock>) {
    for lock in locks {
        let _ = lock.release().await;
    }
}

impl Deps {
    pub(crate) fn home(&self) -> &Path {
        self.layout.root()
    }

    fn metadata_for(&self, command_id: Uuid, correlation: Correlation) -> Metadata {
        Metadata {
            command_id,
            correlation,
            worker_id: self.config.worker_id.clone(),
            node: self.config.node.clone(),
        }
    }

    /// Appends events in their own short transaction (a sweep commits as it goes).
    pub(crate) async fn record(
        &self,
        command_id: Uuid,
        correlation: Correlation,
        events: &[Event],
    ) -> Result<(), CommandError> {
        let md = self.metadata_for(command_id, correlation);
        let mut tx = self.pool.begin().await.map_err(|e| store_error(e.into()))?;
        store::append(&mut tx, events, &md, now())
            .await
            .map_err(store_error)?;
        tx.commit().await.map_err(|e| store_error(e.into()))
    }

    async fn open_commands_for(
        &self,
        workspace_id: Uuid,
        except: Uuid,
    ) -> Result<bool, CommandError> {
        let mut conn = self.conn().await?;
        let open = rows::workspaces_with_open_commands(&mut conn, Some(except))
            .await
            .map_err(store_error)?;
        Ok(open.contains(&workspace_id))
    }

    async fn pause(&self) {
        if let Some(p) = self.config.eviction.test_pause {
            tokio::time::sleep(p).await;
        }
    }

    /// `evict_sweep`: see the module documentation.
    pub async fn evict_sweep(
        &self,
        c: &EvictSweep,
        command_id: Uuid,
    ) -> Result<Handled, CommandError> {
        let started = Instant::now();
        let settings = &self.config.eviction;
        if c.node != self.config.node {
            return Err(CommandError::new(
                ErrorKind::InvalidInput,
                format!(
                    "this worker serves node {}, not {}",
                    self.config.node, c.node
                ),
            ));
        }
        if c.now.is_some() && !settings.allow_clock_override {
            return Err(CommandError::new(
                ErrorKind::InvalidInput,
                "a sweep with a clock override needs a worker started with GROVE_ALLOW_CLOCK_OVERRIDE=1",
            ));
        }
        let plan_now = c.now.unwrap_or_else(now);
        let policy = &settings.policy;
        let mut report = SweepReport {
            node: c.node.clone(),
            now: plan_now,
            tick: c.tick,
            trigger: c.trigger,
            skipped: None,
            marks: policy.marks(filesystem_bytes(self.home())),
            used_bytes_before: 0,
            used_bytes_after: 0,
            under_pressure: false,
            budget_met: true,
            shortfall_bytes: 0,
            rounds: 0,
            measured: 0,
            reconciled: Vec::new(),
            actions: Vec::new(),
            blocked: Vec::new(),
            blocked_total: 0,
            duration_ms: 0,
        };
        // A scheduled or on-demand sweep that finds another one running has nothing to
        // add; one asked for by hand waits for it (up to the lock timeout) and runs.
        let node_lock = if c.trigger == SweepTrigger::Manual {
            Some(self.lock(LockScope::NodeSweep, &c.node, false).await?)
        } else {
            try_lock(&self.pool, LockScope::NodeSweep, &c.node, false).await?
        };
        let Some(node_lock) = node_lock else {
            report.skipped = Some("another sweep of this node is running".into());
            return Ok(self.sweep_done(command_id, report, None, started));
        };
        self.empty_trash().await;
        self.reconcile(command_id, &mut report).await?;
        self.measure_stale(command_id, &mut report).await?;

        let mut excluded: HashSet<Uuid> = HashSet::new();
        let mut unhealthy: HashSet<Uuid> = HashSet::new();
        let mut last_plan: Option<Plan> = None;
        for round in 1..=MAX_ROUNDS {
            report.rounds = round;
            let mut state = load_node(
                &self.pool,
                &c.node,
                self.home(),
                plan_now,
                Some(command_id),
                &unhealthy,
            )
            .await
            .map_err(store_error)?;
            if round == 1 {
                unhealthy = self.health_checks(&state).await;
                if !unhealthy.is_empty() {
                    for rt in &mut state.inventory.runtimes {
                        rt.healthy = !unhealthy.contains(&rt.id);
                    }
                }
            }
            for ws in &mut state.inventory.workspaces {
                if excluded.contains(&ws.id) && ws.state == WorkspaceState::Ready {
                    ws.state = WorkspaceState::Busy;
                }
            }
            let p = plan(policy, &state.inventory);
            if round == 1 {
                report.used_bytes_before = p.used_bytes;
                report.marks = p.marks;
                report.under_pressure = p.under_pressure;
            }
            let actions: Vec<Action> = p
                .actions
                .iter()
                .filter(|a| !excluded.contains(&a.id))
                .copied()
                .collect();
            last_plan = Some(p);
            let mut replan = false;
            for action in actions {
                let ended = match self.perform(command_id, &action, &state).await {
                    Ok(ended) => ended,
                    Err(e) => Ended::failed(e.message),
                };
                let ok = ended.outcome == ActionOutcome::Done;
                if !ok {
                    info!(action = ?action.kind, id = %action.id, outcome = ?ended.outcome, detail = ?ended.detail, "eviction action not performed");
                }
                report.actions.push(ActionRecord {
                    action,
                    outcome: ended.outcome,
                    detail: ended.detail,
                });
                if !ok {
                    if ended.exclude {
                        excluded.insert(action.id);
                    }
                    // The rest of the plan still holds: a skipped eviction only leaves
                    // usage higher than projected, so later actions never over-evict.
                    // What it would have freed is found by re-planning afterwards.
                    replan = round < MAX_ROUNDS;
                }
            }
            if !replan {
                break;
            }
        }
        let after = load_node(
            &self.pool,
            &c.node,
            self.home(),
            plan_now,
            Some(command_id),
            &unhealthy,
        )
        .await
        .map_err(store_error)?;
        report.used_bytes_after = after.inventory.used_bytes;
        let marks = report.marks;
        report.shortfall_bytes = if report.under_pressure {
            report
                .used_bytes_after
                .saturating_sub(marks.low_water_bytes)
        } else {
            0
        };
        report.budget_met = report.shortfall_bytes == 0;
        let mut blocked = last_plan.map(|p| p.blocked).unwrap_or_default();
        report.blocked_total = blocked.len() as u64;
        blocked.truncate(grove_core::sweep::MAX_BLOCKED_IN_REPORT);
        report.blocked = blocked;
        info!(
            node = %c.node,
            used_before = report.used_bytes_before,
            used_after = report.used_bytes_after,
            actions = report.actions.len(),
            budget_met = report.budget_met,
            "eviction sweep finished"
        );
        Ok(self.sweep_done(command_id, report, Some(node_lock), started))
    }

    fn sweep_done(
        &self,
        command_id: Uuid,
        mut report: SweepReport,
        lock: Option<AdvisoryLock>,
        started: Instant,
    ) -> Handled {
        report.duration_ms = started.elapsed().as_millis() as u64;
        Handled {
            events: vec![Event::SweepFinished {
                sweep_id: command_id,
                report: report.clone(),
            }],
            result: Ok(CommandResult::Sweep(report)),
            locks: lock.into_iter().collect(),
            correlation: Correlation::default(),
        }
    }

    /// Removes what earlier evictions moved to the trash (the sweep lock is held, so no
    /// other sweep of this node is removing the same entries).
    async fn empty_trash(&self) {
        let dir = trash_dir(self.home());
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let git = self.git.clone();
            let p = path.clone();
            if let Err(e) = blocking(move || git.remove_trash(&p)).await {
                warn!(path = %path.display(), error = %e.message, "could not empty a trash entry");
            }
        }
    }

    /// Finishes or rolls back interrupted evictions; records missing directories.
    async fn reconcile(
        &self,
        command_id: Uuid,
        report: &mut SweepReport,
    ) -> Result<(), CommandError> {
        let (workspaces, caches) = {
            let mut conn = self.conn().await?;
            (
                rows::workspaces_of_node(&mut conn, &self.config.node)
                    .await
                    .map_err(store_error)?,
                rows::repo_caches_of_node(&mut conn, &self.config.node)
                    .await
                    .map_err(store_error)?,
            )
        };
        for ws in workspaces {
            let suspicious = ws.state == "evicting"
                || (matches!(ws.state.as_str(), "ready" | "released")
                    && !Path::new(&ws.local_path).is_dir());
            if !suspicious {
                continue;
            }
            let Some(locks) = self.try_lock_workspace(&ws).await? else {
                continue;
            };
            let ws = self.workspace(ws.id).await;
            let result = match ws {
                Ok(ws) => self.reconcile_workspace(command_id, &ws, report).await,
                Err(_) => Ok(()),
            };
            release_all(locks).await;
            result?;
        }
        for cache in caches {
            if cache.state != "ready" || Path::new(&cache.local_path).is_dir() {
                continue;
            }
            let Some(lock) = try_lock(
                &self.pool,
                LockScope::RepoCache,
                &format!("{}\u{0}{}", cache.node, cache.identity),
                false,
            )
            .await?
            else {
                continue;
            };
            let current = {
                let mut conn = self.conn().await?;
                rows::repo_cache(&mut conn, cache.id)
                    .await
                    .map_err(store_error)?
            };
            if let Some(current) =
                current.filter(|c| c.state == "ready" && !Path::new(&c.local_path).is_dir())
            {
                self.record(
                    command_id,
                    Correlation::default(),
                    &[Event::RepoCacheEvicted {
                        repo_cache_id: current.id,
                        cause: EvictionCause::DirectoryMissing,
                        bytes_freed: 0,
                    }],
                )
                .await?;
                report.reconciled.push(Reconciled {
                    target: Target::RepoCache,
                    id: current.id,
                    what: "directory missing: recorded as evicted".into(),
                });
            }
            let _ = lock.release().await;
        }
        Ok(())
    }

    async fn reconcile_workspace(
        &self,
        command_id: Uuid,
        ws: &WorkspaceRow,
        report: &mut SweepReport,
    ) -> Result<(), CommandError> {
        let present = Path::new(&ws.local_path).is_dir();
        let (event, what) = match (ws.state.as_str(), present) {
            ("evicting", true) => (
                Event::WorkspaceEvictionBlocked {
                    workspace_id: ws.id,
                    cause: Some(EvictionCause::Interrupted),
                    error: "an interrupted eviction was rolled back: the files were still in place"
                        .into(),
                    state: Some("released".into()),
                },
                "interrupted eviction rolled back",
            ),
            ("evicting", false) => (
                Event::WorkspaceEvicted {
                    workspace_id: ws.id,
                    cause: EvictionCause::Interrupted,
                    bytes_freed: ws.size_bytes,
                    saved: ws.saved.clone(),
                    omitted: Vec::new(),
                },
                "interrupted eviction finished",
            ),
            ("ready" | "released", false) => (
                Event::WorkspaceEvicted {
                    workspace_id: ws.id,
                    cause: EvictionCause::DirectoryMissing,
                    bytes_freed: 0,
                    saved: None,
                    omitted: Vec::new(),
                },
                "directory missing: recorded as evicted",
            ),
            _ => return Ok(()),
        };
        self.record(command_id, correlation_of(ws), &[event])
            .await?;
        report.reconciled.push(Reconciled {
            target: Target::Workspace,
            id: ws.id,
            what: what.into(),
        });
        Ok(())
    }

    /// The key lock, then the command lock (the order acquire and destroy use), each
    /// without waiting long. `None` when either is held.
    pub(crate) async fn try_lock_workspace(
        &self,
        ws: &WorkspaceRow,
    ) -> Result<Option<Vec<AdvisoryLock>>, CommandError> {
        let Some(key) = try_lock(
            &self.pool,
            LockScope::WorkspaceKey,
            &ws.key().lock_string(),
            false,
        )
        .await?
        else {
            return Ok(None);
        };
        match try_lock(
            &self.pool,
            LockScope::WorkspaceCommands,
            &ws.id.to_string(),
            false,
        )
        .await
        {
            Ok(Some(cmd)) => Ok(Some(vec![cmd, key])),
            Ok(None) => {
                let _ = key.release().await;
                Ok(None)
            }
            Err(e) => {
                let _ = key.release().await;
                Err(e)
            }
        }
    }

    /// Re-measures workspaces used since their last measurement (at most once per
    /// `measure_every` each).
    async fn measure_stale(
        &self,
        command_id: Uuid,
        report: &mut SweepReport,
    ) -> Result<(), CommandError> {
        let workspaces = {
            let mut conn = self.conn().await?;
            rows::workspaces_of_node(&mut conn, &self.config.node)
                .await
                .map_err(store_error)?
        };
        let real_now = now();
        let every = chrono::Duration::from_std(self.config.eviction.measure_every)
            .unwrap_or(chrono::Duration::MAX);
        for ws in workspaces {
            if !matches!(ws.state.as_str(), "ready" | "released") {
                continue;
            }
            let due = match ws.size_measured_at {
                None => true,
                Some(at) => ws.last_used_at > at && real_now - at >= every,
            };
            if !due {
                continue;
            }
            let git = self.git.clone();
            let dir = PathBuf::from(&ws.local_path);
            let Ok(size_bytes) = blocking(move || git.measure(&dir)).await else {
                continue;
            };
            self.record(
                command_id,
                correlation_of(&ws),
                &[Event::WorkspaceSizeMeasured {
                    workspace_id: ws.id,
                    size_bytes,
                }],
            )
            .await?;
            report.measured += 1;
        }
        Ok(())
    }

    /// Runtimes whose provider says they are unhealthy (local runtimes always are healthy).
    async fn health_checks(&self, state: &NodeState) -> HashSet<Uuid> {
        let mut out = HashSet::new();
        for rt in state.runtimes.values().filter(|r| r.state == "running") {
            if let Some(provider) = self.runtimes.get(&rt.backend_kind) {
                if let Ok(false) = provider.healthy(&rt.backend_runtime_id).await {
                    out.insert(rt.id);
                }
            }
        }
        out
    }

    async fn perform(
        &self,
        command_id: Uuid,
        action: &Action,
        state: &NodeState,
    ) -> Result<Ended, CommandError> {
        match action.kind {
            ActionKind::StopRuntime | ActionKind::DestroyRuntime => {
                self.runtime_action(command_id, action, state).await
            }
            ActionKind::EvictWorkspace { preserve_dirty } => {
                self.evict_workspace(command_id, action, preserve_dirty, state)
                    .await
            }
            ActionKind::EvictRepoCache => self.evict_cache(command_id, action, state).await,
        }
    }

    async fn runtime_action(
        &self,
        command_id: Uuid,
        action: &Action,
        state: &NodeState,
    ) -> Result<Ended, CommandError> {
        let Some(planned) = state.runtimes.get(&action.id) else {
            return Ok(Ended::skipped("runtime not in the inventory"));
        };
        let destroy = action.kind == ActionKind::DestroyRuntime;
        let Some(lock) = try_lock(
            &self.pool,
            LockScope::WorkspaceCommands,
            &planned.workspace_id.to_string(),
            false,
        )
        .await?
        else {
            return Ok(Ended::skipped("the workspace is locked by another job"));
        };
        let result: Result<Ended, CommandError> = async {
            let current = {
                let mut conn = self.conn().await?;
                rows::runtime(&mut conn, action.id)
                    .await
                    .map_err(store_error)?
            };
            let Some(current) = current else {
                return Ok(Ended::skipped("the runtime is gone"));
            };
            if current.last_used_at != planned.last_used_at {
                return Ok(Ended::skipped("the runtime was used since the plan"));
            }
            let orphan = matches!(action.reason, Reason::OrphanRuntime);
            if !orphan
                && self
                    .open_commands_for(current.workspace_id, command_id)
                    .await?
            {
                return Ok(Ended::skipped(
                    "a command on its workspace is queued or running",
                ));
            }
            match action.reason {
                Reason::IdleRuntime { .. } if current.state != "running" => {
                    return Ok(Ended::skipped("the runtime is no longer running"));
                }
                Reason::StoppedRuntime { .. }
                    if current.state != "stopped" || current.updated_at != planned.updated_at =>
                {
                    return Ok(Ended::skipped("the runtime changed since the plan"));
                }
                Reason::WorkspaceEvicted { .. } if current.state == "running" => {
                    return Ok(Ended::skipped("the runtime is running"));
                }
                Reason::OrphanRuntime => {
                    let ws = {
                        let mut conn = self.conn().await?;
                        rows::workspace(&mut conn, current.workspace_id)
                            .await
                            .map_err(store_error)?
                    };
                    if ws.is_some_and(|w| is_live(&w.state)) {
                        return Ok(Ended::skipped("its workspace exists"));
                    }
                }
                _ => {}
            }
            if let Some(provider) = self.runtimes.get(&current.backend_kind) {
                let effect = if destroy {
                    provider.destroy(&current.backend_runtime_id).await
                } else {
                    provider.stop(&current.backend_runtime_id).await
                };
                match effect {
                    Ok(()) | Err(grove_core::error::RuntimeError::NotFound(_)) => {}
                    Err(e) => return Ok(Ended::failed(e.to_string())),
                }
            }
            let reason = format!("eviction: {}", describe(&action.reason));
            let event = if destroy {
                Event::RuntimeDestroyed {
                    runtime_id: current.id,
                    reason,
                }
            } else {
                Event::RuntimeStopped {
                    runtime_id: current.id,
                    reason,
                }
            };
            let correlation = state
                .workspaces
                .get(&current.workspace_id)
                .map(correlation_of)
                .unwrap_or_default();
            self.record(command_id, correlation, &[event]).await?;
            Ok(Ended::done())
        }
        .await;
        let _ = lock.release().await;
        result
    }

    async fn evict_workspace(
        &self,
        command_id: Uuid,
        action: &Action,
        preserve_dirty: bool,
        state: &NodeState,
    ) -> Result<Ended, CommandError> {
        let Some(planned) = state.workspaces.get(&action.id) else {
            return Ok(Ended::skipped("workspace not in the inventory"));
        };
        let Some(locks) = self.try_lock_workspace(planned).await? else {
            return Ok(Ended::skipped("the workspace is locked by another job"));
        };
        let result = self
            .evict_locked(command_id, action, preserve_dirty, planned, state)
            .await;
        // The directory is in the trash and the record says evicted: unlock, then delete.
        let trash = match &result {
            Ok((_, trash)) => trash.clone(),
            Err(_) => None,
        };
        release_all(locks).await;
        if let Some(trash) = trash {
            let git = self.git.clone();
            let t = trash.clone();
            if let Err(e) = blocking(move || git.remove_trash(&t)).await {
                warn!(path = %trash.display(), error = %e.message, "could not empty the trash; the next sweep will");
            }
        }
        result.map(|(ended, _)| ended)
    }

    async fn evict_locked(
        &self,
        command_id: Uuid,
        action: &Action,
        preserve_dirty: bool,
        planned: &WorkspaceRow,
        state: &NodeState,
    ) -> Result<(Ended, Option<PathBuf>), CommandError> {
        let ws = match self.workspace(planned.id).await {
            Ok(ws) => ws,
            Err(_) => return Ok((Ended::skipped("the workspace is gone"), None)),
        };
        let skip = |why: &str| Ok((Ended::skipped(why), None));
        if !matches!(ws.state.as_str(), "ready" | "released") {
            return skip("its state changed since the plan");
        }
        if ws.last_used_at != planned.last_used_at {
            return skip("it was used since the plan");
        }
        if ws
            .pinned_until
            .is_some_and(|until| until > state.inventory.now)
        {
            return skip("it was pinned since the plan");
        }
        let runtimes = {
            let mut conn = self.conn().await?;
            rows::runtimes_of(&mut conn, ws.id)
                .await
                .map_err(store_error)?
        };
        if !runtimes.is_empty() {
            return skip("it still has a runtime");
        }
        if self.open_commands_for(ws.id, command_id).await? {
            return skip("a command on it is queued or running");
        }
        let dir = PathBuf::from(&ws.local_path);
        if !dir.is_dir() {
            // Nothing to delete: the reconcile step of the next sweep records it.
            return skip("its directory is missing");
        }
        let correlation = correlation_of(&ws);
        let cause = EvictionCause::Policy(action.reason);
        // A merge-back a dead worker left half-done is settled before anything is saved.
        self.recover_merge_back(&ws).await?;

        // Dirtiness is git's answer now, not the record's.
        let git = self.git.clone();
        let d = dir.clone();
        let dirty = match blocking(move || git.is_dirty(&d)).await {
            Ok(dirty) => dirty,
            Err(e) => {
                return self
                    .blocked(
                        command_id,
                        &ws,
                        cause,
                        format!("cannot tell whether it is dirty: {}", e.message),
                    )
                    .await
            }
        };
        if dirty != ws.dirty {
            self.record(
                command_id,
                correlation.clone(),
                &[Event::WorkspaceDirtyChanged {
                    workspace_id: ws.id,
                    dirty,
                }],
            )
            .await?;
        }
        if dirty && !preserve_dirty {
            // The record said clean: re-plan with what git says (its tier changed).
            let mut ended =
                Ended::skipped("it has uncommitted changes the plan did not know of (re-planned)");
            ended.exclude = false;
            return Ok((ended, None));
        }
        let saved = if ws.capabilities.writable || dirty {
            let cache = state
                .caches
                .get(&ws.repo_cache_id)
                .filter(|c| c.state == "ready" && Path::new(&c.local_path).is_dir());
            let Some(cache) = cache else {
                return self
                    .blocked(
                        command_id,
                        &ws,
                        cause,
                        "its repo cache is missing, so its work cannot be saved".into(),
                    )
                    .await;
            };
            let git = self.git.clone();
            let cache_dir = PathBuf::from(&cache.local_path);
            let (ws_dir, store, base, budget) = (
                dir.clone(),
                store_path(self.home(), &ws),
                ws.base_commit.clone(),
                self.config.eviction.ignored_budget_bytes,
            );
            let message = format!(
                "grove: work of workspace {} saved before eviction\n\n{}",
                ws.id,
                describe(&action.reason)
            );
            let saved = blocking(move || {
                git.save_work(&SaveWorkRequest {
                    workspace_dir: &ws_dir,
                    cache_dir: &cache_dir,
                    store_dir: &store,
                    ignored_budget_bytes: budget,
                    base_commit: &base,
                    message: &message,
                })
            })
            .await;
            match saved {
                Ok(report) => (report.saved, report.omitted),
                Err(e) => {
                    return self
                        .blocked(
                            command_id,
                            &ws,
                            cause,
                            format!("saving its work failed: {}", e.message),
                        )
                        .await
                }
            }
        } else {
            (None, Vec::new())
        };
        let (saved, omitted) = saved;
        self.record(
            command_id,
            correlation.clone(),
            &[Event::WorkspaceEvicting {
                workspace_id: ws.id,
                cause,
                saved: saved.clone(),
                omitted: omitted.clone(),
            }],
        )
        .await?;
        self.pause().await;
        let trash = trash_path(self.home(), "ws", ws.id);
        let moved = std::fs::create_dir_all(trash_dir(self.home()))
            .and_then(|()| std::fs::rename(&dir, &trash));
        if let Err(e) = moved {
            // Nothing was deleted: back to where it was.
            self.record(
                command_id,
                correlation,
                &[Event::WorkspaceEvictionBlocked {
                    workspace_id: ws.id,
                    cause: Some(cause),
                    error: format!("moving the workspace to the trash failed: {e}"),
                    state: Some(ws.state.clone()),
                }],
            )
            .await?;
            return Ok((
                Ended::blocked(format!("moving it to the trash failed: {e}")),
                None,
            ));
        }
        self.pause().await;
        self.record(
            command_id,
            correlation,
            &[Event::WorkspaceEvicted {
                workspace_id: ws.id,
                cause,
                bytes_freed: ws.size_bytes,
                saved,
                omitted,
            }],
        )
        .await?;
        info!(workspace = %ws.id, reason = %describe(&action.reason), "workspace evicted");
        Ok((Ended::done(), Some(trash)))
    }

    async fn blocked(
        &self,
        command_id: Uuid,
        ws: &WorkspaceRow,
        cause: EvictionCause,
        error: String,
    ) -> Result<(Ended, Option<PathBuf>), CommandError> {
        warn!(workspace = %ws.id, %error, "eviction blocked; the workspace is kept");
        self.record(
            command_id,
            correlation_of(ws),
            &[Event::WorkspaceEvictionBlocked {
                workspace_id: ws.id,
                cause: Some(cause),
                error: error.clone(),
                state: None,
            }],
        )
        .await?;
        Ok((Ended::blocked(error), None))
    }

    async fn evict_cache(
        &self,
        command_id: Uuid,
        action: &Action,
        state: &NodeState,
    ) -> Result<Ended, CommandError> {
        let Some(planned) = state.caches.get(&action.id) else {
            return Ok(Ended::skipped("repo cache not in the inventory"));
        };
        let Some(lock) = try_lock(
            &self.pool,
            LockScope::RepoCache,
            &format!("{}\u{0}{}", planned.node, planned.identity),
            false,
        )
        .await?
        else {
            return Ok(Ended::skipped("the repo cache is in use"));
        };
        let result: Result<(Ended, Option<PathBuf>), CommandError> = async {
            let (current, (live, saved)) = {
                let mut conn = self.conn().await?;
                (
                    rows::repo_cache(&mut conn, planned.id)
                        .await
                        .map_err(store_error)?,
                    rows::cache_dependents(&mut conn, planned.id)
                        .await
                        .map_err(store_error)?,
                )
            };
            let Some(current) = current else {
                return Ok((Ended::skipped("the repo cache is gone"), None));
            };
            if current.state != "ready" || current.last_used_at != planned.last_used_at {
                return Ok((Ended::skipped("the repo cache was used since the plan"), None));
            }
            if live > 0 {
                return Ok((Ended::skipped("the repo cache has live workspaces"), None));
            }
            if saved > 0 {
                return Ok((Ended::skipped("the repo cache holds saved work"), None));
            }
            let dir = PathBuf::from(&current.local_path);
            let trash = trash_path(self.home(), "cache", current.id);
            let moved = std::fs::create_dir_all(trash_dir(self.home()))
                .and_then(|()| std::fs::rename(&dir, &trash));
            if let Err(e) = moved {
                return Ok((Ended::failed(format!("moving it to the trash failed: {e}")), None));
            }
            self.record(
                command_id,
                Correlation::default(),
                &[Event::RepoCacheEvicted {
                    repo_cache_id: current.id,
                    cause: EvictionCause::Policy(action.reason),
                    bytes_freed: current.size_bytes,
                }],
            )
            .await?;
            info!(repo_cache = %current.id, reason = %describe(&action.reason), "repo cache evicted");
            Ok((Ended::done(), Some(trash)))
        }
        .await;
        let _ = lock.release().await;
        let (ended, trash) = result?;
        if let Some(trash) = trash {
            let git = self.git.clone();
            let t = trash.clone();
            if let Err(e) = blocking(move || git.remove_trash(&t)).await {
                warn!(path = %trash.display(), error = %e.message, "could not empty the trash; the next sweep will");
            }
        }
        Ok(ended)
    }

    // -----------------------------------------------------------------------------------
    // Restore, pin, release scope.

    /// `restore_workspace`: checks an evicted workspace out again, under its key lock and
    /// its command lock.
    pub async fn restore_workspace(
        &self,
        workspace_id: Uuid,
        token: Option<&GitToken>,
        at: DateTime<Utc>,
    ) -> Result<Handled, CommandError> {
        let ws = self.workspace(workspace_id).await?;
        // A remote workspace is never evicted, so never restored.
        crate::handlers::host_only(&ws, "restore")?;
        let key_lock = self
            .lock(LockScope::WorkspaceKey, &ws.key().lock_string(), false)
            .await?;
        let cmd_lock = match self
            .lock(LockScope::WorkspaceCommands, &ws.id.to_string(), false)
            .await
        {
            Ok(l) => l,
            Err(e) => {
                let _ = key_lock.release().await;
                return Err(e);
            }
        };
        let locks = vec![cmd_lock, key_lock];
        let ws = match self.workspace(workspace_id).await {
            Ok(ws) => ws,
            Err(e) => {
                release_all(locks).await;
                return Err(e);
            }
        };
        self.restore_locked(ws, token, at, locks).await
    }

    /// Restores `ws` (its key and command locks held, passed in `locks`). A workspace
    /// that is not evicted is returned as it is; one left `evicting` by a crash is
    /// rolled back if its files are in place, else restored from its saved work.
    pub(crate) async fn restore_locked(
        &self,
        ws: WorkspaceRow,
        token: Option<&GitToken>,
        at: DateTime<Utc>,
        mut locks: Vec<AdvisoryLock>,
    ) -> Result<Handled, CommandError> {
        let correlation = correlation_of(&ws);
        let fail = |locks: Vec<AdvisoryLock>, e: CommandError| async move {
            release_all(locks).await;
            Err(e)
        };
        if ws.node != self.config.node {
            let msg = format!(
                "workspace {} lives on node {}; restore it there",
                ws.id, ws.node
            );
            return fail(locks, CommandError::new(ErrorKind::Conflict, msg)).await;
        }
        let dir = PathBuf::from(&ws.local_path);
        let mut events = Vec::new();
        match ws.state.as_str() {
            "evicted" => {}
            "evicting" if dir.is_dir() => {
                events.push(Event::WorkspaceEvictionBlocked {
                    workspace_id: ws.id,
                    cause: Some(EvictionCause::Interrupted),
                    error: "an interrupted eviction was rolled back: the files were still in place"
                        .into(),
                    state: Some("ready".into()),
                });
                let row = fold_workspace(Some(ws), &events, at);
                return Ok(Handled {
                    result: row
                        .map(CommandResult::Workspace)
                        .ok_or_else(|| CommandError::new(ErrorKind::Internal, "fold lost the row")),
                    events,
                    locks,
                    correlation,
                });
            }
            "evicting" => {}
            _ if dir.is_dir() => {
                // Not evicted: nothing to do.
                return Ok(Handled {
                    result: Ok(CommandResult::Workspace(ws)),
                    events,
                    locks,
                    correlation,
                });
            }
            _ => {
                let msg = format!(
                    "workspace {} has a record but its directory is missing and it was not evicted; the next eviction sweep records it as evicted, then restore it",
                    ws.id
                );
                return fail(
                    locks,
                    CommandError::new(ErrorKind::Conflict, msg).transient(),
                )
                .await;
            }
        }
        let cache = {
            let mut conn = match self.conn().await {
                Ok(c) => c,
                Err(e) => return fail(locks, e).await,
            };
            rows::repo_cache(&mut conn, ws.repo_cache_id).await
        };
        let cache = match cache {
            Ok(Some(c)) => c,
            Ok(None) => {
                let msg = format!("the repo cache record of workspace {} is gone", ws.id);
                return fail(locks, CommandError::new(ErrorKind::NotFound, msg)).await;
            }
            Err(e) => return fail(locks, store_error(e)).await,
        };
        // Clones the cache again if it was evicted; holds its lock until the commit.
        let (cache, cache_events, cache_lock) = match self
            .ensure_cache(&cache.repo_name, &cache.repo_url, false, token, at)
            .await
        {
            Ok(x) => x,
            Err(e) => return fail(locks, e).await,
        };
        locks.extend(cache_lock);
        events.extend(cache_events);
        let head = ws
            .saved
            .as_ref()
            .map(|s| s.head_commit.clone())
            .unwrap_or_else(|| ws.base_commit.clone());
        let work = ws
            .saved
            .as_ref()
            .filter(|s| s.has_changes())
            .map(|s| s.commit.clone());
        let git = self.git.clone();
        let upstream = cache.repo_url.clone();
        // Work saved by this version is in the private store, with everything it kept.
        let store = ws
            .saved
            .as_ref()
            .filter(|s| !s.in_cache())
            .map(|_| store_path(self.home(), &ws));
        let (cache_dir, ws_dir, base_ref, base_commit, branch, h, w) = (
            PathBuf::from(&cache.local_path),
            dir.clone(),
            ws.base_ref.clone(),
            ws.base_commit.clone(),
            ws.branch_name.clone(),
            head.clone(),
            work.clone(),
        );
        // A directory at the path of an `evicted` record can only be a restore whose
        // worker died after moving the finished checkout into place (an eviction moves the
        // directory away before it records `evicted`): it is whole, so it is kept.
        let already_built = ws.state == "evicted" && dir.join(".git").is_dir();
        let restored = blocking(move || {
            if already_built {
                return git
                    .measure(&ws_dir)
                    .map(|size_bytes| grove_core::ports::CheckoutReport {
                        base_commit: base_commit.clone(),
                        size_bytes,
                    });
            }
            git.restore_checkout(&RestoreRequest {
                cache_dir: &cache_dir,
                workspace_dir: &ws_dir,
                base_ref: &base_ref,
                base_commit: &base_commit,
                branch: branch.as_deref(),
                head_commit: &h,
                work_commit: w.as_deref(),
                upstream_url: &upstream,
                store_dir: store.as_deref(),
            })
        })
        .await;
        let report = match restored {
            Ok(r) => r,
            Err(e) => return fail(locks, e).await,
        };
        events.push(Event::WorkspaceRestored {
            workspace_id: ws.id,
            head_commit: head,
            saved: ws.saved.clone(),
            dirty: work.is_some(),
            size_bytes: report.size_bytes,
        });
        info!(workspace = %ws.id, "workspace restored");
        let row = fold_workspace(Some(ws), &events, at)
            .ok_or_else(|| CommandError::new(ErrorKind::Internal, "fold lost the row"));
        Ok(Handled {
            result: row.map(CommandResult::Workspace),
            events,
            locks,
            correlation,
        })
    }

    /// Deletes a destroyed workspace's private store (and a saved-work ref an older
    /// version left in the cache). Best effort: a leftover is only disk space.
    pub(crate) async fn discard_saved_work(&self, ws: &WorkspaceRow) {
        let cache = match self.conn().await {
            Ok(mut conn) => rows::repo_cache(&mut conn, ws.repo_cache_id)
                .await
                .ok()
                .flatten(),
            Err(_) => None,
        };
        let git = self.git.clone();
        let cache_dir = cache
            .map(|c| PathBuf::from(c.local_path))
            .unwrap_or_default();
        let (ref_name, store) = (saved_ref_name(ws.id), store_path(self.home(), ws));
        if let Err(e) =
            blocking(move || git.discard_saved_work(&cache_dir, &ref_name, &store)).await
        {
            warn!(workspace = %ws.id, error = %e.message, "could not discard the saved work of a destroyed workspace");
        }
    }

    /// `pin_workspace`: records the pin under the workspace's command lock.
    pub async fn pin_workspace(
        &self,
        workspace_id: Uuid,
        until: Option<DateTime<Utc>>,
        at: DateTime<Utc>,
    ) -> Result<Handled, CommandError> {
        let (ws, lock) = self.lock_workspace(workspace_id, false).await?;
        let correlation = correlation_of(&ws);
        let events = vec![Event::WorkspacePinned {
            workspace_id: ws.id,
            until,
        }];
        let row = fold_workspace(Some(ws), &events, at)
            .ok_or_else(|| CommandError::new(ErrorKind::Internal, "fold lost the row"));
        Ok(Handled {
            result: row.map(CommandResult::Workspace),
            events,
            locks: vec![lock],
            correlation,
        })
    }

    /// `release_scope`: every workspace of a conversation (edit) or task (task) of a user,
    /// released (runtimes stopped) or destroyed. Each is committed as it is done; those of
    /// another node get a command on that node's queue.
    pub async fn release_scope(
        &self,
        c: &ReleaseScope,
        command_id: Uuid,
    ) -> Result<Handled, CommandError> {
        let (mode, scope) = match (&c.conversation_id, &c.task_id) {
            (Some(conv), None) => (WorkspaceMode::Edit, conv.clone()),
            (None, Some(task)) => (WorkspaceMode::Task, task.clone()),
            _ => {
                return Err(CommandError::new(
                    ErrorKind::InvalidInput,
                    "release needs exactly one of a conversation and a task",
                ))
            }
        };
        let workspaces: Vec<WorkspaceRow> = {
            let mut conn = self.conn().await?;
            rows::workspaces(&mut conn, Some(&c.user_id))
                .await
                .map_err(store_error)?
        }
        .into_iter()
        .filter(|w| w.mode == mode)
        .filter(|w| c.project_id.as_ref().is_none_or(|p| &w.project_id == p))
        .filter(|w| match mode {
            WorkspaceMode::Edit => w.conversation_id.as_deref() == Some(scope.as_str()),
            _ => w.task_id.as_deref() == Some(scope.as_str()),
        })
        .collect();
        let mut report = ReleaseReport::default();
        for ws in workspaces {
            if ws.node != self.config.node {
                let child = Uuid::new_v5(&command_id, ws.id.as_bytes());
                let command = if c.destroy_workspaces {
                    Command::DestroyWorkspace {
                        workspace_id: ws.id,
                    }
                } else {
                    Command::ReleaseSession {
                        workspace_id: ws.id,
                        destroy_runtime: false,
                    }
                };
                let mut tx = self.pool.begin().await.map_err(|e| store_error(e.into()))?;
                queue::enqueue(
                    &mut tx,
                    child,
                    &command,
                    &queue::placement_queue(&ws.node),
                    None,
                )
                .await
                .map_err(store_error)?;
                tx.commit().await.map_err(|e| store_error(e.into()))?;
                report.delegated.push((ws.id, child));
                continue;
            }
            let evicted = !matches!(ws.state.as_str(), "ready" | "released");
            if evicted && !c.destroy_workspaces {
                report.already_evicted.push(ws.id);
                continue;
            }
            let handled = if c.destroy_workspaces {
                self.destroy_workspace(ws.id).await?
            } else {
                self.release(ws.id, false).await?
            };
            let recorded = self
                .record(command_id, handled.correlation.clone(), &handled.events)
                .await;
            release_all(handled.locks).await;
            recorded?;
            if c.destroy_workspaces {
                report.destroyed.push(ws.id);
            } else {
                report.released.push(ws.id);
            }
        }
        Ok(Handled {
            result: Ok(CommandResult::Released(report)),
            events: Vec::new(),
            locks: Vec::new(),
            correlation: Correlation {
                user_id: Some(c.user_id.clone()),
                project_id: c.project_id.clone(),
                conversation_id: c.conversation_id.clone(),
                task_id: c.task_id.clone(),
            },
        })
    }
}

// ---------------------------------------------------------------------------------------
// Scheduling.

async fn enqueue_sweep(
    deps: &Deps,
    command_id: Uuid,
    sweep: EvictSweep,
) -> Result<bool, StoreError> {
    let queue_name = queue::node_queue(&sweep.node);
    let mut tx = deps.pool.begin().await?;
    let (_, inserted) = queue::enqueue(
        &mut tx,
        command_id,
        &Command::EvictSweep(sweep),
        &queue_name,
        None,
    )
    .await?;
    tx.commit().await?;
    Ok(inserted)
}

/// Enqueues this node's sweep at every tick of `GROVE_EVICT_SCHEDULE` (apalis-cron). Every
/// worker of the node runs this loop; the command id derived from `(node, tick)` makes the
/// ledger keep one sweep per tick.
pub(crate) async fn cron_loop(deps: Arc<Deps>) {
    let Some(expr) = deps.config.eviction.schedule.clone() else {
        return;
    };
    let schedule = match cron::Schedule::from_str(&expr) {
        Ok(s) => s,
        Err(e) => {
            warn!(schedule = %expr, error = %e, "invalid eviction schedule; no scheduled sweeps");
            return;
        }
    };
    let node = deps.config.node.clone();
    info!(schedule = %expr, %node, "eviction sweeps scheduled");
    let mut ticks = Box::pin(apalis_cron::CronScheduler::new(schedule).into_stream());
    while let Some(tick) = ticks.next().await {
        let tick = match tick {
            Ok(t) => t,
            Err(e) => {
                warn!(error = %e, "eviction schedule tick failed");
                continue;
            }
        };
        let Some(at) = Utc.timestamp_opt(tick.get_timestamp() as i64, 0).single() else {
            continue;
        };
        let id = cron_command_id(&node, at);
        let sweep = EvictSweep {
            node: node.clone(),
            tick: Some(at),
            now: None,
            trigger: SweepTrigger::Cron,
        };
        match enqueue_sweep(&deps, id, sweep).await {
            Ok(inserted) => tracing::debug!(tick = %at, inserted, "eviction sweep enqueued"),
            Err(e) => warn!(error = %e, "enqueueing the scheduled eviction sweep failed"),
        }
    }
}

/// After an acquire: when the node's usage (with the new workspace) is above high water,
/// enqueues an on-demand sweep (at most one per node and minute).
pub(crate) async fn after_acquire(deps: &Deps, handled: &Handled) {
    let Ok(CommandResult::Workspace(row)) = &handled.result else {
        return;
    };
    let created: i64 = handled
        .events
        .iter()
        .map(|e| match e {
            Event::WorkspaceCreated { size_bytes, .. }
            | Event::WorkspaceRestored { size_bytes, .. } => *size_bytes,
            _ => 0,
        })
        .sum();
    if created == 0 {
        return;
    }
    let used: Result<Option<i64>, sqlx::Error> = sqlx::query_scalar(
        "SELECT ((SELECT coalesce(sum(size_bytes), 0) FROM grove.sandbox_workspaces WHERE node = $1 AND state <> 'evicted')
              + (SELECT coalesce(sum(size_bytes), 0) FROM grove.sandbox_repo_caches WHERE node = $1 AND state <> 'evicted'))::bigint",
    )
    .bind(&row.node)
    .fetch_one(&deps.pool)
    .await;
    let used = match used {
        Ok(Some(used)) => used,
        Ok(None) => 0,
        Err(e) => {
            warn!(error = %e, "reading the node's usage after an acquire failed");
            return;
        }
    };
    let marks = deps
        .config
        .eviction
        .policy
        .marks(filesystem_bytes(deps.layout.root()));
    // The new workspace's row is not committed yet.
    let used = size(used) + size(created);
    if used <= marks.high_water_bytes {
        return;
    }
    let at = now();
    let id = on_demand_command_id(&row.node, at);
    let sweep = EvictSweep {
        node: row.node.clone(),
        tick: None,
        now: None,
        trigger: SweepTrigger::OnDemand,
    };
    match enqueue_sweep(deps, id, sweep).await {
        Ok(true) => info!(
            used,
            high_water = marks.high_water_bytes,
            "usage above high water: on-demand eviction sweep enqueued"
        ),
        Ok(false) => {}
        Err(e) => warn!(error = %e, "enqueueing an on-demand eviction sweep failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(vars: &[(&str, &str)]) -> Result<EvictionSettings, String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        EvictionSettings::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn budgets_parse_as_bytes_fractions_and_percentages() {
        assert_eq!(parse_budget("1000"), Ok(DiskBudget::Bytes(1000)));
        assert_eq!(parse_budget("20G"), Ok(DiskBudget::Bytes(20_000_000_000)));
        assert_eq!(parse_budget("512MiB"), Ok(DiskBudget::Bytes(512 << 20)));
        assert_eq!(parse_budget("0.5"), Ok(DiskBudget::Fraction(0.5)));
        assert_eq!(parse_budget("25%"), Ok(DiskBudget::Fraction(0.25)));
        assert!(parse_budget("lots").is_err());
        assert!(parse_budget("12parsecs").is_err());
    }

    #[test]
    fn settings_default_to_the_documented_values_and_env_overrides_them() {
        let d = settings(&[]).unwrap();
        assert_eq!(d, EvictionSettings::default());
        assert_eq!(d.schedule.as_deref(), Some("0 */5 * * * *"));
        assert_eq!(d.measure_every, Duration::from_secs(600));
        let s = settings(&[
            ("GROVE_DISK_BUDGET", "10M"),
            ("GROVE_HIGH_WATER", "0.9"),
            ("GROVE_LOW_WATER", "0.5"),
            ("GROVE_PRESSURE_GRACE", "0"),
            ("GROVE_TTL_EDIT", "60"),
            ("GROVE_EVICT_SCHEDULE", "off"),
            ("GROVE_ALLOW_CLOCK_OVERRIDE", "1"),
        ])
        .unwrap();
        assert_eq!(s.policy.disk_budget, DiskBudget::Bytes(10_000_000));
        assert_eq!((s.policy.high_water, s.policy.low_water), (0.9, 0.5));
        assert_eq!(s.policy.pressure_grace_secs, 0);
        assert_eq!(s.policy.workspace_ttl.edit_secs, 60);
        assert_eq!(s.schedule, None);
        assert!(s.allow_clock_override);
        assert!(
            settings(&[("GROVE_LOW_WATER", "0.95")]).is_err(),
            "low above high"
        );
        assert!(settings(&[("GROVE_EVICT_SCHEDULE", "every tuesday")]).is_err());
        assert!(settings(&[("GROVE_TTL_TASK", "0")]).is_err());
    }

    #[test]
    fn one_tick_of_one_node_names_one_command_and_other_ticks_or_nodes_another() {
        let t = Utc.with_ymd_and_hms(2030, 1, 1, 0, 5, 0).unwrap();
        assert_eq!(cron_command_id("n1", t), cron_command_id("n1", t));
        assert_ne!(cron_command_id("n1", t), cron_command_id("n2", t));
        assert_ne!(
            cron_command_id("n1", t),
            cron_command_id("n1", t + chrono::Duration::minutes(5))
        );
        assert_eq!(
            on_demand_command_id("n1", t),
            on_demand_command_id("n1", t + chrono::Duration::seconds(59))
        );
        assert_ne!(on_demand_command_id("n1", t), cron_command_id("n1", t));
    }
}
