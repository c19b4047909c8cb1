//! The data boundary, tried as an attacker would: local repository URLs from API and
//! SQL callers, a second OS user against `$GROVE_HOME` and the private cluster, and
//! token fingerprints tested against a guessed token.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use grove_e2e::http::{Server, ALICE, BOB};
use grove_e2e::{acquire_args, files_containing, text, TestEnv};
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::env_or_skip;

fn session(url: &str, conversation: &str) -> Value {
    json!({"project_id": "p1", "repo_name": "o/fixture", "repo_url": url,
           "base_ref": "main", "mode": "edit", "conversation_id": conversation})
}

/// Every file and directory name under `dir` (to prove nothing was added).
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

async fn count(env: &TestEnv, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cross_tenant_file_url_session_over_http_is_refused() {
    let env = env_or_skip!("a_cross_tenant_file_url_session_over_http_is_refused");
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let server = Server::start(&env).await;
    // Alice's session from an allow-listed path works.
    let (status, alice) = server
        .post("/v1/sessions", ALICE, session(&url, "a1"))
        .await;
    assert_eq!(status, StatusCode::OK, "{alice}");
    let ws = alice["workspace"]["local_path"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::write(Path::new(&ws).join("secret.txt"), "alice's draft\n").unwrap();
    let cache: String = sqlx::query_scalar("SELECT local_path FROM grove.sandbox_repo_caches")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    // An unlisted directory outside the test's allow-listed one.
    let outside = tempfile::tempdir().unwrap();
    grove_e2e::git(outside.path(), &["init", "-q", "-b", "main"]);
    let marker = env.dir.path().join("pwned");
    let before_tree = tree(&env.home());
    let before_events = count(&env, "SELECT count(*) FROM grove.events").await;
    let before_ledger = count(&env, "SELECT count(*) FROM grove.commands").await;

    let attacks = [
        format!("file://{cache}"),
        format!("file://{ws}"),
        format!("file://{}", env.home().display()),
        format!("file://{}", outside.path().display()),
        format!("ext::sh -c touch% {}", marker.display()),
        format!("ext::touch%{}", marker.display()),
        "fd::3".to_string(),
    ];
    for (i, attack) in attacks.iter().enumerate() {
        let (status, body) = server
            .post("/v1/sessions", BOB, session(attack, &format!("b{i}")))
            .await;
        let kind = body["error"]["kind"].as_str().unwrap_or_default();
        assert!(
            matches!(
                (status, kind),
                (StatusCode::UNPROCESSABLE_ENTITY, "rejected")
                    | (StatusCode::BAD_REQUEST, "invalid_input")
            ),
            "{attack}: {status} {body}"
        );
        let message = body["error"]["message"].as_str().unwrap();
        assert_eq!(message.lines().count(), 1, "{message}");
        let (status, body) = server
            .post(
                "/v1/repo-caches/ensure",
                BOB,
                json!({"repo_name": "o/stolen", "repo_url": attack}),
            )
            .await;
        assert!(status.is_client_error(), "{attack}: {status} {body}");
    }
    assert!(!marker.exists(), "ext:: ran a command");
    assert_eq!(
        tree(&env.home()),
        before_tree,
        "refusals changed GROVE_HOME"
    );
    assert_eq!(
        count(&env, "SELECT count(*) FROM grove.events").await,
        before_events
    );
    assert_eq!(
        count(&env, "SELECT count(*) FROM grove.commands").await,
        before_ledger,
        "a refused request was enqueued"
    );
    let (_, bobs) = server.get("/v1/workspaces", BOB).await;
    assert_eq!(bobs["workspaces"], json!([]));
    let hits = files_containing(&env.home(), b"alice's draft");
    assert_eq!(hits, vec![Path::new(&ws).join("secret.txt")]);
}

/// Waits for a command's outcome in the ledger.
async fn outcome(env: &TestEnv, id: uuid::Uuid) -> (String, Value) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, error): (String, Option<Value>) =
            sqlx::query_as("SELECT status, error FROM grove.commands WHERE command_id = $1")
                .bind(id)
                .fetch_one(&env.pool)
                .await
                .unwrap();
        if status == "succeeded" || status == "failed" {
            return (status, error.unwrap_or(Value::Null));
        }
        assert!(Instant::now() < deadline, "command {id} did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sql_callers_need_the_allow_list_and_the_cli_is_the_operator() {
    let mut env = env_or_skip!("sql_callers_need_the_allow_list_and_the_cli_is_the_operator");
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    // A worker with no allow-list at all.
    env.spawn_worker_env(&[("GROVE_LOCAL_REPO_ROOTS", "")])
        .await;
    let (id, _, _): (uuid::Uuid, String, bool) =
        sqlx::query_as("SELECT * FROM grove.enqueue_ensure_repo_cache($1, $2, $3)")
            .bind("sql-local-1")
            .bind("o/fixture")
            .bind(&url)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    let (status, error) = outcome(&env, id).await;
    assert_eq!(status, "failed");
    assert_eq!(error["kind"], "rejected", "{error}");
    assert!(error["message"]
        .as_str()
        .unwrap()
        .contains("GROVE_LOCAL_REPO_ROOTS"));
    assert_eq!(count(&env, "SELECT count(*) FROM grove.events").await, 0);
    assert!(
        tree(&env.home().join("repos")).is_empty(),
        "something was cloned"
    );

    // A grant for another URL does not carry over to this one.
    let mut tx = env.pool.begin().await.unwrap();
    let (id, _, _): (uuid::Uuid, String, bool) =
        sqlx::query_as("SELECT * FROM grove.enqueue_ensure_repo_cache($1, $2, $3)")
            .bind("sql-local-2")
            .bind("o/fixture")
            .bind(&url)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    sqlx::query("INSERT INTO grove.operator_grants (command_id, repo_url) VALUES ($1, $2)")
        .bind(id)
        .bind("file:///somewhere/else")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let (status, error) = outcome(&env, id).await;
    assert_eq!(status, "failed");
    assert_eq!(error["kind"], "rejected", "{error}");

    // The operator's CLI may clone the same path...
    let out = env
        .grove(&[
            "repo",
            "ensure",
            "--repo",
            "o/fixture",
            "--url",
            &url,
            "--json",
        ])
        .await;
    assert!(out.status.success(), "{:?}", text(&out));
    // ...but not from grove's own data directory.
    let cache: String = sqlx::query_scalar("SELECT local_path FROM grove.sandbox_repo_caches")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    let stolen = format!("file://{cache}");
    let out = env
        .grove(&["repo", "ensure", "--repo", "o/stolen", "--url", &stolen])
        .await;
    assert!(!out.status.success());
    let (_, stderr) = text(&out);
    assert!(stderr.contains("data directory"), "{stderr}");
    assert_eq!(
        count(&env, "SELECT count(*) FROM grove.sandbox_repo_caches").await,
        1
    );
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `argv` as the unprivileged `nobody` (65534), with no supplementary groups.
fn as_nobody(argv: &[&str]) -> std::process::Output {
    std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(argv)
        .output()
        .expect("run setpriv")
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_os_user_cannot_read_grove_home() {
    let mut env = env_or_skip!("a_second_os_user_cannot_read_grove_home");
    // An installation from before: its directories open to everyone.
    for d in ["", "repos", "workspaces", "saved"] {
        let p = env.home().join(d);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let ws = PathBuf::from(ws["local_path"].as_str().unwrap());
    std::fs::write(ws.join("secret.txt"), "top secret\n").unwrap();
    for d in ["", "repos", "workspaces", "saved", "trash"] {
        assert_eq!(mode(&env.home().join(d)), 0o700, "$GROVE_HOME/{d}");
    }
    if !is_root() {
        eprintln!("skipped the second-user part of a_second_os_user_cannot_read_grove_home: setpriv needs root");
        return;
    }
    // The test's own temp dir is private too; open it so only grove's modes decide.
    std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = env.home();
    let secret = ws.join("secret.txt");
    let attempts: Vec<Vec<String>> = vec![
        vec!["ls".into(), home.join("workspaces").display().to_string()],
        vec!["ls".into(), home.join("repos").display().to_string()],
        vec!["ls".into(), home.display().to_string()],
        vec!["cat".into(), secret.display().to_string()],
        vec!["cat".into(), ws.join("README.md").display().to_string()],
    ];
    for argv in &attempts {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let out = as_nobody(&argv);
        assert!(!out.status.success(), "nobody could run {argv:?}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("top secret"),
            "{argv:?}"
        );
    }
    // The control: the same command as root reads it, so the refusals are the modes'.
    assert!(std::fs::read_to_string(&secret)
        .unwrap()
        .contains("top secret"));
}

/// A private cluster made with `grove db start` under a home of its own, stopped and
/// removed when dropped.
struct Cluster {
    home: PathBuf,
}

impl Cluster {
    fn db(&self, verb: &str) -> std::process::Output {
        self.grove(&["db", verb])
    }

    /// `grove ARGS` with this home and no `DATABASE_URL`.
    fn grove(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(grove_e2e::grove_bin())
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("GROVE_HOME", &self.home)
            .output()
            .expect("run grove")
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_command_on_a_fresh_home_starts_migrates_and_announces_the_private_cluster() {
    if postgres_bindir().is_none() {
        if std::env::var("GROVE_TEST_REQUIRE_DB").is_ok_and(|v| v == "1") {
            panic!("GROVE_TEST_REQUIRE_DB=1 but Postgres' binaries are not installed");
        }
        eprintln!("skipped a_command_on_a_fresh_home_starts_migrates_and_announces_the_private_cluster: no /usr/lib/postgresql/*/bin");
        return;
    }
    let cluster = Cluster {
        home: std::env::temp_dir().join(format!("grove-fresh-{}", uuid::Uuid::new_v4().simple())),
    };
    let first = cluster.grove(&["workspace", "list", "--json"]);
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{stderr}");
    assert!(
        stderr.contains("started the private Postgres cluster") && stderr.contains("grove db stop"),
        "the process it leaves running is announced: {stderr}"
    );
    let again = cluster.grove(&["workspace", "list", "--json"]);
    assert!(again.status.success());
    assert!(
        again.stderr.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&again.stderr)
    );
    let stopped = cluster.db("stop");
    assert!(stopped.status.success());
    assert!(!cluster.home.join("postgres/data/postmaster.pid").exists());
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.db("stop");
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

fn postgres_bindir() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|e| e.path().join("bin"))
        .collect();
    dirs.sort();
    dirs.into_iter().rev().find(|d| d.join("initdb").is_file())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_private_cluster_admits_only_grove_and_grove_is_no_superuser() {
    let Some(bindir) = postgres_bindir() else {
        if std::env::var("GROVE_TEST_REQUIRE_DB").is_ok_and(|v| v == "1") {
            panic!("GROVE_TEST_REQUIRE_DB=1 but Postgres' binaries are not installed");
        }
        eprintln!("skipped the_private_cluster_admits_only_grove_and_grove_is_no_superuser: no /usr/lib/postgresql/*/bin");
        return;
    };
    // Under /tmp: as root the cluster belongs to the postgres user, who must reach it.
    let cluster = Cluster {
        home: std::env::temp_dir().join(format!("grove-priv-pg-{}", uuid::Uuid::new_v4().simple())),
    };
    let out = cluster.db("start");
    assert!(out.status.success(), "{:?}", text(&out));
    let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let password = std::fs::read_to_string(cluster.home.join("postgres.password")).unwrap();
    assert!(
        url.contains(password.trim()),
        "the URL carries grove's password"
    );
    assert_eq!(mode(&cluster.home.join("postgres.password")), 0o600);
    assert_eq!(mode(&cluster.home.join("postgres")), 0o700);
    assert_eq!(mode(&cluster.home.join("postgres/run")), 0o700);
    let hba = cluster.home.join("postgres/data/pg_hba.conf");
    let hba = std::fs::read_to_string(hba).unwrap();
    assert!(!hba.contains("trust"), "{hba}");
    // A second start (as every CLI call makes) keeps the same URL.
    let again = cluster.db("start");
    assert_eq!(String::from_utf8_lossy(&again.stdout).trim(), url);

    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("grove connects with the printed URL");
    let superuser: bool =
        sqlx::query_scalar("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(!superuser, "grove's role is a superuser");
    let marker = cluster.home.join("copy-to-program");
    let err = sqlx::query(sqlx::AssertSqlSafe(format!(
        "COPY (SELECT 1) TO PROGRAM 'touch {}'",
        marker.display()
    )))
    .execute(&pool)
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("permission denied") || err.to_string().contains("must be"),
        "{err}"
    );
    assert!(!marker.exists());
    // Without the password, even grove's own OS user is refused.
    let sock = cluster.home.join("postgres/run");
    let nopw = format!("postgres://grove@localhost/grove?host={}", sock.display());
    assert!(sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&nopw)
        .await
        .is_err());
    pool.close().await;

    if !is_root() {
        eprintln!("skipped the second-user part of the_private_cluster_admits_only_grove_and_grove_is_no_superuser: setpriv needs root");
        return;
    }
    let psql = bindir.join("psql");
    let out = as_nobody(&[
        psql.to_str().unwrap(),
        "-h",
        sock.to_str().unwrap(),
        "-U",
        "grove",
        "-d",
        "grove",
        "-w",
        "-c",
        "SELECT 1",
    ]);
    assert!(!out.status.success(), "nobody connected: {:?}", text(&out));
    let out = as_nobody(&["ls", sock.to_str().unwrap()]);
    assert!(!out.status.success(), "nobody listed the socket directory");
    let out = as_nobody(&[
        "cat",
        cluster.home.join("postgres.password").to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "nobody read the password");
}

#[tokio::test(flavor = "multi_thread")]
async fn token_fingerprints_are_keyed_and_the_key_is_shown_nowhere() {
    let mut env = env_or_skip!("token_fingerprints_are_keyed_and_the_key_is_shown_nowhere");
    env.spawn_worker_env(&[("GROVE_LOG", "debug")]).await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let token = "ghp_guessable_token_1234";
    let vars = [("GIT_TOKEN_FOR_TEST", token)];
    let args = [
        "repo",
        "ensure",
        "--repo",
        "o/fixture",
        "--url",
        &url,
        "--token-env",
        "GIT_TOKEN_FOR_TEST",
        "--json",
    ];
    let first = env.grove_env(&args, &vars).await;
    assert!(first.status.success(), "{:?}", text(&first));
    let second = env.grove_env(&args, &vars).await;
    assert!(second.status.success(), "{:?}", text(&second));
    let shown: Value = serde_json::from_slice(&first.stdout).unwrap();
    let stored: String = sqlx::query_scalar(
        "SELECT payload ->> 'auth_scope_hash' FROM grove.events WHERE event_type = 'repo_cache.created'",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(stored.len(), 16);
    // The same token has the same fingerprint: the second ensure reused the cache
    // instead of fetching it as another scope's.
    assert_eq!(env.count_events("repo_cache.fetched").await, 0);
    assert_eq!(env.count_events("repo_cache.used").await, 1);
    // A guessed token's plain SHA-256 prefix does not match what is stored or shown.
    let guess = &hex::encode(Sha256::digest(token.as_bytes()))[..16];
    assert_ne!(stored, guess);
    if let Some(v) = shown.get("auth_scope_hash") {
        assert_ne!(v.as_str(), Some(guess));
    }
    let key: String = sqlx::query_scalar(
        "SELECT encode(key, 'hex') FROM grove.instance_keys WHERE name = 'auth_scope'",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(key.len(), 64);
    let with_key = grove_core::fingerprint::Fingerprinter::from_slice(&hex::decode(&key).unwrap())
        .unwrap()
        .auth_scope(token);
    assert_eq!(
        stored, with_key,
        "the fingerprint is the HMAC under the stored key"
    );
    for out in [&first, &second] {
        let (o, e) = text(out);
        assert!(!o.contains(&key) && !e.contains(&key));
    }
    assert!(
        !env.worker_logs().contains(&key),
        "the key is in the worker log"
    );
    assert!(files_containing(&env.home(), key.as_bytes()).is_empty());
    let in_events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM grove.events WHERE payload::text LIKE '%' || $1 || '%'",
    )
    .bind(&key)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(in_events, 0);
}
