//! Sandbox keys and labels, backend ids, and the checks both remote adapters apply to
//! a runtime spec and to each exec request before anything reaches the provider.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use grove_core::error::RuntimeError;
use grove_core::ports::{ExecRequest, NetworkPolicy, RuntimeSpec};

/// Label (Daytona) or metadata key (E2B) on every sandbox grove creates.
pub const LABEL_MANAGED: &str = "grove.managed";
/// The user a sandbox belongs to (one sandbox per user and project).
pub const LABEL_USER: &str = "grove.user";
/// The project a sandbox belongs to.
pub const LABEL_PROJECT: &str = "grove.project";
/// The network policy the sandbox was created with.
pub const LABEL_NETWORK: &str = "grove.network";

/// The (user, project) a sandbox serves.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SandboxKey {
    pub user: String,
    pub project: String,
}

impl SandboxKey {
    /// From a spec's `grove.user` / `grove.project` labels (`default` when absent).
    pub fn of(spec: &RuntimeSpec) -> Self {
        let get = |k: &str| {
            spec.labels
                .get(k)
                .cloned()
                .unwrap_or_else(|| "default".to_string())
        };
        Self {
            user: get(LABEL_USER),
            project: get(LABEL_PROJECT),
        }
    }

    /// `<kind>:<user>/<project>`, the runtime's backend id.
    pub fn backend_id(&self, kind: &str) -> String {
        format!("{kind}:{}/{}", self.user, self.project)
    }

    /// The key a backend id of `kind` names; `None` for another provider's id.
    pub fn parse_backend_id(kind: &str, backend_id: &str) -> Option<Self> {
        let rest = backend_id.strip_prefix(kind)?.strip_prefix(':')?;
        let (user, project) = rest.split_once('/')?;
        Some(Self {
            user: user.to_string(),
            project: project.to_string(),
        })
    }

    /// The labels that identify this key's sandbox: the provider's scope labels plus
    /// `grove.managed`, `grove.user` and `grove.project`.
    pub fn labels(&self, scope: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut l = scope.clone();
        l.insert(LABEL_MANAGED.into(), "true".into());
        l.insert(LABEL_USER.into(), self.user.clone());
        l.insert(LABEL_PROJECT.into(), self.project.clone());
        l
    }
}

/// The value of [`LABEL_NETWORK`] for a policy.
pub fn network_name(n: NetworkPolicy) -> &'static str {
    match n {
        NetworkPolicy::None => "none",
        NetworkPolicy::Limited => "limited",
        NetworkPolicy::Default => "default",
    }
}

/// A sandbox keeps the network it was created with (its [`LABEL_NETWORK`]); a runtime
/// asking for another one is a `Conflict`, not something to approximate.
pub fn check_network(
    sandbox_id: &str,
    labels: &BTreeMap<String, String>,
    wanted: NetworkPolicy,
) -> Result<(), RuntimeError> {
    match labels.get(LABEL_NETWORK) {
        Some(have) if have != network_name(wanted) => Err(RuntimeError::Conflict(format!(
            "sandbox {sandbox_id} was created with network {have}, this runtime asks for {}",
            network_name(wanted)
        ))),
        _ => Ok(()),
    }
}

/// What a runtime of a remote sandbox is, once its spec is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSpec {
    pub key: SandboxKey,
    /// The workspace's absolute path inside the sandbox.
    pub workdir: String,
    pub writable: bool,
    pub env: BTreeMap<String, String>,
    pub network: NetworkPolicy,
}

impl RemoteSpec {
    /// Checks `spec` for a remote sandbox: the workdir is an absolute UTF-8 path
    /// inside the sandbox, no mount but the workdir itself (host paths cannot reach a
    /// remote sandbox), a valid environment. `provider` names it in messages
    /// (`"Daytona"`).
    pub fn check(spec: RuntimeSpec, provider: &str) -> Result<Self, RuntimeError> {
        let workdir = spec
            .workdir
            .to_str()
            .filter(|w| w.starts_with('/'))
            .ok_or_else(|| {
                RuntimeError::CommandRejected(format!(
                    "a {provider} workdir must be an absolute UTF-8 path inside the sandbox"
                ))
            })?
            .to_string();
        let mut writable = false;
        for m in &spec.mounts {
            if m.source != spec.workdir || m.target != spec.workdir {
                return Err(RuntimeError::CommandRejected(format!(
                    "a {provider} sandbox cannot mount host paths ({} -> {}); only the workspace inside the sandbox is used",
                    m.source.display(),
                    m.target.display()
                )));
            }
            writable |= m.writable;
        }
        for (k, v) in &spec.env {
            grove_core::validate::validate_env(k, v)
                .map_err(|e| RuntimeError::CommandRejected(e.to_string()))?;
        }
        Ok(Self {
            key: SandboxKey::of(&spec),
            workdir,
            writable,
            env: spec.env,
            network: spec.network,
        })
    }
}

/// The checks of one exec request: argv and env are valid, and a mutating command
/// needs a writable workspace.
pub fn validate_exec(req: &ExecRequest, writable: bool) -> Result<(), RuntimeError> {
    grove_core::validate::validate_command(&req.argv)
        .map_err(|e| RuntimeError::CommandRejected(e.to_string()))?;
    for (k, v) in &req.env {
        grove_core::validate::validate_env(k, v)
            .map_err(|e| RuntimeError::CommandRejected(e.to_string()))?;
    }
    if req.mutating && !writable {
        return Err(RuntimeError::CommandRejected(
            "a mutating command on a read-only workspace".into(),
        ));
    }
    Ok(())
}

/// The cwd of a request, checked lexically (relative, no `..`) and joined to
/// `workdir`; `None` for the workdir itself. The adapter then resolves it in the
/// sandbox, symlinks included, before the command runs.
pub fn lexical_cwd(workdir: &str, cwd: Option<&Path>) -> Result<Option<String>, RuntimeError> {
    let Some(cwd) = cwd else { return Ok(None) };
    let mut rel = PathBuf::new();
    for c in cwd.components() {
        match c {
            Component::CurDir => {}
            Component::Normal(p) => rel.push(p),
            _ => {
                return Err(RuntimeError::CommandRejected(format!(
                    "cwd {} leaves the workspace",
                    cwd.display()
                )))
            }
        }
    }
    if rel.as_os_str().is_empty() {
        return Ok(None);
    }
    let rel = rel
        .to_str()
        .ok_or_else(|| RuntimeError::CommandRejected("cwd is not UTF-8".into()))?;
    Ok(Some(format!("{}/{rel}", workdir.trim_end_matches('/'))))
}

/// The output cap of one exec: the first `cap` bytes are kept, the rest dropped and
/// the result marked truncated.
#[derive(Debug, Clone)]
pub struct OutputCap {
    cap: usize,
    kept: usize,
    truncated: bool,
}

impl OutputCap {
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            kept: 0,
            truncated: false,
        }
    }

    /// The part of `data` that fits.
    pub fn take<'a>(&mut self, data: &'a [u8]) -> &'a [u8] {
        let room = self.cap.saturating_sub(self.kept);
        let take = data.len().min(room);
        if take < data.len() {
            self.truncated = true;
        }
        self.kept += take;
        &data[..take]
    }

    pub fn truncated(&self) -> bool {
        self.truncated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cwd_that_leaves_the_workspace_is_refused_lexically() {
        for bad in ["..", "../x", "a/../..", "/etc"] {
            assert!(
                lexical_cwd("/w", Some(Path::new(bad))).is_err(),
                "{bad} must be refused"
            );
        }
        assert_eq!(lexical_cwd("/w", Some(Path::new("."))).unwrap(), None);
        assert_eq!(
            lexical_cwd("/w/", Some(Path::new("a/./b")))
                .unwrap()
                .as_deref(),
            Some("/w/a/b")
        );
    }

    #[test]
    fn backend_ids_name_the_user_and_project_of_one_provider() {
        let key = SandboxKey::parse_backend_id("daytona", "daytona:u1/p1").unwrap();
        assert_eq!((key.user.as_str(), key.project.as_str()), ("u1", "p1"));
        assert_eq!(key.backend_id("daytona"), "daytona:u1/p1");
        assert!(SandboxKey::parse_backend_id("daytona", "docker:x").is_none());
        assert!(SandboxKey::parse_backend_id("e2b", "e2bx:u/p").is_none());
    }

    #[test]
    fn the_cap_keeps_the_first_bytes_and_says_it_dropped_some() {
        let mut cap = OutputCap::new(5);
        assert_eq!(cap.take(b"abc"), b"abc");
        assert!(!cap.truncated());
        assert_eq!(cap.take(b"defg"), b"de");
        assert_eq!(cap.take(b"h"), b"");
        assert!(cap.truncated());
    }
}
