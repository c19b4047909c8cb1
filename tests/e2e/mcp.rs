//! The MCP server: the real `grove mcp --workspace ID` driven over stdio by a scripted
//! JSON-RPC client (newline-delimited messages, as MCP's stdio transport frames them),
//! with a real worker: initialize, list the tools (gated on a read-only workspace), run
//! `str_replace` and `shell`, and check their effects on disk and in the results.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use grove_e2e::{acquire_args, TestEnv};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::env_or_skip;

/// A `grove mcp` process and the client side of its stdio.
struct Mcp {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    next_id: u64,
}

impl Mcp {
    /// Starts `grove mcp --workspace ID` and completes the handshake; returns the
    /// server's `initialize` result too.
    async fn start(env: &TestEnv, workspace: &str) -> (Self, Value) {
        let log =
            std::fs::File::create(env.dir.path().join(format!("mcp-{workspace}.log"))).unwrap();
        let mut child = env
            .command(&["mcp", "--workspace", workspace])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn grove mcp");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut mcp = Self {
            child,
            stdin,
            lines,
            next_id: 1,
        };
        let init = mcp
            .request(
                "initialize",
                json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "grove-e2e", "version": "0"}
                }),
            )
            .await;
        mcp.notify("notifications/initialized").await;
        (mcp, init)
    }

    async fn send(&mut self, message: Value) {
        let mut line = serde_json::to_vec(&message).unwrap();
        line.push(b'\n');
        self.stdin.write_all(&line).await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn notify(&mut self, method: &str) {
        self.send(json!({"jsonrpc": "2.0", "method": method})).await;
    }

    /// Sends a request and returns its response (`result` or `error` object), skipping
    /// any notification the server sends meanwhile. Every stdout line must be JSON-RPC.
    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        loop {
            let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("no answer to {method} within 60 s"))
                .unwrap()
                .unwrap_or_else(|| panic!("grove mcp closed stdout during {method}"));
            let msg: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("stdout carried a non-JSON line ({e}): {line}"));
            assert_eq!(msg["jsonrpc"], "2.0", "{line}");
            if msg["id"] == json!(id) {
                return msg;
            }
            assert!(
                msg.get("method").is_some(),
                "an answer to another id: {line}"
            );
        }
    }

    async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let resp = self
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await;
        assert!(resp.get("error").is_none(), "{tool}: {resp}");
        resp["result"].clone()
    }

    async fn tool_names(&mut self) -> Vec<String> {
        let resp = self.request("tools/list", json!({})).await;
        resp["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{resp}"))
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    }

    /// Closes stdin (the client leaves) and waits for the server to exit.
    async fn close(mut self) -> std::process::ExitStatus {
        drop(self.stdin);
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("grove mcp exits when its client leaves")
            .unwrap()
    }
}

fn text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

async fn acquire(env: &TestEnv, url: &str, mode: &str) -> (String, PathBuf) {
    let scope: &[&str] = if mode == "edit" {
        &["--conversation", "c1"]
    } else {
        &[]
    };
    let ws = env.grove_json(&acquire_args(url, mode, scope)).await;
    (
        ws["id"].as_str().unwrap().to_string(),
        PathBuf::from(ws["local_path"].as_str().unwrap()),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_client_lists_the_tools_and_runs_str_replace_and_shell_in_a_workspace() {
    let mut env =
        env_or_skip!("an_mcp_client_lists_the_tools_and_runs_str_replace_and_shell_in_a_workspace");
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("src/lib.rs", "pub fn alpha() {}\n")]);
    let (ws, dir) = acquire(&env, &url, "edit").await;
    let (mut mcp, init) = Mcp::start(&env, &ws).await;

    let result = &init["result"];
    assert_eq!(result["serverInfo"]["name"], "grove", "{init}");
    assert_eq!(result["protocolVersion"], "2025-06-18");
    assert!(result["capabilities"]["tools"].is_object(), "{init}");
    assert!(result["instructions"].as_str().unwrap().contains(&ws));

    let list = mcp.request("tools/list", json!({})).await;
    let tools = list["result"]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    for expected in [
        "view",
        "create",
        "str_replace",
        "insert",
        "read_file",
        "write_file",
        "list_dir",
        "search",
        "git_status",
        "git_diff",
        "git_log",
        "git_commit",
        "git_push",
        "shell",
        "create_pull_request",
        "comment_pull_request",
        "history",
        "history_diff",
        "history_file",
        "checkpoint",
        "rewind",
        "undo",
        "fork",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    assert_eq!(names.len(), 23);
    // A pull request tool checks its arguments before anything is enqueued.
    let r = mcp
        .call("create_pull_request", json!({"title": "t", "head": "main"}))
        .await;
    assert_eq!(r["isError"], true, "{r}");
    assert!(
        text(&r).starts_with("invalid_input: invalid arguments for create_pull_request"),
        "{}",
        text(&r)
    );
    let sr = tools.iter().find(|t| t["name"] == "str_replace").unwrap();
    assert_eq!(sr["inputSchema"]["type"], "object");
    assert_eq!(
        sr["inputSchema"]["required"],
        json!(["path", "old_str", "new_str"])
    );
    assert_eq!(sr["annotations"]["readOnlyHint"], false);
    let view = tools.iter().find(|t| t["name"] == "view").unwrap();
    assert_eq!(view["annotations"]["readOnlyHint"], true);

    // str_replace: the file changes on disk; the result carries the written file.
    let r = mcp
        .call(
            "str_replace",
            json!({"path": "src/lib.rs", "old_str": "alpha", "new_str": "beta"}),
        )
        .await;
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(r["structuredContent"]["output"], "written");
    assert_eq!(r["structuredContent"]["path"], "src/lib.rs");
    assert_eq!(
        std::fs::read_to_string(dir.join("src/lib.rs")).unwrap(),
        "pub fn beta() {}\n"
    );
    assert_eq!(env.count_events("workspace.file_written").await, 1);

    // shell: runs in the workspace; exit code and both streams come back.
    let r = mcp
        .call(
            "shell",
            json!({"command": "cat src/lib.rs; echo oops >&2; echo made > made.txt; exit 3"}),
        )
        .await;
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(r["structuredContent"]["exit_code"], 3, "{r}");
    assert_eq!(r["structuredContent"]["stdout"], "pub fn beta() {}\n");
    assert_eq!(r["structuredContent"]["stderr"], "oops\n");
    assert!(text(&r).starts_with("exit code 3\n"), "{}", text(&r));
    assert_eq!(
        std::fs::read_to_string(dir.join("made.txt")).unwrap(),
        "made\n"
    );

    // History for agents: a checkpoint, a destructive shell command, the diff since the
    // checkpoint, and undo bringing the file back.
    let r = mcp.call("checkpoint", json!({"name": "before rm"})).await;
    assert_eq!(r["structuredContent"]["output"], "point", "{r}");
    let since = r["structuredContent"]["number"].to_string();
    let r = mcp.call("shell", json!({"command": "rm made.txt"})).await;
    assert_eq!(r["structuredContent"]["exit_code"], 0, "{r}");
    let r = mcp.call("history_diff", json!({"since": since})).await;
    assert_eq!(
        r["structuredContent"]["files"],
        json!([{"path": "made.txt", "status": "deleted"}]),
        "{r}"
    );
    let r = mcp.call("undo", json!({})).await;
    assert_eq!(r["structuredContent"]["output"], "rewound", "{r}");
    assert_eq!(
        std::fs::read_to_string(dir.join("made.txt")).unwrap(),
        "made\n"
    );

    // A tool that fails answers a tool error naming the kind, and changes nothing.
    let r = mcp
        .call(
            "str_replace",
            json!({"path": "src/lib.rs", "old_str": "gamma", "new_str": "delta"}),
        )
        .await;
    assert_eq!(r["isError"], true, "{r}");
    assert!(
        text(&r).starts_with("invalid_input: old_str was not found"),
        "{}",
        text(&r)
    );
    let r = mcp
        .call("read_file", json!({"path": "../../etc/passwd"}))
        .await;
    assert_eq!(r["isError"], true, "{r}");
    assert!(!text(&r).contains("root:"));
    let r = mcp.call("read_file", json!({"path": 7})).await;
    assert_eq!(r["isError"], true, "{r}");
    assert!(
        text(&r).starts_with("invalid_input: invalid arguments for read_file"),
        "{}",
        text(&r)
    );
    let r = mcp
        .call("shell", json!({"command": "true", "sudo": true}))
        .await;
    assert_eq!(r["isError"], true, "{r}");
    // An unknown tool is a protocol error.
    let resp = mcp
        .request("tools/call", json!({"name": "rm_rf", "arguments": {}}))
        .await;
    assert!(
        resp["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown tool"),
        "{resp}"
    );

    // The calls went through the queue as the CLI's commands do.
    let kinds: Vec<(String, i64)> = sqlx::query_as(
        "SELECT kind, count(*) FROM grove.commands WHERE kind IN ('tool', 'exec') GROUP BY kind ORDER BY kind",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    // exec: the two shells; tool: str_replace, checkpoint, history_diff, undo and the
    // two that failed inside their job.
    assert_eq!(kinds, [("exec".to_string(), 2), ("tool".to_string(), 6)]);
    assert_eq!(
        std::fs::read_to_string(dir.join("src/lib.rs")).unwrap(),
        "pub fn beta() {}\n"
    );
    assert!(mcp.close().await.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_workspace_offers_no_write_tool_over_mcp_and_refuses_writes() {
    let mut env =
        env_or_skip!("a_read_only_workspace_offers_no_write_tool_over_mcp_and_refuses_writes");
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("src/lib.rs", "pub fn alpha() {}\n")]);
    let (ws, dir) = acquire(&env, &url, "analysis").await;
    let (mut mcp, _) = Mcp::start(&env, &ws).await;

    let names = mcp.tool_names().await;
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
            "history_file",
            "shell"
        ]
    );

    for (tool, args) in [
        (
            "str_replace",
            json!({"path": "src/lib.rs", "old_str": "alpha", "new_str": "beta"}),
        ),
        ("write_file", json!({"path": "new.txt", "content": "x"})),
        ("git_commit", json!({"message": "m"})),
    ] {
        let r = mcp.call(tool, args).await;
        assert_eq!(r["isError"], true, "{tool}: {r}");
        assert!(text(&r).starts_with("rejected: "), "{tool}: {}", text(&r));
        assert!(text(&r).contains("read-only"), "{}", text(&r));
    }
    // The shell runs with the workspace mounted read-only.
    let r = mcp
        .call(
            "shell",
            json!({"command": "cat src/lib.rs && touch made.txt"}),
        )
        .await;
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(r["structuredContent"]["stdout"], "pub fn alpha() {}\n");
    assert_ne!(r["structuredContent"]["exit_code"], 0, "{r}");
    assert!(!dir.join("made.txt").exists());
    assert!(!dir.join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(dir.join("src/lib.rs")).unwrap(),
        "pub fn alpha() {}\n"
    );
    let r = mcp.call("read_file", json!({"path": "src/lib.rs"})).await;
    assert_eq!(text(&r), "pub fn alpha() {}\n");
    assert!(mcp.close().await.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_line_that_is_not_json_and_a_call_without_a_name_get_their_protocol_errors() {
    let mut env =
        env_or_skip!("a_line_that_is_not_json_and_a_call_without_a_name_get_their_protocol_errors");
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let (ws, _) = acquire(&env, &url, "analysis").await;
    let (mut mcp, _) = Mcp::start(&env, &ws).await;

    mcp.stdin.write_all(b"this is not json\n").await.unwrap();
    let line = tokio::time::timeout(Duration::from_secs(60), mcp.lines.next_line())
        .await
        .expect("an answer to a non-JSON line")
        .unwrap()
        .unwrap();
    let parse: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        (&parse["id"], &parse["error"]["code"]),
        (&Value::Null, &json!(-32700))
    );
    let unnamed = mcp.request("tools/call", json!({"arguments": {}})).await;
    assert_eq!(
        unnamed["error"]["code"], -32602,
        "invalid params: {unnamed}"
    );
    // The session goes on.
    assert!(mcp.tool_names().await.contains(&"read_file".to_string()));
    assert!(mcp.close().await.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn grove_mcp_refuses_to_start_on_an_unknown_workspace() {
    let env = env_or_skip!("grove_mcp_refuses_to_start_on_an_unknown_workspace");
    let out = env
        .command(&["mcp", "--workspace", "00000000-0000-7000-8000-000000000000"])
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "nothing but the protocol on stdout");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
}
