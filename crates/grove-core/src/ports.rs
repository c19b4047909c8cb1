//! Ports: the traits adapters implement (git, runtimes). No IO here, only contracts.
//!
//! API is not stable. Implement these only inside this workspace: adapters live in
//! their own crates (`grove-git`, `grove-local`, ...), depend on this crate, and are
//! wired together by `grove-workers`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

use crate::error::{GitError, RuntimeError};
use crate::merge_back::{MergeBackDiff, MergeBackError, MergeBackReport, MergeStrategy};
use crate::model::SavedWork;
use crate::tools::{Committed, DiffAgainst, GitDiff, GitStatus, LogEntry, Pushed};

/// A secret used for one clone or fetch. Its `Debug` never shows the value.
#[derive(Clone)]
pub struct GitToken(String);

impl GitToken {
    pub fn new(value: String) -> Self {
        Self(value)
    }
    /// The secret itself; call only where it is handed to git's credential callback.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for GitToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GitToken(***)")
    }
}

/// What the git adapter reports about a repo cache after ensuring it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheReport {
    /// True when this call cloned (the cache did not exist before).
    pub cloned: bool,
    /// True when this call fetched from the remote.
    pub fetched: bool,
    pub size_bytes: i64,
}

/// What the git adapter reports after creating a workspace checkout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckoutReport {
    /// The commit `base_ref` resolved to.
    pub base_commit: String,
    pub size_bytes: i64,
}

/// The request to create a workspace checkout from a cache.
#[derive(Debug, Clone)]
pub struct CheckoutRequest<'a> {
    pub cache_dir: &'a Path,
    pub workspace_dir: &'a Path,
    /// Branch or commit in the cache to start from.
    pub base_ref: &'a str,
    /// Branch to create and check out; `None` for a detached checkout (analysis).
    pub branch: Option<&'a str>,
    /// The upstream URL recorded as the workspace's `origin` (never with credentials).
    pub upstream_url: &'a str,
}

/// The request to save a workspace's work into its repo cache before it is deleted.
#[derive(Debug, Clone)]
pub struct SaveWorkRequest<'a> {
    pub workspace_dir: &'a Path,
    /// The repo cache, read (never written) for the objects the workspace borrows.
    pub cache_dir: &'a Path,
    /// The workspace's private store (`Layout::saved_dir`), replaced as a whole.
    pub store_dir: &'a Path,
    /// Ignored files are kept up to this many bytes in total; the rest are named in
    /// the report's `omitted`.
    pub ignored_budget_bytes: u64,
    /// The commit the workspace was created at: a clean workspace whose HEAD is still
    /// there has nothing to save.
    pub base_commit: &'a str,
    /// The message of the commit that holds the uncommitted changes.
    pub message: &'a str,
}

/// What [`GitPort::save_work`] found and saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaveWorkReport {
    /// The working tree differed from HEAD (tracked or untracked files, not ignored ones).
    pub dirty: bool,
    pub head_commit: String,
    /// `None` when there was nothing to save (clean, HEAD at the base commit, no
    /// other refs, stash or ignored files).
    pub saved: Option<SavedWork>,
    /// What was deliberately not kept, one line each (what: why).
    pub omitted: Vec<String>,
}

/// The request to check an evicted workspace out again.
#[derive(Debug, Clone)]
pub struct RestoreRequest<'a> {
    pub cache_dir: &'a Path,
    pub workspace_dir: &'a Path,
    /// The workspace's base ref and the commit it resolved to at creation (for its
    /// `origin/<base>` ref).
    pub base_ref: &'a str,
    pub base_commit: &'a str,
    /// Branch to recreate at `head_commit`; `None` for a detached checkout (analysis).
    pub branch: Option<&'a str>,
    pub head_commit: &'a str,
    /// A commit (in the cache) whose tree becomes the working tree, left uncommitted on
    /// top of `head_commit`.
    pub work_commit: Option<&'a str>,
    pub upstream_url: &'a str,
    /// The workspace's private store: when it holds a manifest, everything (refs,
    /// stash, HEAD state, index, working tree) is restored from it and `head_commit`
    /// / `work_commit` are not used.
    pub store_dir: Option<&'a Path>,
}

/// A commit in a workspace (the `git_commit` tool).
#[derive(Debug, Clone)]
pub struct CommitRequest<'a> {
    pub workspace_dir: &'a Path,
    pub message: &'a str,
    /// Relative paths (already validated against the workspace root) to stage; empty:
    /// every change, untracked files included.
    pub paths: &'a [String],
    /// Author and committer; `None`: the workspace's `user.name` / `user.email`.
    pub author: Option<(&'a str, &'a str)>,
}

/// A push of a workspace branch to its `origin` (the `git_push` tool).
#[derive(Debug, Clone)]
pub struct PushRequest<'a> {
    pub workspace_dir: &'a Path,
    /// Where the push goes: the URL grove recorded for the workspace's repository
    /// (its repo cache's upstream). Never a remote URL read from the workspace.
    pub remote_url: &'a str,
    /// The branch; `None`: the checked-out one.
    pub branch: Option<&'a str>,
    pub force_with_lease: bool,
    /// The commit the remote branch must be at for the forced update; `None`: our
    /// remote-tracking ref `refs/remotes/origin/<branch>`, or absent on the remote when
    /// we have none.
    pub expect: Option<&'a str>,
    /// Record `origin/<branch>` as the branch's upstream in the workspace's config.
    pub set_upstream: bool,
    /// Handed to git only through the credentials callback.
    pub token: Option<&'a GitToken>,
}

/// Two workspaces of one repository for a merge-back: the task's branch is brought
/// into the target's (edit) branch. Both directories are checkouts of the same repo
/// cache; the task's own commits live only in the task's object store.
#[derive(Debug, Clone)]
pub struct MergeBackRequest<'a> {
    pub edit_dir: &'a Path,
    /// The branch the target's HEAD must be on, and the one that is moved.
    pub edit_branch: &'a str,
    pub task_dir: &'a Path,
    /// The task branch whose commits are brought in.
    pub task_branch: &'a str,
    /// Where the switch's journal goes (a path grove owns, outside the workspace);
    /// `None` switches without one (a crash may then leave a half-written tree).
    pub journal: Option<&'a Path>,
}

/// What recovering an interrupted merge-back from its journal did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalRecovery {
    /// The branch had moved (the commit point): the switch was finished. Otherwise it
    /// was undone.
    pub rolled_forward: bool,
    pub previous_head: String,
    pub new_head: String,
    /// Where HEAD, index and files are now.
    pub head: String,
}

/// Repo caches and workspace checkouts. Blocking: callers run it on a blocking thread.
///
/// Implementations must keep credentials out of remote URLs, git config, error
/// messages and logs, and must make every effect idempotent on its path (a second
/// `ensure_cache` on a complete cache does not clone; a checkout over a leftover
/// directory from a crashed attempt replaces it).
pub trait GitPort: crate::history::HistoryPort + Send + Sync {
    /// Clones `url` as a bare mirror into `cache_dir` if absent; fetches when `fetch`.
    /// Reports progress to `watch` while it transfers and stops (`GitError::Cancelled`)
    /// soon after the watch is cancelled.
    fn ensure_cache(
        &self,
        url: &str,
        cache_dir: &Path,
        token: Option<&GitToken>,
        fetch: bool,
        watch: &crate::transfer::TransferWatch,
    ) -> Result<CacheReport, GitError>;
    /// Creates a checkout of `base_ref` at `workspace_dir`.
    fn create_checkout(&self, req: &CheckoutRequest<'_>) -> Result<CheckoutReport, GitError>;
    /// Whether the checkout has uncommitted changes (tracked or untracked).
    fn is_dirty(&self, workspace_dir: &Path) -> Result<bool, GitError>;
    /// Deletes a checkout's directory. Never touches the repo cache.
    fn remove_checkout(&self, workspace_dir: &Path) -> Result<(), GitError>;
    /// Saves the workspace's uncommitted changes (tracked and untracked, binary included)
    /// and its local commits into the repo cache: every object the saved commit needs is
    /// written to the cache's object store, then the ref; the patch is written too. The
    /// workspace itself is not changed (its index stays as it was).
    fn save_work(&self, req: &SaveWorkRequest<'_>) -> Result<SaveWorkReport, GitError>;
    /// Recreates a checkout at `workspace_dir` (which must not exist) with HEAD at
    /// `head_commit` and, when given, the working tree of `work_commit` left uncommitted.
    fn restore_checkout(&self, req: &RestoreRequest<'_>) -> Result<CheckoutReport, GitError>;
    /// Deletes a workspace's private store, and a saved-work ref left in the cache by
    /// an older version (absent is Ok).
    fn discard_saved_work(
        &self,
        cache_dir: &Path,
        ref_name: &str,
        store_dir: &Path,
    ) -> Result<(), GitError>;
    /// Moves work saved in the repo cache by an older version (`saved.ref_name` in
    /// the cache) into the workspace's private store; `branch` is the workspace's
    /// branch. Idempotent: an existing store is replaced. The cache ref is kept (see
    /// [`GitPort::drop_cache_ref`]).
    fn move_saved_out_of_cache(
        &self,
        cache_dir: &Path,
        saved: &SavedWork,
        branch: Option<&str>,
        store_dir: &Path,
    ) -> Result<SavedWork, GitError>;
    /// Finishes or undoes a merge-back interrupted by a crash, from the journal at
    /// `journal` (`None`: there was none). Idempotent.
    fn recover_journal(
        &self,
        journal: &Path,
        workspace_dir: &Path,
    ) -> Result<Option<JournalRecovery>, GitError>;
    /// The names of every `refs/grove/saved/*` ref in a repo cache.
    fn cache_saved_refs(&self, cache_dir: &Path) -> Result<Vec<String>, GitError>;
    /// Deletes one ref from a repo cache (absent is Ok).
    fn drop_cache_ref(&self, cache_dir: &Path, ref_name: &str) -> Result<(), GitError>;
    /// Apparent size of a directory tree in bytes (file lengths; see `dir_size_bytes`).
    fn measure(&self, dir: &Path) -> Result<i64, GitError>;
    /// Deletes a workspace or repo cache directory that was moved into grove's trash.
    fn remove_trash(&self, trash_dir: &Path) -> Result<(), GitError>;
    /// The branch, HEAD and changed paths of a workspace (untracked files included).
    fn status(&self, workspace_dir: &Path) -> Result<GitStatus, GitError>;
    /// The working tree (untracked files included) against HEAD or a ref, as a unified
    /// patch cut at `max_bytes`; `paths` (validated, relative) limit it.
    fn diff(
        &self,
        workspace_dir: &Path,
        against: &DiffAgainst,
        paths: &[String],
        max_bytes: usize,
    ) -> Result<GitDiff, GitError>;
    /// The last `max_count` commits reachable from HEAD, newest first.
    fn log(&self, workspace_dir: &Path, max_count: usize) -> Result<Vec<LogEntry>, GitError>;
    /// Stages the request's paths (or everything) and commits on the current branch.
    fn commit(&self, req: &CommitRequest<'_>) -> Result<Committed, GitError>;
    /// Pushes a branch to the request's recorded URL; a rejected update is
    /// [`GitError::Rejected`].
    fn push(&self, req: &PushRequest<'_>) -> Result<Pushed, GitError>;
    /// What a merge-back would bring: the task's commits the target branch lacks and
    /// the files the task changed since the merge base. Changes nothing in either
    /// workspace.
    fn merge_back_diff(&self, req: &MergeBackRequest<'_>) -> Result<MergeBackDiff, MergeBackError>;
    /// Brings the task's commits into the target branch by `strategy`, computed in
    /// memory; only a clean result is written (objects, then the working tree and index,
    /// then the branch). A conflict, or uncommitted changes to the target's tracked
    /// files, leaves the target exactly as it was (HEAD, index, working tree, untracked
    /// files, stash). The report's workspace ids are left nil for the caller to fill.
    fn merge_back(
        &self,
        req: &MergeBackRequest<'_>,
        strategy: MergeStrategy,
    ) -> Result<MergeBackReport, MergeBackError>;
}

/// Network policy of a runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkPolicy {
    /// Loopback only.
    #[default]
    None,
    /// An allow-list; runtimes that cannot enforce it refuse it.
    Limited,
    /// The host's network.
    Default,
}

/// A path made visible inside a runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub source: PathBuf,
    pub target: PathBuf,
    pub writable: bool,
}

/// Resource limits; `None` means the runtime's documented default.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ResourceHints {
    pub cpu: Option<f64>,
    pub memory_mb: Option<u64>,
    pub pids: Option<u64>,
}

/// How to build a runtime for one workspace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeSpec {
    pub image: Option<String>,
    /// The workspace root (host path); commands run here unless `cwd` says otherwise.
    pub workdir: PathBuf,
    pub mounts: Vec<Mount>,
    pub env: BTreeMap<String, String>,
    pub resources: ResourceHints,
    pub network: NetworkPolicy,
    pub labels: BTreeMap<String, String>,
}

/// One command to run.
#[derive(Debug, Clone, Default)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    /// Relative to the workspace root; must stay inside it.
    pub cwd: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    pub timeout: Option<Duration>,
    pub stdin: Option<Vec<u8>>,
    /// Cap on stdout + stderr bytes kept; the rest is drained and dropped.
    pub max_output_bytes: Option<usize>,
    /// Whether the command may write (decides whether a read-only runtime accepts it).
    pub mutating: bool,
}

/// What a finished command produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecResult {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub timed_out: bool,
    pub truncated: bool,
}

/// Which stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    Stdout,
    Stderr,
}

/// A piece of output delivered while the command runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecChunk {
    Output {
        stream: StreamKind,
        data: Vec<u8>,
    },
    /// The last item: the command's result (stdout/stderr left empty; they were streamed).
    Finished(ExecResult),
}

/// What a runtime provider can honestly promise.
///
/// Build it with `..RuntimeCapabilities::default()` for the fields a provider does not
/// claim: every default is `false`, the safe claim, and new fields then compile in
/// every adapter unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub struct RuntimeCapabilities {
    /// It can run commands that change the workspace.
    pub writable: bool,
    /// Its isolation is enforced by the operating system or a VM, not by a flag.
    pub isolated: bool,
    /// It enforces [`NetworkPolicy::None`] (loopback only).
    pub network_none: bool,
    /// It enforces [`NetworkPolicy::Limited`] (an allow-list).
    pub network_limited: bool,
    /// It accepts [`NetworkPolicy::Default`] (the backend's ordinary network).
    #[serde(default)]
    pub network_default: bool,
    /// [`RuntimeProvider::snapshotter`] is `Some`.
    pub snapshot: bool,
    /// [`RuntimeProvider::preview_urls`] is `Some`.
    pub preview_url: bool,
    /// [`RuntimeProvider::sessions`] is `Some`.
    pub interactive_session: bool,
}

impl RuntimeCapabilities {
    /// The network policies a runtime of this provider can be created with, strictest
    /// first.
    pub fn network_policies(&self) -> Vec<NetworkPolicy> {
        let mut out = Vec::new();
        if self.network_none {
            out.push(NetworkPolicy::None);
        }
        if self.network_limited {
            out.push(NetworkPolicy::Limited);
        }
        if self.network_default {
            out.push(NetworkPolicy::Default);
        }
        out
    }
}

/// The serialized form carries the derived `network_policies` list next to the flags.
impl Serialize for RuntimeCapabilities {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("RuntimeCapabilities", 9)?;
        s.serialize_field("writable", &self.writable)?;
        s.serialize_field("isolated", &self.isolated)?;
        s.serialize_field("network_none", &self.network_none)?;
        s.serialize_field("network_limited", &self.network_limited)?;
        s.serialize_field("network_default", &self.network_default)?;
        s.serialize_field("network_policies", &self.network_policies())?;
        s.serialize_field("snapshot", &self.snapshot)?;
        s.serialize_field("preview_url", &self.preview_url)?;
        s.serialize_field("interactive_session", &self.interactive_session)?;
        s.end()
    }
}

/// A running or stopped runtime attached to one workspace.
pub trait Runtime: Send + Sync {
    /// Runs a command to completion: [`Self::exec_stream`], collected (one
    /// implementation of a command per runtime, streaming).
    fn exec(&self, req: ExecRequest) -> BoxFuture<'_, Result<ExecResult, RuntimeError>> {
        Box::pin(async move { collect_exec(self.exec_stream(req).await?).await })
    }
    /// Runs a command, yielding output as it is produced and the result last.
    fn exec_stream(
        &self,
        req: ExecRequest,
    ) -> BoxFuture<'_, Result<BoxStream<'static, Result<ExecChunk, RuntimeError>>, RuntimeError>>;
}

/// A family of runtimes (local processes, Docker, a remote provider).
pub trait RuntimeProvider: Send + Sync {
    /// The name recorded as `backend_kind` (`local`, `docker`, ...).
    fn kind(&self) -> &'static str;
    fn capabilities(&self) -> RuntimeCapabilities;
    /// Creates (or re-attaches to) the runtime for `spec`.
    fn create(&self, spec: RuntimeSpec) -> BoxFuture<'_, Result<Box<dyn Runtime>, RuntimeError>>;
    /// The backend's name for the runtime `spec` describes (recorded as
    /// `backend_runtime_id`). Deterministic, so a retried create finds the same one.
    fn backend_id(&self, spec: &RuntimeSpec) -> String {
        let runtime = spec
            .labels
            .get("grove.runtime")
            .map(String::as_str)
            .unwrap_or("");
        format!("{}:{runtime}", self.kind())
    }
    /// The unprivileged host identity this provider's commands run as when that is
    /// not the worker's own user: a writable workspace is handed over to it (files
    /// re-owned) before the first command. `None`: nothing to hand over.
    fn sandbox_identity(&self) -> Option<crate::identity::SandboxIdentity> {
        None
    }
    /// Whether every exec gets a sandbox built for it alone (the local runtime): a read
    /// command then sees even a writable workspace read-only, and nothing of an exec
    /// outlives it. `false` (the default): a long-lived runtime (a container, a remote
    /// sandbox) keeps the mounts it was created with and may need destroying.
    fn sandbox_per_exec(&self) -> bool {
        false
    }
    /// Whether its runtimes run in a container image the worker chooses (the
    /// deployment's default image, `GROVE_DOCKER_IMAGE`). Default: no image.
    fn uses_default_image(&self) -> bool {
        false
    }
    /// Stops (hibernates) a runtime; its workspace is untouched. A provider that runs a
    /// fresh process tree per exec has nothing to stop, hence the default.
    fn stop(&self, _backend_id: &str) -> BoxFuture<'_, Result<(), RuntimeError>> {
        Box::pin(futures::future::ready(Ok(())))
    }
    /// Destroys a runtime; never deletes its workspace. Absent is success.
    fn destroy(&self, _backend_id: &str) -> BoxFuture<'_, Result<(), RuntimeError>> {
        Box::pin(futures::future::ready(Ok(())))
    }
    /// Removes backend runtimes this provider made that no record claims (`owned` holds
    /// runtime ids), sparing those younger than `grace` (their record may not be
    /// committed yet). Returns the runtime ids removed. Providers that leave nothing
    /// behind between execs have nothing to sweep, hence the default.
    fn sweep_orphans<'a>(
        &'a self,
        _owned: &'a std::collections::HashSet<String>,
        _grace: Duration,
    ) -> BoxFuture<'a, Result<Vec<String>, RuntimeError>> {
        Box::pin(futures::future::ready(Ok(Vec::new())))
    }
    /// Whether a runtime is healthy; the eviction sweep destroys one that is not. A
    /// provider without long-lived runtimes has nothing to check, hence the default.
    fn healthy(&self, _backend_id: &str) -> BoxFuture<'_, Result<bool, RuntimeError>> {
        Box::pin(futures::future::ready(Ok(true)))
    }
    /// Snapshots of runtimes, if this provider can take them (`capabilities().snapshot`).
    /// A provider without them answers `None`, never an error.
    fn snapshotter(&self) -> Option<&dyn Snapshotter> {
        None
    }
    /// Ports of runtimes exposed as URLs, if this provider can (`capabilities().preview_url`).
    fn preview_urls(&self) -> Option<&dyn PreviewUrls> {
        None
    }
    /// Interactive sessions, if this provider holds them
    /// (`capabilities().interactive_session`).
    fn sessions(&self) -> Option<&dyn Sessions> {
        None
    }
    /// Workspaces placed inside the provider (ADR 15), if it can hold them: a remote
    /// provider whose sandboxes keep a clone of the repository. Providers whose
    /// runtimes mount host paths answer `None`.
    fn workspaces(&self) -> Option<&dyn RemoteWorkspaces> {
        None
    }
}

/// A workspace to make inside a remote provider's sandbox of `(user, project)`. Every
/// field is untrusted input: refs are validated, ids hashed into paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteWorkspaceRequest {
    pub user: String,
    pub project: String,
    /// The conversation, task or (analysis) base ref the workspace is for.
    pub scope: String,
    /// Normalized `owner/name`.
    pub repo_name: String,
    /// The upstream URL, without credentials.
    pub repo_url: String,
    pub base_ref: String,
    /// The branch to create and check out; `None` leaves `base_ref` checked out.
    pub branch: Option<String>,
}

/// Where a remote workspace is, as the provider made (or found) it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteCheckout {
    /// The provider's id of the sandbox holding it (informational: sandboxes are found
    /// again by their labels, so this is never recorded).
    pub sandbox_id: String,
    /// Absolute path of the checkout inside the sandbox: the runtime's workdir.
    pub path: String,
    /// The sandbox's clone of the repository (the provider's repo cache).
    pub cache_path: String,
    /// Whether this call cloned the repository from upstream.
    pub cloned_cache: bool,
    /// The commit the checkout's HEAD is at.
    pub base_commit: String,
}

/// Optional capability: workspaces that live inside the provider, one sandbox per
/// (user, project), the repository cloned once per sandbox and one clone of it per
/// workspace. Callers serialize calls for one (user, project) themselves (the worker's
/// `sandbox_placement` lock), so a sandbox is created once.
///
/// API is not stable; implemented only inside this workspace.
pub trait RemoteWorkspaces: Send + Sync {
    /// Makes (or finds) the workspace `req` describes. Idempotent. The token reaches
    /// only the clone from upstream, never a URL, an argument or git config.
    fn ensure_workspace<'a>(
        &'a self,
        req: &'a RemoteWorkspaceRequest,
        token: Option<&'a GitToken>,
    ) -> BoxFuture<'a, Result<RemoteCheckout, RuntimeError>>;
    /// Removes the checkout at `path` (which must be one of this provider's workspace
    /// paths) from the sandbox of `(user, project)`; the sandbox and its clone of the
    /// repository stay. Absent is success.
    fn remove_workspace<'a>(
        &'a self,
        user: &'a str,
        project: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<(), RuntimeError>>;
    /// Deletes the sandbox of `(user, project)` with everything in it (when its last
    /// workspace is destroyed). Absent is success.
    fn delete_sandbox<'a>(
        &'a self,
        user: &'a str,
        project: &'a str,
    ) -> BoxFuture<'a, Result<(), RuntimeError>>;
    /// The network the sandboxes holding workspaces are created with (cloning from
    /// upstream needs one); a runtime on such a workspace asks for this one.
    fn network(&self) -> NetworkPolicy;
}

/// The directory under a sandbox's home that holds remote workspaces.
pub const REMOTE_WORKSPACES_DIR: &str = "grove/workspaces";

/// Splits `<home>/grove/workspaces/<name>` into `(home, name)`: the only paths a
/// provider's [`RemoteWorkspaces::remove_workspace`] deletes. `None` for anything else
/// (relative, `..`, nested, empty name).
pub fn split_remote_workspace_path(path: &str) -> Option<(&str, &str)> {
    let (home, name) = path.rsplit_once(&format!("/{REMOTE_WORKSPACES_DIR}/"))?;
    let ok_home = home.starts_with('/') && !home.split('/').any(|s| s == "..");
    let ok_name = !name.is_empty() && !name.contains('/') && name != "." && name != "..";
    (ok_home && ok_name).then_some((home, name))
}

/// The commit `HEAD` of the repository at `repo` points at, read through `read` (a
/// file reader of the sandbox answering `None` for an absent file): a detached `HEAD`
/// directly, a symbolic one through its loose ref, else through `packed-refs`. Lets an
/// adapter resolve a checkout without a git CLI in the sandbox. `None` when unresolved.
pub async fn resolve_head<E, F, Fut>(repo: &str, read: F) -> Result<Option<String>, E>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Vec<u8>>, E>>,
{
    let is_commit =
        |s: &str| matches!(s.len(), 40 | 64) && s.bytes().all(|b| b.is_ascii_hexdigit());
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).trim().to_string();
    let Some(head) = read(format!("{repo}/.git/HEAD")).await?.map(text) else {
        return Ok(None);
    };
    let Some(reference) = head.strip_prefix("ref: ") else {
        return Ok(is_commit(&head).then_some(head));
    };
    if !reference.starts_with("refs/") || reference.split('/').any(|s| s == "..") {
        return Ok(None);
    }
    if let Some(loose) = read(format!("{repo}/.git/{reference}")).await?.map(text) {
        return Ok(is_commit(&loose).then_some(loose));
    }
    let packed = read(format!("{repo}/.git/packed-refs")).await?.map(text);
    Ok(packed.and_then(|p| {
        p.lines()
            .filter_map(|l| l.split_once(' '))
            .find(|(sha, name)| *name == reference && is_commit(sha))
            .map(|(sha, _)| sha.to_string())
    }))
}

/// A snapshot of a runtime's state, by the provider's id for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    /// The provider's id of the snapshot (an image id, a remote snapshot name).
    pub id: String,
    /// The runtime it was taken of.
    pub backend_id: String,
    pub label: Option<String>,
}

/// What to snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRequest {
    /// The runtime, as [`RuntimeProvider::backend_id`] named it.
    pub backend_id: String,
    /// A caller's label kept with the snapshot; validated by the provider.
    pub label: Option<String>,
}

/// Optional capability: a runtime's state (its filesystem outside the workspace, such
/// as installed packages) saved under an id, and a runtime created again from it. The
/// workspace is not part of a snapshot: it is durable on its own.
///
/// API is not stable; implemented only inside this workspace.
pub trait Snapshotter: Send + Sync {
    /// Saves the state of a runtime.
    fn snapshot(&self, req: SnapshotRequest) -> BoxFuture<'_, Result<SnapshotInfo, RuntimeError>>;
    /// Creates the runtime `spec` describes from a snapshot (replacing the one the spec
    /// names, if any; its workspace is untouched). An unknown snapshot is `NotFound`.
    fn restore<'a>(
        &'a self,
        snapshot_id: &'a str,
        spec: RuntimeSpec,
    ) -> BoxFuture<'a, Result<Box<dyn Runtime>, RuntimeError>>;
}

/// What to expose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewRequest {
    pub backend_id: String,
    /// The port a process inside the runtime listens on.
    pub port: u16,
}

/// Where an exposed port is reachable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviewUrl {
    pub port: u16,
    /// Never carries a credential.
    pub url: String,
}

/// Optional capability: a port inside a runtime reachable as a URL.
///
/// API is not stable; implemented only inside this workspace.
pub trait PreviewUrls: Send + Sync {
    /// The URL of `port`; a port the runtime cannot expose is `CommandRejected`.
    fn expose(&self, req: PreviewRequest) -> BoxFuture<'_, Result<PreviewUrl, RuntimeError>>;
}

pub use crate::session::{
    SessionExit, SessionId, SessionInfo, SessionInput, SessionOutput, SessionRequest,
};

/// Optional capability: interactive sessions, persistent processes (a shell, a REPL, a
/// dev server) started in a runtime, fed through stdin and read by polling.
///
/// Sessions are runtime state held by the provider's process: they are not durable,
/// not events, and end with the process that holds them (and with their runtime).
/// Output (stdout and stderr interleaved as read) is kept in a ring of
/// `max_buffer_bytes` that keeps the newest bytes; each poll returns what arrived since
/// the previous poll and says how many bytes were lost in between.
///
/// API is not stable; implemented only inside this workspace.
pub trait Sessions: Send + Sync {
    /// Starts `req` in the runtime `spec` describes (creating or re-attaching to it).
    fn start(
        &self,
        spec: RuntimeSpec,
        req: SessionRequest,
    ) -> BoxFuture<'_, Result<SessionInfo, RuntimeError>>;
    /// Writes to the session's stdin (and closes it when `input.close`). A session that
    /// ended is `CommandRejected`; an unknown one `NotFound`.
    fn write<'a>(
        &'a self,
        id: &'a SessionId,
        input: SessionInput,
    ) -> BoxFuture<'a, Result<(), RuntimeError>>;
    /// Output since the last poll, waiting up to `wait` for some when there is none
    /// yet; reports the exit once the process ended and everything was read.
    fn poll<'a>(
        &'a self,
        id: &'a SessionId,
        wait: Duration,
    ) -> BoxFuture<'a, Result<SessionOutput, RuntimeError>>;
    /// Kills the session's processes. Killing an ended session is Ok.
    fn kill<'a>(&'a self, id: &'a SessionId) -> BoxFuture<'a, Result<(), RuntimeError>>;
    /// One session, without consuming its output.
    fn info(&self, id: &SessionId) -> Result<SessionInfo, RuntimeError>;
    /// Every session this provider holds (running or ended and not yet forgotten).
    fn list(&self) -> Vec<SessionInfo>;
}

/// A provider as `grove runtimes` lists it: configured here or only known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProviderStatus {
    pub kind: &'static str,
    /// Whether it can serve runtimes from this process (its configuration is present
    /// and, for Docker, the engine answers).
    pub configured: bool,
    /// Why it is not configured, or a note on a degraded setup; never a secret.
    pub detail: Option<String>,
    pub capabilities: RuntimeCapabilities,
}

/// The runtime providers this worker can use, by name; a request picks one per exec.
/// It also remembers providers grove knows but cannot use here, for `grove runtimes`.
#[derive(Clone, Default)]
pub struct RuntimeRegistry {
    providers: Vec<std::sync::Arc<dyn RuntimeProvider>>,
    /// Known, not usable here: (kind, why, what it would offer).
    unconfigured: Vec<(&'static str, String, RuntimeCapabilities)>,
    /// Notes on configured providers (e.g. local without isolation), by kind.
    notes: Vec<(&'static str, String)>,
}

impl RuntimeRegistry {
    pub fn with(mut self, provider: std::sync::Arc<dyn RuntimeProvider>) -> Self {
        self.providers.retain(|p| p.kind() != provider.kind());
        self.unconfigured.retain(|(k, _, _)| *k != provider.kind());
        self.providers.push(provider);
        self
    }
    /// Records a provider grove knows but cannot use here, with the reason (which must
    /// not contain a secret) and the capabilities it would report once configured.
    pub fn with_unconfigured(
        mut self,
        kind: &'static str,
        reason: impl Into<String>,
        capabilities: RuntimeCapabilities,
    ) -> Self {
        if self.get(kind).is_none() {
            self.unconfigured.retain(|(k, _, _)| *k != kind);
            self.unconfigured.push((kind, reason.into(), capabilities));
        }
        self
    }
    /// Attaches a note to a configured provider's listing.
    pub fn with_note(mut self, kind: &'static str, note: impl Into<String>) -> Self {
        self.notes.retain(|(k, _)| *k != kind);
        self.notes.push((kind, note.into()));
        self
    }
    pub fn get(&self, kind: &str) -> Option<std::sync::Arc<dyn RuntimeProvider>> {
        self.providers.iter().find(|p| p.kind() == kind).cloned()
    }
    /// The kinds usable here.
    pub fn kinds(&self) -> Vec<&'static str> {
        self.providers.iter().map(|p| p.kind()).collect()
    }
    /// Every provider grove knows: the usable ones in registration order, then the
    /// known but unconfigured ones.
    pub fn statuses(&self) -> Vec<ProviderStatus> {
        let configured = self.providers.iter().map(|p| ProviderStatus {
            kind: p.kind(),
            configured: true,
            detail: self
                .notes
                .iter()
                .find(|(k, _)| *k == p.kind())
                .map(|(_, n)| n.clone()),
            capabilities: p.capabilities(),
        });
        let known = self
            .unconfigured
            .iter()
            .map(|(kind, why, caps)| ProviderStatus {
                kind,
                configured: false,
                detail: Some(why.clone()),
                capabilities: *caps,
            });
        configured.chain(known).collect()
    }
}

/// Collects an [`Runtime::exec_stream`] stream into one result: how a provider builds
/// `exec` on its streaming form, so the two cannot disagree.
pub async fn collect_exec(
    mut stream: BoxStream<'static, Result<ExecChunk, RuntimeError>>,
) -> Result<ExecResult, RuntimeError> {
    use futures::StreamExt;
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    while let Some(item) = stream.next().await {
        match item? {
            ExecChunk::Output {
                stream: StreamKind::Stdout,
                data,
            } => stdout.extend_from_slice(&data),
            ExecChunk::Output {
                stream: StreamKind::Stderr,
                data,
            } => stderr.extend_from_slice(&data),
            ExecChunk::Finished(mut result) => {
                result.stdout = stdout;
                result.stderr = stderr;
                return Ok(result);
            }
        }
    }
    Err(RuntimeError::Unavailable(
        "the command's output ended without a result".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(files: &[(&str, &str)]) -> Option<String> {
        let files: BTreeMap<String, String> = files
            .iter()
            .map(|(k, v)| (format!("/r/.git/{k}"), v.to_string()))
            .collect();
        futures::executor::block_on(resolve_head::<(), _, _>("/r", |path| {
            let found = files.get(&path).map(|v| v.clone().into_bytes());
            async move { Ok(found) }
        }))
        .unwrap()
    }

    #[test]
    fn only_workspace_paths_under_a_home_are_removable() {
        assert_eq!(
            split_remote_workspace_path("/home/u/grove/workspaces/a_b_c"),
            Some(("/home/u", "a_b_c"))
        );
        for bad in [
            "/home/u/grove/workspaces/",
            "/home/u/grove/workspaces/..",
            "/home/u/grove/workspaces/a/b",
            "/home/u/grove/repos/x",
            "home/u/grove/workspaces/a",
            "/home/../grove/workspaces/a",
            "/",
        ] {
            assert_eq!(split_remote_workspace_path(bad), None, "{bad}");
        }
    }

    #[test]
    fn head_resolves_detached_loose_and_packed_and_nothing_else() {
        let a = "a".repeat(40);
        let b = "b".repeat(40);
        assert_eq!(resolve(&[("HEAD", &a)]), Some(a.clone()));
        assert_eq!(
            resolve(&[("HEAD", "ref: refs/heads/main\n"), ("refs/heads/main", &b)]),
            Some(b.clone())
        );
        let packed = format!("# pack-refs with: peeled\n{a} refs/heads/dev\n{b} refs/heads/main\n");
        assert_eq!(
            resolve(&[("HEAD", "ref: refs/heads/main"), ("packed-refs", &packed)]),
            Some(b)
        );
        assert_eq!(resolve(&[]), None);
        assert_eq!(resolve(&[("HEAD", "ref: refs/heads/gone")]), None);
        assert_eq!(resolve(&[("HEAD", "ref: ../../etc/passwd")]), None);
        assert_eq!(resolve(&[("HEAD", "not a commit")]), None);
    }
}
