//! The `eviction_sweep` cases: one node's sweep over many workspace records, most of
//! them without work to do, some of them real worktrees it must evict.
//!
//! The node holds `sweep_real` real workspaces made through the queue (four in five
//! edit, one in five task) and enough further records (`workspace.created` events whose
//! directories exist but are empty) to reach `sweep_records`. Two measurements:
//! - `eviction_sweep_steady`: a sweep that finds nothing to do (the default policy, the
//!   worker's clock), repeated, next to its floor: reading the node's workspace rows
//!   and `stat`ing each one's directory, the least any sweep must do;
//! - `eviction_sweep_ttl`: one sweep with the clock four days ahead, so every clean
//!   task workspace is past its TTL (3 days) and every idle runtime is stopped, next
//!   to the floor of deleting the same directories with `rm -rf`, measured on copies
//!   made with `cp -a` (so it is the same tree of files).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use grove_core::commands::{AcquireWorkspace, Command, CommandResult, EvictSweep};
use grove_core::events::{Correlation, Event, Metadata};
use grove_core::eviction::ActionKind;
use grove_core::model::{Capabilities, WorkspaceMode, WorkspaceRow};
use grove_core::sweep::{ActionOutcome, SweepReport, SweepTrigger};
use serde_json::json;
use uuid::Uuid;

use crate::ctx::{ms, run_cmd, Ctx, NODE, REPO};
use crate::stats::{latency, round};
use crate::Out;

/// Records per `workspace.created` batch appended in one transaction.
const BATCH: usize = 500;

async fn sweep(ctx: &Ctx, now: Option<chrono::DateTime<chrono::Utc>>) -> Result<SweepReport> {
    let cmd = Command::EvictSweep(EvictSweep {
        node: NODE.into(),
        tick: None,
        now,
        trigger: SweepTrigger::Manual,
    });
    match ctx.client.submit(&cmd).await? {
        CommandResult::Sweep(r) => Ok(r),
        other => bail!("evict_sweep returned {other:?}"),
    }
}

/// Task workspaces `t0..t{count}` made through the queue.
async fn task_workspaces(ctx: &Ctx, count: usize) -> Result<Vec<WorkspaceRow>> {
    use futures::StreamExt;
    let made: Vec<Result<WorkspaceRow>> = futures::stream::iter(0..count)
        .map(|i| async move {
            let cmd = Command::AcquireWorkspace(AcquireWorkspace {
                user_id: "u1".into(),
                project_id: "p1".into(),
                repo_name: REPO.into(),
                repo_url: ctx.url.clone(),
                base_ref: "main".into(),
                mode: WorkspaceMode::Task,
                conversation_id: None,
                task_id: Some(format!("t{i}")),
                runtime: None,
                history_ignored: false,
            });
            match ctx.client.submit(&cmd).await? {
                CommandResult::Workspace(row) => Ok(row),
                other => bail!("acquire returned {other:?}"),
            }
        })
        .buffered(4)
        .collect()
        .await;
    made.into_iter().collect()
}

/// `count` edit-workspace records on the bench node whose directories exist, empty.
async fn record_only_workspaces(ctx: &Ctx, count: usize) -> Result<()> {
    let cache = ctx.warm_cache().await?;
    let root = ctx.dir.join("records");
    let mut done = 0;
    while done < count {
        let n = BATCH.min(count - done);
        let mut events = Vec::with_capacity(n);
        for i in done..done + n {
            let dir = root.join(format!("r{i}"));
            std::fs::create_dir_all(&dir)?;
            events.push(Event::WorkspaceCreated {
                workspace_id: Uuid::new_v4(),
                repo_cache_id: cache.id,
                node: NODE.into(),
                user_id: "records".into(),
                project_id: "p1".into(),
                mode: WorkspaceMode::Edit,
                conversation_id: Some(format!("r{i}")),
                task_id: None,
                base_ref: "main".into(),
                base_commit: "0".repeat(40),
                branch_name: Some(format!("agent/edits-r{i}")),
                local_path: dir.to_string_lossy().into_owned(),
                capabilities: Capabilities::from_mode(WorkspaceMode::Edit),
                size_bytes: 4096,
                history_ignored: false,
            });
        }
        let md = Metadata {
            command_id: Uuid::now_v7(),
            correlation: Correlation::default(),
            worker_id: "grove-bench".into(),
            node: NODE.into(),
        };
        let mut tx = ctx.pool.begin().await?;
        grove_postgres::store::append(&mut tx, &events, &md, grove_workers::context::now()).await?;
        tx.commit().await?;
        done += n;
    }
    Ok(())
}

/// The floor of a sweep that finds nothing: the node's rows, and a `stat` of each
/// workspace directory.
async fn inventory_floor(ctx: &Ctx) -> Result<f64> {
    let t = Instant::now();
    let paths: Vec<String> =
        sqlx::query_scalar("SELECT local_path FROM grove.sandbox_workspaces WHERE node = $1")
            .bind(NODE)
            .fetch_all(&ctx.pool)
            .await?;
    let _runtimes: i64 =
        sqlx::query_scalar("SELECT count(*) FROM grove.sandbox_runtimes r JOIN grove.sandbox_workspaces w ON w.id = r.workspace_id WHERE w.node = $1")
            .bind(NODE)
            .fetch_one(&ctx.pool)
            .await?;
    let present = tokio::task::spawn_blocking(move || {
        paths
            .iter()
            .filter(|p| std::path::Path::new(p).is_dir())
            .count()
    })
    .await?;
    std::hint::black_box(present);
    Ok(ms(t))
}

pub async fn eviction_sweep(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    let real = ctx.args.sweep_real;
    let tasks = real / 5;
    let records = ctx.args.sweep_records.max(real);
    let t = Instant::now();
    ctx.workspaces_at_least(real - tasks).await?;
    let task_rows = task_workspaces(ctx, tasks).await?;
    let have: i64 =
        sqlx::query_scalar("SELECT count(*) FROM grove.sandbox_workspaces WHERE node = $1")
            .bind(NODE)
            .fetch_one(&ctx.pool)
            .await?;
    record_only_workspaces(ctx, records.saturating_sub(have as usize)).await?;
    let total: i64 =
        sqlx::query_scalar("SELECT count(*) FROM grove.sandbox_workspaces WHERE node = $1")
            .bind(NODE)
            .fetch_one(&ctx.pool)
            .await?;
    let setup_s = t.elapsed().as_secs_f64();

    // A first sweep measures what was never measured; the steady state starts after it.
    sweep(ctx, None).await?;
    let (mut grove, mut floor) = (vec![], vec![]);
    let mut last = None;
    for _ in 0..ctx.args.sweep_n.max(1) {
        let t = Instant::now();
        let report = sweep(ctx, None).await?;
        grove.push(ms(t));
        floor.push(inventory_floor(ctx).await?);
        last = Some(report);
    }
    let last = last.context("no sweep ran")?;
    if !last.actions.is_empty() {
        bail!(
            "a steady sweep planned {} actions; expected none",
            last.actions.len()
        );
    }
    let mut row = latency("eviction_sweep_steady", &grove, &floor);
    row.insert(
        "floor_is".into(),
        json!("SELECT the node's rows + stat each directory"),
    );
    row.insert("workspace_records".into(), json!(total));
    row.insert(
        "real_worktrees".into(),
        json!(real - tasks + task_rows.len()),
    );
    row.insert("worker_ms".into(), json!(last.duration_ms));
    row.insert("setup_s".into(), round(setup_s));
    out.emit(row);

    // The floor of the TTL sweep: `rm -rf` of copies of the directories it will evict.
    let copies = ctx.dir.join("rm-floor");
    std::fs::create_dir_all(&copies)?;
    let mut copied: Vec<PathBuf> = Vec::new();
    for (i, ws) in task_rows.iter().enumerate() {
        let dst = copies.join(format!("c{i}"));
        run_cmd("cp", &["-a", &ws.local_path, &dst.to_string_lossy()], None).await?;
        copied.push(dst);
    }
    let t = Instant::now();
    for dir in &copied {
        run_cmd("rm", &["-rf", &dir.to_string_lossy()], None).await?;
    }
    let rm_ms = ms(t);

    let ahead = chrono::Utc::now() + chrono::Duration::days(4);
    let t = Instant::now();
    let report = sweep(ctx, Some(ahead)).await?;
    let ttl_ms = ms(t);
    let evicted = report
        .actions
        .iter()
        .filter(|a| {
            matches!(a.action.kind, ActionKind::EvictWorkspace { .. })
                && a.outcome == ActionOutcome::Done
        })
        .count();
    let stopped = report
        .actions
        .iter()
        .filter(|a| a.action.kind == ActionKind::StopRuntime && a.outcome == ActionOutcome::Done)
        .count();
    if evicted != task_rows.len() {
        bail!(
            "the TTL sweep evicted {evicted} workspaces; expected the {} clean task ones",
            task_rows.len()
        );
    }
    let gone = task_rows
        .iter()
        .filter(|w| !std::path::Path::new(&w.local_path).exists())
        .count();
    let mut row = latency("eviction_sweep_ttl", &[ttl_ms], &[rm_ms]);
    row.insert(
        "floor_is".into(),
        json!("rm -rf of copies of the evicted directories"),
    );
    row.insert("workspace_records".into(), json!(total));
    row.insert("evicted".into(), json!(evicted));
    row.insert("directories_gone".into(), json!(gone));
    row.insert("runtimes_stopped".into(), json!(stopped));
    row.insert("bytes_freed".into(), json!(report.bytes_freed()));
    row.insert("worker_ms".into(), json!(report.duration_ms));
    out.emit(row);
    Ok(())
}
