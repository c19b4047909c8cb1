//! Preserving a workspace's work in its repo cache before eviction, and restoring it.
//!
//! **Save.** The working tree is snapshotted through the workspace's index, in memory
//! only (`add_all` + `update_all` on the loaded index, `write_tree`, never `write`): new
//! untracked files are included, ignored ones are not, and the index file on disk is
//! left as it was. When the tree differs from HEAD's, a commit with that tree and HEAD as
//! its parent is written. Every object that commit needs and the cache lacks (the
//! snapshot's new blobs and trees, and the workspace's local commits with theirs) is
//! then copied into the cache's object store — children before parents, commits after
//! their trees and parents, so an object present in the cache always has its whole
//! closure there even if a copy is interrupted. The ref is written last. The patch (the
//! same change as a binary-safe `git diff --binary --full-index HEAD` would print) is
//! written next to it, atomically.
//!
//! **Restore.** A fresh checkout borrowing the cache's objects, like a new workspace,
//! built in a partial sibling and renamed into place: the branch at the saved HEAD,
//! the working tree from the saved commit, the index at HEAD — so the files are
//! byte-identical and `git status` shows the changes as unstaged (the staged/unstaged
//! split of the evicted workspace is not kept).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use git2::build::CheckoutBuilder;
use git2::{
    DiffFormat, DiffOptions, ErrorCode, IndexAddOption, ObjectType, Odb, Oid, Repository,
    RepositoryInitOptions, Signature, Sort,
};
use grove_core::error::GitError;
use grove_core::model::SavedWork;
use grove_core::ports::{CheckoutReport, RestoreRequest, SaveWorkReport, SaveWorkRequest};

use crate::errors::{map_git2, map_io, Phase};
use crate::fsutil::{
    dir_size_bytes, ensure_parent, partial_sibling, remove_path, remove_stale_partials, PartialDir,
};

const SAVER_NAME: &str = "grove";
const SAVER_EMAIL: &str = "grove@grove.invalid";
const AGENT_NAME: &str = "grove agent";
const AGENT_EMAIL: &str = "agent@grove.invalid";

fn local(e: git2::Error) -> GitError {
    map_git2(&e, Phase::Local, None)
}

fn open_cache(cache_dir: &Path) -> Result<Repository, GitError> {
    crate::trusted::open_cache(cache_dir).map_err(|e| {
        GitError::Other(format!(
            "cannot open the repo cache: {}",
            crate::errors::scrub(e.message(), None)
        ))
    })
}

pub(crate) fn save_work(req: &SaveWorkRequest<'_>) -> Result<SaveWorkReport, GitError> {
    let ws = crate::trusted::open_workspace(req.workspace_dir)?;
    let head = ws
        .head()
        .and_then(|h| h.peel_to_commit())
        .map_err(|e| GitError::Other(format!("workspace HEAD: {}", e.message())))?;
    let head_tree = head.tree().map_err(local)?;

    // The working tree as a tree object, through the index loaded in memory: files that
    // did not change are not re-hashed (the index's stat data says so).
    let tree_id = {
        let mut index = ws.index().map_err(local)?;
        index
            .add_all(["*"], IndexAddOption::DEFAULT, None)
            .map_err(local)?;
        index.update_all(["*"], None).map_err(local)?;
        index.write_tree().map_err(local)?
        // Dropped without `write`: the workspace's index file is untouched.
    };
    let dirty = tree_id != head_tree.id();
    let head_id = head.id();
    let at_base = Oid::from_str(req.base_commit).ok() == Some(head_id);
    if !dirty && at_base {
        remove_file(req.patch_path)?;
        return Ok(SaveWorkReport {
            dirty,
            head_commit: head_id.to_string(),
            saved: None,
        });
    }

    let commit_id = if dirty {
        let sig = Signature::now(SAVER_NAME, SAVER_EMAIL).map_err(local)?;
        let tree = ws.find_tree(tree_id).map_err(local)?;
        ws.commit(None, &sig, &sig, req.message, &tree, &[&head])
            .map_err(local)?
    } else {
        head_id
    };

    let cache = open_cache(req.cache_dir)?;
    copy_missing(&ws, &cache, commit_id)?;

    let patch_path = if dirty {
        let tree = ws.find_tree(tree_id).map_err(local)?;
        let patch = diff_patch(&ws, &head_tree, &tree)?;
        write_atomic(req.patch_path, &patch)?;
        Some(req.patch_path.to_string_lossy().into_owned())
    } else {
        remove_file(req.patch_path)?;
        None
    };

    // Last: the ref only ever names a commit whose objects are all in the cache.
    cache
        .reference(
            req.ref_name,
            commit_id,
            true,
            "grove: work saved before eviction",
        )
        .map_err(local)?;
    tracing::info!(
        workspace = %req.workspace_dir.display(),
        saved = %commit_id,
        dirty,
        "workspace work saved in the repo cache"
    );
    Ok(SaveWorkReport {
        dirty,
        head_commit: head_id.to_string(),
        saved: Some(SavedWork {
            ref_name: req.ref_name.to_string(),
            commit: commit_id.to_string(),
            head_commit: head_id.to_string(),
            patch_path,
        }),
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

/// `git diff --binary --full-index` from `old` to `new`, as bytes.
fn diff_patch(
    repo: &Repository,
    old: &git2::Tree<'_>,
    new: &git2::Tree<'_>,
) -> Result<Vec<u8>, GitError> {
    let mut opts = DiffOptions::new();
    opts.show_binary(true).id_abbrev(40);
    let diff = repo
        .diff_tree_to_tree(Some(old), Some(new), Some(&mut opts))
        .map_err(local)?;
    let mut out = Vec::new();
    diff.print(DiffFormat::Patch, |_delta, _hunk, line| {
        if matches!(line.origin(), '+' | '-' | ' ') {
            out.push(line.origin() as u8);
        }
        out.extend_from_slice(line.content());
        true
    })
    .map_err(local)?;
    Ok(out)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), GitError> {
    ensure_parent(path).map_err(|e| map_io("cannot create the saved-work directory", &e))?;
    let tmp = partial_sibling(path).map_err(|e| map_io("cannot name a partial patch", &e))?;
    let result = std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(map_io("cannot write the saved-work patch", &e));
    }
    Ok(())
}

fn remove_file(path: &Path) -> Result<(), GitError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(map_io("cannot remove a stale saved-work patch", &e)),
    }
}

pub(crate) fn restore_checkout(req: &RestoreRequest<'_>) -> Result<CheckoutReport, GitError> {
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
    patch_path: &Path,
) -> Result<(), GitError> {
    if cache_dir.is_dir() {
        let cache = open_cache(cache_dir)?;
        let found = cache.find_reference(ref_name);
        match found {
            Ok(mut r) => r.delete().map_err(local)?,
            Err(e) if e.code() == ErrorCode::NotFound => {}
            Err(e) => return Err(local(e)),
        };
    }
    remove_file(patch_path)
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
    remove_path(trash_dir).map_err(|e| map_io("cannot empty the trash", &e))
}
