//! The `http_*` cases: a request to `grove serve`'s API over loopback next to what it
//! wraps: an exec next to the same command submitted in-process (both through the same
//! queue and worker); a read tool, answered inline by the server's worker (ADR 24), next
//! to reading the file directly, with the queued path's time beside it.
//!
//! The API runs in this process (`grove_api::serve` on `127.0.0.1:0`, a dev operator
//! token), with one kept-alive HTTP/1.1 client, so the difference is what HTTP adds:
//! the request, authentication, the tenancy check and the JSON in and out.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use grove_core::commands::{Command, CommandResult};
use grove_core::tools::{ToolOp, ToolRequest};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::ctx::{ms, Ctx};
use crate::stats::latency;
use crate::Out;

/// The API served in-process until dropped.
pub struct Api {
    pub(crate) base: String,
    pub(crate) token: String,
    pub(crate) http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
}

impl Api {
    /// Serves the API; with `inline`, read tools are answered and write tools and execs
    /// run by the worker in this process, as `grove serve --worker` does.
    pub async fn start(ctx: &Ctx, inline: bool) -> Result<Self> {
        Self::start_as(ctx, inline, "bench").await
    }

    /// As [`Api::start`], the token's caller being `user` (an operator).
    pub async fn start_as(ctx: &Ctx, inline: bool, user: &str) -> Result<Self> {
        let (tokens, token) = grove_api::auth::Tokens::dev(user);
        let mut state = grove_api::AppState::new(
            ctx.pool.clone(),
            tokens,
            grove_postgres::submit::WaitOptions::default(),
        )
        .await?;
        if let (true, Some(reads)) = (inline, ctx.inline_reads()) {
            state = state.with_inline(reads, ctx.inline_writes(), 8);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let (stop, rx) = oneshot::channel::<()>();
        tokio::spawn(grove_api::serve(listener, Arc::new(state), async move {
            let _ = rx.await;
        }));
        Ok(Self {
            base,
            token,
            http: reqwest::Client::new(),
            stop: Some(stop),
        })
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> Result<Value> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await?;
        let status = resp.status();
        let value: Value = resp.json().await.context("a JSON answer")?;
        if !status.is_success() {
            bail!("{path}: {status} {value}");
        }
        Ok(value)
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// `true` (kind read, local runtime) over HTTP vs submitted in-process.
pub async fn http_exec(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    ctx.workspaces_at_least(1).await?;
    let ws = ctx.workspaces[0].id;
    let api = Api::start(ctx, false).await?;
    let path = format!("/v1/workspaces/{ws}/exec");
    let body = json!({"argv": ["true"], "kind": "read"});
    api.post(&path, body.clone()).await?; // warm-up: the connection and the runtime
    let (mut grove, mut floor) = (vec![], vec![]);
    for _ in 0..ctx.args.http_n {
        let t = Instant::now();
        let r = api.post(&path, body.clone()).await?;
        grove.push(ms(t));
        if r["exit_code"] != 0 {
            bail!("exec over HTTP: {r}");
        }
        let t = Instant::now();
        ctx.exec(ws, "local", &["true"]).await?;
        floor.push(ms(t));
    }
    let mut row = latency("http_exec", &grove, &floor);
    row.insert(
        "floor_is".into(),
        json!("the same exec submitted in-process"),
    );
    out.emit(row);
    Ok(())
}

/// `read_file` of a tracked file over HTTP, answered inline (ADR 24), vs reading the
/// file; the same tool command through the queue in-process is reported beside it.
pub async fn http_read_file(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    ctx.workspaces_at_least(1).await?;
    let ws = ctx.workspaces[0].id;
    let file = first_file(&ctx.workspaces[0].local_path)?;
    let on_disk = std::path::Path::new(&ctx.workspaces[0].local_path).join(&file);
    let api = Api::start(ctx, true).await?;
    let path = format!("/v1/workspaces/{ws}/tools/read_file");
    let body = json!({"path": file});
    let expected = api.post(&path, body.clone()).await?; // warm-up
    let command = Command::Tool(ToolRequest {
        workspace_id: ws,
        op: ToolOp::ReadFile { path: file.clone() },
    });
    let (mut grove, mut queued, mut floor) = (vec![], vec![], vec![]);
    for _ in 0..ctx.args.http_n {
        let t = Instant::now();
        let r = api.post(&path, body.clone()).await?;
        grove.push(ms(t));
        if r != expected {
            bail!("read_file over HTTP answered differently: {r}");
        }
        let t = Instant::now();
        match ctx.client.submit(&command).await? {
            CommandResult::Tool(_) => {}
            other => bail!("read_file returned {other:?}"),
        }
        queued.push(ms(t));
        let t = Instant::now();
        std::hint::black_box(std::fs::read(&on_disk)?);
        floor.push(ms(t));
    }
    let mut row = latency("http_read_file", &grove, &floor);
    row.insert("floor_is".into(), json!("open + read of the file"));
    row.insert("file".into(), json!(file));
    row.insert(
        "queued_in_process_p50_ms".into(),
        crate::stats::round(crate::stats::pct(&queued, 50.0)),
    );
    out.emit(row);
    Ok(())
}

/// A tracked file of the fixture (relative path).
pub(crate) fn first_file(workspace: &str) -> Result<String> {
    let src = std::path::Path::new(workspace).join("src");
    let mut dir = src.clone();
    loop {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)?.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        let first = entries
            .first()
            .context("an empty directory in the fixture")?;
        if first.file_type()?.is_dir() {
            dir = first.path();
            continue;
        }
        let rel = first.path();
        let rel = rel.strip_prefix(workspace)?;
        return Ok(rel.to_string_lossy().into_owned());
    }
}
