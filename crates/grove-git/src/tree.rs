//! Descriptor-based walks of trees an agent can write (workspaces, their `.git`):
//! ownership hand-over, removal and size. Every step is an `*at` call relative to an
//! open directory, directories are opened with `O_NOFOLLOW`, and no symlink is ever
//! followed, so swapping a directory for a link mid-walk cannot send grove (often
//! root) outside the tree it was given. The root path comes from grove's records.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Dir, FileType, Gid, Mode, OFlags, Stat, Uid};
use rustix::io::Errno;

/// Deepest directory nesting a walk follows; deeper trees are refused with an error
/// rather than exhausting descriptors (one is held per level).
pub const MAX_DEPTH: usize = 512;

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Opens `root` as a directory, refusing a symlink in its place.
pub fn open_root(root: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(root, DIR_FLAGS, Mode::empty())?)
}

/// What a walk shows its visitor: a directory (after its contents) or anything else.
enum Visit<'a> {
    Dir(&'a OwnedFd),
    Other(&'a Stat),
}

/// One directory being walked: its descriptor, the names still to visit, and its
/// name in the parent (none for the root).
struct Frame {
    fd: OwnedFd,
    names: Vec<CString>,
    name_in_parent: Option<CString>,
}

fn list_names(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    let mut out = Vec::new();
    for entry in Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            out.push(name.to_owned());
        }
    }
    Ok(out)
}

enum Entry {
    Dir(OwnedFd),
    Other(Stat),
}

/// What `name` in `dir` is, never following it; `None` when it is gone.
fn entry_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Option<Entry>> {
    match rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => Ok(Some(Entry::Dir(fd))),
        Err(Errno::NOTDIR | Errno::LOOP) => {
            match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => Ok(Some(Entry::Other(stat))),
                Err(Errno::NOENT) => Ok(None),
                Err(e) => Err(e.into()),
            }
        }
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Visits every entry below `root` depth-first, each directory after its contents,
/// with the directory holding it and its name. The root itself is not visited.
fn walk(
    root: OwnedFd,
    visit: &mut dyn FnMut(BorrowedFd<'_>, &CStr, Visit<'_>) -> io::Result<()>,
) -> io::Result<()> {
    let names = list_names(root.as_fd())?;
    let mut stack = vec![Frame {
        fd: root,
        names,
        name_in_parent: None,
    }];
    loop {
        let Some(top) = stack.last_mut() else {
            return Ok(());
        };
        if let Some(name) = top.names.pop() {
            match entry_at(top.fd.as_fd(), &name)? {
                None => {}
                Some(Entry::Other(stat)) => visit(top.fd.as_fd(), &name, Visit::Other(&stat))?,
                Some(Entry::Dir(fd)) => {
                    if stack.len() > MAX_DEPTH {
                        return Err(io::Error::other(format!(
                            "directory tree deeper than {MAX_DEPTH} levels"
                        )));
                    }
                    let names = list_names(fd.as_fd())?;
                    stack.push(Frame {
                        fd,
                        names,
                        name_in_parent: Some(name),
                    });
                }
            }
            continue;
        }
        let done = stack.pop().expect("a frame is on the stack");
        if let (Some(parent), Some(name)) = (stack.last(), done.name_in_parent) {
            visit(parent.fd.as_fd(), &name, Visit::Dir(&done.fd))?;
        }
    }
}

fn ignore_gone(r: rustix::io::Result<()>) -> io::Result<()> {
    match r {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn chown_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    let stat = rustix::fs::fstat(fd)?;
    if (stat.st_uid, stat.st_gid) == (uid, gid) {
        return Ok(());
    }
    let (u, g) = (Uid::from_raw(uid), Gid::from_raw(gid));
    Ok(rustix::fs::chownat(
        fd,
        c"",
        Some(u),
        Some(g),
        AtFlags::EMPTY_PATH,
    )?)
}

/// Gives every entry of the tree at `root` (itself last) to `uid:gid`. Symlinks are
/// re-owned themselves, never followed.
pub fn chown_tree(root: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let fd = open_root(root)?;
    let top = rustix::io::dup(&fd)?;
    let (u, g) = (Uid::from_raw(uid), Gid::from_raw(gid));
    walk(fd, &mut |dir, name, visit| match visit {
        Visit::Dir(fd) => chown_fd(fd.as_fd(), uid, gid),
        Visit::Other(stat) if (stat.st_uid, stat.st_gid) == (uid, gid) => Ok(()),
        Visit::Other(_) => ignore_gone(rustix::fs::chownat(
            dir,
            name,
            Some(u),
            Some(g),
            AtFlags::SYMLINK_NOFOLLOW,
        )),
    })?;
    chown_fd(top.as_fd(), uid, gid)
}

/// Hands the tree at `root` to `uid:gid` unless its top already belongs to `uid`. The
/// top is re-owned last, so a tree whose top is owned was handed over completely and
/// a crash midway repeats the walk next time.
pub fn hand_over(root: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let stat = rustix::fs::fstat(open_root(root)?)?;
    if stat.st_uid == uid {
        return Ok(());
    }
    chown_tree(root, uid, gid)
}

/// Removes the tree at `root` and `root` itself; a missing root (or parent) is not an
/// error. A symlink in `root`'s place is removed itself, never followed.
pub fn remove_tree(root: &Path) -> io::Result<()> {
    let (Some(parent), Some(leaf)) = (root.parent(), root.file_name()) else {
        return Err(io::Error::other("refusing to remove a filesystem root"));
    };
    let parent = match rustix::fs::open(parent, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let leaf = CString::new(leaf.as_bytes()).map_err(io::Error::other)?;
    remove_at(parent.as_fd(), &leaf)
}

/// Removes the entry `name` of the open directory `parent` (a tree, a file or a
/// symlink itself, never followed); absent is Ok.
pub(crate) fn remove_at(parent: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    match entry_at(parent, name)? {
        None => Ok(()),
        Some(Entry::Other(_)) => ignore_gone(rustix::fs::unlinkat(parent, name, AtFlags::empty())),
        Some(Entry::Dir(fd)) => {
            walk(fd, &mut |dir, name, visit| {
                let flags = match visit {
                    Visit::Dir(_) => AtFlags::REMOVEDIR,
                    Visit::Other(_) => AtFlags::empty(),
                };
                ignore_gone(rustix::fs::unlinkat(dir, name, flags))
            })?;
            ignore_gone(rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR))
        }
    }
}

/// Apparent size of the tree at `root`: the lengths of its files and symlinks (the
/// link itself); directories count as zero. Entries vanishing mid-walk are skipped.
pub fn tree_size(root: &Path) -> io::Result<u64> {
    let mut total: u64 = 0;
    walk(open_root(root)?, &mut |_, _, visit| {
        if let Visit::Other(stat) = visit {
            if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
                total = total.saturating_add(u64::try_from(stat.st_size).unwrap_or(0));
            }
        }
        Ok(())
    })?;
    Ok(total)
}

#[cfg(test)]
mod tests;
