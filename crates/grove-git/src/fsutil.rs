//! Filesystem helpers of the git adapter: apparent sizes, partial sibling directories
//! (build next to the target, then rename into place) and directory removal, the walks
//! done by descriptors in [`crate::tree`].

use std::collections::hash_map::RandomState;
use std::ffi::OsString;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Apparent size of a directory tree: the sum of the lengths of its regular files and
/// symlinks (the link itself, never its target). Directories count as zero, so the
/// number does not depend on the filesystem's block size. Walked by descriptors
/// ([`crate::tree::tree_size`]): a symlink swapped in mid-walk is never followed.
pub fn dir_size_bytes(path: &Path) -> io::Result<i64> {
    let root = std::fs::symlink_metadata(path)?;
    if !root.is_dir() {
        return Ok(clamp(root.len()));
    }
    crate::tree::tree_size(path).map(clamp)
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

/// Removes a file, symlink or directory tree; absent is Ok. Walked by descriptors
/// ([`crate::tree::remove_tree`]): nothing outside `path` is ever followed or removed.
pub(crate) fn remove_path(path: &Path) -> io::Result<()> {
    crate::tree::remove_tree(path)
}

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
