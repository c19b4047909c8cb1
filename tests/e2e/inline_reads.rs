//! Read tools answered inline (ADR 24) by a real `grove serve` and its in-process
//! worker: a read of this node's workspace leaves no ledger row and no event, waits for
//! a running write's exclusive lock, keeps tenancy, and one of another node's workspace
//! still goes through the queue to that node's worker. The path rules of inline reads
//! are the `paths_that_leave_the_workspace…` cases of tests/e2e/tools_http.rs, which
//! this server now answers inline.

use std::time::Duration;

use grove_e2e::http::{Server, ALICE, BOB};
use grove_e2e::TestEnv;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::env_or_skip;

fn fixture(env: &TestEnv) -> String {
    env.fixture_repo("fixture", &[("src/lib.rs", "pub fn alpha() {}\n")])
}

async fn ledger(env: &TestEnv) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM grove.commands")
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

async fn events(env: &TestEnv) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM grove.events")
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

async fn read(server: &Server, token: &str, ws: &str, path: &str) -> (StatusCode, Value) {
    server
        .post(
            &format!("/v1/workspaces/{ws}/tools/read_file"),
            token,
            json!({ "path": path }),
        )
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn reads_of_this_nodes_workspace_leave_no_ledger_row_and_no_event() {
    let env = env_or_skip!("reads_of_this_nodes_workspace_leave_no_ledger_row_and_no_event");
    let url = fixture(&env);
    let server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "c1").await;
    let (commands, logged) = (ledger(&env).await, events(&env).await);

    let (status, body) = read(&server, ALICE, &ws, "src/lib.rs").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["content"], "pub fn alpha() {}\n", "{body}");
    for (tool, args) in [
        ("view", json!({"path": "src"})),
        ("list_dir", json!({"path": "."})),
        ("search", json!({"pattern": "alpha"})),
        ("git_status", json!({})),
        ("git_diff", json!({})),
        ("git_log", json!({"max_count": 1})),
    ] {
        let (status, body) = server
            .post(&format!("/v1/workspaces/{ws}/tools/{tool}"), ALICE, args)
            .await;
        assert_eq!(status, StatusCode::OK, "{tool}: {body}");
    }
    // A missing file is the same typed 404 the queued handler gives.
    let (status, body) = read(&server, ALICE, &ws, "nope.rs").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["kind"], "not_found", "{body}");
    assert_eq!(ledger(&env).await, commands, "reads enqueue nothing");
    assert_eq!(events(&env).await, logged, "reads record nothing");

    // Another user's workspace does not exist for them, inline or not.
    let (status, body) = read(&server, BOB, &ws, "src/lib.rs").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(!body.to_string().contains("alpha"), "{body}");

    // A write still is a command with its event; the next read sees it.
    let (status, body) = server
        .post(
            &format!("/v1/workspaces/{ws}/tools/write_file"),
            ALICE,
            json!({"path": "src/new.rs", "content": "pub fn beta() {}\n"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(ledger(&env).await, commands + 1);
    assert_eq!(env.count_events("workspace.file_written").await, 1);
    let (_, body) = read(&server, ALICE, &ws, "src/new.rs").await;
    assert_eq!(body["content"], "pub fn beta() {}\n", "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_inline_read_waits_for_a_running_write_to_finish() {
    let env = env_or_skip!("an_inline_read_waits_for_a_running_write_to_finish");
    let url = fixture(&env);
    let server = std::sync::Arc::new(Server::start(&env).await);
    let ws = server.acquire(ALICE, &url, "c1").await;
    let writer = {
        let (server, ws) = (server.clone(), ws.clone());
        tokio::spawn(async move {
            server
                .post(
                    &format!("/v1/workspaces/{ws}/exec"),
                    ALICE,
                    json!({"argv": ["sh", "-c", "sleep 2; echo done > late.txt"]}),
                )
                .await
        })
    };
    // Once the exec runs (holding the workspace's exclusive lock), a read of the file it
    // is about to write must wait for it rather than miss it. Its `exec.started` is
    // committed under that lock (the ledger says `running` from the claim on, before
    // the handler has the lock).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if env.count_events("exec.started").await == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the exec never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body) = read(&server, ALICE, &ws, "late.txt").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["content"], "done\n", "{body}");
    let (status, exec) = writer.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{exec}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_of_another_nodes_workspace_goes_to_that_nodes_worker() {
    let env = env_or_skip!("a_read_of_another_nodes_workspace_goes_to_that_nodes_worker");
    let url = fixture(&env);
    let home = Server::start(&env).await;
    let ws = home.acquire(ALICE, &url, "c1").await;
    // Started after the acquire, so the workspace is surely the first server's (node
    // `local`): both workers take shared jobs such as a new workspace's.
    let other = Server::start_with(&env, &[("GROVE_NODE", "n2")]).await;
    let commands = ledger(&env).await;

    let (status, body) = read(&other, ALICE, &ws, "src/lib.rs").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["content"], "pub fn alpha() {}\n", "{body}");
    let queue: String = sqlx::query_scalar("SELECT queue FROM grove.commands WHERE kind = 'tool'")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(queue, "grove:node:local", "queued for the workspace's node");
    assert_eq!(ledger(&env).await, commands + 1, "one queued tool command");

    // The owning server answers the same read inline.
    let (status, _) = read(&home, ALICE, &ws, "src/lib.rs").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ledger(&env).await, commands + 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_of_an_evicted_workspace_says_how_to_get_it_back() {
    let env = env_or_skip!("a_read_of_an_evicted_workspace_says_how_to_get_it_back");
    let url = fixture(&env);
    // Everything is above a 1-byte budget; the sweep's clock an hour ahead puts the
    // released workspace past the grace.
    let server = Server::start_with(
        &env,
        &[
            ("GROVE_DISK_BUDGET", "1"),
            ("GROVE_PRESSURE_GRACE", "60"),
            ("GROVE_ALLOW_CLOCK_OVERRIDE", "1"),
        ],
    )
    .await;
    let ws = server.acquire(ALICE, &url, "c1").await;
    let (status, body) = server
        .post(&format!("/v1/sessions/{ws}/release"), ALICE, json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let out = env.grove(&["evict", "--json", "--now", &later]).await;
    assert!(out.status.success(), "{:?}", grove_e2e::text(&out));
    let (_, evicted) = server.get(&format!("/v1/workspaces/{ws}"), ALICE).await;
    assert_eq!(evicted["state"], "evicted", "{evicted}");

    let (status, body) = read(&server, ALICE, &ws, "src/lib.rs").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("evicted") && message.contains("restore"),
        "{message}"
    );
}
