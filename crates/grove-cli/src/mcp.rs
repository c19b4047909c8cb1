//! `grove mcp --workspace ID`: the MCP server of one workspace over stdio (`grove-mcp`).
//! stdout carries the protocol only; logs go to stderr. Tool calls are commands through
//! the queue, so a worker must serve the workspace's node: a separate `grove worker`,
//! or `--worker` for one in this process.

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use grove_core::error::{CommandError, ErrorKind};
use grove_mcp::{Config, McpServeError};
use grove_postgres::submit::WaitOptions;
use tokio::sync::watch;

use crate::{build_worker, connect, invalid, parse_id, read_token, shutdown_signal};

#[derive(Args)]
pub struct McpArgs {
    /// The workspace whose tools are offered.
    #[arg(long)]
    workspace: String,
    /// The runtime the `shell` tool runs in.
    #[arg(long, default_value = "local")]
    runtime: String,
    /// Environment variable holding a git token for `git_push`.
    #[arg(long = "token-env")]
    token_env: Option<String>,
    /// Run a worker in this process too (otherwise a `grove worker` must be running).
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
