//! Scenario `postgres_restart`: a private Postgres cluster, owned by this test, is
//! restarted (fast and immediate shutdown, alternately) under CLI and HTTP load.
//! Workers and `grove serve` must reconnect by themselves, their LISTEN connections
//! must come back, job pickup must go on, and nothing may be lost or doubled.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use grove_e2e::TestEnv;
use serde_json::json;
use uuid::Uuid;

use crate::load::{Load, LoadOptions};
use crate::server::{Server, ALICE};
use crate::{
    account_commands, drain, leaked_dirs, ledger_status, replay_ok, scale, submit_until_decided,
    Figures, Fleet, Rng,
};

/// Restarts in the default run (half fast, half immediate); scaled by `GROVE_FAULTS_SCALE`.
const RESTARTS: u64 = 2;
const WORKERS: usize = 2;

/// Postgres' binaries, found the way `grove db start` finds them: `GROVE_PG_BINDIR`,
/// then Debian's versioned directories, newest first, then PATH.
fn pg_bindir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("GROVE_PG_BINDIR") {
        return Some(PathBuf::from(dir));
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("bin")).collect();
        versions.sort();
        versions.reverse();
        candidates.extend(versions);
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    candidates.into_iter().find(|d| {
        d.join("initdb").is_file() && d.join("pg_ctl").is_file() && d.join("psql").is_file()
    })
}

/// A Postgres cluster of this test's own, made and started with `grove db start` under
/// a `GROVE_HOME` of its own; stopped and removed when dropped. Nothing else uses it,
/// so restarting it disturbs no other test.
pub(crate) struct Cluster {
    home: PathBuf,
    bindir: PathBuf,
    pub(crate) url: String,
}

impl Cluster {
    fn grove_db(home: &Path, verb: &str) -> std::process::Output {
        std::process::Command::new(grove_e2e::grove_bin())
            .args(["db", verb])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("GROVE_HOME", home)
            .output()
            .expect("run grove db")
    }

    pub(crate) fn start() -> Result<Self, String> {
        let bindir = pg_bindir().ok_or("Postgres' initdb/pg_ctl/psql were not found")?;
        // Under /tmp, not in a private temp dir: when the suite runs as root the
        // cluster belongs to the postgres user, who must reach its directory.
        let home =
            std::env::temp_dir().join(format!("grove-faults-pg-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&home).map_err(|e| e.to_string())?;
        let out = Self::grove_db(&home, "start");
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&home);
            return Err(format!(
                "grove db start failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Ok(Self { home, bindir, url })
    }

    /// `pg_ctl stop -m MODE`, run as the cluster's owner, as `grove db` runs it.
    pub(crate) fn stop(&self, mode: &str) {
        let data = self.home.join("postgres/data");
        let pg_ctl = self.bindir.join("pg_ctl");
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let mut cmd = if root {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&pg_ctl);
            c
        } else {
            std::process::Command::new(&pg_ctl)
        };
        let out = cmd
            .arg("-D")
            .arg(&data)
            .args(["-m", mode, "-w", "-t", "60", "stop"])
            .current_dir(&self.home)
            .output()
            .expect("run pg_ctl");
        assert!(
            out.status.success(),
            "pg_ctl stop -m {mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub(crate) fn start_again(&self) {
        let out = Self::grove_db(&self.home, "start");
        assert!(
            out.status.success(),
            "grove db start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Self::grove_db(&self.home, "stop");
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// Sessions in our database whose last statement LISTENed on `channel`.
async fn listening(pool: &sqlx::PgPool, channel: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND query LIKE 'LISTEN%' AND query LIKE '%' || $1 || '%'",
    )
    .bind(channel)
    .fetch_one(pool)
    .await
    .unwrap_or(-1)
}

/// An HTTP client: sessions and writing execs through `grove serve`, each request
/// retried with its idempotency key until the ledger holds its decision.
struct HttpLoad {
    ids: Mutex<Vec<Uuid>>,
    requests: AtomicU64,
    doubled: AtomicU64,
    missing: AtomicU64,
    undecided: AtomicU64,
}

impl HttpLoad {
    async fn request(
        &self,
        env: &TestEnv,
        server: &Server,
        path: &str,
        mut body: serde_json::Value,
    ) -> Option<crate::Decided> {
        let key = Uuid::new_v4().to_string();
        let id = grove_core::idempotency::command_id_for_key(
            &grove_core::idempotency::user_scope("alice"),
            &key,
        );
        body["idempotency_key"] = json!(key);
        self.ids.lock().unwrap().push(id);
        self.requests.fetch_add(1, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            let _ = server
                .call(reqwest::Method::POST, path, Some(ALICE), Some(&body))
                .await;
            if let Some((status, error_kind, result)) = ledger_status(&env.pool, id).await {
                if status == "succeeded" || status == "failed" {
                    return Some(crate::Decided {
                        status,
                        result,
                        error_kind,
                    });
                }
            }
            if Instant::now() > deadline {
                self.undecided.fetch_add(1, Ordering::SeqCst);
                return None;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    async fn client(
        &self,
        env: &TestEnv,
        server: &Server,
        url: &str,
        n: usize,
        stop: &std::sync::atomic::AtomicBool,
    ) {
        let mut cycle = 0;
        while !stop.load(Ordering::SeqCst) {
            cycle += 1;
            let session = self
                .request(
                    env,
                    server,
                    "/v1/sessions",
                    json!({"project_id": "p1", "repo_name": "o/fixture", "repo_url": url,
                           "base_ref": "main", "mode": "edit",
                           "conversation_id": format!("h{n}-{cycle}")}),
                )
                .await;
            let Some(ws) = session.filter(|d| d.succeeded()) else {
                continue;
            };
            let id = ws.field("id").and_then(|v| v.as_str()).unwrap().to_string();
            let path = ws
                .field("local_path")
                .and_then(|v| v.as_str())
                .unwrap()
                .to_string();
            let mut markers = Vec::new();
            for _ in 0..2 {
                let marker = Uuid::new_v4().to_string();
                let d = self
                    .request(
                        env,
                        server,
                        &format!("/v1/workspaces/{id}/exec"),
                        json!({"argv": ["sh", "-c", "echo \"$FAULT_ID\" >> .fault-runs"],
                               "env": {"FAULT_ID": marker}}),
                    )
                    .await;
                let ok = d.as_ref().is_some_and(|d| {
                    d.succeeded() && d.field("exit_code").and_then(|c| c.as_i64()) == Some(0)
                });
                markers.push((marker, ok));
            }
            let runs =
                std::fs::read_to_string(Path::new(&path).join(".fault-runs")).unwrap_or_default();
            for (marker, ok) in markers {
                let n = runs.lines().filter(|l| *l == marker).count() as u64;
                if n > 1 {
                    self.doubled.fetch_add(n - 1, Ordering::SeqCst);
                }
                if ok && n == 0 {
                    self.missing.fetch_add(1, Ordering::SeqCst);
                }
            }
            let cid = Uuid::now_v7();
            self.ids.lock().unwrap().push(cid);
            self.requests.fetch_add(1, Ordering::SeqCst);
            if submit_until_decided(
                env,
                &["workspace", "destroy", &id],
                cid,
                &[],
                Duration::from_secs(240),
            )
            .await
            .is_none()
            {
                self.undecided.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_restart_under_load_loses_nothing_and_listeners_come_back() {
    let require = std::env::var("GROVE_TEST_REQUIRE_DB").is_ok_and(|v| v == "1");
    let cluster = match Cluster::start() {
        Ok(c) => c,
        Err(why) if !require => {
            eprintln!("skipped postgres_restart: {why}");
            return;
        }
        Err(why) => panic!("postgres_restart: GROVE_TEST_REQUIRE_DB=1 but {why}"),
    };
    let env = TestEnv::on_server(&cluster.url).await;
    let mut rng = Rng::new("postgres_restart");
    let url = env.fixture_repo("fixture", &[("README.md", "fixture\n")]);
    let mut fleet = Fleet::new(&env, &[], 4);
    for _ in 0..WORKERS {
        fleet.spawn().await;
    }
    let server = Server::start(&env, &["--concurrency", "4"], &[]).await;
    let load = Load::default();
    let http = HttpLoad {
        ids: Mutex::new(Vec::new()),
        requests: AtomicU64::new(0),
        doubled: AtomicU64::new(0),
        missing: AtomicU64::new(0),
        undecided: AtomicU64::new(0),
    };
    let opts = LoadOptions {
        clients: 3,
        docker: false,
        patience: Duration::from_secs(240),
    };
    let restarts = RESTARTS * scale();
    let mut figures = Figures {
        injected: restarts,
        ..Default::default()
    };
    let mut stalls = Vec::new();
    let mut listener_cuts = 0u64;
    let cli_clients =
        futures::future::join_all((0..opts.clients).map(|n| load.client(&env, &url, n, &opts)));
    let http_clients =
        futures::future::join_all((0..2).map(|n| http.client(&env, &server, &url, n, &load.stop)));
    let restarter = async {
        for i in 0..restarts {
            tokio::time::sleep(Duration::from_millis(rng.range(1500, 5000))).await;
            let mode = if i % 2 == 0 { "fast" } else { "immediate" };
            cluster.stop(mode);
            tokio::time::sleep(Duration::from_millis(rng.range(0, 1500))).await;
            cluster.start_again();
            // Every worker (the fleet's and the server's) LISTENs again for job
            // inserts, and the API's notifier for outcomes and events; then only the
            // LISTEN connections are cut, and they must come back too.
            for cut in [false, true] {
                if cut {
                    let _ = sqlx::query(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                          WHERE datname = current_database() AND query LIKE 'LISTEN%'",
                    )
                    .execute(&env.pool)
                    .await;
                    listener_cuts += 1;
                }
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let jobs = listening(&env.pool, "apalis::job::insert").await;
                    let api = listening(&env.pool, "grove_events").await;
                    if jobs >= (WORKERS + 1) as i64 && api >= 1 {
                        break;
                    }
                    if Instant::now() > deadline {
                        stalls.push(format!(
                            "restart {i} ({mode}, listeners cut: {cut}): {jobs} job listeners of {}, {api} API listeners after 60 s",
                            WORKERS + 1
                        ));
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            // And pickup goes on: a fresh command is taken and decided.
            let probe = Uuid::now_v7();
            let decided = submit_until_decided(
                &env,
                &["repo", "ensure", "--repo", "o/fixture", "--url", &url],
                probe,
                &[],
                Duration::from_secs(120),
            )
            .await;
            if !decided.is_some_and(|d| d.succeeded()) {
                stalls.push(format!(
                    "restart {i} ({mode}): a fresh command was not picked up"
                ));
            }
            load.ids.lock().unwrap().push(probe);
        }
        load.stop.store(true, Ordering::SeqCst);
    };
    tokio::join!(cli_clients, http_clients, restarter);
    eprintln!(
        "postgres_restart: {restarts} restarts, LISTEN connections cut {listener_cuts} times"
    );

    let mut ids = load.ids();
    ids.extend(http.ids.lock().unwrap().iter().copied());
    drain(&env.pool, &ids, Duration::from_secs(180)).await;
    load.account(&mut figures);
    figures.trials += http.requests.load(Ordering::SeqCst);
    figures.duplicated += http.doubled.load(Ordering::SeqCst);
    figures.lost += http.missing.load(Ordering::SeqCst) + http.undecided.load(Ordering::SeqCst);
    figures.lost += stalls.len() as u64;
    for s in stalls {
        figures.note(s);
    }
    account_commands(&env.pool, &ids, &mut figures).await;
    leaked_dirs(&env, &mut figures).await;
    replay_ok(&env, &mut figures).await;
    drop(server);
    drop(fleet);
    drop(env);
    drop(cluster);
    figures.finish("postgres_restart");
}
