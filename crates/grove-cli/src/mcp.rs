//! `grove mcp --workspace ID`: the MCP server of one workspace over stdio (`grove-mcp`).
//! stdout carries the protocol only; logs go to stderr. Tool calls are commands through
//! the queue, so a worker must serve the workspace's node: a separate `grove worker`,
//! or `--worker` for one in this process.
//!
//! With `GROVE_URL` (and `GROVE_TOKEN`) set, it is instead a thin client of that
//! server: each stdin line is posted to the workspace's MCP route (ADR 27) and the
//! answer written to stdout, so the agent's host needs no database credentials.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use grove_core::error::{CommandError, ErrorKind};
use grove_mcp::{Config, McpServeError};
use grove_postgres::submit::WaitOptions;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use uuid::Uuid;

use crate::remote;

use crate::{build_worker, connect, invalid, parse_id, read_token, shutdown_signal};

#[derive(Args)]
pub struct McpArgs {
    /// The workspace whose tools are offered (its UUID).
    #[arg(long)]
    workspace: String,
    /// The runtime the `shell` tool runs in: local, docker, daytona or e2b.
    #[arg(long, default_value = "local")]
    runtime: String,
    /// Name of an environment variable holding a git token for `git_push` and the pull
    /// request tools (the token itself is never an argument).
    #[arg(long = "token-env")]
    token_env: Option<String>,
    /// Run a worker in this process too (otherwise a `grove worker` must be running).
    /// Not with GROVE_URL: the server's worker runs the calls.
    #[arg(long)]
    pub worker: bool,
    /// The node of the in-process worker.
    #[arg(long, default_value = "local", env = "GROVE_NODE")]
    node: String,
    /// Jobs the in-process worker runs at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
}

pub async fn mcp(args: McpArgs) -> Result<ExitCode> {
    let workspace_id = parse_id(&args.workspace)?;
    grove_core::placement::RuntimeKind::parse_named("--runtime", &args.runtime)
        .map_err(|e| invalid(e.to_string()))?;
    let git_token = read_token(&args.token_env)?;
    if let Some(server) = remote::Server::from_env()? {
        if args.worker {
            return Err(invalid(
                "--worker runs jobs against the database: not with GROVE_URL",
            ));
        }
        return bridge(server, workspace_id, args.runtime, git_token).await;
    }
    let worker = if args.worker {
        Some(build_worker(args.node, args.concurrency).await?)
    } else {
        None
    };
    let pool = connect(8).await?;
    let config = Config {
        workspace_id,
        runtime: args.runtime,
        git_token,
        wait: WaitOptions::from_env(),
    };
    let (stop, stopped) = watch::channel(false);
    let worker = worker.map(|w| {
        let mut rx = stopped.clone();
        tokio::spawn(w.run(async move {
            let _ = rx.wait_for(|s| *s).await;
        }))
    });
    let served = tokio::select! {
        served = grove_mcp::serve_stdio(pool, config) => served,
        _ = shutdown_signal() => Ok(()),
    };
    let _ = stop.send(true);
    if let Some(worker) = worker {
        worker.await.context("the worker task failed")??;
    }
    match served {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(McpServeError::WorkspaceNotFound(id)) => {
            Err(CommandError::new(ErrorKind::NotFound, format!("workspace {id} not found")).into())
        }
        Err(e) => Err(e.into()),
    }
}

/// The thin client: stdin's JSON-RPC lines to the server's MCP route, its answers to
/// stdout. Requests run concurrently (a long `shell` does not hold a `ping`); what
/// `grove_mcp::front` answers itself (a parse error, a call without a name) is answered here, and a call the server refused with
/// an HTTP error with a JSON-RPC error of the same message.
async fn bridge(
    server: remote::Server,
    workspace_id: Uuid,
    runtime: String,
    git_token: Option<String>,
) -> Result<ExitCode> {
    // An unknown (or another user's) workspace fails here, before the handshake, as it
    // does over the database.
    server.workspace(workspace_id).await?;
    let server = Arc::new(server);
    let (tx, mut rx) = mpsc::unbounded_channel::<Value>();
    let writer = tokio::spawn(async move {
        let mut out = tokio::io::stdout();
        while let Some(message) = rx.recv().await {
            out.write_all(format!("{message}\n").as_bytes()).await?;
            out.flush().await?;
        }
        Ok::<_, std::io::Error>(())
    });
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut calls = JoinSet::new();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(answer) = grove_mcp::front::early_answer(&line) {
            let _ = tx.send(answer);
            continue;
        }
        let parsed: Value = serde_json::from_str(&line).unwrap_or_default();
        let (server, tx, runtime, token) = (
            server.clone(),
            tx.clone(),
            runtime.clone(),
            git_token.clone(),
        );
        calls.spawn(async move {
            let id = parsed.get("id").cloned();
            match server
                .mcp_message(workspace_id, &runtime, line, token.as_deref())
                .await
            {
                Ok(messages) => messages.into_iter().for_each(|m| {
                    let _ = tx.send(m);
                }),
                Err(e) => match id {
                    Some(id) => {
                        let _ = tx.send(grove_mcp::front::rpc_error(id, -32603, &format!("{e:#}")));
                    }
                    None => tracing::warn!(error = %e, "a notification was not delivered"),
                },
            }
        });
    }
    while calls.join_next().await.is_some() {}
    drop(tx);
    writer.await.context("the stdout writer failed")??;
    Ok(ExitCode::SUCCESS)
}
