//! `agent_calls`: the calls an agent makes most, over HTTP with a kept-alive client
//! (`grove serve`'s API in this process, its worker answering reads inline, ADR 24) and
//! through the CLI against that server (`GROVE_URL`), at each fleet size of
//! `--fleets`, each next to its floor in the same run: read_file and write_file next to
//! reading and writing the file, an exec of `true` (kind write and read) next to
//! spawning `true`, a new workspace next to `git worktree add`, and warm acquire and a
//! second ensure next to the same command submitted in-process through the queue.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::cases::worktree_add_floor;
use crate::ctx::{ms, Ctx, REPO};
use crate::http::{first_file, Api};
use crate::stats::{latency, round, skipped};
use crate::Out;

/// 88 bytes, the size the latency issue measured a file write with.
const WRITTEN: &str =
    "fn written_by_the_bench() -> u32 {\n    // eighty-eight bytes, the newlines too\n    42\n}\n";
const _: () = assert!(WRITTEN.len() == 88);

/// A literal the search row looks for.
const SEARCHED: &str = "line 14: ";

/// Rows `call_<call>@<fleet>` and `cli_<call>@<fleet>` for every fleet size.
pub async fn agent_calls(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    for fleet in ctx.args.fleets.clone() {
        ctx.workspaces_at_least(fleet).await?;
        let api = Api::start_as(ctx, true, "u1").await?;
        http_rows(ctx, &api, fleet, out).await?;
        match cli_binary() {
            Some(bin) => cli_rows(ctx, &api, &bin, fleet, out).await?,
            None => out.emit(skipped(
                &format!("cli_read_file@{fleet}"),
                "no `grove` binary beside grove-bench (cargo build -p grove-cli)",
            )),
        }
    }
    Ok(())
}

/// The workspace the calls go to (the newest of the fleet), its id and directory.
fn target(ctx: &Ctx, fleet: usize) -> (uuid::Uuid, PathBuf) {
    let ws = &ctx.workspaces[fleet - 1];
    (ws.id, PathBuf::from(&ws.local_path))
}

async fn http_rows(ctx: &mut Ctx, api: &Api, fleet: usize, out: &mut Out) -> Result<()> {
    let (ws, dir) = target(ctx, fleet);
    let file = first_file(dir.to_str().context("a UTF-8 path")?)?;
    let tools = format!("/v1/workspaces/{ws}/tools");
    let n = ctx.args.calls_n;
    let read = json!({"path": file});
    let write = json!({"path": "bench-call.txt", "content": WRITTEN});
    let (read_path, write_path) = (format!("{tools}/read_file"), format!("{tools}/write_file"));
    let (on_disk, written) = (dir.join(&file), dir.join("bench-call.txt"));
    let row = timed_pair(
        n,
        || api.post(&read_path, read.clone()),
        || read_floor(&on_disk),
    );
    emit(out, "call", "read_file", fleet, row.await?, "open + read");
    let view = json!({"path": file, "range": [1, -1]});
    let view_path = format!("{tools}/view");
    let row = timed_pair(
        n,
        || api.post(&view_path, view.clone()),
        || read_floor(&on_disk),
    );
    emit(out, "call", "view", fleet, row.await?, "open + read");
    search_row(api, &tools, &dir, fleet, n, out).await?;
    let flushes = Flushes::start(ctx).await?;
    let row = timed_pair(
        n,
        || api.post(&write_path, write.clone()),
        || write_floor(&written),
    );
    let row = row.await?;
    let per_call = flushes.per_call(ctx, n + 1).await?;
    emit_counted(out, "write_file", fleet, row, "open + write", per_call);
    let exec_path = format!("/v1/workspaces/{ws}/exec");
    for kind in ["write", "read"] {
        let body = json!({"argv": ["true"], "kind": kind});
        let flushes = Flushes::start(ctx).await?;
        let row = timed_pair(
            n,
            || checked_exec(api, &exec_path, body.clone()),
            spawn_true,
        );
        let row = row.await?;
        let per_call = flushes.per_call(ctx, n + 1).await?;
        emit_counted(
            out,
            &format!("exec_{kind}"),
            fleet,
            row,
            "spawn `true`",
            per_call,
        );
    }
    queued_rows(ctx, api, fleet, out).await?;
    new_workspace_row(ctx, api, fleet, out).await
}

/// `search` of a literal that occurs in the bench's fixture, next to `grep -r` of the
/// same literal over the same tree (every match, `.git` left out as search leaves it).
async fn search_row(
    api: &Api,
    tools: &str,
    dir: &Path,
    fleet: usize,
    n: usize,
    out: &mut Out,
) -> Result<()> {
    let body = json!({"pattern": SEARCHED, "max_results": 1000});
    let path = format!("{tools}/search");
    let row = timed_pair(
        n.min(50),
        || api.post(&path, body.clone()),
        || grep_floor(dir),
    );
    emit(
        out,
        "call",
        "search",
        fleet,
        row.await?,
        "grep -rn of the same literal",
    );
    Ok(())
}

async fn grep_floor(dir: &Path) -> Result<()> {
    let status = tokio::process::Command::new("grep")
        .args(["-rnF", "--exclude-dir=.git", SEARCHED])
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .status()
        .await?;
    // 0: found, 1: not found; 2 or more: an error.
    anyhow::ensure!(
        status.code().is_some_and(|c| c < 2),
        "grep failed: {status}"
    );
    Ok(())
}

/// Warm acquire and a second ensure over HTTP, each next to the same command
/// submitted in-process. Back to back, each finds its use recorded within the worker's
/// recent-use window (ADR 40) unless `GROVE_RECORD_USE_AFTER=0` (every use recorded);
/// the rows say which (`recent_use_window_secs`: 0 records every use).
async fn queued_rows(ctx: &Ctx, api: &Api, fleet: usize, out: &mut Out) -> Result<()> {
    let n = ctx.args.calls_n;
    let conversation = format!("w{}", fleet - 1);
    let session = session_body(ctx, &conversation);
    let row = timed_pair(
        n,
        || api.post("/v1/sessions", session.clone()),
        || async { ctx.acquire(&conversation).await.map(|_| ()) },
    );
    emit(
        out,
        "call",
        "warm_acquire",
        fleet,
        row.await?,
        "the same acquire, in-process",
    );
    let ensure = json!({"repo_name": REPO, "repo_url": ctx.url});
    let row = timed_pair(
        n,
        || api.post("/v1/repo-caches/ensure", ensure.clone()),
        || async { ctx.warm_cache().await.map(|_| ()) },
    );
    emit(
        out,
        "call",
        "second_ensure",
        fleet,
        row.await?,
        "the same ensure, in-process",
    );
    Ok(())
}

/// A new edit workspace over HTTP next to `git worktree add` from the same cache.
async fn new_workspace_row(ctx: &mut Ctx, api: &Api, fleet: usize, out: &mut Out) -> Result<()> {
    let cache_dir = PathBuf::from(&ctx.warm_cache().await?.local_path);
    let (mut grove, mut floor) = (vec![], vec![]);
    for i in 0..ctx.args.n {
        let body = session_body(ctx, &format!("calls-{fleet}-{i}"));
        let t = Instant::now();
        api.post("/v1/sessions", body).await?;
        grove.push(ms(t));
        let dest = ctx.dir.join(format!("floor-calls-{fleet}-{i}"));
        floor.push(worktree_add_floor(&cache_dir, &dest).await?);
    }
    crate::fixture::git(&cache_dir, &["worktree", "prune"])?;
    emit(
        out,
        "call",
        "new_workspace",
        fleet,
        (grove, floor),
        "git worktree add --detach",
    );
    Ok(())
}

fn session_body(ctx: &Ctx, conversation: &str) -> Value {
    json!({
        "project_id": "p1", "repo_name": REPO, "repo_url": ctx.url, "base_ref": "main",
        "mode": "edit", "conversation_id": conversation,
    })
}

/// The CLI against the same server (`GROVE_URL`, `GROVE_TOKEN`): `grove tool` and
/// `grove exec`, each a process start and one request.
async fn cli_rows(ctx: &Ctx, api: &Api, bin: &Path, fleet: usize, out: &mut Out) -> Result<()> {
    let (ws, dir) = target(ctx, fleet);
    let file = first_file(dir.to_str().context("a UTF-8 path")?)?;
    let id = ws.to_string();
    let n = ctx.args.calls_n.min(100);
    let (on_disk, written) = (dir.join(&file), dir.join("bench-cli.txt"));
    let read_args = ["tool", &id, "read", &file];
    let row = timed_pair(n, || run_cli(bin, api, &read_args), || read_floor(&on_disk));
    emit(out, "cli", "read_file", fleet, row.await?, "open + read");
    let write_args = ["tool", &id, "write", "bench-cli.txt", "--content", WRITTEN];
    let row = timed_pair(
        n,
        || run_cli(bin, api, &write_args),
        || write_floor(&written),
    );
    emit(out, "cli", "write_file", fleet, row.await?, "open + write");
    for kind in ["write", "read"] {
        let args = ["exec", &id, "--kind", kind, "--", "true"];
        let row = timed_pair(n, || run_cli(bin, api, &args), spawn_true);
        emit(
            out,
            "cli",
            &format!("exec_{kind}"),
            fleet,
            row.await?,
            "spawn `true`",
        );
    }
    Ok(())
}

/// `n` alternating iterations of grove's call and the floor; their times in ms.
async fn timed_pair<G, GF, T, F, FF>(
    n: usize,
    mut grove: G,
    mut floor: F,
) -> Result<(Vec<f64>, Vec<f64>)>
where
    G: FnMut() -> GF,
    GF: std::future::Future<Output = Result<T>>,
    F: FnMut() -> FF,
    FF: std::future::Future<Output = Result<()>>,
{
    grove().await?; // warm-up: the connection, the runtime, the agent
    let (mut g, mut f) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t = Instant::now();
        grove().await?;
        g.push(ms(t));
        let t = Instant::now();
        floor().await?;
        f.push(ms(t));
    }
    Ok((g, f))
}

/// The server's WAL flushes (`pg_stat_wal.wal_sync`) at the start of a loop of calls,
/// when `--count-flushes` asks for them.
struct Flushes(Option<i64>);

impl Flushes {
    async fn read(ctx: &Ctx) -> Result<i64> {
        // Backends report their WAL counters when idle, at most once a second and at
        // the latest after ten: wait for every report.
        tokio::time::sleep(Duration::from_secs(11)).await;
        Ok(sqlx::query_scalar("SELECT wal_sync FROM pg_stat_wal")
            .fetch_one(&ctx.pool)
            .await?)
    }

    async fn start(ctx: &Ctx) -> Result<Self> {
        if !ctx.args.count_flushes {
            return Ok(Self(None));
        }
        Ok(Self(Some(Self::read(ctx).await?)))
    }

    /// Flushes per call over the `calls` made since the start.
    async fn per_call(self, ctx: &Ctx, calls: usize) -> Result<Option<f64>> {
        let Some(before) = self.0 else {
            return Ok(None);
        };
        let after = Self::read(ctx).await?;
        Ok(Some((after - before) as f64 / calls as f64))
    }
}

/// [`emit`] of an HTTP call's row with its WAL flushes per call, if counted.
fn emit_counted(
    out: &mut Out,
    call: &str,
    fleet: usize,
    times: (Vec<f64>, Vec<f64>),
    floor_is: &str,
    flushes_per_call: Option<f64>,
) {
    let mut row = latency(&format!("call_{call}@{fleet}"), &times.0, &times.1);
    row.insert("floor_is".into(), json!(floor_is));
    row.insert("workspaces".into(), json!(fleet));
    if let Some(f) = flushes_per_call {
        row.insert("wal_flushes_per_call".into(), round(f));
    }
    tag_exec_path(&mut row, call);
    out.emit(row);
}

fn emit(
    out: &mut Out,
    via: &str,
    call: &str,
    fleet: usize,
    times: (Vec<f64>, Vec<f64>),
    floor_is: &str,
) {
    let mut row = latency(&format!("{via}_{call}@{fleet}"), &times.0, &times.1);
    row.insert("floor_is".into(), json!(floor_is));
    row.insert("workspaces".into(), json!(fleet));
    tag_exec_path(&mut row, call);
    if matches!(call, "warm_acquire" | "second_ensure") {
        let settings = grove_workers::config::EvictionSettings {
            record_use_after: crate::ctx::record_use_after(),
            ..Default::default()
        };
        let window = settings.recent_use_window().as_secs();
        row.insert("recent_use_window_secs".into(), json!(window));
    }
    out.emit(row);
}

/// An exec row says which way the in-process server ran its commands: through the exec
/// agent (`grove-sandboxd`, found as the server finds it) or a sandbox per exec, which
/// is several times slower (a bench binary copied without the agent beside it).
fn tag_exec_path(row: &mut serde_json::Map<String, Value>, call: &str) {
    if !call.starts_with("exec_") {
        return;
    }
    let path = match grove_local::LocalRuntimeProvider::find_agent() {
        Ok(agent) => format!("exec agent {}", agent.display()),
        Err(why) => format!("a sandbox per exec ({why})"),
    };
    row.insert("exec_path".into(), json!(path));
}

async fn checked_exec(api: &Api, path: &str, body: Value) -> Result<()> {
    let r = api.post(path, body).await?;
    if r["exit_code"] != 0 {
        bail!("exec over HTTP: {r}");
    }
    Ok(())
}

async fn read_floor(path: &Path) -> Result<()> {
    std::fs::read(path)?;
    Ok(())
}

async fn write_floor(path: &Path) -> Result<()> {
    std::fs::write(path, WRITTEN)?;
    Ok(())
}

async fn spawn_true() -> Result<()> {
    let status = tokio::process::Command::new("true").status().await?;
    anyhow::ensure!(status.success(), "true failed");
    Ok(())
}

/// `grove` beside this binary (cargo builds both into the same directory).
fn cli_binary() -> Option<PathBuf> {
    let bin = std::env::current_exe().ok()?.parent()?.join("grove");
    bin.is_file().then_some(bin)
}

async fn run_cli(bin: &Path, api: &Api, args: &[&str]) -> Result<()> {
    let out = tokio::process::Command::new(bin)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GROVE_URL", &api.base)
        .env("GROVE_TOKEN", &api.token)
        .stdin(std::process::Stdio::null())
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "grove {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
