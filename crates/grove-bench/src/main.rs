//! grove-bench: every cost grove adds, measured next to its floor in the same run.
//!
//! Sets up its own fixtures (a fresh `grove_bench_<uuid>` database on `DATABASE_URL`, a
//! temporary `$GROVE_HOME`, a repository generated with `git fast-import` and served
//! over `file://`), runs an in-process worker, submits commands through
//! `grove_postgres::queue::enqueue` and waits on the ledger, and prints one row per case
//! (a Markdown table, or JSON lines with `--json`). See issue 6 and the README's
//! "Performance" section.

mod calls;
mod cases;
mod client;
mod console;
mod ctx;
mod first;
mod fixture;
mod history;
mod http;
mod metrics;
mod stats;
mod sweep;
mod transfer;

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::{Map, Value};

/// Every case, in the order they run.
pub const ALL_CASES: &[&str] = &[
    "cache_first",
    "cache_again",
    "workspace_create",
    "workspace_warm",
    "exec_local",
    "exec_docker",
    "jobs_throughput",
    "worker_rss",
    "eviction_sweep",
    "replay",
    "metrics_scrape",
    "http_read_file",
    "http_exec",
    "console_pages",
    "history_exec",
    "history_exec_50k",
    "history_fork",
    "history_rewind_100",
    "history_storage_1000",
    "cache_first_file",
    "cache_first_http",
    "cache_fetch_file",
    "cache_fetch_http",
    "worker_rss_after_clone",
    "agent_calls",
    "first_workspace_file",
    "first_workspace_http",
    "worker_rss_after_jobs",
];

#[derive(Parser, Debug, Clone)]
#[command(
    name = "grove-bench",
    about = "Benchmarks grove next to the floor of each operation"
)]
pub struct Args {
    /// One JSON object per line per case instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Comma-separated cases to run (default: all).
    #[arg(long, value_delimiter = ',')]
    pub cases: Vec<String>,
    /// Iterations of each latency case.
    #[arg(long, default_value_t = 40)]
    pub n: usize,
    /// Iterations of cache_first / cache_again (each clones the whole repository).
    #[arg(long, default_value_t = 5)]
    pub cache_n: usize,
    /// Files in the generated repository.
    #[arg(long, default_value_t = 5000)]
    pub files: usize,
    /// Commits in the generated repository.
    #[arg(long, default_value_t = 2000)]
    pub commits: usize,
    /// Jobs per throughput round.
    #[arg(long, default_value_t = 300)]
    pub jobs: usize,
    /// Rounds of each throughput measurement (grove and floor alternate).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Workspace rows seeded for metrics_scrape (its log is topped up to
    /// --replay-events).
    #[arg(long, default_value_t = 10_000)]
    pub metrics_workspaces: i64,
    /// Events in the replay log.
    #[arg(long, default_value_t = 1_000_000)]
    pub replay_events: i64,
    /// Runs of fold_all / verify over the replay log.
    #[arg(long, default_value_t = 2)]
    pub replay_runs: usize,
    /// Workspaces that exist during the memory case.
    #[arg(long, default_value_t = 100)]
    pub rss_workspaces: usize,
    /// Execs running concurrently during the memory case.
    #[arg(long, default_value_t = 50)]
    pub rss_execs: usize,
    /// Workspace records on the node during the eviction sweep cases.
    #[arg(long, default_value_t = 10_000)]
    pub sweep_records: usize,
    /// Of those, real worktrees made through the queue (one in five a task workspace,
    /// which the TTL sweep evicts).
    #[arg(long, default_value_t = 500)]
    pub sweep_real: usize,
    /// Requests of each HTTP case (and as many in-process submissions).
    #[arg(long, default_value_t = 1000)]
    pub http_n: usize,
    /// A bare repository (path) for the transfer cases instead of the generated
    /// fixture; it is copied, never changed.
    #[arg(long)]
    pub repo: Option<PathBuf>,
    /// Commits the upstream moves by before each cache_fetch_* iteration.
    #[arg(long, default_value_t = 20)]
    pub fetch_commits: usize,
    /// Idle wait before the last sample of worker_rss_after_clone and
    /// worker_rss_after_jobs.
    #[arg(long, default_value_t = 60)]
    pub rss_idle_secs: u64,
    /// Mixed jobs (execs, tool writes and reads, warm acquires, ensures) before
    /// worker_rss_after_jobs' sample.
    #[arg(long, default_value_t = 1000)]
    pub rss_jobs: usize,
    /// Fleet sizes (workspaces on the node) agent_calls measures at.
    #[arg(long, value_delimiter = ',', default_value = "10,300")]
    pub fleets: Vec<usize>,
    /// Iterations of each agent_calls call (the CLI's at most 100).
    #[arg(long, default_value_t = 200)]
    pub calls_n: usize,
    /// agent_calls also counts the WAL flushes of the server per HTTP call
    /// (`pg_stat_wal.wal_sync`, read 11 s after each loop so every backend has
    /// reported): exact only on a server nothing else uses, with a long
    /// `wal_writer_delay`.
    #[arg(long)]
    pub count_flushes: bool,
    /// Workspace records during the console_pages case.
    #[arg(long, default_value_t = 10_000)]
    pub console_workspaces: i64,
    /// Events in the log during the console_pages case (topped up to this many).
    #[arg(long, default_value_t = 1_000_000)]
    pub console_events: i64,
    /// Repetitions of the steady (nothing to do) sweep.
    #[arg(long, default_value_t = 5)]
    pub sweep_n: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    for c in &args.cases {
        if !ALL_CASES.contains(&c.as_str()) {
            bail!("unknown case {c:?}; known: {}", ALL_CASES.join(","));
        }
    }
    // SAFETY: first thing in main, before the tokio runtime or any other thread exists.
    unsafe { grove_workers::init_process() }.context("process setup")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

/// Prints a row now (JSON) and keeps it for the table.
pub struct Out {
    json: bool,
    pub rows: Vec<Map<String, Value>>,
}

impl Out {
    pub fn emit(&mut self, row: Map<String, Value>) {
        if self.json {
            println!("{}", Value::Object(row.clone()));
            let _ = std::io::stdout().flush();
        } else {
            let name = row.get("name").and_then(Value::as_str).unwrap_or("?");
            eprintln!("grove-bench: {name} done");
        }
        self.rows.push(row);
    }
}

async fn run(args: Args) -> Result<()> {
    let admin = std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .context("DATABASE_URL must name a Postgres admin database (the bench creates and drops its own database on it)")?;
    let db = fixture::BenchDb::create(&admin).await?;
    let dir = tempfile::Builder::new().prefix("grove-bench-").tempdir()?;
    let result = run_in(&args, &db, dir.path().to_path_buf()).await;
    if let Err(e) = db.drop_db().await {
        eprintln!("grove-bench: dropping database {} failed: {e}", db.name);
    }
    let out = result?;
    if !args.json {
        print!("{}", stats::table(&out.rows));
    }
    Ok(())
}

async fn run_in(args: &Args, db: &fixture::BenchDb, dir: PathBuf) -> Result<Out> {
    let wants = |c: &str| args.cases.is_empty() || args.cases.iter().any(|x| x == c);
    let home = dir.join("home");
    std::fs::create_dir_all(&home)?;
    let t = std::time::Instant::now();
    let upstream = fixture::generate_repo(&dir, args.files, args.commits)?;
    eprintln!(
        "grove-bench: generated {} files / {} commits in {:.1} s",
        args.files,
        args.commits,
        t.elapsed().as_secs_f64()
    );
    let pool = db.pool(12).await?;
    grove_postgres::migrate::migrate(&pool).await?;
    // The API's callers (agent_calls) name the fixture by its file:// URL, as an
    // operator lets them with this allow-list (ADR 22); read by the worker as it starts.
    std::env::set_var(grove_core::local_repo::ROOTS_ENV, &dir);

    // A sandbox image for the Docker cases, built before the worker starts so its
    // config names it.
    let docker = if wants("exec_docker") {
        ctx::docker_setup().await
    } else {
        Err("not selected".to_string())
    };

    let mut ctx = ctx::Ctx::start(args.clone(), pool, home, dir.clone(), upstream, docker).await?;
    let mut out = Out {
        json: args.json,
        rows: Vec::new(),
    };
    let res = cases::run_all(&mut ctx, &mut out, &wants).await;
    ctx.stop().await;
    res?;
    Ok(out)
}
