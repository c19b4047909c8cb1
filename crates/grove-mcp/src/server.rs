//! [`GroveMcp`]: the MCP `ServerHandler` of one workspace per request. Over stdio the
//! workspace is fixed when the server starts; over HTTP each request carries its
//! [`Target`] (put into the request by the API after authentication and the tenancy
//! check). `tools/list` reads the workspace's capabilities each time (a read-only
//! workspace is offered no write tool); `tools/call` turns a call into a command and
//! submits it through the queue, or answers a read or runs a file write or an exec inline
//! where the process can (ADR 24, ADR 31).

use std::sync::Arc;

use grove_core::commands::{Command, CommandResult};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::inline::{answers_inline, runs_inline, InlineReads, InlineWrites};
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

/// The workspace one request acts on, with what its calls need: the whole server's
/// over stdio, a request's over HTTP (an extension of the request's `http` parts).
#[derive(Clone)]
pub struct Target {
    pub workspace_id: Uuid,
    /// The runtime `shell` runs in.
    pub runtime: String,
    /// A git token for `git_push` and the pull request tools; only ever handed to the
    /// queue with that call.
    pub git_token: Option<String>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("workspace_id", &self.workspace_id)
            .field("runtime", &self.runtime)
            .field("git_token", &self.git_token.as_ref().map(|_| "***"))
            .finish()
    }
}

/// The MCP server of one workspace (stdio) or of each request's (HTTP).
#[derive(Clone)]
pub struct GroveMcp {
    pool: PgPool,
    wait: WaitOptions,
    /// Over stdio: the one target. Over HTTP: `None`, each request names its own.
    fixed: Option<Arc<Target>>,
    /// Reads answered in this process (ADR 24), when it serves the workspace's node.
    inline: Option<Arc<dyn InlineReads>>,
    /// File writes and execs run in this process (ADR 31), on the same node's
    /// workspaces.
    writes: Option<Arc<dyn InlineWrites>>,
}

impl GroveMcp {
    /// Binds the server to `config.workspace_id`, which must exist.
    pub async fn new(pool: PgPool, config: Config) -> Result<Self, McpServeError> {
        let server = Self {
            pool,
            wait: config.wait,
            fixed: Some(Arc::new(Target {
                workspace_id: config.workspace_id,
                runtime: config.runtime,
                git_token: config.git_token,
            })),
            inline: None,
            writes: None,
        };
        server.workspace(config.workspace_id).await?;
        Ok(server)
    }

    /// A server whose requests each carry their [`Target`] (served over HTTP by the
    /// API, which authenticates the caller and checks the workspace is theirs first).
    pub fn per_request(pool: PgPool, wait: WaitOptions) -> Self {
        Self {
            pool,
            wait,
            fixed: None,
            inline: None,
            writes: None,
        }
    }

    /// Answers read tools through `reads` where it serves the workspace's node.
    pub fn with_inline_reads(mut self, reads: Arc<dyn InlineReads>) -> Self {
        self.inline = Some(reads);
        self
    }

    /// Runs file write tools and execs through `writes` where the inline reads' node
    /// holds the workspace (ADR 31).
    pub fn with_inline_writes(mut self, writes: Arc<dyn InlineWrites>) -> Self {
        self.writes = Some(writes);
        self
    }

    /// The target of a request: the fixed one, or the one its HTTP request carries.
    fn target(&self, ctx: &RequestContext<RoleServer>) -> Result<Arc<Target>, ErrorData> {
        if let Some(t) = &self.fixed {
            return Ok(t.clone());
        }
        ctx.extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<Arc<Target>>())
            .cloned()
            .ok_or_else(|| ErrorData::invalid_request("no workspace named for this request", None))
    }

    async fn workspace(&self, id: Uuid) -> Result<WorkspaceRow, McpServeError> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(grove_postgres::StoreError::from)?;
        rows::workspace(&mut conn, id)
            .await?
            .ok_or(McpServeError::WorkspaceNotFound(id))
    }

    /// The tools the workspace offers now: the catalogue's for its capabilities, and
    /// `shell`.
    pub async fn tools(&self, target: &Target) -> Result<Vec<Tool>, McpServeError> {
        let ws = self.workspace(target.workspace_id).await?;
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
            .with_raw_output_schema(Arc::new(object(shell::output_schema())))
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
        target: &Target,
        name: &str,
        args: Map<String, Value>,
    ) -> Result<CallToolResult, ErrorData> {
        let id = target.workspace_id;
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
            let token = target.git_token.as_deref();
            return Ok(match self.submit(&command, token).await? {
                Ok(CommandResult::PullRequest(p)) => json_result(serde_json::to_value(&p)),
                Ok(CommandResult::PullRequestComment(c)) => json_result(serde_json::to_value(&c)),
                Ok(_) => failed(&unexpected()),
                Err(e) => failed(&e),
            });
        }
        if name == shell::NAME {
            let command = match shell::command(id, &target.runtime, args) {
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
            ToolOp::GitPush { .. } => target.git_token.as_deref(),
            _ => None,
        };
        let command = Command::Tool(ToolRequest {
            workspace_id: id,
            op,
        });
        let answered = match self.read_inline(&command).await? {
            Some(answered) => answered,
            None => self.submit(&command, token).await?,
        };
        Ok(match answered {
            Ok(CommandResult::Tool(output)) => {
                let mut r = CallToolResult::success(vec![ContentBlock::text(text_of(&output))]);
                r.structured_content = serde_json::to_value(&output).ok();
                r
            }
            Ok(_) => failed(&unexpected()),
            Err(e) => failed(&e),
        })
    }

    /// A read of a workspace on this process's node, answered here (ADR 24); `None`
    /// when the call must take the queue.
    async fn read_inline(
        &self,
        command: &Command,
    ) -> Result<Option<Result<CommandResult, CommandError>>, ErrorData> {
        let (Some(inline), Command::Tool(req)) = (&self.inline, command) else {
            return Ok(None);
        };
        if let Err(e) = command.validate() {
            return Ok(Some(Err(e.into())));
        }
        let ws = match self.workspace(req.workspace_id).await {
            Ok(ws) => ws,
            Err(McpServeError::WorkspaceNotFound(_)) => return Ok(None),
            Err(e) => return Err(internal(e)),
        };
        if !answers_inline(inline.node(), &ws, &req.op) {
            return Ok(None);
        }
        Ok(Some(
            inline
                .read(req.workspace_id, &req.op)
                .await
                .map(CommandResult::Tool),
        ))
    }

    /// A file write tool or an exec of a workspace on this process's node, run here
    /// (ADR 31) under a fresh command id; `None` when the call must take the queue.
    async fn run_inline(
        &self,
        command: &Command,
    ) -> Result<Option<Result<CommandResult, CommandError>>, ErrorData> {
        let (Some(reads), Some(writes), Some(id)) =
            (&self.inline, &self.writes, command.workspace_id())
        else {
            return Ok(None);
        };
        let ws = match self.workspace(id).await {
            Ok(ws) => ws,
            Err(McpServeError::WorkspaceNotFound(_)) => return Ok(None),
            Err(e) => return Err(internal(e)),
        };
        if !runs_inline(reads.node(), &ws, command) {
            return Ok(None);
        }
        Ok(match writes.run(uuid::Uuid::now_v7(), command).await {
            Ok(Some(result)) => Some(Ok(result)),
            // A fresh id is never known already; the queue would answer it if it were.
            Ok(None) => None,
            Err(e) => Some(Err(e)),
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
        if token.is_none() {
            if let Some(answered) = self.run_inline(command).await? {
                return Ok(answered);
            }
        }
        // Subscribe before enqueueing so the outcome's notification cannot be missed.
        let mut listener = PgListener::connect_with(&self.pool)
            .await
            .map_err(internal)?;
        listener
            .listen(queue::DONE_CHANNEL)
            .await
            .map_err(internal)?;
        match submit::submit(&self.pool, command, None, token, &mut listener, self.wait).await {
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
    Tool::new(t.name, t.description, object(t.input_schema))
        .with_raw_output_schema(Arc::new(object(t.output_schema)))
        .with_annotations(annotations)
}

impl ServerHandler for GroveMcp {
    fn get_info(&self) -> ServerConfig {
        let on = match &self.fixed {
            Some(t) => format!("grove workspace {}", t.workspace_id),
            None => "the grove workspace named in the URL".to_string(),
        };
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("grove", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "Tools on {on}: a text editor (view, create, str_replace, insert), files (read_file, write_file, list_dir), search, git (git_status, git_diff, git_log, git_commit, git_push), shell, and on a writable workspace pull requests (create_pull_request, comment_pull_request; push first). Paths are relative to the workspace root. A read-only workspace offers no write tool."
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let target = self.target(&context)?;
        match self.tools(&target).await {
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
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let target = self.target(&context)?;
        let args = request.arguments.unwrap_or_default();
        self.call(&target, &request.name, args)
            .await
            .map(Into::into)
    }
}
