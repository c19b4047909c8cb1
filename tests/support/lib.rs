//! Test support for grove's end-to-end tests: a fresh database per test, the real
//! `grove` binary, worker processes, and git fixture repositories.
//!
//! Postgres comes from `GROVE_TEST_DATABASE_URL` (or `DATABASE_URL`): an admin URL on
//! which each test creates, and afterwards drops, a database of its own. Without one
//! a test prints why and skips, unless `GROVE_TEST_REQUIRE_DB=1` (set by the README's
//! test command and CI), where the absence is a failure.

pub mod fake_github;
pub mod http;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::process::{Child, Command};

/// The `grove` binary under test: `GROVE_BIN`, else `target/<profile>/grove` next to
/// this test executable.
pub fn grove_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("GROVE_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/grove
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("grove"))
        .expect("target dir");
    assert!(
        bin.is_file(),
        "{} not found: build it first (cargo build -p grove-cli) or set GROVE_BIN",
        bin.display()
    );
    bin
}

fn admin_url() -> Option<String> {
    std::env::var("GROVE_TEST_DATABASE_URL")
        .ok()
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .filter(|u| !u.is_empty())
}

/// Replaces the database name in a Postgres URL.
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

/// One test's world: its database, its `$GROVE_HOME`, its workers.
pub struct TestEnv {
    pub db_url: String,
    admin_url: String,
    db_name: String,
    pub pool: PgPool,
    pub dir: tempfile::TempDir,
    workers: Vec<Worker>,
}

/// A running `grove worker` process, killed when dropped.
pub struct Worker {
    pub child: Child,
    pub log: PathBuf,
}

impl Worker {
    /// SIGKILL: no chance to clean up, as when a machine dies.
    pub async fn kill9(&mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: plain kill(2) on a child we own.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
        }
        let _ = self.child.wait().await;
    }

    /// SIGTERM, then waits up to `patience` for the exit; `None` if it did not exit.
    pub async fn terminate(&mut self, patience: Duration) -> Option<std::process::ExitStatus> {
        if let Some(pid) = self.child.id() {
            // SAFETY: plain kill(2) on a child we own.
            unsafe {
                libc::kill(pid as i32, libc::SIGTERM);
            }
        }
        tokio::time::timeout(patience, self.child.wait())
            .await
            .ok()
            .and_then(Result::ok)
    }
}

impl TestEnv {
    /// A fresh database with grove's migrations applied, or `None` (printed) when no
    /// Postgres is configured.
    pub async fn new(test: &str) -> Option<Self> {
        let admin = Self::new_skipping(test)?;
        Some(Self::on_server(&admin).await)
    }

    /// A fresh, empty database nobody migrated (as a new `DATABASE_URL` is), or `None`
    /// (printed) when no Postgres is configured.
    pub async fn unmigrated(test: &str) -> Option<Self> {
        let admin = Self::new_skipping(test)?;
        Some(Self::blank(&admin).await)
    }

    fn new_skipping(test: &str) -> Option<String> {
        let admin = admin_url();
        if admin.is_none() {
            if std::env::var("GROVE_TEST_REQUIRE_DB").is_ok_and(|v| v == "1") {
                panic!("GROVE_TEST_REQUIRE_DB=1 but neither GROVE_TEST_DATABASE_URL nor DATABASE_URL is set");
            }
            eprintln!("skipped {test}: no GROVE_TEST_DATABASE_URL/DATABASE_URL (run ./scripts/test, which starts Postgres)");
        }
        admin
    }

    /// A fresh database with grove's migrations applied on the Postgres server of
    /// `admin` (an admin URL), for a test that brings a server of its own.
    pub async fn on_server(admin: &str) -> Self {
        let mut env = Self::blank(admin).await;
        let out = env.grove(&["migrate"]).await;
        assert!(
            out.status.success(),
            "grove migrate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        env.pool = PgPoolOptions::new()
            .max_connections(8)
            .connect(&env.db_url)
            .await
            .expect("pool");
        env
    }

    /// A fresh database with nothing in it, on the server of `admin`.
    async fn blank(admin: &str) -> Self {
        let admin = admin.to_string();
        let db_name = format!("grove_test_{}", uuid::Uuid::new_v4().simple());
        let admin_pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&admin)
            .await
            .expect("connect to the admin database");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db_name}")))
            .execute(&admin_pool)
            .await
            .expect("create test database");
        admin_pool.close().await;
        let db_url = with_database(&admin, &db_name);
        let dir = tempfile::Builder::new()
            .prefix("grove-e2e-")
            .tempdir()
            .expect("tempdir");
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        Self {
            pool: PgPoolOptions::new()
                .max_connections(8)
                .connect_lazy(&db_url)
                .expect("pool"),
            db_url,
            admin_url: admin,
            db_name,
            dir,
            workers: Vec::new(),
        }
    }

    /// `$GROVE_HOME` of this test.
    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// A `grove` command with an environment built from nothing but what grove needs.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(grove_bin());
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("DATABASE_URL", &self.db_url)
            .env("GROVE_HOME", self.home())
            // Fixture repositories are file:// URLs in this test's directory (next to
            // $GROVE_HOME, which stays refused): allow-listed as an operator would.
            .env("GROVE_LOCAL_REPO_ROOTS", self.dir.path())
            .env("GROVE_LOG", "info")
            // No scheduled eviction sweeps unless a test asks for them (they would add
            // ledger rows and events to tests that count them).
            .env("GROVE_EVICT_SCHEDULE", "off")
            // Every warm acquire and ensure records its use, so tests that count those
            // events see each one; tests of the recent-use answer (ADR 40) set a window.
            .env("GROVE_RECORD_USE_AFTER", "0")
            .kill_on_drop(true);
        // The Docker exec agent is opt-in: a run that sets it (to try the suites with
        // the agent) passes it on.
        if let Some(agent) = std::env::var_os("GROVE_DOCKER_SANDBOXD") {
            cmd.env("GROVE_DOCKER_SANDBOXD", agent);
        }
        cmd
    }

    /// Runs `grove ARGS...` to completion.
    pub async fn grove(&self, args: &[&str]) -> Output {
        self.command(args).output().await.expect("run grove")
    }

    /// Runs `grove ARGS...` with extra environment variables.
    pub async fn grove_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = self.command(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().await.expect("run grove")
    }

    /// Runs `grove ARGS... --json`, asserts success and parses the one JSON object printed.
    pub async fn grove_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all: Vec<&str> = args.to_vec();
        // Flags go before `--`: what follows it is the command to run.
        let at = all.iter().position(|a| *a == "--").unwrap_or(all.len());
        all.insert(at, "--json");
        let out = self.grove(&all).await;
        assert!(
            out.status.success(),
            "grove {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "grove {args:?} printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// Starts a worker process and waits until it has registered.
    pub async fn spawn_worker(&mut self) -> usize {
        self.spawn_worker_env(&[]).await
    }

    pub async fn spawn_worker_env(&mut self, env: &[(&str, &str)]) -> usize {
        let idx = self.workers.len();
        let log = self.dir.path().join(format!("worker-{idx}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let before: i64 = self.live_workers().await;
        let mut cmd = self.command(&["worker", "--concurrency", "8"]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .stdout(Stdio::from(file.try_clone().unwrap()))
            .stderr(Stdio::from(file))
            .spawn()
            .expect("spawn worker");
        self.workers.push(Worker { child, log });
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.live_workers().await <= before {
            assert!(
                Instant::now() < deadline,
                "worker {idx} did not register within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        idx
    }

    async fn live_workers(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM apalis.workers WHERE last_seen > now() - interval '10 seconds'",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap_or(0)
    }

    pub fn worker(&mut self, idx: usize) -> &mut Worker {
        &mut self.workers[idx]
    }

    /// Every worker's log, concatenated.
    pub fn worker_logs(&self) -> String {
        self.workers
            .iter()
            .map(|w| std::fs::read_to_string(&w.log).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Creates a git repository with `files` committed on `main`, returning its file:// URL.
    pub fn fixture_repo(&self, name: &str, files: &[(&str, &str)]) -> String {
        let dir = self.dir.path().join("upstream").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        git(&dir, &["init", "-q", "-b", "main"]);
        for (path, content) in files {
            let p = dir.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
        git(&dir, &["add", "-A"]);
        git(&dir, &["commit", "-q", "-m", "initial"]);
        format!("file://{}", dir.display())
    }

    /// Counts events of a type.
    pub async fn count_events(&self, event_type: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM grove.events WHERE event_type = $1")
            .bind(event_type)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }
}

/// Removes every Docker container a test's `$GROVE_HOME` caused: those with its scope
/// label (`grove.home`, the short hash workers put on them) or naming it as their home
/// (`grove.home_path`). Returns how many it removed; 0 without a Docker engine.
pub fn remove_containers_of_home(home: &Path) -> usize {
    let scope = grove_core::layout::short_hash(&home.to_string_lossy(), 12);
    let canonical = std::fs::canonicalize(home).unwrap_or_else(|_| home.to_path_buf());
    let mut ids: Vec<String> = Vec::new();
    for filter in [
        format!("label=grove.home={scope}"),
        format!("label=grove.home_path={}", home.display()),
        format!("label=grove.home_path={}", canonical.display()),
    ] {
        let Ok(out) = std::process::Command::new("docker")
            .args(["ps", "-aq", "--filter", &filter])
            .output()
        else {
            return 0;
        };
        ids.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| !l.is_empty())
                .map(str::to_string),
        );
    }
    ids.sort();
    ids.dedup();
    if ids.is_empty() {
        return 0;
    }
    let removed = std::process::Command::new("docker")
        .args(["rm", "-f"])
        .args(&ids)
        .output()
        .is_ok_and(|o| o.status.success());
    if removed {
        ids.len()
    } else {
        0
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        for w in &mut self.workers {
            let _ = w.child.start_kill();
        }
        // Nothing a test caused outlives it: its containers go with its home.
        remove_containers_of_home(&self.home());
        let admin = self.admin_url.clone();
        let db = self.db_name.clone();
        // Drop the database from a thread with its own runtime: Drop cannot await.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Ok(pool) = PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&admin)
                    .await
                {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {db} WITH (FORCE)"
                    )))
                    .execute(&pool)
                    .await;
                }
            })
        })
        .join();
    }
}

/// Runs git with a fixed identity, asserting success.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args([
            "-c",
            "user.name=grove test",
            "-c",
            "user.email=test@grove.invalid",
            "-c",
            "init.defaultBranch=main",
            // Workspaces handed to the sandbox user are not owned by the test (root).
            "-c",
            "safe.directory=*",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Output as text, for assertions.
pub fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Standard acquire arguments for a fixture repo.
pub fn acquire_args<'a>(url: &'a str, mode: &'a str, scope: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "workspace",
        "acquire",
        "--user",
        "u1",
        "--project",
        "p1",
        "--repo",
        "o/fixture",
        "--url",
        url,
        "--base",
        "main",
        "--mode",
        mode,
    ];
    v.extend_from_slice(scope);
    v
}

/// Every file under `dir` whose bytes contain `needle`.
pub fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() {
                if let Ok(bytes) = std::fs::read(&p) {
                    if bytes.windows(needle.len()).any(|w| w == needle) {
                        hits.push(p);
                    }
                }
            }
        }
    }
    hits
}
