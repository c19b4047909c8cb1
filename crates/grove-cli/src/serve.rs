//! `grove serve`: the HTTP API, with a worker in the same process unless `--no-worker`.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use grove_api::auth::Tokens;
use grove_api::sessions::SessionHost;
use grove_api::AppState;
use grove_postgres::submit::WaitOptions;
use tokio::sync::watch;

use crate::{build_worker, connect, invalid, shutdown_signal};

/// Serves until SIGINT/SIGTERM. Prints `grove: listening on http://ADDR` first (the
/// bound address, so `--bind 127.0.0.1:0` can be used), then the dev token if one was
/// made, then the MCP endpoint: without `GROVE_API_TOKENS`/`GROVE_API_TOKENS_FILE`, a loopback server gets a
/// random operator token for user `dev`; any other address refuses to start.
///
/// Interactive sessions are held by this process with the same runtime providers as
/// its in-process worker (so that worker's hibernate and destroy end them), for the
/// workspaces of `node`; read tools of those workspaces are answered by the worker's
/// code in this process, without the queue (ADR 24).
pub async fn serve(
    bind: String,
    node: String,
    concurrency: Option<usize>,
    metrics_bind: Option<String>,
) -> Result<ExitCode> {
    let addr: SocketAddr = bind
        .parse()
        .map_err(|_| invalid(format!("--bind {bind:?}: expected IP:PORT")))?;
    let (tokens, dev_token) = api_tokens(addr)?;
    // The worker migrates as it starts; a server without one migrates itself.
    let worker = match concurrency {
        Some(concurrency) => Some(build_worker(node.clone(), concurrency).await?),
        None => None,
    };
    let runtimes = match &worker {
        Some(w) => w.deps().runtimes.clone(),
        None => {
            crate::validate_node(&node)?;
            let mut config = grove_workers::WorkerConfig::new(crate::grove_home(), node.clone());
            grove_workers::build_runtimes(&mut config).await
        }
    };
    let pool = connect(16).await?;
    if worker.is_none() {
        grove_postgres::migrate::migrate(&pool).await?;
    }
    let (stop, stopped) = watch::channel(false);
    let mut state = AppState::new(pool, tokens, WaitOptions::from_env())
        .await
        .context("listening for notifications")?
        .with_sessions(SessionHost::new(runtimes, node))
        .with_local_repos(grove_core::local_repo::LocalRepoPolicy::from_value(
            std::env::var(grove_core::local_repo::ROOTS_ENV)
                .ok()
                .as_deref(),
            crate::grove_home(),
        ))
        .with_stop(stopped.clone());
    // Reads of this node's workspaces are answered here by the worker's code (ADR 24), and
    // their file writes and execs run here (ADR 31), as many at once as it runs jobs;
    // without a worker every call takes the queue.
    if let (Some(w), Some(concurrency)) = (&worker, concurrency) {
        state = state.with_inline(w.inline_reads(), Some(w.inline_writes()), concurrency);
    }
    // Pull request reads ask the platform directly; a bad configuration is reported
    // here and those reads answer 503 (the worker reports it for its jobs too).
    match grove_github::GitHubProvider::from_env() {
        Ok(github) => state = state.with_platform(Arc::new(github)),
        Err(e) => tracing::error!(error = %e, "git platform not configured"),
    }
    let state = Arc::new(state);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    announce(
        listener.local_addr()?,
        dev_token.as_deref(),
        metrics_bind.as_deref(),
        &state.pool,
    )
    .await?;
    let until_stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let worker = worker.map(|w| tokio::spawn(w.run(until_stopped(stopped.clone()))));
    let mut server = tokio::spawn(grove_api::serve(
        listener,
        state.clone(),
        until_stopped(stopped.clone()),
    ));
    tokio::select! {
        _ = shutdown_signal() => {}
        served = &mut server => {
            served.context("the HTTP server task failed")??;
        }
    }
    // Stopping: event follows end at once (the flag reaches them), requests in
    // progress get up to 5 s, the in-process worker finishes or hands back its jobs
    // (within its own grace), and the sessions this server started are killed.
    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), &mut server).await;
    if let Some(worker) = worker {
        worker.await.context("the worker task failed")??;
    }
    if let Some(host) = &state.sessions {
        let ended = host.end_all().await;
        if ended > 0 {
            tracing::info!(
                sessions = ended,
                "ended the interactive sessions this server started"
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The configured API tokens; without any, on a loopback address, a random operator
/// token for user `dev` (returned too, to be shown); on any other address an error.
fn api_tokens(addr: SocketAddr) -> Result<(Tokens, Option<String>)> {
    match Tokens::from_env().map_err(|e| invalid(e.to_string()))? {
        Some(tokens) => Ok((tokens, None)),
        None if addr.ip().is_loopback() => {
            let (tokens, token) = Tokens::dev("dev");
            Ok((tokens, Some(token)))
        }
        None => Err(invalid(
            "no API tokens configured: set GROVE_API_TOKENS or GROVE_API_TOKENS_FILE (a dev token is made only on a loopback address)",
        )),
    }
}

/// Starts the `--metrics-bind` listener, if asked for, and prints the startup lines:
/// the address, the dev token, the metrics address and the MCP endpoint. One write, so
/// a reader that takes the first line and closes the pipe cannot fail a later line's
/// write.
async fn announce(
    local: SocketAddr,
    dev_token: Option<&str>,
    metrics_bind: Option<&str>,
    pool: &sqlx::PgPool,
) -> Result<()> {
    let mut banner = format!("grove: listening on http://{local}\n");
    if let Some(token) = dev_token {
        banner.push_str(&format!("grove: dev token (user dev, operator): {token}\n"));
    }
    if let Some(bind) = metrics_bind {
        let addr = metrics_listener(bind, pool.clone()).await?;
        banner.push_str(&format!("grove: metrics on http://{addr}/metrics\n"));
    }
    banner.push_str(&format!(
        "grove: MCP endpoint: http://{local}/v1/workspaces/<workspace id>/mcp (bearer token)\n"
    ));
    let mut out = std::io::stdout().lock();
    out.write_all(banner.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Serves `/metrics` without a token on `bind` (`--metrics-bind`) in the background, for
/// the life of the process; returns the bound address.
pub(crate) async fn metrics_listener(bind: &str, pool: sqlx::PgPool) -> Result<SocketAddr> {
    let addr: SocketAddr = bind
        .parse()
        .map_err(|_| invalid(format!("--metrics-bind {bind:?}: expected IP:PORT")))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) =
            grove_api::metrics::serve_standalone(listener, pool, std::future::pending()).await
        {
            tracing::error!(error = %e, "the metrics listener failed");
        }
    });
    Ok(local)
}
