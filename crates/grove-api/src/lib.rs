//! grove-api: the HTTP API of grove (`grove serve`), and its OpenAPI document.
//!
//! JSON over HTTP for callers in any language: repo caches (ensure), sessions
//! (acquire, release), workspaces (list, get, destroy, pin), execs (synchronous, and
//! streamed as server-sent events while they run), a workspace's events (paged or
//! followed) and the agent tool surface (text editor, files, search, git). Every state
//! change is a command through the queue, exactly as the CLI submits it; reads go to
//! the projections and the log, and read tools of this node's workspaces to the
//! worker in this process (`InlineReads`, ADR 24). See docs/adr/09-http-api.md.
//!
//! # Layout
//! - [`console`]: the operator console, HTML pages under `/ui` (ADR 29).
//! - [`auth`]: bearer tokens to users and operators (`GROVE_API_TOKENS`, `..._FILE`).
//! - [`routes`]: the JSON resources, with tenancy (another user's ids answer 404).
//! - `request`: the helpers the route modules share (command ids, the tenancy check,
//!   the exec command of a request); it imports no route module.
//! - [`sessions`]: interactive sessions, held in this process (the one exception to
//!   "runs no effect": see the module).
//! - [`pulls`]: a workspace's pull requests (open, read, comment) on the git platform.
//! - [`stream`]: server-sent events: streaming exec, following events.
//! - [`merge_back`]: merge-back of a task workspace into an edit workspace, and its diff.
//! - [`progress`]: a command's status and its clone's or fetch's progress, by key.
//! - [`notify`]: one LISTEN connection per server, fanned out to waiting requests.
//! - [`tools`]: the agent tool surface: a workspace's tools, one route per tool.
//! - [`metrics`]: `/metrics` for Prometheus (operators; HTTP requests by route).
//! - [`mcp`]: the same tools for MCP clients (streamable HTTP, `grove-mcp`'s server).
//! - [`dto`]: request and response bodies and their schemas.
//! - [`extract`]: extractors that fail in the API's error shape; the git token header.
//! - [`error`]: the error body and the status of each error kind.
//! - [`contract`]: what the document declares for every route (descriptions, shared
//!   statuses).
//!
//! Architecture invariant: this crate writes no events or projections and runs no
//! effect but interactive sessions (runtime state, through the `Sessions` port of the
//! registry it is given, never an adapter crate), inline reads (through the
//! `InlineReads` port the worker gives it, which changes nothing) and inline writes and
//! reuses (through its `InlineWrites` port: the worker's handler code records them,
//! ADR 31 and 32); it enqueues through
//! `grove_postgres::submit` and reads rows and the log (and, for a pull request read,
//! the git platform through its port). No bearer or git token reaches a log line, a
//! response or an error message.

pub mod auth;
pub mod console;
pub mod contract;
pub mod dto;
pub mod error;
pub mod extract;
pub mod mcp;
pub mod merge_back;
pub mod metrics;
pub mod notify;
pub mod progress;
pub mod pulls;
mod request;
pub mod routes;
pub mod sessions;
pub mod stream;
pub mod tools;

use std::future::Future;
use std::sync::Arc;

use axum::routing::{get, post};
use axum::{Json, Router};
use grove_core::commands::{Command, CommandResult};
use grove_core::error::{CommandError, ErrorKind};
use grove_postgres::submit::{self, WaitOptions};
use sqlx::PgPool;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use uuid::Uuid;

use crate::auth::Tokens;
use crate::error::ApiError;
use crate::notify::Notifier;
use crate::tools::ToolSchemas;

/// What every request shares.
pub struct AppState {
    pub pool: PgPool,
    pub tokens: Tokens,
    pub notifier: Notifier,
    pub wait: WaitOptions,
    /// Interactive sessions, when this server holds them (`grove serve` does).
    pub sessions: Option<sessions::SessionHost>,
    /// The git platform pull requests are read from (`None`: reads answer 503).
    pub platform: Option<Arc<dyn grove_core::platform::GitPlatformProvider>>,
    /// Which local repository URLs callers may name (the worker checks again).
    pub local_repos: grove_core::local_repo::LocalRepoPolicy,
    /// Read tools of this node's workspaces, answered in this process (ADR 24);
    /// `None` (a server without a worker): every call takes the queue.
    pub inline: Option<Arc<tools::InlineHost>>,
    /// Set when the server is stopping: open event follows end at once, so they do
    /// not hold the graceful shutdown.
    pub stopping: Option<tokio::sync::watch::Receiver<bool>>,
}

impl AppState {
    /// Starts the shared listener.
    pub async fn new(pool: PgPool, tokens: Tokens, wait: WaitOptions) -> Result<Self, sqlx::Error> {
        let notifier = Notifier::start(&pool).await?;
        Ok(Self {
            pool,
            tokens,
            notifier,
            wait,
            sessions: None,
            platform: None,
            local_repos: grove_core::local_repo::LocalRepoPolicy::from_value(
                std::env::var(grove_core::local_repo::ROOTS_ENV)
                    .ok()
                    .as_deref(),
                std::env::var_os("GROVE_HOME")
                    .map(Into::into)
                    .unwrap_or_default(),
            ),
            stopping: None,
            inline: None,
        })
    }

    /// Sets which local repository URLs callers may name, and grove's data directory.
    pub fn with_local_repos(mut self, policy: grove_core::local_repo::LocalRepoPolicy) -> Self {
        self.local_repos = policy;
        self
    }

    /// Holds interactive sessions with these runtime providers, for workspaces on `node`.
    pub fn with_sessions(mut self, host: sessions::SessionHost) -> Self {
        self.sessions = Some(host);
        self
    }

    /// Answers read tools of `reads`' node in this process, at most `concurrency` at once.
    pub fn with_inline_reads(
        self,
        reads: Arc<dyn grove_core::inline::InlineReads>,
        concurrency: usize,
    ) -> Self {
        self.with_inline(reads, None, concurrency)
    }

    /// Answers read tools of `reads`' node in this process, and with `writes` runs file
    /// write tools and execs of that node's workspaces here too (ADR 31), at most
    /// `concurrency` at once.
    pub fn with_inline(
        mut self,
        reads: Arc<dyn grove_core::inline::InlineReads>,
        writes: Option<Arc<dyn grove_core::inline::InlineWrites>>,
        concurrency: usize,
    ) -> Self {
        self.inline = Some(Arc::new(tools::InlineHost::new(reads, writes, concurrency)));
        self
    }

    /// Ends long-lived streams (event follows) when `stopping` turns true.
    pub fn with_stop(mut self, stopping: tokio::sync::watch::Receiver<bool>) -> Self {
        self.stopping = Some(stopping);
        self
    }

    /// Resolves once the server is stopping (never, without [`Self::with_stop`]).
    pub async fn stopped(&self) {
        match self.stopping.clone() {
            Some(mut rx) => {
                let _ = rx.wait_for(|s| *s).await;
            }
            None => std::future::pending().await,
        }
    }

    /// Reads pull requests through `platform`.
    pub fn with_platform(
        mut self,
        platform: Arc<dyn grove_core::platform::GitPlatformProvider>,
    ) -> Self {
        self.platform = Some(platform);
        self
    }

    /// API callers never hold the operator's grant: a local repository URL must lie
    /// under the allow-list. Refused before anything is enqueued or run inline.
    pub(crate) fn check_repo_source(&self, command: &Command) -> Result<(), ApiError> {
        if let Some(url) = grove_core::local_repo::command_repo_url(command) {
            self.local_repos
                .check(url, grove_core::local_repo::Requester::Caller, |p| {
                    std::fs::canonicalize(p)
                })
                .map_err(|e| CommandError::new(ErrorKind::Rejected, e.to_string()))?;
        }
        Ok(())
    }

    /// Enqueues `command` under `command_id` (once) and waits for its outcome.
    pub async fn submit(
        &self,
        command: &Command,
        command_id: Uuid,
        token: Option<&str>,
    ) -> Result<CommandResult, ApiError> {
        self.check_repo_source(command)?;
        let mut wake = self.notifier.subscribe(command_id);
        Ok(submit::submit(
            &self.pool,
            command,
            Some(command_id),
            token,
            &mut wake,
            self.wait,
        )
        .await?)
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "grove",
        description = "Sandbox control plane for AI coding agents: repo caches, sessions, workspaces, execs, events, tools and pull requests. Authenticate with `Authorization: Bearer <token>`. Errors answer `{\"error\": {\"kind\", \"message\"}}`."
    ),
    paths(
        routes::ensure_repo_cache,
        routes::acquire_session,
        routes::release_session,
        routes::list_workspaces,
        routes::get_workspace,
        routes::destroy_workspace,
        routes::pin_workspace,
        routes::restore_workspace,
        routes::exec,
        stream::exec_stream,
        routes::get_exec,
        routes::workspace_events,
        tools::list_tools,
        tools::call_tool,
        sessions::start_session,
        sessions::list_sessions,
        sessions::write_session,
        sessions::poll_session,
        sessions::kill_session,
        pulls::create_pull_request,
        pulls::get_pull_request,
        pulls::comment_pull_request,
    ),
    components(schemas(
        dto::ExecOutput,
        dto::ExecFinished,
        error::ErrorResponse,
        contract::ErrorKindName
    )),
    servers((url = "/", description = "The grove server that serves this document")),
    modifiers(&BearerAuth, &ToolSchemas),
    security(("bearer" = []))
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            components.add_security_scheme(
                "bearer",
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
        }
    }
}

/// The OpenAPI document, as served at `/openapi.json` and committed at
/// `docs/openapi.json` (regenerate with `grove openapi > docs/openapi.json`).
pub fn openapi_json() -> String {
    let mut doc = ApiDoc::openapi();
    doc.merge(merge_back::MergeBackDoc::openapi());
    doc.merge(progress::ProgressDoc::openapi());
    doc.merge(mcp::McpDoc::openapi());
    contract::Contract.modify(&mut doc);
    let mut value = serde_json::to_value(&doc).expect("the OpenAPI document serializes");
    contract::describe_event_streams(&mut value);
    let mut text = serde_json::to_string_pretty(&value).expect("a JSON value serializes");
    text.push('\n');
    text
}

/// The routes, with their state.
pub fn router(state: Arc<AppState>) -> Router {
    static DOC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let doc: &'static str = DOC.get_or_init(openapi_json);
    Router::new()
        .route("/v1/repo-caches/ensure", post(routes::ensure_repo_cache))
        .route("/v1/sessions", post(routes::acquire_session))
        .route("/v1/sessions/{id}/release", post(routes::release_session))
        .route("/v1/workspaces", get(routes::list_workspaces))
        .route(
            "/v1/workspaces/{id}",
            get(routes::get_workspace).delete(routes::destroy_workspace),
        )
        .route("/v1/workspaces/{id}/pin", post(routes::pin_workspace))
        .route(
            "/v1/workspaces/{id}/restore",
            post(routes::restore_workspace),
        )
        .route("/v1/workspaces/{id}/exec", post(routes::exec))
        .route("/v1/workspaces/{id}/exec/stream", post(stream::exec_stream))
        .route("/v1/workspaces/{id}/events", get(routes::workspace_events))
        .route("/v1/workspaces/{id}/tools", get(tools::list_tools))
        .route("/v1/workspaces/{id}/tools/{tool}", post(tools::call_tool))
        .route("/v1/execs/{id}", get(routes::get_exec))
        .route(
            "/v1/workspaces/{id}/sessions/interactive",
            post(sessions::start_session).get(sessions::list_sessions),
        )
        .route(
            "/v1/workspaces/{id}/sessions/interactive/{session_id}/write",
            post(sessions::write_session),
        )
        .route(
            "/v1/workspaces/{id}/sessions/interactive/{session_id}/poll",
            post(sessions::poll_session),
        )
        .route(
            "/v1/workspaces/{id}/sessions/interactive/{session_id}/kill",
            post(sessions::kill_session),
        )
        .route(
            "/v1/workspaces/{id}/pulls",
            post(pulls::create_pull_request),
        )
        .route(
            "/v1/workspaces/{id}/pulls/{number}",
            get(pulls::get_pull_request),
        )
        .route(
            "/v1/workspaces/{id}/pulls/{number}/comments",
            post(pulls::comment_pull_request),
        )
        .route(
            "/openapi.json",
            get(move || async move {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    doc,
                )
            }),
        )
        .route(
            "/healthz",
            get(|| async { Json(serde_json::json!({"ok": true})) }),
        )
        .merge(merge_back::routes())
        .merge(progress::routes())
        .merge(mcp::routes())
        .merge(console::routes())
        .merge(metrics::routes())
        .method_not_allowed_fallback(|| async {
            ApiError::Request(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this route".into(),
            )
        })
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(axum::extract::DefaultBodyLimit::max(
            extract::MAX_BODY_BYTES,
        ))
        .layer(axum::middleware::from_fn(extract::refuse_oversized_bodies))
        .layer(axum::middleware::from_fn(metrics::track))
        .with_state(state)
}

/// Serves `router(state)` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}
