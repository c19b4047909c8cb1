//! Ignored files in a point, for a workspace that opted in (ADR 28): which paths count
//! as ignored (matched by the workspace's `.gitignore` files and not in HEAD's tree),
//! which of them fit the per-point budget (path order; one that does not fit is left
//! out, read no further than the room left, and the next ones are tried), and the tree
//! without them that decides the workspace's `dirty`.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use git2::{Index, Oid, Repository, Tree};
use grove_core::error::GitError;

use super::beneath::{self, Added};
use super::local;

/// Whether `path` is an ignored file: a `.gitignore` rule matches it and HEAD does not
/// track it (a tracked file stays tracked whatever the rules say).
pub(super) fn is_ignored(store: &Repository, head: &Tree<'_>, path: &Path) -> bool {
    store.is_path_ignored(path).unwrap_or(false) && head.get_path(path).is_err()
}

/// What [`fit`] left in the index.
#[derive(Debug, Default)]
pub(super) struct Fitted {
    /// The ignored paths the point keeps.
    pub kept: Vec<Vec<u8>>,
    /// Ignored files left out over the budget.
    pub omitted: u32,
    /// The index changed.
    pub changed: bool,
}

/// Puts into `index` the ignored files that fit in `budget` bytes: those it already
/// holds unchanged (their size known from it) and `changed` (new or changed since the
/// last point, read through descriptors with the room left as their limit), in path
/// order. What does not fit is removed from the index and counted.
pub(super) fn fit(
    store: &Repository,
    index: &mut Index,
    root: &OwnedFd,
    head: &Tree<'_>,
    changed: Vec<Vec<u8>>,
    budget: u64,
) -> Result<Fitted, GitError> {
    let fresh: HashSet<&[u8]> = changed.iter().map(Vec::as_slice).collect();
    let mut all: Vec<(Vec<u8>, Option<u64>)> = index
        .iter()
        .filter(|e| !fresh.contains(e.path.as_slice()))
        .filter(|e| is_ignored(store, head, as_path(&e.path)))
        .map(|e| (e.path, Some(u64::from(e.file_size))))
        .collect();
    all.extend(changed.iter().map(|p| (p.clone(), None)));
    all.sort();
    let mut used = 0u64;
    let mut out = Fitted::default();
    for (path, known) in all {
        let p = as_path(&path);
        let room = budget.saturating_sub(used).min(super::MAX_POINT_FILE_BYTES);
        let size = match known {
            Some(size) => (size <= room).then_some(size),
            None => match beneath::add(store, index, root, p, Some(room))? {
                Added::Entry(size) => Some(size),
                Added::OverLimit => None,
                Added::Skipped => {
                    let _ = index.remove_path(p);
                    out.changed = true;
                    continue;
                }
            },
        };
        out.changed |= known.is_none();
        match size {
            Some(size) => {
                used += size;
                out.kept.push(path);
            }
            None => {
                if index.get_path(p, 0).is_some() {
                    index.remove_path(p).map_err(local)?;
                    out.changed = true;
                }
                out.omitted += 1;
            }
        }
    }
    Ok(out)
}

/// The tree of `index` without the `kept` ignored files (what `dirty` compares with
/// HEAD's tree: ignored files never make a workspace dirty).
pub(super) fn tree_without(
    store: &Repository,
    index: &Index,
    kept: &[Vec<u8>],
) -> Result<Oid, GitError> {
    let kept: HashSet<&[u8]> = kept.iter().map(Vec::as_slice).collect();
    let mut plain = Index::new().map_err(local)?;
    for entry in index.iter() {
        if !kept.contains(entry.path.as_slice()) {
            plain.add(&entry).map_err(local)?;
        }
    }
    plain.write_tree_to(store).map_err(local)
}

fn as_path(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}
