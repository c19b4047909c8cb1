//! The repo cache: a bare mirror of the upstream's branches and tags, cloned once into
//! a partial sibling directory and renamed into place, then fetched on demand.

use std::cell::Cell;
use std::path::Path;
use std::time::Instant;

use git2::{
    AutotagOption, Cred, CredentialType, Direction, ErrorClass, ErrorCode, FetchOptions,
    FetchPrune, RemoteCallbacks, Repository, RepositoryInitOptions,
};
use grove_core::error::GitError;
use grove_core::ports::{CacheReport, GitToken};
use grove_core::transfer::{TransferPhase, TransferProgress, TransferWatch};

use crate::errors::{map_git2, map_io, scrub, Phase};
use crate::fsutil::{
    dir_size_bytes, ensure_parent, partial_sibling, remove_path, remove_stale_partials, PartialDir,
};
use crate::remote_cli::RemoteCli;
use crate::transport::{Transport, TransportConfig};

/// The cache mirrors local branches and tags of the upstream under the same names, so
/// `refs/heads/<base>` in the cache is the upstream's `<base>`.
pub(crate) const HEADS_REFSPEC: &str = "+refs/heads/*:refs/heads/*";
pub(crate) const TAGS_REFSPEC: &str = "+refs/tags/*:refs/tags/*";
const REMOTE: &str = "origin";

/// libgit2 calls the credentials callback again each time the server rejects what it
/// got; past this many calls the credentials are wrong and asking again only loops.
const MAX_CREDENTIAL_CALLS: u32 = 3;

/// One clone or fetch of a cache: where from, with what, how, watched by whom.
pub(crate) struct Sync<'a> {
    pub(crate) url: &'a str,
    pub(crate) token: Option<&'a GitToken>,
    pub(crate) config: &'a TransportConfig,
    pub(crate) watch: &'a TransferWatch,
}

pub(crate) fn ensure_cache(
    sync: &Sync<'_>,
    cache_dir: &Path,
    fetch: bool,
) -> Result<CacheReport, GitError> {
    let url = sync.url;
    if let Some(repo) = open_complete(cache_dir)? {
        set_origin_url(&repo, url)?;
        let fetched = if fetch {
            tracing::info!(url = %redact_url(url), path = %cache_dir.display(), "fetching repo cache");
            sync_remote(&repo, sync)?;
            true
        } else {
            false
        };
        drop(repo);
        return Ok(CacheReport {
            cloned: false,
            fetched,
            size_bytes: size_of(cache_dir)?,
        });
    }

    tracing::info!(url = %redact_url(url), path = %cache_dir.display(), "cloning repo cache");
    ensure_parent(cache_dir).map_err(|e| map_io("cannot create the cache's parent", &e))?;
    remove_stale_partials(cache_dir)
        .map_err(|e| map_io("cannot remove a stale partial cache", &e))?;
    // Whatever is at cache_dir is not a complete cache (open_complete said so): a
    // leftover from an older layout or a foreign directory. Clone replaces it.
    remove_path(cache_dir).map_err(|e| map_io("cannot remove a leftover cache directory", &e))?;

    let partial = PartialDir::new(
        partial_sibling(cache_dir).map_err(|e| map_io("cannot name a partial cache", &e))?,
    );
    {
        let repo = init_mirror(partial.path(), url)?;
        sync_remote(&repo, sync)?;
    }
    partial
        .commit_to(cache_dir)
        .map_err(|e| map_io("cannot move the cloned cache into place", &e))?;
    Ok(CacheReport {
        cloned: true,
        // A clone is a fetch into an empty repo: the cache is as fresh as after a fetch.
        fetched: true,
        size_bytes: size_of(cache_dir)?,
    })
}

fn size_of(dir: &Path) -> Result<i64, GitError> {
    dir_size_bytes(dir).map_err(|e| map_io("cannot measure the cache", &e))
}

/// Opens `cache_dir` if it holds a bare repo with an `origin` remote (which, since
/// clones are renamed into place only when done, means a complete cache). `None` when
/// there is nothing usable there; an error when it cannot tell (e.g. permissions),
/// because replacing a cache we merely failed to read would throw away a good clone.
fn open_complete(cache_dir: &Path) -> Result<Option<Repository>, GitError> {
    match std::fs::symlink_metadata(cache_dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(map_io("cannot inspect the cache directory", &e)),
    }
    let repo = match crate::trusted::open_cache(cache_dir) {
        Ok(repo) => repo,
        Err(e) if e.code() == ErrorCode::NotFound => return Ok(None),
        Err(e) => return Err(map_git2(&e, Phase::Local, None)),
    };
    let has_origin = match repo.find_remote(REMOTE) {
        Ok(_) => true,
        Err(e) if e.code() == ErrorCode::NotFound => false,
        Err(e) => return Err(map_git2(&e, Phase::Local, None)),
    };
    Ok(has_origin.then_some(repo))
}

/// A fresh bare repo configured as a mirror of `url`.
fn init_mirror(path: &Path, url: &str) -> Result<Repository, GitError> {
    let local = |e: git2::Error| map_git2(&e, Phase::Local, None);
    let mut opts = RepositoryInitOptions::new();
    opts.bare(true).no_reinit(true).mkpath(true);
    crate::trusted::init();
    let repo = Repository::init_opts(path, &opts).map_err(local)?;
    repo.remote_with_fetch(REMOTE, url, HEADS_REFSPEC)
        .map_err(local)?;
    repo.remote_add_fetch(REMOTE, TAGS_REFSPEC).map_err(local)?;
    {
        let mut config = repo.config().map_err(local)?;
        // Workspaces borrow this object store through `alternates`; a `git gc` run by
        // the git CLI here could prune objects only they still need. libgit2 never
        // collects garbage, so this only keeps the CLI from doing it on its own.
        config.set_i32("gc.auto", 0).map_err(local)?;
    }
    Ok(repo)
}

/// Records exactly the caller's URL as `origin`: a moved upstream updates it here.
fn set_origin_url(repo: &Repository, url: &str) -> Result<(), GitError> {
    let local = |e: git2::Error| map_git2(&e, Phase::Local, None);
    let current = repo.find_remote(REMOTE).map_err(local)?;
    if current.url_bytes() != url.as_bytes() {
        repo.remote_set_url(REMOTE, url).map_err(local)?;
    }
    Ok(())
}

/// Brings the cache's branches and tags up to date with the remote (pruning deleted
/// ones) and points HEAD at the remote's default branch, over the configured transport.
fn sync_remote(repo: &Repository, sync: &Sync<'_>) -> Result<(), GitError> {
    set_origin_url(repo, sync.url)?;
    let default_branch = match &sync.config.transport {
        Transport::Cli(git) => {
            let cli = RemoteCli::new(git, sync.config, sync.url, sync.token)?;
            let dir = repo.path();
            // The remote's HEAD is asked for while the fetch runs: on a small fetch
            // over HTTP the second round trip would otherwise be half the time.
            let (fetched, head) = std::thread::scope(|s| {
                let head = s.spawn(|| cli.default_branch(dir, sync.watch));
                let fetched = cli.fetch(dir, sync.watch);
                let head = head
                    .join()
                    .unwrap_or_else(|_| Err(GitError::Other("git ls-remote panicked".into())));
                (fetched, head)
            });
            fetched?;
            head?
        }
        Transport::Libgit2 => {
            let fetched = fetch_libgit2(repo, sync);
            release_freed_heap();
            fetched?
        }
        Transport::Missing(why) => return Err(GitError::Unavailable(why.clone())),
    };
    if let Some(branch) = default_branch {
        if branch.starts_with("refs/heads/") && repo.find_reference(&branch).is_ok() {
            repo.set_head(&branch)
                .map_err(|e| map_git2(&e, Phase::Local, sync.token))?;
        }
    }
    Ok(())
}

/// Hands the heap libgit2's indexer freed back to the system. glibc keeps freed memory
/// in the arena of the thread that freed it: after a large clone that is hundreds of
/// MiB that the worker never touches again (ADR 25 measures it).
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of the allocator to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The fetch through libgit2, in this process; returns the remote's default branch.
fn fetch_libgit2(repo: &Repository, sync: &Sync<'_>) -> Result<Option<String>, GitError> {
    let (url, token) = (sync.url, sync.token);
    let local = |e: git2::Error| map_git2(&e, Phase::Local, token);
    let mut remote = repo.find_remote(REMOTE).map_err(local)?;
    let auth = Auth::for_url(token, url);
    let started = Instant::now();
    let limit = sync.config.transfer_timeout;
    let remote_err = |e: git2::Error| -> GitError {
        if auth.refused.get() {
            return GitError::AuthFailed;
        }
        if sync.watch.is_cancelled() {
            return GitError::Cancelled;
        }
        if started.elapsed() >= limit {
            return GitError::ResourceLimit(format!(
                "the transfer took longer than {} s (GROVE_GIT_TRANSFER_TIMEOUT_SECS)",
                limit.as_secs()
            ));
        }
        let mapped = map_git2(&e, Phase::Remote, token);
        tracing::warn!(url = %redact_url(url), error = %mapped, "repo cache remote operation failed");
        mapped
    };

    let mut conn = remote
        .connect_auth(Direction::Fetch, Some(auth.callbacks()), None)
        .map_err(remote_err)?;
    // Read before fetching: the fetch disconnects, after which the remote's
    // advertisement (and so its HEAD) is gone.
    let default_branch = conn
        .default_branch()
        .ok()
        .and_then(|b| b.as_str().ok().map(str::to_string));
    let mut callbacks = auth.callbacks();
    callbacks.transfer_progress(|stats| {
        sync.watch.report(&libgit2_progress(&stats, started));
        !sync.watch.is_cancelled() && started.elapsed() < limit
    });
    let mut fo = FetchOptions::new();
    fo.remote_callbacks(callbacks)
        .prune(FetchPrune::On)
        // Tags come through the explicit tags refspec, including ones not on any branch.
        .download_tags(AutotagOption::None)
        .update_fetchhead(false);
    conn.remote()
        .fetch(&[] as &[&str], Some(&mut fo), Some("grove: fetch"))
        .map_err(remote_err)?;
    let last = libgit2_progress(&conn.remote().stats(), started);
    sync.watch.report(&TransferProgress {
        phase: TransferPhase::Done,
        percent: Some(100),
        ..last
    });
    Ok(default_branch)
}

/// libgit2's counters as a snapshot: receiving until every object is in, then indexing.
fn libgit2_progress(stats: &git2::Progress<'_>, started: Instant) -> TransferProgress {
    let (received, total) = (
        stats.received_objects() as u64,
        stats.total_objects() as u64,
    );
    let (deltas, deltas_total) = (stats.indexed_deltas() as u64, stats.total_deltas() as u64);
    let bytes = stats.received_bytes() as u64;
    let secs = started.elapsed().as_secs_f64().max(0.001);
    let receiving = total == 0 || received < total;
    let (done, of) = if receiving {
        (received, total)
    } else {
        (deltas, deltas_total)
    };
    TransferProgress {
        phase: if receiving {
            TransferPhase::Receiving
        } else {
            TransferPhase::Resolving
        },
        objects_done: done,
        objects_total: of,
        objects_received: received,
        deltas_done: deltas,
        deltas_total,
        bytes_received: bytes,
        bytes_per_sec: (bytes as f64 / secs) as u64,
        percent: (of > 0).then(|| (done * 100 / of).min(100) as u8),
    }
}

/// The credentials callback's state for one clone, fetch or push: the token, how often
/// libgit2 asked, and whether we stopped answering (which makes the failure an auth
/// failure whatever libgit2 reports afterwards).
pub(crate) struct Auth<'t> {
    token: Option<&'t GitToken>,
    /// The host (and port) of the URL grove chose; the token is only ever handed to a
    /// request for that same origin, whatever a redirect says.
    origin: Option<String>,
    calls: Cell<u32>,
    pub(crate) refused: Cell<bool>,
}

impl<'t> Auth<'t> {
    /// The callback state for one operation on `url`: the token is handed only to
    /// requests for `url`'s scheme, host and port.
    pub(crate) fn for_url(token: Option<&'t GitToken>, url: &str) -> Self {
        Self {
            token,
            origin: Some(origin_of(url)),
            calls: Cell::new(0),
            refused: Cell::new(false),
        }
    }

    pub(crate) fn callbacks(&self) -> RemoteCallbacks<'_> {
        let mut cb = RemoteCallbacks::new();
        cb.credentials(move |url, _username, allowed| {
            let calls = self.calls.get() + 1;
            self.calls.set(calls);
            let refuse = |why: &str| {
                self.refused.set(true);
                Err(git2::Error::new(ErrorCode::Auth, ErrorClass::Callback, why))
            };
            if calls > MAX_CREDENTIAL_CALLS {
                return refuse("the remote rejected the credentials");
            }
            let Some(token) = self.token else {
                return refuse("the remote asked for credentials and none were given");
            };
            if self.origin.as_ref().is_some_and(|o| *o != origin_of(url)) {
                return refuse("credentials were asked for by another host than grove's record");
            }
            if !allowed.contains(CredentialType::USER_PASS_PLAINTEXT) {
                return refuse("the remote asked for an unsupported credential type");
            }
            Cred::userpass_plaintext("x-access-token", token.expose())
                .map_err(|e| git2::Error::new(e.code(), e.class(), scrub(e.message(), self.token)))
        });
        cb
    }
}

/// `scheme://host:port` of a URL (userinfo dropped, lower-cased), or the whole string
/// when it has no scheme.
pub(crate) fn origin_of(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_ascii_lowercase();
    };
    let rest = &url[scheme_end + 3..];
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    format!("{}://{}", &url[..scheme_end], host).to_ascii_lowercase()
}

/// The URL with any userinfo removed, for log lines. Callers promise URLs without
/// credentials; this keeps a broken promise out of the logs anyway.
pub(crate) fn redact_url(url: &str) -> String {
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        let authority_end = rest.find('/').unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            return format!("{}***@{}", &url[..scheme_end + 3], &rest[at + 1..]);
        }
    }
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn userinfo_is_redacted_from_logged_urls() {
        assert_eq!(
            redact_url("https://x:secret@github.com/a/b.git"),
            "https://***@github.com/a/b.git"
        );
        assert_eq!(
            redact_url("https://github.com/a/b.git"),
            "https://github.com/a/b.git"
        );
        assert_eq!(redact_url("file:///tmp/a@b"), "file:///tmp/a@b");
    }
}
