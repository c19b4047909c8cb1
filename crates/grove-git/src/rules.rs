//! The workspace's `.gitignore` and `.gitattributes` files, checked before libgit2
//! walks the workspace (a history point's walk, the dirty check's status): libgit2
//! reads each one by path with a blocking `open()`, following a link, so one that is a
//! FIFO, a device or a socket (`.gitmodules` at the root likewise) would stall the
//! walk, and the workspace's lock with it, for as long as no writer comes, and one that
//! is a symbolic link would make a host file's lines the workspace's ignore rules or
//! attributes (which of the workspace's files a point, a status or a commit leaves
//! out: an oracle on the host file). Every directory the walk would enter is visited
//! first through descriptors (`O_NOFOLLOW`); a rule file that is a symbolic link
//! refuses the walk (`GitError::Untrusted`; git itself no longer follows one in the
//! tree, and libgit2 cannot be told to treat it as absent), and one that is neither a
//! regular file nor a directory too (no point is taken, the dirty check answers an
//! error). Ignored directories are entered only when the walk enters them too (a
//! workspace keeping its ignored files in its points).
//!
//! The check and libgit2's opens are separate steps: a process left running in the
//! sandbox could swap a rule file (or a directory above one) between them. [`check`]
//! therefore records what it saw (each directory's and rule file's device, inode,
//! type and change time) and [`Checked::verify`], called once the walk is done,
//! refuses the walk's result when any of it changed: an entry added, removed or
//! renamed in a directory changes that directory's change time, which no process can
//! set back. What remains: a swap and its undoing both within the timer tick of the
//! directory's last change before the check, on a filesystem whose change times are
//! that coarse (kernels before multigrain timestamps); and a FIFO swapped in after the
//! check still stalls the walk it was made for.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use grove_core::error::GitError;
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

/// The files libgit2 reads rules from in each directory of the walk.
const RULE_FILES: [&CStr; 2] = [c".gitignore", c".gitattributes"];
/// The root's too: `.gitmodules`, read when the index holds a submodule.
const ROOT_FILES: [&CStr; 3] = [c".gitignore", c".gitattributes", c".gitmodules"];

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// What [`check`] saw of one directory or rule file: enough to tell that it was
/// replaced, renamed, or (a directory) had an entry added, removed or renamed since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    mode: u32,
    ctime: (i64, i64),
}

impl Stamp {
    fn of(stat: &Stat) -> Self {
        Self {
            dev: stat.st_dev,
            ino: stat.st_ino,
            mode: stat.st_mode,
            ctime: (stat.st_ctime, stat.st_ctime_nsec as i64),
        }
    }
}

/// A passed [`check`]: the workspace root and what was seen under it, to
/// [`verify`](Checked::verify) once libgit2's walk is done.
#[derive(Debug)]
pub(crate) struct Checked {
    root: OwnedFd,
    /// Paths from the root (`""` is the root itself) and what they were.
    seen: Vec<(PathBuf, Stamp)>,
}

impl Checked {
    /// Refuses the walk that followed the check when a directory it checked, or a rule
    /// file in one, is no longer what it was (see the module documentation): its
    /// result may rest on rules read from somewhere else and must not be used.
    pub(crate) fn verify(&self) -> Result<(), GitError> {
        for (rel, before) in &self.seen {
            if stamp_beneath(self.root.as_fd(), rel).as_ref() != Some(before) {
                return Err(GitError::Untrusted(format!("{} {CHANGED}", display(rel))));
            }
        }
        Ok(())
    }
}

/// The end of [`Checked::verify`]'s refusal.
const CHANGED: &str = "changed while the workspace was walked; the walk's result is not used";
/// How many times a walk whose directories changed under it is made before the change
/// is answered as a refusal.
const WALK_ATTEMPTS: u64 = 3;

/// Runs `walk` (a [`check`], libgit2's walk, then [`Checked::verify`]) again when what
/// it checked changed while it ran, as a process in the sandbox that adds or removes
/// files does without any intent; refused after [`WALK_ATTEMPTS`]. Any other error is
/// returned at once. `walk` must write nothing before its `verify`.
pub(crate) fn retrying<T>(mut walk: impl FnMut() -> Result<T, GitError>) -> Result<T, GitError> {
    let mut attempt = 1;
    loop {
        match walk() {
            Err(GitError::Untrusted(m)) if m.ends_with(CHANGED) && attempt < WALK_ATTEMPTS => {
                std::thread::sleep(std::time::Duration::from_millis(10 * attempt));
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// The stamp of `rel` beneath `root`, no link followed on the way or at the end.
fn stamp_beneath(root: BorrowedFd<'_>, rel: &Path) -> Option<Stamp> {
    let path = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let fd = rustix::fs::openat2(
        root,
        path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .ok()?;
    rustix::fs::fstat(&fd).ok().map(|s| Stamp::of(&s))
}

fn display(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        "the workspace root".into()
    } else {
        rel.display().to_string()
    }
}

/// Refuses the walk when a rule file in a directory it enters could block its read or
/// is a link; see the module documentation. `enter`: whether the walk enters a
/// directory (by its path from the root), asked after that directory's own rule files
/// are checked. A directory is opened only when its turn comes, from its parent's
/// descriptor, so the descriptors held at once grow with the tree's depth, not its
/// width; one that cannot be opened for another reason (out of descriptors) refuses
/// the walk.
pub(crate) fn check(root: &OwnedFd, enter: &dyn Fn(&Path) -> bool) -> Result<Checked, GitError> {
    let io = |e: Errno| GitError::Other(format!("checking the workspace's rule files: {e}"));
    let mut seen = Vec::new();
    check_dir(root, Path::new(""), &ROOT_FILES, &mut seen)?;
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
        check_dir(&dir, &rel, &RULE_FILES, &mut seen)?;
        if enter(&rel) {
            push_children(&Rc::new(dir), &rel, &mut pending).map_err(io)?;
        }
    }
    let root = Rc::try_unwrap(root).map_err(|_| {
        GitError::Other("checking the workspace's rule files: root still held".into())
    })?;
    Ok(Checked { root, seen })
}

/// Queues the entries of `dir` (at `rel`) that may be directories, `.git` aside.
pub(crate) fn push_children(
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
pub(crate) fn check_workspace(repo: &git2::Repository, dir: &Path) -> Result<Checked, GitError> {
    let root = crate::tree::open_root(dir)
        .map_err(|e| GitError::Other(format!("cannot open the workspace: {e}")))?;
    check(&root, &|d| !repo.is_path_ignored(d).unwrap_or(false))
}

/// [`check`] for one directory below the root (at `rel`, opened without following a
/// link): what a walk of a new subtree checks in each directory it enters. Nothing is
/// recorded to verify afterwards.
pub(crate) fn check_one(dir: &OwnedFd, rel: &Path) -> Result<(), GitError> {
    check_dir(dir, rel, &RULE_FILES, &mut Vec::new())
}

/// Refuses `dir` (at `rel`) when one of its files `names` is a link or something a
/// read blocks on; records `dir` and its rule files in `seen`.
fn check_dir(
    dir: &OwnedFd,
    rel: &Path,
    names: &[&CStr],
    seen: &mut Vec<(PathBuf, Stamp)>,
) -> Result<(), GitError> {
    let stat = rustix::fs::fstat(dir)
        .map_err(|e| GitError::Other(format!("checking the workspace's rule files: {e}")))?;
    seen.push((rel.to_path_buf(), Stamp::of(&stat)));
    for &name in names {
        let path = rel.join(OsStr::from_bytes(name.to_bytes()));
        // Not followed: libgit2 would follow it. A stat never blocks.
        let stat = match rustix::fs::statat(dir.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(_) => continue, // absent: libgit2 finds nothing either
        };
        let kind = FileType::from_raw_mode(stat.st_mode);
        if kind == FileType::Symlink {
            return Err(GitError::Untrusted(format!(
                "{} is a symbolic link: host-side git does not follow it, and nothing walks \
                 the workspace while it is there (make it a regular file or remove it)",
                path.display()
            )));
        }
        if !matches!(kind, FileType::RegularFile | FileType::Directory) {
            return Err(GitError::Other(format!(
                "{} is not a regular file (a {kind:?}): nothing walks the workspace while it is there",
                path.display()
            )));
        }
        seen.push((path, Stamp::of(&stat)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(dir: &Path) -> Result<Checked, GitError> {
        check(&crate::tree::open_root(dir).unwrap(), &|_| true)
    }

    /// A rule file swapped for a link to a host file and back (as a process left
    /// running in the sandbox would, between the check and libgit2's open) is caught
    /// after the walk, though it is a regular file again; so is a directory above a
    /// rule file swapped and put back. Nothing changed: the walk stands.
    #[test]
    fn a_rule_file_or_directory_swapped_during_the_walk_refuses_its_result() {
        let root = tempfile::tempdir().unwrap();
        let ws = root.path();
        std::fs::create_dir_all(ws.join("sub/deeper")).unwrap();
        std::fs::write(ws.join(".gitignore"), "target/\n").unwrap();
        std::fs::write(ws.join("sub/deeper/.gitattributes"), "* text\n").unwrap();
        let host = root.path().join("sub/deeper/x.txt");
        std::fs::write(&host, "x\n").unwrap();

        // Past the timer tick of the setup's changes, for filesystems whose change
        // times are that coarse (see the module documentation).
        let tick = || std::thread::sleep(std::time::Duration::from_millis(25));
        tick();
        let untouched = checked(ws).unwrap();
        untouched.verify().expect("nothing changed");

        let swapped = checked(ws).unwrap();
        std::fs::rename(ws.join(".gitignore"), ws.join("aside")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", ws.join(".gitignore")).unwrap();
        std::fs::remove_file(ws.join(".gitignore")).unwrap();
        std::fs::rename(ws.join("aside"), ws.join(".gitignore")).unwrap();
        let err = swapped.verify().expect_err("a swapped rule file");
        assert!(matches!(err, GitError::Untrusted(_)), "{err}");

        tick();
        let moved = checked(ws).unwrap();
        std::fs::rename(ws.join("sub"), ws.join("sub2")).unwrap();
        std::os::unix::fs::symlink("sub2", ws.join("sub")).unwrap();
        std::fs::remove_file(ws.join("sub")).unwrap();
        std::fs::rename(ws.join("sub2"), ws.join("sub")).unwrap();
        assert!(moved.verify().is_err(), "a directory swapped and put back");
        checked(ws).unwrap().verify().expect("a fresh check stands");
    }

    /// A walk whose directories changed under it is made again, and refused only
    /// when they keep changing; other refusals are not retried.
    #[test]
    fn a_walk_is_retried_while_its_tree_changes_then_refused() {
        let calls = std::cell::Cell::new(0);
        let changed = || GitError::Untrusted(format!("sub {CHANGED}"));
        let once_changed = retrying(|| {
            calls.set(calls.get() + 1);
            if calls.get() == 1 {
                Err(changed())
            } else {
                Ok(7)
            }
        });
        assert_eq!(once_changed.unwrap(), 7);
        assert_eq!(calls.get(), 2);
        calls.set(0);
        let always = retrying::<()>(|| {
            calls.set(calls.get() + 1);
            Err(changed())
        });
        assert!(matches!(always, Err(GitError::Untrusted(_))));
        assert_eq!(calls.get(), WALK_ATTEMPTS as usize);
        calls.set(0);
        let linked = retrying::<()>(|| {
            calls.set(calls.get() + 1);
            Err(GitError::Untrusted(".gitignore is a symbolic link".into()))
        });
        assert!(linked.is_err());
        assert_eq!(calls.get(), 1, "a link is refused at once");
    }

    /// A link as a rule file is refused before anything reads it, whatever it names.
    #[test]
    fn a_linked_rule_file_is_refused_as_untrusted() {
        let root = tempfile::tempdir().unwrap();
        let ws = root.path();
        std::fs::create_dir(ws.join("a")).unwrap();
        std::fs::write(ws.join("a/real"), "x\n").unwrap();
        std::os::unix::fs::symlink("real", ws.join("a/.gitattributes")).unwrap();
        let err = checked(ws).expect_err("a link");
        assert!(
            matches!(&err, GitError::Untrusted(m) if m.contains("a/.gitattributes")),
            "{err}"
        );
    }
}
