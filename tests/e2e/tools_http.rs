//! The agent tool surface over HTTP against a real `grove serve` (its in-process worker,
//! real Postgres and git): an edit-to-push flow, path escapes, the text editor's
//! semantics, tenancy and the read-only gate, as the HTTP layer answers them. The tools'
//! own edge cases are covered at the CLI level (tests/e2e/tools.rs) and in grove-tools.

use std::path::PathBuf;

use grove_e2e::http::{Server, ALICE, BOB};
use grove_e2e::{git, TestEnv};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::env_or_skip;

/// A bare upstream made from a fixture repository, and its file:// URL (libgit2 pushes
/// only to bare local repositories).
fn bare_upstream(env: &TestEnv) -> (PathBuf, String) {
    env.fixture_repo(
        "fixture",
        &[
            ("src/lib.rs", "pub fn alpha() {}\n"),
            ("notes.txt", "one\ntwo\nthree\nfour\n"),
            ("twice.txt", "x = 1\nx = 1\n"),
        ],
    );
    let upstream = env.dir.path().join("upstream");
    git(
        &upstream,
        &["clone", "-q", "--bare", "fixture", "fixture.git"],
    );
    let bare = upstream.join("fixture.git");
    let url = format!("file://{}", bare.display());
    (bare, url)
}

async fn tool(
    server: &Server,
    token: &str,
    ws: &str,
    op: &str,
    args: Value,
) -> (StatusCode, Value) {
    server
        .post(&format!("/v1/workspaces/{ws}/tools/{op}"), token, args)
        .await
}

/// Calls a tool that must succeed and returns its output.
async fn ok(server: &Server, ws: &str, op: &str, args: Value) -> Value {
    let (status, body) = tool(server, ALICE, ws, op, args).await;
    assert_eq!(status, StatusCode::OK, "{op}: {body}");
    body
}

/// Calls a tool that must fail with `status` and `kind`; returns the message.
async fn refused(
    server: &Server,
    ws: &str,
    op: &str,
    args: Value,
    status: StatusCode,
    kind: &str,
) -> String {
    let (got, body) = tool(server, ALICE, ws, op, args.clone()).await;
    assert_eq!(got, status, "{op} {args}: {body}");
    assert_eq!(body["error"]["kind"], kind, "{op} {args}: {body}");
    body["error"]["message"].as_str().unwrap().to_string()
}

async fn local_path(server: &Server, ws: &str) -> PathBuf {
    let (_, body) = server.get(&format!("/v1/workspaces/{ws}"), ALICE).await;
    PathBuf::from(body["local_path"].as_str().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_writes_replaces_searches_commits_and_pushes_over_http() {
    let env = env_or_skip!("an_agent_writes_replaces_searches_commits_and_pushes_over_http");
    let (bare, url) = bare_upstream(&env);
    let server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "c1").await;
    let dir = local_path(&server, &ws).await;

    let w = ok(
        &server,
        &ws,
        "write_file",
        json!({"path": "src/new.rs", "content": "pub fn beta() {}\n"}),
    )
    .await;
    assert_eq!(w["output"], "written");
    assert_eq!(w["created"], true);
    assert_eq!(
        std::fs::read_to_string(dir.join("src/new.rs")).unwrap(),
        "pub fn beta() {}\n"
    );

    let r = ok(
        &server,
        &ws,
        "str_replace",
        json!({"path": "src/new.rs", "old_str": "beta", "new_str": "gamma"}),
    )
    .await;
    assert_eq!(r["output"], "written");
    assert_eq!(r["created"], false);

    let found = ok(&server, &ws, "search", json!({"pattern": "gamma"})).await;
    assert_eq!(found["output"], "search");
    assert_eq!(
        found["hits"],
        json!([{"path": "src/new.rs", "line": 1, "text": "pub fn gamma() {}"}])
    );

    let read = ok(&server, &ws, "read_file", json!({"path": "src/new.rs"})).await;
    assert_eq!(read["content"], "pub fn gamma() {}\n");

    let status = ok(&server, &ws, "git_status", json!({})).await;
    assert_eq!(status["branch"], "agent/edits-c1");
    assert_eq!(status["entries"][0]["path"], "src/new.rs");
    assert_eq!(status["entries"][0]["unstaged"], "untracked");

    let commit = ok(&server, &ws, "git_commit", json!({"message": "add gamma"})).await;
    assert_eq!(commit["output"], "committed");
    assert_eq!(commit["files"], json!(["src/new.rs"]));
    let sha = commit["commit"].as_str().unwrap().to_string();

    let log = ok(&server, &ws, "git_log", json!({"max_count": 1})).await;
    assert_eq!(log["entries"][0]["commit"], sha.as_str());
    assert_eq!(log["entries"][0]["summary"], "add gamma");

    // The push carries a git token in the API's header: used, and kept nowhere.
    let git_token = "ghp_tools0push0token0for0the0test";
    let resp = server
        .http
        .post(server.url(&format!("/v1/workspaces/{ws}/tools/git_push")))
        .bearer_auth(ALICE)
        .header("X-Grove-Git-Token", git_token)
        .json(&json!({"set_upstream": true}))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(!text.contains(git_token));
    let pushed: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(pushed["output"], "pushed");
    assert_eq!(pushed["branch"], "agent/edits-c1");
    assert_eq!(pushed["commit"], sha.as_str());
    assert_eq!(pushed["previous"], Value::Null);
    // The bare remote's branch is the commit, with the file in it.
    assert_eq!(
        git(&bare, &["rev-parse", "refs/heads/agent/edits-c1"]).trim(),
        sha
    );
    assert_eq!(
        git(&bare, &["show", "agent/edits-c1:src/new.rs"]),
        "pub fn gamma() {}\n"
    );
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
        !log.contains(git_token),
        "the git token is in the server log"
    );

    // Every write went through the queue as a `tool` command and left its event.
    assert_eq!(env.count_events("workspace.file_written").await, 2);
    assert_eq!(env.count_events("workspace.committed").await, 1);
    assert_eq!(env.count_events("workspace.pushed").await, 1);
    let tools: i64 = sqlx::query_scalar("SELECT count(*) FROM grove.commands WHERE kind = 'tool'")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    // The four writes are commands; the four reads (search, read_file, git_status,
    // git_log) were answered by the server's own worker without the queue (ADR 24).
    assert_eq!(tools, 4, "one tool command per write, none per read");
}

#[tokio::test(flavor = "multi_thread")]
async fn paths_that_leave_the_workspace_are_refused_over_http_and_nothing_outside_is_touched() {
    let env = env_or_skip!(
        "paths_that_leave_the_workspace_are_refused_over_http_and_nothing_outside_is_touched"
    );
    let (_bare, url) = bare_upstream(&env);
    let server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "c1").await;
    let dir = local_path(&server, &ws).await;
    let outside = env.dir.path().join("outside.txt");
    std::fs::write(&outside, "outside secret\n").unwrap();
    std::os::unix::fs::symlink("/etc", dir.join("etc")).unwrap();
    let rel = pathdiff(&outside, &dir);
    std::os::unix::fs::symlink(&rel, dir.join("leak.txt")).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("leak.txt")).unwrap(),
        "outside secret\n"
    );

    let bad = StatusCode::BAD_REQUEST;
    let long = "a".repeat(300);
    let cases: Vec<(&str, Value)> = vec![
        ("read_file", json!({"path": "../outside.txt"})),
        ("read_file", json!({"path": "src/../../outside.txt"})),
        ("read_file", json!({"path": outside.to_str().unwrap()})),
        ("read_file", json!({"path": "/etc/passwd"})),
        ("read_file", json!({"path": "etc/passwd"})),
        ("view", json!({"path": "etc"})),
        ("list_dir", json!({"path": "etc"})),
        ("read_file", json!({"path": "leak.txt"})),
        ("view", json!({"path": "leak.txt"})),
        ("search", json!({"pattern": "secret", "path": "leak.txt"})),
        ("search", json!({"pattern": "root", "path": "etc"})),
        (
            "write_file",
            json!({"path": "leak.txt", "content": "overwritten\n"}),
        ),
        (
            "write_file",
            json!({"path": "etc/grove-e2e-escape", "content": "x"}),
        ),
        (
            "create",
            json!({"path": "../grove-e2e-escape", "content": "x"}),
        ),
        (
            "str_replace",
            json!({"path": "leak.txt", "old_str": "outside", "new_str": "inside"}),
        ),
        (
            "insert",
            json!({"path": "leak.txt", "insert_line": 0, "text": "x\n"}),
        ),
        ("read_file", json!({"path": "src/lib.rs\u{0}.txt"})),
        ("write_file", json!({"path": "a\u{0}b", "content": "x"})),
        (
            "write_file",
            json!({"path": "ok.txt", "content": "nul \u{0} inside"}),
        ),
        ("search", json!({"pattern": "a\u{0}"})),
        ("read_file", json!({"path": long})),
        (
            "write_file",
            json!({"path": format!("src/{long}"), "content": "x"}),
        ),
        ("git_diff", json!({"paths": ["../outside.txt"]})),
    ];
    for (op, args) in cases {
        let (status, body) = tool(&server, ALICE, &ws, op, args.clone()).await;
        assert_eq!(status, bad, "{op} {args}: {body}");
        assert_eq!(
            body["error"]["kind"], "invalid_input",
            "{op} {args}: {body}"
        );
        let text = body.to_string();
        assert!(
            !text.contains("outside secret") && !text.contains("root:"),
            "{op}: content leaked: {text}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        "outside secret\n"
    );
    assert!(!std::path::Path::new("/etc/grove-e2e-escape").exists());
    assert!(!env.dir.path().join("grove-e2e-escape").exists());
    assert!(!dir.join("ok.txt").exists());
    assert_eq!(env.count_events("workspace.file_written").await, 0);
    assert_eq!(env.count_events("workspace.committed").await, 0);
}

/// `to`, relative to the directory `from` (both absolute, no symlinks on the way).
fn pathdiff(to: &std::path::Path, from: &std::path::Path) -> PathBuf {
    let depth = from.components().count() - 1;
    let mut rel = PathBuf::new();
    for _ in 0..depth {
        rel.push("..");
    }
    rel.join(to.strip_prefix("/").unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_text_editor_keeps_its_semantics_over_http() {
    let env = env_or_skip!("the_text_editor_keeps_its_semantics_over_http");
    let (_bare, url) = bare_upstream(&env);
    let server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "c1").await;
    let dir = local_path(&server, &ws).await;
    let bad = StatusCode::BAD_REQUEST;

    let v = ok(
        &server,
        &ws,
        "view",
        json!({"path": "notes.txt", "range": [2, 3]}),
    )
    .await;
    assert_eq!(
        v,
        json!({"output": "text", "text": "     2\ttwo\n     3\tthree\n"})
    );
    let v = ok(
        &server,
        &ws,
        "view",
        json!({"path": "notes.txt", "range": [3, -1]}),
    )
    .await;
    assert_eq!(v["text"], "     3\tthree\n     4\tfour\n");
    let v = ok(&server, &ws, "view", json!({"path": "src"})).await;
    assert!(
        v["text"]
            .as_str()
            .unwrap()
            .lines()
            .any(|l| l == "src/lib.rs"),
        "{v}"
    );
    let m = refused(
        &server,
        &ws,
        "view",
        json!({"path": "notes.txt", "range": [2, 9]}),
        bad,
        "invalid_input",
    )
    .await;
    assert!(m.contains("out of range"), "{m}");
    refused(
        &server,
        &ws,
        "view",
        json!({"path": "notes.txt", "range": [0, 2]}),
        bad,
        "invalid_input",
    )
    .await;

    let m = refused(
        &server,
        &ws,
        "create",
        json!({"path": "notes.txt", "content": "x"}),
        StatusCode::CONFLICT,
        "conflict",
    )
    .await;
    assert!(m.contains("already exists"), "{m}");
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt")).unwrap(),
        "one\ntwo\nthree\nfour\n"
    );
    ok(
        &server,
        &ws,
        "create",
        json!({"path": "deep/new.txt", "content": "fresh\n"}),
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(dir.join("deep/new.txt")).unwrap(),
        "fresh\n"
    );

    let m = refused(
        &server,
        &ws,
        "str_replace",
        json!({"path": "notes.txt", "old_str": "five", "new_str": "5"}),
        bad,
        "invalid_input",
    )
    .await;
    assert!(m.contains("not found"), "{m}");
    let m = refused(
        &server,
        &ws,
        "str_replace",
        json!({"path": "twice.txt", "old_str": "x = 1", "new_str": "x = 2"}),
        bad,
        "invalid_input",
    )
    .await;
    assert!(m.contains("occurs 2 times"), "{m}");
    assert_eq!(
        std::fs::read_to_string(dir.join("twice.txt")).unwrap(),
        "x = 1\nx = 1\n"
    );

    ok(
        &server,
        &ws,
        "insert",
        json!({"path": "notes.txt", "insert_line": 0, "text": "zero\n"}),
    )
    .await;
    ok(
        &server,
        &ws,
        "insert",
        json!({"path": "notes.txt", "insert_line": 5, "text": "five\n"}),
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt")).unwrap(),
        "zero\none\ntwo\nthree\nfour\nfive\n"
    );
    let m = refused(
        &server,
        &ws,
        "insert",
        json!({"path": "notes.txt", "insert_line": 8, "text": "x\n"}),
        bad,
        "invalid_input",
    )
    .await;
    assert!(m.contains("out of range"), "{m}");
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt")).unwrap(),
        "zero\none\ntwo\nthree\nfour\nfive\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_routes_answer_only_their_owner_and_a_read_only_workspace_offers_no_write_tool() {
    let env = env_or_skip!(
        "tool_routes_answer_only_their_owner_and_a_read_only_workspace_offers_no_write_tool"
    );
    let (_bare, url) = bare_upstream(&env);
    let server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "c1").await;

    // Alice's tools: all twenty (thirteen plus the seven of history), each with its argument schema.
    let (status, list) = server
        .get(&format!("/v1/workspaces/{ws}/tools"), ALICE)
        .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list["writable"], true);
    let names: Vec<&str> = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 20, "{names:?}");
    let sr = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "str_replace")
        .unwrap();
    assert_eq!(sr["writes"], true);
    assert_eq!(
        sr["input_schema"]["required"],
        json!(["path", "old_str", "new_str"])
    );

    // Bob sees none of it: 404 on the list and on every call, and nothing is enqueued.
    let (status, body) = server.get(&format!("/v1/workspaces/{ws}/tools"), BOB).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    for (op, args) in [
        ("read_file", json!({"path": "src/lib.rs"})),
        ("write_file", json!({"path": "bob.txt", "content": "x"})),
        ("git_status", json!({})),
    ] {
        let (status, body) = tool(&server, BOB, &ws, op, args).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{op}: {body}");
        assert_eq!(body["error"]["kind"], "not_found");
        assert!(!body.to_string().contains("alpha"));
    }
    let (status, _) = server
        .call(
            reqwest::Method::GET,
            &format!("/v1/workspaces/{ws}/tools"),
            None,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Unknown tools are 404; arguments of the wrong shape 422, in the error shape.
    let m = refused(
        &server,
        &ws,
        "rm_rf",
        json!({}),
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    assert!(m.contains("unknown tool"), "{m}");
    refused(
        &server,
        &ws,
        "shell",
        json!({"command": "true"}),
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    for args in [
        json!({"path": 3}),
        json!({}),
        json!({"path": "src/lib.rs", "op": "write_file"}),
        json!({"path": "src/lib.rs", "extra": true}),
    ] {
        refused(
            &server,
            &ws,
            "read_file",
            args,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        )
        .await;
    }
    refused(
        &server,
        &ws,
        "insert",
        json!({"path": "a", "insert_line": "two", "text": "x"}),
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_input",
    )
    .await;
    let (status, body) = tool(&server, ALICE, &ws, "read_file", json!(["src/lib.rs"])).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let tools: i64 = sqlx::query_scalar("SELECT count(*) FROM grove.commands WHERE kind = 'tool'")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(tools, 0, "refused calls enqueue nothing");

    // A read-only (analysis) workspace: no write tool listed, and a write refused.
    let (status, body) = server
        .post(
            "/v1/sessions",
            ALICE,
            json!({"project_id": "p1", "repo_name": "o/fixture", "repo_url": url, "base_ref": "main", "mode": "analysis"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ro = body["session_id"].as_str().unwrap().to_string();
    let ro_dir = PathBuf::from(body["workspace"]["local_path"].as_str().unwrap());
    let (_, list) = server
        .get(&format!("/v1/workspaces/{ro}/tools"), ALICE)
        .await;
    assert_eq!(list["writable"], false);
    let names: Vec<&str> = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "view",
            "read_file",
            "list_dir",
            "search",
            "git_status",
            "git_diff",
            "git_log",
            "history",
            "history_diff",
            "history_file"
        ]
    );
    for (op, args) in [
        ("write_file", json!({"path": "ro.txt", "content": "x"})),
        (
            "str_replace",
            json!({"path": "src/lib.rs", "old_str": "alpha", "new_str": "beta"}),
        ),
        ("git_commit", json!({"message": "m"})),
    ] {
        let m = refused(
            &server,
            &ro,
            op,
            args,
            StatusCode::UNPROCESSABLE_ENTITY,
            "rejected",
        )
        .await;
        assert!(m.contains("read-only"), "{m}");
    }
    assert!(!ro_dir.join("ro.txt").exists());
    assert_eq!(
        std::fs::read_to_string(ro_dir.join("src/lib.rs")).unwrap(),
        "pub fn alpha() {}\n"
    );
    let read = ok(&server, &ro, "read_file", json!({"path": "src/lib.rs"})).await;
    assert_eq!(read["content"], "pub fn alpha() {}\n");
}
