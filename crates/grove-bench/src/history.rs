//! Workspace history (ADR 28) on the 5,000-file fixture: a mutating exec with history
//! on next to the same exec with history off (`history_exec`), `fork` at a point next to
//! `workspace_create` (`history_fork`), and a rewind of a change to 100 files next to
//! writing those files directly (`history_rewind_100`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use grove_core::commands::{Command, CommandResult};
use grove_core::tools::{ToolOp, ToolOutput, ToolRequest};
use serde_json::json;
use uuid::Uuid;

use crate::ctx::{ms, Ctx};
use crate::stats::{latency, pct, round};
use crate::Out;

/// A tool call through the queue, its output.
async fn tool(ctx: &Ctx, ws: Uuid, op: ToolOp) -> Result<ToolOutput> {
    match ctx
        .submit(&Command::Tool(ToolRequest {
            workspace_id: ws,
            op,
        }))
        .await?
    {
        CommandResult::Tool(o) => Ok(o),
        other => bail!("tool returned {other:?}"),
    }
}

/// The timeline's last point number.
async fn last_point(ctx: &Ctx, ws: Uuid) -> Result<u64> {
    match tool(
        ctx,
        ws,
        ToolOp::History {
            offset: Some(0),
            limit: Some(1),
        },
    )
    .await?
    {
        ToolOutput::History { total, .. } if total > 0 => Ok(total - 1),
        other => bail!("history returned {other:?}"),
    }
}

/// One file appended to: the mutating exec both sides run.
fn append(i: usize) -> String {
    format!("echo {i} >> bench-history.txt")
}

pub async fn history_exec(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    let ws = ctx.acquire("hist-exec").await?;
    let n = ctx.args.n.max(10);
    let (mut on, mut off) = (vec![], vec![]);
    // Blocks of each setting (the worker restarts between them), twice over.
    for round_no in 0..2 {
        for history in [false, true] {
            ctx.restart_worker(history).await?;
            ctx.exec_write(ws.id, &["sh", "-c", &append(0)]).await?; // warm-up
            for i in 0..n / 2 {
                let t = Instant::now();
                ctx.exec_write(ws.id, &["sh", "-c", &append(round_no * n + i)])
                    .await?;
                if history {
                    on.push(ms(t))
                } else {
                    off.push(ms(t))
                }
            }
        }
    }
    let mut row = latency("history_exec", &on, &off);
    row.insert("floor_is".into(), json!("the same exec, history off"));
    row.insert(
        "added_p50_ms".into(),
        round(pct(&on, 50.0) - pct(&off, 50.0)),
    );
    out.emit(row);
    Ok(())
}

pub async fn history_fork(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    ctx.restart_worker(true).await?;
    let ws = ctx.acquire("hist-fork").await?;
    ctx.exec_write(ws.id, &["sh", "-c", &append(1)]).await?;
    let point = last_point(ctx, ws.id).await?.to_string();
    let n = ctx.args.n.clamp(5, 20);
    let (mut fork, mut create) = (vec![], vec![]);
    for i in 0..n {
        let t = Instant::now();
        let op = ToolOp::Fork {
            point: point.clone(),
            scope: format!("hist-fork-{i}"),
        };
        match tool(ctx, ws.id, op).await? {
            ToolOutput::Forked { .. } => fork.push(ms(t)),
            other => bail!("fork returned {other:?}"),
        }
        let t = Instant::now();
        ctx.acquire(&format!("hist-create-{i}")).await?;
        create.push(ms(t));
    }
    let mut row = latency("history_fork", &fork, &create);
    row.insert(
        "floor_is".into(),
        json!("workspace_create (acquire of a new key)"),
    );
    out.emit(row);
    Ok(())
}

pub async fn history_rewind_100(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    ctx.restart_worker(true).await?;
    let ws = ctx.acquire("hist-rewind").await?;
    let dir = PathBuf::from(&ws.local_path);
    let make = "mkdir -p r && for i in $(seq 1 100); do echo base $i > r/f$i; done";
    ctx.exec_write(ws.id, &["sh", "-c", make]).await?;
    let n = ctx.args.n.clamp(5, 20);
    let (mut rewind, mut floor) = (vec![], vec![]);
    for i in 0..n {
        let base = last_point(ctx, ws.id).await?.to_string();
        let change = format!("for i in $(seq 1 100); do echo change {i} >> r/f$i; done");
        ctx.exec_write(ws.id, &["sh", "-c", &change]).await?;
        let t = Instant::now();
        match tool(ctx, ws.id, ToolOp::Rewind { point: base }).await? {
            ToolOutput::Rewound {
                files_written: 100, ..
            } => rewind.push(ms(t)),
            other => bail!("rewind returned {other:?}"),
        }
        let scratch = ctx.dir.join(format!("rewind-floor-{i}"));
        std::fs::create_dir_all(&scratch)?;
        let t = Instant::now();
        for f in 1..=100 {
            let bytes = std::fs::read(dir.join(format!("r/f{f}")))?;
            std::fs::write(scratch.join(format!("f{f}")), bytes)?;
        }
        floor.push(ms(t));
        std::fs::remove_dir_all(&scratch)?;
    }
    let mut row = latency("history_rewind_100", &rewind, &floor);
    row.insert(
        "floor_is".into(),
        json!("read and write the 100 files directly"),
    );
    out.emit(row);
    Ok(())
}
