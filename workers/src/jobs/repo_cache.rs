//! `ensure_repo_cache`: the node's clone of a repository, cloned if absent and fetched
//! when asked, stale or first served to other credentials.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use grove_core::commands::{CommandResult, EnsureRepoCache};
use grove_core::error::CommandError;
use grove_core::events::{Correlation, Event};
use grove_core::inline::use_is_recent;
use grove_core::model::RepoCacheRow;
use grove_core::ports::GitToken;
use grove_core::state::RepoCacheState;
use grove_core::validate::RepoUrl;
use grove_postgres::folded::HeldRows;
use grove_postgres::locks::{lock_key, AdvisoryLock, LeaseCommit, LockScope};
use grove_postgres::rows;
use uuid::Uuid;

use crate::context::{blocking, fold_cache, store_error, Handled, JobContext, Reuse};

impl JobContext {
    async fn cache_by_identity(
        &self,
        identity: &str,
    ) -> Result<Option<RepoCacheRow>, CommandError> {
        let mut conn = self.conn().await?;
        rows::repo_cache_by_identity(&mut conn, &self.config.node, identity)
            .await
            .map_err(store_error)
    }

    /// Ensures the repo cache on this node: clones if absent, fetches if asked or stale.
    /// Returns the row as it will be after `events` commit, and the lock (if one was
    /// needed) that must be held until then.
    pub(crate) async fn ensure_cache(
        &self,
        repo_name: &str,
        repo_url: &str,
        fetch: bool,
        token: Option<&GitToken>,
        at: DateTime<Utc>,
        command_id: Uuid,
    ) -> Result<(RepoCacheRow, Vec<Event>, Option<AdvisoryLock>), CommandError> {
        let url = RepoUrl::parse(repo_url)?;
        // A cache cloned with credentials is served to a caller with other (or no)
        // credentials only after a fetch with theirs succeeds: the fetch is the access check.
        let scope = self.auth_scope(token).await?;
        let need = CacheNeed {
            fetch,
            at,
            freshness: self.config.cache_freshness,
            scope: scope.clone(),
        };
        if let Some(used) = self.use_shared(&url, &need, LeaseCommit::Flushed).await? {
            return Ok(used);
        }
        let lock = self
            .lock(LockScope::RepoCache, &self.cache_lock_key(&url), false)
            .await?;
        // Another worker may have created or fetched it while we waited.
        let existing = self.cache_by_identity(url.identity()).await?;
        let cache_dir = self.layout.repo_cache_dir(url.identity());
        let must_fetch = existing.as_ref().is_some_and(|row| need.must_fetch(row));
        let git = self.git.clone();
        let (u, d, t) = (repo_url.to_string(), cache_dir.clone(), token.cloned());
        let (watch, writer) = crate::progress::recorder(self.pool.clone(), command_id);
        // Dropping this job's future (a stopping worker) cancels the transfer, which
        // kills git's process group instead of leaving it running unowned.
        let guard = watch.cancel_on_drop();
        let report =
            blocking(move || git.ensure_cache(&u, &d, t.as_ref(), must_fetch, &watch)).await;
        guard.disarm();
        // The watch is gone with the blocking call: the writer records the last
        // snapshot and ends, before the outcome is committed.
        let _ = writer.await;
        let report = report?;
        let events = match &existing {
            Some(row) if report.fetched => vec![Event::RepoCacheFetched {
                repo_cache_id: row.id,
                size_bytes: report.size_bytes,
            }],
            Some(row) => vec![Event::RepoCacheUsed {
                repo_cache_id: row.id,
            }],
            None => vec![cache_created(
                Uuid::now_v7(),
                &self.config.node,
                &url,
                repo_name,
                cache_dir.to_string_lossy().into_owned(),
                scope,
                report.size_bytes,
            )],
        };
        Ok((fold_cache(existing, &events, at), events, Some(lock)))
    }

    /// The lock value of this node's cache of `url`.
    fn cache_lock_key(&self, url: &RepoUrl) -> String {
        format!("{}\u{0}{}", self.config.node, url.identity())
    }

    /// A fresh cache this caller may use as it is, under a shared lock: concurrent users
    /// of a fresh cache do not wait for each other, and an eviction sweep (exclusive)
    /// cannot delete it while a checkout reads it. `None`: it must be cloned or fetched.
    async fn use_shared(
        &self,
        url: &RepoUrl,
        need: &CacheNeed,
        commit: LeaseCommit,
    ) -> Result<Option<(RepoCacheRow, Vec<Event>, Option<AdvisoryLock>)>, CommandError> {
        let existing = self.cache_by_identity(url.identity()).await?;
        if !existing.as_ref().is_some_and(|row| need.usable(row)) {
            return Ok(None);
        }
        self.use_locked(url, need, commit).await
    }

    /// [`Self::use_shared`] once an unlocked read found the cache usable: the shared
    /// lock, the row read again under it, and `repo_cache.used`.
    async fn use_locked(
        &self,
        url: &RepoUrl,
        need: &CacheNeed,
        commit: LeaseCommit,
    ) -> Result<Option<(RepoCacheRow, Vec<Event>, Option<AdvisoryLock>)>, CommandError> {
        let mut shared = self
            .lock_with(
                LockScope::RepoCache,
                &self.cache_lock_key(url),
                true,
                commit,
            )
            .await?;
        let node = &self.config.node;
        let current = rows::repo_cache_by_identity_versioned(shared.conn(), node, url.identity())
            .await
            .map_err(store_error);
        match current {
            Ok(Some((row, version))) if need.usable(&row) => {
                // Its record folds onto the row read here (ADR 36).
                shared.hold(HeldRows::repo_cache(row.clone(), version));
                let events = vec![Event::RepoCacheUsed {
                    repo_cache_id: row.id,
                }];
                Ok(Some((
                    fold_cache(Some(row), &events, need.at),
                    events,
                    Some(shared),
                )))
            }
            Ok(_) => {
                // Evicted while we waited: clone it again.
                shared.release().await.ok();
                Ok(None)
            }
            Err(e) => {
                shared.release().await.ok();
                Err(e)
            }
        }
    }

    /// The cheap case of an ensure, for running it inline (ADR 34): the cache exists,
    /// is fresh, was cloned with the caller's credentials (or none) and has its files,
    /// so the queued handler would only use it. If its use was recorded within the
    /// recent-use window, the row as it stands is the answer (ADR 40); else
    /// `repo_cache.used` under the cache's shared lock, as [`Self::ensure_repo_cache`]
    /// takes it. `None` (no lock held) when a clone or a fetch is needed: the ensure
    /// takes the queue.
    pub(crate) async fn use_cache_inline(
        &self,
        c: &EnsureRepoCache,
        token: Option<&GitToken>,
        at: DateTime<Utc>,
    ) -> Result<Option<Reuse>, CommandError> {
        if c.fetch {
            return Ok(None);
        }
        let url = RepoUrl::parse(&c.repo_url)?;
        let need = CacheNeed {
            fetch: false,
            at,
            freshness: self.config.cache_freshness,
            scope: self.auth_scope(token).await?,
        };
        let Some(seen) = self
            .cache_by_identity(url.identity())
            .await?
            .filter(|row| need.usable(row))
        else {
            return Ok(None);
        };
        let window = self.config.eviction.recent_use_window();
        if use_is_recent(seen.last_used_at, at, window) {
            // An eviction of the cache holds its lock exclusively.
            let locks = vec![lock_key(LockScope::RepoCache, &self.cache_lock_key(&url))];
            let result = CommandResult::RepoCache(seen);
            return Ok(Some(Reuse::Recent { result, locks }));
        }
        // Its one effect is its flushed commit, which the lease rides on (ADR 35).
        let used = self
            .use_locked(&url, &need, LeaseCommit::WithNextCommit)
            .await?;
        Ok(used.map(|(row, events, lock)| {
            Reuse::Record(Handled {
                result: Ok(CommandResult::RepoCache(row)),
                events,
                locks: lock.into_iter().collect(),
                correlation: Correlation::default(),
            })
        }))
    }

    pub async fn ensure_repo_cache(
        &self,
        c: &EnsureRepoCache,
        command_id: Uuid,
        token: Option<&GitToken>,
        at: DateTime<Utc>,
    ) -> Result<Handled, CommandError> {
        let (row, events, lock) = self
            .ensure_cache(&c.repo_name, &c.repo_url, c.fetch, token, at, command_id)
            .await?;
        Ok(Handled {
            result: Ok(CommandResult::RepoCache(row)),
            events,
            locks: lock.into_iter().collect(),
            correlation: Correlation::default(),
        })
    }
}

/// What an ensure asks of a cache.
struct CacheNeed {
    /// A fetch was asked for.
    fetch: bool,
    at: DateTime<Utc>,
    /// A cache older than this is fetched.
    freshness: Duration,
    /// The caller's credentials' fingerprint.
    scope: Option<String>,
}

impl CacheNeed {
    fn stale(&self, row: &RepoCacheRow) -> bool {
        row.last_fetched_at
            .is_none_or(|t| (self.at - t).to_std().unwrap_or_default() > self.freshness)
    }

    /// Cloned with other credentials than the caller's.
    fn foreign(&self, row: &RepoCacheRow) -> bool {
        row.auth_scope_hash.is_some() && row.auth_scope_hash != self.scope
    }

    fn must_fetch(&self, row: &RepoCacheRow) -> bool {
        self.fetch || self.stale(row) || self.foreign(row)
    }

    /// Usable as it is: no fetch needed, and its files are in place.
    fn usable(&self, row: &RepoCacheRow) -> bool {
        !self.must_fetch(row)
            && row.state != RepoCacheState::Evicted
            && PathBuf::from(&row.local_path).is_dir()
    }
}

/// `repo_cache.created` for a clone of `url` on `node` at `local_path`.
pub(crate) fn cache_created(
    repo_cache_id: Uuid,
    node: &str,
    url: &RepoUrl,
    repo_name: &str,
    local_path: String,
    auth_scope_hash: Option<String>,
    size_bytes: i64,
) -> Event {
    Event::RepoCacheCreated {
        repo_cache_id,
        node: node.to_string(),
        identity: url.identity().to_string(),
        repo_name: repo_name.to_string(),
        repo_url: url.as_str().to_string(),
        provider: if url.is_local() {
            "local".into()
        } else {
            "git".into()
        },
        provider_host: url.host().to_string(),
        local_path,
        auth_scope_hash,
        size_bytes,
    }
}
