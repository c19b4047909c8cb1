//! Which transport clones and fetches repo caches, and their time budgets:
//! `GROVE_GIT_TRANSPORT` (`auto`, `cli`, `libgit2`), `GROVE_GIT_TRANSFER_TIMEOUT_SECS`
//! and `GROVE_GIT_STALL_TIMEOUT_SECS` (ADR 25).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::supervise::Limits;

/// Default total budget of one clone or fetch.
pub const DEFAULT_TRANSFER_TIMEOUT: Duration = Duration::from_secs(3600);
/// Default budget without any progress output.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(120);
/// The oldest git whose fetch has every flag grove passes (`--no-write-fetch-head`).
const MIN_GIT: (u32, u32) = (2, 29);

/// What moves a repo cache's objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// The git CLI at this path, run as a supervised child (ADR 25).
    Cli(PathBuf),
    /// libgit2, in the worker's own process.
    Libgit2,
    /// `GROVE_GIT_TRANSPORT=cli` without a usable git: every transfer fails with this.
    Missing(String),
}

/// How repo caches are cloned and fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportConfig {
    pub transport: Transport,
    pub transfer_timeout: Duration,
    pub stall_timeout: Duration,
}

impl TransportConfig {
    /// The CLI when a git binary of at least 2.29 is on `PATH`, else libgit2, with the
    /// default budgets.
    pub fn auto() -> Self {
        Self {
            transport: detect_cli().map_or(Transport::Libgit2, Transport::Cli),
            transfer_timeout: DEFAULT_TRANSFER_TIMEOUT,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
        }
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()))
    }

    /// Reads the three variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let transport = match get("GROVE_GIT_TRANSPORT").as_deref().map(str::trim) {
            None | Some("auto") => detect_cli().map_or(Transport::Libgit2, Transport::Cli),
            Some("cli") => detect_cli().map_or_else(
                || {
                    Transport::Missing(
                        "GROVE_GIT_TRANSPORT=cli but no git 2.29 or newer is on PATH".into(),
                    )
                },
                Transport::Cli,
            ),
            Some("libgit2") => Transport::Libgit2,
            Some(other) => {
                return Err(format!(
                    "GROVE_GIT_TRANSPORT: expected auto, cli or libgit2, got {other:?}"
                ))
            }
        };
        let secs = |name: &str, default: Duration| match get(name) {
            None => Ok(default),
            Some(v) => match v.trim().parse::<u64>() {
                Ok(n) if n > 0 => Ok(Duration::from_secs(n)),
                _ => Err(format!(
                    "{name}: expected a positive whole number of seconds, got {v:?}"
                )),
            },
        };
        Ok(Self {
            transport,
            transfer_timeout: secs("GROVE_GIT_TRANSFER_TIMEOUT_SECS", DEFAULT_TRANSFER_TIMEOUT)?,
            stall_timeout: secs("GROVE_GIT_STALL_TIMEOUT_SECS", DEFAULT_STALL_TIMEOUT)?,
        })
    }

    /// The same budgets with another transport.
    pub fn with_transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    pub(crate) fn limits(&self) -> Limits {
        Limits {
            total: self.transfer_timeout,
            stall: self.stall_timeout,
        }
    }
}

/// The git binary on `PATH` when its version is new enough, looked up once.
pub fn detect_cli() -> Option<PathBuf> {
    static GIT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    GIT.get_or_init(|| {
        let git = crate::checkout::git_cli()?;
        let ok = version_of(git).is_some_and(|v| v >= MIN_GIT);
        if !ok {
            tracing::warn!(git = %git.display(), "git is older than 2.29: repo caches use libgit2");
        }
        ok.then(|| git.to_path_buf())
    })
    .clone()
}

fn version_of(git: &Path) -> Option<(u32, u32)> {
    let out = std::process::Command::new(git)
        .arg("--version")
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    parse_version(&String::from_utf8_lossy(&out.stdout))
}

/// `git version 2.47.3` → (2, 47).
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let v = text.trim().strip_prefix("git version ")?;
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<TransportConfig, String> {
        let map: HashMap<_, _> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        TransportConfig::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn the_variables_choose_the_transport_and_the_budgets() {
        let d = config(&[]).unwrap();
        assert_eq!(d.transfer_timeout, DEFAULT_TRANSFER_TIMEOUT);
        assert_eq!(d.stall_timeout, DEFAULT_STALL_TIMEOUT);
        assert_eq!(d.transport == Transport::Libgit2, detect_cli().is_none());
        let c = config(&[
            ("GROVE_GIT_TRANSPORT", "libgit2"),
            ("GROVE_GIT_TRANSFER_TIMEOUT_SECS", "60"),
            ("GROVE_GIT_STALL_TIMEOUT_SECS", "5"),
        ])
        .unwrap();
        assert_eq!(c.transport, Transport::Libgit2);
        assert_eq!(c.limits().total, Duration::from_secs(60));
        assert_eq!(c.limits().stall, Duration::from_secs(5));
        assert!(config(&[("GROVE_GIT_TRANSPORT", "ssh")]).is_err());
        assert!(config(&[("GROVE_GIT_STALL_TIMEOUT_SECS", "0")]).is_err());
        assert!(config(&[("GROVE_GIT_TRANSFER_TIMEOUT_SECS", "soon")]).is_err());
    }

    #[test]
    fn git_versions_parse() {
        assert_eq!(parse_version("git version 2.47.3\n"), Some((2, 47)));
        assert_eq!(
            parse_version("git version 2.39.5 (Apple Git-154)"),
            Some((2, 39))
        );
        assert_eq!(parse_version("hub version 2.14"), None);
    }
}
