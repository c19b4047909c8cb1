//! Filesystem helpers of the git adapter: apparent sizes, partial sibling directories
//! (build next to the target, then rename into place) and robust directory removal.

use std::collections::hash_map::RandomState;
use std::ffi::OsString;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Apparent size of a directory tree: the sum of the lengths of its regular files and
/// symlinks (the link itself, never its target). Directories count as zero, so the
/// number does not depend on the filesystem's block size.
///
/// Entries that vanish while the walk runs are skipped: a size is a report, and a
/// concurrent writer (an agent editing its workspace) must not make it fail.
pub fn dir_size_bytes(path: &Path) -> io::Result<i64> {
    let root = std::fs::symlink_metadata(path)?;
    if !root.is_dir() {
        return Ok(clamp(root.len()));
    }
    let mut total: u64 = 0;
    // An explicit stack instead of recursion: deep trees (node_modules) cannot
    // overflow the thread's stack.
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            // `DirEntry::metadata` does not follow symlinks, which is what we want.
            let meta = match entry.metadata() {
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total = total.saturating_add(meta.len());
            }
        }
    }
    Ok(clamp(total))
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The prefix of partial siblings of `target`: `.<name>.partial-`.
fn partial_prefix(target: &Path) -> io::Result<OsString> {
    let name = target.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "target path has no final component",
        )
    })?;
    let mut prefix = OsString::from(".");
    prefix.push(name);
    prefix.push(".partial-");
    Ok(prefix)
}

/// A fresh, unused sibling path of `target` to build into before renaming into place.
/// Being in the same parent directory keeps the final `rename` on one filesystem, so
/// it is atomic.
pub(crate) fn partial_sibling(target: &Path) -> io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let parent = parent_of(target)?;
    let prefix = partial_prefix(target)?;
    // RandomState is seeded randomly per process; mixing in time, pid and a counter
    // makes names unique across processes and calls without a `rand` dependency.
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    hasher.write_u128(nanos);
    let mut name = prefix;
    name.push(format!("{:016x}", hasher.finish()));
    Ok(parent.join(name))
}

/// Removes partial siblings of `target` left by crashed attempts. Callers hold the
/// per-target lock (cache creation lock, workspace creation lock), so any partial
/// sibling found here belongs to a dead attempt.
pub(crate) fn remove_stale_partials(target: &Path) -> io::Result<()> {
    let parent = parent_of(target)?;
    let prefix = partial_prefix(target)?;
    let entries = match std::fs::read_dir(&parent) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if entry
            .file_name()
            .as_encoded_bytes()
            .starts_with(prefix.as_encoded_bytes())
        {
            remove_path(&entry.path())?;
        }
    }
    Ok(())
}

/// The parent directory of `target`, created if missing.
pub(crate) fn ensure_parent(target: &Path) -> io::Result<PathBuf> {
    let parent = parent_of(target)?;
    std::fs::create_dir_all(&parent)?;
    Ok(parent)
}

fn parent_of(target: &Path) -> io::Result<PathBuf> {
    match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => Ok(p.to_path_buf()),
        Some(_) => Ok(PathBuf::from(".")),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "target path has no parent directory",
        )),
    }
}

/// Removes a file, symlink or directory tree; absent is Ok.
///
/// Workspaces can hold read-only directories (Go's module cache writes them 0555),
/// which `remove_dir_all` cannot empty; on a permission error the tree is made
/// writable by its owner and removal is tried once more.
pub(crate) fn remove_path(path: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            make_dirs_writable(path);
            match std::fs::remove_dir_all(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        }
        Err(e) => Err(e),
    }
}

/// Best effort: adds owner rwx to every directory of the tree (symlinks not followed).
#[cfg(unix)]
fn make_dirs_writable(root: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if let Ok(meta) = std::fs::symlink_metadata(&dir) {
            if !meta.is_dir() {
                continue;
            }
            let mode = meta.permissions().mode() | 0o700;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode));
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    stack.push(entry.path());
                }
            }
        }
    }
}

#[cfg(not(unix))]
fn make_dirs_writable(_root: &Path) {}

/// Removes a partial directory on drop unless disarmed: every early return of a build
/// cleans up after itself, and a crash leaves a `.partial-*` that the next attempt
/// removes.
pub(crate) struct PartialDir {
    path: PathBuf,
    armed: bool,
}

impl PartialDir {
    pub(crate) fn new(path: PathBuf) -> Self {
        Self { path, armed: true }
    }
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
    /// Renames the partial directory to `target` and stops cleaning it up.
    pub(crate) fn commit_to(mut self, target: &Path) -> io::Result<()> {
        std::fs::rename(&self.path, target)?;
        self.armed = false;
        Ok(())
    }
}

impl Drop for PartialDir {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = remove_path(&self.path) {
                tracing::warn!(path = %self.path.display(), error = %e, "could not remove partial directory");
            }
        }
    }
}
