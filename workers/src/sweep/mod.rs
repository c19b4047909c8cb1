//! The eviction sweep of a node around `grove_core::eviction::plan`, by phase:
//! [`inventory`] (the plan's inputs), [`reconcile`] (trash, interrupted evictions,
//! measurement, health), [`act`] (the plan's actions under their locks) and
//! [`schedule`] (when sweeps run). Settings are in [`crate::config`].
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
//!    waiting long ([`TRY_LOCK`](crate::context::TRY_LOCK)) — after its guards are checked again; an action whose
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

use std::collections::HashSet;
use std::time::Instant;

use grove_core::commands::{CommandResult, EvictSweep};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::events::{Correlation, Event};
use grove_core::eviction::{plan, Action, Plan, WorkspaceActivity};
use grove_core::sweep::{ActionOutcome, ActionRecord, SweepReport, SweepTrigger};
use grove_postgres::locks::{AdvisoryLock, LockScope};
use tracing::info;
use uuid::Uuid;

use crate::context::{now, store_error, try_lock, Handled, JobContext};

mod act;
pub mod inventory;
mod reconcile;
pub mod schedule;

pub use inventory::{describe, filesystem_bytes, load_node, NodeState};
pub use schedule::{cron_command_id, on_demand_command_id, SWEEP_NAMESPACE};

use act::Ended;

/// Plans per sweep at most (the first, plus re-plans after skipped or failed actions).
pub const MAX_ROUNDS: u32 = 8;

impl JobContext {
    /// `evict_sweep`: see the module documentation.
    pub async fn evict_sweep(
        &self,
        c: &EvictSweep,
        command_id: Uuid,
    ) -> Result<Handled, CommandError> {
        let started = Instant::now();
        self.check_sweep(c)?;
        let plan_now = c.now.unwrap_or_else(now);
        let mut report = SweepReport {
            node: c.node.clone(),
            now: plan_now,
            tick: c.tick,
            trigger: c.trigger,
            skipped: None,
            marks: self
                .config
                .eviction
                .policy
                .marks(filesystem_bytes(self.home())),
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
        let (last_plan, unhealthy) = self.plan_and_act(c, command_id, &mut report).await?;
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
        settle(&mut report, after.inventory.used_bytes, last_plan);
        self.prune_histories(command_id, plan_now).await;
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

    /// Refuses a sweep of another node, and a clock override this worker does not allow.
    fn check_sweep(&self, c: &EvictSweep) -> Result<(), CommandError> {
        if c.node != self.config.node {
            return Err(CommandError::new(
                ErrorKind::InvalidInput,
                format!(
                    "this worker serves node {}, not {}",
                    self.config.node, c.node
                ),
            ));
        }
        if c.now.is_some() && !self.config.eviction.allow_clock_override {
            return Err(CommandError::new(
                ErrorKind::InvalidInput,
                "a sweep with a clock override needs a worker started with GROVE_ALLOW_CLOCK_OVERRIDE=1",
            ));
        }
        Ok(())
    }

    /// Plans and acts up to [`MAX_ROUNDS`] times, re-planning without the targets whose
    /// actions were not performed. Returns the last plan and the unhealthy runtimes.
    async fn plan_and_act(
        &self,
        c: &EvictSweep,
        command_id: Uuid,
        report: &mut SweepReport,
    ) -> Result<(Option<Plan>, HashSet<Uuid>), CommandError> {
        let mut excluded: HashSet<Uuid> = HashSet::new();
        let mut unhealthy: HashSet<Uuid> = HashSet::new();
        let mut last_plan: Option<Plan> = None;
        for round in 1..=MAX_ROUNDS {
            report.rounds = round;
            let mut state = load_node(
                &self.pool,
                &c.node,
                self.home(),
                report.now,
                Some(command_id),
                &unhealthy,
            )
            .await
            .map_err(store_error)?;
            if round == 1 {
                unhealthy = self.health_checks(&state).await;
                for rt in &mut state.inventory.runtimes {
                    rt.healthy = !unhealthy.contains(&rt.id);
                }
            }
            for ws in &mut state.inventory.workspaces {
                if excluded.contains(&ws.id) && ws.state == WorkspaceActivity::Ready {
                    ws.state = WorkspaceActivity::Busy;
                }
            }
            let p = plan(&self.config.eviction.policy, &state.inventory);
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
            let replan = self
                .act_round(command_id, actions, &state, &mut excluded, report)
                .await;
            if !(replan && round < MAX_ROUNDS) {
                break;
            }
        }
        Ok((last_plan, unhealthy))
    }

    /// Carries out one plan's actions; true when one was not performed (a re-plan may
    /// free what it would have). The rest of the plan still holds: a skipped eviction
    /// only leaves usage higher than projected, so later actions never over-evict.
    async fn act_round(
        &self,
        command_id: Uuid,
        actions: Vec<Action>,
        state: &NodeState,
        excluded: &mut HashSet<Uuid>,
        report: &mut SweepReport,
    ) -> bool {
        let mut replan = false;
        for action in actions {
            let ended = match self.perform(command_id, &action, state).await {
                Ok(ended) => ended,
                Err(e) => Ended::failed(e.message),
            };
            let ok = ended.outcome == ActionOutcome::Done;
            if !ok {
                info!(action = ?action.kind, id = %action.id, outcome = ?ended.outcome, detail = ?ended.detail, "eviction action not performed");
                if ended.exclude {
                    excluded.insert(action.id);
                }
                replan = true;
            }
            report.actions.push(ActionRecord {
                action,
                outcome: ended.outcome,
                detail: ended.detail,
            });
        }
        replan
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
}

/// Fills the end of the report: usage after, the shortfall below low water when the
/// node was under pressure, and the targets the last plan found blocked.
fn settle(report: &mut SweepReport, used_after: u64, last_plan: Option<Plan>) {
    report.used_bytes_after = used_after;
    report.shortfall_bytes = if report.under_pressure {
        used_after.saturating_sub(report.marks.low_water_bytes)
    } else {
        0
    };
    report.budget_met = report.shortfall_bytes == 0;
    let mut blocked = last_plan.map(|p| p.blocked).unwrap_or_default();
    report.blocked_total = blocked.len() as u64;
    blocked.truncate(grove_core::sweep::MAX_BLOCKED_IN_REPORT);
    report.blocked = blocked;
}
