//! Giving a workspace back from its private saved-work store.
//!
//! A fresh checkout borrowing the repo cache's objects (like a new workspace) is built
//! in a partial sibling of the workspace path and renamed into place, so a crash leaves
//! either no workspace or the whole restored one. Into it go the objects the store
//! holds for every saved ref, stash entry and snapshot (copied, never borrowed: the store
//! stays private), then every ref, the stash list (the reflog of `refs/stash`), HEAD as
//! it was (branch or detached), the working tree from the working-tree snapshot (modes
//! and symlinks as recorded) and last the index from the index snapshot — so staged,
//! unstaged, untracked and ignored files come back as they were.

use std::path::Path;

use git2::build::CheckoutBuilder;
use git2::{Oid, Repository, RepositoryInitOptions, Signature, Time};
use grove_core::error::GitError;
use grove_core::ports::{CheckoutReport, RestoreRequest};

use crate::errors::{map_git2, map_io, Phase};
use crate::fsutil::{ensure_parent, partial_sibling, remove_stale_partials, PartialDir};
use crate::saved::{copy_closure, open_store, HeadState, Manifest};

const AGENT_NAME: &str = "grove agent";
const AGENT_EMAIL: &str = "agent@grove.invalid";

fn local(e: git2::Error) -> GitError {
    map_git2(&e, Phase::Local, None)
}

fn oid(id: &str) -> Result<Oid, GitError> {
    Oid::from_str(id).map_err(|_| GitError::Other(format!("invalid commit id {id:?} in a store")))
}

/// Restores `req.workspace_dir` (which must not exist) from the store at `store`.
pub(crate) fn restore_from_store(
    req: &RestoreRequest<'_>,
    store: &Path,
    manifest: &Manifest,
) -> Result<CheckoutReport, GitError> {
    let ws = req.workspace_dir;
    if std::fs::symlink_metadata(ws).is_ok() {
        return Err(GitError::Other(format!(
            "cannot restore into {}: something already exists there",
            ws.display()
        )));
    }
    let objects = std::path::absolute(req.cache_dir.join("objects"))
        .map_err(|e| map_io("cannot resolve the cache's object directory", &e))?;
    ensure_parent(ws).map_err(|e| map_io("cannot create the workspace's parent", &e))?;
    remove_stale_partials(ws).map_err(|e| map_io("cannot remove a stale partial workspace", &e))?;
    let partial = PartialDir::new(
        partial_sibling(ws).map_err(|e| map_io("cannot name a partial workspace", &e))?,
    );
    let store = open_store(store, req.cache_dir)?;
    build(partial.path(), &objects, req, &store, manifest)?;
    drop(store);
    partial
        .commit_to(ws)
        .map_err(|e| map_io("cannot move the restored checkout into place", &e))?;
    let size_bytes = crate::tree::tree_size(ws)
        .map(|n| i64::try_from(n).unwrap_or(i64::MAX))
        .map_err(|e| map_io("cannot measure the workspace", &e))?;
    tracing::info!(path = %ws.display(), head = %manifest.head.commit(), "workspace restored from its store");
    Ok(CheckoutReport {
        base_commit: req.base_commit.to_string(),
        size_bytes,
    })
}

/// A new repository at `dir` whose objects come from the cache (alternates).
pub(crate) fn init_checkout(
    dir: &Path,
    cache_objects: &Path,
    req: &RestoreRequest<'_>,
) -> Result<Repository, GitError> {
    let mut opts = RepositoryInitOptions::new();
    opts.bare(false).no_reinit(true).mkpath(true);
    let repo = Repository::init_opts(dir, &opts).map_err(local)?;
    let info_dir = repo.path().join("objects").join("info");
    drop(repo);
    std::fs::create_dir_all(&info_dir).map_err(|e| map_io("cannot create objects/info", &e))?;
    let mut alternates = cache_objects.as_os_str().as_encoded_bytes().to_vec();
    alternates.push(b'\n');
    std::fs::write(info_dir.join("alternates"), alternates)
        .map_err(|e| map_io("cannot write objects/info/alternates", &e))?;
    let repo = crate::trusted::open_fresh(dir)?;
    repo.remote("origin", req.upstream_url).map_err(local)?;
    {
        let mut config = repo.config().map_err(local)?;
        config.set_str("user.name", AGENT_NAME).map_err(local)?;
        config.set_str("user.email", AGENT_EMAIL).map_err(local)?;
    }
    Ok(repo)
}

fn build(
    dir: &Path,
    cache_objects: &Path,
    req: &RestoreRequest<'_>,
    store: &Repository,
    m: &Manifest,
) -> Result<(), GitError> {
    let repo = init_checkout(dir, cache_objects, req)?;
    let dst = repo.odb().map_err(local)?;
    let head = oid(m.head.commit())?;
    let index_commit = oid(&m.index_commit)?;
    let work_commit = oid(&m.work_commit)?;
    let mut roots = vec![head, index_commit, work_commit];
    for r in &m.refs {
        roots.extend(r.target.as_deref().map(oid).transpose()?);
    }
    for s in &m.stash {
        roots.push(oid(&s.commit)?);
    }
    for id in roots {
        copy_closure(store, &dst, id)?;
    }
    drop(dst);
    restore_refs(&repo, m)?;
    match &m.head {
        HeadState::Branch { name, .. } => {
            if repo.find_reference(name).is_err() {
                repo.reference(name, head, true, "grove: restored")
                    .map_err(local)?;
            }
            repo.set_head(name).map_err(local)?;
        }
        HeadState::Detached { .. } => repo.set_head_detached(head).map_err(local)?,
    }
    let work_tree = repo
        .find_commit(work_commit)
        .and_then(|c| c.tree())
        .map_err(local)?;
    let mut checkout = CheckoutBuilder::new();
    checkout.force().recreate_missing(true);
    repo.checkout_tree(work_tree.as_object(), Some(&mut checkout))
        .map_err(local)?;
    // The index last: what was staged is staged again, the rest is unstaged or
    // untracked (or ignored) exactly as it was.
    let index_tree = repo
        .find_commit(index_commit)
        .and_then(|c| c.tree())
        .map_err(local)?;
    let mut index = repo.index().map_err(local)?;
    index.read_tree(&index_tree).map_err(local)?;
    index.write().map_err(local)?;
    Ok(())
}

/// Every saved ref (direct ones first, then symbolic ones), then the stash list.
fn restore_refs(repo: &Repository, m: &Manifest) -> Result<(), GitError> {
    for r in &m.refs {
        if let Some(t) = r.target.as_deref() {
            repo.reference(&r.name, oid(t)?, true, "grove: restored")
                .map_err(local)?;
        }
    }
    for r in &m.refs {
        if let (None, Some(s)) = (&r.target, &r.symbolic) {
            repo.reference_symbolic(&r.name, s, true, "grove: restored")
                .map_err(local)?;
        }
    }
    if m.stash.is_empty() {
        return Ok(());
    }
    let _ = repo.reflog_delete("refs/stash");
    let mut log = repo.reflog("refs/stash").map_err(local)?;
    for s in &m.stash {
        let when = Time::new(s.time, s.offset_minutes);
        let who = Signature::new(&s.name, &s.email, &when)
            .or_else(|_| Signature::new("grove", "grove@grove.invalid", &when))
            .map_err(local)?;
        log.append(oid(&s.commit)?, &who, Some(&s.message))
            .map_err(local)?;
    }
    log.write().map_err(local)?;
    Ok(())
}
