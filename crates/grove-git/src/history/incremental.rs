//! A point from a set of changed paths instead of a walk of the whole tree (ADR 32):
//! each path is applied to the store's private index as the walk would (gone: removed;
//! there: read through descriptors by `beneath::add`; an untracked ignored file left
//! out), and a changed directory's subtree is read again by a walk of that subtree
//! alone, through descriptors, its rule files checked before libgit2 reads them.
//! Anything a walk of the subtree cannot decide as libgit2 would (a nested repository,
//! a gitlink in the index) asks for the full walk instead.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use git2::{Index, Repository};
use grove_core::error::GitError;
use rustix::fs::{AtFlags, Dir, FileType};

use super::beneath::{self, Added};
use super::watch::{open_beneath, ChangeSet};
use super::{local, Walked, MAX_POINT_FILE_BYTES};

/// The index mode of a gitlink (a submodule's commit).
const GITLINK: u32 = 0o160000;

/// Applies `set` to `index`; `None` when only a full walk decides it.
pub(super) fn apply(
    store: &Repository,
    index: &mut Index,
    root: &OwnedFd,
    set: &ChangeSet,
) -> Result<Option<Walked>, GitError> {
    let mut walked = Walked::default();
    for tree in &set.trees {
        if !apply_tree(store, index, root, tree, &mut walked)? {
            return Ok(None);
        }
    }
    for file in &set.files {
        if set.trees.iter().any(|t| file != t && file.starts_with(t)) {
            continue; // read with its tree
        }
        apply_file(store, index, root, file, &mut walked)?;
    }
    Ok(Some(walked))
}

/// One changed path: the walk's own rule (a path the index holds is tracked; an
/// untracked one is taken unless ignored).
fn apply_file(
    store: &Repository,
    index: &mut Index,
    root: &OwnedFd,
    path: &Path,
    walked: &mut Walked,
) -> Result<(), GitError> {
    let tracked = index.get_path(path, 0).is_some();
    if !tracked && store.is_path_ignored(path).unwrap_or(false) {
        return Ok(());
    }
    add(store, index, root, path, walked)
}

/// Reads `path` into the index as the walk does (see `super::apply_walk`).
fn add(
    store: &Repository,
    index: &mut Index,
    root: &OwnedFd,
    path: &Path,
    walked: &mut Walked,
) -> Result<(), GitError> {
    let had = index.get_path(path, 0);
    walked.touched.insert(path.as_os_str().as_bytes().to_vec());
    match beneath::add(store, index, root, path, Some(MAX_POINT_FILE_BYTES))? {
        Added::Entry(_) => walked.changed = true,
        Added::Skipped => {
            if had.is_some() {
                index.remove_path(path).map_err(local)?;
                walked.changed = true;
            }
        }
        Added::OverLimit => {
            let _ = index.remove_path(path);
            walked.oversized.push(path.to_path_buf());
            walked.changed = true;
        }
    }
    Ok(())
}

/// A directory created or removed since the last point: its entries in the index go,
/// then what is on disk below it now comes back in. `false`: a full walk is needed.
fn apply_tree(
    store: &Repository,
    index: &mut Index,
    root: &OwnedFd,
    tree: &Path,
    walked: &mut Walked,
) -> Result<bool, GitError> {
    let prefix = tree.as_os_str().as_bytes();
    let mut old = HashSet::new();
    for e in index.iter() {
        let under = e.path.starts_with(prefix)
            && (e.path.len() == prefix.len() || e.path.get(prefix.len()) == Some(&b'/'));
        if under {
            if e.mode == GITLINK {
                return Ok(false);
            }
            old.insert(e.path);
        }
    }
    if !old.is_empty() {
        index.remove_dir(tree, 0).map_err(local)?;
        let _ = index.remove_path(tree);
        walked.changed = true;
        walked.touched.extend(old.iter().cloned());
    }
    let Some(dir) = open_beneath(root, tree) else {
        return Ok(true); // gone: nothing comes back
    };
    let mut pending = vec![(dir, tree.to_path_buf())];
    while let Some((dir, rel)) = pending.pop() {
        if !enter_dir(&dir, &rel)? {
            return Ok(false);
        }
        for (name, kind) in entries(&dir)? {
            let child = rel.join(OsStr::from_bytes(&name));
            if kind == FileType::Directory {
                if let Some(next) = open_beneath(&dir, Path::new(OsStr::from_bytes(&name))) {
                    if !ignored_dir(store, &child, &old) {
                        pending.push((next, child));
                    }
                }
                continue;
            }
            let tracked = old.contains(child.as_os_str().as_bytes());
            if tracked || !store.is_path_ignored(&child).unwrap_or(false) {
                add(store, index, root, &child, walked)?;
            }
        }
    }
    Ok(true)
}

/// Checks a directory a subtree walk enters: its rule files (before libgit2 reads
/// them to decide what is ignored) and whether it is a nested repository (`false`:
/// the full walk decides it, as libgit2 leaves an untracked one out whole).
fn enter_dir(dir: &OwnedFd, rel: &Path) -> Result<bool, GitError> {
    crate::rules::check_one(dir, rel)?;
    let nested = rustix::fs::statat(dir.as_fd(), ".git", AtFlags::SYMLINK_NOFOLLOW).is_ok();
    Ok(!nested)
}

/// Whether the walk leaves directory `rel` out: ignored, and no file below it was
/// tracked.
fn ignored_dir(store: &Repository, rel: &Path, old: &HashSet<Vec<u8>>) -> bool {
    let mut prefix = rel.as_os_str().as_bytes().to_vec();
    prefix.push(b'/');
    let tracked_below = old.iter().any(|p| p.starts_with(&prefix));
    !tracked_below && store.is_path_ignored(rel).unwrap_or(false)
}

/// A directory's entries (`.`, `..` and `.git` aside) with their types (a type the
/// directory does not give is read by `fstatat`, never following a link).
fn entries(dir: &OwnedFd) -> Result<Vec<(Vec<u8>, FileType)>, GitError> {
    let io = |e: rustix::io::Errno| GitError::Other(format!("reading a workspace directory: {e}"));
    let mut out = Vec::new();
    for entry in Dir::read_from(dir.as_fd()).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." || name == b".git" {
            continue;
        }
        let kind = match entry.file_type() {
            FileType::Unknown => {
                match rustix::fs::statat(dir.as_fd(), entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
                {
                    Ok(st) => FileType::from_raw_mode(st.st_mode),
                    Err(_) => continue,
                }
            }
            k => k,
        };
        out.push((name.to_vec(), kind));
    }
    Ok(out)
}

/// Whether the walk that establishes a tracker (or watches a new directory) enters
/// `rel`: not a nested repository, its rule files safe to read, and not ignored unless
/// the index holds files below it.
pub(super) fn watched_dir(
    store: &Repository,
    index: &Index,
    dir: &OwnedFd,
    rel: &Path,
) -> Result<bool, GitError> {
    crate::rules::check_one(dir, rel)?;
    if rustix::fs::statat(dir.as_fd(), ".git", AtFlags::SYMLINK_NOFOLLOW).is_ok() {
        return Ok(false);
    }
    let mut prefix = rel.as_os_str().as_bytes().to_vec();
    prefix.push(b'/');
    let tracked_below = index.find_prefix(prefix.as_slice()).is_ok();
    Ok(tracked_below || !store.is_path_ignored(rel).unwrap_or(false))
}
