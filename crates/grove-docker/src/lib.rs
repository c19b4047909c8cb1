//! grove-docker: the Docker runtime of grove, driven through bollard (never the
//! `docker` CLI).
//!
//! One long-lived container per workspace runtime. The container's main process is a
//! long `sleep` under Docker's init (`docker-init`, which reaps zombies); every command
//! is a Docker exec in it. The workspace is a bind mount, so files, installed
//! dependencies and git state in the workspace outlive `stop` (hibernate), `start` and
//! `destroy` (which removes the container and never touches a host directory).
//!
//! # Container config (what [`DockerRuntimeProvider::create_docker`] asks the engine for)
//!
//! - name `grove-rt-<runtime id>`: the runtime id is the spec's `grove.runtime` label,
//!   else `spec-<hash of the spec>`; a retried create finds the container by name and
//!   re-attaches (starting it if stopped) instead of making a second one;
//! - labels [`LABEL_MANAGED`]`=true`, [`LABEL_WORKSPACE`], [`LABEL_RUNTIME`],
//!   [`LABEL_SPEC`] (hash of the whole config), the provider's scope labels and the
//!   spec's labels;
//! - `Entrypoint ["sleep"]`, `Cmd ["2147483647"]`, `HostConfig.Init = true`;
//! - `User`: the provider's configured user, else the owner `uid:gid` of
//!   `spec.workdir` when that is not root, else [`fallback_user`], the sandbox
//!   identity shared with the local runtime (`GROVE_SANDBOX_UID`/`GID`, default
//!   60100:60100). A user resolving to uid 0 is refused. With a root-owned workspace
//!   the caller hands the workspace over to that identity first
//!   ([`RuntimeProvider::sandbox_identity`]) (or configures a user that can write it);
//! - `Env`: `PATH`, `HOME=/tmp`, `LANG=C.UTF-8`, then the spec's env. Nothing from the
//!   worker's environment. Each exec adds its request's env;
//! - `HostConfig.Mounts`: exactly the spec's mounts as bind mounts, read-only unless
//!   `Mount.writable` (plus the workdir read-only if no mount covers it), and, when an
//!   exec agent is configured, its binary read-only at [`agent::INSIDE_PATH`]. No
//!   other host path;
//! - `HostConfig`: `CapDrop ["ALL"]`, `SecurityOpt ["no-new-privileges"]`,
//!   `Privileged false`, `PidsLimit` (default [`DEFAULT_PIDS`]), `Memory` =
//!   `MemorySwap` (no swap; default [`DEFAULT_MEMORY_MB`] MiB), `NanoCpus` (default
//!   [`DEFAULT_CPUS`], clamped to the engine's CPU count), `NetworkMode "none"` unless
//!   the spec asks for `Default` (`bridge`); `Limited` is refused with
//!   `CommandRejected`, never widened; `IpcMode "private"`, `RestartPolicy no`, log
//!   driver `none` (exec output never reaches container logs).
//!
//! # The exec agent
//!
//! With [`agent::AGENT_ENV`] naming a statically linked `grove-sandboxd`
//! ([`DockerRuntimeProvider::with_exec_agent`]), each container's first command starts
//! the agent as one attached engine exec, and every command but a session is then a
//! frame on its stdin: no engine exec per command (ADR 18). The agent gives a command
//! the container's env (with the engine's `HOSTNAME`) plus the request's, its own
//! session, the cap, and kills its group on timeout, on drop and after it ends. The
//! counters below are read around agent commands too (inside: through the agent).
//! Unset (the default), or an agent that does not start: engine execs, as described
//! below.
//!
//! # Scratch directories
//!
//! A read-only (analysis) runtime's commands each start on emptied `/tmp`,
//! `/var/tmp`, `/dev/shm`, `/run/lock` and `$HOME` (`fresh.rs`); edit and task
//! runtimes keep theirs for the container's life.
//!
//! # Timeouts, drops and stragglers
//!
//! Docker starts each exec as its own session and process-group leader. When a
//! command times out, its stream is dropped, or it exits leaving background processes,
//! the provider kills from the host every process in the container's cgroup whose
//! process group or session is the exec's (`SIGKILL`, repeated until none is left),
//! so the whole tree dies and the container stays up. This needs the worker to see
//! the engine's `/proc` (a local engine, worker as root or as the container user).
//! Where it cannot, the provider restarts the container instead (which also kills
//! other commands running in it) and logs a warning.
//!
//! # Resource limits
//!
//! The memory and pids cgroup counters of the container are read before and after
//! each command (`oom_kill` in `memory.oom_control` / `memory.events`, `max` in
//! `pids.events`; from the host when it can see them, else by a helper exec of `sh`
//! inside the container before and after the command, which costs two extra execs).
//! Docker 20.10 does not set `State.OOMKilled` when the OOM killer takes an exec's
//! process rather than the container's init, so the counters are the reliable signal. A command during which the OOM killer struck
//! or a fork was refused by the pids limit returns [`RuntimeError::ResourceLimit`];
//! the container is started again if the OOM killer took its init. A limit hit by
//! another command running concurrently in the same container is attributed to every
//! command that overlapped it.
//!
//! # Interactive sessions
//!
//! [`grove_core::ports::Sessions`]: a session is a Docker exec with attached stdin in
//! the workspace's container (created or re-attached to as for an exec), run without
//! timeout through the same code as an exec, so killing it (or dropping it) kills its
//! process tree as a timeout would. The provider holds its sessions in memory: they end
//! with the worker process holding it (the drop kills them) and with the container
//! (`stop` and `destroy` end every session of that container first).
//!
//! # Snapshots and preview URLs
//!
//! [`grove_core::ports::Snapshotter`] (module [`snapshot`]): the container committed to
//! a local image `grove-snapshot:<runtime id>-<random>` (bind mounts, so the workspace,
//! are not part of it); restore creates the spec's runtime from that image. Images are
//! kept until removed with the engine's tools.
//!
//! [`grove_core::ports::PreviewUrls`] (module [`preview`]): a port of a runtime with
//! network `default` published on `127.0.0.1:<random>` by a relay in the provider's
//! process; with network `none` exposing a port is `CommandRejected`.
//!
//! # Orphans
//!
//! [`DockerRuntimeProvider::sweep_orphans`] removes every container labelled
//! [`LABEL_MANAGED`]`=true` (and carrying the provider's scope labels, if any) whose
//! [`LABEL_RUNTIME`] is not in the owned set. Scope labels
//! ([`DockerRuntimeProvider::with_scope_label`]) keep several workers, nodes or test
//! runs on one engine from sweeping each other's containers.
//!
//! # Layout
//! - `plan`: a spec checked and resolved into the container that serves it.
//! - `inner`: what every exec of one runtime shares, and the engine calls around an
//!   exec; imports only `agent` and `host`.
//! - `exec`: one command as an engine exec, or through the agent.
//! - [`agent`]: the transport of the exec agent (`grove_sandboxd::host::client`) and
//!   its pool, one agent per container.
//! - `fresh`: emptied scratch directories for a read-only runtime's command.
//! - `host`: the container's processes and counters seen from the host.
//! - [`image`], [`preview`], [`snapshot`]: images, preview relays, snapshots.

pub mod agent;
mod exec;
mod fresh;
mod host;
pub mod image;
mod inner;
mod plan;
pub mod preview;
pub mod snapshot;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bollard::errors::Error as BollardError;
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use bollard::Docker;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use grove_core::error::RuntimeError;
use grove_core::ports::{
    ExecChunk, ExecRequest, Runtime, RuntimeCapabilities, RuntimeProvider, RuntimeSpec, SessionId,
    SessionInfo, SessionInput, SessionOutput, SessionRequest, Sessions,
};
use grove_core::session::{SessionTable, Started};
use grove_core::validate::{validate_command, validate_env};
use grove_sandboxd::host::workdir;

pub use bollard;

/// Label present (`true`) on every container this crate creates; what sweeps look for.
pub const LABEL_MANAGED: &str = "grove.managed";
/// The workspace id (copied from the spec's label of the same name).
pub const LABEL_WORKSPACE: &str = "grove.workspace";
/// The runtime id; the container is named [`CONTAINER_PREFIX`] + this.
pub const LABEL_RUNTIME: &str = "grove.runtime";
/// The `$GROVE_HOME` of the deployment that made the container (its absolute path):
/// any worker on the engine removes a managed container whose home no longer exists
/// ([`DockerRuntimeProvider::sweep_homeless`]).
pub const LABEL_HOME_PATH: &str = "grove.home_path";
/// Hash of the container config; a spec that hashes differently replaces the container.
pub const LABEL_SPEC: &str = "grove.spec";
/// Prefix of every container name.
pub const CONTAINER_PREFIX: &str = "grove-rt-";

/// Default pids limit of a container.
pub const DEFAULT_PIDS: u64 = 512;
/// Default memory limit (MiB); swap is off.
pub const DEFAULT_MEMORY_MB: u64 = 1024;
/// Default CPU limit, clamped to the engine's CPU count.
pub const DEFAULT_CPUS: f64 = 2.0;
/// User of the container when none is configured and the workspace is owned by root:
/// the sandbox identity (the local runtime's too), `uid:gid`.
pub fn fallback_user() -> String {
    sandbox_identity().user_spec()
}

fn sandbox_identity() -> grove_core::identity::SandboxIdentity {
    grove_core::identity::SandboxIdentity::from_env()
        .unwrap_or(grove_core::identity::SandboxIdentity::DEFAULT)
}
/// Output kept per command (stdout + stderr combined) when the request names no cap.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 1024 * 1024;

/// `PATH` of every container (the usual system dirs).
pub const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long `stop` lets the container's init end before the engine kills it.
const STOP_TIMEOUT_SECS: i32 = 3;

/// A container this provider manages, as listed by the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    pub id: String,
    /// Without the leading `/`.
    pub name: String,
    /// `running`, `exited`, `created`, ...
    pub state: String,
    pub labels: BTreeMap<String, String>,
    /// Creation time, seconds since the epoch.
    pub created: i64,
}

impl ContainerInfo {
    /// The runtime id from its label.
    pub fn runtime_id(&self) -> Option<&str> {
        self.labels.get(LABEL_RUNTIME).map(String::as_str)
    }
}

/// Runs each workspace runtime as one long-lived Docker container.
#[derive(Clone)]
pub struct DockerRuntimeProvider {
    docker: Docker,
    default_image: Option<String>,
    user: Option<String>,
    scope: BTreeMap<String, String>,
    /// The `$GROVE_HOME` put on containers as [`LABEL_HOME_PATH`].
    home_path: Option<PathBuf>,
    host_access: bool,
    /// Interactive sessions started by this provider (shared by its clones).
    sessions: Arc<SessionTable>,
    /// Ports published on loopback by [`preview`] (shared by its clones).
    previews: Arc<preview::Relays>,
    /// The exec agents (module [`agent`]), when an agent binary is configured.
    agents: Option<Arc<agent::Pool>>,
}

impl std::fmt::Debug for DockerRuntimeProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerRuntimeProvider")
            .field("default_image", &self.default_image)
            .field("user", &self.user)
            .field("scope", &self.scope)
            .field("host_access", &self.host_access)
            .field("exec_agent", &self.agents.as_ref().map(|p| p.binary()))
            .finish()
    }
}

impl DockerRuntimeProvider {
    /// What every Docker runtime offers (also listed when no engine answers).
    pub const CAPABILITIES: RuntimeCapabilities = RuntimeCapabilities {
        writable: true,
        isolated: true,
        network_none: true,
        network_limited: false,
        network_default: true,
        snapshot: true,
        preview_url: true,
        interactive_session: true,
    };

    /// Connects to the engine named by `DOCKER_HOST` (a `unix://` socket), else
    /// `/var/run/docker.sock`, negotiates the API version and pings it.
    pub async fn connect() -> Result<Self, RuntimeError> {
        let docker = Docker::connect_with_defaults()
            .map_err(|e| RuntimeError::Unavailable(format!("cannot reach a Docker engine: {e}")))?;
        Self::from_client(docker).await
    }

    /// Connects to the engine on the unix socket at `path`.
    pub async fn connect_unix(path: &str) -> Result<Self, RuntimeError> {
        let docker =
            Docker::connect_with_unix(path, 120, bollard::API_DEFAULT_VERSION).map_err(|e| {
                RuntimeError::Unavailable(format!("cannot reach a Docker engine at {path}: {e}"))
            })?;
        Self::from_client(docker).await
    }

    /// Uses an existing client: negotiates the API version and pings the engine.
    pub async fn from_client(docker: Docker) -> Result<Self, RuntimeError> {
        let docker = docker
            .negotiate_version()
            .await
            .map_err(|e| RuntimeError::Unavailable(format!("no Docker engine answers: {e}")))?;
        let provider = Self {
            docker,
            default_image: None,
            user: None,
            scope: BTreeMap::new(),
            home_path: None,
            host_access: true,
            sessions: Arc::default(),
            previews: Arc::default(),
            agents: None,
        };
        provider.ping().await?;
        let agent = match agent::from_env() {
            Ok(found) => found,
            Err(why) => {
                tracing::warn!(reason = %why, "no exec agent for Docker containers; every \
                    command is an engine exec");
                None
            }
        };
        if let Some(binary) = &agent {
            tracing::info!(binary = %binary.display(), "exec agent for Docker containers");
        }
        Ok(provider.with_exec_agent(agent))
    }

    /// The exec agent (a statically linked `grove-sandboxd`, see [`agent`]) to mount
    /// into every container this provider creates, or `None` for none: every command
    /// is then an engine exec. [`Self::connect`] takes it from
    /// [`agent::AGENT_ENV`]. A binary that cannot run in containers
    /// ([`agent::check_binary`]) is refused by the caller, not here.
    pub fn with_exec_agent(mut self, binary: Option<PathBuf>) -> Self {
        self.agents = binary.map(|b| Arc::new(agent::Pool::new(b)));
        self
    }

    /// How many container agents the provider knows (tests).
    pub fn exec_agents(&self) -> usize {
        self.agents.as_ref().map_or(0, |p| p.len())
    }

    /// The image used when a spec names none.
    pub fn with_default_image(mut self, image: impl Into<String>) -> Self {
        self.default_image = Some(image.into()).filter(|s: &String| !s.is_empty());
        self
    }

    /// The container user (`uid:gid`, `uid` or a name the image knows) instead of the
    /// workspace owner. A user resolving to root is refused at create time.
    pub fn with_user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// A label put on every container this provider creates and required on every
    /// container it lists or sweeps (e.g. `grove.node=<name>`).
    pub fn with_scope_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.scope.insert(key.into(), value.into());
        self
    }

    /// Labels every container this provider creates with its deployment's home
    /// ([`LABEL_HOME_PATH`]), so that once that directory is gone any worker on the
    /// engine sweeps them ([`Self::sweep_homeless`]).
    pub fn with_home_path(mut self, home: impl Into<PathBuf>) -> Self {
        self.home_path = Some(home.into());
        self
    }

    /// Whether to use the host's `/proc` and cgroup files (killing process trees,
    /// reading limit counters). On by default; without it timeouts restart the
    /// container and counters are read inside the container. For tests and for
    /// workers that do not share the engine's host.
    pub fn with_host_access(mut self, enabled: bool) -> Self {
        self.host_access = enabled;
        self
    }

    /// The bollard client.
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// The default image, if one is configured.
    pub fn default_image(&self) -> Option<&str> {
        self.default_image.as_deref()
    }

    /// One cheap round trip to the engine.
    pub async fn ping(&self) -> Result<(), RuntimeError> {
        self.docker
            .ping()
            .await
            .map(|_| ())
            .map_err(|e| RuntimeError::Unavailable(format!("no Docker engine answers: {e}")))
    }

    /// The container name of a runtime id.
    pub fn container_name(runtime_id: &str) -> String {
        format!("{CONTAINER_PREFIX}{runtime_id}")
    }

    /// The runtime id in a container name made by [`Self::container_name`].
    pub fn runtime_id_of(container_name: &str) -> Option<&str> {
        container_name
            .trim_start_matches('/')
            .strip_prefix(CONTAINER_PREFIX)
    }

    /// [`RuntimeProvider::create`] with the concrete type: finds the container of the
    /// spec's runtime by name (re-attaching, starting it if stopped, replacing it if
    /// its config hash differs) or creates and starts it.
    pub async fn create_docker(&self, spec: RuntimeSpec) -> Result<DockerRuntime, RuntimeError> {
        let plan = self.plan(&spec).await?;
        let name = Self::container_name(&plan.runtime_id);
        let mut attempts = 0;
        let id = loop {
            attempts += 1;
            if attempts > 40 {
                return Err(RuntimeError::Conflict(format!(
                    "container {name} keeps changing under concurrent creates"
                )));
            }
            if attempts > 1 {
                // A concurrent create holds the name but has not registered the
                // container yet (inspect says 404, create says 409): give it a moment.
                tokio::time::sleep(Duration::from_millis(25 * attempts.min(8))).await;
            }
            match self
                .docker
                .inspect_container(&name, None::<InspectContainerOptions>)
                .await
            {
                Ok(existing) => {
                    let labels = existing
                        .config
                        .as_ref()
                        .and_then(|c| c.labels.clone())
                        .unwrap_or_default();
                    if labels.get(LABEL_MANAGED).map(String::as_str) != Some("true") {
                        return Err(RuntimeError::Conflict(format!(
                            "a container named {name} exists and is not managed by grove"
                        )));
                    }
                    let id = existing.id.clone().unwrap_or_else(|| name.clone());
                    if labels.get(LABEL_SPEC) != Some(&plan.hash) {
                        tracing::info!(
                            container = %name,
                            "runtime spec changed; replacing the container (the workspace stays)"
                        );
                        self.remove(&id).await?;
                        continue;
                    }
                    let running = existing
                        .state
                        .as_ref()
                        .and_then(|s| s.running)
                        .unwrap_or(false);
                    if !running {
                        self.start(&id).await?;
                    }
                    break id;
                }
                Err(e) if status(&e) == Some(404) => {
                    let options = CreateContainerOptionsBuilder::default().name(&name).build();
                    match self
                        .docker
                        .create_container(Some(options), plan.body.clone())
                        .await
                    {
                        Ok(created) => {
                            if let Err(e) = self.start(&created.id).await {
                                // A container that cannot start is useless; do not leave it.
                                let _ = self.remove(&created.id).await;
                                return Err(e);
                            }
                            break created.id;
                        }
                        // Someone else created it meanwhile: attach to theirs.
                        Err(e) if status(&e) == Some(409) => continue,
                        Err(e) => return Err(create_error(&e, &plan.image)),
                    }
                }
                Err(e) => return Err(engine_error("inspecting the container", &e)),
            }
        };
        let cgroups = if self.host_access {
            self.host_cgroups(&id).await
        } else {
            None
        };
        Ok(DockerRuntime {
            inner: Arc::new(inner::Inner {
                docker: self.docker.clone(),
                container_id: id,
                name,
                runtime_id: plan.runtime_id,
                host_workdir: plan.host_workdir,
                inside_workdir: plan.inside_workdir,
                workdir_writable: plan.workdir_writable,
                memory_mb: plan.memory_mb,
                pids: plan.pids,
                host_access: self.host_access,
                cgroups: std::sync::Mutex::new(cgroups),
                agents: self.agents.clone(),
                env: plan.env,
            }),
        })
    }

    /// Starts a container (by name or id); a running one is left alone.
    pub async fn start(&self, name: &str) -> Result<(), RuntimeError> {
        match self.docker.start_container(name, None).await {
            Ok(()) => Ok(()),
            Err(e) if status(&e) == Some(304) => Ok(()),
            Err(e) if status(&e) == Some(404) => Err(RuntimeError::NotFound(format!(
                "container {name} does not exist"
            ))),
            Err(e) => Err(start_error(&e)),
        }
    }

    /// Stops (hibernates) a container: its processes end, the container and the
    /// workspace stay. Stopping a stopped container is fine.
    pub async fn stop(&self, name: &str) -> Result<(), RuntimeError> {
        if let Some(pool) = &self.agents {
            pool.forget(name);
        }
        let options = StopContainerOptionsBuilder::default()
            .t(STOP_TIMEOUT_SECS)
            .build();
        match self.docker.stop_container(name, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) if status(&e) == Some(304) => Ok(()),
            Err(e) if status(&e) == Some(404) => Err(RuntimeError::NotFound(format!(
                "container {name} does not exist"
            ))),
            Err(e) => Err(engine_error("stopping the container", &e)),
        }
    }

    /// Removes a container (running or not). Bind-mounted host directories are never
    /// touched. Returns whether there was one to remove.
    pub async fn destroy(&self, name: &str) -> Result<bool, RuntimeError> {
        self.remove(name).await
    }

    async fn remove(&self, name: &str) -> Result<bool, RuntimeError> {
        if let Some(pool) = &self.agents {
            pool.forget(name);
        }
        let options = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match self.docker.remove_container(name, Some(options)).await {
            Ok(()) => Ok(true),
            Err(e) if status(&e) == Some(404) => Ok(false),
            // Removal already in progress (a concurrent destroy).
            Err(e) if status(&e) == Some(409) => Ok(false),
            Err(e) => Err(engine_error("removing the container", &e)),
        }
    }

    /// Managed containers (in this provider's scope) carrying `key=value`, running
    /// or not.
    pub async fn list_by_label(
        &self,
        key: &str,
        value: &str,
    ) -> Result<Vec<ContainerInfo>, RuntimeError> {
        self.list(&[(key, value)]).await
    }

    /// All managed containers in this provider's scope.
    pub async fn list_managed(&self) -> Result<Vec<ContainerInfo>, RuntimeError> {
        self.list(&[]).await
    }

    async fn list(&self, extra: &[(&str, &str)]) -> Result<Vec<ContainerInfo>, RuntimeError> {
        let mut labels = vec![format!("{LABEL_MANAGED}=true")];
        labels.extend(self.scope.iter().map(|(k, v)| format!("{k}={v}")));
        labels.extend(extra.iter().map(|(k, v)| format!("{k}={v}")));
        self.list_labelled(labels).await
    }

    /// Removes managed containers of any scope whose [`LABEL_HOME_PATH`] names a
    /// directory that no longer exists (a deployment or test run whose `$GROVE_HOME`
    /// was deleted: no worker of its own is left to sweep them), sparing those younger
    /// than `grace`. Only with host access (the paths are the engine host's); a label
    /// that is not an absolute path, or a path whose existence cannot be told (not
    /// "not found"), keeps its container. Returns the names removed.
    pub async fn sweep_homeless(&self, grace: Duration) -> Result<Vec<String>, RuntimeError> {
        if !self.host_access {
            return Ok(Vec::new());
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let mut removed = Vec::new();
        let labels = vec![format!("{LABEL_MANAGED}=true"), LABEL_HOME_PATH.to_string()];
        for c in self.list_labelled(labels).await? {
            let Some(home) = c.labels.get(LABEL_HOME_PATH).map(Path::new) else {
                continue;
            };
            let gone = home.is_absolute()
                && matches!(std::fs::symlink_metadata(home), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
            if !gone || now - c.created < grace.as_secs() as i64 {
                continue;
            }
            if self.remove(&c.id).await? {
                tracing::info!(container = %c.name, home = %home.display(), "removed a runtime container whose GROVE_HOME is gone");
                removed.push(c.name);
            }
        }
        Ok(removed)
    }

    async fn list_labelled(&self, labels: Vec<String>) -> Result<Vec<ContainerInfo>, RuntimeError> {
        let filters: HashMap<String, Vec<String>> = [("label".to_string(), labels)].into();
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let found = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|e| engine_error("listing containers", &e))?;
        Ok(found
            .into_iter()
            .map(|c| ContainerInfo {
                id: c.id.unwrap_or_default(),
                name: c
                    .names
                    .and_then(|n| n.into_iter().next())
                    .map(|n| n.trim_start_matches('/').to_string())
                    .unwrap_or_default(),
                state: c.state.map(|s| s.to_string()).unwrap_or_default(),
                labels: c.labels.unwrap_or_default().into_iter().collect(),
                created: c.created.unwrap_or(0),
            })
            .collect())
    }

    /// Removes every managed container in this provider's scope whose runtime id
    /// (label [`LABEL_RUNTIME`]) is not in `owned`, and returns the names of those it
    /// removed. A container created a moment ago by another worker whose record is not
    /// committed yet is an orphan too: callers that sweep while others create pass
    /// only containers older than a grace period, see [`Self::sweep_orphans_older_than`].
    pub async fn sweep_orphans(
        &self,
        owned: &HashSet<String>,
    ) -> Result<Vec<String>, RuntimeError> {
        self.sweep_orphans_older_than(owned, Duration::ZERO).await
    }

    /// [`Self::sweep_orphans`], sparing containers created less than `grace` ago.
    pub async fn sweep_orphans_older_than(
        &self,
        owned: &HashSet<String>,
        grace: Duration,
    ) -> Result<Vec<String>, RuntimeError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let mut removed = Vec::new();
        for c in self.list_managed().await? {
            let is_owned = c.runtime_id().is_some_and(|r| owned.contains(r));
            if is_owned || now - c.created < grace.as_secs() as i64 {
                continue;
            }
            if self.remove(&c.id).await? {
                tracing::info!(container = %c.name, "removed an orphaned runtime container");
                removed.push(c.name);
            }
        }
        Ok(removed)
    }

    async fn engine_cpus(&self) -> Option<i64> {
        static NCPU: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
        if let Some(n) = NCPU.get() {
            return Some(*n);
        }
        let n = self.docker.info().await.ok()?.ncpu.filter(|n| *n > 0)?;
        Some(*NCPU.get_or_init(|| n))
    }

    async fn host_cgroups(&self, id: &str) -> Option<host::Cgroups> {
        let pid = self
            .docker
            .inspect_container(id, None::<InspectContainerOptions>)
            .await
            .ok()?
            .state?
            .pid
            .filter(|p| *p > 0)?;
        let found = host::Cgroups::of_pid(pid as u32, id);
        if found.is_none() {
            tracing::warn!(
                container = %id,
                "cannot see the container's processes or cgroup from here; timeouts will \
                 restart the container and limit counters are read inside it"
            );
        }
        found
    }
}

fn validate_runtime_id(id: &str) -> Result<(), RuntimeError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && id.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::CommandRejected(format!(
            "runtime id {id:?} must be letters, digits, '-', '_' or '.'"
        )))
    }
}

impl RuntimeProvider for DockerRuntimeProvider {
    fn kind(&self) -> &'static str {
        "docker"
    }

    /// Containers run the deployment's default image.
    fn uses_default_image(&self) -> bool {
        true
    }

    /// Without a configured user, containers of a root-owned workspace run as the
    /// sandbox identity, so a writable workspace is handed over to it first.
    fn sandbox_identity(&self) -> Option<grove_core::identity::SandboxIdentity> {
        self.user.is_none().then(sandbox_identity)
    }

    fn capabilities(&self) -> RuntimeCapabilities {
        Self::CAPABILITIES
    }

    fn sessions(&self) -> Option<&dyn Sessions> {
        Some(self)
    }

    fn snapshotter(&self) -> Option<&dyn grove_core::ports::Snapshotter> {
        Some(self)
    }

    fn preview_urls(&self) -> Option<&dyn grove_core::ports::PreviewUrls> {
        Some(self)
    }

    fn create(&self, spec: RuntimeSpec) -> BoxFuture<'_, Result<Box<dyn Runtime>, RuntimeError>> {
        Box::pin(async move {
            let runtime = self.create_docker(spec).await?;
            Ok(Box::new(runtime) as Box<dyn Runtime>)
        })
    }

    /// The container name, `grove-rt-<runtime id>`.
    fn backend_id(&self, spec: &RuntimeSpec) -> String {
        let runtime = spec
            .labels
            .get(LABEL_RUNTIME)
            .map(String::as_str)
            .unwrap_or("");
        Self::container_name(runtime)
    }

    fn stop(&self, backend_id: &str) -> BoxFuture<'_, Result<(), RuntimeError>> {
        let name = backend_id.to_string();
        // The container's processes stop with it; its sessions end as killed.
        self.sessions.kill_all_of(Some(backend_id));
        self.previews.close_of(backend_id);
        Box::pin(async move { DockerRuntimeProvider::stop(self, &name).await })
    }

    fn destroy(&self, backend_id: &str) -> BoxFuture<'_, Result<(), RuntimeError>> {
        let name = backend_id.to_string();
        self.sessions.kill_all_of(Some(backend_id));
        self.previews.close_of(backend_id);
        Box::pin(async move {
            DockerRuntimeProvider::destroy(self, &name)
                .await
                .map(|_| ())
        })
    }

    /// A runtime recorded as running is healthy while its container exists and runs; a
    /// container that vanished, exited or died (e.g. its init was OOM-killed) is not.
    fn healthy(&self, backend_id: &str) -> BoxFuture<'_, Result<bool, RuntimeError>> {
        let name = backend_id.to_string();
        Box::pin(async move {
            match self
                .docker
                .inspect_container(&name, None::<InspectContainerOptions>)
                .await
            {
                Ok(c) => Ok(c.state.and_then(|s| s.running).unwrap_or(false)),
                Err(e) if status(&e) == Some(404) => Ok(false),
                Err(e) => Err(RuntimeError::Unavailable(format!(
                    "Docker engine: inspecting {name}: {e}"
                ))),
            }
        })
    }

    fn sweep_orphans<'a>(
        &'a self,
        owned: &'a HashSet<String>,
        grace: Duration,
    ) -> BoxFuture<'a, Result<Vec<String>, RuntimeError>> {
        Box::pin(async move {
            let removed = self.sweep_orphans_older_than(owned, grace).await?;
            // Containers of deleted homes belong to no record of this deployment: they
            // are removed, not reported as this deployment's orphans.
            if let Err(e) = self.sweep_homeless(grace).await {
                tracing::warn!(error = %e, "sweeping containers of deleted homes failed");
            }
            Ok(removed
                .iter()
                .filter_map(|name| Self::runtime_id_of(name).map(str::to_string))
                .collect())
        })
    }
}

impl Sessions for DockerRuntimeProvider {
    /// A Docker exec with attached stdin in the runtime's container (created or
    /// re-attached to as an exec would), without timeout; its output is uncapped on
    /// the way and kept by the session's ring.
    fn start(
        &self,
        spec: RuntimeSpec,
        req: SessionRequest,
    ) -> BoxFuture<'_, Result<SessionInfo, RuntimeError>> {
        Box::pin(async move {
            let cap = req.buffer_bytes()?;
            self.sessions.check_room()?;
            let runtime = self.create_docker(spec).await?;
            let argv = req.argv.clone();
            let mut plan = runtime.prepare(ExecRequest {
                argv: req.argv,
                cwd: req.cwd,
                env: req.env,
                timeout: None,
                stdin: None,
                max_output_bytes: Some(usize::MAX),
                mutating: req.mutating,
            })?;
            let (stdin, rx) = futures::channel::mpsc::unbounded();
            plan.stdin = exec::Stdin::Channel(rx);
            let output = exec::start(runtime.inner.clone(), plan).await?;
            let (info, pump) = self.sessions.insert(
                runtime.container_name().to_string(),
                argv,
                cap,
                Started { output, stdin },
            )?;
            tokio::spawn(pump);
            Ok(info)
        })
    }

    fn write<'a>(
        &'a self,
        id: &'a SessionId,
        input: SessionInput,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move { self.sessions.write(id, input) })
    }

    fn poll<'a>(
        &'a self,
        id: &'a SessionId,
        wait: Duration,
    ) -> BoxFuture<'a, Result<SessionOutput, RuntimeError>> {
        Box::pin(self.sessions.poll(id, tokio::time::sleep(wait)))
    }

    fn kill<'a>(&'a self, id: &'a SessionId) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move { self.sessions.kill(id) })
    }

    fn info(&self, id: &SessionId) -> Result<SessionInfo, RuntimeError> {
        self.sessions.info(id)
    }

    fn list(&self) -> Vec<SessionInfo> {
        self.sessions.list()
    }
}

/// The runtime of one workspace: a handle on its container. Cheap to clone.
#[derive(Clone)]
pub struct DockerRuntime {
    inner: Arc<inner::Inner>,
}

impl std::fmt::Debug for DockerRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerRuntime")
            .field("name", &self.inner.name)
            .field("container_id", &self.inner.container_id)
            .finish()
    }
}

impl DockerRuntime {
    /// The container's name (`grove-rt-<runtime id>`).
    pub fn container_name(&self) -> &str {
        &self.inner.name
    }
    /// The container's id.
    pub fn container_id(&self) -> &str {
        &self.inner.container_id
    }
    /// The runtime id (label [`LABEL_RUNTIME`]).
    pub fn runtime_id(&self) -> &str {
        &self.inner.runtime_id
    }
    /// The workspace root as commands see it.
    pub fn inside_workdir(&self) -> &Path {
        &self.inner.inside_workdir
    }
    /// Whether the workspace is mounted writable.
    pub fn is_writable(&self) -> bool {
        self.inner.workdir_writable
    }

    fn prepare(&self, req: ExecRequest) -> Result<exec::Plan, RuntimeError> {
        validate_command(&req.argv).map_err(|e| RuntimeError::CommandRejected(e.to_string()))?;
        for (k, v) in &req.env {
            validate_env(k, v).map_err(|e| RuntimeError::CommandRejected(e.to_string()))?;
        }
        if req.mutating && !self.inner.workdir_writable {
            return Err(RuntimeError::CommandRejected(
                "the workspace is mounted read-only; mutating commands are refused".into(),
            ));
        }
        let cwd = self.resolve_cwd(req.cwd.as_deref())?;
        Ok(exec::Plan {
            argv: req.argv,
            env: req.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            working_dir: cwd.to_string_lossy().into_owned(),
            stdin: req.stdin.map_or(exec::Stdin::Null, exec::Stdin::Bytes),
            timeout: req.timeout,
            max_output: req.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT_BYTES),
        })
    }

    /// The cwd inside the container, refusing anything that is not a directory inside
    /// the workspace after resolving symlinks on the host.
    fn resolve_cwd(&self, cwd: Option<&Path>) -> Result<PathBuf, RuntimeError> {
        let (_, inside) =
            workdir::resolve_cwd(&self.inner.host_workdir, &self.inner.inside_workdir, cwd)?;
        Ok(inside)
    }
}

impl Runtime for DockerRuntime {
    fn exec_stream(
        &self,
        req: ExecRequest,
    ) -> BoxFuture<'_, Result<BoxStream<'static, Result<ExecChunk, RuntimeError>>, RuntimeError>>
    {
        Box::pin(async move {
            let plan = self.prepare(req)?;
            exec::start(self.inner.clone(), plan).await
        })
    }
}

/// The HTTP status of an engine error, if it is one.
pub(crate) fn status(e: &BollardError) -> Option<u16> {
    match e {
        BollardError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// An engine failure as a runtime error: unreachable engines and 5xx are
/// `Unavailable`, 404 `NotFound`, 409 `Conflict`.
pub(crate) fn engine_error(what: &str, e: &BollardError) -> RuntimeError {
    let msg = one_line(&e.to_string());
    match status(e) {
        Some(404) => RuntimeError::NotFound(format!("{what}: {msg}")),
        Some(409) => RuntimeError::Conflict(format!("{what}: {msg}")),
        Some(400) => RuntimeError::CommandRejected(format!("{what}: {msg}")),
        _ => RuntimeError::Unavailable(format!("{what}: {msg}")),
    }
}

fn create_error(e: &BollardError, image: &str) -> RuntimeError {
    match status(e) {
        Some(404) => RuntimeError::Unavailable(format!(
            "image {image} is not on the engine (images are never pulled): build one with \
             grove image build --minimal or --debian, or point RuntimeSpec.image at a local image"
        )),
        _ => engine_error("creating the container", e),
    }
}

fn start_error(e: &BollardError) -> RuntimeError {
    let msg = one_line(&e.to_string());
    if msg.contains("executable file not found") || msg.contains("no such file or directory") {
        return RuntimeError::Unavailable(format!(
            "the container cannot start its main process (the image needs `sleep`): {msg}"
        ));
    }
    engine_error("starting the container", e)
}

pub(crate) fn one_line(s: &str) -> String {
    s.lines().next().unwrap_or("").trim().to_string()
}
