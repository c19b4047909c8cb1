//! A real `grove serve` for end-to-end tests over HTTP: started on port 0 with three
//! configured tokens (alice, bob, and an operator), called with reqwest.

use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

use crate::TestEnv;

pub const ALICE: &str = "alice-token-0123456789abcdef";
pub const BOB: &str = "bob-token-0123456789abcdef";
pub const OPS: &str = "ops-token-0123456789abcdef";

/// A running `grove serve`, killed when dropped.
pub struct Server {
    pub base: String,
    pub http: reqwest::Client,
    _child: Child,
}

impl Server {
    /// Starts `grove serve --bind 127.0.0.1:0` (with its in-process worker) and reads
    /// the address it printed.
    pub async fn start(env: &TestEnv) -> Self {
        Self::start_with(env, &[]).await
    }

    /// As `start`, with extra environment for the server and its in-process worker.
    pub async fn start_with(env: &TestEnv, extra: &[(&str, &str)]) -> Self {
        Self::start_args(env, &[], extra).await
    }

    /// As `start_with`, with extra arguments to `grove serve` (`--no-worker`).
    pub async fn start_args(env: &TestEnv, args: &[&str], extra: &[(&str, &str)]) -> Self {
        let log = std::fs::File::create(env.dir.path().join("serve.log")).unwrap();
        let mut argv = vec!["serve", "--bind", "127.0.0.1:0"];
        argv.extend_from_slice(args);
        let mut cmd = env.command(&argv);
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

    /// Sends SIGTERM to the server process.
    pub fn terminate(&self) {
        if let Some(pid) = self._child.id() {
            // SAFETY: kill(2) on a child process this test owns.
            unsafe {
                libc::kill(pid as i32, libc::SIGTERM);
            }
        }
    }

    /// Waits up to `patience` for the server process to exit.
    pub async fn wait_exit(&mut self, patience: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(patience, self._child.wait())
            .await
            .ok()
            .and_then(Result::ok)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn call(
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

    pub async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        self.call(reqwest::Method::GET, path, Some(token), None)
            .await
    }

    pub async fn post(&self, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(reqwest::Method::POST, path, Some(token), Some(body))
            .await
    }

    /// Acquires an edit session of `conversation` for the token's user; returns its id.
    pub async fn acquire(&self, token: &str, url: &str, conversation: &str) -> String {
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
