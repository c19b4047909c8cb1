//! grove-mcp: the MCP server of grove. It offers one workspace's agent tool surface to
//! an MCP client: the text editor, files, search, git, `shell` and pull requests, gated
//! by the workspace's capabilities. Over stdio (`grove mcp --workspace ID`) or over the
//! streamable HTTP transport ([`http_service`], mounted by `grove serve` at
//! `/v1/workspaces/{id}/mcp` behind its bearer tokens and tenancy check).
//!
//! Every tool call is a command submitted through the queue with
//! `grove_postgres::submit`, exactly as the CLI and the HTTP API submit it: the file,
//! search and git tools are `Command::Tool`, `shell` is `Command::Exec`, the pull
//! request tools `Command::CreatePullRequest` / `CommentPullRequest`. A worker that
//! holds the workspace runs them; this crate runs no effect itself. See
//! docs/adr/16-mcp-server.md.
//!
//! # Layout
//! - [`server`]: [`GroveMcp`], the `rmcp` `ServerHandler`: the tool list, the calls;
//!   [`Target`], the workspace a request acts on.
//! - [`shell`]: the `shell` tool's arguments and result text.
//! - [`pulls`]: the pull request tools' arguments (`create_pull_request`,
//!   `comment_pull_request`: jobs whose token is the server's git token).
//! - [`error`]: [`McpServeError`], what can stop the server.
//! - [`front`]: what is answered before the server sees a line (parse errors, a
//!   `tools/call` without a name), and the stdio relay that applies it.
//!
//! Architecture invariant: this crate writes no events or projections and runs no
//! effect; it reads the workspace row and submits commands. Nothing but the protocol
//! is written to stdout. A git token (for `git_push`) goes only to
//! `grove.command_secrets` through the queue, never into a result or a log line.

pub mod error;
pub mod front;
pub mod pulls;
pub mod server;
pub mod shell;

pub use error::McpServeError;
pub use server::{Config, GroveMcp, Target};

use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt;
use sqlx::PgPool;

/// The streamable HTTP transport of `server` (built with [`GroveMcp::per_request`]):
/// stateless (no `Mcp-Session-Id`, so any server process can answer any request) and
/// answering JSON, not an event stream. Every request must carry an `Arc<Target>`
/// extension; the caller authenticates it and checks the workspace is the caller's
/// before handing it over. Hosts are not checked here: every request carries a bearer
/// token, which a DNS-rebinding page does not have.
pub fn http_service(server: GroveMcp) -> StreamableHttpService<GroveMcp, NeverSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_allowed_hosts(Vec::<String>::new());
    StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}

/// Serves `config.workspace_id`'s tools over stdin/stdout until the client closes the
/// stream. Fails before serving when the workspace does not exist.
pub async fn serve_stdio(pool: PgPool, config: Config) -> Result<(), McpServeError> {
    let server = GroveMcp::new(pool, config).await?;
    // stdin and stdout go through the front (ADR 27), the server talks to its other end.
    let (server_side, relay_side) = tokio::io::duplex(1 << 16);
    let (relay_read, relay_write) = tokio::io::split(relay_side);
    let relay = tokio::spawn(front::relay(
        tokio::io::stdin(),
        tokio::io::stdout(),
        relay_write,
        relay_read,
    ));
    let running = server
        .serve(tokio::io::split(server_side))
        .await
        .map_err(|e| McpServeError::Transport(e.to_string()))?;
    running
        .waiting()
        .await
        .map_err(|e| McpServeError::Transport(e.to_string()))?;
    relay
        .await
        .map_err(|e| McpServeError::Transport(e.to_string()))?
        .map_err(|e| McpServeError::Transport(e.to_string()))?;
    Ok(())
}
