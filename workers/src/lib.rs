//! grove-workers: the job handlers and the worker loop that runs them.
//!
//! # Layout
//! - [`config`]: worker settings and their defaults.
//! - [`handlers`]: one handler per job kind (load state, lock, effect, events).
//! - [`runner`]: claim → start → handle → finish, heartbeats and orphan recovery.
//!
//! Architecture invariant: handlers reach git and runtimes only through the ports of
//! `grove-core`; the concrete adapters are chosen in [`build_deps`].

pub mod config;
pub mod handlers;
pub mod runner;

use std::sync::Arc;

use grove_core::layout::Layout;
use grove_core::ports::RuntimeRegistry;
use sqlx::PgPool;

pub use config::WorkerConfig;
pub use runner::{Outcome, Worker};

/// Process-wide setup a worker needs before any thread starts: network timeouts for git
/// (30 s to connect, 120 s per read or write), so a stalled remote cannot pin a thread.
///
/// # Safety
///
/// Call once, first thing in `main`, before the tokio runtime or any other thread exists.
pub unsafe fn init_process() -> Result<(), grove_core::error::GitError> {
    use std::time::Duration;
    // SAFETY: the caller guarantees no other thread exists yet.
    unsafe { grove_git::set_network_timeouts(Duration::from_secs(30), Duration::from_secs(120)) }
}

/// Wires the production adapters: git2 for git, bubblewrap-isolated local processes.
pub fn build_deps(pool: PgPool, config: WorkerConfig) -> handlers::Deps {
    let layout = Layout::new(config.home.clone());
    let local = grove_local::LocalRuntimeProvider::detect(vec![config.home.clone()]);
    handlers::Deps {
        pool,
        layout,
        git: Arc::new(grove_git::Git2Adapter::new()),
        runtimes: RuntimeRegistry::default().with(Arc::new(local)),
        inflight: Default::default(),
        config,
    }
}
