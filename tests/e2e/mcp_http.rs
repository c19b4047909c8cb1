//! MCP over HTTP (ADR 27) against a real `grove serve`: the workspace's tools for its
//! owner, with the REST API's tokens and tenancy (another user's workspace does not
//! exist, and their calls change nothing), paths kept inside the workspace, reads
//! answered without a ledger row; and `grove mcp` with `GROVE_URL` as a thin client that
//! needs no database. The official MCP Python SDK drives both transports in
//! tests/mcp_sdk (run by ./scripts/test).

use std::process::Stdio;
use std::time::Duration;

use grove_e2e::http::{Server, ALICE, BOB};
use grove_e2e::TestEnv;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::env_or_skip;

/// Posts one JSON-RPC message to the workspace's MCP route.
async fn rpc(
    server: &Server,
    token: Option<&str>,
    ws: &str,
    message: Value,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let mut req = reqwest::Client::new()
        .post(server.url(&format!("/v1/workspaces/{ws}/mcp")))
        .header("accept", "application/json, text/event-stream")
        .json(&message);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, headers, body)
}

fn call(id: u64, tool: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": tool, "arguments": arguments}})
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "grove-e2e", "version": "0"}}})
}

async fn ledger(env: &TestEnv) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM grove.commands")
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_over_http_serves_a_workspace_to_its_owner_and_to_no_one_else() {
    let env = env_or_skip!("mcp_over_http_serves_a_workspace_to_its_owner_and_to_no_one_else");
    let server = Server::start(&env).await;
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let ws = server.acquire(ALICE, &url, "c1").await;
    let (_, row) = server.get(&format!("/v1/workspaces/{ws}"), ALICE).await;
    let root = std::path::PathBuf::from(row["local_path"].as_str().unwrap());

    let (status, headers, init) = rpc(&server, Some(ALICE), &ws, initialize()).await;
    assert_eq!(status, StatusCode::OK, "{init}");
    assert_eq!(init["result"]["serverInfo"]["name"], "grove", "{init}");
    assert!(
        headers.get("mcp-session-id").is_none(),
        "stateless: no session to pin"
    );
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (_, _, tools) = rpc(&server, Some(ALICE), &ws, list).await;
    let tools = tools["result"]["tools"].as_array().unwrap().clone();
    for name in ["read_file", "write_file", "shell"] {
        let t = tools.iter().find(|t| t["name"] == name).expect(name);
        assert_eq!(
            t["outputSchema"]["type"], "object",
            "{name} declares its output"
        );
    }

    let write = call(
        3,
        "write_file",
        json!({"path": "notes.txt", "content": "mine\n"}),
    );
    let (status, _, written) = rpc(&server, Some(ALICE), &ws, write).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(written["result"]["isError"], false, "{written}");
    assert_eq!(
        std::fs::read_to_string(root.join("notes.txt")).unwrap(),
        "mine\n"
    );
    // The write and a shell command ran inline in the server's worker (ADR 31): their
    // ledger rows started as they were inserted, each with its event.
    let shell = call(7, "shell", json!({"command": "cat notes.txt"}));
    let (_, _, ran) = rpc(&server, Some(ALICE), &ws, shell).await;
    assert_eq!(ran["result"]["isError"], false, "{ran}");
    assert_eq!(
        ran["result"]["structuredContent"]["stdout"], "mine\n",
        "{ran}"
    );
    let inline: Vec<(String, bool)> = sqlx::query_as(
        "SELECT kind, enqueued_at = started_at FROM grove.commands
         WHERE kind IN ('tool', 'exec') ORDER BY enqueued_at",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        inline,
        [("tool".to_string(), true), ("exec".to_string(), true)]
    );
    assert_eq!(env.count_events("workspace.file_written").await, 1);
    assert_eq!(env.count_events("exec.finished").await, 1);

    let before = ledger(&env).await;
    let read = call(4, "read_file", json!({"path": "notes.txt"}));
    let (_, _, got) = rpc(&server, Some(ALICE), &ws, read).await;
    assert_eq!(
        got["result"]["structuredContent"]["content"], "mine\n",
        "{got}"
    );
    assert_eq!(
        ledger(&env).await,
        before,
        "a read is answered without the queue"
    );

    // A path out of the workspace is a tool error, and nothing outside is read.
    let escape = call(5, "read_file", json!({"path": "../../../../etc/passwd"}));
    let (_, _, refused) = rpc(&server, Some(ALICE), &ws, escape).await;
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert!(!refused.to_string().contains("root:"), "{refused}");

    // Another user: the workspace does not exist for them, and their write lands nowhere.
    let (status, _, body) = rpc(&server, Some(BOB), &ws, initialize()).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["kind"], "not_found", "{body}");
    let steal = call(
        6,
        "write_file",
        json!({"path": "notes.txt", "content": "bob\n"}),
    );
    let (status, _, _) = rpc(&server, Some(BOB), &ws, steal).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        std::fs::read_to_string(root.join("notes.txt")).unwrap(),
        "mine\n"
    );

    // No token, a bad token, a workspace that does not exist, not an id, another method.
    let (status, _, _) = rpc(&server, None, &ws, initialize()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = rpc(&server, Some("not-a-token-0123456789"), &ws, initialize()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let missing = uuid::Uuid::now_v7().to_string();
    let (status, _, _) = rpc(&server, Some(ALICE), &missing, initialize()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = rpc(&server, Some(ALICE), "not-an-id", initialize()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = server.get(&format!("/v1/workspaces/{ws}/mcp"), ALICE).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test(flavor = "multi_thread")]
async fn grove_mcp_with_grove_url_is_a_thin_client_that_needs_no_database() {
    let env = env_or_skip!("grove_mcp_with_grove_url_is_a_thin_client_that_needs_no_database");
    let server = Server::start(&env).await;
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let ws = server.acquire(ALICE, &url, "c1").await;
    let bridge = |token: &str| {
        let mut cmd = env.command(&["mcp", "--workspace", &ws]);
        cmd.env_remove("DATABASE_URL")
            .env("GROVE_HOME", env.dir.path().join("no-such-home"))
            .env("GROVE_URL", &server.base)
            .env("GROVE_TOKEN", token)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.spawn().expect("spawn grove mcp")
    };

    let mut child = bridge(ALICE);
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let notified = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let shell = call(2, "shell", json!({"command": "echo hi; exit 3"}));
    for message in [initialize(), notified, shell] {
        stdin
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
    }
    stdin.write_all(b"this is not json\n").await.unwrap();
    let mut answers = vec![];
    for _ in 0..3 {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("an answer within 60 s")
            .unwrap()
            .expect("a line");
        answers.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    let by_id = |id: Value| answers.iter().find(|a| a["id"] == id).cloned().unwrap();
    assert_eq!(by_id(json!(1))["result"]["serverInfo"]["name"], "grove");
    let ran = by_id(json!(2));
    assert_eq!(ran["result"]["structuredContent"]["exit_code"], 3, "{ran}");
    assert_eq!(
        ran["result"]["structuredContent"]["stdout"], "hi\n",
        "{ran}"
    );
    assert_eq!(by_id(Value::Null)["error"]["code"], -32700, "a parse error");
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "ends when stdin closes: {status}");

    // Another user's workspace: refused before the handshake, as over the database.
    let out = bridge(BOB).wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("grove: not_found:"), "{stderr}");
    assert!(!stderr.contains(BOB), "the token is never printed");
}
