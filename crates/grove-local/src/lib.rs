//! grove-local: the local process runtime, isolated by bubblewrap (bwrap) when it works.
//!
//! With a working bwrap every command runs in fresh pid/ipc/uts (and, for network
//! `none`, net) namespaces, sees the host root read-only with `/tmp`, `/root`, `/home`,
//! `/run` and the caller's hidden dirs replaced by empty tmpfs, and sees grove's data
//! only through the spec's mounts; a read-only workspace is a `--ro-bind`, enforced by
//! the kernel. Without bwrap the runtime still runs read-class commands directly on
//! the host, but reports `isolated: false` and refuses mutating ones: a write-capable
//! request never falls back silently to a host subprocess.
//!
//! With the exec agent (`grove-sandboxd`, found via `$GROVE_SANDBOXD` or next to the
//! running executable) the sandbox is built once per view (workspace, writability,
//! network) and kept: the agent runs inside it and fork/execs each command on request,
//! which saves bwrap's namespace setup per exec (ADR 18). Without it, or when it cannot
//! start, every command gets a sandbox of its own as above.
//!
//! Every command starts from an empty environment plus `PATH` (the usual system dirs),
//! `HOME=/tmp` and `LANG=C.UTF-8`, then the spec's env, then the request's env (the
//! request wins).
//!
//! # Optional capabilities
//!
//! Interactive sessions ([`grove_core::ports::Sessions`]) only with bubblewrap: a
//! session is one process started exactly as an exec is (same sandbox, same argv
//! prefix, no timeout) with its stdin a pipe fed by writes. The provider holds the
//! sessions in memory; they die with the process holding it (`--die-with-parent`).
//! Without isolation there are no sessions (`sessions()` is `None`): an interactive
//! shell on the host unsandboxed is what the security rules forbid. No snapshots (a
//! local runtime has no state outside the workspace) and no preview URLs (the
//! sandbox's network is either none or the host's own, where a port needs no URL).

mod agent;
mod jail;
mod process;
mod sandbox;
mod seccomp;

pub use agent::{AGENT_ENV, AGENT_FILE};
pub use jail::{LimitMode, DEFAULT_MEMORY_MB, DEFAULT_PIDS};
pub use seccomp::denied_syscalls;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt};
use grove_core::error::RuntimeError;
use grove_core::identity::SandboxIdentity;
use grove_core::ports::{
    ExecChunk, ExecRequest, NetworkPolicy, Runtime, RuntimeCapabilities, RuntimeProvider,
    RuntimeSpec, SessionId, SessionInfo, SessionInput, SessionOutput, SessionRequest, Sessions,
};
use grove_core::session::{SessionTable, Started};
use grove_core::validate::{validate_command, validate_env};
use grove_sandboxd::host::workdir::{self, Placed};

/// Output kept per command (stdout + stderr combined) when the request names no cap.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 1024 * 1024;

/// Environment variable naming the bwrap binary, overriding the `PATH` lookup.
pub const BWRAP_ENV: &str = "GROVE_BWRAP";

/// How long `detect` waits for the probe before declaring bwrap unusable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
enum Isolation {
    Bwrap(PathBuf),
    /// Why there is none; shown in logs and to tests.
    Unavailable(String),
}

/// Runs commands as local processes; see the crate docs for what it isolates.
#[derive(Debug, Clone)]
pub struct LocalRuntimeProvider {
    isolation: Isolation,
    /// Who commands run as (when the worker is root) and under which limits.
    jail: std::sync::Arc<jail::Jail>,
    hidden: Vec<PathBuf>,
    sessions: SessionHolder,
    /// The exec agents, when isolation works and the agent binary was found.
    agents: Option<std::sync::Arc<agent::AgentPool>>,
}

/// The interactive sessions of a provider (shared by its clones).
#[derive(Clone, Default)]
struct SessionHolder(std::sync::Arc<SessionTable>);

impl std::fmt::Debug for SessionHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionHolder({} sessions)", self.0.list().len())
    }
}

impl LocalRuntimeProvider {
    /// [`Self::detect_hiding`] for the deployment of `$GROVE_HOME` at `home`, hiding
    /// `home` from commands (what the worker uses).
    pub fn detect(home: &Path) -> Self {
        Self::detect_hiding(home, vec![home.to_path_buf()])
    }

    /// Finds bwrap (`$GROVE_BWRAP`, else `bwrap` on `PATH`) and checks once that it
    /// works here. `home` is the deployment's `$GROVE_HOME`: its runtimes' cgroups live
    /// under a directory of that deployment alone. `hidden` are host dirs commands must
    /// not see; the spec's mounts inside them are bound back on top.
    pub fn detect_hiding(home: &Path, hidden: Vec<PathBuf>) -> Self {
        let (jail, identity_error) = make_jail(home);
        let isolation = match (find_bwrap(), identity_error) {
            (_, Some(why)) => Isolation::Unavailable(why),
            (None, None) => Isolation::Unavailable(format!(
                "bwrap not found (install bubblewrap or set {BWRAP_ENV})"
            )),
            (Some(path), None) => match probe(&path, &jail) {
                Ok(()) => Isolation::Bwrap(path),
                Err(why) => Isolation::Unavailable(format!(
                    "bwrap at {} does not work here: {why}",
                    path.display()
                )),
            },
        };
        if let Isolation::Unavailable(why) = &isolation {
            tracing::warn!(
                reason = %why,
                "local runtime without OS isolation: only non-mutating commands will run"
            );
        }
        let agent = match &isolation {
            Isolation::Bwrap(_) => match agent::find_agent() {
                Ok(path) => {
                    tracing::info!(agent = %path.display(), "local runtime: execs go through the in-sandbox exec agent");
                    Some(path)
                }
                Err(why) => {
                    tracing::warn!(
                        reason = %why,
                        "local runtime without its exec agent: every exec builds its own sandbox"
                    );
                    None
                }
            },
            Isolation::Unavailable(_) => None,
        };
        Self {
            isolation,
            jail,
            hidden,
            sessions: SessionHolder::default(),
            agents: None,
        }
        .with_agent(agent)
    }

    /// Uses the exec agent at `binary` (or none: every exec builds its own sandbox).
    /// Without isolation there is no sandbox to start it in and this does nothing.
    pub fn with_agent(mut self, binary: Option<PathBuf>) -> Self {
        // bwrap, as the sandbox identity, must reach the binary to bind it.
        let binary = binary.filter(|b| match self.jail.drop_to {
            None => true,
            Some((uid, _)) => jail::grant_search(b, uid)
                .map_err(|e| tracing::warn!(error = %e, "exec agent unreachable"))
                .is_ok(),
        });
        self.agents = match (&self.isolation, binary) {
            (Isolation::Bwrap(_), Some(b)) => Some(std::sync::Arc::new(agent::AgentPool::new(
                b,
                self.jail.clone(),
            ))),
            _ => None,
        };
        self
    }

    /// The exec agent binary in use, if execs go through one.
    pub fn agent(&self) -> Option<&Path> {
        self.agents.as_deref().map(agent::AgentPool::binary)
    }

    /// How many exec agents are running (one per sandbox view in use).
    pub fn running_agents(&self) -> usize {
        self.agents.as_deref().map_or(0, agent::AgentPool::len)
    }

    /// Where `detect` looks for the agent: `$GROVE_SANDBOXD`, else `grove-sandboxd`
    /// next to the running executable (or one directory up). `Err` says why none.
    pub fn find_agent() -> Result<PathBuf, String> {
        agent::find_agent()
    }

    /// A provider of the deployment at `home` that never uses bwrap (tests of the
    /// refusal path); `home` is hidden.
    pub fn without_isolation(home: &Path) -> Self {
        Self {
            isolation: Isolation::Unavailable("isolation disabled by configuration".into()),
            jail: make_jail(home).0,
            hidden: vec![home.to_path_buf()],
            sessions: SessionHolder::default(),
            agents: None,
        }
    }

    /// Exactly which protections commands run under, for `grove runtimes`; `None`
    /// without isolation (see [`Self::isolation_unavailable_reason`]).
    pub fn protections(&self) -> Option<String> {
        match &self.isolation {
            Isolation::Bwrap(_) => Some(format!(
                "bubblewrap; {}; allow-listed read-only system tree, no /sys, /proc/sys \
                 read-only; exec agent: {}",
                self.jail.describe(),
                if self.agents.is_some() { "on" } else { "off" }
            )),
            Isolation::Unavailable(_) => None,
        }
    }

    /// How a runtime's processes and memory are bounded here.
    pub fn limit_mode(&self) -> &LimitMode {
        &self.jail.limits
    }

    /// The `pids` and `memory` cgroup directories of the runtime `backend_id` (made
    /// while the runtime is in use), when limits are cgroups of our own: under
    /// `/sys/fs/cgroup/<controller>/grove-local/<deployment>/`.
    pub fn cgroup_dirs(&self, backend_id: &str) -> Option<[PathBuf; 2]> {
        self.jail
            .cgroup_dirs(&jail::cgroup_name(backend_id, Path::new("")))
    }

    /// The identity bwrap (and so every command) runs as when the worker is root;
    /// `None` when the worker is not root (it runs as the worker's own user).
    pub fn runs_as(&self) -> Option<SandboxIdentity> {
        self.jail
            .drop_to
            .map(|(uid, gid)| SandboxIdentity { uid, gid })
    }

    /// The bwrap binary in use, if isolation works.
    pub fn bwrap(&self) -> Option<&Path> {
        match &self.isolation {
            Isolation::Bwrap(p) => Some(p),
            Isolation::Unavailable(_) => None,
        }
    }

    /// Why commands are not isolated, if they are not.
    pub fn isolation_unavailable_reason(&self) -> Option<&str> {
        match &self.isolation {
            Isolation::Bwrap(_) => None,
            Isolation::Unavailable(why) => Some(why),
        }
    }

    /// [`RuntimeProvider::create`] with the concrete type.
    pub fn create_local(&self, spec: RuntimeSpec) -> Result<LocalRuntime, RuntimeError> {
        if spec.network == NetworkPolicy::Limited {
            // Never widened to `default` nor narrowed to `none` behind the caller's back.
            return Err(RuntimeError::CommandRejected(
                "network policy 'limited' is not enforceable by the local runtime".into(),
            ));
        }
        for (k, v) in &spec.env {
            validate_env(k, v).map_err(|e| RuntimeError::CommandRejected(e.to_string()))?;
        }
        let Placed {
            workdir,
            mounts,
            inside_workdir,
            workdir_writable,
        } = workdir::place(&spec.workdir, &spec.mounts)?;

        let (mode, cgroup) = match &self.isolation {
            Isolation::Bwrap(path) => {
                if let Some((uid, _)) = self.jail.drop_to {
                    for m in &mounts {
                        jail::grant_search(&m.source, uid).map_err(|e| {
                            RuntimeError::Unavailable(format!(
                                "cannot let the sandbox identity reach {}: {e}",
                                m.source.display()
                            ))
                        })?;
                    }
                }
                let name = jail::cgroup_name(&self.backend_id(&spec), &workdir);
                let pids = spec.resources.pids.unwrap_or(jail::DEFAULT_PIDS);
                let memory = spec.resources.memory_mb.unwrap_or(jail::DEFAULT_MEMORY_MB);
                let cgroup = self
                    .jail
                    .cgroup(&name, pids, memory)
                    .map_err(RuntimeError::Unavailable)?;
                let mode = Mode::Bwrap {
                    program: path.clone().into_os_string(),
                    prefix: sandbox::runtime_prefix(&self.hidden, &mounts, spec.network),
                };
                (mode, cgroup)
            }
            Isolation::Unavailable(why) => (Mode::Direct { why: why.clone() }, None),
        };
        let agent = self.agent_route(&mode, &mounts, &spec)?;
        let mut env: BTreeMap<String, String> = sandbox::BASE_ENV
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.extend(spec.env.clone());

        Ok(LocalRuntime {
            mode,
            jail: self.jail.clone(),
            cgroup,
            agent,
            workdir,
            inside_workdir,
            workdir_writable,
            env,
        })
    }

    /// How a runtime of `mode` reaches its exec agent, when the provider has agents
    /// and the runtime a sandbox view.
    fn agent_route(
        &self,
        mode: &Mode,
        mounts: &[grove_core::ports::Mount],
        spec: &RuntimeSpec,
    ) -> Result<Option<AgentRoute>, RuntimeError> {
        let route = match (mode, &self.agents) {
            (Mode::Bwrap { program, prefix }, Some(pool)) => {
                use std::os::unix::fs::MetadataExt;
                let mut mount_ids = Vec::with_capacity(mounts.len());
                for m in mounts {
                    let meta = std::fs::metadata(&m.source).map_err(|_| {
                        RuntimeError::NotFound(format!(
                            "mount source {} does not exist",
                            m.source.display()
                        ))
                    })?;
                    mount_ids.push((meta.dev(), meta.ino()));
                }
                Some(AgentRoute {
                    pool: pool.clone(),
                    key: agent::AgentKey {
                        prefix: prefix.clone(),
                        mount_ids,
                        fresh_tmp: !mounts.iter().any(|m| m.writable),
                    },
                    bwrap: program.clone(),
                    backend_id: self.backend_id(spec),
                })
            }
            _ => None,
        };
        Ok(route)
    }
}

impl RuntimeProvider for LocalRuntimeProvider {
    fn kind(&self) -> &'static str {
        "local"
    }

    /// One bubblewrap sandbox (or process tree) per exec.
    fn sandbox_per_exec(&self) -> bool {
        true
    }

    fn capabilities(&self) -> RuntimeCapabilities {
        let isolated = matches!(self.isolation, Isolation::Bwrap(_));
        RuntimeCapabilities {
            writable: isolated,
            isolated,
            network_none: isolated,
            network_limited: false,
            network_default: true,
            snapshot: false,
            preview_url: false,
            interactive_session: isolated,
        }
    }

    fn create(&self, spec: RuntimeSpec) -> BoxFuture<'_, Result<Box<dyn Runtime>, RuntimeError>> {
        Box::pin(async move {
            let runtime = self.create_local(spec)?;
            Ok(Box::new(runtime) as Box<dyn Runtime>)
        })
    }

    /// Nothing runs between execs but sessions: stopping (hibernating) or destroying
    /// the runtime ends the sessions started in it.
    fn stop(&self, backend_id: &str) -> BoxFuture<'_, Result<(), RuntimeError>> {
        self.sessions.0.kill_all_of(Some(backend_id));
        if let Some(pool) = &self.agents {
            pool.remove_backend(backend_id);
        }
        Box::pin(futures::future::ready(Ok(())))
    }

    fn destroy(&self, backend_id: &str) -> BoxFuture<'_, Result<(), RuntimeError>> {
        self.sessions.0.kill_all_of(Some(backend_id));
        if let Some(pool) = &self.agents {
            pool.remove_backend(backend_id);
        }
        // Best effort: the agent's processes may take a moment to go; an empty cgroup
        // left behind holds nothing.
        self.jail
            .remove_cgroup(&jail::cgroup_name(backend_id, Path::new("")));
        Box::pin(futures::future::ready(Ok(())))
    }

    fn sandbox_identity(&self) -> Option<SandboxIdentity> {
        match self.isolation {
            Isolation::Bwrap(_) => self.runs_as(),
            Isolation::Unavailable(_) => None,
        }
    }

    fn sessions(&self) -> Option<&dyn Sessions> {
        match self.isolation {
            Isolation::Bwrap(_) => Some(self),
            Isolation::Unavailable(_) => None,
        }
    }
}

impl Sessions for LocalRuntimeProvider {
    fn start(
        &self,
        spec: RuntimeSpec,
        req: SessionRequest,
    ) -> BoxFuture<'_, Result<SessionInfo, RuntimeError>> {
        Box::pin(async move {
            if let Isolation::Unavailable(why) = &self.isolation {
                return Err(RuntimeError::Unavailable(format!(
                    "interactive sessions need OS isolation, unavailable here ({why})"
                )));
            }
            let cap = req.buffer_bytes()?;
            self.sessions.0.check_room()?;
            let backend_id = self.backend_id(&spec);
            let runtime = self.create_local(spec)?;
            let argv = req.argv.clone();
            let mut launch = runtime.prepare(ExecRequest {
                argv: req.argv,
                cwd: req.cwd,
                env: req.env,
                timeout: None,
                stdin: None,
                max_output_bytes: Some(usize::MAX),
                mutating: req.mutating,
            })?;
            let (stdin, rx) = futures::channel::mpsc::unbounded();
            launch.stdin = process::Stdin::Channel(rx);
            let output = process::start(launch)?;
            let (info, pump) =
                self.sessions
                    .0
                    .insert(backend_id, argv, cap, Started { output, stdin })?;
            tokio::spawn(pump);
            Ok(info)
        })
    }

    fn write<'a>(
        &'a self,
        id: &'a SessionId,
        input: SessionInput,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move { self.sessions.0.write(id, input) })
    }

    fn poll<'a>(
        &'a self,
        id: &'a SessionId,
        wait: Duration,
    ) -> BoxFuture<'a, Result<SessionOutput, RuntimeError>> {
        Box::pin(self.sessions.0.poll(id, tokio::time::sleep(wait)))
    }

    fn kill<'a>(&'a self, id: &'a SessionId) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move { self.sessions.0.kill(id) })
    }

    fn info(&self, id: &SessionId) -> Result<SessionInfo, RuntimeError> {
        self.sessions.0.info(id)
    }

    fn list(&self) -> Vec<SessionInfo> {
        self.sessions.0.list()
    }
}

#[derive(Debug, Clone)]
enum Mode {
    Bwrap {
        program: OsString,
        /// Everything up to the per-command `--setenv`s.
        prefix: Vec<OsString>,
    },
    Direct {
        why: String,
    },
}

/// How a runtime reaches the exec agent of its sandbox view.
#[derive(Debug, Clone)]
struct AgentRoute {
    pool: std::sync::Arc<agent::AgentPool>,
    key: agent::AgentKey,
    bwrap: OsString,
    backend_id: String,
}

/// The runtime of one workspace. Cheap: it is a prepared command line. Without an
/// exec agent every exec is its own sandbox; with one, execs of the same sandbox view
/// share one sandbox (one agent), and no process of an exec outlives the time no exec
/// runs there (see `agent.rs`).
#[derive(Debug, Clone)]
pub struct LocalRuntime {
    mode: Mode,
    jail: std::sync::Arc<jail::Jail>,
    /// The runtime's cgroup, when limits are cgroups of our own.
    cgroup: Option<jail::Cgroup>,
    /// Where execs go first when the provider has an exec agent (isolated mode only).
    agent: Option<AgentRoute>,
    /// Canonical host path of the workspace root.
    workdir: PathBuf,
    /// The same directory as the command sees it.
    inside_workdir: PathBuf,
    workdir_writable: bool,
    /// Base env plus the spec's env.
    env: BTreeMap<String, String>,
}

impl LocalRuntime {
    /// Whether commands run under OS isolation (bwrap).
    pub fn is_isolated(&self) -> bool {
        matches!(self.mode, Mode::Bwrap { .. })
    }

    /// The bwrap argv (without the program) a request would run with; for
    /// inspection and diagnostics. Errors as `exec` would refuse the request.
    pub fn sandbox_argv(&self, req: &ExecRequest) -> Result<Vec<OsString>, RuntimeError> {
        Ok(self.prepare(req.clone())?.args)
    }

    /// The request checked (argv, env, cwd, and whether this runtime may run it) and
    /// resolved: its complete env and its cwd on the host and inside.
    fn validate(&self, req: ExecRequest) -> Result<Validated, RuntimeError> {
        validate_command(&req.argv).map_err(|e| RuntimeError::CommandRejected(e.to_string()))?;
        let mut env = self.env.clone();
        for (k, v) in &req.env {
            validate_env(k, v).map_err(|e| RuntimeError::CommandRejected(e.to_string()))?;
        }
        env.extend(req.env.clone());
        let (host_cwd, inside_cwd) = self.resolve_cwd(req.cwd.as_deref())?;
        let max_output = req.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT_BYTES);
        match &self.mode {
            Mode::Bwrap { .. } if req.mutating && !self.workdir_writable => {
                return Err(RuntimeError::CommandRejected(
                    "the workspace is mounted read-only; mutating commands are refused".into(),
                ));
            }
            Mode::Direct { why } if req.mutating => {
                return Err(RuntimeError::CommandRejected(format!(
                    "OS isolation is unavailable on this host ({why}); the local runtime \
                     refuses mutating commands rather than run them unsandboxed"
                )));
            }
            _ => {}
        }
        Ok(Validated {
            req,
            env,
            host_cwd,
            inside_cwd,
            max_output,
        })
    }

    fn prepare(&self, req: ExecRequest) -> Result<process::Launch, RuntimeError> {
        let Validated {
            req,
            env,
            host_cwd,
            inside_cwd,
            max_output,
        } = self.validate(req)?;
        let shown_name = req.argv[0].clone();

        match &self.mode {
            Mode::Bwrap { program, prefix } => {
                let mut args = prefix.clone();
                sandbox::push_env(&mut args, env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                args.push("--chdir".into());
                args.push(inside_cwd.into());
                args.push("--".into());
                args.extend(req.argv.into_iter().map(OsString::from));
                Ok(process::Launch {
                    program: program.clone(),
                    args,
                    env: Vec::new(),
                    // bwrap's own cwd is irrelevant inside; "/" avoids pinning the
                    // worker's cwd.
                    cwd: PathBuf::from("/"),
                    stdin: req
                        .stdin
                        .map_or(process::Stdin::Null, process::Stdin::Bytes),
                    timeout: req.timeout,
                    max_output,
                    sandboxed: true,
                    jail: Some(process::JailRun {
                        jail: self.jail.clone(),
                        cgroup: self.cgroup.clone(),
                    }),
                    shown_name,
                })
            }
            Mode::Direct { .. } => {
                let mut argv = req.argv.into_iter();
                let program = argv.next().expect("validated non-empty").into();
                Ok(process::Launch {
                    program,
                    args: argv.map(OsString::from).collect(),
                    env: env.into_iter().collect(),
                    cwd: host_cwd,
                    stdin: req
                        .stdin
                        .map_or(process::Stdin::Null, process::Stdin::Bytes),
                    timeout: req.timeout,
                    max_output,
                    sandboxed: false,
                    jail: None,
                    shown_name,
                })
            }
        }
    }

    /// Resolves a request's cwd to (host path, path inside the sandbox), refusing
    /// anything that is not a directory inside the workspace after resolving symlinks.
    fn resolve_cwd(&self, cwd: Option<&Path>) -> Result<(PathBuf, PathBuf), RuntimeError> {
        workdir::resolve_cwd(&self.workdir, &self.inside_workdir, cwd)
    }
}

impl LocalRuntime {
    /// The exec agent first (when there is one), else a sandbox of the exec's own.
    async fn start(
        &self,
        req: ExecRequest,
    ) -> Result<BoxStream<'static, Result<ExecChunk, RuntimeError>>, RuntimeError> {
        let Some(cgroup) = self.cgroup.clone() else {
            return self.start_unwatched(req).await;
        };
        let before = cgroup.hits();
        let stream = self.start_unwatched(req).await?;
        // A command that hit a limit ends as `resource_limit`, not as an exit code.
        Ok(stream
            .map(move |item| match item {
                Ok(ExecChunk::Finished(r)) => match cgroup.hit_since(before) {
                    Some(why) => Err(RuntimeError::ResourceLimit(format!(
                        "{why} (exit {}{})",
                        r.exit_code,
                        if r.timed_out { ", timed out" } else { "" }
                    ))),
                    None => Ok(ExecChunk::Finished(r)),
                },
                other => other,
            })
            .boxed())
    }

    /// [`Self::start`] without the limit check.
    async fn start_unwatched(
        &self,
        req: ExecRequest,
    ) -> Result<BoxStream<'static, Result<ExecChunk, RuntimeError>>, RuntimeError> {
        let Some(route) = &self.agent else {
            return process::start(self.prepare(req)?);
        };
        let v = self.validate(req.clone())?;
        let exec = agent::AgentExec {
            argv: v.req.argv,
            cwd: v.inside_cwd.to_string_lossy().into_owned(),
            env: v.env.into_iter().collect(),
            stdin: v.req.stdin,
            timeout: v.req.timeout,
            max_output: v.max_output,
        };
        match route
            .pool
            .exec(
                &route.key,
                &route.bwrap,
                &route.backend_id,
                self.cgroup.as_ref(),
                exec,
            )
            .await
        {
            Ok(stream) => Ok(stream),
            Err(agent::NotTaken(why)) => {
                tracing::warn!(
                    reason = %why,
                    backend_id = %route.backend_id,
                    "exec agent unavailable; this exec builds its own sandbox"
                );
                process::start(self.prepare(req)?)
            }
        }
    }
}

/// A request that passed [`LocalRuntime::validate`].
struct Validated {
    req: ExecRequest,
    env: BTreeMap<String, String>,
    host_cwd: PathBuf,
    inside_cwd: PathBuf,
    max_output: usize,
}

impl Runtime for LocalRuntime {
    fn exec_stream(
        &self,
        req: ExecRequest,
    ) -> BoxFuture<'_, Result<BoxStream<'static, Result<ExecChunk, RuntimeError>>, RuntimeError>>
    {
        Box::pin(self.start(req))
    }
}

/// The jail of this process: the sandbox identity from the environment, and the
/// reason isolation is off when that identity is invalid.
fn make_jail(home: &Path) -> (std::sync::Arc<jail::Jail>, Option<String>) {
    let (identity, error) = match SandboxIdentity::from_env() {
        Ok(id) => (id, None),
        Err(e) => (
            SandboxIdentity::DEFAULT,
            Some(format!("invalid sandbox identity: {e}")),
        ),
    };
    (
        std::sync::Arc::new(jail::Jail::detect(
            (identity.uid, identity.gid),
            jail::Deployment::of_home(home),
        )),
        error,
    )
}

fn find_bwrap() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(BWRAP_ENV).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("bwrap"))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Runs `true` under the same setup a command gets; blocking, once per `detect`.
fn probe(bwrap: &Path, jail: &jail::Jail) -> Result<(), String> {
    let (mut cmd, seccomp_fd) = jail.command(bwrap.as_os_str(), &sandbox::probe_args(), None)?;
    let spawned = cmd
        .env_clear()
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn();
    drop(seccomp_fd);
    let mut child = spawned.map_err(|e| format!("cannot start it: {e}"))?;
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("the probe did not finish in time".into());
            }
            Err(e) => return Err(format!("waiting for the probe failed: {e}")),
        }
    };
    if status.success() {
        return Ok(());
    }
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    Err(format!(
        "probe exited with {status}: {}",
        stderr.lines().next().unwrap_or("").trim()
    ))
}
