//! Who may clone from a local repository: the operator's allow-list of directories
//! (`GROVE_LOCAL_REPO_ROOTS`) and the rule that grove's own data directory is never a
//! source. Pure decisions; the caller passes the filesystem lookup (`canonicalize`).

use std::io;
use std::path::{Component, Path, PathBuf};

/// The environment variable holding the operator's allow-list: absolute directories,
/// separated by `:`.
pub const ROOTS_ENV: &str = "GROVE_LOCAL_REPO_ROOTS";

/// Where a repository URL makes git read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepoLocation {
    /// A network transport (`https://`, `http://`, `ssh://`, `git://`, `user@host:path`).
    Remote,
    /// A path on this machine (`file://`, a bare path, a bundle file).
    Local(PathBuf),
    /// A form git reads locally that grove never accepts from anyone (`ext::`, `fd::`
    /// and other transport helpers, relative paths).
    Refused(&'static str),
}

/// Classifies `raw` the way git would resolve it: remote transport or local path.
pub fn classify(raw: &str) -> RepoLocation {
    if raw.contains("::") {
        return RepoLocation::Refused("transport helpers (ext::, fd:: ...) are not allowed");
    }
    if let Some(rest) = raw.strip_prefix("file://") {
        return absolute(rest);
    }
    if let Some((scheme, _)) = raw.split_once("://") {
        return match scheme.to_ascii_lowercase().as_str() {
            "https" | "http" | "ssh" | "git" | "git+ssh" | "ssh+git" => RepoLocation::Remote,
            _ => RepoLocation::Refused("unsupported URL scheme"),
        };
    }
    // git's rule: a colon before any slash makes `host:path` an ssh location;
    // anything else is a path on this machine.
    match (raw.find(':'), raw.find('/')) {
        (Some(colon), slash) if slash.is_none_or(|s| colon < s) => RepoLocation::Remote,
        _ => absolute(raw),
    }
}

fn absolute(path: &str) -> RepoLocation {
    let path = Path::new(path);
    if !path.is_absolute() {
        return RepoLocation::Refused("local repository paths must be absolute");
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return RepoLocation::Refused("local repository paths must not contain '..'");
    }
    RepoLocation::Local(path.to_path_buf())
}

/// The repository URL a command asks grove to clone or fetch from, if any.
pub fn command_repo_url(command: &crate::commands::Command) -> Option<&str> {
    use crate::commands::Command;
    match command {
        Command::EnsureRepoCache(c) => Some(&c.repo_url),
        Command::AcquireWorkspace(c) => Some(&c.repo_url),
        _ => None,
    }
}

/// Whether `command` names a local repository (so its submitter's standing matters).
pub fn names_local_repo(command: &crate::commands::Command) -> bool {
    command_repo_url(command).is_some_and(|u| !matches!(classify(u), RepoLocation::Remote))
}

/// Who asks for the repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requester {
    /// The operator at the host's CLI: any local path outside `$GROVE_HOME`.
    Operator,
    /// An HTTP API, MCP or SQL caller: only paths under the allow-list.
    Caller,
}

/// Why a local repository URL was refused. Messages are one line and say the same
/// thing whether or not the path exists, so a refusal reveals nothing about another
/// tenant's files.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocalRepoError {
    #[error("local repository URLs are refused here: the path is not under a directory the operator allows (GROVE_LOCAL_REPO_ROOTS)")]
    NotAllowed,
    #[error("local repository URLs inside grove's data directory are refused")]
    InsideHome,
    #[error("repository URL refused: {0}")]
    Transport(&'static str),
}

/// The operator's allow-list and grove's data directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalRepoPolicy {
    roots: Vec<PathBuf>,
    home: PathBuf,
}

impl LocalRepoPolicy {
    /// `roots` as listed; relative entries are ignored (they would depend on the
    /// process's working directory).
    pub fn new(roots: Vec<PathBuf>, home: PathBuf) -> Self {
        let roots = roots.into_iter().filter(|r| r.is_absolute()).collect();
        Self { roots, home }
    }

    /// A policy from the value of [`ROOTS_ENV`] (`None` or empty: no local URLs for
    /// callers).
    pub fn from_value(value: Option<&str>, home: PathBuf) -> Self {
        let roots = value
            .unwrap_or("")
            .split(':')
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect();
        Self::new(roots, home)
    }

    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// Decides whether `requester` may use `raw` as a repository URL. `canonicalize`
    /// resolves symlinks (`std::fs::canonicalize`); a path that does not resolve is
    /// refused for callers and left to git (which reports it) for the operator.
    pub fn check(
        &self,
        raw: &str,
        requester: Requester,
        canonicalize: impl Fn(&Path) -> io::Result<PathBuf>,
    ) -> Result<(), LocalRepoError> {
        let path = match classify(raw) {
            RepoLocation::Remote => return Ok(()),
            RepoLocation::Refused(why) => return Err(LocalRepoError::Transport(why)),
            RepoLocation::Local(path) => path,
        };
        let homes = [Some(self.home.clone()), canonicalize(&self.home).ok()];
        let inside_home = |p: &Path| {
            homes
                .iter()
                .flatten()
                .any(|h| !h.as_os_str().is_empty() && p.starts_with(h))
        };
        if inside_home(&path) {
            return Err(LocalRepoError::InsideHome);
        }
        let real = match (canonicalize(&path), requester) {
            (Ok(real), _) => real,
            (Err(_), Requester::Operator) => return Ok(()),
            (Err(_), Requester::Caller) => return Err(LocalRepoError::NotAllowed),
        };
        if inside_home(&real) {
            return Err(LocalRepoError::InsideHome);
        }
        if requester == Requester::Operator {
            return Ok(());
        }
        let allowed = self
            .roots
            .iter()
            .filter_map(|r| canonicalize(r).ok())
            .any(|root| real.starts_with(&root));
        if allowed {
            Ok(())
        } else {
            Err(LocalRepoError::NotAllowed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake filesystem: `/link` resolves to `/home/grove/repos`, `/missing...` does
    /// not exist, everything else is its own canonical form.
    fn fake(p: &Path) -> io::Result<PathBuf> {
        let s = p.to_string_lossy();
        if let Some(rest) = s.strip_prefix("/link") {
            return Ok(PathBuf::from(format!("/home/grove/repos{rest}")));
        }
        if s.starts_with("/missing") {
            return Err(io::ErrorKind::NotFound.into());
        }
        Ok(p.to_path_buf())
    }

    fn policy() -> LocalRepoPolicy {
        LocalRepoPolicy::from_value(Some("/srv/repos::relative:/link"), "/home/grove".into())
    }

    #[test]
    fn classifies_like_git() {
        use RepoLocation::*;
        assert_eq!(classify("https://h/o/r.git"), Remote);
        assert_eq!(classify("ssh://git@h/o/r"), Remote);
        assert_eq!(classify("git@h:o/r.git"), Remote);
        assert_eq!(classify("file:///srv/r"), Local("/srv/r".into()));
        assert_eq!(classify("/srv/r"), Local("/srv/r".into()));
        assert_eq!(classify("/srv/x:y"), Local("/srv/x:y".into()));
        assert_eq!(classify("/srv/r.bundle"), Local("/srv/r.bundle".into()));
        assert!(matches!(classify("ext::sh -c id"), Refused(_)));
        assert!(matches!(classify("fd::3"), Refused(_)));
        assert!(matches!(classify("file://rel"), Refused(_)));
        assert!(matches!(classify("./r"), Refused(_)));
        assert!(matches!(classify("file:///srv/../etc"), Refused(_)));
        assert!(matches!(classify("gopher://h/r"), Refused(_)));
    }

    #[test]
    fn callers_only_reach_allow_listed_paths() {
        let p = policy();
        assert_eq!(p.roots(), &[PathBuf::from("/srv/repos"), "/link".into()]);
        assert_eq!(p.check("https://h/o/r", Requester::Caller, fake), Ok(()));
        assert_eq!(
            p.check("file:///srv/repos/a", Requester::Caller, fake),
            Ok(())
        );
        assert_eq!(
            p.check("file:///srv/other/a", Requester::Caller, fake),
            Err(LocalRepoError::NotAllowed)
        );
        // A missing path and a forbidden one give the same answer.
        assert_eq!(
            p.check("file:///missing/a", Requester::Caller, fake),
            Err(LocalRepoError::NotAllowed)
        );
        assert!(matches!(
            p.check("ext::sh -c id", Requester::Operator, fake),
            Err(LocalRepoError::Transport(_))
        ));
    }

    #[test]
    fn grove_home_is_refused_even_when_allow_listed_or_reached_by_a_symlink() {
        let p = policy();
        for who in [Requester::Caller, Requester::Operator] {
            assert_eq!(
                p.check("file:///home/grove/repos/x.git", who, fake),
                Err(LocalRepoError::InsideHome)
            );
            // `/link` is allow-listed but resolves into the data directory.
            assert_eq!(
                p.check("file:///link/x.git", who, fake),
                Err(LocalRepoError::InsideHome)
            );
        }
    }

    #[test]
    fn the_operator_may_use_any_path_outside_home() {
        let p = LocalRepoPolicy::from_value(None, "/home/grove".into());
        assert_eq!(
            p.check("file:///srv/other/a", Requester::Operator, fake),
            Ok(())
        );
        assert_eq!(
            p.check("file:///missing/a", Requester::Operator, fake),
            Ok(())
        );
        assert_eq!(
            p.check("file:///srv/other/a", Requester::Caller, fake),
            Err(LocalRepoError::NotAllowed)
        );
    }
}
