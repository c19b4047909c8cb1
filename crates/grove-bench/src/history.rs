//! Workspace history (ADR 28) on the 5,000-file fixture: a mutating exec with history
//! on next to the same exec with history off (`history_exec`, and `history_exec_50k` on
//! a 50,000-file tree), `fork` at a point next to `workspace_create` (`history_fork`), a
//! rewind of a change to 100 files next to writing those files directly
//! (`history_rewind_100`), and the store's size after 1,000 one-file changes next to
//! the changed bytes (`history_storage_1000`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Result};
use grove_core::commands::{Command, CommandResult, EvictSweep};
use grove_core::sweep::SweepTrigger;
use grove_core::tools::{ToolOp, ToolOutput, ToolRequest};
use serde_json::{json, Map, Value};
use uuid::Uuid;

use crate::ctx::{ms, Ctx, NODE};
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

/// Blocks of `n / 2` appends with history off, then on (the worker restarts between
/// them), twice over: the samples (ms) with history on and off.
async fn exec_blocks(ctx: &mut Ctx, ws: Uuid, n: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    let (mut on, mut off) = (vec![], vec![]);
    for round_no in 0..2 {
        for history in [false, true] {
            ctx.restart_worker(history).await?;
            ctx.exec_write(ws, &["sh", "-c", &append(0)]).await?; // warm-up
            for i in 0..n / 2 {
                let t = Instant::now();
                ctx.exec_write(ws, &["sh", "-c", &append(round_no * n + i)])
                    .await?;
                if history {
                    on.push(ms(t))
                } else {
                    off.push(ms(t))
                }
            }
        }
    }
    Ok((on, off))
}

/// The row of an exec with history on next to the same exec with it off.
fn exec_row(name: &str, on: &[f64], off: &[f64]) -> Map<String, Value> {
    let mut row = latency(name, on, off);
    row.insert("floor_is".into(), json!("the same exec, history off"));
    row.insert("added_p50_ms".into(), round(pct(on, 50.0) - pct(off, 50.0)));
    row
}

pub async fn history_exec(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    let ws = ctx.acquire("hist-exec").await?;
    let n = ctx.args.n.max(10);
    let (on, off) = exec_blocks(ctx, ws.id, n).await?;
    out.emit(exec_row("history_exec", &on, &off));
    Ok(())
}

/// Files in the tree of `history_exec_50k`.
const BIG_FILES: usize = 50_000;

/// `history_exec` on a tree of 50,000 files (a repository and cache of its own): with
/// history on a point's walk answers `dirty`, with it off `git status` does.
pub async fn history_exec_50k(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    let dir = ctx.dir.join("big");
    std::fs::create_dir_all(&dir)?;
    let t = Instant::now();
    let upstream = crate::fixture::generate_repo(&dir, BIG_FILES, 1)?;
    let generate_s = ms(t) / 1000.0;
    let url = format!("file://{}", upstream.display());
    ctx.restart_worker(true).await?;
    let t = Instant::now();
    let ws = ctx.acquire_of("hist-exec-50k", "bench/big", &url).await?;
    let create_s = ms(t) / 1000.0;
    let n = ctx.args.n.clamp(10, 20);
    let (on, off) = exec_blocks(ctx, ws.id, n).await?;
    let mut row = exec_row("history_exec_50k", &on, &off);
    row.insert("files".into(), json!(BIG_FILES));
    row.insert("generate_s".into(), round(generate_s));
    row.insert("create_s".into(), round(create_s));
    out.emit(row);
    Ok(())
}

/// Execs of `history_storage_1000`.
const STORAGE_EXECS: usize = 1000;

/// 1,000 execs each appending a line to a different file of the fixture, with history
/// on; the store's bytes on disk after them (loose, then packed by an eviction sweep)
/// next to the sum of the changed files' sizes (the bytes a point must newly hold).
pub async fn history_storage_1000(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    ctx.restart_worker(true).await?;
    let ws = ctx.acquire("hist-storage").await?;
    let dir = PathBuf::from(&ws.local_path);
    let store = store_of(&ctx.home, ws.id)?;
    let before = disk_bytes(&store)?;
    let files = ctx.args.files.max(1);
    let (mut changed, mut execs) = (0u64, vec![]);
    for i in 0..STORAGE_EXECS {
        // A stride prime to the file count: each exec a file no earlier one changed.
        let path = crate::fixture::path_of((i * 7919) % files);
        let t = Instant::now();
        let cmd = format!("echo 'edit {i}' >> {path}");
        ctx.exec_write(ws.id, &["sh", "-c", &cmd]).await?;
        execs.push(ms(t));
        changed += std::fs::metadata(dir.join(&path))?.len();
    }
    let loose = disk_bytes(&store)?;
    let t = Instant::now();
    sweep(ctx).await?;
    let sweep_ms = ms(t);
    let packed = disk_bytes(&store)?;
    let grown = |b: Bytes| (b.allocated - before.allocated) as f64;
    let mut row = Map::new();
    row.insert("name".into(), json!("history_storage_1000"));
    row.insert("n".into(), json!(STORAGE_EXECS));
    row.insert("grove_p50_ms".into(), round(pct(&execs, 50.0)));
    row.insert("grove_p99_ms".into(), round(pct(&execs, 99.0)));
    row.insert("ratio".into(), round(grown(packed) / changed as f64));
    row.insert(
        "floor_is".into(),
        json!("the bytes of the changed files (each file's size after its exec)"),
    );
    row.insert("changed_bytes".into(), json!(changed));
    row.insert(
        "store_loose_bytes".into(),
        json!(loose.allocated - before.allocated),
    );
    row.insert(
        "store_loose_apparent".into(),
        json!(loose.apparent - before.apparent),
    );
    row.insert("ratio_loose".into(), round(grown(loose) / changed as f64));
    row.insert(
        "store_packed_bytes".into(),
        json!(packed.allocated - before.allocated),
    );
    row.insert(
        "store_packed_apparent".into(),
        json!(packed.apparent - before.apparent),
    );
    row.insert("sweep_ms".into(), round(sweep_ms));
    out.emit(row);
    Ok(())
}

/// A manual eviction sweep of the node (it packs history stores with many loose
/// objects).
async fn sweep(ctx: &Ctx) -> Result<()> {
    let cmd = Command::EvictSweep(EvictSweep {
        node: NODE.into(),
        tick: None,
        now: None,
        trigger: SweepTrigger::Manual,
    });
    match ctx.submit(&cmd).await? {
        CommandResult::Sweep(_) => Ok(()),
        other => bail!("evict_sweep returned {other:?}"),
    }
}

/// The history store of workspace `id` under `$GROVE_HOME/history/<user>/`.
fn store_of(home: &Path, id: Uuid) -> Result<PathBuf> {
    for user in std::fs::read_dir(home.join("history"))? {
        let candidate = user?.path().join(id.to_string());
        if candidate.is_dir() {
            return Ok(candidate);
        }
    }
    bail!("no history store for workspace {id}")
}

/// A tree's size: blocks allocated (what `du` reports) and the files' lengths.
#[derive(Clone, Copy)]
struct Bytes {
    allocated: u64,
    apparent: u64,
}

fn disk_bytes(dir: &Path) -> Result<Bytes> {
    use std::os::unix::fs::MetadataExt;
    let mut total = Bytes {
        allocated: 0,
        apparent: 0,
    };
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_dir() {
            let sub = disk_bytes(&entry.path())?;
            total.allocated += sub.allocated;
            total.apparent += sub.apparent;
        }
        total.allocated += meta.blocks() * 512;
        total.apparent += meta.len();
    }
    Ok(total)
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
