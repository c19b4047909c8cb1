//! grove-daytona: the [`RuntimeProvider`] on Daytona sandboxes, over Daytona's REST API
//! and its toolbox (reqwest; no SDK, no untyped handles).
//!
//! One sandbox per (user, project), found again by its labels (`grove.managed`,
//! `grove.user`, `grove.project` and the deployment's scope labels) after a restart.
//! Workspaces live inside it as clones named `<user>_<scope>_<branch>` under
//! `<home>/grove/workspaces` ([`workspace`]), made from one clone per repository
//! under `<home>/grove/repos` (the repo-cache rule, per sandbox). A runtime's
//! [`RuntimeSpec::workdir`] is the workspace's path **inside the sandbox**; host
//! mounts cannot reach a remote sandbox, so a spec mounting anything but its own
//! workdir is refused.
//!
//! Every toolbox call that fails is checked against the sandbox's state: a sandbox that
//! is not started is started and the call retried once; one that is gone is created
//! again (its workspaces with it, which the caller re-prepares) and the call retried
//! once. Destroying a runtime stops the sandbox (compute released, disk kept): the
//! sandbox holds workspaces, and a runtime is never allowed to delete a workspace;
//! [`DaytonaRuntimeProvider::delete_sandbox`] is the explicit cleanup.
//!
//! # Layout
//! - [`api`]: the typed REST client (sandboxes, toolbox sessions, files, git).
//! - [`error`]: [`DaytonaError`] and its mapping to `RuntimeError`.
//! - `sandboxes`: Daytona's calls for the shared sandbox lifecycle (find, create,
//!   converge, recover: `grove_remote_runtime::lifecycle`).
//! - [`script`]: argv/env/cwd/stdin as a quoted `sh` script for the session API.
//! - [`workspace`]: workspaces inside the sandbox (clone, branch, checkout, verified).

pub mod api;
pub mod error;
mod sandboxes;
pub mod script;
pub mod workspace;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{SinkExt, StreamExt};
use grove_core::error::RuntimeError;
use grove_core::ports::{
    ExecChunk, ExecRequest, ExecResult, NetworkPolicy, PreviewRequest, PreviewUrl, PreviewUrls,
    Runtime, RuntimeCapabilities, RuntimeProvider, RuntimeSpec, StreamKind,
};

pub use api::{ApiKey, Client, Sandbox, SandboxState};
pub use error::DaytonaError;
use grove_remote_runtime::lifecycle;
use grove_remote_runtime::{lexical_cwd, validate_exec, OutputCap, RemoteSpec};
pub use grove_remote_runtime::{
    RemoteWorkspace, SandboxKey, WorkspacePlacement, LABEL_MANAGED, LABEL_NETWORK, LABEL_PROJECT,
    LABEL_USER,
};

/// The exit code reported for a command killed at its timeout (SIGKILL).
const TIMEOUT_EXIT: i32 = 137;
const DEFAULT_MAX_OUTPUT: usize = 1024 * 1024;

/// How to reach one Daytona deployment and what to ask of it. Comes from the
/// deployment's configuration ([`DaytonaConfig::from_env`]), never from a request.
#[derive(Debug, Clone)]
pub struct DaytonaConfig {
    /// The API root, e.g. `https://app.daytona.io/api`.
    pub api_url: String,
    pub api_key: ApiKey,
    pub organization: Option<String>,
    pub target: Option<String>,
    /// The snapshot sandboxes are created from (`None`: Daytona's default).
    pub snapshot: Option<String>,
    pub cpu: Option<u32>,
    pub memory_gib: Option<u32>,
    pub disk_gib: Option<u32>,
    /// Minutes idle before Daytona stops a sandbox (0: never).
    pub auto_stop_minutes: u32,
    /// Minutes stopped before Daytona archives it.
    pub auto_archive_minutes: u32,
    /// CIDRs for network `limited` (comma-separated); `None`: `limited` is refused.
    pub network_allow_list: Option<String>,
    /// How long to wait for a sandbox to reach `started`.
    pub start_timeout: Duration,
    /// How often to poll a sandbox's state and a command's output.
    pub poll_interval: Duration,
    /// Sandboxes per page when listing by label.
    pub list_page_size: u32,
}

impl DaytonaConfig {
    pub fn new(api_url: impl Into<String>, api_key: ApiKey) -> Self {
        Self {
            api_url: api_url.into(),
            api_key,
            organization: None,
            target: None,
            snapshot: None,
            cpu: None,
            memory_gib: None,
            disk_gib: None,
            auto_stop_minutes: 15,
            auto_archive_minutes: 7 * 24 * 60,
            network_allow_list: None,
            start_timeout: Duration::from_secs(120),
            poll_interval: Duration::from_millis(100),
            list_page_size: 100,
        }
    }

    /// Reads `GROVE_DAYTONA_API_URL` and `GROVE_DAYTONA_API_KEY` (both or neither) and
    /// the optional `GROVE_DAYTONA_ORGANIZATION_ID`, `GROVE_DAYTONA_TARGET`,
    /// `GROVE_DAYTONA_SNAPSHOT`, `GROVE_DAYTONA_AUTO_STOP_MINUTES`,
    /// `GROVE_DAYTONA_AUTO_ARCHIVE_MINUTES`, `GROVE_DAYTONA_NETWORK_ALLOW_LIST`.
    /// `Ok(None)` when Daytona is not configured.
    pub fn from_env() -> Result<Option<Self>, DaytonaError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`DaytonaConfig::from_env`] over any source of variables.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, DaytonaError> {
        let var = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let Some((url, key)) = grove_remote_runtime::config::url_and_key(
            &get,
            "GROVE_DAYTONA_API_URL",
            "GROVE_DAYTONA_API_KEY",
        )
        .map_err(DaytonaError::Config)?
        else {
            return Ok(None);
        };
        let minutes = |k: &str, default: u32| -> Result<u32, DaytonaError> {
            match var(k) {
                None => Ok(default),
                Some(v) => v
                    .trim()
                    .parse()
                    .map_err(|_| DaytonaError::Config(format!("{k} must be a number of minutes"))),
            }
        };
        let mut c = Self::new(url, ApiKey::new(key));
        c.organization = var("GROVE_DAYTONA_ORGANIZATION_ID");
        c.target = var("GROVE_DAYTONA_TARGET");
        c.snapshot = var("GROVE_DAYTONA_SNAPSHOT");
        c.auto_stop_minutes = minutes("GROVE_DAYTONA_AUTO_STOP_MINUTES", c.auto_stop_minutes)?;
        c.auto_archive_minutes =
            minutes("GROVE_DAYTONA_AUTO_ARCHIVE_MINUTES", c.auto_archive_minutes)?;
        c.network_allow_list = var("GROVE_DAYTONA_NETWORK_ALLOW_LIST");
        Ok(Some(c))
    }
}

/// The Daytona runtime provider. Cheap to clone (shared state inside).
#[derive(Clone)]
pub struct DaytonaRuntimeProvider {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    config: DaytonaConfig,
    scope: BTreeMap<String, String>,
    /// Sandbox ids by key, as last seen; a lookup failure re-reads them by label.
    sandboxes: tokio::sync::Mutex<HashMap<SandboxKey, String>>,
}

impl DaytonaRuntimeProvider {
    pub fn new(config: DaytonaConfig) -> Result<Self, DaytonaError> {
        let client = Client::new(
            &config.api_url,
            config.api_key.clone(),
            config.organization.clone(),
        )?
        .with_page_size(config.list_page_size);
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                config,
                scope: BTreeMap::new(),
                sandboxes: Default::default(),
            }),
        })
    }

    /// Adds a label that scopes this provider's sandboxes (e.g. a deployment id): it is
    /// set on every sandbox created and required of every sandbox found by label.
    pub fn with_scope_label(self, key: impl Into<String>, value: impl Into<String>) -> Self {
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|arc| Inner {
            client: arc.client.clone(),
            config: arc.config.clone(),
            scope: arc.scope.clone(),
            sandboxes: Default::default(),
        });
        let mut inner = inner;
        inner.scope.insert(key.into(), value.into());
        Self {
            inner: Arc::new(inner),
        }
    }

    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// What the provider offers once configured (`network_limited` needs an allow-list
    /// in the configuration).
    pub fn offered_capabilities() -> RuntimeCapabilities {
        RuntimeCapabilities {
            writable: true,
            // Workspaces of one (user, project) share a sandbox and a read-only
            // workspace is not read-only to the kernel there: isolation between
            // workspaces is not enforced, only between sandboxes.
            isolated: false,
            network_none: true,
            network_limited: true,
            network_default: true,
            preview_url: true,
            // No snapshots and no interactive sessions: `snapshotter()` and
            // `sessions()` answer `None`. A session command's input is text with a
            // newline forced on, echoed into its output, with no end of file; a
            // snapshot would hold every workspace of the sandbox (ADR 15).
            ..RuntimeCapabilities::default()
        }
    }

    pub fn config(&self) -> &DaytonaConfig {
        &self.inner.config
    }

    /// The labels that identify the sandbox of `key`.
    pub fn labels_of(&self, key: &SandboxKey) -> BTreeMap<String, String> {
        key.labels(&self.inner.scope)
    }

    /// The started sandbox of `key`: the known one, else one found by label (started
    /// if stopped), else a new one.
    pub async fn sandbox(
        &self,
        key: &SandboxKey,
        network: NetworkPolicy,
    ) -> Result<String, RuntimeError> {
        lifecycle::sandbox(&*self.inner, key, network).await
    }

    /// Waits for `id` to be started, starting it when it is stopped or archived.
    pub async fn ensure_started(&self, id: &str) -> Result<(), RuntimeError> {
        self.inner.ensure_started(id).await
    }

    /// Runs `op` against the sandbox of `key`, with the not-started / not-found
    /// recovery: on failure the sandbox's state decides whether to retry once.
    pub async fn with_sandbox<T, F, Fut>(
        &self,
        key: &SandboxKey,
        network: NetworkPolicy,
        op: F,
    ) -> Result<(String, T), RuntimeError>
    where
        F: Fn(String) -> Fut,
        Fut: std::future::Future<Output = Result<T, DaytonaError>>,
    {
        lifecycle::with_sandbox(&*self.inner, key, network, op).await
    }

    /// Deletes the sandbox of `key` and every workspace in it: the explicit cleanup
    /// when the last workspace of a (user, project) is destroyed. Absent is success.
    pub async fn delete_sandbox(&self, key: &SandboxKey) -> Result<(), RuntimeError> {
        lifecycle::discard_all(&*self.inner, key).await
    }

    /// Forgets the ids this process remembers, as a restart would.
    pub async fn forget_known_sandboxes(&self) {
        self.inner.sandboxes.lock().await.clear();
    }

    fn parse_backend_id(backend_id: &str) -> Option<SandboxKey> {
        SandboxKey::parse_backend_id("daytona", backend_id)
    }
}

/// The sandbox of a key among those listed by its labels: the one every worker keeps
/// after a create race (the oldest not being destroyed).
fn oldest(listed: Vec<Sandbox>) -> Option<Sandbox> {
    let live = listed
        .into_iter()
        .filter(|s| !matches!(s.state, SandboxState::Destroyed | SandboxState::Destroying))
        .collect();
    grove_remote_runtime::keep_oldest(live, |s| &s.id, |s| s.created_at.as_deref())
}

/// A sandbox keeps the network it was created with (ADR 15).
fn check_network(s: &Sandbox, wanted: NetworkPolicy) -> Result<(), RuntimeError> {
    grove_remote_runtime::check_network(&s.id, &s.labels, wanted)
}

impl RuntimeProvider for DaytonaRuntimeProvider {
    fn kind(&self) -> &'static str {
        "daytona"
    }

    fn capabilities(&self) -> RuntimeCapabilities {
        RuntimeCapabilities {
            network_limited: self.inner.config.network_allow_list.is_some(),
            ..Self::offered_capabilities()
        }
    }

    fn create(&self, spec: RuntimeSpec) -> BoxFuture<'_, Result<Box<dyn Runtime>, RuntimeError>> {
        Box::pin(async move {
            let spec = RemoteSpec::check(spec, "Daytona")?;
            self.sandbox(&spec.key, spec.network).await?;
            Ok(Box::new(DaytonaRuntime {
                provider: self.clone(),
                key: spec.key,
                network: spec.network,
                workdir: spec.workdir,
                env: spec.env,
                writable: spec.writable,
            }) as Box<dyn Runtime>)
        })
    }

    fn backend_id(&self, spec: &RuntimeSpec) -> String {
        SandboxKey::of(spec).backend_id("daytona")
    }

    fn stop(&self, backend_id: &str) -> BoxFuture<'_, Result<(), RuntimeError>> {
        let key = Self::parse_backend_id(backend_id);
        Box::pin(async move {
            let Some(key) = key else { return Ok(()) };
            for s in self
                .inner
                .client
                .list_sandboxes(&self.labels_of(&key))
                .await?
            {
                if s.state == SandboxState::Started {
                    match self.inner.client.stop_sandbox(&s.id).await {
                        Ok(()) | Err(DaytonaError::Api { status: 404, .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            Ok(())
        })
    }

    /// Stops the sandbox: it holds the workspaces, which a runtime never deletes.
    fn destroy(&self, backend_id: &str) -> BoxFuture<'_, Result<(), RuntimeError>> {
        self.stop(backend_id)
    }

    fn preview_urls(&self) -> Option<&dyn PreviewUrls> {
        Some(self)
    }

    fn workspaces(&self) -> Option<&dyn grove_core::ports::RemoteWorkspaces> {
        Some(self)
    }

    fn healthy(&self, backend_id: &str) -> BoxFuture<'_, Result<bool, RuntimeError>> {
        let key = Self::parse_backend_id(backend_id);
        Box::pin(async move {
            let Some(key) = key else { return Ok(false) };
            let found = self
                .inner
                .client
                .list_sandboxes(&self.labels_of(&key))
                .await?;
            Ok(found
                .iter()
                .any(|s| !matches!(s.state, SandboxState::Error | SandboxState::BuildFailed)))
        })
    }
}

/// Daytona's preview proxy: ports 3000-9999 of a sandbox. A private sandbox's URL
/// needs Daytona's preview token, which grove does not hand out; the URL itself never
/// carries it.
impl PreviewUrls for DaytonaRuntimeProvider {
    fn expose(&self, req: PreviewRequest) -> BoxFuture<'_, Result<PreviewUrl, RuntimeError>> {
        Box::pin(async move {
            if !(3000..=9999).contains(&req.port) {
                return Err(RuntimeError::CommandRejected(format!(
                    "Daytona previews ports 3000-9999, not {}",
                    req.port
                )));
            }
            let key = Self::parse_backend_id(&req.backend_id).ok_or_else(|| {
                RuntimeError::NotFound(format!("not a Daytona runtime: {}", req.backend_id))
            })?;
            let sandbox = oldest(
                self.inner
                    .client
                    .list_sandboxes(&self.labels_of(&key))
                    .await?,
            )
            .ok_or_else(|| RuntimeError::NotFound(format!("no sandbox for {}", req.backend_id)))?;
            let url = self.inner.client.preview_url(&sandbox.id, req.port).await?;
            Ok(PreviewUrl {
                port: req.port,
                url,
            })
        })
    }
}

/// A runtime: one workspace directory in the sandbox of one (user, project).
struct DaytonaRuntime {
    provider: DaytonaRuntimeProvider,
    key: SandboxKey,
    network: NetworkPolicy,
    workdir: String,
    env: BTreeMap<String, String>,
    writable: bool,
}

impl DaytonaRuntime {
    async fn start(
        &self,
        req: ExecRequest,
    ) -> Result<BoxStream<'static, Result<ExecChunk, RuntimeError>>, RuntimeError> {
        validate_exec(&req, self.writable)?;
        let dir = lexical_cwd(&self.workdir, req.cwd.as_deref())?;
        let client = self.provider.client().clone();
        let poll = self.provider.config().poll_interval;
        let session = format!("grove-{}", uuid::Uuid::new_v4().simple());
        let (sandbox, ()) = self
            .provider
            .with_sandbox(&self.key, self.network, |id| {
                let client = client.clone();
                let session = session.clone();
                async move { client.create_session(&id, &session).await }
            })
            .await?;
        let guard = SessionGuard {
            client: client.clone(),
            sandbox: sandbox.clone(),
            session: session.clone(),
            armed: true,
        };
        if let Some(dir) = &dir {
            // The cwd must resolve (symlinks included) inside the workspace.
            let check = script::sh_c(&script::cwd_check_script(&self.workdir, dir));
            let cmd = client
                .session_exec_async(&sandbox, &session, &check)
                .await?;
            let code = wait_exit(&client, &sandbox, &session, &cmd, poll).await?;
            if code != 0 {
                return Err(RuntimeError::CommandRejected(format!(
                    "cwd {} is not a directory inside the workspace",
                    req.cwd.as_deref().unwrap_or(Path::new("")).display()
                )));
            }
        }
        let stdin_file = match req.stdin {
            Some(data) => {
                let path = format!("/tmp/{session}.stdin");
                client.upload_file(&sandbox, &path, data).await?;
                Some(path)
            }
            None => None,
        };
        let mut env = self.env.clone();
        env.extend(req.env.clone());
        let text = script::command_script(
            dir.as_deref().unwrap_or(&self.workdir),
            &env,
            stdin_file.as_deref(),
            &req.argv,
        );
        let cmd = client
            .session_exec_async(&sandbox, &session, &script::sh_c(&text))
            .await?;
        let (tx, rx) = futures::channel::mpsc::channel(16);
        let follow = Follow {
            client,
            sandbox,
            session,
            cmd,
            poll,
            deadline: req.timeout.map(|t| Instant::now() + t),
            cap: OutputCap::new(req.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT)),
        };
        tokio::spawn(follow.run(tx, guard));
        Ok(rx.boxed())
    }
}

/// Deletes the exec's session (which ends its processes) when dropped armed.
struct SessionGuard {
    client: Client,
    sandbox: String,
    session: String,
    armed: bool,
}

impl SessionGuard {
    async fn close(mut self) {
        self.armed = false;
        if let Err(e) = self
            .client
            .delete_session(&self.sandbox, &self.session)
            .await
        {
            tracing::debug!(error = %e, "deleting a daytona session failed");
        }
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let client = self.client.clone();
        let sandbox = self.sandbox.clone();
        let session = self.session.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = client.delete_session(&sandbox, &session).await;
            });
        }
    }
}

async fn wait_exit(
    client: &Client,
    sandbox: &str,
    session: &str,
    cmd: &str,
    poll: Duration,
) -> Result<i32, RuntimeError> {
    loop {
        if let Some(code) = client
            .session_command(sandbox, session, cmd)
            .await?
            .exit_code
        {
            return Ok(code);
        }
        tokio::time::sleep(poll).await;
    }
}

/// Follows one session command: polls its exit code and logs, sends new output as
/// chunks, enforces the timeout and the output cap, and ends the session.
struct Follow {
    client: Client,
    sandbox: String,
    session: String,
    cmd: String,
    poll: Duration,
    deadline: Option<Instant>,
    cap: OutputCap,
}

impl Follow {
    async fn run(
        mut self,
        mut tx: futures::channel::mpsc::Sender<Result<ExecChunk, RuntimeError>>,
        guard: SessionGuard,
    ) {
        let mut seen = [0usize; 2];
        loop {
            if tx.is_closed() {
                // The caller dropped the stream: the command ends with the session.
                guard.close().await;
                return;
            }
            let step = async {
                let c = self
                    .client
                    .session_command(&self.sandbox, &self.session, &self.cmd)
                    .await?;
                let logs = self
                    .client
                    .session_command_logs(&self.sandbox, &self.session, &self.cmd)
                    .await?;
                Ok::<_, DaytonaError>((c.exit_code, logs))
            };
            let (exit, logs) = match step.await {
                Ok(v) => v,
                Err(e) => {
                    let _ = tx.send(Err(e.into())).await;
                    guard.close().await;
                    return;
                }
            };
            for (i, (kind, text)) in [
                (StreamKind::Stdout, &logs.stdout),
                (StreamKind::Stderr, &logs.stderr),
            ]
            .into_iter()
            .enumerate()
            {
                let bytes = text.as_bytes();
                if bytes.len() <= seen[i] {
                    continue;
                }
                let new = &bytes[seen[i]..];
                seen[i] = bytes.len();
                let kept = self.cap.take(new);
                if !kept.is_empty() {
                    let chunk = ExecChunk::Output {
                        stream: kind,
                        data: kept.to_vec(),
                    };
                    if tx.send(Ok(chunk)).await.is_err() {
                        guard.close().await;
                        return;
                    }
                }
            }
            let timed_out = exit.is_none() && self.deadline.is_some_and(|d| Instant::now() >= d);
            if exit.is_some() || timed_out {
                guard.close().await;
                let result = ExecResult {
                    exit_code: exit.unwrap_or(TIMEOUT_EXIT),
                    stdout: Vec::new(),
                    stderr: Vec::new(),
                    timed_out,
                    truncated: self.cap.truncated(),
                };
                let _ = tx.send(Ok(ExecChunk::Finished(result))).await;
                return;
            }
            tokio::time::sleep(self.poll).await;
        }
    }
}

impl Runtime for DaytonaRuntime {
    fn exec_stream(
        &self,
        req: ExecRequest,
    ) -> BoxFuture<'_, Result<BoxStream<'static, Result<ExecChunk, RuntimeError>>, RuntimeError>>
    {
        Box::pin(self.start(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn configuration_needs_both_url_and_key_and_never_shows_the_key() {
        assert!(DaytonaConfig::from_vars(vars(&[])).unwrap().is_none());
        let e =
            DaytonaConfig::from_vars(vars(&[("GROVE_DAYTONA_API_KEY", "dtn_secret")])).unwrap_err();
        assert!(!e.to_string().contains("dtn_secret"), "{e}");
        assert!(DaytonaConfig::from_vars(vars(&[("GROVE_DAYTONA_API_URL", "https://x")])).is_err());
        assert!(DaytonaConfig::from_vars(vars(&[
            ("GROVE_DAYTONA_API_URL", "ftp://x"),
            ("GROVE_DAYTONA_API_KEY", "k")
        ]))
        .is_err());
        let c = DaytonaConfig::from_vars(vars(&[
            ("GROVE_DAYTONA_API_URL", "https://app.daytona.io/api"),
            ("GROVE_DAYTONA_API_KEY", "dtn_secret"),
            ("GROVE_DAYTONA_AUTO_STOP_MINUTES", "30"),
            ("GROVE_DAYTONA_NETWORK_ALLOW_LIST", "10.0.0.0/8"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.auto_stop_minutes, 30);
        assert_eq!(c.network_allow_list.as_deref(), Some("10.0.0.0/8"));
        assert!(!format!("{c:?}").contains("dtn_secret"));
    }

    #[test]
    fn backend_ids_name_the_user_and_project() {
        let key = DaytonaRuntimeProvider::parse_backend_id("daytona:u1/p1").unwrap();
        assert_eq!((key.user.as_str(), key.project.as_str()), ("u1", "p1"));
        assert!(DaytonaRuntimeProvider::parse_backend_id("docker:x").is_none());
    }
}
