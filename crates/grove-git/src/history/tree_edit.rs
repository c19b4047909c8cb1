//! A point's tree from the previous point's tree and the index paths a tracked point
//! changed (ADR 35), instead of `git_index_write_tree`, which rebuilds its tree cache
//! by reading every tree of the working tree back after each write. Only the trees on
//! the way to a changed path are read and written: a point that changed one file
//! writes as many trees as the file is deep.
//!
//! Each changed path takes what the index now holds for it: its entry, or nothing (the
//! entry leaves its tree; a tree left empty leaves its parent). A file that replaced a
//! directory replaces the whole subtree (the index cannot hold both), and a directory
//! that replaced a file replaces that file.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use git2::{Index, ObjectType, Oid, Repository, Tree, TreeBuilder};
use grove_core::error::GitError;

use super::local;

/// A tree's mode in its parent.
const TREE_MODE: i32 = 0o040000;

/// The tree of `index` when `base` is the tree it had before `changed` (index paths, a
/// superset of those whose entries differ) changed.
pub(super) fn edit<'p, I>(
    store: &Repository,
    base: Oid,
    index: &Index,
    changed: I,
) -> Result<Oid, GitError>
where
    I: IntoIterator<Item = &'p [u8]>,
{
    let root = store.find_tree(base).map_err(local)?;
    let paths: Vec<&[u8]> = changed.into_iter().collect();
    match subtree(store, Some(&root), index, b"", &paths)? {
        Some(tree) => Ok(tree),
        None => store
            .treebuilder(None)
            .and_then(|b| b.write())
            .map_err(local),
    }
}

/// The changes below one directory, by the name of its entry they go through.
#[derive(Default)]
struct Through<'p> {
    /// The entry itself changed.
    itself: bool,
    /// Paths below it (relative to it).
    below: Vec<&'p [u8]>,
}

/// `base` (the directory at `prefix`, or none) with `paths` (relative to it) applied;
/// `None` when nothing is left in it.
fn subtree(
    store: &Repository,
    base: Option<&Tree<'_>>,
    index: &Index,
    prefix: &[u8],
    paths: &[&[u8]],
) -> Result<Option<Oid>, GitError> {
    let mut by_name: BTreeMap<&[u8], Through<'_>> = BTreeMap::new();
    for path in paths {
        match path.iter().position(|b| *b == b'/') {
            Some(at) => by_name
                .entry(&path[..at])
                .or_default()
                .below
                .push(&path[at + 1..]),
            None => by_name.entry(path).or_default().itself = true,
        }
    }
    let mut builder = store.treebuilder(base).map_err(local)?;
    for (name, through) in by_name {
        let full = join(prefix, name);
        let entry = if through.itself {
            index.get_path(Path::new(OsStr::from_bytes(&full)), 0)
        } else {
            None
        };
        if let Some(entry) = entry {
            // The index holds a file here, so nothing below it.
            builder
                .insert(OsStr::from_bytes(name), entry.id, entry.mode as i32)
                .map_err(local)?;
            continue;
        }
        let old = old_subtree(store, &mut builder, name, through.itself)?;
        if through.below.is_empty() {
            continue;
        }
        match subtree(store, old.as_ref(), index, &full, &through.below)? {
            Some(id) => {
                builder
                    .insert(OsStr::from_bytes(name), id, TREE_MODE)
                    .map_err(local)?;
            }
            // Every file below it gone: the directory goes (a file the index still
            // holds under that name stays).
            None if old.is_some() => remove(&mut builder, name)?,
            None => {}
        }
    }
    if builder.is_empty() {
        return Ok(None);
    }
    builder.write().map(Some).map_err(local)
}

/// The tree at `name` in `builder` (if it is one); an entry there that is not a tree
/// and that the index no longer holds (`gone`) is removed.
fn old_subtree<'r>(
    store: &'r Repository,
    builder: &mut TreeBuilder<'_>,
    name: &[u8],
    gone: bool,
) -> Result<Option<Tree<'r>>, GitError> {
    let existing = builder
        .get(OsStr::from_bytes(name))
        .map_err(local)?
        .map(|e| (e.kind(), e.id()));
    match existing {
        Some((Some(ObjectType::Tree), id)) => store.find_tree(id).map(Some).map_err(local),
        Some(_) if gone => {
            remove(builder, name)?;
            Ok(None)
        }
        _ => Ok(None),
    }
}

fn remove(builder: &mut TreeBuilder<'_>, name: &[u8]) -> Result<(), GitError> {
    let name = OsStr::from_bytes(name);
    if builder.get(name).map_err(local)?.is_some() {
        builder.remove(name).map_err(local)?;
    }
    Ok(())
}

fn join(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    if prefix.is_empty() {
        return name.to_vec();
    }
    let mut full = Vec::with_capacity(prefix.len() + 1 + name.len());
    full.extend_from_slice(prefix);
    full.push(b'/');
    full.extend_from_slice(name);
    full
}
