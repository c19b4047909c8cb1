//! Workspaces inside an E2B sandbox: one clone of each repository per sandbox
//! (`<home>/grove/repos/<repo>`, the repo cache of that provider) and one clone of it
//! per workspace (`<home>/grove/workspaces/<user>_<scope>_<branch>`, every segment a safe
//! prefix plus a hash), made with the sandbox's own `git` (E2B templates ship it).
//!
//! A git token reaches the clone only as an environment variable of that one process,
//! read by an inline credential helper: it is never in an argv, a URL or git config.

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use futures::StreamExt;
use grove_core::error::RuntimeError;
use grove_core::ports::{
    resolve_head, split_remote_workspace_path, GitToken, NetworkPolicy, RemoteCheckout,
    RemoteWorkspaceRequest, RemoteWorkspaces,
};
use grove_remote_runtime::{RemoteWorkspace, WorkspacePlacement};

use crate::api::{ProcessConfig, ProcessEvent};
use crate::error::E2bError;
use crate::{E2bRuntimeProvider, SandboxKey};

const CREDENTIAL_HELPER: &str =
    "credential.helper=!f() { echo username=x-access-token; echo \"password=$GROVE_GIT_TOKEN\"; }; f";

fn invalid(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::CommandRejected(e.to_string())
}

impl E2bRuntimeProvider {
    /// Runs one program in `key`'s sandbox to completion: exit code and stderr.
    async fn run(
        &self,
        key: &SandboxKey,
        network: NetworkPolicy,
        argv: &[&str],
        envs: BTreeMap<String, String>,
    ) -> Result<(i32, String), RuntimeError> {
        let process = ProcessConfig {
            cmd: argv[0].to_string(),
            args: argv[1..].iter().map(|s| s.to_string()).collect(),
            envs,
            cwd: None,
        };
        let client = self.client().clone();
        let (_, mut events) = self
            .with_envd(key, network, |envd| {
                let client = client.clone();
                let process = process.clone();
                async move { client.start(&envd, &process, false).await }
            })
            .await?;
        let mut stderr = Vec::new();
        while let Some(ev) = events.next().await {
            match ev? {
                ProcessEvent::Stderr(d) => stderr.extend_from_slice(&d),
                ProcessEvent::End {
                    exit_code,
                    exited,
                    status,
                } => {
                    let code = if exited { exit_code } else { 128 };
                    let _ = status;
                    return Ok((code, String::from_utf8_lossy(&stderr).trim().to_string()));
                }
                _ => {}
            }
        }
        Err(E2bError::Protocol("process ended without an end event".into()).into())
    }

    async fn home(&self, key: &SandboxKey, network: NetworkPolicy) -> Result<String, RuntimeError> {
        let client = self.client().clone();
        let process = ProcessConfig {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), "printf %s \"$HOME\"".into()],
            envs: BTreeMap::new(),
            cwd: None,
        };
        let (_, mut events) = self
            .with_envd(key, network, |envd| {
                let client = client.clone();
                let process = process.clone();
                async move { client.start(&envd, &process, false).await }
            })
            .await?;
        let mut out = Vec::new();
        while let Some(ev) = events.next().await {
            if let ProcessEvent::Stdout(d) = ev? {
                out.extend_from_slice(&d);
            }
        }
        let home = String::from_utf8_lossy(&out)
            .trim()
            .trim_end_matches('/')
            .to_string();
        if !home.starts_with('/') {
            return Err(RuntimeError::Unavailable(
                "the sandbox has no absolute $HOME".into(),
            ));
        }
        Ok(home)
    }

    async fn exists(
        &self,
        key: &SandboxKey,
        network: NetworkPolicy,
        path: &str,
    ) -> Result<bool, RuntimeError> {
        match self.read_file(key, network, path).await {
            Ok(_) => Ok(true),
            Err(RuntimeError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Makes (or finds) the workspace `p` describes inside the sandbox of its user and
    /// project. Idempotent on `.git/HEAD`; the repository is cloned from upstream once
    /// per sandbox.
    pub async fn ensure_workspace(
        &self,
        p: &WorkspacePlacement,
        token: Option<&GitToken>,
    ) -> Result<RemoteWorkspace, RuntimeError> {
        let key = p.validate()?;
        let home = self.home(&key, p.network).await?;
        let cache_path = p.cache_path(&home);
        let path = p.path(&home);
        let fail = |what: &str, code: i32, stderr: String| {
            RuntimeError::CommandRejected(format!("{what} failed (exit {code}): {stderr}"))
        };
        let mut cloned_cache = false;
        if !self
            .exists(&key, p.network, &format!("{cache_path}/.git/HEAD"))
            .await?
        {
            let mut envs = BTreeMap::new();
            let mut argv = vec!["git"];
            if let Some(t) = token {
                envs.insert("GROVE_GIT_TOKEN".to_string(), t.expose().to_string());
                argv.extend(["-c", CREDENTIAL_HELPER]);
            }
            envs.insert("GIT_TERMINAL_PROMPT".into(), "0".into());
            argv.extend(["clone", "--quiet", "--", &p.repo_url, &cache_path]);
            let (code, err) = self.run(&key, p.network, &argv, envs).await?;
            if code != 0 {
                return Err(fail("cloning the repository", code, err));
            }
            cloned_cache = true;
        }
        if !self
            .exists(&key, p.network, &format!("{path}/.git/HEAD"))
            .await?
        {
            let argv = [
                "git",
                "clone",
                "--quiet",
                "--branch",
                &p.base_ref,
                "--",
                &cache_path,
                &path,
            ];
            let (code, err) = self.run(&key, p.network, &argv, BTreeMap::new()).await?;
            if code != 0 {
                return Err(fail("making the workspace", code, err));
            }
            if let Some(branch) = &p.branch {
                let argv = ["git", "-C", &path, "checkout", "--quiet", "-b", branch];
                let (code, err) = self.run(&key, p.network, &argv, BTreeMap::new()).await?;
                if code != 0 {
                    return Err(fail("creating the branch", code, err));
                }
            }
        }
        let sandbox_id = self.sandbox(&key, p.network).await?.sandbox_id;
        Ok(RemoteWorkspace {
            sandbox_id,
            path,
            cache_path,
            cloned_cache,
        })
    }
}

/// The placement port (ADR 15): the worker reaches [`ensure_workspace`] and the cleanup
/// through [`grove_core::ports::RuntimeProvider::workspaces`].
///
/// [`ensure_workspace`]: E2bRuntimeProvider::ensure_workspace
impl RemoteWorkspaces for E2bRuntimeProvider {
    fn ensure_workspace<'a>(
        &'a self,
        req: &'a RemoteWorkspaceRequest,
        token: Option<&'a GitToken>,
    ) -> BoxFuture<'a, Result<RemoteCheckout, RuntimeError>> {
        Box::pin(async move {
            let network = RemoteWorkspaces::network(self);
            let p = WorkspacePlacement::of_request(req, network);
            let w = E2bRuntimeProvider::ensure_workspace(self, &p, token).await?;
            let key = SandboxKey {
                user: req.user.clone(),
                project: req.project.clone(),
            };
            let head = resolve_head(&w.path, |path| {
                let key = key.clone();
                async move {
                    match self.read_file(&key, network, &path).await {
                        Ok(bytes) => Ok(Some(bytes)),
                        Err(RuntimeError::NotFound(_)) => Ok(None),
                        Err(e) => Err(e),
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
            split_remote_workspace_path(path).ok_or_else(|| {
                invalid(format!("{path:?} is not a workspace path inside a sandbox"))
            })?;
            let key = SandboxKey {
                user: user.to_string(),
                project: project.to_string(),
            };
            // No sandbox, no workspace: never create one just to delete from it.
            if self
                .client()
                .list(&self.metadata_of(&key))
                .await?
                .is_empty()
            {
                return Ok(());
            }
            let argv = ["rm", "-rf", "--", path];
            let network = RemoteWorkspaces::network(self);
            let (code, err) = self.run(&key, network, &argv, BTreeMap::new()).await?;
            if code != 0 {
                return Err(RuntimeError::Unavailable(format!(
                    "removing the workspace at {path} failed (exit {code}): {err}"
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
            self.kill_sandbox(&key).await
        })
    }

    /// Cloning needs the internet; E2B offers `none` or `default` only.
    fn network(&self) -> NetworkPolicy {
        NetworkPolicy::Default
    }
}
