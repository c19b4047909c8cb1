//! The HTTP API against a real `grove serve`: sessions, execs, events, tenancy,
//! streaming, idempotency over HTTP and SQL, and the committed OpenAPI document.

use std::process::Stdio;
use std::time::{Duration, Instant};

use grove_e2e::TestEnv;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

use crate::env_or_skip;

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef";
const OPS: &str = "ops-token-0123456789abcdef";

/// A running `grove serve`, killed when dropped.
struct Server {
    base: String,
    http: reqwest::Client,
    _child: Child,
}

impl Server {
    /// Starts `grove serve --bind 127.0.0.1:0` (with its in-process worker) and reads
    /// the address it printed.
    async fn start(env: &TestEnv) -> Self {
        Self::start_with(env, &[]).await
    }

    /// As `start`, with extra environment for the server and its in-process worker.
    async fn start_with(env: &TestEnv, extra: &[(&str, &str)]) -> Self {
        let log = std::fs::File::create(env.dir.path().join("serve.log")).unwrap();
        let mut cmd = env.command(&["serve", "--bind", "127.0.0.1:0"]);
        cmd.envs(extra.iter().copied());
        cmd.env(
            "GROVE_API_TOKENS",
            format!("{ALICE}=alice,{BOB}=bob\n{OPS}=ops:operator"),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log));
        let mut child = cmd.spawn().expect("spawn grove serve");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("grove serve printed its address within 60 s")
            .unwrap()
            .expect("a first line");
        let base = first
            .strip_prefix("grove: listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {first}"))
            .to_string();
        Self {
            base,
            http: reqwest::Client::new(),
            _child: child,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self.http.request(method, self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status();
        let text = resp.text().await.unwrap();
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path}: not JSON: {text}"))
        };
        (status, value)
    }

    async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        self.call(reqwest::Method::GET, path, Some(token), None)
            .await
    }

    async fn post(&self, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(reqwest::Method::POST, path, Some(token), Some(body))
            .await
    }

    /// Acquires an edit session of `conversation` for the token's user; returns its id.
    async fn acquire(&self, token: &str, url: &str, conversation: &str) -> String {
        let (status, body) = self
            .post(
                "/v1/sessions",
                token,
                json!({
                    "project_id": "p1",
                    "repo_name": "o/fixture",
                    "repo_url": url,
                    "base_ref": "main",
                    "mode": "edit",
                    "conversation_id": conversation,
                }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "acquire: {body}");
        assert_eq!(body["session_id"], body["workspace"]["id"]);
        body["session_id"].as_str().unwrap().to_string()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_is_acquired_run_in_and_its_events_read_over_http() {
    let env = env_or_skip!("a_session_is_acquired_run_in_and_its_events_read_over_http");
    let url = env.fixture_repo("fixture", &[("README.md", "hello from the fixture\n")]);
    let server = Server::start(&env).await;

    // Ensure with an idempotency key, twice: one command, one clone.
    let ensure = json!({"repo_name": "o/fixture", "repo_url": url, "idempotency_key": "parse-1"});
    let (s1, first) = server
        .post("/v1/repo-caches/ensure", ALICE, ensure.clone())
        .await;
    let (s2, second) = server.post("/v1/repo-caches/ensure", ALICE, ensure).await;
    assert_eq!(
        (s1, s2),
        (StatusCode::OK, StatusCode::OK),
        "{first} {second}"
    );
    assert_eq!(first["command_id"], second["command_id"]);
    assert_eq!(first["repo_cache"]["id"], second["repo_cache"]["id"]);
    assert!(
        first["repo_cache"].get("local_path").is_none(),
        "no host path of the cache"
    );
    let ensures: i64 =
        sqlx::query_scalar("SELECT count(*) FROM grove.commands WHERE kind = 'ensure_repo_cache'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(ensures, 1, "one job for one key");
    assert_eq!(env.count_events("repo_cache.created").await, 1);
    // The same key for another repository is a conflict, not the other one's answer.
    let (status, body) = server
        .post(
            "/v1/repo-caches/ensure",
            ALICE,
            json!({"repo_name": "o/other", "repo_url": url, "idempotency_key": "parse-1"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["kind"], "conflict");

    // A git token in its header is handed to the worker and found nowhere after.
    let git_token = "ghp_api0secret0token0for0the0test";
    let resp = server
        .http
        .post(server.url("/v1/repo-caches/ensure"))
        .bearer_auth(ALICE)
        .header("X-Grove-Git-Token", git_token)
        .json(&json!({"repo_name": "o/fixture", "repo_url": url, "fetch": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(!resp.text().await.unwrap().contains(git_token));
    let leaks: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM grove.command_secrets)
              + (SELECT count(*) FROM grove.commands WHERE payload::text LIKE '%' || $1 || '%'
                     OR coalesce(result::text, '') LIKE '%' || $1 || '%')
              + (SELECT count(*) FROM grove.events WHERE payload::text LIKE '%' || $1 || '%')",
    )
    .bind(git_token)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(leaks, 0, "the git token was kept somewhere");
    let log = std::fs::read_to_string(env.dir.path().join("serve.log")).unwrap();
    assert!(
        !log.contains(git_token) && !log.contains(ALICE),
        "a token in the log"
    );

    let ws = server.acquire(ALICE, &url, "c1").await;
    let (status, got) = server.get(&format!("/v1/workspaces/{ws}"), ALICE).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got["user_id"], "alice", "the user comes from the token");
    assert_eq!(got["branch_name"], "agent/edits-c1");
    assert_eq!(got["capabilities"]["writable"], true);

    let (status, exec) = server
        .post(
            &format!("/v1/workspaces/{ws}/exec"),
            ALICE,
            json!({"argv": ["sh", "-c", "cat README.md; echo oops >&2; exit 3"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{exec}");
    assert_eq!(exec["exit_code"], 3);
    assert_eq!(exec["stdout"], "hello from the fixture\n");
    assert_eq!(exec["stderr"], "oops\n");
    let exec_id = exec["exec_id"].as_str().unwrap();
    let (status, recorded) = server.get(&format!("/v1/execs/{exec_id}"), ALICE).await;
    assert_eq!(status, StatusCode::OK, "{recorded}");
    assert_eq!(recorded["status"], "succeeded");
    assert_eq!(recorded["result"]["stdout"], "hello from the fixture\n");

    // Bad input is 400 with the error shape; a write in a read-only workspace is 422.
    let (status, body) = server
        .post(
            &format!("/v1/workspaces/{ws}/exec"),
            ALICE,
            json!({"argv": []}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["kind"], "invalid_input");

    // Events of the workspace: its own stream and its runtime's, paged. A reader sees
    // events only once every older transaction in the cluster has ended (ADR 02), so
    // under load they may take a moment to appear.
    let wanted = [
        "workspace.created",
        "runtime.started",
        "exec.started",
        "exec.finished",
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    let (page, types) = loop {
        let (status, page) = server
            .get(&format!("/v1/workspaces/{ws}/events?limit=1000"), ALICE)
            .await;
        assert_eq!(status, StatusCode::OK);
        let types: Vec<String> = page["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["event_type"].as_str().unwrap().to_string())
            .collect();
        if wanted.iter().all(|w| types.iter().any(|t| t == w)) {
            break (page, types);
        }
        assert!(
            Instant::now() < deadline,
            "events missing after 30 s: {types:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        page["events"].as_array().unwrap().iter().all(|e| {
            e["stream_id"] == format!("workspace:{ws}")
                || e["stream_id"].as_str().unwrap().starts_with("runtime:")
        }),
        "only this workspace's streams"
    );
    let (_, one) = server
        .get(&format!("/v1/workspaces/{ws}/events?limit=1"), ALICE)
        .await;
    assert_eq!(one["events"].as_array().unwrap().len(), 1);
    let after = one["next_after"].as_i64().unwrap();
    let (_, rest) = server
        .get(
            &format!("/v1/workspaces/{ws}/events?after={after}&limit=1000"),
            ALICE,
        )
        .await;
    assert_eq!(
        rest["events"].as_array().unwrap().len() + 1,
        types.len(),
        "paging with after returns the rest"
    );

    // Release hibernates the runtime; the workspace stays.
    let (status, released) = server
        .post(&format!("/v1/sessions/{ws}/release"), ALICE, json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{released}");
    assert_eq!(released["state"], "released");
    assert_eq!(env.count_events("runtime.stopped").await, 1);

    let (status, pinned) = server
        .post(
            &format!("/v1/workspaces/{ws}/pin"),
            ALICE,
            json!({"until": "2999-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{pinned}");
    assert!(pinned["pinned_until"]
        .as_str()
        .unwrap()
        .starts_with("2999-01-01"));

    let (status, list) = server.get("/v1/workspaces", ALICE).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["workspaces"].as_array().unwrap().len(), 1);

    let (status, _) = server
        .call(
            reqwest::Method::DELETE,
            &format!("/v1/workspaces/{ws}"),
            Some(ALICE),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, gone) = server.get(&format!("/v1/workspaces/{ws}"), ALICE).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(gone["error"]["kind"], "not_found");
    // The exec stays readable by its owner after the workspace is gone.
    let (status, _) = server.get(&format!("/v1/execs/{exec_id}"), ALICE).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread")]
async fn another_users_ids_answer_404_and_a_missing_token_401() {
    let env = env_or_skip!("another_users_ids_answer_404_and_a_missing_token_401");
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "c1").await;
    let (_, exec) = server
        .post(
            &format!("/v1/workspaces/{ws}/exec"),
            ALICE,
            json!({"argv": ["true"]}),
        )
        .await;
    let exec_id = exec["exec_id"].as_str().unwrap().to_string();
    let execs_before = env.count_events("exec.started").await;

    let exec_body = json!({"argv": ["touch", "bob-was-here"]});
    let attempts = [
        (reqwest::Method::GET, format!("/v1/workspaces/{ws}"), None),
        (
            reqwest::Method::POST,
            format!("/v1/sessions/{ws}/release"),
            None,
        ),
        (
            reqwest::Method::POST,
            format!("/v1/workspaces/{ws}/exec"),
            Some(exec_body.clone()),
        ),
        (
            reqwest::Method::POST,
            format!("/v1/workspaces/{ws}/exec/stream"),
            Some(exec_body),
        ),
        (reqwest::Method::GET, format!("/v1/execs/{exec_id}"), None),
        (
            reqwest::Method::GET,
            format!("/v1/workspaces/{ws}/events"),
            None,
        ),
        (
            reqwest::Method::GET,
            format!("/v1/workspaces/{ws}/events?follow=true"),
            None,
        ),
        (
            reqwest::Method::POST,
            format!("/v1/workspaces/{ws}/pin"),
            None,
        ),
        (
            reqwest::Method::DELETE,
            format!("/v1/workspaces/{ws}"),
            None,
        ),
    ];
    for (method, path, body) in &attempts {
        let (status, answer) = server
            .call(method.clone(), path, Some(BOB), body.clone())
            .await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "bob {method} {path}: {answer}"
        );
        assert_eq!(answer["error"]["kind"], "not_found");
    }
    for (method, path, body) in &attempts {
        let (status, answer) = server.call(method.clone(), path, None, body.clone()).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{method} {path}: {answer}"
        );
        assert_eq!(answer["error"]["kind"], "unauthorized");
        let (status, _) = server
            .call(
                method.clone(),
                path,
                Some("not-a-configured-token-at-all"),
                body.clone(),
            )
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}");
    }
    assert_eq!(
        env.count_events("exec.started").await,
        execs_before,
        "nothing ran for bob"
    );
    // The user is the token's: a body that names one is refused.
    let (status, answer) = server
        .post(
            "/v1/sessions",
            BOB,
            json!({"user_id": "alice", "project_id": "p1", "repo_name": "o/fixture",
                   "repo_url": url, "base_ref": "main", "mode": "edit", "conversation_id": "c1"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    let (_, bobs) = server.get("/v1/workspaces", BOB).await;
    assert_eq!(bobs["workspaces"], json!([]));

    // An operator sees alice's workspace and exec.
    let (status, _) = server.get(&format!("/v1/workspaces/{ws}"), OPS).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = server.get(&format!("/v1/execs/{exec_id}"), OPS).await;
    assert_eq!(status, StatusCode::OK);
    let (_, all) = server.get("/v1/workspaces", OPS).await;
    assert_eq!(all["workspaces"].as_array().unwrap().len(), 1);
    // Alice still has it, untouched.
    let (status, still) = server.get(&format!("/v1/workspaces/{ws}"), ALICE).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(still["state"], "ready");
    assert_eq!(still["pinned_until"], Value::Null);
    let dir = std::path::Path::new(still["local_path"].as_str().unwrap());
    assert!(dir.join("README.md").is_file());
    assert!(!dir.join("bob-was-here").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_streaming_exec_delivers_its_first_chunk_before_the_command_ends() {
    let env = env_or_skip!("the_streaming_exec_delivers_its_first_chunk_before_the_command_ends");
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "c1").await;
    let started = Instant::now();
    let mut resp = server
        .http
        .post(server.url(&format!("/v1/workspaces/{ws}/exec/stream")))
        .bearer_auth(ALICE)
        .json(&json!({"argv": ["sh", "-c", "echo first; sleep 3; echo second"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let mut text = String::new();
    let mut first_at = None;
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(30), resp.chunk())
        .await
        .expect("the stream went silent for 30 s")
        .unwrap()
    {
        text.push_str(&String::from_utf8_lossy(&chunk));
        if first_at.is_none() && text.contains("first\\n") {
            first_at = Some(started.elapsed());
            assert!(
                !text.contains("second"),
                "second arrived with first: {text}"
            );
        }
    }
    let ended = started.elapsed();
    let first_at = first_at.unwrap_or_else(|| panic!("no first chunk: {text}"));
    assert!(
        ended - first_at >= Duration::from_secs(2),
        "first chunk at {first_at:?}, stream ended at {ended:?}: not streamed"
    );
    assert!(text.contains("event: started"), "{text}");
    let second = text.find("second\\n").expect("second chunk");
    let finished = text.find("event: finished").expect("finished event");
    assert!(second < finished, "output before the end: {text}");
    assert!(text.contains("\"exit_code\":0"), "{text}");
    // The exec is recorded like any other.
    assert_eq!(env.count_events("exec.finished").await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sql_enqueue_in_a_rolled_back_transaction_enqueues_nothing_and_one_key_is_one_clone() {
    let mut env = env_or_skip!(
        "the_sql_enqueue_in_a_rolled_back_transaction_enqueues_nothing_and_one_key_is_one_clone"
    );
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let count = |table: &'static str| {
        let pool = env.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {table}"
            )))
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let enqueue =
        "SELECT command_id, job_id, inserted FROM grove.enqueue_ensure_repo_cache($1, $2, $3)";

    // A service's transaction that rolls back enqueues nothing.
    let mut tx = env.pool.begin().await.unwrap();
    let _: (uuid::Uuid, String, bool) = sqlx::query_as(enqueue)
        .bind("parse-run-7")
        .bind("o/fixture")
        .bind(&url)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    // (its own work would be here)
    tx.rollback().await.unwrap();
    assert_eq!(count("grove.commands").await, 0);
    assert_eq!(count("apalis.jobs").await, 0);

    // Committed twice with one key: one command, one job.
    let mut ids = Vec::new();
    for expect_inserted in [true, false] {
        let mut tx = env.pool.begin().await.unwrap();
        let (id, _job, inserted): (uuid::Uuid, String, bool) = sqlx::query_as(enqueue)
            .bind("parse-run-7")
            .bind("o/fixture")
            .bind(&url)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(inserted, expect_inserted);
        ids.push(id);
    }
    assert_eq!(ids[0], ids[1]);
    assert_eq!(
        ids[0],
        grove_core::idempotency::command_id_for_key(
            grove_core::idempotency::SQL_SCOPE,
            "parse-run-7"
        ),
        "SQL and Rust derive the same command id"
    );
    assert_eq!(count("grove.commands").await, 1);
    assert_eq!(count("apalis.jobs").await, 1);
    // The key used for another repository is refused, not answered with this one.
    let err = sqlx::query(enqueue)
        .bind("parse-run-7")
        .bind("o/other")
        .bind(&url)
        .execute(&env.pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("already used"), "{err}");

    // A worker runs it once: one clone.
    env.spawn_worker().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status: String =
            sqlx::query_scalar("SELECT status FROM grove.commands WHERE command_id = $1")
                .bind(ids[0])
                .fetch_one(&env.pool)
                .await
                .unwrap();
        if status == "succeeded" {
            break;
        }
        assert_ne!(status, "failed");
        assert!(Instant::now() < deadline, "the ensure did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(env.count_events("repo_cache.created").await, 1);
    assert_eq!(env.worker_logs().matches("cloning repo cache").count(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_openapi_document_in_the_repo_equals_the_served_one() {
    let committed_path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
    let committed = std::fs::read_to_string(&committed_path).expect("docs/openapi.json");
    let regenerate = "regenerate it with `grove openapi > docs/openapi.json`";
    // `grove openapi` needs no database.
    let printed = std::process::Command::new(grove_e2e::grove_bin())
        .arg("openapi")
        .output()
        .unwrap();
    assert!(printed.status.success());
    assert_eq!(
        String::from_utf8(printed.stdout).unwrap(),
        committed,
        "docs/openapi.json is stale: {regenerate}"
    );
    let env = env_or_skip!("the_openapi_document_in_the_repo_equals_the_served_one");
    let server = Server::start(&env).await;
    // Served without a token.
    let served = server
        .http
        .get(server.url("/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    let served: Value = served.json().await.unwrap();
    let committed: Value = serde_json::from_str(&committed).unwrap();
    assert_eq!(served, committed, "{regenerate}");
    assert!(served["paths"]["/v1/sessions"]["post"].is_object());
    assert!(served["paths"]["/v1/workspaces/{id}/exec/stream"]["post"].is_object());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_evicted_workspace_is_restored_over_http_with_its_uncommitted_work() {
    let env = env_or_skip!("an_evicted_workspace_is_restored_over_http_with_its_uncommitted_work");
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    // Everything is above a 1-byte budget; the grace keeps what was used in the last
    // minute, so only the sweep run with a clock an hour ahead evicts it.
    let server = Server::start_with(
        &env,
        &[
            ("GROVE_DISK_BUDGET", "1"),
            ("GROVE_PRESSURE_GRACE", "60"),
            ("GROVE_ALLOW_CLOCK_OVERRIDE", "1"),
        ],
    )
    .await;
    let ws = server.acquire(ALICE, &url, "restore-1").await;
    let (status, exec) = server
        .post(
            &format!("/v1/workspaces/{ws}/exec"),
            ALICE,
            json!({"argv": ["sh", "-c", "echo draft > notes.txt"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{exec}");
    assert_eq!(exec["exit_code"], 0, "{exec}");
    let (status, released) = server
        .post(&format!("/v1/sessions/{ws}/release"), ALICE, json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{released}");

    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let out = env.grove(&["evict", "--json", "--now", &later]).await;
    assert!(out.status.success(), "{:?}", grove_e2e::text(&out));
    let (_, evicted) = server.get(&format!("/v1/workspaces/{ws}"), ALICE).await;
    assert_eq!(evicted["state"], "evicted", "{evicted}");

    // Another user's restore is a 404 and changes nothing.
    let (status, body) = server
        .post(&format!("/v1/workspaces/{ws}/restore"), BOB, json!({}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (_, still) = server.get(&format!("/v1/workspaces/{ws}"), ALICE).await;
    assert_eq!(still["state"], "evicted", "{still}");

    let (status, restored) = server
        .post(&format!("/v1/workspaces/{ws}/restore"), ALICE, json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{restored}");
    assert_eq!(restored["id"], ws.as_str());
    assert_eq!(restored["state"], "ready", "{restored}");
    assert_eq!(restored["dirty"], true, "{restored}");
    let (status, exec) = server
        .post(
            &format!("/v1/workspaces/{ws}/exec"),
            ALICE,
            json!({"argv": ["cat", "notes.txt"], "kind": "read"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{exec}");
    assert_eq!(exec["stdout"], "draft\n", "{exec}");
}

/// Polls an interactive session over HTTP until `done(all output, exit)`.
async fn poll_session_until(
    server: &Server,
    path: &str,
    done: impl Fn(&str, &Value) -> bool,
) -> (String, Value) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut all = String::new();
    loop {
        let (status, body) = server
            .post(&format!("{path}/poll"), ALICE, json!({"wait_ms": 500}))
            .await;
        assert_eq!(status, StatusCode::OK, "poll: {body}");
        all.push_str(body["data"].as_str().unwrap());
        if done(&all, &body["exit"]) {
            return (all, body["exit"].clone());
        }
        assert!(
            Instant::now() < deadline,
            "session never got there; output {all:?}, last {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interactive_session_is_started_written_polled_and_killed_over_http_by_its_owner_only() {
    let env = env_or_skip!(
        "an_interactive_session_is_started_written_polled_and_killed_over_http_by_its_owner_only"
    );
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "c-interactive").await;
    let base = format!("/v1/workspaces/{ws}/sessions/interactive");

    let (status, started) = server.post(&base, ALICE, json!({"argv": ["sh"]})).await;
    if status == StatusCode::SERVICE_UNAVAILABLE {
        eprintln!("skipped: no sandboxed local runtime for sessions here: {started}");
        return;
    }
    assert_eq!(status, StatusCode::CREATED, "start: {started}");
    assert_eq!(started["workspace_id"], ws.as_str());
    assert_eq!(started["runtime"], "local");
    assert!(started["exit"].is_null());
    let sid = started["id"].as_str().unwrap().to_string();
    let path = format!("{base}/{sid}");

    // Another user sees neither the workspace's sessions nor this one.
    for (method, p, body) in [
        (reqwest::Method::POST, format!("{path}/poll"), json!({})),
        (
            reqwest::Method::POST,
            format!("{path}/write"),
            json!({"data": "x"}),
        ),
        (reqwest::Method::POST, format!("{path}/kill"), json!({})),
        (reqwest::Method::GET, base.clone(), json!({})),
        (reqwest::Method::POST, base.clone(), json!({"argv": ["sh"]})),
    ] {
        let (status, body) = server.call(method, &p, Some(BOB), Some(body)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "bob on {p}: {body}");
    }

    let (status, body) = server
        .post(
            &format!("{path}/write"),
            ALICE,
            json!({"data": "GROVE_X=$((40+2)); echo \"hi-$GROVE_X\" > made.txt\n"}),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "write: {body}");
    let (status, _) = server
        .post(
            &format!("{path}/write"),
            ALICE,
            json!({"data": "cat made.txt\n"}),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (out, exit) = poll_session_until(&server, &path, |o, _| o.contains("hi-42")).await;
    assert_eq!(out, "hi-42\n");
    assert!(exit.is_null(), "the shell still runs: {exit}");
    let (_, row) = server.get(&format!("/v1/workspaces/{ws}"), ALICE).await;
    let made = std::path::Path::new(row["local_path"].as_str().unwrap()).join("made.txt");
    assert_eq!(
        std::fs::read_to_string(&made).unwrap(),
        "hi-42\n",
        "the session writes into the edit workspace"
    );

    let (status, listed) = server.get(&base, ALICE).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == sid.as_str()),
        "{listed}"
    );

    let (status, _) = server.post(&format!("{path}/kill"), ALICE, json!({})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, exit) = poll_session_until(&server, &path, |_, e| !e.is_null()).await;
    assert_eq!(exit["killed"], true, "{exit}");
    assert_eq!(exit["exit_code"], 137, "{exit}");
    let (status, body) = server
        .post(
            &format!("{path}/write"),
            ALICE,
            json!({"data": "echo late\n"}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "write after kill: {body}"
    );
    let (status, _) = server
        .post(&format!("{base}/no-such-session/poll"), ALICE, json!({}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = server
        .post(&format!("{path}/poll"), ALICE, json!({"wait_ms": 999999}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "an overlong wait: {body}");
}
