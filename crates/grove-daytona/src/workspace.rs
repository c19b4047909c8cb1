//! Workspaces inside a Daytona sandbox: one clone of each repository per sandbox
//! (`<home>/grove/repos/<repo>`, the repo cache of that provider) and one checkout per
//! workspace (`<home>/grove/workspaces/<user>_<scope>_<branch>`, every segment a safe
//! prefix plus a hash, so two conversations on one branch never share a directory).
//!
//! Made through the toolbox's git endpoints (`/git/clone`, `/git/branches`,
//! `/git/checkout`): sandbox images need not ship a git CLI. Daytona sometimes
//! answers one of these with a validation error although the operation took effect,
//! so every validation error is checked against the repository's state (`.git/HEAD`,
//! the branch list) before it counts as a failure.

use grove_core::error::RuntimeError;
use grove_core::ports::GitToken;
use grove_remote_runtime::{RemoteWorkspace, WorkspacePlacement};

use crate::api::GitClone;
use crate::error::DaytonaError;
use crate::DaytonaRuntimeProvider;

impl DaytonaRuntimeProvider {
    /// Makes (or finds) the workspace `p` describes inside the sandbox of its user and
    /// project. Idempotent: a checkout whose `.git/HEAD` exists is returned as is; the
    /// repository is cloned from upstream once per sandbox. The token goes only into the
    /// clone request's password field.
    pub async fn ensure_workspace(
        &self,
        p: &WorkspacePlacement,
        token: Option<&GitToken>,
    ) -> Result<RemoteWorkspace, RuntimeError> {
        let key = p.validate()?;
        let client = self.client().clone();
        let (sandbox, home) = self
            .with_sandbox(&key, p.network, |id| {
                let client = client.clone();
                async move { client.home_dir(&id).await }
            })
            .await?;
        let cache_path = p.cache_path(&home);
        let path = p.path(&home);

        let mut cloned_cache = false;
        if head(&client, &sandbox, &cache_path).await?.is_none() {
            let req = GitClone {
                url: &p.repo_url,
                path: &cache_path,
                branch: None,
                username: token.map(|_| "x-access-token"),
                password: token.map(GitToken::expose),
            };
            let r = client.git_clone(&sandbox, &req).await;
            verified(r, || async {
                Ok(head(&client, &sandbox, &cache_path).await?.is_some())
            })
            .await?;
            cloned_cache = true;
        }
        if head(&client, &sandbox, &path).await?.is_none() {
            let req = GitClone {
                url: &cache_path,
                path: &path,
                branch: Some(&p.base_ref),
                username: None,
                password: None,
            };
            let r = client.git_clone(&sandbox, &req).await;
            verified(r, || async {
                Ok(head(&client, &sandbox, &path).await?.is_some())
            })
            .await?;
            if let Some(branch) = &p.branch {
                let r = client.git_create_branch(&sandbox, &path, branch).await;
                verified(r, || async {
                    Ok(client
                        .git_branches(&sandbox, &path)
                        .await?
                        .iter()
                        .any(|b| b == branch))
                })
                .await?;
                let r = client.git_checkout(&sandbox, &path, branch).await;
                let want = format!("ref: refs/heads/{branch}");
                verified(r, || async {
                    Ok(head(&client, &sandbox, &path).await?.as_deref() == Some(want.as_str()))
                })
                .await?;
            }
        }
        Ok(RemoteWorkspace {
            sandbox_id: sandbox,
            path,
            cache_path,
            cloned_cache,
        })
    }
}

/// The content of `<repo>/.git/HEAD` (trimmed), `None` when absent.
async fn head(
    client: &crate::Client,
    sandbox: &str,
    repo: &str,
) -> Result<Option<String>, RuntimeError> {
    match client
        .download_file(sandbox, &format!("{repo}/.git/HEAD"))
        .await
    {
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).trim().to_string())),
        Err(DaytonaError::Api { status: 404, .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The outcome of a git call, with Daytona's quirk handled: a validation error for an
/// operation that did take effect counts as success once `check` confirms the state.
async fn verified<F, Fut>(result: Result<(), DaytonaError>, check: F) -> Result<(), RuntimeError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<bool, RuntimeError>>,
{
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.is_validation() => {
            if check().await? {
                tracing::info!(error = %e, "daytona answered a validation error for an operation that took effect");
                Ok(())
            } else {
                Err(e.into())
            }
        }
        Err(e) => Err(e.into()),
    }
}
