//! Path safety: every path is checked lexically, then resolved by the kernel beneath the
//! workspace root's directory descriptor (`openat2` with `RESOLVE_BENEATH`), so no
//! symlink, however it is swapped in, can lead outside the root (ADR 10).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{openat2, AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

use crate::error::ToolError;

/// Longest relative path accepted (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest single name accepted (Linux's `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;

/// A relative path that passed the lexical checks: no NUL, not absolute, no `..`, no
/// overlong name; `.` and empty segments removed. The empty path is the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelPath(String);

impl RelPath {
    pub fn parse(raw: &str) -> Result<Self, ToolError> {
        let bad = |reason| ToolError::InvalidPath {
            path: raw.to_string(),
            reason,
        };
        if raw.contains('\0') {
            return Err(bad("contains a NUL byte"));
        }
        if raw.starts_with('/') {
            return Err(bad(
                "absolute paths are refused; give a path relative to the workspace root",
            ));
        }
        if raw.len() > MAX_PATH_BYTES {
            return Err(bad("longer than 4096 bytes"));
        }
        let mut parts = Vec::new();
        for seg in raw.split('/') {
            match seg {
                "" | "." => {}
                ".." => return Err(bad("contains '..'")),
                s if s.len() > MAX_NAME_BYTES => {
                    return Err(bad("has a name longer than 255 bytes"))
                }
                s => parts.push(s),
            }
        }
        Ok(Self(parts.join("/")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The path as given to `openat2` (`.` for the root).
    fn arg(&self) -> &str {
        if self.0.is_empty() {
            "."
        } else {
            &self.0
        }
    }

    /// The parent (root for a top-level name) and the last name; `None` for the root.
    pub fn split_last(&self) -> Option<(RelPath, &str)> {
        if self.0.is_empty() {
            return None;
        }
        Some(match self.0.rsplit_once('/') {
            Some((parent, name)) => (RelPath(parent.to_string()), name),
            None => (RelPath(String::new()), self.0.as_str()),
        })
    }

    pub fn join(&self, name: &str) -> RelPath {
        if self.0.is_empty() {
            RelPath(name.to_string())
        } else {
            RelPath(format!("{}/{name}", self.0))
        }
    }

    /// Whether any segment is `.git` (the repository's own metadata).
    pub fn touches_git_dir(&self) -> bool {
        self.0.split('/').any(|s| s == ".git")
    }
}

/// The workspace root, held open as a directory descriptor: every path is resolved
/// beneath it by the kernel.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    /// The root's owner: files and directories the tools create are given to it, so a
    /// workspace handed to a sandbox user stays writable by that user.
    owner: (u32, u32),
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

impl Root {
    pub fn open(dir: &Path) -> Result<Self, ToolError> {
        let fd = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_err("opening the workspace", "", e))?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| io_err("stat", "", e))?;
        Ok(Self {
            fd,
            owner: (stat.st_uid, stat.st_gid),
        })
    }

    /// Gives a file or directory this call created to the root's owner (a no-op when
    /// it already belongs to it).
    pub(crate) fn adopt(&self, fd: BorrowedFd<'_>, path: &str) -> Result<(), ToolError> {
        let stat = rustix::fs::fstat(fd).map_err(|e| io_err("stat", path, e))?;
        if (stat.st_uid, stat.st_gid) == self.owner {
            return Ok(());
        }
        let (uid, gid) = (
            rustix::fs::Uid::from_raw(self.owner.0),
            rustix::fs::Gid::from_raw(self.owner.1),
        );
        // `AT_EMPTY_PATH` works on `O_PATH` descriptors too (directories are held so).
        rustix::fs::chownat(fd, c"", Some(uid), Some(gid), AtFlags::EMPTY_PATH)
            .map_err(|e| io_err("chown", path, e))
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Opens `path` beneath the root with `flags` (symlinks inside the root followed,
    /// any that lead out refused).
    pub fn open_beneath(
        &self,
        path: &RelPath,
        flags: OFlags,
        mode: Mode,
    ) -> Result<OwnedFd, ToolError> {
        open_beneath(self.fd(), path.arg(), flags, mode, path.as_str())
    }

    /// `stat` of what `path` resolves to beneath the root; `None` when it does not exist.
    pub fn stat(&self, path: &RelPath) -> Result<Option<Stat>, ToolError> {
        match self.open_beneath(path, OFlags::PATH, Mode::empty()) {
            Ok(fd) => rustix::fs::fstat(&fd)
                .map(Some)
                .map_err(|e| io_err("stat", path.as_str(), e)),
            Err(ToolError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens the directory `path`, creating it and missing parents beneath the root.
    pub fn create_dirs(&self, path: &RelPath) -> Result<OwnedFd, ToolError> {
        let dir_flags = OFlags::PATH | OFlags::DIRECTORY;
        let mut at = RelPath(String::new());
        let mut fd = self.open_beneath(&at, dir_flags, Mode::empty())?;
        if path.is_root() {
            return Ok(fd);
        }
        for name in path.as_str().split('/') {
            let next = at.join(name);
            let made = match rustix::fs::mkdirat(&fd, name, Mode::from_raw_mode(0o755)) {
                Ok(()) => true,
                Err(Errno::EXIST) => false,
                Err(e) => return Err(io_err("creating a directory", next.as_str(), e)),
            };
            // Re-resolved from the root: a name that is (or just became) a symlink
            // pointing out is refused here, before anything is created inside it.
            fd = self.open_beneath(&next, dir_flags, Mode::empty())?;
            if made {
                self.adopt(fd.as_fd(), next.as_str())?;
            }
            at = next;
        }
        Ok(fd)
    }
}

fn open_beneath(
    dirfd: BorrowedFd<'_>,
    arg: &str,
    flags: OFlags,
    mode: Mode,
    shown: &str,
) -> Result<OwnedFd, ToolError> {
    loop {
        match openat2(dirfd, arg, flags | OFlags::CLOEXEC, mode, RESOLVE) {
            Ok(fd) => return Ok(fd),
            // A concurrent rename anywhere on the system can make the kernel give up
            // on a RESOLVE_BENEATH lookup; it says to retry.
            Err(Errno::AGAIN) | Err(Errno::INTR) => continue,
            Err(e) => return Err(map_errno(e, shown)),
        }
    }
}

pub(crate) fn map_errno(e: Errno, path: &str) -> ToolError {
    let path = path.to_string();
    match e {
        Errno::XDEV => ToolError::OutsideRoot { path },
        Errno::NOENT => ToolError::NotFound { path },
        Errno::EXIST => ToolError::AlreadyExists { path },
        Errno::NOTDIR => ToolError::NotADirectory { path },
        Errno::ISDIR => ToolError::NotAFile { path },
        Errno::LOOP => ToolError::InvalidPath {
            path,
            reason: "too many levels of symbolic links",
        },
        Errno::NAMETOOLONG => ToolError::InvalidPath {
            path,
            reason: "name too long",
        },
        Errno::NOSYS => ToolError::Unsupported(
            "this kernel has no openat2 (Linux 5.6 or later is needed for safe path resolution)"
                .into(),
        ),
        other => io_err("opening", &path, other),
    }
}

pub(crate) fn io_err(what: &'static str, path: &str, e: Errno) -> ToolError {
    ToolError::Io {
        what,
        path: path.to_string(),
        message: std::io::Error::from(e).to_string(),
    }
}

/// The kind of a `stat` result, as the listing words it.
pub(crate) fn kind_of(stat: &Stat) -> &'static str {
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => "file",
        FileType::Directory => "dir",
        FileType::Symlink => "symlink",
        _ => "other",
    }
}

/// `stat` of a name in a directory, not following a final symlink.
pub(crate) fn lstat_in(dir: BorrowedFd<'_>, name: &std::ffi::CStr) -> Result<Stat, Errno> {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_checks_refuse_what_can_never_be_inside() {
        for bad in [
            "/etc/passwd",
            "a/../../b",
            "..",
            "a\0b",
            &"x".repeat(256),
            &"a/".repeat(2100),
        ] {
            assert!(
                matches!(RelPath::parse(bad), Err(ToolError::InvalidPath { .. })),
                "{bad:?} was accepted"
            );
        }
        assert_eq!(RelPath::parse("./a//b/.").unwrap().as_str(), "a/b");
        assert!(RelPath::parse("").unwrap().is_root());
        assert!(RelPath::parse("a/.git/config").unwrap().touches_git_dir());
    }
}
