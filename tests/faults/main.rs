//! The fault and abuse suite: real `grove worker` processes killed with SIGKILL, a
//! private Postgres restarted under load, contention on one key and one workspace,
//! hostile input, git tokens hunted for everywhere, and a second tenant trying every
//! route. Each scenario counts what was lost, run twice or left behind and prints one
//! line, `faults: scenario=NAME trials=N injected=N lost=N duplicated=N leaked=N
//! replay=ok|diff`; any non-zero count or a replay diff fails it.
//!
//! `GROVE_FAULTS_SCALE=N` multiplies every trial count (default 1, sized for CI).
//!
//! # Layout
//! - `main.rs`: scale, the summary line, the worker fleet, submit-until-decided, the
//!   accounting queries shared by the scenarios.
//! - `load.rs`: the mixed client load (ensure, acquire, exec, release, destroy).
//! - `worker_kill.rs`, `postgres_restart.rs`, `contention.rs`, `hostile.rs`,
//!   `secrets.rs` (with `grove-gitserver`, a token-checking git smart-HTTP server),
//!   `tenancy.rs`, `fuzz.rs`, `fencing.rs` (restarts inside mutating execs),
//!   `inline_kill.rs` (`grove serve` killed mid-write and mid-exec, ADR 31),
//!   `panic.rs` (`injected_panic`), `merge_back_kill.rs`: one scenario each;
//!   `saved_work.rs`: `saved_work_identity` and `saved_work_kill`.

mod contention;
mod fencing;
mod fuzz;
mod hostile;
mod inline_kill;
mod load;
mod merge_back_kill;
mod panic;
mod postgres_restart;
mod saved_work;
mod secrets;
mod server;
mod tenancy;
mod worker_kill;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use grove_e2e::TestEnv;
use tokio::process::Child;
use uuid::Uuid;

/// Skips the scenario (with the reason printed by `TestEnv::new`) when no database is set.
#[macro_export]
macro_rules! env_or_skip {
    ($name:expr) => {
        match grove_e2e::TestEnv::new($name).await {
            Some(env) => env,
            None => return,
        }
    };
}

/// `GROVE_FAULTS_SCALE`, at least 1.
pub fn scale() -> u64 {
    std::env::var("GROVE_FAULTS_SCALE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1)
}

/// A small xorshift generator: the suite needs random moments, not cryptography, and a
/// printed seed makes a failing run repeatable (`GROVE_FAULTS_SEED`).
pub struct Rng(u64);

impl Rng {
    pub fn new(scenario: &str) -> Self {
        let seed = std::env::var("GROVE_FAULTS_SEED")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| Uuid::new_v4().as_u64_pair().0 | 1);
        eprintln!("faults: scenario={scenario} seed={seed}");
        Self(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in `lo..hi` (hi > lo).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }
}

/// One scenario's figures, printed as its summary line.
#[derive(Debug, Default)]
pub struct Figures {
    pub trials: u64,
    pub injected: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub leaked: u64,
    pub replay_ok: bool,
    /// What each non-zero count was made of, for the failure message.
    pub notes: Vec<String>,
}

impl Figures {
    pub fn note(&mut self, what: impl Into<String>) {
        self.notes.push(what.into());
    }

    /// Prints the summary line (past the test harness's capture, so that it shows in a
    /// passing run too) and fails on any loss, duplicate, leak or replay diff.
    pub fn finish(self, scenario: &str) {
        let line = format!(
            "faults: scenario={scenario} trials={} injected={} lost={} duplicated={} leaked={} replay={}\n",
            self.trials,
            self.injected,
            self.lost,
            self.duplicated,
            self.leaked,
            if self.replay_ok { "ok" } else { "diff" }
        );
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
        drop(out);
        if let Ok(path) = std::env::var("GROVE_FAULTS_SUMMARY") {
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = f.write_all(line.as_bytes());
            }
        }
        assert!(
            self.lost == 0 && self.duplicated == 0 && self.leaked == 0 && self.replay_ok,
            "{}{:#?}",
            line,
            self.notes
        );
    }
}

/// `grove worker` processes that come and go.
pub struct Fleet<'a> {
    env: &'a TestEnv,
    extra: Vec<(String, String)>,
    concurrency: usize,
    live: Vec<Child>,
    pub logs: Vec<PathBuf>,
}

impl<'a> Fleet<'a> {
    pub fn new(env: &'a TestEnv, extra: &[(&str, &str)], concurrency: usize) -> Self {
        Self {
            env,
            extra: extra
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            concurrency,
            live: Vec::new(),
            logs: Vec::new(),
        }
    }

    /// Starts a worker; waits (bounded) until its log says it started.
    pub async fn spawn(&mut self) {
        let log = self
            .env
            .dir
            .path()
            .join(format!("fleet-{}.log", self.logs.len()));
        let file = std::fs::File::create(&log).unwrap();
        let conc = self.concurrency.to_string();
        let mut cmd = self.env.command(&["worker", "--concurrency", &conc]);
        for (k, v) in &self.extra {
            cmd.env(k, v);
        }
        let child = cmd
            .stdout(Stdio::from(file.try_clone().unwrap()))
            .stderr(Stdio::from(file))
            .spawn()
            .expect("spawn grove worker");
        self.live.push(child);
        self.logs.push(log.clone());
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("worker started")
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("a worker did not start within 60 s; see {}", log.display());
    }

    /// SIGKILLs the worker at `index % len` and reaps it.
    pub async fn kill9(&mut self, index: usize) {
        let mut child = self.live.remove(index % self.live.len());
        if let Some(pid) = child.id() {
            // SAFETY: kill(2) on a child process this fleet owns.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
        }
        let _ = child.wait().await;
    }

    /// Every worker's log, concatenated.
    pub fn all_logs(&self) -> String {
        self.logs
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// What a command came to, read from the ledger.
#[derive(Debug, Clone)]
pub struct Decided {
    pub status: String,
    /// The recorded result (`CommandResult`, tagged by `type`), when it succeeded.
    pub result: Option<serde_json::Value>,
    pub error_kind: Option<String>,
}

impl Decided {
    pub fn succeeded(&self) -> bool {
        self.status == "succeeded"
    }
    /// A field of the recorded result.
    pub fn field(&self, name: &str) -> Option<&serde_json::Value> {
        self.result.as_ref().and_then(|r| r.get(name))
    }
}

type LedgerRow = (String, Option<String>, Option<serde_json::Value>);

/// The ledger status, error kind and result of a command, if it has a row.
pub async fn ledger_status(pool: &sqlx::PgPool, id: Uuid) -> Option<LedgerRow> {
    sqlx::query_as::<_, LedgerRow>(
        "SELECT status, error->>'kind', result FROM grove.commands WHERE command_id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
    .ok()
    .flatten()
}

/// Runs `grove ARGS --command-id ID` until the ledger holds a decision for `id`: a CLI
/// that gave up (its database connection dropped, no worker was alive) is simply run
/// again with the same id, which enqueues nothing new and waits on the same command.
/// Returns `None` if no decision came within `patience`.
pub async fn submit_until_decided(
    env: &TestEnv,
    args: &[&str],
    id: Uuid,
    extra_env: &[(&str, &str)],
    patience: Duration,
) -> Option<Decided> {
    let deadline = Instant::now() + patience;
    let ids = id.to_string();
    let mut all: Vec<&str> = args.to_vec();
    let at = all.iter().position(|a| *a == "--").unwrap_or(all.len());
    all.insert(at, &ids);
    all.insert(at, "--command-id");
    loop {
        let _ = env.grove_env(&all, extra_env).await;
        if let Some((status, error_kind, result)) = ledger_status(&env.pool, id).await {
            if status == "succeeded" || status == "failed" {
                return Some(Decided {
                    status,
                    result,
                    error_kind,
                });
            }
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until every command in `ids` has a decided ledger row, or `patience` passes.
pub async fn drain(pool: &sqlx::PgPool, ids: &[Uuid], patience: Duration) {
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM unnest($1::uuid[]) AS i(id)
               LEFT JOIN grove.commands c ON c.command_id = i.id
              WHERE c.status IS NULL OR c.status NOT IN ('succeeded', 'failed')",
        )
        .bind(ids)
        .fetch_one(pool)
        .await
        .unwrap_or(1);
        if open == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Counts what the log and the ledger lost or doubled for the commands in `ids`.
pub async fn account_commands(pool: &sqlx::PgPool, ids: &[Uuid], figures: &mut Figures) {
    let one = |sql: &'static str| async move {
        sqlx::query_scalar::<_, i64>(sql)
            .bind(ids)
            .fetch_one(pool)
            .await
            .expect("accounting query") as u64
    };
    let undecided = one("SELECT count(*) FROM unnest($1::uuid[]) AS i(id)
           LEFT JOIN grove.commands c ON c.command_id = i.id
          WHERE c.status IS NULL OR c.status NOT IN ('succeeded', 'failed')")
    .await;
    let no_reason = one(
        "SELECT count(*) FROM grove.commands WHERE command_id = ANY($1) AND status = 'failed'
            AND (coalesce(error->>'kind', '') = '' OR coalesce(error->>'message', '') = '')",
    )
    .await;
    let silent = one(
        "SELECT count(*) FROM grove.commands c WHERE c.command_id = ANY($1)
            AND c.status = 'succeeded'
            AND c.kind IN ('ensure_repo_cache', 'acquire_workspace', 'exec', 'release_session', 'destroy_workspace')
            AND NOT EXISTS (SELECT 1 FROM grove.events e WHERE e.command_id = c.command_id)",
    )
    .await;
    let unfinished_execs = one(
        "SELECT count(*) FROM grove.events s WHERE s.command_id = ANY($1)
            AND s.event_type = 'exec.started'
            AND NOT EXISTS (SELECT 1 FROM grove.events f
                             WHERE f.command_id = s.command_id AND f.event_type = 'exec.finished')",
    )
    .await;
    let doubled = one(
        "SELECT count(*) FROM (SELECT 1 FROM grove.events WHERE command_id = ANY($1)
            GROUP BY command_id, stream_id, event_type HAVING count(*) > 1) d",
    )
    .await;
    for (n, what) in [
        (undecided, "commands neither succeeded nor failed"),
        (no_reason, "failed commands without a kind and message"),
        (silent, "succeeded commands that left no event"),
        (unfinished_execs, "exec.started without exec.finished"),
    ] {
        if n > 0 {
            figures.lost += n;
            figures.note(format!("lost: {n} {what}"));
        }
    }
    if doubled > 0 {
        figures.duplicated += doubled;
        figures.note(format!(
            "duplicated: {doubled} (command, stream, event type) groups appear more than once"
        ));
    }
}

/// Directories under `$GROVE_HOME` that no record owns: workspace checkouts and repo
/// caches without a row, partial builds, and anything left in the trash.
pub async fn leaked_dirs(env: &TestEnv, figures: &mut Figures) {
    let owned: Vec<String> = sqlx::query_scalar(
        "SELECT local_path FROM grove.sandbox_workspaces
         UNION ALL SELECT local_path FROM grove.sandbox_repo_caches",
    )
    .fetch_all(&env.pool)
    .await
    .expect("owned paths");
    let owned: std::collections::HashSet<PathBuf> = owned.into_iter().map(PathBuf::from).collect();
    let home = env.home();
    let mut found = Vec::new();
    // workspaces/<user>/<project>/<checkout>
    for user in entries(&home.join("workspaces")) {
        for project in entries(&user) {
            for checkout in entries(&project) {
                found.push(checkout);
            }
        }
    }
    found.extend(entries(&home.join("repos")));
    // A workspace's record of its repo cache (`.<name>.grove-cache`, ADR 23) belongs to
    // it while the recorded workspace is on disk; otherwise it is a leak.
    let record_of_owned = |p: &PathBuf| {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        name.strip_prefix('.')
            .and_then(|n| n.strip_suffix(".grove-cache"))
            .map(|ws| p.with_file_name(ws))
            .is_some_and(|ws| owned.contains(&ws) && ws.is_dir())
    };
    let mut leaks: Vec<PathBuf> = found
        .into_iter()
        .filter(|p| !owned.contains(p) && !record_of_owned(p))
        .collect();
    leaks.extend(entries(&home.join("trash")));
    if !leaks.is_empty() {
        figures.leaked += leaks.len() as u64;
        figures.note(format!("leaked directories: {leaks:?}"));
    }
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Docker containers of this `$GROVE_HOME` that no runtime record owns. Workers sweep
/// such orphans (30 s grace, every 60 s, and at start), so this waits up to `patience`
/// for the sweep before counting.
pub async fn leaked_containers(env: &TestEnv, figures: &mut Figures, patience: Duration) {
    let scope = grove_core::layout::short_hash(&env.home().to_string_lossy(), 12);
    let deadline = Instant::now() + patience;
    loop {
        let out = std::process::Command::new("docker")
            .args([
                "ps",
                "-a",
                "--filter",
                &format!("label=grove.home={scope}"),
                "--format",
                "{{.Label \"grove.runtime\"}}",
            ])
            .output();
        let Ok(out) = out else { return };
        if !out.status.success() {
            return;
        }
        let labels: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .filter(|l| !l.is_empty())
            .collect();
        let owned: Vec<String> = sqlx::query_scalar(
            "SELECT backend_runtime_id FROM grove.sandbox_runtimes WHERE backend_kind = 'docker'
             UNION SELECT id::text FROM grove.sandbox_runtimes WHERE backend_kind = 'docker'",
        )
        .fetch_all(&env.pool)
        .await
        .expect("runtime records");
        let orphans: Vec<&String> = labels.iter().filter(|l| !owned.contains(l)).collect();
        if orphans.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            figures.leaked += orphans.len() as u64;
            figures.note(format!("containers no record owns: {orphans:?}"));
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Removes every container of this `$GROVE_HOME` (the test's own cleanup, after counting).
pub fn remove_containers(env: &TestEnv) {
    grove_e2e::remove_containers_of_home(&env.home());
}

/// `grove replay --verify` passes.
pub async fn replay_ok(env: &TestEnv, figures: &mut Figures) {
    let out = env.grove(&["replay", "--verify"]).await;
    figures.replay_ok = out.status.success();
    if !figures.replay_ok {
        figures.note(format!(
            "replay: {}",
            String::from_utf8_lossy(&out.stdout)
                .chars()
                .take(2000)
                .collect::<String>()
        ));
    }
}

/// Whether a Docker engine answers and the minimal sandbox image builds in this
/// `$GROVE_HOME`; `Err` says why not (and panics when `GROVE_TEST_REQUIRE_DOCKER=1`).
pub async fn docker_image(env: &TestEnv, scenario: &str) -> Result<(), String> {
    let why = if !Path::new("/var/run/docker.sock").exists()
        && std::env::var_os("DOCKER_HOST").is_none()
    {
        Some("no Docker engine socket".to_string())
    } else {
        let out = env.grove(&["image", "build", "--minimal"]).await;
        (!out.status.success()).then(|| {
            format!(
                "grove image build --minimal failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
    };
    match why {
        None => Ok(()),
        Some(why) => {
            if std::env::var("GROVE_TEST_REQUIRE_DOCKER").is_ok_and(|v| v == "1") {
                panic!("{scenario}: GROVE_TEST_REQUIRE_DOCKER=1 but {why}");
            }
            eprintln!("{scenario}: Docker execs left out: {why}");
            Err(why)
        }
    }
}
