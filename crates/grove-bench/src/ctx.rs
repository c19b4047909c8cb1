//! The bench's shared context: the database and fixtures every case uses, the worker
//! running in this process, the Docker pieces, and the small helpers the cases share.
//!
//! The case modules (`cases`, `sweep`, `http`) import from here and never from each
//! other, except `cases::run_all`, which calls each case.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use grove_core::commands::{AcquireWorkspace, Command, CommandResult, EnsureRepoCache, Exec};
use grove_core::model::{ExecKind, WorkspaceMode, WorkspaceRow};
use sqlx::PgPool;
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::client::Client;
use crate::Args;

pub(crate) const NODE: &str = "bench";
pub(crate) const REPO: &str = "bench/repo";

pub(crate) fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// The bench's worker's recent-use window (ADR 40): `GROVE_RECORD_USE_AFTER` seconds,
/// as `grove serve` reads it (0: every warm acquire and ensure is recorded), else the
/// default.
pub(crate) fn record_use_after() -> std::time::Duration {
    std::env::var("GROVE_RECORD_USE_AFTER")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .map_or(
            grove_workers::config::DEFAULT_RECORD_USE_AFTER,
            std::time::Duration::from_secs,
        )
}

/// A worker running on a tokio task until its shutdown fires.
pub(crate) struct RunningWorker {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    /// The worker's read tools, for an API served in this process (ADR 24).
    pub(crate) inline: std::sync::Arc<dyn grove_core::inline::InlineReads>,
    /// The worker's write tools and execs, for the same API (ADR 31).
    pub(crate) inline_writes: std::sync::Arc<dyn grove_core::inline::InlineWrites>,
}

impl RunningWorker {
    pub(crate) async fn start(
        pool: PgPool,
        home: &Path,
        node: &str,
        concurrency: usize,
        image: Option<String>,
    ) -> Self {
        Self::start_with(pool, home, node, concurrency, image, true).await
    }

    /// As `start`, with workspace history (ADR 28) on or off.
    pub(crate) async fn start_with(
        pool: PgPool,
        home: &Path,
        node: &str,
        concurrency: usize,
        image: Option<String>,
        history: bool,
    ) -> Self {
        let mut config = grove_workers::WorkerConfig::new(home.to_path_buf(), node.to_string());
        config.concurrency = concurrency;
        config.history = history;
        config.eviction.schedule = None;
        // The TTL sweep case plans with a clock four days ahead.
        config.eviction.allow_clock_override = true;
        config.docker_image = image;
        config.eviction.record_use_after = record_use_after();
        // The fixtures are file:// repositories next to $GROVE_HOME: allow-listed, as an
        // operator would list them (the bench submits as an API caller would).
        config.local_repos = grove_core::local_repo::LocalRepoPolicy::new(
            home.parent().map(Path::to_path_buf).into_iter().collect(),
            home.to_path_buf(),
        );
        let deps = grove_workers::build_deps(pool, config).await;
        let worker = grove_workers::Worker::new(deps);
        worker.register().await.expect("register worker");
        let inline = worker.inline_reads();
        let inline_writes = worker.inline_writes();
        let (stop, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            if let Err(e) = worker
                .run(async move {
                    let _ = rx.await;
                })
                .await
            {
                eprintln!("grove-bench: worker failed: {e}");
            }
        });
        Self {
            stop,
            task,
            inline,
            inline_writes,
        }
    }

    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// The Docker pieces, when an engine answers and an image could be built.
pub struct DockerBits {
    pub(crate) provider: grove_docker::DockerRuntimeProvider,
    pub(crate) image: String,
}

/// Connects to Docker and builds the minimal image; the error is the skip reason.
pub async fn docker_setup() -> Result<DockerBits, String> {
    let provider = grove_docker::DockerRuntimeProvider::connect()
        .await
        .map_err(|e| format!("no Docker engine answers: {e}"))?;
    let image = grove_docker::image::build_minimal(provider.docker())
        .await
        .map_err(|e| format!("cannot build the minimal image: {e}"))?;
    Ok(DockerBits {
        provider: provider
            .with_default_image(image.clone())
            .with_user("65534:65534"),
        image,
    })
}

/// What every case shares: the arguments, the database, the fixtures, the worker.
pub struct Ctx {
    pub(crate) args: Args,
    pub(crate) pool: PgPool,
    pub(crate) home: PathBuf,
    pub(crate) dir: PathBuf,
    pub(crate) url: String,
    pub(crate) upstream: PathBuf,
    pub(crate) client: Client,
    worker: Option<RunningWorker>,
    pub(crate) docker: Result<DockerBits, String>,
    /// Edit workspaces made so far (conversation id, row), reused by later cases.
    pub(crate) workspaces: Vec<WorkspaceRow>,
}

impl Ctx {
    pub async fn start(
        args: Args,
        pool: PgPool,
        home: PathBuf,
        dir: PathBuf,
        upstream: PathBuf,
        docker: Result<DockerBits, String>,
    ) -> Result<Self> {
        let image = docker.as_ref().ok().map(|d| d.image.clone());
        // Concurrency high enough for the memory case's concurrent execs.
        let concurrency = args.rss_execs.max(8) + 8;
        // The worker's own pool, as `grove worker` has (it sizes it 2c + 6; capped here
        // so the bench stays under Postgres' default max_connections of 100): every
        // running exec holds one connection for its workspace lock.
        let worker_pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(((2 * concurrency + 6) as u32).min(70))
            .acquire_timeout(Duration::from_secs(60))
            .connect_with((*pool.connect_options()).clone())
            .await?;
        let worker = RunningWorker::start(worker_pool, &home, NODE, concurrency, image).await;
        let client = Client::new(pool.clone()).await?;
        Ok(Self {
            url: format!("file://{}", upstream.display()),
            args,
            pool,
            home,
            dir,
            upstream,
            client,
            worker: Some(worker),
            docker,
            workspaces: Vec::new(),
        })
    }

    /// The running worker's inline reads (ADR 24).
    pub(crate) fn inline_reads(
        &self,
    ) -> Option<std::sync::Arc<dyn grove_core::inline::InlineReads>> {
        self.worker.as_ref().map(|w| w.inline.clone())
    }

    /// The running worker's inline write tools and execs (ADR 31).
    pub(crate) fn inline_writes(
        &self,
    ) -> Option<std::sync::Arc<dyn grove_core::inline::InlineWrites>> {
        self.worker.as_ref().map(|w| w.inline_writes.clone())
    }

    /// Replaces the running worker by one with workspace history on or off.
    pub(crate) async fn restart_worker(&mut self, history: bool) -> Result<()> {
        if let Some(w) = self.worker.take() {
            w.stop().await;
        }
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(20)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with((*self.pool.connect_options()).clone())
            .await?;
        let image = self.docker.as_ref().ok().map(|d| d.image.clone());
        self.worker =
            Some(RunningWorker::start_with(pool, &self.home, NODE, 16, image, history).await);
        Ok(())
    }

    /// Submits a command and returns its result.
    pub(crate) async fn submit(&self, cmd: &Command) -> Result<CommandResult> {
        self.client.submit(cmd).await
    }

    /// A mutating (`write`) exec through the queue that must exit 0.
    pub(crate) async fn exec_write(&self, ws: Uuid, argv: &[&str]) -> Result<()> {
        let mut cmd = self.exec_cmd(ws, "local", argv);
        if let Command::Exec(e) = &mut cmd {
            e.kind = Some(ExecKind::Write);
        }
        match self.client.submit(&cmd).await? {
            CommandResult::Exec(o) if o.exit_code == 0 => Ok(()),
            CommandResult::Exec(o) => bail!("exec exited {}: {}", o.exit_code, o.stderr),
            other => bail!("exec returned {other:?}"),
        }
    }

    pub async fn stop(&mut self) {
        // Containers of the Docker case are destroyed by the case itself; sweep any left.
        if let Ok(d) = &self.docker {
            if let Ok(list) = d.provider.list_managed().await {
                for c in list {
                    let _ = d.provider.destroy(&c.name).await;
                }
            }
        }
        if let Some(w) = self.worker.take() {
            w.stop().await;
        }
    }

    fn acquire_cmd(&self, conversation: &str, repo: &str, url: &str) -> Command {
        Command::AcquireWorkspace(AcquireWorkspace {
            user_id: "u1".into(),
            project_id: "p1".into(),
            repo_name: repo.into(),
            repo_url: url.into(),
            base_ref: "main".into(),
            mode: WorkspaceMode::Edit,
            conversation_id: Some(conversation.into()),
            task_id: None,
            runtime: None,
            history_ignored: false,
        })
    }

    pub(crate) async fn acquire(&self, conversation: &str) -> Result<WorkspaceRow> {
        self.acquire_of(conversation, REPO, &self.url).await
    }

    /// An edit workspace of the repository `repo` at `url` (not the main fixture's).
    pub(crate) async fn acquire_of(
        &self,
        conversation: &str,
        repo: &str,
        url: &str,
    ) -> Result<WorkspaceRow> {
        let cmd = self.acquire_cmd(conversation, repo, url);
        match self.client.submit(&cmd).await? {
            CommandResult::Workspace(row) => Ok(row),
            other => bail!("acquire returned {other:?}"),
        }
    }

    pub(crate) async fn ensure(
        &self,
        name: &str,
        url: &str,
    ) -> Result<grove_core::model::RepoCacheRow> {
        let cmd = Command::EnsureRepoCache(EnsureRepoCache {
            repo_name: name.into(),
            repo_url: url.into(),
            fetch: false,
        });
        match self.client.submit(&cmd).await? {
            CommandResult::RepoCache(row) => Ok(row),
            other => bail!("ensure returned {other:?}"),
        }
    }

    /// An ensure of `url`, fetching when `fetch`, with a git token if given.
    pub(crate) async fn ensure_with(
        &self,
        name: &str,
        url: &str,
        fetch: bool,
        token: Option<&str>,
    ) -> Result<grove_core::model::RepoCacheRow> {
        let cmd = Command::EnsureRepoCache(EnsureRepoCache {
            repo_name: name.into(),
            repo_url: url.into(),
            fetch,
        });
        match self.client.submit_with_token(&cmd, token).await? {
            CommandResult::RepoCache(row) => Ok(row),
            other => bail!("ensure returned {other:?}"),
        }
    }

    /// The warm cache of the main fixture.
    pub(crate) async fn warm_cache(&self) -> Result<grove_core::model::RepoCacheRow> {
        self.ensure(REPO, &self.url.clone()).await
    }

    /// At least `n` edit workspaces exist (made through the queue).
    pub(crate) async fn workspaces_at_least(&mut self, n: usize) -> Result<()> {
        use futures::StreamExt;
        let have = self.workspaces.len();
        if have >= n {
            return Ok(());
        }
        let made: Vec<Result<WorkspaceRow>> = futures::stream::iter(have..n)
            .map(|i| {
                let this = &*self;
                async move { this.acquire(&format!("w{i}")).await }
            })
            .buffered(4)
            .collect()
            .await;
        for r in made {
            self.workspaces.push(r?);
        }
        Ok(())
    }

    fn exec_cmd(&self, ws: Uuid, runtime: &str, argv: &[&str]) -> Command {
        Command::Exec(Exec {
            workspace_id: ws,
            runtime: runtime.into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: Default::default(),
            cwd: None,
            stdin: None,
            timeout_ms: None,
            max_output_bytes: None,
            kind: Some(ExecKind::Read),
            network: None,
            keep_output: true,
        })
    }

    pub(crate) async fn exec(&self, ws: Uuid, runtime: &str, argv: &[&str]) -> Result<()> {
        match self
            .client
            .submit(&self.exec_cmd(ws, runtime, argv))
            .await?
        {
            CommandResult::Exec(o) if o.exit_code == 0 => Ok(()),
            CommandResult::Exec(o) => bail!("exec exited {}: {}", o.exit_code, o.stderr),
            other => bail!("exec returned {other:?}"),
        }
    }
}

pub(crate) async fn run_cmd(program: &str, args: &[&str], cwd: Option<&Path>) -> Result<()> {
    let mut c = tokio::process::Command::new(program);
    c.args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    let out = c.output().await?;
    if !out.status.success() {
        bail!(
            "{program} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
