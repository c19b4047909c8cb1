//! Packing a history store: each point leaves a few small loose files (its blob, the
//! trees on its path, its commit) and a ref file, each taking a whole filesystem block.
//! The sweep packs a store that holds many: with a git binary, everything into one pack
//! by `git repack` (`super::repack`); without one, the loose objects into one pack of
//! their own here (a version of a file or tree as a delta against another where that is
//! smaller). The point refs go into `packed-refs`. Points and their numbers are unchanged, and every
//! object stays readable throughout (from its loose file, then from the pack).

use std::collections::HashSet;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use git2::{Oid, Repository};
use grove_core::error::GitError;
use grove_core::history::HistoryPaths;

use super::{local, open_existing};
use crate::errors::map_io;

const PACKED_REFS: &str = "packed-refs";
const PACKED_HEADER: &str = "# pack-refs with: peeled fully-peeled sorted \n";

/// The store's loose objects as `git gc --auto` estimates them: the entries of one of
/// the 256 fan-out directories, times 256 (a directory listing, no walk).
pub(crate) fn loose_estimate(store_dir: &Path) -> usize {
    std::fs::read_dir(store_dir.join("objects").join("17"))
        .map(|d| d.count() * 256)
        .unwrap_or(0)
}

/// Packs the store's loose objects (its own: the cache's are never in it) and its
/// refs; see the module documentation. Returns how many objects were packed.
///
/// With a git binary, one `git repack` of everything ([`super::repack::repack`]): a
/// single pack lets every version delta against any other, where packs made one batch
/// of loose objects at a time store each batch's first version of a tree whole. Without
/// one, libgit2 packs the loose objects alone.
pub(crate) fn pack(paths: &HistoryPaths<'_>) -> Result<usize, GitError> {
    let io = |e: std::io::Error| map_io("cannot pack the history store", &e);
    let objects = paths.store_dir.join("objects");
    let loose = loose_objects(&objects).map_err(io)?;
    if super::repack::repack(paths.store_dir, paths.cache_dir)? {
        return Ok(loose.len());
    }
    let (store_dir, store) = (paths.store_dir, open_existing(paths.store_dir)?);
    if !loose.is_empty() {
        let mut builder = store.packbuilder().map_err(local)?;
        insert_named(&store, &mut builder, &loose)?;
        // Written to a temporary name and renamed into place: the pack and its index
        // exist whole before any loose file goes.
        builder.write(&objects.join("pack"), 0).map_err(local)?;
        for (_, path) in &loose {
            std::fs::remove_file(path).map_err(io)?;
        }
        // An emptied fan-out directory still takes a block (up to 256 of them).
        for (_, path) in &loose {
            if let Some(dir) = path.parent() {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
    pack_refs(&store, store_dir).map_err(io)?;
    Ok(loose.len())
}

/// Inserts the loose objects into `builder`, each blob and tree under the path a point
/// has it at (the delta search pairs versions of the same path), then the rest.
fn insert_named(
    store: &Repository,
    builder: &mut git2::PackBuilder<'_>,
    loose: &[(Oid, PathBuf)],
) -> Result<(), GitError> {
    let loose: HashSet<Oid> = loose.iter().map(|(id, _)| *id).collect();
    let mut done = HashSet::new();
    for r in store.references().map_err(local)? {
        let Some(id) = r.map_err(local)?.target() else {
            continue;
        };
        if !loose.contains(&id) || !done.insert(id) {
            continue;
        }
        builder.insert_object(id, None).map_err(local)?;
        let tree = store.find_commit(id).map_err(local)?.tree_id();
        insert_tree(store, builder, &loose, &mut done, tree, "")?;
    }
    for id in loose.iter().filter(|id| !done.contains(id)) {
        builder.insert_object(*id, None).map_err(local)?;
    }
    Ok(())
}

/// Inserts tree `id` at `path` and what it holds, stopping at objects that are not
/// loose (in the cache or an earlier pack, with all they reach).
fn insert_tree(
    store: &Repository,
    builder: &mut git2::PackBuilder<'_>,
    loose: &HashSet<Oid>,
    done: &mut HashSet<Oid>,
    id: Oid,
    path: &str,
) -> Result<(), GitError> {
    if !loose.contains(&id) || !done.insert(id) {
        return Ok(());
    }
    builder.insert_object(id, Some(path)).map_err(local)?;
    let tree = store.find_tree(id).map_err(local)?;
    for entry in tree.iter() {
        let name = String::from_utf8_lossy(entry.name_bytes());
        let sub = if path.is_empty() {
            name.into_owned()
        } else {
            format!("{path}/{name}")
        };
        match entry.kind() {
            Some(git2::ObjectType::Tree) => {
                insert_tree(store, builder, loose, done, entry.id(), &sub)?
            }
            Some(git2::ObjectType::Blob)
                if loose.contains(&entry.id()) && done.insert(entry.id()) =>
            {
                builder
                    .insert_object(entry.id(), Some(&sub))
                    .map_err(local)?
            }
            _ => {}
        }
    }
    Ok(())
}

/// Every loose object of an `objects` directory (`xx/<38 hex>`) and its file.
fn loose_objects(objects: &Path) -> std::io::Result<Vec<(Oid, PathBuf)>> {
    let mut out = Vec::new();
    for dir in std::fs::read_dir(objects)? {
        let dir = dir?;
        let prefix = dir.file_name();
        let Some(prefix) = prefix.to_str().filter(|p| is_hex(p, 2)) else {
            continue;
        };
        if !dir.file_type()?.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(dir.path())? {
            let file = file?;
            let name = file.file_name();
            let Some(rest) = name.to_str().filter(|n| is_hex(n, 38)) else {
                continue; // a temporary file of a write in progress
            };
            if let Ok(id) = Oid::from_str(&format!("{prefix}{rest}")) {
                out.push((id, file.path()));
            }
        }
    }
    Ok(out)
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Writes every ref of the store (loose or already packed) into `packed-refs`, then
/// removes each loose ref file that still names what was packed. The new file is
/// made as `packed-refs.lock` (`O_EXCL`: libgit2 takes the same lock to rewrite it)
/// and renamed into place.
fn pack_refs(store: &Repository, store_dir: &Path) -> std::io::Result<()> {
    let git = |e: git2::Error| std::io::Error::other(e.message().to_string());
    let mut refs: Vec<(String, Oid)> = Vec::new();
    for r in store.references().map_err(git)? {
        let r = r.map_err(git)?;
        if let (Ok(name), Some(id)) = (r.name(), r.target()) {
            refs.push((name.to_string(), id));
        }
    }
    if refs.is_empty() {
        return Ok(());
    }
    write_packed(store_dir, &refs)?;
    for (name, id) in &refs {
        let file = store_dir.join(name);
        if std::fs::read(&file).is_ok_and(|b| b == format!("{id}\n").as_bytes()) {
            std::fs::remove_file(&file)?;
        }
    }
    Ok(())
}

/// Replaces the store's `packed-refs` by `refs` (sorted by name, as the format wants).
fn write_packed(store_dir: &Path, refs: &[(String, Oid)]) -> std::io::Result<()> {
    let mut refs = refs.to_vec();
    refs.sort();
    refs.dedup_by(|a, b| a.0 == b.0);
    let mut text = String::from(PACKED_HEADER);
    for (name, id) in &refs {
        text.push_str(&format!("{id} {name}\n"));
    }
    let lock = store_dir.join(format!("{PACKED_REFS}.lock"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&lock)?;
    let written = file.write_all(text.as_bytes());
    drop(file);
    match written.and_then(|()| std::fs::rename(&lock, store_dir.join(PACKED_REFS))) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&lock);
            Err(e)
        }
    }
}

/// Adds the refs of `from`'s `packed-refs` to `to`'s (a fork's store taking its
/// source's points); nothing to do when `from` has none.
pub(crate) fn merge_packed_refs(from: &Path, to: &Path) -> std::io::Result<()> {
    let Ok(theirs) = std::fs::read_to_string(from.join(PACKED_REFS)) else {
        return Ok(());
    };
    let ours = std::fs::read_to_string(to.join(PACKED_REFS)).unwrap_or_default();
    let refs: Vec<(String, Oid)> = theirs
        .lines()
        .chain(ours.lines())
        .filter_map(|line| {
            let (id, name) = line.split_once(' ')?;
            let id = Oid::from_str(id)
                .ok()
                .filter(|_| !line.starts_with(['#', '^']))?;
            Some((name.to_string(), id))
        })
        .collect();
    write_packed(to, &refs)
}
