//! grove-workers: the job handlers and the worker loop that runs them.
//!
//! # Layout
//! - [`config`]: worker settings and their defaults.
//! - [`home`]: `$GROVE_HOME` and its directories kept private (0700).
//! - [`boundary`]: local repository URLs checked, token fingerprints keyed.
//! - [`context`]: what every job shares ([`JobContext`]: ports, settings, locks, rows,
//!   the fold of events into rows) and what a handler returns.
//! - [`jobs`]: one module per job kind (load state, lock, decide, act, return events).
//! - [`sweep`]: the eviction sweep by phase (inventory, reconcile, act) and its
//!   schedule.
//! - [`saved_work`]: saved work moved out of shared repo caches at start.
//! - [`relay`]: relaying a streaming exec's output while it runs.
//! - [`progress`]: a running clone's or fetch's progress written to its ledger row.
//! - [`runner`]: claim → start → handle → finish, heartbeats and orphan recovery.
//! - `trace`: a job's trace spans, continuing its command's trace (ADR 30).
//!
//! Module graph (`use crate::` edges, acyclic): `config` ← `context` ← `boundary`,
//! `jobs`, `sweep`, `saved_work` ← `runner` ← `lib`; `sweep` and `saved_work` use
//! `jobs` only through `JobContext` methods, `jobs` never uses `sweep`.
//!
//! Architecture invariant: handlers reach git and runtimes only through the ports of
//! `grove-core`; the concrete adapters are chosen in [`build_deps`].

mod boundary;
pub mod config;
pub mod context;
pub mod home;
pub mod jobs;
pub mod progress;
pub mod relay;
pub mod runner;
pub mod saved_work;
pub mod sweep;
mod trace;

use std::sync::Arc;

use grove_core::layout::Layout;
use grove_core::ports::RuntimeRegistry;
use sqlx::PgPool;

pub use config::WorkerConfig;
pub use context::JobContext;
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

/// Registers the Daytona and E2B providers when this deployment configures them
/// (`GROVE_DAYTONA_API_URL` + `GROVE_DAYTONA_API_KEY`, `GROVE_E2B_API_URL` +
/// `GROVE_E2B_API_KEY`, from the environment only, never from a request); otherwise
/// records them as known but unconfigured, with the reason. Their sandboxes carry the
/// `grove.home` scope label (`scope`), so deployments sharing an account never adopt
/// each other's sandboxes.
pub fn with_remote_providers(runtimes: RuntimeRegistry, scope: &str) -> RuntimeRegistry {
    with_remote_providers_from(runtimes, scope, |k| std::env::var(k).ok())
}

/// [`with_remote_providers`] over any source of variables.
pub fn with_remote_providers_from(
    mut runtimes: RuntimeRegistry,
    scope: &str,
    get: impl Fn(&str) -> Option<String>,
) -> RuntimeRegistry {
    let daytona = grove_daytona::DaytonaConfig::from_vars(&get).and_then(|c| {
        c.map(grove_daytona::DaytonaRuntimeProvider::new)
            .transpose()
    });
    runtimes = match daytona {
        Ok(Some(p)) => {
            tracing::info!("daytona runtime configured");
            runtimes.with(Arc::new(p.with_scope_label("grove.home", scope)))
        }
        Ok(None) => runtimes.with_unconfigured(
            "daytona",
            "GROVE_DAYTONA_API_URL and GROVE_DAYTONA_API_KEY are not set",
            grove_daytona::DaytonaRuntimeProvider::offered_capabilities(),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "daytona runtime misconfigured");
            runtimes.with_unconfigured(
                "daytona",
                e.to_string(),
                grove_daytona::DaytonaRuntimeProvider::offered_capabilities(),
            )
        }
    };
    let e2b = grove_e2b::E2bConfig::from_vars(&get).and_then(|c| {
        c.map(|c| {
            let scope = [("grove.home".to_string(), scope.to_string())].into();
            grove_e2b::E2bRuntimeProvider::with_scope(c, scope)
        })
        .transpose()
    });
    match e2b {
        Ok(Some(p)) => {
            tracing::info!("e2b runtime configured");
            runtimes.with(Arc::new(p))
        }
        Ok(None) => runtimes.with_unconfigured(
            "e2b",
            "GROVE_E2B_API_URL and GROVE_E2B_API_KEY are not set",
            grove_e2b::E2bRuntimeProvider::offered_capabilities(),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "e2b runtime misconfigured");
            runtimes.with_unconfigured(
                "e2b",
                e.to_string(),
                grove_e2b::E2bRuntimeProvider::offered_capabilities(),
            )
        }
    }
}

/// Wires the production adapters: git2 for git, bubblewrap-isolated local processes,
/// Docker through bollard when an engine answers (else `--runtime docker` is
/// refused with a clear error and the worker runs without it), and Daytona and E2B
/// when configured ([`with_remote_providers`]).
pub async fn build_deps(pool: PgPool, mut config: WorkerConfig) -> JobContext {
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
    JobContext {
        pool,
        layout,
        git: Arc::new(grove_git::Git2Adapter::new()),
        runtimes,
        platform,
        inflight: Default::default(),
        fingerprint: Default::default(),
        config,
    }
}

/// The runtime providers of this process: local (always; without bubblewrap it
/// carries a note and claims no isolation) and Docker when an engine answers, else
/// Docker listed as known but not configured, and Daytona and E2B when configured
/// ([`with_remote_providers`]), else listed as known but not configured. Fills `config.docker_image` from
/// `GROVE_DOCKER_IMAGE` or the last built image when unset. What `grove worker`,
/// `grove serve` and `grove runtimes` use.
pub async fn build_runtimes(config: &mut WorkerConfig) -> RuntimeRegistry {
    let local = grove_local::LocalRuntimeProvider::detect(&config.home);
    // Exactly which protections are active, or why there are none.
    let local_note = Some(match local.isolation_unavailable_reason() {
        Some(reason) => {
            tracing::warn!(%reason, "local runtime without OS isolation: write-class commands will be refused");
            format!("no OS isolation: {reason}")
        }
        None => local.protections().unwrap_or_default(),
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
            // Each container also names its home's path: once that directory is gone
            // (a deleted deployment or test run), any worker on the engine sweeps it.
            let home_path = std::fs::canonicalize(&config.home).unwrap_or(config.home.clone());
            let mut docker = docker
                .with_scope_label(
                    "grove.home",
                    grove_core::layout::short_hash(&config.home.to_string_lossy(), 12),
                )
                .with_home_path(home_path);
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
    let scope = grove_core::layout::short_hash(&config.home.to_string_lossy(), 12);
    with_remote_providers(runtimes, &scope)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_providers_are_registered_only_when_configured() {
        let none = with_remote_providers_from(RuntimeRegistry::default(), "s", |_| None);
        assert!(none.get("daytona").is_none() && none.get("e2b").is_none());
        let listed: Vec<_> = none
            .statuses()
            .into_iter()
            .map(|s| (s.kind, s.configured))
            .collect();
        assert_eq!(listed, vec![("daytona", false), ("e2b", false)]);

        let vars = |k: &str| match k {
            "GROVE_DAYTONA_API_URL" => Some("https://daytona.example/api".to_string()),
            "GROVE_DAYTONA_API_KEY" => Some("dtn_secret".to_string()),
            "GROVE_E2B_API_URL" => Some("https://api.e2b.example".to_string()),
            "GROVE_E2B_API_KEY" => Some("e2b_secret".to_string()),
            _ => None,
        };
        let both = with_remote_providers_from(RuntimeRegistry::default(), "s", vars);
        assert_eq!(both.kinds(), vec!["daytona", "e2b"]);

        let half = with_remote_providers_from(RuntimeRegistry::default(), "s", |k| {
            (k == "GROVE_E2B_API_KEY").then(|| "e2b_secret".to_string())
        });
        let e2b = half
            .statuses()
            .into_iter()
            .find(|s| s.kind == "e2b")
            .unwrap();
        assert!(!e2b.configured);
        let detail = e2b.detail.unwrap();
        assert!(detail.contains("GROVE_E2B_API_URL") && !detail.contains("e2b_secret"));
    }
}
