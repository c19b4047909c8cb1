//! Repo-cache side of saved work: the object copy merge-back uses, restoring work an
//! older version saved in the cache (`refs/grove/saved/<id>`, until the worker moves it
//! into the workspace's private store), dropping such refs, and emptying the trash.
//!
//! **Legacy restore.** A fresh checkout borrowing the cache's objects, built in a
//! partial sibling and renamed into place: the branch at the saved HEAD, the working
//! tree from the saved commit, the index at HEAD. Work saved by this version lives in a
//! private store and is restored by `restore` (everything, staged state included).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use git2::build::CheckoutBuilder;
use git2::{ErrorCode, ObjectType, Odb, Oid, Repository, RepositoryInitOptions, Sort};
use grove_core::error::GitError;
use grove_core::model::LEGACY_SAVED_REF_PREFIX;
use grove_core::ports::{CheckoutReport, RestoreRequest};

use crate::errors::{map_git2, map_io, Phase};
use crate::fsutil::{
    dir_size_bytes, ensure_parent, partial_sibling, remove_path, remove_stale_partials, PartialDir,
};

const AGENT_NAME: &str = "grove agent";
const AGENT_EMAIL: &str = "agent@grove.invalid";

fn local(e: git2::Error) -> GitError {
    map_git2(&e, Phase::Local, None)
}

pub(crate) fn open_cache(cache_dir: &Path) -> Result<Repository, GitError> {
    crate::trusted::open_cache(cache_dir).map_err(|e| {
        GitError::Other(format!(
            "cannot open the repo cache: {}",
            crate::errors::scrub(e.message(), None)
        ))
    })
}

/// Copies into `cache` every object `commit` needs that the cache does not have.
pub(crate) fn copy_missing(
    ws: &Repository,
    cache: &Repository,
    commit: Oid,
) -> Result<(), GitError> {
    let src = ws.odb().map_err(local)?;
    let dst = cache.odb().map_err(local)?;
    if dst.exists(commit) {
        return Ok(());
    }
    // The commits the cache lacks, and the boundary (parents it has) to stop a walk at.
    let mut missing: HashSet<Oid> = HashSet::new();
    let mut boundary: HashSet<Oid> = HashSet::new();
    let mut stack = vec![commit];
    while let Some(id) = stack.pop() {
        if missing.contains(&id) || boundary.contains(&id) {
            continue;
        }
        if dst.exists(id) {
            boundary.insert(id);
            continue;
        }
        missing.insert(id);
        let c = ws.find_commit(id).map_err(local)?;
        stack.extend(c.parent_ids());
    }
    // Parents before children.
    let mut walk = ws.revwalk().map_err(local)?;
    walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)
        .map_err(local)?;
    walk.push(commit).map_err(local)?;
    for id in &boundary {
        walk.hide(*id).map_err(local)?;
    }
    let mut done: HashSet<Oid> = HashSet::new();
    for id in walk {
        let id = id.map_err(local)?;
        let c = ws.find_commit(id).map_err(local)?;
        copy_tree(ws, &src, &dst, c.tree_id(), &mut done)?;
        copy_object(&src, &dst, id)?;
    }
    Ok(())
}

/// Copies a tree and what it holds (children first); a tree the cache already has is
/// complete there, so it is not descended into.
fn copy_tree(
    ws: &Repository,
    src: &Odb<'_>,
    dst: &Odb<'_>,
    tree_id: Oid,
    done: &mut HashSet<Oid>,
) -> Result<(), GitError> {
    if done.contains(&tree_id) || dst.exists(tree_id) {
        return Ok(());
    }
    let tree = ws.find_tree(tree_id).map_err(local)?;
    for entry in tree.iter() {
        let id = entry.id();
        match entry.kind() {
            Some(ObjectType::Tree) => copy_tree(ws, src, dst, id, done)?,
            Some(ObjectType::Blob) if !done.contains(&id) && !dst.exists(id) => {
                copy_object(src, dst, id)?;
                done.insert(id);
            }
            // Gitlinks (submodules, nested repositories) name commits of another repo.
            _ => {}
        }
    }
    copy_object(src, dst, tree_id)?;
    done.insert(tree_id);
    Ok(())
}

fn copy_object(src: &Odb<'_>, dst: &Odb<'_>, id: Oid) -> Result<(), GitError> {
    let obj = src.read(id).map_err(local)?;
    let written = dst.write(obj.kind(), obj.data()).map_err(local)?;
    if written != id {
        return Err(GitError::Other(format!(
            "copying object {id} into the repo cache wrote {written}"
        )));
    }
    Ok(())
}

pub(crate) fn restore_checkout(req: &RestoreRequest<'_>) -> Result<CheckoutReport, GitError> {
    if let Some(store) = req.store_dir {
        if let Some(manifest) = crate::saved::read_manifest(store)? {
            return crate::restore::restore_from_store(req, store, &manifest);
        }
    }
    let ws = req.workspace_dir;
    match std::fs::symlink_metadata(ws) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Ok(_) => {
            return Err(GitError::Other(format!(
                "cannot restore into {}: something already exists there",
                ws.display()
            )))
        }
        Err(e) => return Err(map_io("cannot inspect the workspace path", &e)),
    }
    let cache = open_cache(req.cache_dir)?;
    let parse = |what: &str, id: &str| {
        Oid::from_str(id).map_err(|_| GitError::Other(format!("invalid {what} commit id")))
    };
    let head = parse("head", req.head_commit)?;
    let work = req.work_commit.map(|w| parse("saved", w)).transpose()?;
    for id in std::iter::once(head).chain(work) {
        if cache.find_commit(id).is_err() {
            return Err(GitError::RefNotFound(id.to_string()));
        }
    }
    // `origin/<base>` as the workspace had it, when the base is a branch of the cache.
    let base_branch = req
        .base_ref
        .strip_prefix("refs/heads/")
        .unwrap_or(req.base_ref)
        .to_string();
    let base_origin = match (
        cache.find_reference(&format!("refs/heads/{base_branch}")),
        Oid::from_str(req.base_commit),
    ) {
        (Ok(_), Ok(base)) if cache.find_commit(base).is_ok() => Some((base_branch, base)),
        _ => None,
    };
    let objects = std::path::absolute(req.cache_dir.join("objects"))
        .map_err(|e| map_io("cannot resolve the cache's object directory", &e))?;
    drop(cache);

    ensure_parent(ws).map_err(|e| map_io("cannot create the workspace's parent", &e))?;
    remove_stale_partials(ws).map_err(|e| map_io("cannot remove a stale partial workspace", &e))?;
    let partial = PartialDir::new(
        partial_sibling(ws).map_err(|e| map_io("cannot name a partial workspace", &e))?,
    );
    build(partial.path(), &objects, req, head, work, base_origin)?;
    crate::trusted::record_cache(ws, &objects)?;
    partial
        .commit_to(ws)
        .map_err(|e| map_io("cannot move the restored checkout into place", &e))?;
    let size_bytes = dir_size_bytes(ws).map_err(|e| map_io("cannot measure the workspace", &e))?;
    tracing::info!(path = %ws.display(), head = %head, "workspace restored");
    Ok(CheckoutReport {
        base_commit: req.base_commit.to_string(),
        size_bytes,
    })
}

fn build(
    dir: &Path,
    cache_objects: &Path,
    req: &RestoreRequest<'_>,
    head: Oid,
    work: Option<Oid>,
    base_origin: Option<(String, Oid)>,
) -> Result<(), GitError> {
    let mut opts = RepositoryInitOptions::new();
    opts.bare(false).no_reinit(true).mkpath(true);
    crate::trusted::init();
    let repo = Repository::init_opts(dir, &opts).map_err(local)?;
    let info_dir: PathBuf = repo.path().join("objects").join("info");
    drop(repo);
    std::fs::create_dir_all(&info_dir).map_err(|e| map_io("cannot create objects/info", &e))?;
    let mut alternates = cache_objects.as_os_str().as_encoded_bytes().to_vec();
    alternates.push(b'\n');
    std::fs::write(info_dir.join("alternates"), alternates)
        .map_err(|e| map_io("cannot write objects/info/alternates", &e))?;

    let repo = crate::trusted::open_fresh(dir)?;
    if let Some((branch, base)) = base_origin {
        repo.reference(
            &format!("refs/remotes/origin/{branch}"),
            base,
            true,
            "grove: base",
        )
        .map_err(local)?;
    }
    repo.remote("origin", req.upstream_url).map_err(local)?;
    {
        let mut config = repo.config().map_err(local)?;
        config.set_str("user.name", AGENT_NAME).map_err(local)?;
        config.set_str("user.email", AGENT_EMAIL).map_err(local)?;
    }
    let head_commit = repo.find_commit(head).map_err(local)?;
    match req.branch {
        Some(name) => {
            let branch = repo.branch(name, &head_commit, true).map_err(local)?;
            let refname = branch
                .get()
                .name()
                .map_err(|_| GitError::Other("branch name is not UTF-8".to_string()))?
                .to_string();
            repo.set_head(&refname).map_err(local)?;
        }
        None => repo.set_head_detached(head).map_err(local)?,
    }
    let mut checkout = CheckoutBuilder::new();
    checkout.force();
    repo.checkout_head(Some(&mut checkout)).map_err(local)?;

    if let Some(work) = work {
        // The saved tree into the working directory (this also moves the index), then the
        // index back to HEAD: the changes are uncommitted again, untracked files untracked.
        let work_tree = repo
            .find_commit(work)
            .and_then(|c| c.tree())
            .map_err(local)?;
        let mut checkout = CheckoutBuilder::new();
        checkout.force();
        repo.checkout_tree(work_tree.as_object(), Some(&mut checkout))
            .map_err(local)?;
        let head_tree = head_commit.tree().map_err(local)?;
        let mut index = repo.index().map_err(local)?;
        index.read_tree(&head_tree).map_err(local)?;
        index.write().map_err(local)?;
    }
    Ok(())
}

pub(crate) fn discard_saved_work(
    cache_dir: &Path,
    ref_name: &str,
    store_dir: &Path,
) -> Result<(), GitError> {
    if cache_dir.is_dir() && ref_name.starts_with(LEGACY_SAVED_REF_PREFIX) {
        drop_cache_ref(cache_dir, ref_name)?;
    }
    crate::saved::discard_store(store_dir)
}

/// Deletes one ref from a repo cache (absent is Ok).
pub(crate) fn drop_cache_ref(cache_dir: &Path, ref_name: &str) -> Result<(), GitError> {
    let cache = open_cache(cache_dir)?;
    let found = cache.find_reference(ref_name);
    match found {
        Ok(mut r) => r.delete().map_err(local),
        Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
        Err(e) => Err(local(e)),
    }
}

/// The names of every saved-work ref an older version left in a repo cache.
pub(crate) fn cache_saved_refs(cache_dir: &Path) -> Result<Vec<String>, GitError> {
    let cache = open_cache(cache_dir)?;
    let glob = format!("{LEGACY_SAVED_REF_PREFIX}*");
    let mut out = Vec::new();
    for r in cache.references_glob(&glob).map_err(local)? {
        if let Ok(name) = r.map_err(local)?.name() {
            out.push(name.to_string());
        }
    }
    Ok(out)
}

/// Removes a directory moved into grove's trash. Refuses anything not directly inside a
/// directory named `trash`, so a wiring mistake cannot delete a live tree.
pub(crate) fn remove_trash(trash_dir: &Path) -> Result<(), GitError> {
    let in_trash = trash_dir
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|n| n == "trash");
    if !in_trash {
        return Err(GitError::Other(format!(
            "refusing to remove {}: not inside a trash directory",
            trash_dir.display()
        )));
    }
    // Descriptor-based, never following a symlink the agent left in the tree; a tree
    // with read-only directories (a non-root worker) falls back to making them writable.
    crate::tree::remove_tree(trash_dir)
        .or_else(|e| match e.kind() {
            std::io::ErrorKind::PermissionDenied => remove_path(trash_dir),
            _ => Err(e),
        })
        .map_err(|e| map_io("cannot empty the trash", &e))
}
