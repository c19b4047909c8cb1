//! The `grove` command: migrate, run workers, and submit commands to the queue.
//!
//! Commands that change state enqueue a job and wait for its recorded outcome. Every
//! error is one stderr line `grove: <kind>: <message>` (printed by [`report`]). Exit
//! codes: 0 success, 2 bad input, 3 not found, 4 conflict or locked, 1 anything else;
//! `grove exec` exits with the command's own code (124 on timeout).

mod client;
mod db;
mod evict;
mod history;
mod localdb;
mod mcp;
mod merge_back;
mod otel;
mod pr;
mod progress_bar;
mod remote;
mod serve;
mod tool;
mod wire;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use grove_core::commands::{AcquireWorkspace, Command, CommandResult, EnsureRepoCache, Exec};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::model::{ExecKind, WorkspaceMode};
use grove_core::placement::Placement;
use grove_core::ports::NetworkPolicy;
use grove_core::validate::ValidationError;
use grove_postgres::{reader, replay, rows};
use sqlx::PgPool;
use uuid::Uuid;

#[derive(Parser)]
#[command(
    name = "grove",
    version,
    about = "Sandbox control plane for AI coding agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Top,
}

#[derive(Subcommand)]
enum Top {
    /// Apply all migrations to $DATABASE_URL (or the private cluster).
    Migrate,
    /// Run a worker until SIGINT/SIGTERM.
    Worker {
        /// The node this worker serves: it takes that node's jobs and owns its workspaces.
        #[arg(long, default_value = "local", env = "GROVE_NODE")]
        node: String,
        /// Jobs run at once (at least 1).
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Serve Prometheus metrics at http://ADDR/metrics, without a token (for a
        /// network only the scraper reaches).
        #[arg(long = "metrics-bind", env = "GROVE_METRICS_BIND")]
        metrics_bind: Option<String>,
    },
    /// Serve the HTTP API; runs a worker in-process unless --no-worker. Prints the
    /// address it listens on (and, without configured tokens, a dev token) on stdout.
    Serve {
        /// Address to listen on; port 0 picks a free port.
        #[arg(long, default_value = "127.0.0.1:8080", env = "GROVE_BIND")]
        bind: String,
        /// Serve only; leave the jobs to separate `grove worker` processes.
        #[arg(long = "no-worker")]
        no_worker: bool,
        /// The node of the in-process worker, and of the workspaces whose interactive
        /// sessions this server holds.
        #[arg(long, default_value = "local", env = "GROVE_NODE")]
        node: String,
        /// Jobs the in-process worker runs at once.
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Also serve Prometheus metrics at http://ADDR/metrics without a token (the
        /// API's /metrics asks for an operator token).
        #[arg(long = "metrics-bind", env = "GROVE_METRICS_BIND")]
        metrics_bind: Option<String>,
    },
    /// Print the HTTP API's OpenAPI document (the one `grove serve` serves).
    Openapi,
    /// Repo caches.
    #[command(subcommand)]
    Repo(RepoCmd),
    /// Workspaces.
    #[command(subcommand)]
    Workspace(WorkspaceCmd),
    /// Run a command in a workspace.
    Exec(ExecArgs),
    /// Agent tools on a workspace: text editor, files, search, git. Prints JSON.
    Tool(tool::ToolArgs),
    /// A workspace's history: points, diffs, checkpoints, rewind, undo, fork. Prints JSON.
    History(history::HistoryArgs),
    /// Serve one workspace's tools to an MCP client over stdio (stdout is the protocol).
    Mcp(mcp::McpArgs),
    /// Pull requests of a workspace on the git platform (GitHub): create, show, comment.
    #[command(subcommand)]
    Pr(pr::PrCmd),
    /// Read (or follow) the event log.
    Events {
        /// Only the events of this stream (e.g. `workspace:<uuid>`); default: all streams.
        #[arg(long)]
        stream: Option<String>,
        /// Start after this log position (the first number of each printed line);
        /// default: from the beginning.
        #[arg(long)]
        after: Option<i64>,
        /// Keep running and print new events as they are appended (until Ctrl-C).
        #[arg(long)]
        follow: bool,
        /// One JSON object per event, one per line.
        #[arg(long)]
        json: bool,
    },
    /// Rebuild the projections from the log and compare them with the live tables.
    Replay {
        /// Compare only (required): exit 1 and print each difference if they disagree.
        #[arg(long)]
        verify: bool,
    },
    /// The private Postgres cluster used when DATABASE_URL is unset.
    #[command(subcommand)]
    Db(DbCmd),
    /// Sandbox images for `--runtime docker`, built offline from this machine's packages.
    #[command(subcommand)]
    Image(ImageCmd),
    /// List the runtime providers grove knows, whether each is configured here, and
    /// what each can do.
    Runtimes {
        /// One JSON object per provider, one per line.
        #[arg(long)]
        json: bool,
    },
    /// Run an eviction sweep of a node now (or print its plan with --dry-run).
    Evict {
        /// The node to sweep (default: `local`).
        #[arg(long, allow_hyphen_values = true)]
        node: Option<String>,
        /// Print the plan (what, why, bytes freed) without changing anything.
        #[arg(long = "dry-run")]
        dry_run: bool,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
        /// Plan as if it were this time (RFC 3339). Workers accept it only with
        /// GROVE_ALLOW_CLOCK_OVERRIDE=1; for tests.
        #[arg(long, hide = true)]
        now: Option<String>,
        /// Idempotency key (a UUID): the same id submitted twice runs once.
        #[arg(long = "command-id")]
        command_id: Option<Uuid>,
    },
    /// Release everything of one conversation or task of a user: runtimes stopped,
    /// workspaces kept (or destroyed with --destroy-workspaces).
    Release {
        /// The user whose workspaces are released.
        #[arg(long, allow_hyphen_values = true)]
        user: String,
        /// Only this project of the user (default: all of the user's projects).
        #[arg(long, allow_hyphen_values = true)]
        project: Option<String>,
        /// Only the workspaces of this conversation (edit and analysis workspaces).
        #[arg(long, allow_hyphen_values = true, conflicts_with = "task")]
        conversation: Option<String>,
        /// Only the workspace of this task.
        #[arg(long, allow_hyphen_values = true)]
        task: Option<String>,
        /// Destroy the workspaces too (files deleted), not only their runtimes.
        #[arg(long = "destroy-workspaces")]
        destroy_workspaces: bool,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ImageCmd {
    /// Build an image; its tag is printed on the last line and becomes the default.
    Build {
        /// A static busybox only (small; enough for shell commands and tests).
        #[arg(long, conflicts_with = "debian", required_unless_present = "debian")]
        minimal: bool,
        /// Debian (debootstrap) with git and CA certificates.
        #[arg(long)]
        debian: bool,
    },
}

#[derive(Subcommand)]
enum DbCmd {
    /// Create and start it if needed; print its DATABASE_URL.
    Start,
    /// Stop it.
    Stop,
}

#[derive(Subcommand)]
enum RepoCmd {
    /// Ensure the repo cache of a repository exists (clone once).
    Ensure {
        /// The repository's name in grove (e.g. `owner/name`); keys the cache.
        #[arg(long, allow_hyphen_values = true)]
        repo: String,
        /// The clone URL (https:// or ssh; no credentials in it: use --token-env).
        #[arg(long, allow_hyphen_values = true)]
        url: String,
        /// A ref to check exists after the ensure (optional).
        #[arg(long = "ref", allow_hyphen_values = true)]
        git_ref: Option<String>,
        /// Fetch even when the cache is fresh.
        #[arg(long)]
        fetch: bool,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Args)]
struct Common {
    /// Name of an environment variable holding a git token for this request.
    #[arg(long = "token-env")]
    token_env: Option<String>,
    /// Idempotency key (a UUID): the same id submitted twice runs once.
    #[arg(long = "command-id")]
    command_id: Option<Uuid>,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum WorkspaceCmd {
    /// Ensure the cache, then get or create the workspace of this key.
    Acquire {
        /// The user the workspace belongs to.
        #[arg(long, allow_hyphen_values = true)]
        user: String,
        /// The user's project.
        #[arg(long, allow_hyphen_values = true)]
        project: String,
        /// The repository's name in grove (e.g. `owner/name`); keys the repo cache.
        #[arg(long, allow_hyphen_values = true)]
        repo: String,
        /// The clone URL (https:// or ssh; no credentials in it: use --token-env).
        #[arg(long, allow_hyphen_values = true)]
        url: String,
        /// The ref the workspace starts from (branch, tag or commit).
        #[arg(long, allow_hyphen_values = true)]
        base: String,
        /// analysis: a clean read-only checkout of --base, one per (user, project, base);
        /// edit: writable, on branch agent/edits-<conversation>, one per conversation
        /// (needs --conversation); task: writable, on branch agent/task-<task>, one per
        /// task (needs --task).
        #[arg(long, allow_hyphen_values = true, value_name = "analysis|edit|task")]
        mode: String,
        /// The conversation of an edit workspace (required with --mode edit).
        #[arg(long, allow_hyphen_values = true)]
        conversation: Option<String>,
        /// The task of a task workspace (required with --mode task).
        #[arg(long, allow_hyphen_values = true)]
        task: Option<String>,
        /// Where the workspace lives: on a worker's node (default; `local` or
        /// `docker`), or inside a remote provider's sandbox (`daytona`, `e2b`).
        #[arg(long, allow_hyphen_values = true)]
        runtime: Option<String>,
        /// A new workspace's history points keep ignored files too (build output,
        /// dependencies), up to GROVE_HISTORY_IGNORED_BUDGET_BYTES each.
        #[arg(long)]
        history_ignored: bool,
        #[command(flatten)]
        common: Common,
    },
    /// List workspaces with their state and eviction order.
    List {
        /// Only this user's workspaces (default: all).
        #[arg(long, allow_hyphen_values = true)]
        user: Option<String>,
        /// One JSON object per workspace, one per line.
        #[arg(long)]
        json: bool,
    },
    /// Show one workspace.
    Show {
        /// The workspace id (a UUID).
        id: String,
        /// Print it as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Release the session: the runtime is stopped (or destroyed); the workspace stays.
    Release {
        /// The workspace id (a UUID).
        id: String,
        /// Destroy the runtime (its processes and container) instead of stopping it.
        #[arg(long = "destroy-runtime")]
        destroy_runtime: bool,
        /// Idempotency key (a UUID): the same id submitted twice runs once.
        #[arg(long = "command-id")]
        command_id: Option<Uuid>,
    },
    /// Stop the workspace's runtime; files stay.
    Hibernate {
        /// The workspace id (a UUID).
        id: String,
    },
    /// Destroy the workspace's runtime; files stay.
    DestroyRuntime {
        /// The workspace id (a UUID).
        id: String,
    },
    /// Check an evicted workspace out again (same id, path, branch) with its saved work.
    Restore {
        /// The workspace id (a UUID).
        id: String,
        /// Name of an environment variable holding a git token for the fetch.
        #[arg(long = "token-env")]
        token_env: Option<String>,
        /// Idempotency key (a UUID): the same id submitted twice runs once.
        #[arg(long = "command-id")]
        command_id: Option<Uuid>,
        /// Print the workspace as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Pin a workspace until a time (RFC 3339): eviction never takes it. --clear unpins.
    Pin {
        /// The workspace id (a UUID).
        id: String,
        /// Pinned until this time (RFC 3339, e.g. 2030-01-01T00:00:00Z).
        #[arg(long)]
        until: Option<String>,
        /// Remove the pin.
        #[arg(long)]
        clear: bool,
        /// Print the workspace as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Delete the workspace and its runtimes.
    Destroy {
        /// The workspace id (a UUID).
        id: String,
        /// Idempotency key (a UUID): the same id submitted twice runs once.
        #[arg(long = "command-id")]
        command_id: Option<Uuid>,
    },
    /// Bring a task workspace's commits into this (edit) workspace's branch.
    MergeBack {
        /// The edit workspace (the target).
        id: String,
        /// The task workspace whose commits are brought in (its id, a UUID).
        #[arg(long)]
        task: String,
        /// merge (fast-forward or a merge commit) or cherry-pick (one new commit each).
        #[arg(long, value_name = "merge|cherry-pick")]
        strategy: String,
        /// Idempotency key (a UUID): the same id submitted twice runs once.
        #[arg(long = "command-id")]
        command_id: Option<Uuid>,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// What a merge-back of a task workspace would bring: commits and changed files.
    MergeBackDiff {
        /// The edit workspace (the target).
        id: String,
        /// The task workspace (its id, a UUID).
        #[arg(long)]
        task: String,
        /// Print the diff as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct ExecArgs {
    /// The workspace id (a UUID).
    id: String,
    /// The runtime the command runs in: local, docker, or a remote provider (daytona, e2b).
    #[arg(long, default_value = "local")]
    runtime: String,
    /// Kill the command after this many seconds (fractions allowed, e.g. 0.5); it then
    /// exits 124. Default: no limit.
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// Keep at most this many bytes of output (default 1 MiB, at most
    /// 16 MiB); the rest is cut and reported as truncated.
    #[arg(long = "max-output", value_name = "BYTES")]
    max_output: Option<u64>,
    /// read: inspection only, runs alongside other reads; write: edits, commits,
    /// formatters (exclusive); install: package managers (exclusive, may ask for
    /// network); test: test runs (exclusive). Default: write, or read in an analysis
    /// workspace.
    #[arg(long, value_name = "read|write|install|test")]
    kind: Option<String>,
    /// Network for the command: none (default), default (the host's), limited.
    #[arg(long, allow_hyphen_values = true, value_name = "none|default|limited")]
    network: Option<String>,
    /// Working directory relative to the workspace root.
    #[arg(long)]
    cwd: Option<String>,
    /// KEY=VALUE for the command's environment (repeatable).
    #[arg(long = "env")]
    env: Vec<String>,
    /// Pass this process's stdin to the command.
    #[arg(long)]
    stdin: bool,
    /// Idempotency key (a UUID): the same id submitted twice runs once.
    #[arg(long = "command-id")]
    command_id: Option<Uuid>,
    /// Print the outcome (exit code, stdout, stderr, duration) as one JSON object
    /// instead of replaying the output; grove then exits 0.
    #[arg(long)]
    json: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    cmd: Vec<String>,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind as Clap;
            if matches!(
                e.kind(),
                Clap::DisplayHelp
                    | Clap::DisplayVersion
                    | Clap::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // Bad usage is bad input: one line, exit 2.
            let rendered = e.render().to_string();
            let first = rendered
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid arguments");
            return report(ErrorKind::InvalidInput, first.trim_start_matches("error: "));
        }
    };
    let is_worker = matches!(
        cli.command,
        Top::Worker { .. }
            | Top::Serve {
                no_worker: false,
                ..
            }
    ) || matches!(&cli.command, Top::Mcp(a) if a.worker);
    if is_worker {
        // SAFETY: no thread has been spawned yet; the runtime is built below.
        if let Err(e) = unsafe { grove_workers::init_process() } {
            return report(ErrorKind::Internal, &e.to_string());
        }
    }
    let traces = init_tracing(is_worker);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&anyhow::Error::from(e)),
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => fail(&e),
    };
    drop(runtime);
    if let Some(traces) = traces {
        traces.shutdown();
    }
    code
}

/// Logs to stderr (`GROVE_LOG`); with `OTEL_EXPORTER_OTLP_ENDPOINT`, trace spans over
/// OTLP too (the returned exporter is flushed at exit).
fn init_tracing(worker: bool) -> Option<otel::Otel> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let default = if worker { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("GROVE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_filter(filter);
    let (traces, exporter) = match otel::layer() {
        Ok(Some((layer, exporter))) => (Some(layer), Some(exporter)),
        Ok(None) => (None, None),
        Err(e) => {
            eprintln!("grove: traces are not exported: {e}");
            (None, None)
        }
    };
    tracing_subscriber::registry().with(log).with(traces).init();
    exporter
}

/// Reports a failed command with the kind [`classify`] gives it.
fn fail(e: &anyhow::Error) -> ExitCode {
    let (kind, message) = classify(e);
    report(kind, &message)
}

/// The kind and message of a failed command: typed errors keep theirs, validation
/// errors are `invalid_input`, a lost or unreachable database `unavailable`, the rest
/// `internal`.
fn classify(e: &anyhow::Error) -> (ErrorKind, String) {
    if let Some(c) = e.downcast_ref::<CommandError>() {
        return (c.kind, c.message.clone());
    }
    if let Some(v) = e.downcast_ref::<ValidationError>() {
        return (ErrorKind::InvalidInput, v.to_string());
    }
    let unreachable = e.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<sqlx::Error>(),
            Some(
                sqlx::Error::Io(_)
                    | sqlx::Error::PoolTimedOut
                    | sqlx::Error::PoolClosed
                    | sqlx::Error::WorkerCrashed
            )
        )
    });
    if unreachable {
        return (ErrorKind::Unavailable, format!("{e:#}"));
    }
    if e.chain().any(is_missing_schema) {
        return (
            ErrorKind::Unavailable,
            "the database has no grove schema (or an older one): run `grove migrate` \
             against it, or start a worker, which migrates as it starts"
                .into(),
        );
    }
    (ErrorKind::Internal, format!("{e:#}"))
}

/// Whether `cause` is Postgres saying a relation or function grove makes does not
/// exist (SQLSTATE 42P01 undefined_table, 42883 undefined_function, 3F000
/// invalid_schema_name): a database nobody migrated.
fn is_missing_schema(cause: &(dyn std::error::Error + 'static)) -> bool {
    let sql = cause.downcast_ref::<sqlx::Error>().or_else(|| {
        match cause.downcast_ref::<grove_postgres::StoreError>() {
            Some(grove_postgres::StoreError::Database(e)) => Some(e),
            _ => None,
        }
    });
    let Some(sqlx::Error::Database(db)) = sql else {
        return false;
    };
    matches!(db.code().as_deref(), Some("42P01" | "42883" | "3F000"))
}

/// The one way the CLI reports an error: a single line `grove: <kind>: <message>` on
/// stderr (the database password scrubbed), and the kind's documented exit code.
pub(crate) fn report(kind: ErrorKind, message: &str) -> ExitCode {
    let url = std::env::var("DATABASE_URL").unwrap_or_default();
    let message = db::scrub(&message.replace('\n', " "), &url);
    eprintln!("grove: {}: {message}", kind.as_str());
    ExitCode::from(kind.exit_code().clamp(0, 255) as u8)
}

/// `$GROVE_HOME`, or its default: `/var/lib/grove` for root, else `~/.local/share/grove`.
pub(crate) fn grove_home() -> PathBuf {
    if let Some(home) = std::env::var_os("GROVE_HOME") {
        return PathBuf::from(home);
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/lib/grove");
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("grove")
}

/// The database to use: `DATABASE_URL`, or the private cluster under `$GROVE_HOME`
/// (`true`), started if it is not running, which this process announces on stderr.
fn database_url(home: &std::path::Path) -> Result<(String, bool)> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => Ok((url, false)),
        _ => {
            let local = localdb::LocalDb::new(home);
            let (url, started) = local.ensure_running_reporting()?;
            if started {
                eprintln!(
                    "grove: started the private Postgres cluster in {} (it keeps running; `grove db stop` stops it)",
                    local.dir().display()
                );
            }
            Ok((url, true))
        }
    }
}

/// A pool on the database. The private cluster is migrated first, so any command works
/// on a fresh `$GROVE_HOME`; a database of `DATABASE_URL` is migrated by workers and
/// `grove migrate`.
pub(crate) async fn connect(max: u32) -> Result<PgPool> {
    let home = grove_home();
    let (url, private) = database_url(&home)?;
    let pool = db::open_pool(&url, max).await?;
    if private {
        grove_postgres::migrate::migrate(&pool).await?;
    }
    Ok(pool)
}

pub(crate) fn invalid(msg: impl Into<String>) -> anyhow::Error {
    CommandError::new(ErrorKind::InvalidInput, msg).into()
}

fn parse_id(raw: &str) -> Result<Uuid> {
    Uuid::parse_str(raw).map_err(|_| {
        invalid(format!(
            "invalid workspace id {:?}: expected a UUID",
            raw.chars().take(40).collect::<String>()
        ))
    })
}

fn read_token(var: &Option<String>) -> Result<Option<String>> {
    match var {
        None => Ok(None),
        Some(name) => match std::env::var(name) {
            Ok(v) if !v.is_empty() => Ok(Some(v)),
            _ => Err(invalid(format!(
                "--token-env {name}: that environment variable is not set"
            ))),
        },
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Top::Migrate => {
            let pool = connect(2).await?;
            grove_postgres::migrate::migrate(&pool).await?;
            println!("migrations applied");
            Ok(ExitCode::SUCCESS)
        }
        Top::Db(DbCmd::Start) => {
            let url = localdb::LocalDb::new(&grove_home()).ensure_running()?;
            println!("{url}");
            Ok(ExitCode::SUCCESS)
        }
        Top::Db(DbCmd::Stop) => {
            localdb::LocalDb::new(&grove_home()).stop()?;
            Ok(ExitCode::SUCCESS)
        }
        Top::Worker {
            node,
            concurrency,
            metrics_bind,
        } => run_worker(node, concurrency, metrics_bind).await,
        Top::Serve {
            bind,
            no_worker,
            node,
            concurrency,
            metrics_bind,
        } => {
            serve::serve(
                bind,
                node,
                (!no_worker).then_some(concurrency),
                metrics_bind,
            )
            .await
        }
        Top::Openapi => {
            print!("{}", grove_api::openapi_json());
            Ok(ExitCode::SUCCESS)
        }
        Top::Runtimes { json } => {
            let mut config = grove_workers::WorkerConfig::new(grove_home(), "local".into());
            let registry = grove_workers::build_runtimes(&mut config).await;
            print_runtimes(&registry.statuses(), json)?;
            Ok(ExitCode::SUCCESS)
        }
        Top::Image(ImageCmd::Build { minimal, debian }) => {
            let docker = grove_docker::DockerRuntimeProvider::connect().await?;
            let tag = if minimal && !debian {
                grove_docker::image::build_minimal(docker.docker()).await?
            } else {
                grove_docker::image::build_debian(docker.docker()).await?
            };
            let home = grove_home();
            grove_docker::image::record_default_image(&home, &tag)?;
            println!("{tag}");
            Ok(ExitCode::SUCCESS)
        }
        Top::Repo(RepoCmd::Ensure {
            repo,
            url,
            git_ref,
            fetch,
            common,
        }) => {
            if let Some(r) = &git_ref {
                grove_core::validate::validate_ref(r)?;
            }
            let command = Command::EnsureRepoCache(EnsureRepoCache {
                repo_name: repo,
                repo_url: url,
                fetch,
            });
            command.validate()?;
            let token = read_token(&common.token_env)?;
            let pool = connect(4).await?;
            // The id is chosen here so the progress bar can follow the command.
            let id = common.command_id.unwrap_or_else(Uuid::now_v7);
            let bar = progress_bar::start(&pool, id, common.json);
            let result = client::submit(&pool, &command, Some(id), token.as_deref()).await;
            if let Some(bar) = bar {
                bar.finish().await;
            }
            print_result(&result?, common.json)
        }
        Top::Workspace(cmd) => workspace(cmd).await,
        Top::Evict {
            node,
            dry_run,
            json,
            now,
            command_id,
        } => evict::evict(node, dry_run, json, now, command_id).await,
        Top::Release {
            user,
            project,
            conversation,
            task,
            destroy_workspaces,
            json,
        } => evict::release(user, project, conversation, task, destroy_workspaces, json).await,
        Top::Exec(args) => exec(args).await,
        Top::Tool(args) => tool::tool(args).await,
        Top::History(args) => history::history(args).await,
        Top::Mcp(args) => mcp::mcp(args).await,
        Top::Pr(cmd) => pr::pr(cmd).await,
        Top::Events {
            stream,
            after,
            follow,
            json,
        } => events(stream, after, follow, json).await,
        Top::Replay { verify } => {
            if !verify {
                return Err(invalid("only `grove replay --verify` is supported"));
            }
            let pool = connect(4).await?;
            let verified = replay::verify(&pool).await?;
            if verified.diffs.is_empty() {
                println!("replay: {} events, projections identical", verified.events);
                Ok(ExitCode::SUCCESS)
            } else {
                for d in &verified.diffs {
                    println!("diff: {d}");
                }
                Ok(report(
                    ErrorKind::Internal,
                    &format!(
                        "replay found {} difference(s) between the log and the live projections",
                        verified.diffs.len()
                    ),
                ))
            }
        }
    }
}

/// `grove runtimes`: one JSON line per provider, or a table.
fn print_runtimes(statuses: &[grove_core::ports::ProviderStatus], json: bool) -> Result<()> {
    if json {
        for s in statuses {
            println!("{}", serde_json::to_string(s)?);
        }
        return Ok(());
    }
    let yes = |b: bool| if b { "yes" } else { "no" };
    println!(
        "{:<8} {:<10} {:<8} {:<8} {:<8} {:<8} {:<8} {:<22} DETAIL",
        "KIND", "CONFIGURED", "WRITABLE", "ISOLATED", "SESSIONS", "SNAPSHOT", "PREVIEW", "NETWORK"
    );
    for s in statuses {
        let c = &s.capabilities;
        let network: Vec<&str> = c
            .network_policies()
            .into_iter()
            .map(|p| match p {
                grove_core::ports::NetworkPolicy::None => "none",
                grove_core::ports::NetworkPolicy::Limited => "limited",
                grove_core::ports::NetworkPolicy::Default => "default",
            })
            .collect();
        println!(
            "{:<8} {:<10} {:<8} {:<8} {:<8} {:<8} {:<8} {:<22} {}",
            s.kind,
            yes(s.configured),
            yes(c.writable),
            yes(c.isolated),
            yes(c.interactive_session),
            yes(c.snapshot),
            yes(c.preview_url),
            network.join(","),
            s.detail.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}

async fn run_worker(
    node: String,
    concurrency: usize,
    metrics_bind: Option<String>,
) -> Result<ExitCode> {
    let worker = build_worker(node, concurrency).await?;
    if let Some(bind) = metrics_bind {
        let addr = serve::metrics_listener(&bind, worker.deps().pool.clone()).await?;
        println!("grove: metrics on http://{addr}/metrics");
    }
    worker.run(shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

/// A worker's (or server's) node name: a valid id that is not a remote runtime's name.
/// Such a node's queue would be the provider's (its jobs would reach workers without
/// the provider), and its sweep and sessions would take in-sandbox paths for host ones.
pub(crate) fn validate_node(node: &str) -> Result<()> {
    grove_core::validate::validate_owner_id("node", node)?;
    if Placement::of_node(node).is_remote() {
        return Err(invalid(format!(
            "node name {node:?} is reserved for the remote runtime of that name"
        )));
    }
    Ok(())
}

/// A worker with its own pool, on a migrated database.
pub(crate) async fn build_worker(
    node: String,
    concurrency: usize,
) -> Result<grove_workers::Worker> {
    validate_node(&node)?;
    let home = grove_home();
    grove_workers::home::secure_home(&home)
        .with_context(|| format!("making GROVE_HOME {} private", home.display()))?;
    let pool = connect((concurrency as u32) * 2 + 6).await?;
    grove_postgres::migrate::migrate(&pool).await?;
    let mut config = grove_workers::WorkerConfig::new(home, node);
    config.eviction = grove_workers::config::EvictionSettings::from_env().map_err(invalid)?;
    config.history_ignored_budget =
        grove_workers::config::history_ignored_budget_from_env().map_err(invalid)?;
    config.concurrency = concurrency.max(1);
    if let Some(secs) = env_secs("GROVE_WORKER_LOST_AFTER") {
        config.worker_lost_after = secs;
    }
    if let Some(secs) = env_secs("GROVE_EXEC_OUTPUT_RETENTION") {
        config.output_retention = secs;
    }
    let deps = grove_workers::build_deps(pool, config).await;
    Ok(grove_workers::Worker::new(deps))
}

pub(crate) fn env_secs(name: &str) -> Option<Duration> {
    std::env::var(name)
        .ok()?
        .parse::<f64>()
        .ok()
        .map(Duration::from_secs_f64)
}

pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

async fn workspace(cmd: WorkspaceCmd) -> Result<ExitCode> {
    match cmd {
        WorkspaceCmd::Acquire {
            user,
            project,
            repo,
            url,
            base,
            mode,
            conversation,
            task,
            runtime,
            history_ignored,
            common,
        } => {
            let mode = WorkspaceMode::parse(&mode)?;
            let command = Command::AcquireWorkspace(AcquireWorkspace {
                user_id: user,
                project_id: project,
                repo_name: repo,
                repo_url: url,
                base_ref: base,
                mode,
                conversation_id: conversation,
                task_id: task,
                runtime,
                history_ignored,
            });
            command.validate()?;
            let token = read_token(&common.token_env)?;
            let pool = connect(4).await?;
            // The id is chosen here so the progress bar can follow the command.
            let id = common.command_id.unwrap_or_else(Uuid::now_v7);
            let bar = progress_bar::start(&pool, id, common.json);
            let result = client::submit(&pool, &command, Some(id), token.as_deref()).await;
            if let Some(bar) = bar {
                bar.finish().await;
            }
            print_result(&result?, common.json)
        }
        WorkspaceCmd::List { user, json } => {
            let pool = connect(2).await?;
            let mut conn = pool.acquire().await?;
            let list = rows::workspaces(&mut conn, user.as_deref()).await?;
            drop(conn);
            // What eviction would take next: position in the node's order (1 = first).
            let order = evict::queue_positions(&pool, &list).await?;
            let mut out = std::io::stdout().lock();
            for ws in list {
                let (eviction, short) = evict::queue_field(order.get(&ws.id));
                if json {
                    let mut value = serde_json::to_value(&ws)?;
                    value["eviction"] = eviction;
                    writeln!(out, "{value}")?;
                } else {
                    writeln!(
                        out,
                        "{}  {:<8} {:<9} dirty={:<5} {:<18} {}  {}",
                        ws.id,
                        ws.mode.as_str(),
                        ws.state,
                        ws.dirty,
                        short,
                        ws.branch_name.as_deref().unwrap_or(&ws.base_ref),
                        ws.local_path
                    )?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        WorkspaceCmd::Restore {
            id,
            token_env,
            command_id,
            json,
        } => evict::restore(id, token_env, command_id, json).await,
        WorkspaceCmd::Pin {
            id,
            until,
            clear,
            json,
        } => evict::pin(id, until, clear, json).await,
        WorkspaceCmd::MergeBack {
            id,
            task,
            strategy,
            command_id,
            json,
        } => merge_back::merge_back(id, task, strategy, command_id, json).await,
        WorkspaceCmd::MergeBackDiff { id, task, json } => merge_back::diff(id, task, json).await,
        WorkspaceCmd::Show { id, json } => {
            let id = parse_id(&id)?;
            let pool = connect(2).await?;
            let mut conn = pool.acquire().await?;
            let ws = rows::workspace(&mut conn, id).await?.ok_or_else(|| {
                CommandError::new(ErrorKind::NotFound, format!("workspace {id} not found"))
            })?;
            print_result(&CommandResult::Workspace(ws), json)
        }
        WorkspaceCmd::Release {
            id,
            destroy_runtime,
            command_id,
        } => {
            let workspace_id = parse_id(&id)?;
            simple(
                Command::ReleaseSession {
                    workspace_id,
                    destroy_runtime,
                },
                command_id,
            )
            .await
        }
        WorkspaceCmd::Hibernate { id } => {
            simple(
                Command::HibernateRuntime {
                    workspace_id: parse_id(&id)?,
                },
                None,
            )
            .await
        }
        WorkspaceCmd::DestroyRuntime { id } => {
            simple(
                Command::DestroyRuntime {
                    workspace_id: parse_id(&id)?,
                },
                None,
            )
            .await
        }
        WorkspaceCmd::Destroy { id, command_id } => {
            simple(
                Command::DestroyWorkspace {
                    workspace_id: parse_id(&id)?,
                },
                command_id,
            )
            .await
        }
    }
}

async fn simple(command: Command, command_id: Option<Uuid>) -> Result<ExitCode> {
    let pool = connect(4).await?;
    client::submit(&pool, &command, command_id, None).await?;
    Ok(ExitCode::SUCCESS)
}

async fn exec(args: ExecArgs) -> Result<ExitCode> {
    let workspace_id = parse_id(&args.id)?;
    let kind = args.kind.as_deref().map(ExecKind::parse).transpose()?;
    let network = match args.network.as_deref() {
        None => None,
        Some("none") => Some(NetworkPolicy::None),
        Some("default") => Some(NetworkPolicy::Default),
        Some("limited") => Some(NetworkPolicy::Limited),
        Some(other) => {
            return Err(invalid(format!(
                "invalid network {:?}: expected none, default or limited",
                other.chars().take(40).collect::<String>()
            )))
        }
    };
    let mut env = BTreeMap::new();
    for pair in &args.env {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| invalid(format!("--env {pair:?}: expected KEY=VALUE")))?;
        env.insert(k.to_string(), v.to_string());
    }
    let timeout_ms = match args.timeout {
        Some(t) if !(t > 0.0 && t.is_finite()) => {
            return Err(invalid("--timeout must be a positive number of seconds"))
        }
        Some(t) => Some((t * 1000.0) as u64),
        None => None,
    };
    let stdin = if args.stdin {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf)?;
        Some(buf)
    } else {
        None
    };
    let command = Command::Exec(Exec {
        workspace_id,
        runtime: args.runtime,
        argv: args.cmd,
        env,
        cwd: args.cwd,
        stdin,
        timeout_ms,
        max_output_bytes: args.max_output,
        kind,
        network,
        keep_output: true,
    });
    command.validate()?;
    let outcome = match remote::Server::from_env()? {
        Some(server) => {
            let Command::Exec(exec) = &command else {
                unreachable!("built above")
            };
            server.exec(exec, args.command_id).await?
        }
        None => {
            let pool = connect(4).await?;
            let result = client::submit(&pool, &command, args.command_id, None).await?;
            let CommandResult::Exec(outcome) = result else {
                anyhow::bail!("unexpected result for exec");
            };
            outcome
        }
    };
    if args.json {
        println!("{}", serde_json::to_string(&outcome)?);
        return Ok(ExitCode::SUCCESS);
    }
    std::io::stdout().write_all(outcome.stdout.as_bytes())?;
    std::io::stderr().write_all(outcome.stderr.as_bytes())?;
    if outcome.truncated {
        eprintln!("grove: output truncated");
    }
    if outcome.timed_out {
        eprintln!("grove: command timed out");
    }
    let code = outcome.reported_exit_code().clamp(0, 255);
    Ok(ExitCode::from(code as u8))
}

fn print_result(result: &CommandResult, json: bool) -> Result<ExitCode> {
    match result {
        CommandResult::RepoCache(row) => {
            if json {
                println!("{}", serde_json::to_string(row)?);
            } else {
                println!("{}  {}  {}", row.id, row.repo_name, row.local_path);
            }
        }
        CommandResult::Workspace(row) => {
            if json {
                println!("{}", serde_json::to_string(row)?);
            } else {
                println!(
                    "{}  {}  {}  {}",
                    row.id,
                    row.mode.as_str(),
                    row.branch_name.as_deref().unwrap_or(&row.base_ref),
                    row.local_path
                );
            }
        }
        CommandResult::Exec(o) => println!("{}", serde_json::to_string(o)?),
        CommandResult::Sweep(report) => evict::print_report(report, json)?,
        CommandResult::Released(report) => evict::print_released(report, json)?,
        CommandResult::Tool(output) => println!("{}", serde_json::to_string(output)?),
        CommandResult::MergeBackDiff(d) => merge_back::print_diff(d, json)?,
        CommandResult::MergedBack(r) => merge_back::print_report(r, json)?,
        CommandResult::PullRequest(pr) => println!("{}", serde_json::to_string(pr)?),
        CommandResult::PullRequestComment(c) => println!("{}", serde_json::to_string(c)?),
        CommandResult::Done => {}
    }
    Ok(ExitCode::SUCCESS)
}

async fn events(
    stream: Option<String>,
    after: Option<i64>,
    follow: bool,
    json: bool,
) -> Result<ExitCode> {
    let pool = connect(3).await?;
    let mut conn = pool.acquire().await?;
    let mut cursor = match after {
        Some(p) => reader::cursor_at(&mut conn, p).await?,
        None => reader::Cursor::default(),
    };
    let mut listener = if follow {
        let mut l = sqlx::postgres::PgListener::connect_with(&pool).await?;
        l.listen("grove_events").await?;
        Some(l)
    } else {
        None
    };
    let mut out = std::io::stdout().lock();
    loop {
        let batch = reader::read_after(&mut conn, cursor, stream.as_deref(), 1000).await?;
        for e in &batch {
            if json {
                writeln!(out, "{}", serde_json::to_string(e)?)?;
            } else {
                let (_, payload) = e.event.to_stored();
                writeln!(
                    out,
                    "{} {} v{} {} {}",
                    e.position, e.stream_id, e.stream_version, e.event_type, payload
                )?;
            }
            cursor = reader::Cursor::after(e);
        }
        out.flush()?;
        if batch.len() == 1000 {
            continue;
        }
        let Some(l) = listener.as_mut() else {
            return Ok(ExitCode::SUCCESS);
        };
        // Woken by the insert trigger; the timeout is the fallback for a lost listener
        // and for transactions that were still open below xmin on the last read.
        let _ = tokio::time::timeout(Duration::from_millis(500), l.try_recv()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every argument of every subcommand, as `path: --name`, that has no help text.
    fn missing_help(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let has = arg
                .get_help()
                .is_some_and(|h| !h.to_string().trim().is_empty());
            if !has {
                out.push(format!("{path}: {id}"));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_name() == "help" {
                continue;
            }
            missing_help(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_argument_of_every_subcommand_has_help() {
        let mut missing = Vec::new();
        missing_help(&Cli::command(), "grove", &mut missing);
        assert!(
            missing.is_empty(),
            "arguments without help:\n{}",
            missing.join("\n")
        );
    }

    #[test]
    fn the_help_walk_detects_an_argument_without_help() {
        let cmd = clap::Command::new("x")
            .subcommand(clap::Command::new("y").arg(clap::Arg::new("bare").long("bare")));
        let mut missing = Vec::new();
        missing_help(&cmd, "x", &mut missing);
        assert_eq!(missing, vec!["x y: bare".to_string()]);
    }

    #[test]
    fn errors_are_classified_into_their_kinds() {
        use super::classify;
        use grove_core::error::{CommandError, ErrorKind};
        let typed = anyhow::Error::from(CommandError::new(ErrorKind::NotFound, "gone"));
        assert_eq!(classify(&typed), (ErrorKind::NotFound, "gone".to_string()));
        let bad = anyhow::Error::from(grove_core::model::WorkspaceMode::parse("x").unwrap_err());
        assert_eq!(classify(&bad).0, ErrorKind::InvalidInput);
        let lost = anyhow::Error::from(sqlx::Error::PoolTimedOut).context("listing workspaces");
        assert_eq!(classify(&lost).0, ErrorKind::Unavailable);
        let other = anyhow::anyhow!("something broke");
        assert_eq!(
            classify(&other),
            (ErrorKind::Internal, "something broke".into())
        );
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
