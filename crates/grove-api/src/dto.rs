//! The API's request and response bodies, with their OpenAPI schemas.
//!
//! These mirror the domain rows of `grove-core` rather than expose them: the core knows
//! nothing of OpenAPI, and the API decides what it shows (a repo cache's host path, for
//! one, is not shown).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use grove_core::events::RecordedEvent;
use grove_core::model::{ExecKind, ExecOutcome, RepoCacheRow, WorkspaceMode, WorkspaceRow};
use grove_core::ports::NetworkPolicy;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnsureRepoCacheRequest {
    /// `OWNER/NAME`: each part 1 to 100 of letters, digits and `. _ -`, not starting
    /// with `.` or `-`, without `..`.
    #[schema(
        pattern = r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]|\.[A-Za-z0-9_-])*\.?/[A-Za-z0-9_](?:[A-Za-z0-9_-]|\.[A-Za-z0-9_-])*\.?$",
        max_length = 201
    )]
    pub repo_name: String,
    /// The upstream URL, without credentials (send a token in `X-Grove-Git-Token`).
    pub repo_url: String,
    /// A ref; checked for syntax, like the CLI's `--ref`.
    #[serde(default, rename = "ref")]
    pub git_ref: Option<String>,
    /// Fetch even when the cache is fresh.
    #[serde(default)]
    pub fetch: bool,
    /// The same key twice (for the same caller) is one command: one job, one clone.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RepoCache {
    pub id: Uuid,
    pub repo_name: String,
    pub repo_url: String,
    pub node: String,
    /// `ready` or `evicted`.
    pub state: String,
    pub last_fetched_at: Option<DateTime<Utc>>,
    pub last_used_at: DateTime<Utc>,
    pub size_bytes: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<RepoCacheRow> for RepoCache {
    fn from(r: RepoCacheRow) -> Self {
        Self {
            id: r.id,
            repo_name: r.repo_name,
            repo_url: r.repo_url,
            node: r.node,
            state: r.state.as_str().to_owned(),
            last_fetched_at: r.last_fetched_at,
            last_used_at: r.last_used_at,
            size_bytes: r.size_bytes,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EnsureRepoCacheResponse {
    /// The command that ensured it (derived from the idempotency key when one was given).
    pub command_id: Uuid,
    pub repo_cache: RepoCache,
}

/// What a workspace is for.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Read-only checkout of `base_ref`, keyed by (user, project, base_ref).
    Analysis,
    /// Writable, on `agent/edits-<conversation>`, keyed by (user, project, conversation).
    Edit,
    /// Writable, on `agent/task-<task>`, keyed by (user, project, task).
    Task,
}

impl From<Mode> for WorkspaceMode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Analysis => Self::Analysis,
            Mode::Edit => Self::Edit,
            Mode::Task => Self::Task,
        }
    }
}

impl From<WorkspaceMode> for Mode {
    fn from(m: WorkspaceMode) -> Self {
        match m {
            WorkspaceMode::Analysis => Self::Analysis,
            WorkspaceMode::Edit => Self::Edit,
            WorkspaceMode::Task => Self::Task,
        }
    }
}

/// `grove workspace acquire` without `--user`: the user is the caller's.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireSessionRequest {
    /// 1 to 128 of letters, digits and `. _ - @ +`.
    #[schema(min_length = 1, max_length = 128)]
    pub project_id: String,
    /// `OWNER/NAME`, as for a repo cache.
    #[schema(
        pattern = r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]|\.[A-Za-z0-9_-])*\.?/[A-Za-z0-9_](?:[A-Za-z0-9_-]|\.[A-Za-z0-9_-])*\.?$",
        max_length = 201
    )]
    pub repo_name: String,
    pub repo_url: String,
    pub base_ref: String,
    pub mode: Mode,
    /// Required for `edit`.
    #[serde(default)]
    pub conversation_id: Option<String>,
    /// Required for `task`.
    #[serde(default)]
    pub task_id: Option<String>,
    /// Where the workspace lives: absent, `local` or `docker` on a worker's node;
    /// `daytona` or `e2b` inside that provider's sandbox of the caller and project.
    #[serde(default)]
    pub runtime: Option<String>,
    /// A new workspace's history points keep ignored files too (build output,
    /// dependencies), up to the server's `GROVE_HISTORY_IGNORED_BUDGET_BYTES` each; those
    /// beyond are counted in the point's `ignored_omitted`. Fixed at creation: acquiring
    /// an existing workspace does not change it.
    #[serde(default)]
    pub history_ignored: bool,
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Capabilities {
    pub writable: bool,
    pub isolated: bool,
    pub persistent: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Workspace {
    pub id: Uuid,
    pub repo_cache_id: Uuid,
    pub node: String,
    pub user_id: String,
    pub project_id: String,
    pub mode: Mode,
    pub conversation_id: Option<String>,
    pub task_id: Option<String>,
    pub base_ref: String,
    pub base_commit: String,
    pub branch_name: Option<String>,
    /// The checkout's directory on its node (inside the sandbox for a workspace placed
    /// in a remote runtime).
    pub local_path: String,
    /// `ready`, `released`, `evicting` or `evicted`.
    pub state: String,
    pub dirty: bool,
    pub pinned_until: Option<DateTime<Utc>>,
    pub last_used_at: DateTime<Utc>,
    pub size_bytes: i64,
    pub capabilities: Capabilities,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub evicted_at: Option<DateTime<Utc>>,
    /// Its history points keep ignored files too (`history_ignored` at acquire).
    pub history_ignored: bool,
}

impl From<WorkspaceRow> for Workspace {
    fn from(w: WorkspaceRow) -> Self {
        Self {
            id: w.id,
            repo_cache_id: w.repo_cache_id,
            node: w.node,
            user_id: w.user_id,
            project_id: w.project_id,
            mode: w.mode.into(),
            conversation_id: w.conversation_id,
            task_id: w.task_id,
            base_ref: w.base_ref,
            base_commit: w.base_commit,
            branch_name: w.branch_name,
            local_path: w.local_path,
            state: w.state.as_str().to_owned(),
            dirty: w.dirty,
            pinned_until: w.pinned_until,
            last_used_at: w.last_used_at,
            size_bytes: w.size_bytes,
            capabilities: Capabilities {
                writable: w.capabilities.writable,
                isolated: w.capabilities.isolated,
                persistent: w.capabilities.persistent,
            },
            created_at: w.created_at,
            updated_at: w.updated_at,
            evicted_at: w.evicted_at,
            history_ignored: w.history_ignored,
        }
    }
}

/// A session is a workspace acquired for a conversation or task; its id is the
/// workspace's.
#[derive(Debug, Serialize, ToSchema)]
pub struct Session {
    pub session_id: Uuid,
    pub command_id: Uuid,
    pub workspace: Workspace,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseSessionRequest {
    /// Destroy the runtime instead of hibernating (stopping) it. Files stay either way.
    #[serde(default)]
    pub destroy_runtime: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WorkspaceList {
    /// Oldest first (by creation time, then id).
    pub workspaces: Vec<Workspace>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// The default page size of a workspace list.
pub const DEFAULT_LIST_LIMIT: u32 = 100;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Operators only: the workspaces of this user (default: every user's).
    pub user: Option<String>,
    /// Workspaces per page, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// The previous page's `next_cursor` (opaque): the page starts after its last row.
    pub cursor: Option<String>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PinRequest {
    /// Pinned until this time (RFC 3339); `null` or absent unpins.
    #[serde(default)]
    pub until: Option<DateTime<Utc>>,
}

/// How a command may touch its workspace.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Read,
    Write,
    Install,
    Test,
}

impl From<Kind> for ExecKind {
    fn from(k: Kind) -> Self {
        match k {
            Kind::Read => Self::Read,
            Kind::Write => Self::Write,
            Kind::Install => Self::Install,
            Kind::Test => Self::Test,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    None,
    Limited,
    Default,
}

impl From<Network> for NetworkPolicy {
    fn from(n: Network) -> Self {
        match n {
            Network::None => Self::None,
            Network::Limited => Self::Limited,
            Network::Default => Self::Default,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The command and its arguments (no shell unless you run one).
    #[schema(min_items = 1)]
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory relative to the workspace root.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Text given to the command's stdin (at most 1 MiB).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Milliseconds before the command is killed (at least 1; default: the runtime's).
    #[serde(default)]
    #[schema(minimum = 1)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
    /// Default: `write` on a writable workspace, `read` on a read-only one.
    #[serde(default)]
    pub kind: Option<Kind>,
    /// Default: `none`.
    #[serde(default)]
    pub network: Option<Network>,
    /// `local` (default), `docker`, `daytona` or `e2b` (each where the worker has it).
    #[serde(default)]
    pub runtime: Option<String>,
    /// The same key twice (for the same caller) runs the command once and answers with
    /// its result.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// `false`: the output is not kept for the console's timeline (default `true`: kept
    /// for `GROVE_EXEC_OUTPUT_RETENTION`, within the output cap).
    #[serde(default)]
    pub keep_output: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ExecResult {
    pub exec_id: Uuid,
    pub exit_code: i32,
    /// UTF-8 (lossy).
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
    pub truncated: bool,
    pub duration_ms: u64,
}

impl ExecResult {
    pub fn new(exec_id: Uuid, o: ExecOutcome) -> Self {
        Self {
            exec_id,
            exit_code: o.exit_code,
            stdout: o.stdout,
            stderr: o.stderr,
            timed_out: o.timed_out,
            truncated: o.truncated,
            duration_ms: o.duration_ms,
        }
    }
}

/// An exec as the ledger has it.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExecStatus {
    pub exec_id: Uuid,
    pub workspace_id: Uuid,
    /// `queued`, `running`, `succeeded` or `failed`.
    pub status: String,
    /// When it ran to completion (whatever its exit code).
    pub result: Option<ExecResult>,
    /// When it failed (refused, worker lost, ...).
    pub error: Option<crate::error::ErrorBody>,
}

/// `data` of the streaming exec's `started` event.
#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecStarted {
    pub exec_id: Uuid,
}

/// The `data:` payload of a streaming exec's messages, by SSE event name: `started`
/// ([`ExecStarted`]), `output` ([`ExecOutput`], SSE id = chunk sequence), then one
/// `finished` ([`ExecFinished`]) or `error` (the error envelope). A schema only.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum ExecStreamData {
    Started(ExecStarted),
    Output(ExecOutput),
    Finished(ExecFinished),
    Error(crate::error::ErrorResponse),
}

/// `data` of the streaming exec's `output` events.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExecOutput {
    /// `stdout` or `stderr`.
    pub stream: String,
    /// The output as UTF-8 text (a character split between chunks is kept whole).
    pub text: String,
}

/// `data` of the streaming exec's `finished` event.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExecFinished {
    pub exec_id: Uuid,
    pub exit_code: i32,
    pub timed_out: bool,
    pub truncated: bool,
    pub duration_ms: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Event {
    /// Position in the log; pass it as `after` to read on from here.
    pub position: i64,
    pub stream_id: String,
    pub stream_version: i64,
    pub event_type: String,
    pub event_version: i32,
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    /// `command_id`, `correlation` (user, project, conversation, task), `worker_id`, `node`.
    #[schema(value_type = Object)]
    pub metadata: serde_json::Value,
    pub recorded_at: DateTime<Utc>,
}

impl From<&RecordedEvent> for Event {
    fn from(e: &RecordedEvent) -> Self {
        let (_, payload) = e.event.to_stored();
        Self {
            position: e.position,
            stream_id: e.stream_id.clone(),
            stream_version: e.stream_version,
            event_type: e.event_type.clone(),
            event_version: e.event_version,
            payload,
            metadata: serde_json::to_value(&e.metadata).unwrap_or_default(),
            recorded_at: e.recorded_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EventsPage {
    pub events: Vec<Event>,
    /// The position to pass as `after` for the next page (the last event's, or the
    /// `after` given when the page is empty).
    pub next_after: Option<i64>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Events after this position (default: from the beginning).
    pub after: Option<i64>,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// Stream the events as server-sent events, now and as they are appended.
    #[serde(default)]
    pub follow: bool,
}

/// A tool a workspace offers.
#[derive(Debug, Serialize, ToSchema)]
pub struct ToolInfo {
    /// The route's `{tool}`: `POST /v1/workspaces/{id}/tools/{name}`.
    pub name: String,
    pub description: String,
    /// The tool changes the workspace or its remote (never offered on a read-only one).
    pub writes: bool,
    /// JSON Schema (draft 2020-12) of the tool's arguments, the request body.
    #[schema(value_type = Object)]
    pub input_schema: serde_json::Value,
    /// JSON Schema (draft 2020-12) of the tool's output, the answer's body.
    #[schema(value_type = Object)]
    pub output_schema: serde_json::Value,
}

/// The tools of one workspace.
#[derive(Debug, Serialize, ToSchema)]
pub struct ToolList {
    pub workspace_id: Uuid,
    /// Whether write tools are offered (the workspace's `capabilities.writable`).
    pub writable: bool,
    pub tools: Vec<ToolInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use grove_core::validate::RepoName;
    use utoipa::PartialSchema;

    /// The `repo_name` pattern `schema` documents, compiled.
    fn documented_pattern(
        schema: utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
    ) -> regex::Regex {
        let schema = serde_json::to_value(schema).unwrap();
        let pattern = schema["properties"]["repo_name"]["pattern"]
            .as_str()
            .expect("repo_name has a pattern");
        regex::Regex::new(pattern).unwrap()
    }

    #[test]
    fn the_documented_repo_name_pattern_accepts_what_the_server_accepts() {
        let samples = [
            "owner/name",
            "a/b",
            "_x/y_",
            "my-org/my.repo",
            "o.a-b/n.",
            "a-/b-",
            "0/9",
            "owner",
            "/name",
            "owner/",
            "-owner/name",
            "owner/-name",
            ".owner/name",
            "owner/.name",
            "own..er/name",
            "owner/na..me",
            "owner/name/more",
            "owner/na me",
            "owner/na\u{0}me",
            "owner/näme",
            "own:er/name",
            "a./.b",
            "a../b",
        ];
        for schema in [
            EnsureRepoCacheRequest::schema(),
            AcquireSessionRequest::schema(),
        ] {
            let pattern = documented_pattern(schema);
            for s in samples {
                assert_eq!(
                    pattern.is_match(s),
                    RepoName::parse(s).is_ok(),
                    "{s:?}: the document and the server disagree"
                );
            }
        }
    }
}
