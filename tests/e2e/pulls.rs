//! Pull requests end to end: a real `grove serve` (HTTP, in-process worker, real
//! Postgres) against the fake GitHub of the test tree, which is also the git remote
//! (smart HTTP over a local bare repository): acquire, write, commit and push through the
//! tool routes, open a pull request, read it, comment on it; the token is found nowhere;
//! another user gets 404.

use std::process::Stdio;
use std::time::Duration;

use grove_e2e::fake_github::FakeGitHub;
use grove_e2e::{files_containing, git, text, TestEnv};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

use crate::env_or_skip;

const ALICE: &str = "alice-token-pulls-0123456789";
const BOB: &str = "bob-token-pulls-0123456789";

/// A running `grove serve` pointed at the fake GitHub, killed when dropped.
struct Server {
    base: String,
    http: reqwest::Client,
    _child: Child,
}

impl Server {
    async fn start(env: &TestEnv, fake: &FakeGitHub) -> Self {
        let log = std::fs::File::create(env.dir.path().join("serve.log")).unwrap();
        let mut cmd = env.command(&["serve", "--bind", "127.0.0.1:0"]);
        cmd.env("GROVE_API_TOKENS", format!("{ALICE}=alice,{BOB}=bob"))
            .env("GROVE_GITHUB_API_URL", fake.api_url())
            .env("GROVE_LOG", "debug")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        let mut child = cmd.spawn().expect("spawn grove serve");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
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

    /// One request; returns the status, the parsed body and the raw text.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        bearer: &str,
        git_token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value, String) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(bearer);
        if let Some(t) = git_token {
            req = req.header("X-Grove-Git-Token", t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status();
        let raw = resp.text().await.unwrap();
        let value = serde_json::from_str(&raw).unwrap_or(Value::Null);
        (status, value, raw)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pushed_branch_becomes_a_pull_request_that_is_read_and_commented_over_http() {
    let env =
        env_or_skip!("a_pushed_branch_becomes_a_pull_request_that_is_read_and_commented_over_http");
    let token = format!("ghp_{}", uuid::Uuid::new_v4().simple());
    // The upstream: a bare repository served by the fake GitHub as octo/hello.
    let upstream = env.fixture_repo("hello", &[("README.md", "hello\n")]);
    let upstream = upstream.strip_prefix("file://").unwrap();
    let remotes = env.dir.path().join("remotes");
    std::fs::create_dir_all(&remotes).unwrap();
    git(&remotes, &["clone", "-q", "--bare", upstream, "hello.git"]);
    let bare = remotes.join("hello.git");
    let fake = FakeGitHub::start(&token).await;
    fake.add_repo("octo/hello", &bare);
    let server = Server::start(&env, &fake).await;
    let mut bodies = Vec::new();

    // Acquire an edit session of the repository at its GitHub URL.
    let (status, session, raw) = server
        .call(
            reqwest::Method::POST,
            "/v1/sessions",
            ALICE,
            None,
            Some(json!({
                "project_id": "p1",
                "repo_name": "octo/hello",
                "repo_url": fake.repo_url("octo/hello"),
                "base_ref": "main",
                "mode": "edit",
                "conversation_id": "c1",
            })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "acquire: {raw}");
    bodies.push(raw);
    let id = session["session_id"].as_str().unwrap().to_string();
    assert_eq!(session["workspace"]["branch_name"], "agent/edits-c1");

    // Write, commit and push through the tool routes (the push with the token header).
    for (tool, args, git_token) in [
        (
            "write_file",
            json!({"path": "src/new.rs", "content": "fn main() {}\n"}),
            None,
        ),
        ("git_commit", json!({"message": "Add src/new.rs"}), None),
        (
            "git_push",
            json!({"set_upstream": true}),
            Some(token.as_str()),
        ),
    ] {
        let (status, _, raw) = server
            .call(
                reqwest::Method::POST,
                &format!("/v1/workspaces/{id}/tools/{tool}"),
                ALICE,
                git_token,
                Some(args),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{tool}: {raw}");
        bodies.push(raw);
    }
    let pushed = git(&bare, &["rev-parse", "refs/heads/agent/edits-c1"]);
    assert_eq!(pushed.trim().len(), 40, "the branch reached the remote");

    // Open the pull request.
    let (status, created, raw) = server
        .call(
            reqwest::Method::POST,
            &format!("/v1/workspaces/{id}/pulls"),
            ALICE,
            Some(&token),
            Some(json!({"title": "Add src/new.rs", "body": "Made by an agent."})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "create: {raw}");
    bodies.push(raw);
    let pr = &created["pull_request"];
    assert_eq!(pr["number"], 1);
    assert_eq!(pr["head"], "agent/edits-c1");
    assert_eq!(pr["base"], "main");
    assert_eq!(pr["state"], "open");
    assert_eq!(pr["head_sha"], pushed.trim());
    assert_eq!(
        pr["url"],
        format!("{}/octo/hello/pull/1", fake.web_origin())
    );
    // The fake received exactly that, with the token as bearer.
    let made = fake.pulls("octo/hello");
    assert_eq!(made.len(), 1);
    assert_eq!(made[0]["head"]["ref"], "agent/edits-c1");
    assert_eq!(made[0]["base"]["ref"], "main");
    assert_eq!(made[0]["title"], "Add src/new.rs");
    assert_eq!(made[0]["body"], "Made by an agent.");
    let first = &fake.requests()[0];
    assert_eq!(
        first.authorization.as_deref(),
        Some(&*format!("Bearer {token}"))
    );
    assert_eq!(first.api_version.as_deref(), Some("2022-11-28"));

    // Read it back (no job: the server asks the platform).
    let (status, read, raw) = server
        .call(
            reqwest::Method::GET,
            &format!("/v1/workspaces/{id}/pulls/1"),
            ALICE,
            Some(&token),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "get: {raw}");
    bodies.push(raw);
    assert_eq!(&read, pr);

    // Comment on it.
    let (status, comment, raw) = server
        .call(
            reqwest::Method::POST,
            &format!("/v1/workspaces/{id}/pulls/1/comments"),
            ALICE,
            Some(&token),
            Some(json!({"body": "Tests pass."})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "comment: {raw}");
    bodies.push(raw);
    assert_eq!(comment["number"], 1);
    assert_eq!(fake.comments().len(), 1);
    assert_eq!(fake.comments()[0]["body"], "Tests pass.");
    assert_eq!(comment["comment_id"], fake.comments()[0]["id"]);

    // A second pull request for the branch: GitHub's 422, passed on with its message.
    let (status, dup, raw) = server
        .call(
            reqwest::Method::POST,
            &format!("/v1/workspaces/{id}/pulls"),
            ALICE,
            Some(&token),
            Some(json!({"title": "Again"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{raw}");
    bodies.push(raw);
    assert_eq!(dup["error"]["kind"], "rejected");
    let message = dup["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("A pull request already exists for octo:agent/edits-c1."),
        "{message}"
    );
    // No token: refused before any job.
    let (status, none, raw) = server
        .call(
            reqwest::Method::POST,
            &format!("/v1/workspaces/{id}/pulls"),
            ALICE,
            None,
            Some(json!({"title": "No token"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{raw}");
    assert_eq!(none["error"]["kind"], "invalid_input");
    bodies.push(raw);
    // An unknown pull request is the platform's 404.
    let (status, _, raw) = server
        .call(
            reqwest::Method::GET,
            &format!("/v1/workspaces/{id}/pulls/99"),
            ALICE,
            None,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{raw}");
    bodies.push(raw);

    // Another user sees none of it, and the platform is not asked.
    let asked = fake.requests().len();
    for (method, path, body) in [
        (
            reqwest::Method::POST,
            format!("/v1/workspaces/{id}/pulls"),
            Some(json!({"title": "Not mine"})),
        ),
        (
            reqwest::Method::GET,
            format!("/v1/workspaces/{id}/pulls/1"),
            None,
        ),
        (
            reqwest::Method::POST,
            format!("/v1/workspaces/{id}/pulls/1/comments"),
            Some(json!({"body": "Not mine"})),
        ),
    ] {
        let (status, v, raw) = server.call(method, &path, BOB, Some(&token), body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "bob {path}: {raw}");
        assert_eq!(v["error"]["kind"], "not_found");
        bodies.push(raw);
    }
    assert_eq!(
        fake.requests().len(),
        asked,
        "bob's requests reached the platform"
    );

    // The CLI: show asks the platform (no job), comment is a job with --token-env.
    let cli_env = [
        ("GROVE_GITHUB_API_URL", fake.api_url()),
        ("GH_TOKEN", token.clone()),
    ];
    let cli_env: Vec<(&str, &str)> = cli_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = env
        .grove_env(&["pr", "show", &id, "1", "--json"], &cli_env)
        .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "pr show: {stderr}");
    let shown: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (shown["number"].clone(), shown["head"].clone()),
        (json!(1), json!("agent/edits-c1"))
    );
    bodies.extend([stdout, stderr]);
    let out = env
        .grove_env(
            &[
                "pr",
                "comment",
                &id,
                "1",
                "--body",
                "From the CLI.",
                "--token-env",
                "GH_TOKEN",
            ],
            &cli_env,
        )
        .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "pr comment: {stderr}");
    assert!(stdout.starts_with("comment "), "{stdout}");
    bodies.extend([stdout, stderr]);
    assert_eq!(fake.comments()[1]["body"], "From the CLI.");
    // Without the variable set: bad input, exit 2, nothing submitted.
    let out = env
        .grove(&[
            "pr",
            "comment",
            &id,
            "1",
            "--body",
            "x",
            "--token-env",
            "GH_TOKEN",
        ])
        .await;
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));

    // The events: opened and commented, with numbers and URLs.
    let events: Vec<(String, Value)> = sqlx::query_as(
        "SELECT event_type, payload FROM grove.events WHERE event_type LIKE 'workspace.pull_request_%' ORDER BY position",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[0].0, "workspace.pull_request_opened");
    assert_eq!(events[0].1["number"], 1);
    assert_eq!(events[0].1["repo"], "octo/hello");
    assert_eq!(events[0].1["head"], "agent/edits-c1");
    assert_eq!(events[0].1["url"], pr["url"]);
    assert_eq!(events[1].0, "workspace.pull_request_commented");
    assert_eq!(events[1].1["comment_id"], comment["comment_id"]);
    assert_eq!(events[2].0, "workspace.pull_request_commented");

    // The token is nowhere: events, ledger, jobs, secrets, responses, logs, files.
    for body in &bodies {
        assert!(!body.contains(&token), "token in a response: {body}");
    }
    let in_db: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM grove.events WHERE payload::text LIKE '%' || $1 || '%' OR metadata::text LIKE '%' || $1 || '%')
              + (SELECT count(*) FROM grove.commands WHERE payload::text LIKE '%' || $1 || '%' OR coalesce(result::text, '') LIKE '%' || $1 || '%' OR coalesce(error::text, '') LIKE '%' || $1 || '%')
              + (SELECT count(*) FROM apalis.jobs WHERE convert_from(job, 'UTF8') LIKE '%' || $1 || '%' OR coalesce(last_result::text, '') LIKE '%' || $1 || '%')
              + (SELECT count(*) FROM grove.command_secrets)",
    )
    .bind(&token)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(in_db, 0, "token (or a leftover secret row) in the database");
    let log = std::fs::read_to_string(env.dir.path().join("serve.log")).unwrap();
    assert!(
        log.contains("worker started"),
        "the log read is the server's"
    );
    assert!(!log.contains(&token), "token in the server log");
    let hits = files_containing(&env.home(), token.as_bytes());
    assert!(hits.is_empty(), "token under GROVE_HOME: {hits:?}");
    // The kinds the ledger recorded: one pull request opened, a comment, one refused, a
    // comment from the CLI.
    let kinds: Vec<(String, String)> = sqlx::query_as(
        "SELECT kind, status FROM grove.commands WHERE kind LIKE '%pull_request' ORDER BY enqueued_at",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        kinds,
        vec![
            ("create_pull_request".into(), "succeeded".into()),
            ("comment_pull_request".into(), "succeeded".into()),
            ("create_pull_request".into(), "failed".into()),
            ("comment_pull_request".into(), "succeeded".into()),
        ]
    );
}
