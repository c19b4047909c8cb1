//! The workspace's `.gitignore` and `.gitattributes` files, checked before libgit2
//! walks the workspace (a history point's walk, the dirty check's status): libgit2
//! reads each one by path with a blocking `open()` (following a link), so
//! one that is a FIFO, a device or a socket (or a link to one, in the workspace or on
//! the host; `.gitmodules` at the root likewise) would stall the walk, and the
//! workspace's lock with it, for as long as no writer comes. Every directory the walk
//! would enter is visited first through descriptors (`O_NOFOLLOW`); a rule file that is
//! neither a regular file nor a directory refuses the walk (no point is taken, the
//! dirty check answers an error). Ignored directories are entered only when the walk
//! enters them too (a workspace keeping its ignored files in its points).

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use grove_core::error::GitError;
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

/// The files libgit2 reads rules from in each directory of the walk.
const RULE_FILES: [&CStr; 2] = [c".gitignore", c".gitattributes"];
/// The root's too: `.gitmodules`, read when the index holds a submodule.
const ROOT_FILES: [&CStr; 3] = [c".gitignore", c".gitattributes", c".gitmodules"];

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Refuses the walk when a rule file in a directory it enters could block its read; see
/// the module documentation. `enter`: whether the walk enters a directory (by its path
/// from the root), asked after that directory's own rule files are checked. A
/// directory is opened only when its turn comes, from its parent's descriptor, so the
/// descriptors held at once grow with the tree's depth, not its width; one that cannot
/// be opened for another reason (out of descriptors) refuses the walk.
pub(crate) fn check(root: &OwnedFd, enter: &dyn Fn(&Path) -> bool) -> Result<(), GitError> {
    let io = |e: Errno| GitError::Other(format!("checking the workspace's rule files: {e}"));
    check_dir(root, Path::new(""), &ROOT_FILES)?;
    let mut pending: Vec<(Rc<OwnedFd>, CString, PathBuf)> = Vec::new();
    let root = Rc::new(rustix::io::dup(root).map_err(io)?);
    push_children(&root, Path::new(""), &mut pending).map_err(io)?;
    while let Some((parent, name, rel)) = pending.pop() {
        let dir = match rustix::fs::openat(parent.as_fd(), &name, DIR_FLAGS, Mode::empty()) {
            Ok(dir) => dir,
            // Not a directory, gone, or closed to this process: libgit2 opens nothing
            // in it either.
            Err(Errno::NOTDIR | Errno::LOOP | Errno::NOENT | Errno::ACCESS) => continue,
            Err(e) => return Err(io(e)),
        };
        drop(parent);
        check_dir(&dir, &rel, &RULE_FILES)?;
        if enter(&rel) {
            push_children(&Rc::new(dir), &rel, &mut pending).map_err(io)?;
        }
    }
    Ok(())
}

/// Queues the entries of `dir` (at `rel`) that may be directories, `.git` aside.
fn push_children(
    dir: &Rc<OwnedFd>,
    rel: &Path,
    pending: &mut Vec<(Rc<OwnedFd>, CString, PathBuf)>,
) -> Result<(), Errno> {
    for entry in Dir::read_from(dir.as_fd())? {
        let entry = entry?;
        let name = entry.file_name();
        if name == c"." || name == c".." || name == c".git" {
            continue;
        }
        if matches!(entry.file_type(), FileType::Directory | FileType::Unknown) {
            let child = rel.join(OsStr::from_bytes(name.to_bytes()));
            pending.push((dir.clone(), name.to_owned(), child));
        }
    }
    Ok(())
}

/// [`check`] for a walk of the workspace repository `repo` at `dir` (a status, a
/// diff to the working tree, an `add -A`): it enters every directory its rules do not
/// ignore.
pub(crate) fn check_workspace(repo: &git2::Repository, dir: &Path) -> Result<(), GitError> {
    let root = crate::tree::open_root(dir)
        .map_err(|e| GitError::Other(format!("cannot open the workspace: {e}")))?;
    check(&root, &|d| !repo.is_path_ignored(d).unwrap_or(false))
}

/// [`check`] for one directory below the root (at `rel`, opened without following a
/// link): what a walk of a new subtree checks in each directory it enters.
pub(crate) fn check_one(dir: &OwnedFd, rel: &Path) -> Result<(), GitError> {
    check_dir(dir, rel, &RULE_FILES)
}

/// Refuses `dir` (at `rel`) when one of its files `names` is something a read blocks on.
fn check_dir(dir: &OwnedFd, rel: &Path, names: &[&CStr]) -> Result<(), GitError> {
    for &name in names {
        // Followed as libgit2 follows it; a stat never blocks.
        let kind = match rustix::fs::statat(dir.as_fd(), name, AtFlags::empty()) {
            Ok(stat) => FileType::from_raw_mode(stat.st_mode),
            Err(_) => continue, // absent or a dangling link: libgit2 finds nothing either
        };
        if !matches!(kind, FileType::RegularFile | FileType::Directory) {
            return Err(GitError::Other(format!(
                "{} is not a regular file (a {kind:?}): nothing walks the workspace while it is there",
                rel.join(OsStr::from_bytes(name.to_bytes())).display()
            )));
        }
    }
    Ok(())
}
