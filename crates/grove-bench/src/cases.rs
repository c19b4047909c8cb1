//! The cases: each measures grove and its floor in alternating iterations.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use grove_core::commands::Command;
use grove_core::events::{Correlation, Event, Metadata};
use grove_core::model::{Capabilities, WorkspaceMode};
use grove_core::ports::{ExecRequest, Mount, Runtime, RuntimeSpec};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::ctx::{ms, run_cmd, Ctx, RunningWorker, NODE};
use crate::stats::{latency, pct, round, skipped};
use crate::Out;

const TP_NODE: &str = "tp";

pub async fn run_all(ctx: &mut Ctx, out: &mut Out, wants: &dyn Fn(&str) -> bool) -> Result<()> {
    macro_rules! case {
        ($name:expr, $f:expr) => {
            if wants($name) {
                if let Err(e) = $f.await {
                    out.emit(skipped($name, format!("failed: {e:#}")));
                }
            }
        };
    }
    if wants("cache_first") || wants("cache_again") {
        if let Err(e) = cache(ctx, out).await {
            out.emit(skipped("cache_first", format!("failed: {e:#}")));
        }
    }
    case!("workspace_create", workspace_create(ctx, out));
    case!("workspace_warm", workspace_warm(ctx, out));
    case!("exec_local", exec_local(ctx, out));
    if wants("exec_docker") {
        match &ctx.docker {
            Err(reason) => out.emit(skipped("exec_docker", reason.clone())),
            Ok(_) => {
                if let Err(e) = exec_docker(ctx, out).await {
                    out.emit(skipped("exec_docker", format!("failed: {e:#}")));
                }
            }
        }
    }
    case!("jobs_throughput", jobs_throughput(ctx, out));
    case!("worker_rss", worker_rss(ctx, out));
    case!("eviction_sweep", crate::sweep::eviction_sweep(ctx, out));
    case!("replay", replay(ctx, out));
    case!("metrics_scrape", crate::metrics::metrics_scrape(ctx, out));
    case!("http_read_file", crate::http::http_read_file(ctx, out));
    case!("http_exec", crate::http::http_exec(ctx, out));
    case!("console_pages", crate::console::console_pages(ctx, out));
    case!("history_exec", crate::history::history_exec(ctx, out));
    case!(
        "history_exec_50k",
        crate::history::history_exec_50k(ctx, out)
    );
    case!("history_fork", crate::history::history_fork(ctx, out));
    case!(
        "history_rewind_100",
        crate::history::history_rewind_100(ctx, out)
    );
    case!(
        "history_storage_1000",
        crate::history::history_storage_1000(ctx, out)
    );
    if let Err(e) = crate::transfer::transfer_cases(ctx, out, wants).await {
        out.emit(skipped("cache_first_http", format!("failed: {e:#}")));
    }
    case!("agent_calls", crate::calls::agent_calls(ctx, out));
    if let Err(e) = crate::first::first_cases(ctx, out, wants).await {
        out.emit(skipped("first_workspace_http", format!("failed: {e:#}")));
    }
    Ok(())
}

/// cache_first: ensure of a cache never seen (a clone) vs `git clone --mirror`;
/// cache_again: the same ensure a second time, against cache_first.
async fn cache(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    let n = ctx.args.cache_n.max(1);
    let (mut first, mut again, mut floor) = (vec![], vec![], vec![]);
    for i in 0..n {
        // A distinct path (a symlink to the same repository) is a distinct identity,
        // so each iteration clones afresh.
        let link = ctx.dir.join(format!("upstream-{i}.git"));
        std::os::unix::fs::symlink(&ctx.upstream, &link)?;
        let url = format!("file://{}", link.display());
        let name = format!("bench/c{i}");
        let t = Instant::now();
        ctx.ensure(&name, &url).await?;
        first.push(ms(t));
        let t = Instant::now();
        ctx.ensure(&name, &url).await?;
        again.push(ms(t));
        let dest = ctx.dir.join(format!("floor-mirror-{i}.git"));
        let t = Instant::now();
        run_cmd(
            "git",
            &["clone", "--mirror", "-q", &url, dest.to_str().unwrap()],
            None,
        )
        .await?;
        floor.push(ms(t));
        std::fs::remove_dir_all(&dest)?;
    }
    let fetched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM grove.events WHERE event_type = 'repo_cache.fetched'",
    )
    .fetch_one(&ctx.pool)
    .await?;
    let created: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM grove.events WHERE event_type = 'repo_cache.created'",
    )
    .fetch_one(&ctx.pool)
    .await?;
    let mut row = latency("cache_first", &first, &floor);
    row.insert("floor_is".into(), json!("git clone --mirror"));
    out.emit(row);
    let mut row = latency("cache_again", &again, &first);
    row.insert("floor_is".into(), json!("cache_first (grove)"));
    row.insert("clones".into(), json!(created));
    row.insert("fetches".into(), json!(fetched));
    out.emit(row);
    Ok(())
}

/// A new edit workspace from a warm cache vs `git worktree add` (and `git clone --shared`).
/// `git worktree add --detach` of `main` from the cache at `dest`, timed (ms), then
/// removed again: the floor of a new workspace.
pub(crate) async fn worktree_add_floor(
    cache_dir: &std::path::Path,
    dest: &std::path::Path,
) -> Result<f64> {
    let d = dest.to_str().context("a UTF-8 path")?;
    let t = Instant::now();
    run_cmd(
        "git",
        &[
            "-c",
            "safe.directory=*",
            "worktree",
            "add",
            "-q",
            "--detach",
            d,
            "main",
        ],
        Some(cache_dir),
    )
    .await?;
    let took = ms(t);
    run_cmd(
        "git",
        &["-c", "safe.directory=*", "worktree", "remove", "--force", d],
        Some(cache_dir),
    )
    .await?;
    Ok(took)
}

async fn workspace_create(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    let cache = ctx.warm_cache().await?;
    let cache_dir = PathBuf::from(&cache.local_path);
    let n = ctx.args.n;
    let (mut grove, mut worktree, mut shared) = (vec![], vec![], vec![]);
    for i in 0..n {
        let conv = format!("w{}", ctx.workspaces.len());
        let t = Instant::now();
        let row = ctx.acquire(&conv).await?;
        grove.push(ms(t));
        ctx.workspaces.push(row);

        let dest = ctx.dir.join(format!("floor-wt-{i}"));
        let d = dest.to_str().unwrap().to_string();
        worktree.push(worktree_add_floor(&cache_dir, &dest).await?);

        let t = Instant::now();
        run_cmd(
            "git",
            &[
                "clone",
                "-q",
                "--shared",
                "-b",
                "main",
                cache_dir.to_str().unwrap(),
                &d,
            ],
            None,
        )
        .await?;
        shared.push(ms(t));
        std::fs::remove_dir_all(&dest)?;
    }
    crate::fixture::git(&cache_dir, &["worktree", "prune"])?;
    let mut row = latency("workspace_create", &grove, &worktree);
    row.insert("floor_is".into(), json!("git worktree add --detach"));
    row.insert("clone_shared_p50_ms".into(), round(pct(&shared, 50.0)));
    row.insert("clone_shared_p99_ms".into(), round(pct(&shared, 99.0)));
    row.insert(
        "ratio_vs_clone_shared".into(),
        round(pct(&grove, 50.0) / pct(&shared, 50.0)),
    );
    out.emit(row);
    Ok(())
}

/// Acquiring an existing workspace through the queue vs one `SELECT 1`.
async fn workspace_warm(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    ctx.workspaces_at_least(1).await?;
    let conv = ctx.workspaces[0]
        .conversation_id
        .clone()
        .ok_or_else(|| anyhow!("no conversation id"))?;
    let (mut grove, mut floor) = (vec![], vec![]);
    for _ in 0..ctx.args.n {
        let t = Instant::now();
        ctx.acquire(&conv).await?;
        grove.push(ms(t));
        let t = Instant::now();
        let _: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&ctx.pool).await?;
        floor.push(ms(t));
    }
    let mut row = latency("workspace_warm", &grove, &floor);
    row.insert("floor_is".into(), json!("SELECT 1"));
    out.emit(row);
    Ok(())
}

/// `true` through the queue (kind read, local runtime) vs spawning `true`; and the
/// runtime alone, through its exec agent (`exec_local_agent`) and with a sandbox per
/// exec (`exec_local_runtime`).
async fn exec_local(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    ctx.workspaces_at_least(1).await?;
    let ws = ctx.workspaces[0].id;
    ctx.exec(ws, "local", &["true"]).await?; // warm-up
                                             // The sandbox alone: the exact bubblewrap argv the worker's local runtime would
                                             // spawn for `true` in this workspace (read-only, no network), spawned directly.
    let dir = PathBuf::from(&ctx.workspaces[0].local_path);
    let provider = grove_local::LocalRuntimeProvider::detect(&ctx.home);
    let spec = RuntimeSpec {
        image: None,
        workdir: dir.clone(),
        mounts: vec![Mount {
            source: dir.clone(),
            target: dir,
            writable: false,
        }],
        env: Default::default(),
        resources: Default::default(),
        network: Default::default(),
        labels: Default::default(),
    };
    let runtime = provider.create_local(spec.clone())?;
    let sandbox_argv = runtime.sandbox_argv(&ExecRequest {
        argv: vec!["true".into()],
        ..Default::default()
    })?;
    let bwrap = provider
        .bwrap()
        .context("bubblewrap is not available: the local runtime cannot isolate")?;
    let sandbox_argv: Vec<String> = std::iter::once(bwrap.as_os_str())
        .chain(sandbox_argv.iter().map(|a| a.as_os_str()))
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let sandbox_args: Vec<&str> = sandbox_argv.iter().map(String::as_str).collect();
    // The runtime alone, both ways back to back: through its exec agent (started by
    // the warm-up below) and with a sandbox built per exec (no agent).
    let per_exec = provider
        .clone()
        .with_agent(None)
        .create_local(spec.clone())?;
    let agent_runtime = provider.agent().map(|_| runtime.clone());
    let req = || ExecRequest {
        argv: vec!["true".into()],
        ..Default::default()
    };
    if let Some(rt) = &agent_runtime {
        rt.exec(req()).await?;
    }
    let (mut grove, mut floor, mut sandbox) = (vec![], vec![], vec![]);
    let (mut via_agent, mut via_sandbox) = (vec![], vec![]);
    for _ in 0..ctx.args.n {
        let t = Instant::now();
        ctx.exec(ws, "local", &["true"]).await?;
        grove.push(ms(t));
        let t = Instant::now();
        run_cmd("true", &[], None).await?;
        floor.push(ms(t));
        let t = Instant::now();
        run_cmd(sandbox_args[0], &sandbox_args[1..], None).await?;
        sandbox.push(ms(t));
        let t = Instant::now();
        let r = per_exec.exec(req()).await?;
        via_sandbox.push(ms(t));
        if r.exit_code != 0 {
            bail!("per-exec sandbox: true exited {}", r.exit_code);
        }
        if let Some(rt) = &agent_runtime {
            let t = Instant::now();
            let r = rt.exec(req()).await?;
            via_agent.push(ms(t));
            if r.exit_code != 0 {
                bail!("exec agent: true exited {}", r.exit_code);
            }
        }
    }
    let mut row = latency("exec_local", &grove, &floor);
    row.insert("floor_is".into(), json!("spawn true"));
    row.insert("sandbox_p50_ms".into(), round(pct(&sandbox, 50.0)));
    row.insert("sandbox_p99_ms".into(), round(pct(&sandbox, 99.0)));
    row.insert(
        "added_over_sandbox_p50_ms".into(),
        round(pct(&grove, 50.0) - pct(&sandbox, 50.0)),
    );
    row.insert(
        "added_p50_ms".into(),
        round(pct(&grove, 50.0) - pct(&floor, 50.0)),
    );
    row.insert(
        "added_p99_ms".into(),
        round(pct(&grove, 99.0) - pct(&floor, 99.0)),
    );
    // Where the time goes, from the ledger: enqueue -> claim+start -> finish.
    let phases: Option<(f64, f64)> = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - enqueued_at) * 1000)::float8,
                percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at) * 1000)::float8
         FROM grove.commands WHERE kind = 'exec' AND payload->>'runtime' = 'local'",
    )
    .fetch_optional(&ctx.pool)
    .await
    .ok()
    .flatten();
    if let Some((queued, running)) = phases {
        row.insert("ledger_queued_p50_ms".into(), round(queued));
        row.insert("ledger_running_p50_ms".into(), round(running));
    }
    out.emit(row);
    // The sandbox part alone: LocalRuntime::exec through the agent vs with a
    // sandbox per exec, against spawning `true`.
    let mut row = latency("exec_local_runtime", &via_sandbox, &floor);
    row.insert("floor_is".into(), json!("spawn true"));
    row.insert("path".into(), json!("LocalRuntime, a bwrap per exec"));
    out.emit(row);
    if agent_runtime.is_some() {
        let mut row = latency("exec_local_agent", &via_agent, &floor);
        row.insert("floor_is".into(), json!("spawn true"));
        row.insert("path".into(), json!("LocalRuntime through grove-sandboxd"));
        row.insert(
            "added_p50_ms".into(),
            round(pct(&via_agent, 50.0) - pct(&floor, 50.0)),
        );
        row.insert(
            "added_p99_ms".into(),
            round(pct(&via_agent, 99.0) - pct(&floor, 99.0)),
        );
        out.emit(row);
    } else {
        let why = grove_local::LocalRuntimeProvider::find_agent()
            .err()
            .unwrap_or_else(|| "the exec agent is not in use".into());
        out.emit(skipped("exec_local_agent", why));
    }
    // A cold runtime start: a fresh exec agent pool each time, so the first exec
    // pays for bwrap, the user namespace, the seccomp filter and the agent's hello.
    if let Some(binary) = provider.agent().map(std::path::Path::to_path_buf) {
        let mut cold = vec![];
        for _ in 0..ctx.args.n.min(20) {
            let fresh = provider.clone().with_agent(Some(binary.clone()));
            let t = Instant::now();
            let rt = fresh.create_local(spec.clone())?;
            let r = rt.exec(req()).await?;
            cold.push(ms(t));
            if r.exit_code != 0 {
                bail!("cold start: true exited {}", r.exit_code);
            }
        }
        let mut row = latency("exec_local_cold", &cold, &floor);
        row.insert("floor_is".into(), json!("spawn true"));
        row.insert(
            "path".into(),
            json!("first exec of a runtime: agent started in a new sandbox"),
        );
        out.emit(row);
    }
    Ok(())
}

/// `true` in a running container: through the queue, through
/// `DockerRuntimeProvider` directly, and as a line to one attached exec kept open
/// (`exec_docker_attached`), vs `docker exec <container> true`.
async fn exec_docker(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    let ws = ctx.acquire("docker-bench").await?;
    ctx.exec(ws.id, "docker", &["true"]).await?; // creates the container
    let container: String = sqlx::query_scalar(
        "SELECT backend_runtime_id FROM grove.sandbox_runtimes WHERE workspace_id = $1 AND backend_kind = 'docker'",
    )
    .bind(ws.id)
    .fetch_one(&ctx.pool)
    .await?;
    let docker = ctx.docker.as_ref().map_err(|e| anyhow!("{e}"))?;
    // A runtime of our own, outside the worker, for the direct path.
    let direct_dir = ctx.dir.join("docker-direct");
    std::fs::create_dir_all(&direct_dir)?;
    let runtime_id = Uuid::new_v4().to_string();
    let spec = RuntimeSpec {
        image: Some(docker.image.clone()),
        workdir: direct_dir.clone(),
        mounts: vec![Mount {
            source: direct_dir.clone(),
            target: direct_dir.clone(),
            writable: false,
        }],
        env: Default::default(),
        resources: Default::default(),
        network: Default::default(),
        labels: [
            ("grove.workspace".to_string(), Uuid::new_v4().to_string()),
            ("grove.runtime".to_string(), runtime_id),
        ]
        .into(),
    };
    let runtime = docker.provider.create_docker(spec).await?;
    let req = || ExecRequest {
        argv: vec!["true".into()],
        max_output_bytes: Some(1 << 20),
        ..Default::default()
    };
    runtime.exec(req()).await?;
    // The floor of an in-container exec agent (ADR 18): one attached exec kept open,
    // a shell loop in it that fork/execs each line it reads and answers `done`.
    let mut attached = attached_loop(docker.provider.docker(), runtime.container_id()).await?;
    attached.round_trip().await?;
    let mut via_attached = vec![];
    let (mut queued, mut direct, mut floor) = (vec![], vec![], vec![]);
    let res: Result<()> = async {
        for _ in 0..ctx.args.n {
            let t = Instant::now();
            ctx.exec(ws.id, "docker", &["true"]).await?;
            queued.push(ms(t));
            let t = Instant::now();
            let r = runtime.exec(req()).await?;
            direct.push(ms(t));
            if r.exit_code != 0 {
                bail!("direct exec exited {}", r.exit_code);
            }
            let t = Instant::now();
            run_cmd("docker", &["exec", &container, "true"], None).await?;
            floor.push(ms(t));
            let t = Instant::now();
            attached.round_trip().await?;
            via_attached.push(ms(t));
        }
        Ok(())
    }
    .await;
    drop(attached);
    let _ = docker.provider.destroy(runtime.container_name()).await;
    let _ = ctx
        .client
        .submit(&Command::DestroyRuntime {
            workspace_id: ws.id,
        })
        .await;
    res?;
    let mut row = latency("exec_docker", &queued, &floor);
    row.insert("floor_is".into(), json!("docker exec CLI"));
    row.insert("path".into(), json!("queue"));
    out.emit(row);
    let mut row = latency("exec_docker_direct", &direct, &floor);
    row.insert("floor_is".into(), json!("docker exec CLI"));
    row.insert("path".into(), json!("DockerRuntimeProvider (bollard)"));
    out.emit(row);
    let mut row = latency("exec_docker_attached", &via_attached, &floor);
    row.insert("floor_is".into(), json!("docker exec CLI"));
    row.insert(
        "path".into(),
        json!("one attached exec answering a line per command (agent floor, ADR 18)"),
    );
    out.emit(row);
    Ok(())
}

/// A shell loop in one attached engine exec: each line it reads is run as a command,
/// then it prints `done`.
struct AttachedLoop {
    input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    output: std::pin::Pin<
        Box<
            dyn futures::Stream<
                    Item = Result<bollard::container::LogOutput, bollard::errors::Error>,
                > + Send,
        >,
    >,
}

impl AttachedLoop {
    /// Runs `true` in the loop and waits for its answer.
    async fn round_trip(&mut self) -> Result<()> {
        use futures::StreamExt;
        use tokio::io::AsyncWriteExt;
        self.input.write_all(b"true\n").await?;
        self.input.flush().await?;
        let mut seen = Vec::new();
        while !seen.ends_with(b"done\n") {
            match self.output.next().await {
                Some(Ok(bollard::container::LogOutput::StdOut { message })) => {
                    seen.extend_from_slice(&message)
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => bail!("attached exec: {e}"),
                None => bail!("attached exec ended"),
            }
        }
        Ok(())
    }
}

async fn attached_loop(docker: &bollard::Docker, container: &str) -> Result<AttachedLoop> {
    let exec = docker
        .create_exec(
            container,
            bollard::exec::CreateExecOptions {
                cmd: Some(vec![
                    "sh".to_string(),
                    "-c".into(),
                    "while read l; do $l; echo done; done".into(),
                ]),
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(false),
                ..Default::default()
            },
        )
        .await?;
    match docker.start_exec(&exec.id, None).await? {
        bollard::exec::StartExecResults::Attached { output, input } => {
            Ok(AttachedLoop { input, output })
        }
        bollard::exec::StartExecResults::Detached => bail!("the exec started detached"),
    }
}

/// Registers `count` workspaces on the throughput node by appending their
/// `workspace.created` events (no files: hibernate of a workspace without a runtime
/// never touches them).
async fn fake_workspaces(ctx: &Ctx, count: usize) -> Result<Vec<Uuid>> {
    let cache = ctx.warm_cache().await?;
    let mut ids = Vec::new();
    let mut events = Vec::new();
    for i in 0..count {
        let id = Uuid::new_v4();
        ids.push(id);
        events.push(Event::WorkspaceCreated {
            workspace_id: id,
            repo_cache_id: cache.id,
            node: TP_NODE.into(),
            user_id: "tp".into(),
            project_id: "tp".into(),
            mode: WorkspaceMode::Analysis,
            conversation_id: None,
            task_id: None,
            base_ref: format!("b{i}"),
            base_commit: "0".repeat(40),
            branch_name: None,
            local_path: ctx
                .dir
                .join(format!("tp-{i}"))
                .to_string_lossy()
                .into_owned(),
            capabilities: Capabilities::from_mode(WorkspaceMode::Analysis),
            size_bytes: 0,
            history_ignored: false,
        });
    }
    let md = Metadata {
        command_id: Uuid::now_v7(),
        correlation: Correlation::default(),
        worker_id: "grove-bench".into(),
        node: TP_NODE.into(),
    };
    let mut tx = ctx.pool.begin().await?;
    grove_postgres::store::append(&mut tx, &events, &md, grove_workers::context::now()).await?;
    tx.commit().await?;
    Ok(ids)
}

/// One grove round: `jobs` hibernate_runtime commands (workspaces without a runtime)
/// already queued, then `k` in-process workers of concurrency 1 sharing a pool of
/// `pool_size`. Jobs per second over the ledger's first start to last finish, and the
/// WAL written per job while the workers ran.
async fn grove_round(
    ctx: &Ctx,
    ws: &[Uuid],
    k: usize,
    pool_size: u32,
    jobs: usize,
) -> Result<(f64, f64)> {
    let queue = grove_postgres::queue::node_queue(TP_NODE);
    let mut ids = Vec::with_capacity(jobs);
    for j in 0..jobs {
        let cmd = Command::HibernateRuntime {
            workspace_id: ws[j % ws.len()],
        };
        ids.push(ctx.client.enqueue_to(&cmd, &queue).await?);
    }
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(pool_size)
        .connect_with((*ctx.pool.connect_options()).clone())
        .await?;
    let wal_before = wal_lsn(&ctx.pool).await?;
    let mut workers = Vec::new();
    for _ in 0..k {
        workers.push(RunningWorker::start(pool.clone(), &ctx.home, TP_NODE, 1, None).await);
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM grove.commands WHERE command_id = ANY($1) AND status IN ('succeeded', 'failed')",
        )
        .bind(&ids)
        .fetch_one(&ctx.pool)
        .await?;
        if done as usize >= jobs {
            break;
        }
        if Instant::now() > deadline {
            bail!("throughput round did not finish");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let wal = (wal_lsn(&ctx.pool).await? - wal_before) as f64 / jobs as f64;
    for w in workers {
        w.stop().await;
    }
    pool.close().await;
    let (failed, span): (i64, f64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'failed'),
                extract(epoch FROM max(finished_at) - min(started_at))::float8
         FROM grove.commands WHERE command_id = ANY($1)",
    )
    .bind(&ids)
    .fetch_one(&ctx.pool)
    .await?;
    if failed > 0 {
        bail!("{failed} throughput jobs failed");
    }
    Ok((jobs as f64 / span, wal))
}

/// The cluster's WAL insert position in bytes: WAL written between two reads.
async fn wal_lsn(pool: &sqlx::PgPool) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint")
            .fetch_one(pool)
            .await?,
    )
}

/// One floor round: `k` tasks, each looping claim (`FOR UPDATE SKIP LOCKED`) → append
/// one event → complete, in one transaction per job, on a pool of `pool_size`; with
/// the WAL written per job.
async fn floor_round(ctx: &Ctx, k: usize, pool_size: u32, jobs: usize) -> Result<(f64, f64)> {
    sqlx::query("TRUNCATE bench.jobs")
        .execute(&ctx.pool)
        .await?;
    sqlx::query(
        "INSERT INTO bench.jobs (payload) SELECT jsonb_build_object('command_id', gen_random_uuid()) FROM generate_series(1, $1)",
    )
    .bind(jobs as i64)
    .execute(&ctx.pool)
    .await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(pool_size)
        .connect_with((*ctx.pool.connect_options()).clone())
        .await?;
    let wal_before = wal_lsn(&ctx.pool).await?;
    let mut tasks = Vec::new();
    for _ in 0..k {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let mut tx = pool.begin().await?;
                let id: Option<i64> = sqlx::query_scalar(
                    "SELECT id FROM bench.jobs WHERE status = 'pending' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
                )
                .fetch_optional(&mut *tx)
                .await?;
                let Some(id) = id else {
                    tx.commit().await?;
                    return Ok::<_, sqlx::Error>(());
                };
                let ws = Uuid::new_v4();
                sqlx::query(
                    "INSERT INTO bench.events (stream_id, stream_version, event_type, event_version, payload, metadata, command_id, recorded_at)
                     VALUES ($1, 1, 'workspace.acquired', 1, $2, '{}', $3, now())",
                )
                .bind(format!("workspace:{ws}"))
                .bind(json!({ "workspace_id": ws }))
                .bind(ws)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "UPDATE bench.jobs SET status = 'done', claimed_at = now(), done_at = clock_timestamp() WHERE id = $1",
                )
                .bind(id)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let wal = (wal_lsn(&ctx.pool).await? - wal_before) as f64 / jobs as f64;
    pool.close().await;
    let span: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM max(done_at) - min(claimed_at))::float8 FROM bench.jobs",
    )
    .fetch_one(&ctx.pool)
    .await?;
    Ok((jobs as f64 / span, wal))
}

async fn jobs_throughput(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    sqlx::query("CREATE SCHEMA IF NOT EXISTS bench")
        .execute(&ctx.pool)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench.jobs (id bigserial PRIMARY KEY, status text NOT NULL DEFAULT 'pending', payload jsonb NOT NULL, claimed_at timestamptz, done_at timestamptz)",
    )
    .execute(&ctx.pool)
    .await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS bench.events (LIKE grove.events INCLUDING ALL)")
        .execute(&ctx.pool)
        .await?;
    let ws = fake_workspaces(ctx, 64).await?;
    let jobs = ctx.args.jobs.max(10);
    for k in [1usize, 2, 4] {
        // The pool size `grove worker` gives itself for this concurrency (2c + 6).
        let pool_size = (2 * k + 6) as u32;
        let (mut g, mut f, mut gw, mut fw) = (vec![], vec![], vec![], vec![]);
        for _ in 0..ctx.args.rounds.max(1) {
            let (per_s, wal) = grove_round(ctx, &ws, k, pool_size, jobs).await?;
            g.push(per_s);
            gw.push(wal);
            let (per_s, wal) = floor_round(ctx, k, pool_size, jobs).await?;
            f.push(per_s);
            fw.push(wal);
        }
        let per_job = |v: &[f64]| v.iter().map(|r| 1000.0 / r).collect::<Vec<_>>();
        let (gm, fm) = (per_job(&g), per_job(&f));
        let mut row = latency(&format!("jobs_throughput_{k}"), &gm, &fm);
        row.insert("n".into(), json!(jobs * g.len()));
        let (gps, fps) = (1000.0 / pct(&gm, 50.0), 1000.0 / pct(&fm, 50.0));
        row.insert("grove_per_s".into(), round(gps));
        row.insert("floor_per_s".into(), round(fps));
        row.insert("share_of_floor".into(), round(gps / fps));
        // What each job writes to the WAL, whose flush the outcome's commit waits for.
        row.insert("grove_wal_bytes_per_job".into(), round(pct(&gw, 50.0)));
        row.insert("floor_wal_bytes_per_job".into(), round(pct(&fw, 50.0)));
        row.insert("workers".into(), json!(k));
        row.insert("pool_size".into(), json!(pool_size));
        row.insert("job".into(), json!("hibernate_runtime, no runtime"));
        out.emit(row);
    }
    Ok(())
}

fn proc_status_kib(pid: &str, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Peak RSS of this process (the in-process worker plus the bench's client) while
/// `rss_workspaces` workspaces exist and `rss_execs` execs run at once.
async fn worker_rss(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    let want = ctx.args.rss_workspaces;
    let t = Instant::now();
    ctx.workspaces_at_least(want).await?;
    let setup_s = t.elapsed().as_secs_f64();
    let before = proc_status_kib("self", "VmRSS:").unwrap_or(0);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let sampler = tokio::spawn(async move {
        let mut peak = 0u64;
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            peak = peak.max(proc_status_kib("self", "VmRSS:").unwrap_or(0));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        peak
    });
    let execs = ctx.args.rss_execs.min(ctx.workspaces.len());
    let t = Instant::now();
    let results = futures::future::join_all(
        ctx.workspaces[..execs]
            .iter()
            .map(|w| ctx.exec(w.id, "local", &["sleep", "1"])),
    )
    .await;
    let wall = ms(t);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.await?;
    for r in results {
        r?;
    }
    let count: i64 =
        sqlx::query_scalar("SELECT count(*) FROM grove.sandbox_workspaces WHERE node = $1")
            .bind(NODE)
            .fetch_one(&ctx.pool)
            .await?;
    let mut row = serde_json::Map::new();
    row.insert("name".into(), json!("worker_rss"));
    row.insert("n".into(), json!(execs));
    row.insert("rss_mib".into(), round(peak as f64 / 1024.0));
    row.insert("rss_before_mib".into(), round(before as f64 / 1024.0));
    row.insert(
        "hwm_mib".into(),
        round(proc_status_kib("self", "VmHWM:").unwrap_or(0) as f64 / 1024.0),
    );
    row.insert("workspaces".into(), json!(count));
    row.insert("execs_wall_ms".into(), round(wall));
    row.insert("setup_s".into(), round(setup_s));
    row.insert(
        "measured".into(),
        json!("bench process: in-process worker + client"),
    );
    out.emit(row);
    Ok(())
}

/// Inserts `n` valid events of ids no projection row has, half `workspace.acquired`
/// and half `repo_cache.used`, the `g`-th (from 1) recorded `g * spread_secs` seconds
/// ago.
pub(crate) async fn insert_filler_events(
    pool: &PgPool,
    n: i64,
    spread_secs: i64,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO grove.events (stream_id, stream_version, event_type, event_version, payload, metadata, command_id, recorded_at)
         SELECT CASE WHEN g % 2 = 0 THEN 'workspace:' ELSE 'repo_cache:' END || u::text, 1,
                CASE WHEN g % 2 = 0 THEN 'workspace.acquired' ELSE 'repo_cache.used' END, 1,
                CASE WHEN g % 2 = 0 THEN jsonb_build_object('workspace_id', u) ELSE jsonb_build_object('repo_cache_id', u) END,
                jsonb_build_object('command_id', u, 'correlation', '{}'::jsonb, 'worker_id', 'grove-bench', 'node', 'bench'),
                u, now() - make_interval(secs => g * $2)
         FROM (SELECT g, gen_random_uuid() AS u FROM generate_series(1, $1) g) s",
    )
    .bind(n)
    .bind(spread_secs)
    .execute(pool)
    .await?;
    Ok(())
}

/// `fold_all` and `verify` over a log of `replay_events` events vs streaming the same
/// rows from Postgres without decoding or folding them.
async fn replay(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    let n = ctx.args.replay_events;
    let t = Instant::now();
    // Valid payloads of ids no projection row has: each event is decoded and applied
    // (a lookup that changes nothing), so verify still finds the live tables equal.
    insert_filler_events(&ctx.pool, n, 0)
        .await
        .context("inserting the replay log")?;
    sqlx::query("ANALYZE grove.events")
        .execute(&ctx.pool)
        .await?;
    let insert_s = t.elapsed().as_secs_f64();
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM grove.events")
        .fetch_one(&ctx.pool)
        .await?;
    let (mut fold, mut verify, mut floor) = (vec![], vec![], vec![]);
    let mut diffs = 0usize;
    for _ in 0..ctx.args.replay_runs.max(1) {
        let t = Instant::now();
        let (_, count) = grove_postgres::replay::fold_all(&ctx.pool).await?;
        fold.push(ms(t));
        if count as i64 != total {
            bail!("fold_all folded {count} of {total} events");
        }
        let t = Instant::now();
        let rows = stream_rows(&ctx.pool).await?;
        floor.push(ms(t));
        if rows != total {
            bail!("floor streamed {rows} of {total} events");
        }
        let t = Instant::now();
        let report = grove_postgres::replay::verify(&ctx.pool).await?;
        verify.push(ms(t));
        diffs = report.diffs.len();
    }
    let per_s = |v: &[f64]| total as f64 / (pct(v, 50.0) / 1000.0);
    let mut row = latency("replay", &fold, &floor);
    row.insert("n".into(), json!(fold.len()));
    row.insert("events".into(), json!(total));
    row.insert("grove_per_s".into(), round(per_s(&fold)));
    row.insert("floor_per_s".into(), round(per_s(&floor)));
    row.insert(
        "floor_is".into(),
        json!("stream the same SELECT, no decode"),
    );
    row.insert("insert_s".into(), round(insert_s));
    out.emit(row);
    let mut row = latency("replay_verify", &verify, &floor);
    row.insert("n".into(), json!(verify.len()));
    row.insert("events".into(), json!(total));
    row.insert("grove_per_s".into(), round(per_s(&verify)));
    row.insert("floor_per_s".into(), round(per_s(&floor)));
    row.insert("diffs".into(), json!(diffs));
    out.emit(row);
    Ok(())
}

async fn stream_rows(pool: &PgPool) -> Result<i64> {
    use futures::TryStreamExt;
    let mut conn = pool.acquire().await?;
    let mut s =
        sqlx::query("SELECT event_type, payload, recorded_at FROM grove.events ORDER BY position")
            .fetch(&mut *conn);
    let mut n = 0i64;
    while let Some(_row) = s.try_next().await? {
        n += 1;
    }
    Ok(n)
}
