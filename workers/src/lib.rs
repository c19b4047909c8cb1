//! grove-workers: the job handlers and the worker loop that runs them.
//!
//! # Layout
//! - [`config`]: worker settings and their defaults.
//! - [`handlers`]: one handler per job kind (load state, lock, effect, events).
//! - [`eviction`]: the eviction sweep, restore, release of a conversation or task, the
//!   schedule.
//! - [`merge_back`]: the diff between a task and an edit workspace, and bringing the
//!   task's commits into the edit branch.
//! - [`relay`]: relaying a streaming exec's output while it runs.
//! - [`runner`]: claim → start → handle → finish, heartbeats and orphan recovery.
//!
//! Architecture invariant: handlers reach git and runtimes only through the ports of
//! `grove-core`; the concrete adapters are chosen in [`build_deps`].

pub mod config;
pub mod eviction;
pub mod handlers;
pub mod merge_back;
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
    let local = grove_local::LocalRuntimeProvider::detect(vec![config.home.clone()]);
    if let Some(reason) = local.isolation_unavailable_reason() {
        tracing::warn!(%reason, "local runtime without OS isolation: write-class commands will be refused");
    }
    let mut runtimes = RuntimeRegistry::default().with(Arc::new(local));
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
            if let Some(image) = &config.docker_image {
                docker = docker.with_default_image(image.clone());
            }
            runtimes = runtimes.with(Arc::new(docker));
        }
        Err(e) => tracing::info!(error = %e, "docker runtime not available on this worker"),
    }
    handlers::Deps {
        pool,
        layout,
        git: Arc::new(grove_git::Git2Adapter::new()),
        runtimes,
        inflight: Default::default(),
        config,
    }
}
