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

use std::time::Duration;

use futures::future::BoxFuture;
use grove_core::error::RuntimeError;
use grove_core::ports::{
    resolve_head, split_remote_workspace_path, ExecRequest, GitToken, Mount, NetworkPolicy,
    RemoteCheckout, RemoteWorkspaceRequest, RemoteWorkspaces, RuntimeProvider, RuntimeSpec,
};
use grove_remote_runtime::{RemoteWorkspace, WorkspacePlacement};

use crate::api::{GitClone, SandboxState};
use crate::error::DaytonaError;
use crate::{DaytonaRuntimeProvider, SandboxKey};

fn invalid(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::CommandRejected(e.to_string())
}

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

/// The placement port (ADR 15): the worker reaches [`ensure_workspace`] and the cleanup
/// through [`grove_core::ports::RuntimeProvider::workspaces`].
///
/// [`ensure_workspace`]: DaytonaRuntimeProvider::ensure_workspace
impl RemoteWorkspaces for DaytonaRuntimeProvider {
    fn ensure_workspace<'a>(
        &'a self,
        req: &'a RemoteWorkspaceRequest,
        token: Option<&'a GitToken>,
    ) -> BoxFuture<'a, Result<RemoteCheckout, RuntimeError>> {
        Box::pin(async move {
            let p = WorkspacePlacement::of_request(req, RemoteWorkspaces::network(self));
            let w = DaytonaRuntimeProvider::ensure_workspace(self, &p, token).await?;
            let client = self.client().clone();
            let sandbox = w.sandbox_id.clone();
            let head = resolve_head(&w.path, |path| {
                let (client, sandbox) = (client.clone(), sandbox.clone());
                async move {
                    match client.download_file(&sandbox, &path).await {
                        Ok(bytes) => Ok(Some(bytes)),
                        Err(DaytonaError::Api { status: 404, .. }) => Ok(None),
                        Err(e) => Err(RuntimeError::from(e)),
                    }
                }
            })
            .await?;
            w.into_checkout(head)
        })
    }

    fn remove_workspace<'a>(
        &'a self,
        user: &'a str,
        project: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let (home, _) = split_remote_workspace_path(path).ok_or_else(|| {
                invalid(format!("{path:?} is not a workspace path inside a sandbox"))
            })?;
            let key = SandboxKey {
                user: user.to_string(),
                project: project.to_string(),
            };
            // No sandbox, no workspace: never create one just to delete from it.
            let live = self
                .client()
                .list_sandboxes(&self.labels_of(&key))
                .await?
                .into_iter()
                .any(|s| !matches!(s.state, SandboxState::Destroyed | SandboxState::Destroying));
            if !live {
                return Ok(());
            }
            let runtime = self
                .create(sandbox_spec(&key, home, RemoteWorkspaces::network(self)))
                .await?;
            let r = runtime
                .exec(ExecRequest {
                    argv: vec!["rm".into(), "-rf".into(), "--".into(), path.into()],
                    timeout: Some(Duration::from_secs(300)),
                    mutating: true,
                    ..ExecRequest::default()
                })
                .await?;
            if r.exit_code != 0 {
                return Err(RuntimeError::Unavailable(format!(
                    "removing the workspace at {path} failed (exit {}): {}",
                    r.exit_code,
                    String::from_utf8_lossy(&r.stderr).trim()
                )));
            }
            Ok(())
        })
    }

    fn delete_sandbox<'a>(
        &'a self,
        user: &'a str,
        project: &'a str,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let key = SandboxKey {
                user: user.to_string(),
                project: project.to_string(),
            };
            DaytonaRuntimeProvider::delete_sandbox(self, &key).await
        })
    }

    /// Cloning needs a network: `limited` when the deployment configures an allow-list
    /// (which must let the git host through), else `default`.
    fn network(&self) -> NetworkPolicy {
        if self.config().network_allow_list.is_some() {
            NetworkPolicy::Limited
        } else {
            NetworkPolicy::Default
        }
    }
}

/// A runtime on the sandbox of `key` rooted at `home` (for grove's own housekeeping).
fn sandbox_spec(key: &SandboxKey, home: &str, network: NetworkPolicy) -> RuntimeSpec {
    RuntimeSpec {
        image: None,
        workdir: home.into(),
        mounts: vec![Mount {
            source: home.into(),
            target: home.into(),
            writable: true,
        }],
        env: Default::default(),
        resources: Default::default(),
        network,
        labels: [
            (crate::LABEL_USER.to_string(), key.user.clone()),
            (crate::LABEL_PROJECT.to_string(), key.project.clone()),
        ]
        .into(),
    }
}
