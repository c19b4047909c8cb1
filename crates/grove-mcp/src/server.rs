//! [`GroveMcp`]: the MCP `ServerHandler` bound to one workspace. `tools/list` reads the
//! workspace's capabilities each time (a read-only workspace is offered no write
//! tool); `tools/call` turns a call into a command and submits it through the queue.

use std::sync::Arc;

use grove_core::commands::{Command, CommandResult};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::model::WorkspaceRow;
use grove_core::tool_catalog::{self, ArgsError};
use grove_core::tools::{ToolOp, ToolOutput, ToolRequest, ToolSpec};
use grove_postgres::submit::{self, SubmitError, WaitOptions};
use grove_postgres::{queue, rows};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Map, Value};
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::McpServeError;
use crate::{pulls, shell};

/// What the server is bound to.
#[derive(Clone)]
pub struct Config {
    /// The one workspace whose tools are offered.
    pub workspace_id: Uuid,
    /// The runtime `shell` runs in (`local` or `docker`).
    pub runtime: String,
    /// A git token for `git_push`, taken from the environment variable the operator
    /// named; handed to the queue with each push and nowhere else.
    pub git_token: Option<String>,
    pub wait: WaitOptions,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("workspace_id", &self.workspace_id)
            .field("runtime", &self.runtime)
            .field("git_token", &self.git_token.as_ref().map(|_| "***"))
            .finish()
    }
}

/// The MCP server of one workspace.
#[derive(Clone)]
pub struct GroveMcp {
    pool: PgPool,
    config: Arc<Config>,
}

impl GroveMcp {
    /// Binds the server to `config.workspace_id`, which must exist.
    pub async fn new(pool: PgPool, config: Config) -> Result<Self, McpServeError> {
        let server = Self {
            pool,
            config: Arc::new(config),
        };
        server.workspace().await?;
        Ok(server)
    }

    async fn workspace(&self) -> Result<WorkspaceRow, McpServeError> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(grove_postgres::StoreError::from)?;
        rows::workspace(&mut conn, self.config.workspace_id)
            .await?
            .ok_or(McpServeError::WorkspaceNotFound(self.config.workspace_id))
    }

    /// The tools the workspace offers now: the catalogue's for its capabilities, and
    /// `shell`.
    pub async fn tools(&self) -> Result<Vec<Tool>, McpServeError> {
        let ws = self.workspace().await?;
        let mut tools: Vec<Tool> = tool_catalog::tools_for(&ws.capabilities, &ws.node)
            .into_iter()
            .map(to_mcp)
            .collect();
        tools.push(
            Tool::new(
                shell::NAME,
                shell::DESCRIPTION,
                object(shell::input_schema()),
            )
            .with_annotations(
                ToolAnnotations::new()
                    .read_only(!ws.capabilities.writable)
                    .open_world(false),
            ),
        );
        if ws.capabilities.writable {
            for (name, description, schema) in [
                (
                    pulls::CREATE,
                    pulls::CREATE_DESCRIPTION,
                    pulls::create_schema(),
                ),
                (
                    pulls::COMMENT,
                    pulls::COMMENT_DESCRIPTION,
                    pulls::comment_schema(),
                ),
            ] {
                tools.push(
                    Tool::new(name, description, object(schema)).with_annotations(
                        ToolAnnotations::new()
                            .read_only(false)
                            .destructive(false)
                            .open_world(true),
                    ),
                );
            }
        }
        Ok(tools)
    }

    /// Runs one call: `Ok` with a tool result (an error result when the tool failed),
    /// `Err` only for an unknown tool or a server that cannot reach Postgres.
    pub async fn call(
        &self,
        name: &str,
        args: Map<String, Value>,
    ) -> Result<CallToolResult, ErrorData> {
        let id = self.config.workspace_id;
        if name == pulls::CREATE || name == pulls::COMMENT {
            let parsed = if name == pulls::CREATE {
                pulls::create(id, &args)
            } else {
                pulls::comment(id, &args)
            };
            let command = match parsed {
                Ok(c) => c,
                Err(m) => {
                    return Ok(failed(&CommandError::new(
                        ErrorKind::InvalidInput,
                        format!("invalid arguments for {name}: {m}"),
                    )))
                }
            };
            // The platform token travels like a push's: with the job, never as an argument.
            let token = self.config.git_token.as_deref();
            return Ok(match self.submit(&command, token).await? {
                Ok(CommandResult::PullRequest(p)) => json_result(serde_json::to_value(&p)),
                Ok(CommandResult::PullRequestComment(c)) => json_result(serde_json::to_value(&c)),
                Ok(_) => failed(&unexpected()),
                Err(e) => failed(&e),
            });
        }
        if name == shell::NAME {
            let command = match shell::command(id, &self.config.runtime, args) {
                Ok(c) => c,
                Err(m) => {
                    return Ok(failed(&CommandError::new(
                        ErrorKind::InvalidInput,
                        format!("invalid arguments for shell: {m}"),
                    )))
                }
            };
            return Ok(match self.submit(&command, None).await? {
                Ok(CommandResult::Exec(o)) => {
                    let mut r = CallToolResult::success(vec![ContentBlock::text(shell::text(&o))]);
                    r.structured_content = serde_json::to_value(&o).ok();
                    r
                }
                Ok(_) => failed(&unexpected()),
                Err(e) => failed(&e),
            });
        }
        let op = match tool_catalog::op_from_args(name, args) {
            Ok(op) => op,
            Err(e @ ArgsError::UnknownTool(_)) => {
                return Err(ErrorData::invalid_params(e.to_string(), None))
            }
            Err(e) => {
                return Ok(failed(&CommandError::new(
                    ErrorKind::InvalidInput,
                    e.to_string(),
                )))
            }
        };
        let token = match op {
            ToolOp::GitPush { .. } => self.config.git_token.as_deref(),
            _ => None,
        };
        let command = Command::Tool(ToolRequest {
            workspace_id: id,
            op,
        });
        Ok(match self.submit(&command, token).await? {
            Ok(CommandResult::Tool(output)) => {
                let mut r = CallToolResult::success(vec![ContentBlock::text(text_of(&output))]);
                r.structured_content = serde_json::to_value(&output).ok();
                r
            }
            Ok(_) => failed(&unexpected()),
            Err(e) => failed(&e),
        })
    }

    /// Validates, enqueues and waits. The outer error is the server's (Postgres); the
    /// inner one the command's, answered to the client as a tool error.
    async fn submit(
        &self,
        command: &Command,
        token: Option<&str>,
    ) -> Result<Result<CommandResult, CommandError>, ErrorData> {
        if let Err(e) = command.validate() {
            return Ok(Err(e.into()));
        }
        // Subscribe before enqueueing so the outcome's notification cannot be missed.
        let mut listener = PgListener::connect_with(&self.pool)
            .await
            .map_err(internal)?;
        listener
            .listen(queue::DONE_CHANNEL)
            .await
            .map_err(internal)?;
        match submit::submit(
            &self.pool,
            command,
            None,
            token,
            &mut listener,
            self.config.wait,
        )
        .await
        {
            Ok(result) => Ok(Ok(result)),
            Err(SubmitError::Command(e)) => Ok(Err(e)),
            Err(e) => Err(internal(e)),
        }
    }
}

fn internal(e: impl std::fmt::Display) -> ErrorData {
    tracing::error!(error = %e, "an MCP call failed on the database");
    ErrorData::internal_error("internal error (see the server log)", None)
}

fn unexpected() -> CommandError {
    CommandError::new(ErrorKind::Internal, "unexpected result for the tool")
}

/// A tool error the agent can read: the kind (as the CLI and the API name it) and the
/// one-line message.
fn failed(e: &CommandError) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(format!(
        "{}: {}",
        e.kind.as_str(),
        e.message.lines().next().unwrap_or("")
    ))]);
    r.structured_content = Some(serde_json::json!({
        "error": {"kind": e.kind.as_str(), "message": e.message.lines().next().unwrap_or("")}
    }));
    r
}

/// The text an agent reads: a view or a file as it is, anything else as JSON.
fn text_of(output: &ToolOutput) -> String {
    match output {
        ToolOutput::Text { text } => text.clone(),
        ToolOutput::File { content, .. } => content.clone(),
        other => serde_json::to_string_pretty(other).unwrap_or_default(),
    }
}

/// A result whose text is its JSON, also given as structured content.
fn json_result(value: Result<Value, serde_json::Error>) -> CallToolResult {
    let value = value.unwrap_or(Value::Null);
    let mut r = CallToolResult::success(vec![ContentBlock::text(
        serde_json::to_string_pretty(&value).unwrap_or_default(),
    )]);
    r.structured_content = Some(value);
    r
}

fn object(schema: Value) -> Map<String, Value> {
    match schema {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn to_mcp(t: ToolSpec) -> Tool {
    let annotations = ToolAnnotations::new()
        .read_only(!t.writes)
        .destructive(t.writes && t.name != "create")
        .open_world(t.name == "git_push");
    Tool::new(t.name, t.description, object(t.input_schema)).with_annotations(annotations)
}

impl ServerHandler for GroveMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("grove", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "Tools on grove workspace {}: a text editor (view, create, str_replace, insert), files (read_file, write_file, list_dir), search, git (git_status, git_diff, git_log, git_commit, git_push), shell, and on a writable workspace pull requests (create_pull_request, comment_pull_request; push first). Paths are relative to the workspace root. A read-only workspace offers no write tool.",
                self.config.workspace_id
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        match self.tools().await {
            Ok(tools) => Ok(ListToolsResult::with_all_items(tools)),
            Err(McpServeError::WorkspaceNotFound(id)) => Err(ErrorData::invalid_request(
                format!("workspace {id} not found"),
                None,
            )),
            Err(e) => Err(internal(e)),
        }
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        self.call(&request.name, args).await.map(Into::into)
    }
}
