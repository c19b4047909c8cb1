//! The agent tool surface over HTTP: the tools a workspace offers, and one route per
//! tool whose JSON body is the tool's arguments. A call is a `tool` command through the
//! queue (`Command::Tool`), exactly as `grove tool` submits it, answered with the
//! tool's output; a read of a workspace on this server's node is answered in this
//! process by its worker, without the queue ([`InlineHost`], ADR 24), and a file write
//! of one runs in this process too, in the fewest durable commits (ADR 31).
//!
//! The catalogue, the argument schemas and the conversion of arguments to an operation
//! are `grove_core::tool_catalog`'s, shared with the CLI and the MCP server.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use grove_core::commands::{Command, CommandResult};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::inline::{answers_inline, reuses_inline, runs_inline, InlineReads, InlineWrites};
use grove_core::ports::GitToken;
use grove_core::tool_catalog::{self, ArgsError};
use grove_core::tools::ToolSpec;
use grove_core::tools::{ToolOp, ToolOutput, ToolRequest};
use serde_json::{Map, Value};
use tokio::sync::Semaphore;
use utoipa::openapi::path::{HttpMethod, Operation, PathItem};
use utoipa::openapi::request_body::RequestBody;
use utoipa::openapi::schema::{ObjectBuilder, Ref, Schema, Type};
use utoipa::openapi::{ComponentsBuilder, Content, RefOr};
use utoipa::Modify;
use uuid::Uuid;

use crate::auth::Caller;
use crate::dto::{ToolInfo, ToolList};
use crate::error::{ApiError, ErrorResponse};
use crate::extract::{git_token, parse_id, OptionalObjectBody};
use crate::request::{command_id, unexpected, visible_workspace};
use crate::AppState;

type St = State<Arc<AppState>>;

/// The tools this workspace offers: every tool on a writable workspace, the read tools
/// only on a read-only (analysis) one. Each comes with the JSON Schema of its arguments.
#[utoipa::path(
    get,
    path = "/v1/workspaces/{id}/tools",
    tag = "tools",
    params(("id" = Uuid, Path)),
    responses(
        (status = 200, body = ToolList),
        (status = 401, body = ErrorResponse),
        (status = 404, body = ErrorResponse),
    )
)]
pub async fn list_tools(
    State(state): St,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ToolList>, ApiError> {
    let id = parse_id(&id, "workspace")?;
    let ws = visible_workspace(&state, &caller, id).await?;
    Ok(Json(ToolList {
        workspace_id: ws.id,
        writable: ws.capabilities.writable,
        tools: tool_catalog::tools_for(&ws.capabilities, &ws.node)
            .into_iter()
            .map(|t| ToolInfo {
                name: t.name,
                description: t.description,
                writes: t.writes,
                input_schema: t.input_schema,
                output_schema: t.output_schema,
            })
            .collect(),
    }))
}

/// Run one tool in the workspace. The body is the tool's arguments (the schema
/// `ToolArgs.<tool>`; `{}` or no body for a tool without any), e.g.
/// `POST /v1/workspaces/{id}/tools/str_replace` with
/// `{"path": "src/a.rs", "old_str": "a", "new_str": "b"}`. The answer is the tool's
/// output, tagged by `output` (`text`, `file`, `dir`, `written`, `search`, `status`,
/// `diff`, `log`, `committed`, `pushed`; the history tools: `history`,
/// `history_diff`, `point`, `rewound`, `forked`).
#[utoipa::path(
    post,
    path = "/v1/workspaces/{id}/tools/{tool}",
    tag = "tools",
    params(
        ("id" = Uuid, Path),
        ("tool" = String, Path, description = "view, create, str_replace, insert, read_file, write_file, list_dir, search, git_status, git_diff, git_log, git_commit, git_push, history, history_diff, history_file, checkpoint, rewind, undo or fork"),
        ("X-Grove-Git-Token" = Option<String>, Header, description = "git_push only: a git token for the remote; used for this request only, never stored or echoed"),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes the call idempotent for the caller: a retry with the same key answers the first call's outcome and never runs the tool twice"),
    ),
    request_body(content = Object, description = "The tool's arguments: see the `ToolArgs.<tool>` schemas, or `GET /v1/workspaces/{id}/tools`"),
    responses(
        (status = 200, body = Object, description = "The tool's output, tagged by `output`"),
        (status = 400, body = ErrorResponse, description = "Invalid input: a path outside the workspace, a NUL byte, a bad range, a missing old_str, ..."),
        (status = 401, body = ErrorResponse),
        (status = 403, body = ErrorResponse, description = "git_push: the remote refused the credentials"),
        (status = 404, body = ErrorResponse, description = "No such workspace (or not the caller's), no such tool, or no such file"),
        (status = 409, body = ErrorResponse, description = "The file exists (create), the push was refused, the workspace is locked, a rewind met a running command, or a fork's scope exists"),
        (status = 422, body = ErrorResponse, description = "Arguments of the wrong shape (unknown field, wrong type), or refused: a write tool on a read-only workspace, old_str found 0 or several times, nothing to commit"),
        (status = 503, body = ErrorResponse, description = "No worker took the job"),
    )
)]
pub async fn call_tool(
    State(state): St,
    caller: Caller,
    headers: HeaderMap,
    Path((id, tool)): Path<(String, String)>,
    OptionalObjectBody(args): OptionalObjectBody<Map<String, Value>>,
) -> Result<Json<ToolOutput>, ApiError> {
    let workspace_id = parse_id(&id, "workspace")?;
    let ws = visible_workspace(&state, &caller, workspace_id).await?;
    let op = tool_catalog::op_from_args(&tool, args).map_err(|e| match e {
        ArgsError::UnknownTool(_) => ApiError::not_found(e.to_string()),
        _ => ApiError::Request(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
    })?;
    // Only a push talks to the remote; a token sent with anything else is not used.
    let token = if matches!(op, grove_core::tools::ToolOp::GitPush { .. }) {
        git_token(&headers)?
    } else {
        None
    };
    let command = Command::Tool(ToolRequest { workspace_id, op });
    command.validate()?;
    let command_id = command_id(&caller, idempotency_key(&headers)?)?;
    if let (Some(inline), Command::Tool(req)) = (&state.inline, &command) {
        if answers_inline(inline.reads.node(), &ws, &req.op) {
            return Ok(Json(inline.read(workspace_id, &req.op).await?));
        }
    }
    if let Some(result) = run_inline(&state, &ws, command_id, &command).await? {
        return match result {
            CommandResult::Tool(output) => Ok(Json(output)),
            _ => Err(unexpected("tool")),
        };
    }
    match state.submit(&command, command_id, token.as_deref()).await? {
        CommandResult::Tool(output) => Ok(Json(output)),
        _ => Err(ApiError::Command(CommandError::new(
            ErrorKind::Internal,
            "unexpected result for tool",
        ))),
    }
}

/// Runs `command` in this process when its worker serves the workspace's node and the
/// command runs inline (a file write tool or an exec, ADR 31). `None`: it takes the
/// queue, because it does not run inline here or because its command id is already in
/// the ledger (the queue's wait then answers that command's outcome).
pub(crate) async fn run_inline(
    state: &AppState,
    ws: &grove_core::model::WorkspaceRow,
    command_id: Uuid,
    command: &Command,
) -> Result<Option<CommandResult>, ApiError> {
    let Some(inline) = &state.inline else {
        return Ok(None);
    };
    if inline.writes.is_none() || !runs_inline(inline.reads.node(), ws, command) {
        return Ok(None);
    }
    Ok(inline.run(command_id, command).await?)
}

/// Runs an acquire or an ensure in this process when its worker serves the node and
/// the decision is the cheap one (a warm acquire, an ensure that needs no fetch; ADR
/// 32). `None`: it takes the queue under the same command id (another decision, no
/// worker here, or a command id already in the ledger, whose outcome the queue's wait
/// answers). The caller's local repository URL is checked first, as
/// [`AppState::submit`] checks it.
pub(crate) async fn reuse_inline(
    state: &AppState,
    command_id: Uuid,
    command: &Command,
    token: Option<&str>,
) -> Result<Option<CommandResult>, ApiError> {
    let Some(inline) = &state.inline else {
        return Ok(None);
    };
    if inline.writes.is_none() || !reuses_inline(command) {
        return Ok(None);
    }
    state.check_repo_source(command)?;
    let token = token.map(|t| GitToken::new(t.to_string()));
    Ok(inline.reuse(command_id, command, token.as_ref()).await?)
}

/// The optional `Idempotency-Key` header of a tool call: a retry with the same key is
/// the same command, answered with its first outcome and never run twice.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    headers
        .get(IDEMPOTENCY_HEADER)
        .map(|v| {
            v.to_str()
                .map_err(|_| ApiError::invalid("invalid Idempotency-Key: expected visible ASCII"))
        })
        .transpose()
}

/// The header a tool call's idempotency key comes in.
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// Tools answered in this process: read tools (ADR 24) and, with the worker's writes
/// port, file write tools and execs (ADR 31) and warm acquires and ensures (ADR 34), at
/// most as many reads and as many writes
/// at once as the worker runs jobs, so they cannot starve the queue of threads and
/// connections. Shared by
/// the tool and exec routes and MCP over HTTP.
pub struct InlineHost {
    reads: Arc<dyn InlineReads>,
    writes: Option<Arc<dyn InlineWrites>>,
    permits: Semaphore,
    /// Writes and execs have permits of their own: long execs never hold up reads.
    write_permits: Semaphore,
}

impl InlineHost {
    pub fn new(
        reads: Arc<dyn InlineReads>,
        writes: Option<Arc<dyn InlineWrites>>,
        concurrency: usize,
    ) -> Self {
        Self {
            reads,
            writes,
            permits: Semaphore::new(concurrency.max(1)),
            write_permits: Semaphore::new(concurrency.max(1)),
        }
    }

    async fn bounded_run(
        &self,
        command_id: Uuid,
        command: &Command,
    ) -> Result<Option<CommandResult>, CommandError> {
        let Some(writes) = &self.writes else {
            return Ok(None);
        };
        let _permit = self
            .write_permits
            .acquire()
            .await
            .map_err(|_| CommandError::new(ErrorKind::Unavailable, "stopping"))?;
        writes.run(command_id, command).await
    }

    /// A reuse (ADR 34) is as short as a read: it takes a read permit, so long execs
    /// holding the write permits never hold up a warm acquire.
    async fn bounded_reuse(
        &self,
        command_id: Uuid,
        command: &Command,
        token: Option<&GitToken>,
    ) -> Result<Option<CommandResult>, CommandError> {
        let Some(writes) = &self.writes else {
            return Ok(None);
        };
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| CommandError::new(ErrorKind::Unavailable, "stopping"))?;
        writes.reuse(command_id, command, token).await
    }

    async fn bounded(&self, workspace_id: Uuid, op: &ToolOp) -> Result<ToolOutput, CommandError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| CommandError::new(ErrorKind::Unavailable, "stopping"))?;
        self.reads.read(workspace_id, op).await
    }
}

impl InlineReads for InlineHost {
    fn node(&self) -> &str {
        self.reads.node()
    }

    fn read<'a>(
        &'a self,
        workspace_id: Uuid,
        op: &'a ToolOp,
    ) -> futures::future::BoxFuture<'a, Result<ToolOutput, CommandError>> {
        Box::pin(self.bounded(workspace_id, op))
    }
}

impl InlineWrites for InlineHost {
    fn run<'a>(
        &'a self,
        command_id: Uuid,
        command: &'a Command,
    ) -> futures::future::BoxFuture<'a, Result<Option<CommandResult>, CommandError>> {
        Box::pin(self.bounded_run(command_id, command))
    }

    fn reuse<'a>(
        &'a self,
        command_id: Uuid,
        command: &'a Command,
        token: Option<&'a GitToken>,
    ) -> futures::future::BoxFuture<'a, Result<Option<CommandResult>, CommandError>> {
        Box::pin(self.bounded_reuse(command_id, command, token))
    }
}

/// Adds the argument schema of every tool to the document's components, as
/// `ToolArgs.<tool>`, from the same catalogue the routes use, and one operation per
/// tool (`POST /v1/workspaces/{id}/tools/<tool>`, served by the generic route) whose
/// body is that schema, so a generated client gets typed arguments.
pub struct ToolSchemas;

/// The generic tool route, which each tool's operation is derived from.
const GENERIC_PATH: &str = "/v1/workspaces/{id}/tools/{tool}";

/// `POST /v1/workspaces/{id}/tools/<tool>`: the generic operation with the tool fixed.
fn typed_operation(generic: &Operation, tool: &ToolSpec) -> Operation {
    let mut op = generic.clone();
    op.operation_id = Some(format!("call_tool_{}", tool.name));
    op.summary = Some(format!("Run the `{}` tool", tool.name));
    op.description = Some(tool.description.clone());
    let push = tool.name == "git_push";
    if let Some(params) = op.parameters.as_mut() {
        params.retain(|p| match p {
            RefOr::T(p) => p.name != "tool" && (push || p.name != "X-Grove-Git-Token"),
            RefOr::Ref(_) => true,
        });
    }
    let mut body = RequestBody::new();
    body.description = Some(format!("The arguments of `{}`", tool.name));
    body.content.insert(
        "application/json".into(),
        RefOr::T(Content::new(Some(Ref::from_schema_name(format!(
            "ToolArgs.{}",
            tool.name
        ))))),
    );
    op.request_body = Some(RefOr::T(body));
    if let Some(RefOr::T(ok)) = op.responses.responses.get_mut("200") {
        ok.description = format!("The output of `{}`", tool.name);
        ok.content.insert(
            "application/json".into(),
            RefOr::T(Content::new(Some(Ref::from_schema_name(format!(
                "ToolOutput.{}",
                tool.name
            ))))),
        );
    }
    op
}

fn add_typed_routes(openapi: &mut utoipa::openapi::OpenApi) {
    let Some(generic) = openapi
        .paths
        .paths
        .get_mut(GENERIC_PATH)
        .and_then(|item| item.post.as_mut())
    else {
        return;
    };
    // The generic route's `tool` names one of the catalogue's tools.
    let names: Vec<String> = tool_catalog::all_tools()
        .into_iter()
        .map(|t| t.name)
        .collect();
    for p in generic.parameters.iter_mut().flatten() {
        if let RefOr::T(p) = p {
            if p.name == "tool" {
                p.schema = Some(RefOr::T(Schema::Object(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .enum_values(Some(names.clone()))
                        .build(),
                )));
            }
        }
    }
    let generic = generic.clone();
    for tool in tool_catalog::all_tools() {
        let op = typed_operation(&generic, &tool);
        openapi.paths.paths.insert(
            GENERIC_PATH.replace("{tool}", &tool.name),
            PathItem::new(HttpMethod::Post, op),
        );
    }
}

impl Modify for ToolSchemas {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let mut components = openapi
            .components
            .take()
            .unwrap_or_else(|| ComponentsBuilder::new().build());
        for t in tool_catalog::all_tools() {
            let schema: Schema = serde_json::from_value(t.input_schema)
                .expect("a tool's argument schema is an OpenAPI schema");
            components
                .schemas
                .insert(format!("ToolArgs.{}", t.name), RefOr::T(schema));
            let output: Schema = serde_json::from_value(t.output_schema)
                .expect("a tool's output schema is an OpenAPI schema");
            components
                .schemas
                .insert(format!("ToolOutput.{}", t.name), RefOr::T(output));
        }
        openapi.components = Some(components);
        add_typed_routes(openapi);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_has_its_own_operation_with_its_argument_schema() {
        let doc: Value = serde_json::from_str(&crate::openapi_json()).unwrap();
        for t in tool_catalog::all_tools() {
            let path = format!("/v1/workspaces/{{id}}/tools/{}", t.name);
            let op = &doc["paths"][&path]["post"];
            assert_eq!(op["operationId"], format!("call_tool_{}", t.name));
            assert_eq!(
                op["requestBody"]["content"]["application/json"]["schema"]["$ref"],
                format!("#/components/schemas/ToolArgs.{}", t.name)
            );
            assert_eq!(
                doc["components"]["schemas"][format!("ToolArgs.{}", t.name)],
                t.input_schema
            );
            assert_eq!(
                op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
                format!("#/components/schemas/ToolOutput.{}", t.name)
            );
            assert_eq!(
                doc["components"]["schemas"][format!("ToolOutput.{}", t.name)],
                t.output_schema,
                "{}: the output schema survives the document unchanged",
                t.name
            );
            let params: Vec<&str> = op["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["name"].as_str().unwrap())
                .collect();
            assert!(!params.contains(&"tool"), "{path}: {params:?}");
            assert_eq!(
                params.contains(&"X-Grove-Git-Token"),
                t.name == "git_push",
                "{path}: {params:?}"
            );
        }
        // The generic route stays documented, its `tool` one of the catalogue's.
        let names: Vec<String> = tool_catalog::all_tools()
            .into_iter()
            .map(|t| t.name)
            .collect();
        let tool = doc["paths"][GENERIC_PATH]["post"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "tool")
            .expect("the generic route takes `tool`");
        assert_eq!(tool["schema"]["enum"], serde_json::json!(names));
    }

    #[test]
    fn the_documented_argument_schemas_are_the_catalogues_unchanged() {
        let mut bad = vec![];
        for t in tool_catalog::all_tools() {
            let schema: Schema = serde_json::from_value(t.input_schema.clone()).unwrap();
            if serde_json::to_value(&schema).unwrap() != t.input_schema {
                bad.push(t.name.clone());
            }
        }
        assert!(bad.is_empty(), "{bad:?}");
        for t in tool_catalog::all_tools() {
            let schema: Schema = serde_json::from_value(t.input_schema.clone()).unwrap();
            assert_eq!(
                serde_json::to_value(&schema).unwrap(),
                t.input_schema,
                "{}",
                t.name
            );
        }
    }
}
