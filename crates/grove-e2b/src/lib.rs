//! grove-e2b: the [`RuntimeProvider`] on E2B sandboxes (Firecracker microVMs), over
//! E2B's REST API and each sandbox's envd (process and filesystem), with reqwest.
//!
//! One sandbox per (user, project), created with metadata (`grove.managed`,
//! `grove.user`, `grove.project`, the deployment's scope labels) and found again by
//! that metadata after a restart. A runtime's [`RuntimeSpec::workdir`] is the
//! workspace's path **inside the sandbox**; host mounts cannot reach it, so a spec
//! mounting anything but its own workdir is refused. A command runs as
//! `/bin/sh -c 'exec "$0" "$@"' argv...` through envd's `process.Process/Start`, so a
//! missing program is exit 127 and a signal is 128 + its number.
//!
//! # Persistence (what survives what)
//!
//! - **Pause** (`POST /sandboxes/{id}/pause`; grove's hibernate and destroy-runtime):
//!   the filesystem *and* memory, running processes included, are kept; `connect`
//!   resumes the sandbox where it was.
//! - **Timeout** (the sandbox's `timeout`, renewed by each connect): with `autoPause`
//!   (grove's default, `GROVE_E2B_AUTO_PAUSE`) the sandbox is paused, so everything
//!   survives as above; without it the sandbox is killed and everything in it is lost.
//! - **Kill** (`DELETE /sandboxes/{id}`; only [`E2bRuntimeProvider::kill_sandbox`]):
//!   everything is lost, workspaces included.
//!
//! Hence: destroying a runtime pauses (a runtime never deletes a workspace), and
//! [`E2bRuntimeProvider::persistence`] reports these facts for the configured
//! `auto_pause`. Every envd failure is checked against the sandbox's state: a paused
//! sandbox is resumed and the call retried once; a killed one is created again (empty)
//! and the call retried once.
//!
//! # Layout
//! - [`api`]: the typed clients (REST, envd Connect-JSON process service, files).
//! - [`error`]: [`E2bError`] and its mapping to `RuntimeError`.
//! - `sandboxes`: E2B's calls for the shared sandbox lifecycle (find, create,
//!   converge, recover: `grove_remote_runtime::lifecycle`).
//! - [`session`]: interactive sessions (envd processes with stdin).
//! - [`workspace`]: workspaces inside the sandbox (one clone per repository, then a
//!   `<user>_<scope>_<branch>` clone of it per workspace), made with the sandbox's git.

pub mod api;
pub mod error;
mod sandboxes;
pub mod session;
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

pub use api::{Client, Envd, ProcessEvent, SandboxInfo, SandboxState, Secret};
pub use error::E2bError;
use grove_remote_runtime::lifecycle;
use grove_remote_runtime::{lexical_cwd, validate_exec, OutputCap, RemoteSpec};
pub use grove_remote_runtime::{
    RemoteWorkspace, SandboxKey, WorkspacePlacement, LABEL_MANAGED, LABEL_NETWORK, LABEL_PROJECT,
    LABEL_USER,
};

const TIMEOUT_EXIT: i32 = 137;
const DEFAULT_MAX_OUTPUT: usize = 1024 * 1024;
const STDIN_CHUNK: usize = 64 * 1024;

/// How to reach one E2B deployment and what to ask of it; from the deployment's
/// configuration ([`E2bConfig::from_env`]), never from a request.
#[derive(Debug, Clone)]
pub struct E2bConfig {
    /// The REST root, `https://api.e2b.dev`.
    pub api_url: String,
    pub api_key: Secret,
    /// Where a sandbox's envd answers; `{sandbox_id}` and `{domain}` are replaced.
    pub envd_url_template: String,
    /// The sandbox domain when the API does not name one.
    pub domain: String,
    pub template: String,
    /// Seconds a sandbox lives without a connect before it times out.
    pub timeout_secs: u64,
    /// Pause instead of kill at timeout.
    pub auto_pause: bool,
    /// Sandboxes per page when listing by metadata.
    pub list_page_size: u32,
}

impl E2bConfig {
    pub fn new(api_url: impl Into<String>, api_key: Secret) -> Self {
        Self {
            api_url: api_url.into(),
            api_key,
            envd_url_template: "https://49983-{sandbox_id}.{domain}".into(),
            domain: "e2b.app".into(),
            template: "base".into(),
            timeout_secs: 15 * 60,
            auto_pause: true,
            list_page_size: 100,
        }
    }

    /// Reads `GROVE_E2B_API_URL` and `GROVE_E2B_API_KEY` (both or neither) and the
    /// optional `GROVE_E2B_TEMPLATE`, `GROVE_E2B_DOMAIN`, `GROVE_E2B_ENVD_URL` (a
    /// template with `{sandbox_id}` and `{domain}`), `GROVE_E2B_TIMEOUT_SECS`,
    /// `GROVE_E2B_AUTO_PAUSE` (`true`/`false`). `Ok(None)` when E2B is not configured.
    pub fn from_env() -> Result<Option<Self>, E2bError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`E2bConfig::from_env`] over any source of variables.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, E2bError> {
        let var = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let Some((url, key)) = grove_remote_runtime::config::url_and_key(
            &get,
            "GROVE_E2B_API_URL",
            "GROVE_E2B_API_KEY",
        )
        .map_err(E2bError::Config)?
        else {
            return Ok(None);
        };
        let mut c = Self::new(url, Secret::new(key));
        if let Some(t) = var("GROVE_E2B_TEMPLATE") {
            c.template = t;
        }
        if let Some(d) = var("GROVE_E2B_DOMAIN") {
            c.domain = d;
        }
        if let Some(e) = var("GROVE_E2B_ENVD_URL") {
            if !e.contains("{sandbox_id}") {
                return Err(E2bError::Config(
                    "GROVE_E2B_ENVD_URL must contain {sandbox_id}".into(),
                ));
            }
            c.envd_url_template = e;
        }
        if let Some(t) = var("GROVE_E2B_TIMEOUT_SECS") {
            c.timeout_secs = t
                .trim()
                .parse()
                .map_err(|_| E2bError::Config("GROVE_E2B_TIMEOUT_SECS must be a number".into()))?;
        }
        if let Some(p) = var("GROVE_E2B_AUTO_PAUSE") {
            c.auto_pause = match p.trim() {
                "true" | "1" => true,
                "false" | "0" => false,
                _ => {
                    return Err(E2bError::Config(
                        "GROVE_E2B_AUTO_PAUSE must be true or false".into(),
                    ))
                }
            };
        }
        Ok(Some(c))
    }
}

/// What survives in an E2B sandbox of this provider (see the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Persistence {
    /// Files and processes survive a pause (hibernate, destroy-runtime).
    pub survives_pause: bool,
    /// Files and processes survive the sandbox's timeout (only with auto-pause).
    pub survives_timeout: bool,
    /// Nothing survives a kill.
    pub survives_kill: bool,
}

/// The E2B runtime provider. Cheap to clone.
#[derive(Clone)]
pub struct E2bRuntimeProvider {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    config: E2bConfig,
    scope: BTreeMap<String, String>,
    known: tokio::sync::Mutex<HashMap<SandboxKey, SandboxInfo>>,
    /// Interactive sessions this provider holds ([`session`]).
    sessions: Arc<grove_core::session::SessionTable>,
}

impl E2bRuntimeProvider {
    pub fn new(config: E2bConfig) -> Result<Self, E2bError> {
        Self::with_scope(config, BTreeMap::new())
    }

    /// A provider whose sandboxes carry (and are found by) `scope` metadata too.
    pub fn with_scope(
        config: E2bConfig,
        scope: BTreeMap<String, String>,
    ) -> Result<Self, E2bError> {
        let client = Client::new(
            &config.api_url,
            config.api_key.clone(),
            &config.envd_url_template,
            &config.domain,
        )?
        .with_page_size(config.list_page_size);
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                config,
                scope,
                known: Default::default(),
                sessions: Default::default(),
            }),
        })
    }

    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// What the provider offers (the same whether or not it is configured).
    pub fn offered_capabilities() -> RuntimeCapabilities {
        RuntimeCapabilities {
            writable: true,
            // One microVM per (user, project): workspaces inside it are not isolated
            // from each other, and a read-only workspace is not read-only there.
            isolated: false,
            network_none: true,
            network_limited: false,
            network_default: true,
            preview_url: true,
            // envd's processes take stdin (`SendInput`, `CloseStdin`) and stream output.
            interactive_session: true,
            // No snapshots: `snapshotter()` answers `None` (ADR 15 says why).
            ..RuntimeCapabilities::default()
        }
    }

    pub fn persistence(&self) -> Persistence {
        Persistence {
            survives_pause: true,
            survives_timeout: self.inner.config.auto_pause,
            survives_kill: false,
        }
    }

    pub fn metadata_of(&self, key: &SandboxKey) -> BTreeMap<String, String> {
        key.labels(&self.inner.scope)
    }

    /// The connected sandbox of `key`: the known one, else one found by metadata
    /// (resumed if paused), else a new one.
    pub async fn sandbox(
        &self,
        key: &SandboxKey,
        network: NetworkPolicy,
    ) -> Result<SandboxInfo, RuntimeError> {
        lifecycle::sandbox(&*self.inner, key, network).await
    }

    /// Runs `op` against the envd of `key`'s sandbox with the paused / gone recovery.
    pub async fn with_envd<T, F, Fut>(
        &self,
        key: &SandboxKey,
        network: NetworkPolicy,
        op: F,
    ) -> Result<(Envd, T), RuntimeError>
    where
        F: Fn(Envd) -> Fut,
        Fut: std::future::Future<Output = Result<T, E2bError>>,
    {
        let client = &self.inner.client;
        let (_, v) = lifecycle::with_sandbox(&*self.inner, key, network, |info| {
            let envd = client.envd(&info);
            let call = op(envd.clone());
            async move { call.await.map(|v| (envd, v)) }
        })
        .await?;
        Ok(v)
    }

    /// Reads a file inside `key`'s sandbox.
    pub async fn read_file(
        &self,
        key: &SandboxKey,
        network: NetworkPolicy,
        path: &str,
    ) -> Result<Vec<u8>, RuntimeError> {
        let client = self.inner.client.clone();
        let (_, data) = self
            .with_envd(key, network, |envd| {
                let client = client.clone();
                async move { client.read_file(&envd, path).await }
            })
            .await?;
        Ok(data)
    }

    /// Writes a file inside `key`'s sandbox (parents created).
    pub async fn write_file(
        &self,
        key: &SandboxKey,
        network: NetworkPolicy,
        path: &str,
        data: &[u8],
    ) -> Result<(), RuntimeError> {
        let client = self.inner.client.clone();
        self.with_envd(key, network, |envd| {
            let client = client.clone();
            let data = data.to_vec();
            async move { client.write_file(&envd, path, data).await }
        })
        .await
        .map(drop)
    }

    /// Kills the sandbox of `key` and everything in it (workspaces included): the
    /// explicit cleanup. Absent is success.
    pub async fn kill_sandbox(&self, key: &SandboxKey) -> Result<(), RuntimeError> {
        lifecycle::discard_all(&*self.inner, key).await
    }

    /// The runtime `spec` describes, its sandbox found or created.
    async fn runtime(&self, spec: RuntimeSpec) -> Result<E2bRuntime, RuntimeError> {
        let spec = RemoteSpec::check(spec, "E2B")?;
        self.sandbox(&spec.key, spec.network).await?;
        Ok(E2bRuntime {
            provider: self.clone(),
            key: spec.key,
            network: spec.network,
            workdir: spec.workdir,
            env: spec.env,
            writable: spec.writable,
        })
    }

    fn parse_backend_id(backend_id: &str) -> Option<SandboxKey> {
        SandboxKey::parse_backend_id("e2b", backend_id)
    }
}

/// The sandbox of a key among those listed by its metadata: the one every worker
/// keeps after a create race (the oldest).
fn oldest(listed: Vec<SandboxInfo>) -> Option<SandboxInfo> {
    grove_remote_runtime::keep_oldest(listed, |s| &s.sandbox_id, |s| s.started_at.as_deref())
}

/// A sandbox keeps the network it was created with (ADR 15).
fn check_network(s: &SandboxInfo, wanted: NetworkPolicy) -> Result<(), RuntimeError> {
    grove_remote_runtime::check_network(&s.sandbox_id, &s.metadata, wanted)
}

impl RuntimeProvider for E2bRuntimeProvider {
    fn kind(&self) -> &'static str {
        "e2b"
    }

    fn capabilities(&self) -> RuntimeCapabilities {
        Self::offered_capabilities()
    }

    fn create(&self, spec: RuntimeSpec) -> BoxFuture<'_, Result<Box<dyn Runtime>, RuntimeError>> {
        Box::pin(async move { Ok(Box::new(self.runtime(spec).await?) as Box<dyn Runtime>) })
    }

    fn backend_id(&self, spec: &RuntimeSpec) -> String {
        SandboxKey::of(spec).backend_id("e2b")
    }

    /// Pauses the sandbox (files and processes kept).
    fn stop(&self, backend_id: &str) -> BoxFuture<'_, Result<(), RuntimeError>> {
        let key = Self::parse_backend_id(backend_id);
        Box::pin(async move {
            let Some(key) = key else { return Ok(()) };
            // A pause would freeze the sessions' processes; they end with the runtime.
            self.inner
                .sessions
                .kill_all_of(Some(&key.backend_id("e2b")));
            self.inner.known.lock().await.remove(&key);
            for s in self.inner.client.list(&self.metadata_of(&key)).await? {
                if s.state == Some(SandboxState::Paused) {
                    continue;
                }
                match self.inner.client.pause(&s.sandbox_id).await {
                    // 409: already paused; 404: gone meanwhile.
                    Ok(())
                    | Err(E2bError::Api {
                        status: 404 | 409, ..
                    }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(())
        })
    }

    /// Pauses too: the sandbox holds the workspaces, which a runtime never deletes.
    fn destroy(&self, backend_id: &str) -> BoxFuture<'_, Result<(), RuntimeError>> {
        self.stop(backend_id)
    }

    fn workspaces(&self) -> Option<&dyn grove_core::ports::RemoteWorkspaces> {
        Some(self)
    }

    fn preview_urls(&self) -> Option<&dyn PreviewUrls> {
        Some(self)
    }

    fn sessions(&self) -> Option<&dyn grove_core::ports::Sessions> {
        Some(self)
    }

    fn healthy(&self, backend_id: &str) -> BoxFuture<'_, Result<bool, RuntimeError>> {
        let key = Self::parse_backend_id(backend_id);
        Box::pin(async move {
            let Some(key) = key else { return Ok(false) };
            Ok(!self
                .inner
                .client
                .list(&self.metadata_of(&key))
                .await?
                .is_empty())
        })
    }
}

/// E2B serves every port of a sandbox at `https://<port>-<sandbox id>.<domain>`; no
/// API call is needed, and the URL carries no credential. envd's own port is refused.
impl PreviewUrls for E2bRuntimeProvider {
    fn expose(&self, req: PreviewRequest) -> BoxFuture<'_, Result<PreviewUrl, RuntimeError>> {
        Box::pin(async move {
            if req.port == 0 || req.port == 49983 {
                return Err(RuntimeError::CommandRejected(format!(
                    "port {} cannot be previewed",
                    req.port
                )));
            }
            let key = Self::parse_backend_id(&req.backend_id).ok_or_else(|| {
                RuntimeError::NotFound(format!("not an E2B runtime: {}", req.backend_id))
            })?;
            let sandbox = oldest(self.inner.client.list(&self.metadata_of(&key)).await?)
                .ok_or_else(|| {
                    RuntimeError::NotFound(format!("no sandbox for {}", req.backend_id))
                })?;
            let domain = sandbox
                .domain
                .clone()
                .unwrap_or_else(|| self.inner.config.domain.clone());
            Ok(PreviewUrl {
                port: req.port,
                url: format!("https://{}-{}.{domain}", req.port, sandbox.sandbox_id),
            })
        })
    }
}

struct E2bRuntime {
    provider: E2bRuntimeProvider,
    key: SandboxKey,
    network: NetworkPolicy,
    workdir: String,
    env: BTreeMap<String, String>,
    writable: bool,
}

/// The exit code of an end event: the code, or 128 + the signal that ended it.
fn exit_code(code: i32, exited: bool, status: &str) -> i32 {
    if exited {
        return code;
    }
    let signal = match status.trim_start_matches("signal: ") {
        "hangup" => 1,
        "interrupt" => 2,
        "quit" => 3,
        "aborted" => 6,
        "killed" => 9,
        "segmentation fault" => 11,
        "broken pipe" => 13,
        "terminated" => 15,
        _ => return if code >= 0 { code } else { 128 },
    };
    128 + signal
}

impl E2bRuntime {
    async fn start(
        &self,
        mut req: ExecRequest,
    ) -> Result<BoxStream<'static, Result<ExecChunk, RuntimeError>>, RuntimeError> {
        let stdin = req.stdin.take().map(Stdin::Bytes).unwrap_or(Stdin::None);
        self.spawn(req, stdin).await
    }

    /// Starts `req` with `stdin` and follows it; the stream ends with its result, and
    /// dropping the stream kills the process.
    async fn spawn(
        &self,
        req: ExecRequest,
        stdin: Stdin,
    ) -> Result<BoxStream<'static, Result<ExecChunk, RuntimeError>>, RuntimeError> {
        validate_exec(&req, self.writable)?;
        let dir = lexical_cwd(&self.workdir, req.cwd.as_deref())?;
        let client = self.provider.client().clone();
        if let Some(d) = &dir {
            // The cwd must resolve (symlinks included) inside the workspace.
            let check = api::ProcessConfig {
                cmd: "/bin/sh".into(),
                args: vec![
                    "-c".into(),
                    r#"r=$(cd -- "$1" && pwd -P) || exit 2; d=$(cd -- "$2" && pwd -P) || exit 3; case "$d/" in "$r"/*) exit 0;; *) exit 4;; esac"#.into(),
                    "sh".into(),
                    self.workdir.clone(),
                    d.clone(),
                ],
                envs: BTreeMap::new(),
                cwd: None,
            };
            let (_, mut events) = self
                .provider
                .with_envd(&self.key, self.network, |envd| {
                    let client = client.clone();
                    let check = check.clone();
                    async move { client.start(&envd, &check, false).await }
                })
                .await?;
            let mut code = None;
            while let Some(ev) = events.next().await {
                if let ProcessEvent::End {
                    exit_code: c,
                    exited,
                    status,
                } = ev?
                {
                    code = Some(exit_code(c, exited, &status));
                }
            }
            if code != Some(0) {
                return Err(RuntimeError::CommandRejected(format!(
                    "cwd {} is not a directory inside the workspace",
                    req.cwd.as_deref().unwrap_or(Path::new("")).display()
                )));
            }
        }
        let mut envs = self.env.clone();
        envs.extend(req.env.clone());
        let mut args = vec!["-c".to_string(), r#"exec "$0" "$@""#.to_string()];
        args.extend(req.argv.iter().cloned());
        let process = api::ProcessConfig {
            cmd: "/bin/sh".into(),
            args,
            envs,
            cwd: Some(dir.unwrap_or_else(|| self.workdir.clone())),
        };
        let want_stdin = !matches!(stdin, Stdin::None);
        let (envd, mut events) = self
            .provider
            .with_envd(&self.key, self.network, |envd| {
                let client = client.clone();
                let process = process.clone();
                async move { client.start(&envd, &process, want_stdin).await }
            })
            .await?;
        let pid = match events.next().await {
            Some(Ok(ProcessEvent::Start { pid })) => pid,
            Some(Err(e)) => return Err(e.into()),
            other => {
                return Err(RuntimeError::Unavailable(format!(
                    "envd did not report the process start: {other:?}"
                )))
            }
        };
        match stdin {
            Stdin::None => {}
            Stdin::Bytes(data) => {
                let chunks = futures::stream::iter(vec![data]);
                tokio::spawn(feed_stdin(client.clone(), envd.clone(), pid, chunks));
            }
            Stdin::Channel(rx) => {
                tokio::spawn(feed_stdin(client.clone(), envd.clone(), pid, rx));
            }
        }
        let (tx, rx) = futures::channel::mpsc::channel(16);
        let follow = Follow {
            client,
            envd,
            pid,
            deadline: req.timeout.map(|t| Instant::now() + t),
            cap: OutputCap::new(req.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT)),
        };
        tokio::spawn(follow.run(events, tx));
        Ok(rx.boxed())
    }
}

/// Where a process's stdin comes from.
enum Stdin {
    /// Closed from the start.
    None,
    /// These bytes, then end of file.
    Bytes(Vec<u8>),
    /// Each item as it comes; end of file when the sender is dropped (a session).
    Channel(futures::channel::mpsc::UnboundedReceiver<Vec<u8>>),
}

/// Sends each item of `input` to the process with `SendInput` (in pieces of at most
/// [`STDIN_CHUNK`] bytes, in order), then `CloseStdin` once `input` ends.
async fn feed_stdin(
    client: Client,
    envd: Envd,
    pid: u32,
    mut input: impl futures::Stream<Item = Vec<u8>> + Unpin,
) {
    while let Some(data) = input.next().await {
        for chunk in data.chunks(STDIN_CHUNK) {
            if let Err(e) = client.send_input(&envd, pid, chunk).await {
                tracing::debug!(error = %e, "sending stdin to an e2b process failed");
                return;
            }
        }
    }
    if let Err(e) = client.close_stdin(&envd, pid).await {
        tracing::debug!(error = %e, "closing an e2b process's stdin failed");
    }
}

struct Follow {
    client: Client,
    envd: Envd,
    pid: u32,
    deadline: Option<Instant>,
    cap: OutputCap,
}

impl Follow {
    async fn kill(&self) {
        if let Err(e) = self.client.kill_process(&self.envd, self.pid).await {
            tracing::debug!(error = %e, "killing an e2b process failed");
        }
    }

    async fn run(
        mut self,
        mut events: BoxStream<'static, Result<ProcessEvent, E2bError>>,
        mut tx: futures::channel::mpsc::Sender<Result<ExecChunk, RuntimeError>>,
    ) {
        let mut timed_out = false;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            let ev = tokio::select! {
                ev = events.next() => ev,
                _ = tick.tick() => {
                    if tx.is_closed() {
                        // The caller dropped the stream: the command dies with it.
                        self.kill().await;
                        return;
                    }
                    if !timed_out && self.deadline.is_some_and(|d| Instant::now() >= d) {
                        timed_out = true;
                        self.kill().await;
                    }
                    continue;
                }
            };
            let (kind, data) = match ev {
                None => {
                    let _ = tx
                        .send(Err(RuntimeError::Unavailable(
                            "the process stream ended without an end event".into(),
                        )))
                        .await;
                    return;
                }
                Some(Err(e)) => {
                    let _ = tx.send(Err(e.into())).await;
                    return;
                }
                Some(Ok(ProcessEvent::Stdout(d))) => (StreamKind::Stdout, d),
                Some(Ok(ProcessEvent::Stderr(d))) => (StreamKind::Stderr, d),
                Some(Ok(ProcessEvent::End {
                    exit_code: c,
                    exited,
                    status,
                })) => {
                    let result = ExecResult {
                        exit_code: if timed_out {
                            TIMEOUT_EXIT
                        } else {
                            exit_code(c, exited, &status)
                        },
                        stdout: Vec::new(),
                        stderr: Vec::new(),
                        timed_out,
                        truncated: self.cap.truncated(),
                    };
                    let _ = tx.send(Ok(ExecChunk::Finished(result))).await;
                    return;
                }
                Some(Ok(_)) => continue,
            };
            let kept = self.cap.take(&data);
            if !kept.is_empty() {
                let chunk = ExecChunk::Output {
                    stream: kind,
                    data: kept.to_vec(),
                };
                if tx.send(Ok(chunk)).await.is_err() {
                    self.kill().await;
                    return;
                }
            }
        }
    }
}

impl Runtime for E2bRuntime {
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
        assert!(E2bConfig::from_vars(vars(&[])).unwrap().is_none());
        let e = E2bConfig::from_vars(vars(&[("GROVE_E2B_API_KEY", "e2b_secret")])).unwrap_err();
        assert!(!e.to_string().contains("e2b_secret"), "{e}");
        let base = [
            ("GROVE_E2B_API_URL", "https://api.e2b.dev"),
            ("GROVE_E2B_API_KEY", "e2b_secret"),
        ];
        let c = E2bConfig::from_vars(vars(&base)).unwrap().unwrap();
        assert!(c.auto_pause && c.timeout_secs == 900 && c.template == "base");
        assert!(!format!("{c:?}").contains("e2b_secret"));
        let mut bad = base.to_vec();
        bad.push(("GROVE_E2B_ENVD_URL", "https://envd.example"));
        assert!(
            E2bConfig::from_vars(vars(&bad)).is_err(),
            "a template without {{sandbox_id}}"
        );
        let mut off = base.to_vec();
        off.push(("GROVE_E2B_AUTO_PAUSE", "false"));
        assert!(
            !E2bConfig::from_vars(vars(&off))
                .unwrap()
                .unwrap()
                .auto_pause
        );
    }

    #[test]
    fn signals_become_128_plus_their_number() {
        assert_eq!(exit_code(3, true, "exit status 3"), 3);
        assert_eq!(exit_code(-1, false, "signal: killed"), 137);
        assert_eq!(exit_code(-1, false, "signal: terminated"), 143);
    }
}
