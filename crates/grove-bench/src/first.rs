//! `first_workspace_file` / `first_workspace_http`: an agent's first workspace of a
//! repository grove has never seen (one acquire: clone into the cache, then the
//! checkout) next to `git clone --mirror` plus `git worktree add` of the same URL in the
//! same run; and `worker_rss_after_jobs`: this process (the in-process worker) before
//! and after a run of mixed jobs, and after an idle wait.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use grove_core::commands::{AcquireWorkspace, Command, CommandResult};
use grove_core::model::WorkspaceMode;
use grove_core::tools::{ToolOp, ToolRequest};
use serde_json::json;

use crate::ctx::{ms, Ctx};
use crate::stats::{latency, round};
use crate::transfer::{floor_git, rss_kib, Remote, TOKEN};
use crate::Out;

/// The cases this module runs.
pub const CASES: [&str; 3] = [
    "first_workspace_file",
    "first_workspace_http",
    "worker_rss_after_jobs",
];

/// Runs every selected case of this module.
pub async fn first_cases(ctx: &mut Ctx, out: &mut Out, wants: &dyn Fn(&str) -> bool) -> Result<()> {
    if !CASES.iter().any(|c| wants(c)) {
        return Ok(());
    }
    if wants(CASES[0]) || wants(CASES[1]) {
        first_workspace(ctx, out).await?;
    }
    if wants(CASES[2]) {
        rss_after_jobs(ctx, out).await?;
    }
    Ok(())
}

/// One acquire of a fresh repository alias per iteration and transport, each next to
/// the git CLI's clone and worktree of another fresh alias.
async fn first_workspace(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    let remote = Remote::start(ctx, "srv-first")?;
    let branch = remote.head_branch()?;
    let (mut g_file, mut f_file, mut g_http, mut f_http) = (vec![], vec![], vec![], vec![]);
    for i in 0..ctx.args.cache_n.max(1) {
        let (file_url, http_url) = remote.alias(&format!("fw-{i}"))?;
        let t = Instant::now();
        acquire_new(ctx, &format!("bench/fwf{i}"), &file_url, &branch, None).await?;
        g_file.push(ms(t));
        f_file.push(floor(ctx, &format!("fwf-{i}"), &file_url, &branch, true).await?);
        let t = Instant::now();
        acquire_new(
            ctx,
            &format!("bench/fwh{i}"),
            &http_url,
            &branch,
            Some(TOKEN),
        )
        .await?;
        g_http.push(ms(t));
        f_http.push(floor(ctx, &format!("fwh-{i}"), &http_url, &branch, false).await?);
    }
    for (name, grove, floor, how) in [
        (
            "first_workspace_file",
            &g_file,
            &f_file,
            "--no-local, file://",
        ),
        (
            "first_workspace_http",
            &g_http,
            &f_http,
            "smart HTTP, loopback",
        ),
    ] {
        let mut row = latency(name, grove, floor);
        row.insert(
            "floor_is".into(),
            json!(format!("git clone --mirror + git worktree add ({how})")),
        );
        out.emit(row);
    }
    Ok(())
}

/// An edit workspace of `repo_name` at `url` (which no cache holds yet) on `branch`.
async fn acquire_new(
    ctx: &Ctx,
    repo_name: &str,
    url: &str,
    branch: &str,
    token: Option<&str>,
) -> Result<()> {
    let cmd = Command::AcquireWorkspace(AcquireWorkspace {
        user_id: "u1".into(),
        project_id: "p1".into(),
        repo_name: repo_name.into(),
        repo_url: url.into(),
        base_ref: branch.into(),
        mode: WorkspaceMode::Edit,
        conversation_id: Some(repo_name.replace('/', "-")),
        task_id: None,
        runtime: None,
        history_ignored: false,
    });
    match ctx.client.submit_with_token(&cmd, token).await? {
        CommandResult::Workspace(_) => Ok(()),
        other => bail!("acquire returned {other:?}"),
    }
}

/// The floor's time in milliseconds: a mirror clone of `url` and a worktree of `branch`.
async fn floor(ctx: &Ctx, name: &str, url: &str, branch: &str, no_local: bool) -> Result<f64> {
    let mirror = ctx.dir.join(format!("floor-{name}.git"));
    let tree = ctx.dir.join(format!("floor-{name}-tree"));
    let (m, w) = (mirror.to_str().unwrap(), tree.to_str().unwrap());
    let mut clone = vec!["clone", "--mirror", "-q"];
    if no_local {
        clone.push("--no-local");
    }
    clone.extend([url, m]);
    let t = Instant::now();
    floor_git(&clone).await?;
    floor_git(&[
        "-C",
        m,
        "worktree",
        "add",
        "-q",
        "-b",
        "agent/first",
        w,
        branch,
    ])
    .await?;
    let took = ms(t);
    std::fs::remove_dir_all(&tree)?;
    std::fs::remove_dir_all(&mirror)?;
    Ok(took)
}

/// Jobs in each round of [`rss_after_jobs`]: a kind-read exec, a kind-write exec, a
/// file write, a queued read, a warm acquire, a second ensure.
const MIX: usize = 6;

/// RSS of this process before, right after `jobs` mixed jobs (rounded up to whole
/// rounds of [`MIX`]), and after the idle wait.
async fn rss_after_jobs(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    ctx.workspaces_at_least(1).await?;
    let ws = ctx.workspaces[0].id;
    let conversation = "w0";
    let before = rss_kib();
    let rounds = ctx.args.rss_jobs.div_ceil(MIX);
    let t = Instant::now();
    for i in 0..rounds {
        ctx.exec(ws, "local", &["true"]).await?;
        ctx.exec_write(ws, &["sh", "-c", "echo x > rss-bench.txt"])
            .await?;
        tool(
            ctx,
            ws,
            ToolOp::WriteFile {
                path: "rss-bench-tool.txt".into(),
                content: format!("round {i}\n"),
            },
        )
        .await?;
        tool(
            ctx,
            ws,
            ToolOp::ReadFile {
                path: "rss-bench-tool.txt".into(),
            },
        )
        .await?;
        ctx.acquire(conversation).await?;
        ctx.warm_cache().await?;
    }
    let wall_s = t.elapsed().as_secs_f64();
    let after = rss_kib();
    let idle = Duration::from_secs(ctx.args.rss_idle_secs);
    tokio::time::sleep(idle).await;
    let mut row = serde_json::Map::new();
    row.insert("name".into(), json!("worker_rss_after_jobs"));
    row.insert("jobs".into(), json!(rounds * MIX));
    row.insert("rss_before_mib".into(), round(before as f64 / 1024.0));
    row.insert("rss_after_jobs_mib".into(), round(after as f64 / 1024.0));
    row.insert(
        "rss_after_idle_mib".into(),
        round(rss_kib() as f64 / 1024.0),
    );
    row.insert("idle_secs".into(), json!(idle.as_secs()));
    row.insert("wall_s".into(), round(wall_s));
    row.insert(
        "measured".into(),
        json!("bench process: in-process worker + client"),
    );
    out.emit(row);
    Ok(())
}

async fn tool(ctx: &Ctx, ws: uuid::Uuid, op: ToolOp) -> Result<()> {
    let cmd = Command::Tool(ToolRequest {
        workspace_id: ws,
        op,
    });
    match ctx.client.submit(&cmd).await? {
        CommandResult::Tool(_) => Ok(()),
        other => bail!("tool returned {other:?}"),
    }
}
