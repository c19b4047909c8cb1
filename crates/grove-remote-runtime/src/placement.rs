//! Workspaces inside a remote sandbox: what to make and where it goes. Every segment
//! built from caller input is a safe prefix plus a hash, so two conversations on one
//! branch never share a directory and no id can leave `<home>/grove`.

use grove_core::error::RuntimeError;
use grove_core::layout::segment;
use grove_core::ports::{NetworkPolicy, RemoteCheckout, RemoteWorkspaceRequest};

use crate::spec::SandboxKey;

/// Where a workspace goes and what it is made of. All fields are untrusted input and
/// are validated (refs, URL) or hashed into paths (ids).
#[derive(Debug, Clone)]
pub struct WorkspacePlacement {
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
    /// The sandbox's network; cloning needs one that reaches the git host.
    pub network: NetworkPolicy,
}

/// A workspace inside a sandbox: what grove records as its location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteWorkspace {
    pub sandbox_id: String,
    /// Absolute path of the checkout inside the sandbox (the runtime's workdir).
    pub path: String,
    /// The sandbox's clone of the repository the checkout was made from.
    pub cache_path: String,
    /// Whether this call cloned the repository from upstream.
    pub cloned_cache: bool,
}

impl RemoteWorkspace {
    /// What the port answers for this workspace, given the commit its HEAD resolved to
    /// (`None`: it resolved to none, which a finished checkout never does).
    pub fn into_checkout(self, head: Option<String>) -> Result<RemoteCheckout, RuntimeError> {
        let base_commit = head.ok_or_else(|| {
            RuntimeError::Unavailable(format!(
                "the HEAD of the workspace at {} does not resolve to a commit",
                self.path
            ))
        })?;
        Ok(RemoteCheckout {
            sandbox_id: self.sandbox_id,
            path: self.path,
            cache_path: self.cache_path,
            cloned_cache: self.cloned_cache,
            base_commit,
        })
    }
}

/// `<user>_<scope>_<branch>`, each part reduced to a safe prefix plus a hash.
pub fn worktree_name(user: &str, scope: &str, branch: &str) -> String {
    format!("{}_{}_{}", segment(user), segment(scope), segment(branch))
}

fn invalid(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::CommandRejected(e.to_string())
}

impl WorkspacePlacement {
    /// The placement of the port's request in a sandbox on `network`.
    pub fn of_request(req: &RemoteWorkspaceRequest, network: NetworkPolicy) -> Self {
        Self {
            user: req.user.clone(),
            project: req.project.clone(),
            scope: req.scope.clone(),
            repo_name: req.repo_name.clone(),
            repo_url: req.repo_url.clone(),
            base_ref: req.base_ref.clone(),
            branch: req.branch.clone(),
            network,
        }
    }

    /// Checks the refs and the URL before anything happens; the key of the sandbox
    /// the workspace goes into.
    pub fn validate(&self) -> Result<SandboxKey, RuntimeError> {
        grove_core::validate::validate_ref(&self.base_ref).map_err(invalid)?;
        if let Some(b) = &self.branch {
            grove_core::validate::validate_ref(b).map_err(invalid)?;
        }
        grove_core::validate::RepoUrl::parse(&self.repo_url).map_err(invalid)?;
        Ok(SandboxKey {
            user: self.user.clone(),
            project: self.project.clone(),
        })
    }

    /// The repository's clone in the sandbox whose home is `home`.
    pub fn cache_path(&self, home: &str) -> String {
        format!(
            "{}/grove/repos/{}",
            home.trim_end_matches('/'),
            segment(&self.repo_name)
        )
    }

    /// The workspace's checkout in the sandbox whose home is `home`.
    pub fn path(&self, home: &str) -> String {
        let branch = self.branch.as_deref().unwrap_or(&self.base_ref);
        format!(
            "{}/grove/workspaces/{}",
            home.trim_end_matches('/'),
            worktree_name(&self.user, &self.scope, branch)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_conversations_on_one_branch_get_two_directories() {
        let a = worktree_name("alice", "conv-1", "agent/edits");
        let b = worktree_name("alice", "conv-2", "agent/edits");
        assert_ne!(a, b);
        assert!(!a.contains('/') && !a.contains(".."), "{a}");
        assert!(a.split('_').count() >= 3, "{a}");
    }

    #[test]
    fn untrusted_refs_and_urls_are_refused() {
        let p = WorkspacePlacement {
            user: "u".into(),
            project: "p".into(),
            scope: "s".into(),
            repo_name: "o/n".into(),
            repo_url: "https://example.com/o/n.git".into(),
            base_ref: "main".into(),
            branch: Some("x\n--upload-pack=evil".into()),
            network: NetworkPolicy::Default,
        };
        assert!(p.validate().is_err());
        let ok = WorkspacePlacement {
            branch: None,
            ..p.clone()
        };
        assert_eq!(ok.validate().unwrap().user, "u");
        assert!(ok.path("/home/x/").starts_with("/home/x/grove/workspaces/"));
        let bad_url = WorkspacePlacement {
            repo_url: "ext::sh -c evil".into(),
            ..ok
        };
        assert!(bad_url.validate().is_err());
    }
}
