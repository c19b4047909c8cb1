//! Compacting a history store after retention dropped points (ADR 28): the objects only
//! dropped points held are deleted and the rest packed, by the git CLI (libgit2 has no
//! gc) run through [`crate::trusted::git_command`] on the private store alone, never on
//! a workspace. The repo cache is named as an alternate for that run only (the store
//! borrows its objects), and `-l` keeps the cache's objects out of the store's pack.

use std::path::Path;

use grove_core::error::GitError;

use crate::errors::{map_io, scrub};

/// Packs what the store's points still reach into one pack and deletes the rest.
/// `Ok(false)`: no git binary is installed, nothing was done.
pub(super) fn compact(store_dir: &Path, cache_dir: &Path) -> Result<bool, GitError> {
    // Unreachable objects first (dropped points are loose objects, mostly), then one
    // pack of the rest with the now-redundant packs and loose objects removed.
    run(
        store_dir,
        cache_dir,
        &[&["prune", "--expire=now"], REPACK, PACK_REFS],
    )
}

/// Packs every object of the store, loose or in earlier packs, into one pack (a
/// version of a file or tree as a delta against any other version the store holds,
/// which separate packs cannot share), and its refs into `packed-refs`; nothing is
/// deleted that a point reaches. `Ok(false)`: no git binary is installed.
pub(super) fn repack(store_dir: &Path, cache_dir: &Path) -> Result<bool, GitError> {
    run(store_dir, cache_dir, &[REPACK, PACK_REFS])
}

/// One pack of everything, the old packs and loose objects removed once it is whole;
/// `-l` keeps the cache's objects out of it.
const REPACK: &[&str] = &["repack", "-a", "-d", "-l", "-q"];
const PACK_REFS: &[&str] = &["pack-refs", "--all", "--prune"];

fn run(store_dir: &Path, cache_dir: &Path, steps: &[&[&str]]) -> Result<bool, GitError> {
    let Some(git) = crate::checkout::git_cli() else {
        return Ok(false);
    };
    for args in steps {
        let out = crate::trusted::git_command(git, store_dir, store_dir)?
            .env(
                "GIT_ALTERNATE_OBJECT_DIRECTORIES",
                cache_dir.join("objects"),
            )
            .args(["-c", "gc.auto=0", "-c", "repack.writeBitmaps=false"])
            // The reverse index speeds up git's own reads of large packs; libgit2, which
            // reads the store, does not use it.
            .args(["-c", "pack.writeReverseIndex=false"])
            .args(*args)
            .output()
            .map_err(|e| map_io("cannot run git on the history store", &e))?;
        if !out.status.success() {
            return Err(GitError::Other(scrub(
                &format!(
                    "git {} on the history store failed ({}): {}",
                    args[0],
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ),
                None,
            )));
        }
    }
    Ok(true)
}
