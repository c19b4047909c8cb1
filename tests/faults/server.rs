//! A real `grove serve` for the scenarios that go through the HTTP API.

use std::process::Stdio;
use std::time::Duration;

use grove_e2e::TestEnv;
use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

pub const ALICE: &str = "alice-faults-token-0123456789";
pub const BOB: &str = "bob-faults-token-0123456789";

/// A running `grove serve --bind 127.0.0.1:0` (with its in-process worker unless
/// `--no-worker` is among the arguments), killed when dropped.
pub struct Server {
    pub base: String,
    pub http: reqwest::Client,
    pub log: std::path::PathBuf,
    _child: Child,
}

impl Server {
    pub async fn start(env: &TestEnv, args: &[&str], extra: &[(&str, &str)]) -> Self {
        let log = env
            .dir
            .path()
            .join(format!("serve-{}.log", uuid::Uuid::new_v4().simple()));
        let file = std::fs::File::create(&log).unwrap();
        let mut all = vec!["serve", "--bind", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let mut cmd = env.command(&all);
        cmd.envs(extra.iter().copied())
            .env("GROVE_API_TOKENS", format!("{ALICE}=alice,{BOB}=bob"))
            .stdout(Stdio::piped())
            .stderr(Stdio::from(file));
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
        // Keep reading so that the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self {
            base,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap(),
            log,
            _child: child,
        }
    }

    /// SIGKILLs the server process (its in-process worker with it) and reaps it.
    pub async fn kill9(&mut self) {
        let _ = self._child.start_kill();
        let _ = self._child.wait().await;
    }

    /// One request; `None` when no HTTP answer came (connection refused or reset).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Option<(StatusCode, String)> {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.ok()?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        Some((status, text))
    }
}
