//! From a runtime spec to the container that serves it ([`Plan`]): the spec checked,
//! the workspace placed (`grove_sandboxd::host::workdir`), the user, limits, labels,
//! environment and host configuration resolved, and the hash that tells a matching
//! existing container from one to replace.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount as DockerMount, MountType,
    RestartPolicy, RestartPolicyNameEnum,
};
use grove_core::error::RuntimeError;
use grove_core::ports::{Mount, NetworkPolicy, RuntimeSpec};
use grove_core::validate::validate_env;
use grove_sandboxd::host::workdir::{self, Placed};
use sha2::{Digest, Sha256};

use crate::{
    agent, fallback_user, validate_runtime_id, DockerRuntimeProvider, BASE_PATH, DEFAULT_CPUS,
    DEFAULT_MEMORY_MB, DEFAULT_PIDS, LABEL_HOME_PATH, LABEL_MANAGED, LABEL_RUNTIME, LABEL_SPEC,
};

/// Everything about a spec that decides the container.
pub(crate) struct Plan {
    pub body: ContainerCreateBody,
    pub hash: String,
    pub image: String,
    pub runtime_id: String,
    pub host_workdir: PathBuf,
    pub inside_workdir: PathBuf,
    pub workdir_writable: bool,
    pub memory_mb: u64,
    pub pids: u64,
    pub env: Vec<(String, String)>,
}

/// The container's limits: memory (MiB), pids, cpus.
struct Limits {
    memory_mb: u64,
    pids: u64,
    cpus: f64,
}

impl DockerRuntimeProvider {
    /// Everything about a spec that decides the container, checked and resolved.
    pub(crate) async fn plan(&self, spec: &RuntimeSpec) -> Result<Plan, RuntimeError> {
        check_spec(spec)?;
        let image = self.image_for(spec)?;
        let Placed {
            workdir: host_workdir,
            mounts,
            inside_workdir,
            workdir_writable,
        } = workdir::place(&spec.workdir, &spec.mounts)?;
        let user = self.user_for(&host_workdir, &spec.workdir)?;
        let limits = self.limits(spec).await?;
        let (mut labels, runtime_id) = self.labels(spec)?;
        let env = container_env(spec);
        let exec_env = exec_env(&env);
        let mut body = ContainerCreateBody {
            image: Some(image.clone()),
            user: Some(user),
            env: Some(env),
            working_dir: Some(inside_workdir.to_string_lossy().into_owned()),
            entrypoint: Some(vec!["sleep".into()]),
            cmd: Some(vec!["2147483647".into()]),
            hostname: Some("grove".into()),
            labels: Some(labels.clone().into_iter().collect()),
            host_config: Some(self.host_config(&mounts, spec.network, &limits)),
            attach_stdin: Some(false),
            attach_stdout: Some(false),
            attach_stderr: Some(false),
            tty: Some(false),
            open_stdin: Some(false),
            ..Default::default()
        };
        let canonical = serde_json::to_string(
            &serde_json::to_value(&body).expect("a container config serializes"),
        )
        .expect("a JSON value serializes");
        let hash = hex::encode(Sha256::digest(canonical.as_bytes()))[..16].to_string();
        labels.insert(LABEL_SPEC.into(), hash.clone());
        body.labels = Some(labels.into_iter().collect());
        Ok(Plan {
            body,
            hash,
            image,
            runtime_id,
            host_workdir,
            inside_workdir,
            workdir_writable,
            memory_mb: limits.memory_mb,
            pids: limits.pids,
            env: exec_env,
        })
    }

    /// The spec's image, else the provider's default.
    fn image_for(&self, spec: &RuntimeSpec) -> Result<String, RuntimeError> {
        spec.image
            .clone()
            .filter(|s| !s.is_empty())
            .or_else(|| self.default_image.clone())
            .ok_or_else(|| {
                RuntimeError::Unavailable(
                    "no image for the docker runtime: set RuntimeSpec.image or \
                     GROVE_DOCKER_IMAGE, or build one (grove image build --minimal)"
                        .into(),
                )
            })
    }

    /// Who commands run as: the configured user, else the workspace's owner (the
    /// fallback user when root owns it); never root.
    fn user_for(&self, host_workdir: &Path, shown: &Path) -> Result<String, RuntimeError> {
        let user = match &self.user {
            Some(u) => u.clone(),
            None => {
                let meta = std::fs::metadata(host_workdir).map_err(|e| {
                    RuntimeError::NotFound(format!("workspace {}: {e}", shown.display()))
                })?;
                if meta.uid() == 0 {
                    fallback_user()
                } else {
                    format!("{}:{}", meta.uid(), meta.gid())
                }
            }
        };
        let uid = user.split(':').next().unwrap_or("");
        if uid == "0" || uid == "root" || uid.is_empty() {
            return Err(RuntimeError::CommandRejected(format!(
                "the docker runtime runs commands as a non-root user; {user:?} is root"
            )));
        }
        Ok(user)
    }

    /// The spec's limits (the defaults where it names none), cpus capped by the
    /// engine's.
    async fn limits(&self, spec: &RuntimeSpec) -> Result<Limits, RuntimeError> {
        let memory_mb = spec.resources.memory_mb.unwrap_or(DEFAULT_MEMORY_MB).max(6);
        let pids = spec.resources.pids.unwrap_or(DEFAULT_PIDS).max(8);
        let mut cpus = spec.resources.cpu.unwrap_or(DEFAULT_CPUS);
        if !(cpus.is_finite() && cpus > 0.0) {
            return Err(RuntimeError::CommandRejected(format!(
                "cpu limit {cpus} must be a positive number"
            )));
        }
        if let Some(ncpu) = self.engine_cpus().await {
            cpus = cpus.min(ncpu as f64);
        }
        Ok(Limits {
            memory_mb,
            pids,
            cpus,
        })
    }

    /// The container's labels (the spec's, the scope's, grove's own) and its runtime
    /// id.
    fn labels(
        &self,
        spec: &RuntimeSpec,
    ) -> Result<(BTreeMap<String, String>, String), RuntimeError> {
        let mut labels: BTreeMap<String, String> = spec.labels.clone();
        labels.extend(self.scope.clone());
        let runtime_id = match spec.labels.get(LABEL_RUNTIME) {
            Some(id) => id.clone(),
            None => {
                // Deterministic, so a retried create of the same spec re-attaches.
                let digest =
                    Sha256::digest(serde_json::to_vec(spec).expect("a RuntimeSpec serializes"));
                format!("spec-{}", &hex::encode(digest)[..20])
            }
        };
        validate_runtime_id(&runtime_id)?;
        labels.insert(LABEL_RUNTIME.into(), runtime_id.clone());
        labels.insert(LABEL_MANAGED.into(), "true".into());
        if let Some(home) = &self.home_path {
            labels.insert(LABEL_HOME_PATH.into(), home.to_string_lossy().into_owned());
        }
        Ok((labels, runtime_id))
    }

    /// The locked-down host configuration: the mounts (and the agent's binary),
    /// network, limits.
    fn host_config(&self, mounts: &[Mount], network: NetworkPolicy, limits: &Limits) -> HostConfig {
        let network_mode = match network {
            NetworkPolicy::None => "none",
            NetworkPolicy::Default => "bridge",
            NetworkPolicy::Limited => unreachable!("refused by check_spec"),
        };
        let bind = |source: &Path, target: &Path, writable: bool| DockerMount {
            target: Some(target.to_string_lossy().into_owned()),
            source: Some(source.to_string_lossy().into_owned()),
            typ: Some(MountType::BIND),
            read_only: Some(!writable),
            ..Default::default()
        };
        let mut docker_mounts: Vec<DockerMount> = mounts
            .iter()
            .map(|m| bind(&m.source, &m.target, m.writable))
            .collect();
        if let Some(pool) = &self.agents {
            docker_mounts.push(bind(pool.binary(), Path::new(agent::INSIDE_PATH), false));
        }
        let memory = (limits.memory_mb * 1024 * 1024) as i64;
        HostConfig {
            mounts: Some(docker_mounts),
            network_mode: Some(network_mode.into()),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            privileged: Some(false),
            init: Some(true),
            pids_limit: Some(limits.pids as i64),
            memory: Some(memory),
            memory_swap: Some(memory),
            nano_cpus: Some((limits.cpus * 1e9) as i64),
            ipc_mode: Some("private".into()),
            restart_policy: Some(RestartPolicy {
                name: Some(RestartPolicyNameEnum::NO),
                maximum_retry_count: None,
            }),
            log_config: Some(HostConfigLogConfig {
                typ: Some("none".into()),
                config: None,
            }),
            ..Default::default()
        }
    }
}

/// What the docker runtime refuses of a spec before anything else.
fn check_spec(spec: &RuntimeSpec) -> Result<(), RuntimeError> {
    if spec.network == NetworkPolicy::Limited {
        return Err(RuntimeError::CommandRejected(
            "network policy 'limited' is not enforceable by the docker runtime; \
             ask for 'none' or 'default'"
                .into(),
        ));
    }
    for (k, v) in &spec.env {
        validate_env(k, v).map_err(|e| RuntimeError::CommandRejected(e.to_string()))?;
    }
    Ok(())
}

/// The container's environment: grove's base, the spec's on top.
fn container_env(spec: &RuntimeSpec) -> Vec<String> {
    let mut env = vec![
        format!("PATH={BASE_PATH}"),
        "HOME=/tmp".to_string(),
        "LANG=C.UTF-8".to_string(),
    ];
    env.retain(|kv| {
        let key = kv.split('=').next().unwrap_or("");
        !spec.env.contains_key(key)
    });
    env.extend(spec.env.iter().map(|(k, v)| format!("{k}={v}")));
    env
}

/// What an engine exec's process starts with: the engine adds HOSTNAME (the
/// container's env wins).
fn exec_env(env: &[String]) -> Vec<(String, String)> {
    let own_hostname = env.iter().any(|kv| kv.starts_with("HOSTNAME="));
    (!own_hostname)
        .then(|| ("HOSTNAME".to_string(), "grove".to_string()))
        .into_iter()
        .chain(env.iter().map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_string(), v.to_string())
        }))
        .collect()
}
