//! Worker settings, with the documented defaults.

use std::path::PathBuf;
use std::time::Duration;

/// How a worker runs. Every field has a documented default (see README "Configuration").
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The node this worker serves: it takes jobs of `grove:node:<node>` and `grove:shared`.
    pub node: String,
    /// Unique per process; recorded in `apalis.workers` and in event metadata.
    pub worker_id: String,
    /// Jobs run at once.
    pub concurrency: usize,
    /// `$GROVE_HOME`: repo caches and workspaces live under it.
    pub home: PathBuf,
    /// How often this worker proves it is alive.
    pub heartbeat_every: Duration,
    /// A worker silent this long is dead: its jobs go back to the queue.
    pub worker_lost_after: Duration,
    /// Fallback poll when no notification arrives (a lost LISTEN connection must not stall pickup).
    pub poll_every: Duration,
    /// How long a job waits for a workspace or cache lock before failing as `conflict`.
    pub lock_timeout: Duration,
    /// A repo cache older than this is fetched by the next ensure, or by the next acquire that
    /// creates a workspace from it.
    pub cache_freshness: Duration,
    /// Finished jobs and ledger rows are pruned after this long (the dedupe window).
    pub prune_after: Duration,
    /// The image `--runtime docker` execs run in (`GROVE_DOCKER_IMAGE`, else the last
    /// `grove image build`); `None` when there is none.
    pub docker_image: Option<String>,
    /// Eviction policy, schedule and measurement settings (`GROVE_DISK_BUDGET`, ...).
    pub eviction: crate::eviction::EvictionSettings,
    /// Who may clone from local repository URLs: the operator's allow-list
    /// (`GROVE_LOCAL_REPO_ROOTS`) and this `$GROVE_HOME`, never a source.
    pub local_repos: grove_core::local_repo::LocalRepoPolicy,
}

impl WorkerConfig {
    pub fn new(home: PathBuf, node: String) -> Self {
        let worker_id = format!(
            "{}-{}-{}",
            node,
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        Self {
            node,
            worker_id,
            concurrency: 8,
            heartbeat_every: Duration::from_secs(2),
            worker_lost_after: Duration::from_secs(15),
            poll_every: Duration::from_millis(500),
            lock_timeout: Duration::from_secs(120),
            cache_freshness: Duration::from_secs(600),
            prune_after: Duration::from_secs(7 * 24 * 3600),
            docker_image: None,
            eviction: crate::eviction::EvictionSettings::default(),
            local_repos: grove_core::local_repo::LocalRepoPolicy::from_value(
                std::env::var(grove_core::local_repo::ROOTS_ENV)
                    .ok()
                    .as_deref(),
                home.clone(),
            ),
            home,
        }
    }
}
