//! Rewind: the workspace's files, HEAD and branch put back to a point. Only the files
//! that differ between the point the workspace is at now and the target are written
//! or removed, each relative to the workspace root by directory descriptors opened
//! with `O_NOFOLLOW`: a symlink planted where a directory or file goes is removed and
//! replaced, never followed. New files and directories get the root's owner.

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use git2::{Delta, Index, Oid, Repository, Signature};
use grove_core::error::GitError;
use grove_core::history::{FileCounts, HistoryPaths, IgnoredFiles, RewindReport, Snapshot};
use rustix::fs::{AtFlags, Gid, Mode, OFlags, Stat, Uid};
use rustix::io::Errno;
use uuid::Uuid;

use super::{
    local, open_store, point_commit, point_head, point_message, tree_diff, INDEX_FILE, POINTS,
};
use crate::errors::map_io;
use crate::saved::copy_closure;

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// The workspace root, open, with the owner new entries get.
struct Root {
    fd: OwnedFd,
    uid: u32,
    gid: u32,
}

fn io_err(what: &str, e: impl Into<std::io::Error>) -> GitError {
    map_io(what, &e.into())
}

/// See the module documentation.
pub(crate) fn rewind(
    paths: &HistoryPaths<'_>,
    workspace_id: Uuid,
    now: &str,
    to: &str,
    branch: Option<&str>,
) -> Result<RewindReport, GitError> {
    let store = open_store(paths.store_dir, paths.cache_dir)?;
    let (now_c, to_c) = (point_commit(&store, now)?, point_commit(&store, to)?);
    let fd = crate::tree::open_root(paths.workspace_dir)
        .map_err(|e| io_err("cannot open the workspace", e))?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| io_err("cannot stat the workspace", e))?;
    let root = Root {
        fd,
        uid: stat.st_uid,
        gid: stat.st_gid,
    };
    let mut index = Written::open(paths)?;
    let diff = tree_diff(&store, Some(now_c.tree_id()), to_c.tree_id())?;
    let (files_written, files_removed) = apply(&root, &store, &diff, &mut index)?;
    let (head, own_branch) = point_head(&to_c);
    let branch = branch.map(str::to_string).or(own_branch);
    set_head(paths, &store, head, branch.as_deref())?;
    let point = match index.tree_if(&store, to_c.tree_id()) {
        Some(tree) => {
            let changes = counts_of(&diff);
            after_point(&store, workspace_id, tree, changes, head, branch)?
        }
        // What was written is not all the point holds (a gitlink, an entry the index
        // could not take): the point after is taken by a walk, as any other.
        None => super::snapshot(paths, workspace_id, Some(now), IgnoredFiles::Excluded)?,
    };
    Ok(RewindReport {
        files_written,
        files_removed,
        point,
    })
}

/// Writes and removes what `diff` (from the state now to the target) names, noting each
/// in `index`; returns the files written and removed.
fn apply(
    root: &Root,
    store: &Repository,
    diff: &git2::Diff<'_>,
    index: &mut Written,
) -> Result<(u32, u32), GitError> {
    let (mut written, mut removed) = (0, 0);
    for delta in diff.deltas() {
        if matches!(delta.status(), Delta::Deleted | Delta::Typechange) {
            if let Some(path) = delta.old_file().path_bytes() {
                remove_file(root, path)?;
                index.removed(path);
                removed += 1;
            }
        }
        if delta.status() != Delta::Deleted {
            let new = delta.new_file();
            let path = new.path_bytes().unwrap_or_default();
            let mode = u32::from(new.mode());
            let stat = write_entry(root, store, path, new.id(), mode)?;
            index.written(path, new.id(), mode, stat);
            written += 1;
        }
    }
    Ok((written, removed))
}

/// The files `diff` adds, modifies and deletes, counted as [`super::snapshot`] counts
/// them.
fn counts_of(diff: &git2::Diff<'_>) -> FileCounts {
    let mut out = FileCounts::default();
    for delta in diff.deltas() {
        match delta.status() {
            Delta::Added => out.added += 1,
            Delta::Deleted => out.deleted += 1,
            _ => out.modified += 1,
        }
    }
    out
}

/// The store's private index as a rewind leaves it: the entries it wrote take the stat
/// data of the files on disk, so the next point hashes none of them again. Any entry
/// it cannot take marks it stale (then it is not saved).
struct Written {
    index: Option<Index>,
}

impl Written {
    fn open(paths: &HistoryPaths<'_>) -> Result<Self, GitError> {
        let file = paths.store_dir.join(INDEX_FILE);
        if std::fs::symlink_metadata(&file).is_err() {
            return Ok(Self { index: None });
        }
        Ok(Self {
            index: Some(Index::open(&file).map_err(local)?),
        })
    }

    fn removed(&mut self, path: &[u8]) {
        if let Some(index) = &mut self.index {
            if index
                .remove_path(Path::new(OsStr::from_bytes(path)))
                .is_err()
            {
                self.index = None;
            }
        }
    }

    fn written(&mut self, path: &[u8], id: Oid, mode: u32, stat: Option<Stat>) {
        let (Some(index), Some(stat)) = (&mut self.index, stat) else {
            self.index = None;
            return;
        };
        let entry = super::beneath::index_entry(&stat, mode, stat.st_size as u32, id, path);
        if index.add(&entry).is_err() {
            self.index = None;
        }
    }

    /// The index's tree when it is `expected` (the index then saved), else `None`.
    fn tree_if(self, store: &Repository, expected: Oid) -> Option<Oid> {
        let mut index = self.index?;
        let tree = index.write_tree_to(store).ok()?;
        (tree == expected && index.write().is_ok()).then_some(tree)
    }
}

/// The point of the state a rewind left: `tree` (`changes` from the state before),
/// HEAD at `head` on `branch`, as [`super::snapshot`] records one.
fn after_point(
    store: &Repository,
    workspace_id: Uuid,
    tree: Oid,
    changes: FileCounts,
    head: Oid,
    branch: Option<String>,
) -> Result<Snapshot, GitError> {
    let sig = Signature::now("grove", "grove@grove.invalid").map_err(local)?;
    let message = point_message(workspace_id, branch.as_deref());
    let head_commit = store.find_commit(head).map_err(local)?;
    let tree_obj = store.find_tree(tree).map_err(local)?;
    let id = store
        .commit(None, &sig, &sig, &message, &tree_obj, &[&head_commit])
        .map_err(local)?;
    store
        .reference(&format!("{POINTS}{id}"), id, true, "grove: point")
        .map_err(local)?;
    Ok(Snapshot {
        id: id.to_string(),
        head: head.to_string(),
        branch,
        changes,
        dirty: tree != head_commit.tree_id(),
        ignored_omitted: 0,
    })
}

/// The components of a `/`-separated tree path, refusing `.`, `..` and empty ones
/// (a tree of grove's own never holds them; a defect must not become an escape).
fn components(path: &[u8]) -> Result<Vec<CString>, GitError> {
    path.split(|b| *b == b'/')
        .map(|c| {
            if c.is_empty() || c == b"." || c == b".." || c == b".git" {
                return Err(GitError::Other(format!(
                    "refusing the history path {:?}",
                    String::from_utf8_lossy(path)
                )));
            }
            CString::new(c).map_err(|_| GitError::Other("a history path holds a NUL".into()))
        })
        .collect()
}

/// Opens the directory `dirs` below the root without following a link, creating what
/// is missing (`create`) and replacing a file or symlink in the way. `None`: it does not
/// exist (and `create` was false).
fn open_dirs(root: &Root, dirs: &[CString], create: bool) -> Result<Option<OwnedFd>, GitError> {
    let mut dir = rustix::io::dup(&root.fd).map_err(|e| io_err("dup", e))?;
    for name in dirs {
        let next = match rustix::fs::openat(&dir, name, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) if !create => return Ok(None),
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => make_dir(root, dir.as_fd(), name)?,
            Err(e) => return Err(io_err("cannot open a workspace directory", e)),
        };
        dir = next;
    }
    Ok(Some(dir))
}

/// Replaces whatever is at `name` (a file or a symlink, never followed) by a new
/// directory owned like the root.
fn make_dir(root: &Root, parent: BorrowedFd<'_>, name: &CString) -> Result<OwnedFd, GitError> {
    crate::tree::remove_at(parent, name).map_err(|e| io_err("cannot clear a path", e))?;
    rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o755))
        .map_err(|e| io_err("cannot create a workspace directory", e))?;
    own(root, parent, name);
    rustix::fs::openat(parent, name, DIR_FLAGS, Mode::empty())
        .map_err(|e| io_err("cannot open a new workspace directory", e))
}

/// Gives `name` (never followed) the root's owner; failures leave it as the worker's.
fn own(root: &Root, dir: BorrowedFd<'_>, name: &CString) {
    let (u, g) = (Uid::from_raw(root.uid), Gid::from_raw(root.gid));
    let _ = rustix::fs::chownat(dir, name, Some(u), Some(g), AtFlags::SYMLINK_NOFOLLOW);
}

/// Removes the file at `path`, then each parent directory it leaves empty.
fn remove_file(root: &Root, path: &[u8]) -> Result<(), GitError> {
    let parts = components(path)?;
    let (leaf, dirs) = parts.split_last().expect("a path has a component");
    let Some(dir) = open_dirs(root, dirs, false)? else {
        return Ok(());
    };
    crate::tree::remove_at(dir.as_fd(), leaf).map_err(|e| io_err("cannot remove a file", e))?;
    for depth in (0..dirs.len()).rev() {
        let Some(parent) = open_dirs(root, &dirs[..depth], false)? else {
            break;
        };
        match rustix::fs::unlinkat(&parent, &dirs[depth], AtFlags::REMOVEDIR) {
            Ok(()) => {}
            Err(_) => break,
        }
    }
    Ok(())
}

/// Writes the blob `id` at `path` as a file of `mode` (or a symlink for 0o120000);
/// returns what is there now (`None`: a gitlink, or no stat).
fn write_entry(
    root: &Root,
    store: &Repository,
    path: &[u8],
    id: Oid,
    mode: u32,
) -> Result<Option<Stat>, GitError> {
    if mode == 0o160000 {
        return Ok(None); // a gitlink names another repository's commit: nothing to write
    }
    let parts = components(path)?;
    let (leaf, dirs) = parts.split_last().expect("a path has a component");
    let dir = open_dirs(root, dirs, true)?.expect("created");
    let blob = store.find_blob(id).map_err(local)?;
    let perm = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
    if mode != 0o120000 && overwrite(dir.as_fd(), leaf, blob.content(), perm)? {
        return Ok(stat_at(dir.as_fd(), leaf));
    }
    crate::tree::remove_at(dir.as_fd(), leaf).map_err(|e| io_err("cannot clear a file", e))?;
    if mode == 0o120000 {
        let target = CString::new(blob.content())
            .map_err(|_| GitError::Other("a symlink target holds a NUL".into()))?;
        rustix::fs::symlinkat(&target, &dir, leaf)
            .map_err(|e| io_err("cannot create a symlink", e))?;
    } else {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
        let fd = rustix::fs::openat(
            &dir,
            leaf,
            flags | OFlags::CLOEXEC,
            Mode::from_raw_mode(perm),
        )
        .map_err(|e| io_err("cannot create a file", e))?;
        let mut file = std::fs::File::from(fd);
        file.write_all(blob.content())
            .map_err(|e| io_err("cannot write a file", e))?;
        // The umask may have cut the mode.
        rustix::fs::fchmod(&file, Mode::from_raw_mode(perm))
            .map_err(|e| io_err("cannot set a file's mode", e))?;
    }
    own(root, dir.as_fd(), leaf);
    Ok(stat_at(dir.as_fd(), leaf))
}

/// The entry `name` of `dir` as it is now, never followed.
fn stat_at(dir: BorrowedFd<'_>, name: &CString) -> Option<Stat> {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()
}

/// Rewrites `name` in place when it is a regular file with one link (checked on the
/// descriptor opened without following a link, non-blocking so a FIFO cannot stall
/// it): the common case of a file changed since the point. `false`: anything else is
/// there (or nothing), to be replaced.
fn overwrite(
    dir: BorrowedFd<'_>,
    name: &CString,
    bytes: &[u8],
    perm: u32,
) -> Result<bool, GitError> {
    let flags = OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let Ok(fd) = rustix::fs::openat(dir, name, flags, Mode::empty()) else {
        return Ok(false);
    };
    let stat = rustix::fs::fstat(&fd).map_err(|e| io_err("cannot stat a file", e))?;
    let regular =
        rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::RegularFile;
    if !regular || stat.st_nlink != 1 {
        return Ok(false);
    }
    // Written over the old bytes, then cut to length: a truncation to zero first would
    // make ext4 (auto_da_alloc) flush the file to disk when it is closed.
    let file = std::fs::File::from(fd);
    file.write_all_at(bytes, 0)
        .map_err(|e| io_err("cannot write a file", e))?;
    rustix::fs::ftruncate(&file, bytes.len() as u64)
        .map_err(|e| io_err("cannot truncate a file", e))?;
    if stat.st_mode & 0o777 != perm {
        rustix::fs::fchmod(&file, Mode::from_raw_mode(perm))
            .map_err(|e| io_err("cannot set a file's mode", e))?;
    }
    Ok(true)
}

/// Points the workspace's branch (or a detached HEAD) at `head`, HEAD at the branch,
/// and its index at HEAD's tree; the commit is copied into the workspace first. When
/// HEAD is already on that branch at that commit nothing is written (the index keeps
/// its stat data, so the next status need not hash every file).
fn set_head(
    paths: &HistoryPaths<'_>,
    store: &Repository,
    head: Oid,
    branch: Option<&str>,
) -> Result<(), GitError> {
    let ws = crate::trusted::open_workspace(paths.workspace_dir)?;
    let current = ws.head().ok().and_then(|h| h.target());
    let current_branch = crate::trusted::head_ref_name(&ws).ok();
    let wanted_branch = branch.map_or_else(|| "HEAD".to_string(), str::to_string);
    if current == Some(head) && current_branch.as_deref() == Some(wanted_branch.as_str()) {
        // HEAD and branch are already there: the agent's index is left as it is.
        return Ok(());
    }
    copy_closure(store, &ws.odb().map_err(local)?, head)?;
    crate::trusted::check_ref_writable(&ws, "HEAD")?;
    match branch {
        Some(b) => {
            crate::trusted::check_ref_writable(&ws, b)?;
            ws.reference(b, head, true, "grove: rewind")
                .map_err(local)?;
            ws.set_head(b).map_err(local)?;
        }
        None => ws.set_head_detached(head).map_err(local)?,
    }
    let tree = ws.find_commit(head).and_then(|c| c.tree()).map_err(local)?;
    let mut index = ws.index().map_err(local)?;
    index.read_tree(&tree).map_err(local)?;
    index.write().map_err(local)?;
    Ok(())
}
