//! git2 adapter of grove: bare mirror repo caches and workspace checkouts that borrow
//! the cache's objects through `alternates`, behind `grove_core::ports::GitPort`.
//!
//! Layout on disk:
//! - cache: a bare repo with remote `origin` = the upstream URL and refspecs
//!   `+refs/heads/*:refs/heads/*`, `+refs/tags/*:refs/tags/*` (branches mirrored as
//!   local branches, so a base ref `main` is `refs/heads/main` in the cache);
//! - workspace: a normal repo (`.git` directory) whose
//!   `.git/objects/info/alternates` names the cache's `objects` directory by absolute
//!   path. A runtime that mounts the workspace must mount the cache's object directory
//!   at the same path (read-only suffices), or git inside it cannot read history.
//!
//! `workdir` runs git as an agent tool inside a workspace (status, diff, log, commit,
//! push); a push goes to the URL grove recorded, never a remote read from the
//! workspace, and its token goes through the same credentials callback as a fetch's.
//!
//! `trusted` is the only way any of them opens a repository or runs the git CLI: the
//! workspace's `.git` is treated as hostile (ADR 23).
//!
//! `saved` keeps a workspace's whole state (refs, stash, HEAD, index, working tree,
//! ignored files within a budget) in a private per-workspace store before eviction;
//! `restore` gives it back; `journal` makes merge-back's switch all-or-nothing.
//!
//! `merge` brings a task workspace's commits into an edit workspace's branch (merge or
//! cherry-pick), computed in memory and written only when clean.
//!
//! `history` keeps a point per change of a workspace in its private history store
//! (ADR 28): snapshots, diffs between points, rewind; a point reads only what the
//! process's inotify change tracker of the workspace saw change, when it knows (ADR 32).
//!
//! `rules` checks, before libgit2 walks a workspace, that no `.gitignore` or
//! `.gitattributes` it would open is a FIFO or a device (its blocking open would stall
//! the walk, ADR 28).
//!
//! `tree` walks trees an agent can write (hand-over of ownership, removal, size) by
//! directory descriptors, never following a symlink.
//!
//! `transport` chooses how a cache is cloned and fetched: the git CLI (`remote_cli`,
//! run as a supervised child by `supervise`, its `--progress` read by `progress`) or
//! libgit2 in process (ADR 25).
//!
//! Both are built in a `.<name>.partial-<random>` sibling and renamed into place, so a
//! crash never leaves a half-built cache or checkout at the final path.

mod cache;
mod checkout;
mod errors;
mod fsutil;
mod history;
mod journal;
mod merge;
mod preserve;
mod progress;
mod remote_cli;
mod restore;
mod rules;
mod saved;
mod supervise;
pub mod transport;
pub mod tree;
mod trusted;
mod workdir;

use std::path::Path;
use std::time::Duration;

use grove_core::error::GitError;
use grove_core::merge_back::{MergeBackDiff, MergeBackError, MergeBackReport, MergeStrategy};
use grove_core::model::SavedWork;
use grove_core::ports::{
    CacheReport, CheckoutReport, CheckoutRequest, CommitRequest, GitPort, GitToken,
    JournalRecovery, MergeBackRequest, PushRequest, RestoreRequest, SaveWorkReport,
    SaveWorkRequest,
};
use grove_core::tools::{Committed, DiffAgainst, GitDiff, GitStatus, LogEntry, Pushed};
use grove_core::transfer::TransferWatch;

pub use fsutil::dir_size_bytes;
pub use history::{WatchLimits, WatchState, MAX_POINT_FILE_BYTES};
pub use transport::{Transport, TransportConfig};

/// Sets libgit2's process-wide network timeouts: `connect` for opening a connection,
/// `io` for any single read or write on it. libgit2's defaults are zero (wait
/// forever), so without this a remote that stops answering mid-fetch pins a blocking
/// worker thread until the process dies. Values above `i32::MAX` ms are clamped.
///
/// # Safety
///
/// This writes libgit2 globals without synchronization: call it once at process
/// start, before any thread is spawned (before building the tokio runtime) and before
/// any other use of git2.
pub unsafe fn set_network_timeouts(connect: Duration, io: Duration) -> Result<(), GitError> {
    let ms = |d: Duration| i32::try_from(d.as_millis()).unwrap_or(i32::MAX);
    let map = |e: git2::Error| GitError::Other(errors::scrub(e.message(), None));
    // SAFETY: forwarded to the caller (see the function's safety section).
    unsafe {
        git2::opts::set_server_connect_timeout_in_milliseconds(ms(connect)).map_err(map)?;
        git2::opts::set_server_timeout_in_milliseconds(ms(io)).map_err(map)?;
    }
    Ok(())
}

/// Lets the worker open repositories it does not own. Writable workspaces handed to a
/// container belong to the sandbox user, while the worker (root) still inspects them
/// (dirty checks, preservation); libgit2's ownership check would refuse that.
///
/// # Safety
///
/// Same as [`set_network_timeouts`]: once, at process start, before any thread exists.
pub unsafe fn trust_foreign_owners() -> Result<(), GitError> {
    // SAFETY: forwarded to the caller (see the function's safety section).
    unsafe { git2::opts::set_verify_owner_validation(false) }
        .map_err(|e| GitError::Other(errors::scrub(e.message(), None)))
}

/// The git2 implementation of [`GitPort`], with the git CLI moving repo caches'
/// objects where one is installed. Holds only its transport settings and the caps of
/// its change trackers: every call opens what it needs (the trackers themselves are
/// the process's, ADR 32).
#[derive(Debug, Clone)]
pub struct Git2Adapter {
    transport: TransportConfig,
    watch_limits: WatchLimits,
}

impl Default for Git2Adapter {
    fn default() -> Self {
        Self::new()
    }
}

impl Git2Adapter {
    /// The transport from the environment (`GROVE_GIT_TRANSPORT`, ...; a value that
    /// does not parse is logged and the defaults used). Also applies grove's
    /// process-wide libgit2 settings (no system or global config; ADR 23) before
    /// anything else uses libgit2.
    pub fn new() -> Self {
        let transport = TransportConfig::from_env().unwrap_or_else(|e| {
            tracing::error!(error = %e, "git transport settings ignored");
            TransportConfig::auto()
        });
        Self::with_transport(transport)
    }

    /// An adapter with these transport settings.
    pub fn with_transport(transport: TransportConfig) -> Self {
        trusted::init();
        tracing::debug!(transport = ?transport.transport, "git transport for repo caches");
        Self {
            transport,
            watch_limits: WatchLimits::from_env(),
        }
    }

    /// The same adapter with other caps for each workspace's change tracker.
    pub fn with_watch_limits(mut self, limits: WatchLimits) -> Self {
        self.watch_limits = limits;
        self
    }

    /// This process's change tracker of a workspace (tests and diagnostics).
    pub fn tracker_state(&self, workspace_id: uuid::Uuid) -> WatchState {
        history::tracker_state(workspace_id)
    }

    pub fn transport(&self) -> &TransportConfig {
        &self.transport
    }
}

impl grove_core::history::HistoryPort for Git2Adapter {
    fn snapshot(
        &self,
        paths: &grove_core::history::HistoryPaths<'_>,
        workspace_id: uuid::Uuid,
        previous: Option<&str>,
        ignored: grove_core::history::IgnoredFiles,
    ) -> Result<grove_core::history::Snapshot, GitError> {
        history::snapshot(paths, workspace_id, previous, ignored)
    }
    fn tracked_snapshot(
        &self,
        paths: &grove_core::history::HistoryPaths<'_>,
        workspace_id: uuid::Uuid,
        previous: Option<&str>,
        ignored: grove_core::history::IgnoredFiles,
    ) -> Result<grove_core::history::Snapshot, GitError> {
        history::tracked_snapshot(paths, workspace_id, previous, ignored, self.watch_limits)
    }
    fn forget_tracker(&self, workspace_id: uuid::Uuid) {
        history::forget_tracker(workspace_id);
    }
    fn first_snapshot(
        &self,
        paths: &grove_core::history::HistoryPaths<'_>,
        workspace_id: uuid::Uuid,
    ) -> Result<grove_core::history::Snapshot, GitError> {
        history::first_snapshot(paths, workspace_id)
    }
    fn history_diff(
        &self,
        paths: &grove_core::history::HistoryPaths<'_>,
        from: &str,
        to: &str,
        max_bytes: usize,
    ) -> Result<grove_core::history::TreeDiff, GitError> {
        history::diff(paths, from, to, max_bytes)
    }
    fn history_file(
        &self,
        paths: &grove_core::history::HistoryPaths<'_>,
        snapshot: &str,
        path: &str,
    ) -> Result<Option<Vec<u8>>, GitError> {
        history::file_at(paths, snapshot, path)
    }
    fn rewind(
        &self,
        paths: &grove_core::history::HistoryPaths<'_>,
        workspace_id: uuid::Uuid,
        now: &str,
        to: &str,
        branch: Option<&str>,
    ) -> Result<grove_core::history::RewindReport, GitError> {
        history::rewind(paths, workspace_id, now, to, branch)
    }
    fn copy_history(&self, from: &Path, to: &Path) -> Result<(), GitError> {
        history::copy_store(from, to)
    }
    fn prune_history(
        &self,
        paths: &grove_core::history::HistoryPaths<'_>,
        keep: &[String],
    ) -> Result<usize, GitError> {
        history::prune(paths, keep)
    }
    fn discard_history(&self, store_dir: &Path) -> Result<(), GitError> {
        fsutil::remove_path(store_dir)
            .map_err(|e| errors::map_io("cannot remove a history store", &e))
    }
    fn history_loose_objects(&self, store_dir: &Path) -> usize {
        history::loose_estimate(store_dir)
    }
    fn pack_history(
        &self,
        paths: &grove_core::history::HistoryPaths<'_>,
    ) -> Result<usize, GitError> {
        history::pack(paths)
    }
}

impl GitPort for Git2Adapter {
    fn ensure_cache(
        &self,
        url: &str,
        cache_dir: &Path,
        token: Option<&GitToken>,
        fetch: bool,
        watch: &TransferWatch,
    ) -> Result<CacheReport, GitError> {
        let sync = cache::Sync {
            url,
            token,
            config: &self.transport,
            watch,
        };
        cache::ensure_cache(&sync, cache_dir, fetch)
    }

    fn create_checkout(&self, req: &CheckoutRequest<'_>) -> Result<CheckoutReport, GitError> {
        checkout::create_checkout(req)
    }

    fn is_dirty(&self, workspace_dir: &Path) -> Result<bool, GitError> {
        checkout::is_dirty(workspace_dir)
    }

    fn remove_checkout(&self, workspace_dir: &Path) -> Result<(), GitError> {
        checkout::remove_checkout(workspace_dir)
    }

    fn save_work(&self, req: &SaveWorkRequest<'_>) -> Result<SaveWorkReport, GitError> {
        let report = saved::save_work(req)?;
        // A save precedes the workspace's move to the trash: its record goes now, so
        // none outlives the workspace (one that stays adopts its cache again; ADR 23).
        trusted::forget_cache(req.workspace_dir)?;
        Ok(report)
    }

    fn restore_checkout(&self, req: &RestoreRequest<'_>) -> Result<CheckoutReport, GitError> {
        preserve::restore_checkout(req)
    }

    fn discard_saved_work(
        &self,
        cache_dir: &Path,
        ref_name: &str,
        store_dir: &Path,
    ) -> Result<(), GitError> {
        preserve::discard_saved_work(cache_dir, ref_name, store_dir)
    }

    fn move_saved_out_of_cache(
        &self,
        cache_dir: &Path,
        saved: &SavedWork,
        branch: Option<&str>,
        store_dir: &Path,
    ) -> Result<SavedWork, GitError> {
        saved::move_out_of_cache(cache_dir, saved, branch, store_dir)
    }

    fn recover_journal(
        &self,
        journal: &Path,
        workspace_dir: &Path,
    ) -> Result<Option<JournalRecovery>, GitError> {
        journal::recover(journal, workspace_dir)
    }

    fn cache_saved_refs(&self, cache_dir: &Path) -> Result<Vec<String>, GitError> {
        preserve::cache_saved_refs(cache_dir)
    }

    fn drop_cache_ref(&self, cache_dir: &Path, ref_name: &str) -> Result<(), GitError> {
        preserve::drop_cache_ref(cache_dir, ref_name)
    }

    fn measure(&self, dir: &Path) -> Result<i64, GitError> {
        tree::tree_size(dir)
            .map(|n| i64::try_from(n).unwrap_or(i64::MAX))
            .map_err(|e| errors::map_io("cannot measure a directory", &e))
    }

    fn remove_trash(&self, trash_dir: &Path) -> Result<(), GitError> {
        preserve::remove_trash(trash_dir)
    }

    fn status(&self, workspace_dir: &Path) -> Result<GitStatus, GitError> {
        workdir::status(workspace_dir)
    }

    fn diff(
        &self,
        workspace_dir: &Path,
        against: &DiffAgainst,
        paths: &[String],
        max_bytes: usize,
    ) -> Result<GitDiff, GitError> {
        workdir::diff(workspace_dir, against, paths, max_bytes)
    }

    fn log(&self, workspace_dir: &Path, max_count: usize) -> Result<Vec<LogEntry>, GitError> {
        workdir::log(workspace_dir, max_count)
    }

    fn commit(&self, req: &CommitRequest<'_>) -> Result<Committed, GitError> {
        workdir::commit(req)
    }

    fn push(&self, req: &PushRequest<'_>) -> Result<Pushed, GitError> {
        workdir::push(req)
    }

    fn merge_back_diff(&self, req: &MergeBackRequest<'_>) -> Result<MergeBackDiff, MergeBackError> {
        merge::diff(req)
    }

    fn merge_back(
        &self,
        req: &MergeBackRequest<'_>,
        strategy: MergeStrategy,
    ) -> Result<MergeBackReport, MergeBackError> {
        merge::merge_back(req, strategy)
    }
}
