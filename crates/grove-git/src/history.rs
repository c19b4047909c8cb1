//! Workspace history (ADR 28): one point per change, kept in a private per-workspace
//! store at `$GROVE_HOME/history/<user>/<workspace id>/` (a bare repository, mode 0700,
//! never mounted into a sandbox).
//!
//! A point is a commit of the store whose tree is the workspace's working tree
//! (tracked and untracked files, not ignored ones; symlinks as symlinks), whose parent
//! is the workspace's HEAD, and whose message names HEAD's branch; a ref
//! `refs/points/<id>` keeps it. The tree is built through the store's own index file
//! (`grove.index`), so only files whose stat changed since the last point are hashed,
//! and the workspace's index, refs, stash and objects are never touched. The store's
//! `info/attributes` turns off every conversion (`-text -filter -ident`), so a point
//! holds the bytes that were on disk whatever the workspace's `.gitattributes` say.
//! The repo cache's objects are read through an in-memory alternate; commits made in
//! the workspace are copied into the store, so a rewind finds them even after the
//! workspace dropped them.

mod beneath;
mod held;
mod ignored;
mod incremental;
mod pack;
mod repack;
mod rewind;
mod stores;
mod tree_edit;
mod watch;

use std::cell::Cell;
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use git2::{Delta, DiffFormat, DiffOptions, Index, ObjectType, Oid, Repository, Signature};
use grove_core::error::GitError;
use grove_core::history::{
    ChangedFile, FileCounts, HistoryPaths, IgnoredFiles, Snapshot, TreeDiff,
};
use uuid::Uuid;

use crate::errors::{map_git2, map_io, Phase};
use crate::saved::{add_alternate, copy_closure, private_dir};

pub(crate) use pack::{loose_estimate, merge_packed_refs, pack};
pub(crate) use rewind::rewind;
pub(crate) use watch::state as tracker_state;
pub use watch::{WatchLimits, WatchState};

/// The store's private index file (stat data of the last point's files).
const INDEX_FILE: &str = "grove.index";

/// The largest file a point reads (ADR 28): one larger (a sparse file an exec made in a
/// moment can claim terabytes) is left out of the point unread, as a deleted file
/// would be, so a point never holds more than this much of one file in memory.
pub const MAX_POINT_FILE_BYTES: u64 = 256 << 20;
/// The store's attributes: no conversion of any kind between disk and blob.
const ATTRIBUTES: &str = "* -text -filter -ident -working-tree-encoding\n";
/// Points are kept by refs under this prefix.
const POINTS: &str = "refs/points/";
/// The branch line of a point's message (absent: HEAD was detached).
const BRANCH_LINE: &str = "branch: ";

/// Drops workspace `id`'s change tracker (its watches and held index) and closes its
/// kept store: released, evicted or destroyed.
pub(crate) fn forget_tracker(id: Uuid) {
    watch::forget(id);
    stores::forget(id);
}

/// A point's commit message: the workspace, HEAD's branch, and a fresh id of the point
/// itself, so two points of identical states (same tree, HEAD and second) are still two
/// commits and a point id names one step of the timeline.
pub(crate) fn point_message(workspace_id: Uuid, branch: Option<&str>) -> String {
    let mut message = format!("grove history point\n\nworkspace: {workspace_id}\n");
    if let Some(b) = branch {
        message.push_str(&format!("{BRANCH_LINE}{b}\n"));
    }
    message.push_str(&format!("point: {}\n", Uuid::now_v7()));
    message
}

pub(crate) fn local(e: git2::Error) -> GitError {
    map_git2(&e, Phase::Local, None)
}

/// Opens the store, creating it (0700, bare, with its attributes) when absent, with the
/// cache's objects readable through an in-memory alternate.
pub(crate) fn open_store(store_dir: &Path, cache_dir: &Path) -> Result<Repository, GitError> {
    if std::fs::symlink_metadata(store_dir).is_err() {
        private_dir(store_dir)?;
        // No template directory: no sample hooks or other files copied in.
        let mut opts = git2::RepositoryInitOptions::new();
        opts.bare(true).external_template(false);
        Repository::init_opts(store_dir, &opts).map_err(local)?;
        std::fs::create_dir_all(store_dir.join("info"))
            .and_then(|()| std::fs::write(store_dir.join("info").join("attributes"), ATTRIBUTES))
            .map_err(|e| map_io("cannot write the history store's attributes", &e))?;
    }
    let repo = crate::trusted::open_private(store_dir)?;
    add_alternate(&repo, cache_dir)?;
    Ok(repo)
}

/// Opens an existing store for reading, the cache's objects readable through it.
fn open_reading(paths: &HistoryPaths<'_>) -> Result<Repository, GitError> {
    let repo = open_existing(paths.store_dir)?;
    add_alternate(&repo, paths.cache_dir)?;
    Ok(repo)
}

/// Opens an existing store (a missing one: no history yet).
fn open_existing(store_dir: &Path) -> Result<Repository, GitError> {
    if std::fs::symlink_metadata(store_dir).is_err() {
        return Err(GitError::RefNotFound(
            "the workspace has no history store".into(),
        ));
    }
    crate::trusted::open_private(store_dir)
}

/// The first point of a checkout grove just made: the store's private index is seeded
/// from the checkout's own index (grove wrote it; a regular file, read without
/// following a link), so the point hashes nothing that index already describes.
pub(crate) fn first_snapshot(
    paths: &HistoryPaths<'_>,
    workspace_id: Uuid,
) -> Result<Snapshot, GitError> {
    open_store(paths.store_dir, paths.cache_dir)?;
    let seed = paths.store_dir.join(INDEX_FILE);
    if std::fs::symlink_metadata(&seed).is_err() {
        if let Some(bytes) = read_regular(&paths.workspace_dir.join(".git").join("index")) {
            std::fs::write(&seed, bytes)
                .map_err(|e| map_io("cannot seed the history index", &e))?;
        }
    }
    snapshot(paths, workspace_id, None, IgnoredFiles::Excluded)
}

/// A regular file's bytes, opened without following a link (`None` otherwise).
fn read_regular(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// Takes one point by a walk of the whole tree; see the module documentation.
pub(crate) fn snapshot(
    paths: &HistoryPaths<'_>,
    workspace_id: Uuid,
    previous: Option<&str>,
    ignored: IgnoredFiles,
) -> Result<Snapshot, GitError> {
    let build = |store: &Repository, head: &git2::Tree<'_>| {
        Ok(work_tree(store, paths, head, ignored, None, &|_, _, _| {})?.0)
    };
    Ok(point(paths, workspace_id, previous, build)?.0)
}

/// Takes one point reading only what the workspace's change tracker saw change since
/// its last point (ADR 32); without a known tracker, by a walk of the whole tree that
/// (re)starts one. A workspace keeping ignored files in its points is always walked.
pub(crate) fn tracked_snapshot(
    paths: &HistoryPaths<'_>,
    workspace_id: Uuid,
    previous: Option<&str>,
    ignored: IgnoredFiles,
    limits: WatchLimits,
) -> Result<Snapshot, GitError> {
    if ignored != IgnoredFiles::Excluded {
        watch::forget(workspace_id);
        return snapshot(paths, workspace_id, previous, ignored);
    }
    let mut tracked = Tracked::default();
    let build = |store: &Repository, head: &git2::Tree<'_>| {
        tracked_tree(store, paths, head, workspace_id, limits, &mut tracked)
    };
    let (snap, built) = point(paths, workspace_id, previous, build)?;
    // Only now, the point's ref written, do the paths it read leave the set.
    watch::settle(workspace_id, &tracked.read, &built.oversized, tracked.held);
    Ok(snap)
}

/// What a tracked point hands its tracker when its ref is written.
#[derive(Default)]
struct Tracked {
    /// The changes it read.
    read: watch::ChangeSet,
    /// The index it left, and its tree.
    held: Option<held::Held>,
}

/// The tree of a point from the tracker's changes and held index, or by a full walk
/// that first re-establishes the tracker's watches.
fn tracked_tree(
    store: &Repository,
    paths: &HistoryPaths<'_>,
    head: &git2::Tree<'_>,
    workspace_id: Uuid,
    limits: WatchLimits,
    tracked: &mut Tracked,
) -> Result<Built, GitError> {
    store
        .set_workdir(paths.workspace_dir, false)
        .map_err(local)?;
    let root = beneath::open_root(paths.workspace_dir)?;
    let enter =
        |index: &Index, rel: &Path, fd: &OwnedFd| incremental::watched_dir(store, index, fd, rel);
    if let Some((set, mut held)) = watch::take(workspace_id, &root, &enter) {
        match incremental::apply(store, &mut held.index, &root, &set) {
            Ok(Some(walked)) => match edited(store, &mut held, walked) {
                Ok(built) => {
                    tracked.read = set;
                    tracked.held = Some(held);
                    return Ok(built);
                }
                // The held tree unreadable (pruned by retention since): a walk.
                Err(e) => {
                    tracing::debug!(workspace = %workspace_id, error = %e, "a held tree could not be edited: the point walks the tree");
                }
            },
            // The held index is part-applied: the walk starts from the file.
            Ok(None) => {}
            Err(e) => {
                watch::forget(workspace_id);
                return Err(e);
            }
        }
    }
    let epoch = Cell::new(None);
    let establish = |store: &Repository, index: &Index, root: &OwnedFd| {
        let enter = |rel: &Path, fd: &OwnedFd| incremental::watched_dir(store, index, fd, rel);
        epoch.set(watch::establish(workspace_id, root, limits, &enter));
        if epoch.get().is_none() {
            tracing::debug!(workspace = %workspace_id, "no change tracker: points walk the tree");
        }
    };
    let start = watch::spare(workspace_id);
    let (built, index) = work_tree(
        store,
        paths,
        head,
        IgnoredFiles::Excluded,
        start,
        &establish,
    )?;
    if let Some(epoch) = epoch.get() {
        tracked.read.epoch = epoch;
        tracked.held = Some(held::Held::walked(index, built.tree));
    }
    Ok(built)
}

/// The point's tree from the held index's tree and the paths a tracked point changed
/// (ADR 35); the index file is not written.
fn edited(store: &Repository, held: &mut held::Held, walked: Walked) -> Result<Built, GitError> {
    let base = held.tree;
    if !walked.touched.is_empty() {
        let touched = walked.touched.iter().map(Vec::as_slice);
        held.tree = tree_edit::edit(store, base, &held.index, touched)?;
        held.unsaved = true;
        // (at most one per entry: gone paths leave the set)
        for path in &walked.touched {
            let entry = held.index.get_path(Path::new(OsStr::from_bytes(path)), 0);
            match entry {
                Some(_) => held.touched.insert(path.clone()),
                None => held.touched.remove(path),
            };
        }
    }
    debug_assert_eq!(
        held.index.write_tree_to(store).ok(),
        Some(held.tree),
        "a tracked point's edited tree differs from its index's"
    );
    Ok(Built {
        tree: held.tree,
        plain: held.tree,
        ignored_omitted: 0,
        oversized: walked.oversized,
        edited: Some(Edited {
            base,
            touched: walked.touched,
        }),
    })
}

/// The parts of a point around its tree: HEAD and branch read from the workspace (its
/// commits copied into the store), the tree `build` makes, the commit and its ref.
fn point<F>(
    paths: &HistoryPaths<'_>,
    workspace_id: Uuid,
    previous: Option<&str>,
    build: F,
) -> Result<(Snapshot, Built), GitError>
where
    F: FnOnce(&Repository, &git2::Tree<'_>) -> Result<Built, GitError>,
{
    let store = match stores::take(workspace_id, paths.store_dir, paths.cache_dir) {
        Some(store) => store,
        None => open_store(paths.store_dir, paths.cache_dir)?,
    };
    let ws = crate::trusted::open_workspace(paths.workspace_dir)?;
    let head = ws
        .head()
        .and_then(|h| h.peel_to_commit())
        .map_err(|e| GitError::Other(format!("workspace HEAD: {}", e.message())))?
        .id();
    let branch = crate::trusted::head_ref_name(&ws)?;
    let branch = (branch != "HEAD").then_some(branch);
    copy_closure(&ws, &store.odb().map_err(local)?, head)?;
    drop(ws);
    let head_commit = store.find_commit(head).map_err(local)?;
    let built = build(&store, &head_commit.tree().map_err(local)?)?;
    let sig = Signature::now("grove", "grove@grove.invalid").map_err(local)?;
    let message = point_message(workspace_id, branch.as_deref());
    let tree_obj = store.find_tree(built.tree).map_err(local)?;
    let id = store
        .commit(None, &sig, &sig, &message, &tree_obj, &[&head_commit])
        .map_err(local)?;
    store
        .reference(&format!("{POINTS}{id}"), id, true, "grove: point")
        .map_err(local)?;
    let before = match previous {
        Some(p) => Some(point_tree(&store, p)?),
        None => None,
    };
    // Only the paths a tracked point touched can differ from the tree it edited.
    let only = built
        .edited
        .as_ref()
        .filter(|e| before == Some(e.base))
        .map(|e| &e.touched);
    let changes = counts(&store, before, built.tree, only)?;
    let snap = Snapshot {
        id: id.to_string(),
        head: head.to_string(),
        branch,
        changes,
        // A file too large for the point is a change the point does not hold.
        dirty: built.plain != head_commit.tree_id() || !built.oversized.is_empty(),
        ignored_omitted: built.ignored_omitted,
    };
    drop((head_commit, tree_obj));
    // A walk gave the store an index to own: that store is not kept (see `held`).
    if built.edited.is_some() {
        stores::keep(workspace_id, paths.store_dir, paths.cache_dir, store);
    }
    Ok((snap, built))
}

/// What a tracked point changed in the tree it edited.
struct Edited {
    /// The tree it edited (its index's before the point).
    base: Oid,
    /// The index paths it read: outside them the two trees are equal.
    touched: BTreeSet<Vec<u8>>,
}

/// The trees of one walk of the working tree.
struct Built {
    /// The point's tree.
    tree: Oid,
    /// The same without ignored files (equal to `tree` unless they are kept).
    plain: Oid,
    ignored_omitted: u32,
    /// Files (not ignored ones) left out over [`MAX_POINT_FILE_BYTES`].
    oversized: Vec<PathBuf>,
    /// Set by a tracked point that edited the last point's tree.
    edited: Option<Edited>,
}

/// The store's private index (`start`, else its file), the store's work tree set to
/// the workspace, and the workspace root opened without following a link.
fn open_index(
    store: &Repository,
    paths: &HistoryPaths<'_>,
    start: Option<Index>,
) -> Result<(Index, OwnedFd), GitError> {
    store
        .set_workdir(paths.workspace_dir, false)
        .map_err(local)?;
    let mut index = match start {
        Some(index) => index,
        None => Index::open(&paths.store_dir.join(INDEX_FILE)).map_err(local)?,
    };
    store.set_index(&mut index).map_err(local)?;
    Ok((index, beneath::open_root(paths.workspace_dir)?))
}

/// Runs between a full walk's rule-file check and the walk itself (a tracker's watches
/// are added there, so what changes during the walk is queued).
type BeforeWalk<'a> = &'a dyn Fn(&Repository, &Index, &OwnedFd);

/// The working tree as a tree of the store, through the store's private index (from
/// its file, or a held one), and that index as the walk left it (saved).
fn work_tree(
    store: &Repository,
    paths: &HistoryPaths<'_>,
    head: &git2::Tree<'_>,
    ignored: IgnoredFiles,
    start: Option<held::Held>,
    before_walk: BeforeWalk<'_>,
) -> Result<(Built, Index), GitError> {
    let unsaved = start.as_ref().is_some_and(|h| h.unsaved);
    let (mut index, root) = open_index(store, paths, start.map(|h| h.index))?;
    let budget = match ignored {
        IgnoredFiles::Excluded => None,
        IgnoredFiles::Included { budget_bytes } => Some(budget_bytes),
    };
    // One walk of the working tree: what differs from the index by stat (content when
    // stat is not enough), untracked files included, ignored ones when they are kept.
    let mut opts = DiffOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_typechange(true)
        .include_ignored(budget.is_some())
        .recurse_ignored_dirs(budget.is_some())
        .update_index(true);
    // No rule file the walk reads may block it (a FIFO named `.gitignore`).
    let ignored_too = budget.is_some();
    let checked = crate::rules::check(&root, &|dir| {
        ignored_too || !store.is_path_ignored(dir).unwrap_or(false)
    })?;
    before_walk(store, &index, &root);
    let diff = store
        .diff_index_to_workdir(Some(&index), Some(&mut opts))
        .map_err(local)?;
    // A rule file swapped while libgit2 read it: the walk may rest on another file's rules.
    checked.verify()?;
    let mut walked = apply_walk(store, &mut index, &root, &diff, head, budget.is_some())?;
    let fitted = match budget {
        Some(budget) => {
            let fresh = std::mem::take(&mut walked.ignored);
            ignored::fit(store, &mut index, &root, head, fresh, budget)?
        }
        None => ignored::Fitted::default(),
    };
    let changed = unsaved || walked.changed || fitted.changed;
    let tree = index.write_tree().map_err(local)?;
    let plain = if fitted.kept.is_empty() {
        tree
    } else {
        ignored::tree_without(store, &index, &fitted.kept)?
    };
    if changed || !paths.store_dir.join(INDEX_FILE).exists() {
        index.write().map_err(local)?;
    }
    let built = Built {
        tree,
        plain,
        ignored_omitted: fitted.omitted,
        oversized: walked.oversized,
        edited: None,
    };
    Ok((built, index))
}

/// What one walk changed in the private index.
#[derive(Default)]
struct Walked {
    changed: bool,
    /// The index paths a tracked point read (their entries may have changed).
    touched: BTreeSet<Vec<u8>>,
    /// Ignored files new or changed since the last point (when they are kept), for the
    /// budget to weigh.
    ignored: Vec<Vec<u8>>,
    /// Files left out over [`MAX_POINT_FILE_BYTES`].
    oversized: Vec<PathBuf>,
}

/// Applies the walk's `diff` to `index`: deleted files removed, changed and new ones
/// read through descriptors (never by path: see `beneath`) up to
/// [`MAX_POINT_FILE_BYTES`] (one larger is removed unread), ignored ones set aside.
fn apply_walk(
    store: &Repository,
    index: &mut Index,
    root: &std::os::fd::OwnedFd,
    diff: &git2::Diff<'_>,
    head: &git2::Tree<'_>,
    keep_ignored: bool,
) -> Result<Walked, GitError> {
    let mut walked = Walked::default();
    for delta in diff.deltas() {
        let Some(path) = delta.new_file().path().or(delta.old_file().path()) else {
            continue;
        };
        match delta.status() {
            Delta::Deleted => index.remove_path(path).map_err(local)?,
            // A nested repository shows as a directory: not part of the point.
            _ if path.as_os_str().as_encoded_bytes().ends_with(b"/") => continue,
            // A file HEAD tracks is not ignored, whatever the rules say.
            _ if keep_ignored && ignored::is_ignored(store, head, path) => {
                walked.ignored.push(path.as_os_str().as_bytes().to_vec());
                continue;
            }
            _ => match beneath::add(store, index, root, path, Some(MAX_POINT_FILE_BYTES))? {
                beneath::Added::Entry(_) => {}
                beneath::Added::Skipped => {
                    let _ = index.remove_path(path);
                }
                beneath::Added::OverLimit => {
                    let _ = index.remove_path(path);
                    walked.oversized.push(path.to_path_buf());
                }
            },
        }
        walked.changed = true;
    }
    Ok(walked)
}

/// The commit of point `id`, which must be a point of this store.
pub(crate) fn point_commit<'r>(
    store: &'r Repository,
    id: &str,
) -> Result<git2::Commit<'r>, GitError> {
    let unknown = || GitError::RefNotFound(format!("history point {id}"));
    let oid = Oid::from_str(id).map_err(|_| unknown())?;
    store
        .find_reference(&format!("{POINTS}{oid}"))
        .map_err(|_| unknown())?;
    store.find_commit(oid).map_err(|_| unknown())
}

fn point_tree(store: &Repository, id: &str) -> Result<Oid, GitError> {
    Ok(point_commit(store, id)?.tree_id())
}

/// HEAD's commit and branch as point `id` recorded them.
pub(crate) fn point_head(commit: &git2::Commit<'_>) -> (Oid, Option<String>) {
    let head = commit.parent_id(0).unwrap_or(Oid::ZERO_SHA1);
    let branch = commit
        .message()
        .unwrap_or("")
        .lines()
        .find_map(|l| l.strip_prefix(BRANCH_LINE))
        .map(str::to_string);
    (head, branch)
}

/// The files added, modified and deleted from tree `before` to `after`; `only`: the
/// paths outside which the two trees are known equal (the diff reads no other tree).
fn counts(
    store: &Repository,
    before: Option<Oid>,
    after: Oid,
    only: Option<&BTreeSet<Vec<u8>>>,
) -> Result<FileCounts, GitError> {
    let mut out = FileCounts::default();
    let files = match only {
        Some(paths) if paths.is_empty() => Vec::new(),
        Some(paths) => {
            let mut opts = DiffOptions::new();
            opts.disable_pathspec_match(true);
            for p in paths {
                opts.pathspec(OsStr::from_bytes(p));
            }
            files_of(&tree_diff_with(store, before, after, opts)?)
        }
        None => changed_files(store, before, after)?,
    };
    for file in &files {
        match file.status.as_str() {
            "added" => out.added += 1,
            "deleted" => out.deleted += 1,
            _ => out.modified += 1,
        }
    }
    // The whole-tree diff gives the same files (every test checks it).
    debug_assert!(
        only.is_none() || changed_files(store, before, after).is_ok_and(|all| all == files),
        "a tracked point's changes differ from the whole diff's"
    );
    Ok(out)
}

fn tree_diff<'r>(
    store: &'r Repository,
    before: Option<Oid>,
    after: Oid,
) -> Result<git2::Diff<'r>, GitError> {
    tree_diff_with(store, before, after, DiffOptions::new())
}

fn tree_diff_with<'r>(
    store: &'r Repository,
    before: Option<Oid>,
    after: Oid,
    mut opts: DiffOptions,
) -> Result<git2::Diff<'r>, GitError> {
    let old = before
        .map(|t| store.find_tree(t))
        .transpose()
        .map_err(local)?;
    let new = store.find_tree(after).map_err(local)?;
    opts.show_binary(true).id_abbrev(40);
    store
        .diff_tree_to_tree(old.as_ref(), Some(&new), Some(&mut opts))
        .map_err(local)
}

fn changed_files(
    store: &Repository,
    before: Option<Oid>,
    after: Oid,
) -> Result<Vec<ChangedFile>, GitError> {
    Ok(files_of(&tree_diff(store, before, after)?))
}

fn files_of(diff: &git2::Diff<'_>) -> Vec<ChangedFile> {
    diff.deltas()
        .map(|d| {
            let file = if d.status() == Delta::Deleted {
                d.old_file()
            } else {
                d.new_file()
            };
            ChangedFile {
                path: String::from_utf8_lossy(file.path_bytes().unwrap_or_default()).into_owned(),
                status: match d.status() {
                    Delta::Added => "added",
                    Delta::Deleted => "deleted",
                    Delta::Typechange => "typechange",
                    _ => "modified",
                }
                .to_string(),
            }
        })
        .collect()
}

/// The diff between two points of one store.
pub(crate) fn diff(
    paths: &HistoryPaths<'_>,
    from: &str,
    to: &str,
    max_bytes: usize,
) -> Result<TreeDiff, GitError> {
    let store = open_reading(paths)?;
    let (a, b) = (point_tree(&store, from)?, point_tree(&store, to)?);
    let files = changed_files(&store, Some(a), b)?;
    let mut patch = Vec::new();
    let mut truncated = false;
    tree_diff(&store, Some(a), b)?
        .print(DiffFormat::Patch, |_, _, line| {
            let extra = usize::from(matches!(line.origin(), '+' | '-' | ' '));
            if patch.len() + extra + line.content().len() > max_bytes {
                truncated = true;
                return false;
            }
            if extra == 1 {
                patch.push(line.origin() as u8);
            }
            patch.extend_from_slice(line.content());
            true
        })
        .or_else(|e| if truncated { Ok(()) } else { Err(local(e)) })?;
    Ok(TreeDiff {
        files,
        patch: String::from_utf8_lossy(&patch).into_owned(),
        truncated,
    })
}

/// A file's bytes at a point (`None`: no file there; a symlink gives its target).
pub(crate) fn file_at(
    paths: &HistoryPaths<'_>,
    point: &str,
    path: &str,
) -> Result<Option<Vec<u8>>, GitError> {
    let store = open_reading(paths)?;
    let tree = point_commit(&store, point)?.tree().map_err(local)?;
    let Ok(entry) = tree.get_path(Path::new(path)) else {
        return Ok(None);
    };
    if entry.kind() != Some(ObjectType::Blob) {
        return Ok(None);
    }
    let blob = store.find_blob(entry.id()).map_err(local)?;
    Ok(Some(blob.content().to_vec()))
}

/// Gives `to` every point of the store `from`: a new store by a partial sibling
/// renamed into place, or, when `to` exists (a fork's own, made with its checkout), its
/// objects and point refs added to it (what `to` has is kept, its private index too, so
/// its next point hashes only what changed since its checkout). Objects are never
/// rewritten once written (a new version is a new file renamed into place), so they
/// are hard links to the source's where the filesystem allows: a fork of a long
/// history costs a link per object file, and outlives its source's store.
pub(crate) fn copy_store(from: &Path, to: &Path) -> Result<(), GitError> {
    use crate::fsutil::{partial_sibling, PartialDir};
    let io = |e: std::io::Error| map_io("cannot copy the history store", &e);
    if std::fs::symlink_metadata(to).is_ok() {
        merge_dir(&from.join("objects"), &to.join("objects"), Share::Link).map_err(io)?;
        merge_dir(&from.join("refs"), &to.join("refs"), Share::Copy).map_err(io)?;
        merge_packed_refs(from, to).map_err(io)?;
        return Ok(());
    }
    if let Some(parent) = to.parent() {
        private_dir(parent)?;
    }
    let partial = PartialDir::new(partial_sibling(to).map_err(io)?);
    merge_dir(from, partial.path(), Share::Copy).map_err(io)?;
    partial.commit_to(to).map_err(io)
}

/// How [`merge_dir`] puts a file in place.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Share {
    /// A copy (files a store rewrites: its index, config, refs).
    Copy,
    /// A hard link, or a copy where linking fails (another filesystem).
    Link,
}

/// Copies a directory grove wrote (a store: plain files and directories only) into
/// `to`, creating what is missing and keeping files `to` already has; a store's
/// `objects` directory is always shared by links.
fn merge_dir(from: &Path, to: &Path, share: Share) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(to) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            let share = if entry.file_name() == "objects" {
                Share::Link
            } else {
                share
            };
            merge_dir(&entry.path(), &target, share)?;
        } else if kind.is_file() && std::fs::symlink_metadata(&target).is_err() {
            let linked = share == Share::Link && std::fs::hard_link(entry.path(), &target).is_ok();
            if !linked {
                std::fs::copy(entry.path(), &target)?;
            }
        }
    }
    Ok(())
}

/// Drops every point ref not in `keep` and, when any were, compacts the store (the
/// objects only they held deleted, the rest packed; a failure there is logged, the
/// refs stay dropped); returns how many were dropped.
pub(crate) fn prune(paths: &HistoryPaths<'_>, keep: &[String]) -> Result<usize, GitError> {
    let dropped = drop_points(paths.store_dir, keep)?;
    if dropped > 0 {
        match repack::compact(paths.store_dir, paths.cache_dir) {
            Ok(true) => {}
            Ok(false) => tracing::info!("no git binary: a pruned history store is not repacked"),
            Err(e) => tracing::warn!(error = %e, "a pruned history store was not repacked"),
        }
    }
    Ok(dropped)
}

fn drop_points(store_dir: &Path, keep: &[String]) -> Result<usize, GitError> {
    let store = open_existing(store_dir)?;
    let mut dropped = 0;
    let names: Vec<String> = store
        .references_glob(&format!("{POINTS}*"))
        .map_err(local)?
        .filter_map(|r| r.ok().and_then(|r| r.name().ok().map(str::to_string)))
        .collect();
    for name in names {
        let id = name.trim_start_matches(POINTS);
        if keep.iter().any(|k| k == id) {
            continue;
        }
        store
            .find_reference(&name)
            .and_then(|mut r| r.delete())
            .map_err(local)?;
        dropped += 1;
    }
    Ok(dropped)
}
