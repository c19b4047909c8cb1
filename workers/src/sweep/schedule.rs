//! When sweeps run: the command ids of scheduled and on-demand sweeps, the cron loop
//! that enqueues one sweep per node and tick, and the on-demand sweep after an acquire
//! that crossed high water.

use std::str::FromStr;
use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use futures::StreamExt;
use grove_core::commands::{Command, CommandResult, EvictSweep};
use grove_core::events::Event;
use grove_core::sweep::SweepTrigger;
use grove_postgres::{queue, StoreError};
use tracing::{info, warn};
use uuid::Uuid;

use super::inventory::{filesystem_bytes, size};
use crate::context::{now, Handled, JobContext};

/// Namespace of the command ids derived for scheduled and on-demand sweeps.
pub const SWEEP_NAMESPACE: Uuid = Uuid::from_u128(0x8d6e_2f3a_51c4_4b0e_9f27_6772_6f76_6565);

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

async fn enqueue_sweep(
    deps: &JobContext,
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
pub(crate) async fn cron_loop(deps: Arc<JobContext>) {
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
pub(crate) async fn after_acquire(deps: &JobContext, handled: &Handled) {
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
    let used = match grove_postgres::worker_queries::node_usage_bytes(&deps.pool, &row.node).await {
        Ok(used) => used,
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
