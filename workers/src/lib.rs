//! grove-workers: the job handlers and the worker loop that runs them.
//!
//! # Layout
//! - [`config`]: worker settings and their defaults.
//! - [`handlers`]: one handler per job kind (load state, lock, effect, events).
//! - [`eviction`]: the eviction sweep, restore, release of a conversation or task, the
//!   schedule.
//! - [`merge_back`]: the diff between a task and an edit workspace, and bringing the
//!   task's commits into the edit branch.
//! - [`pulls`]: pull requests and their comments through the git platform port.
//! - [`relay`]: relaying a streaming exec's output while it runs.
//! - [`runner`]: claim → start → handle → finish, heartbeats and orphan recovery.
//!
//! Architecture invariant: handlers reach git and runtimes only through the ports of
//! `grove-core`; the concrete adapters are chosen in [`build_deps`].

pub mod config;
pub mod eviction;
pub mod handlers;
pub mod merge_back;
pub mod pulls;
pub mod relay;
pub mod runner;

use std::sync::Arc;

use grove_core::layout::Layout;
use grove_core::ports::RuntimeRegistry;
use sqlx::PgPool;

pub use config::WorkerConfig;
pub use runner::{Outcome, Worker};

/// Process-wide setup a worker needs before any thread starts: network timeouts for git
/// (30 s to connect, 120 s per read or write), so a stalled remote cannot pin a thread,
/// and trust in workspaces owned by the sandbox user.
///
/// # Safety
///
/// Call once, first thing in `main`, before the tokio runtime or any other thread exists.
pub unsafe fn init_process() -> Result<(), grove_core::error::GitError> {
    use std::time::Duration;
    // SAFETY: the caller guarantees no other thread exists yet.
    unsafe {
        grove_git::set_network_timeouts(Duration::from_secs(30), Duration::from_secs(120))?;
        grove_git::trust_foreign_owners()
    }
}

/// Wires the production adapters: git2 for git, bubblewrap-isolated local processes,
/// and Docker through bollard when an engine answers (else `--runtime docker` is
/// refused with a clear error and the worker runs without it).
pub async fn build_deps(pool: PgPool, mut config: WorkerConfig) -> handlers::Deps {
    let layout = Layout::new(config.home.clone());
    let runtimes = build_runtimes(&mut config).await;
    // GitHub (or GitHub Enterprise through GROVE_GITHUB_API_URL); a configuration that
    // does not parse leaves pull requests unavailable and says why, once.
    let platform: Option<Arc<dyn grove_core::platform::GitPlatformProvider>> =
        match grove_github::GitHubProvider::from_env() {
            Ok(github) => Some(Arc::new(github)),
            Err(e) => {
                tracing::error!(error = %e, "git platform not configured: pull request jobs will fail");
                None
            }
        };
    handlers::Deps {
        pool,
        layout,
        git: Arc::new(grove_git::Git2Adapter::new()),
        runtimes,
        platform,
        inflight: Default::default(),
        config,
    }
}

/// The runtime providers of this process: local (always; without bubblewrap it
/// carries a note and claims no isolation) and Docker when an engine answers, else
/// Docker listed as known but not configured. Fills `config.docker_image` from
/// `GROVE_DOCKER_IMAGE` or the last built image when unset. What `grove worker`,
/// `grove serve` and `grove runtimes` use.
pub async fn build_runtimes(config: &mut WorkerConfig) -> RuntimeRegistry {
    let local = grove_local::LocalRuntimeProvider::detect(vec![config.home.clone()]);
    let local_note = local.isolation_unavailable_reason().map(|reason| {
        tracing::warn!(%reason, "local runtime without OS isolation: write-class commands will be refused");
        format!("no OS isolation: {reason}")
    });
    let mut runtimes = RuntimeRegistry::default().with(Arc::new(local));
    if let Some(note) = local_note {
        runtimes = runtimes.with_note("local", note);
    }
    if config.docker_image.is_none() {
        config.docker_image = grove_docker::image::default_image(&config.home);
    }
    match grove_docker::DockerRuntimeProvider::connect().await {
        Ok(docker) => {
            // Containers are scoped to this $GROVE_HOME: workers of another deployment on
            // the same engine never sweep them as orphans.
            let mut docker = docker.with_scope_label(
                "grove.home",
                grove_core::layout::short_hash(&config.home.to_string_lossy(), 12),
            );
            match &config.docker_image {
                Some(image) => docker = docker.with_default_image(image.clone()),
                None => {
                    runtimes = runtimes.with_note(
                        "docker",
                        "no default image: build one with `grove image build --minimal` or set \
                         GROVE_DOCKER_IMAGE",
                    )
                }
            }
            runtimes = runtimes.with(Arc::new(docker));
        }
        Err(e) => {
            tracing::info!(error = %e, "docker runtime not available on this worker");
            runtimes = runtimes.with_unconfigured(
                "docker",
                e.to_string(),
                grove_docker::DockerRuntimeProvider::CAPABILITIES,
            );
        }
    }
    runtimes
}
