//! A workspace's whole state saved into its owner's private store before eviction.
//!
//! The store is a bare repository at `$GROVE_HOME/saved/<user>/<workspace id>/` (mode
//! 0700, never mounted into a sandbox) that reads the repo cache's objects through an
//! alternate added in memory only, so it holds just what the workspace added: its local
//! commits, tags and stash, and two snapshot trees — the index (staged) and the working
//! tree (staged, unstaged, untracked and, up to a byte budget, ignored files; modes and
//! symlinks as git records them). Its refs are the workspace's refs under their own
//! names, plus [`WORK_REF`] and [`INDEX_REF`]; `manifest.json` records HEAD (branch or
//! detached), every ref, the stash's reflog entries and what was left out and why.
//!
//! Nothing is written into the workspace: it is opened with an in-memory object backend
//! of the highest priority, so the blobs and trees of the snapshots never reach its
//! `.git/objects`. The store is built in a partial sibling and renamed into place, so a
//! crash leaves either the previous store or the new one, never half of one.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use git2::{
    DiffFormat, DiffOptions, ErrorCode, IndexAddOption, ObjectType, Odb, Oid, Repository,
    Signature, StatusOptions,
};
use grove_core::error::GitError;
use grove_core::model::{SavedWork, SAVED_STORE_REF};
use grove_core::ports::{SaveWorkReport, SaveWorkRequest};
use serde::{Deserialize, Serialize};

use crate::errors::{map_git2, map_io, Phase};
use crate::fsutil::{partial_sibling, remove_path, remove_stale_partials, PartialDir};

/// The store's ref naming the working-tree snapshot (a commit whose parent is HEAD).
pub const WORK_REF: &str = SAVED_STORE_REF;
/// The store's ref naming the index snapshot (a commit whose parent is HEAD).
pub const INDEX_REF: &str = "refs/grove/index";
/// The manifest file inside the store.
pub const MANIFEST: &str = "manifest.json";
/// The patch of the uncommitted changes inside the store.
pub const PATCH: &str = "work.patch";
/// At most this many omissions are named in a report (all are in the manifest).
const MAX_NAMED_OMISSIONS: usize = 50;

const SAVER_NAME: &str = "grove";
const SAVER_EMAIL: &str = "grove@grove.invalid";

/// HEAD as the workspace had it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HeadState {
    /// On a branch (`refs/heads/...`).
    Branch { name: String, commit: String },
    /// Detached at a commit.
    Detached { commit: String },
}

/// One ref of the workspace: direct (`target`) or symbolic (`symbolic`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptRef {
    pub name: String,
    pub target: Option<String>,
    pub symbolic: Option<String>,
}

/// One entry of `refs/stash`'s reflog (the stash list), oldest first in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StashEntry {
    pub commit: String,
    pub message: String,
    pub name: String,
    pub email: String,
    pub time: i64,
    pub offset_minutes: i32,
}

/// Something deliberately not kept, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Omission {
    pub what: String,
    pub why: String,
}

/// Everything a restore needs besides the objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub head: HeadState,
    /// Commit (in the store or the cache) whose tree is the index.
    pub index_commit: String,
    /// Commit whose tree is the working tree.
    pub work_commit: String,
    pub refs: Vec<KeptRef>,
    pub stash: Vec<StashEntry>,
    pub omitted: Vec<Omission>,
}

impl HeadState {
    pub fn commit(&self) -> &str {
        match self {
            HeadState::Branch { commit, .. } | HeadState::Detached { commit } => commit,
        }
    }
}

fn local(e: git2::Error) -> GitError {
    map_git2(&e, Phase::Local, None)
}

/// Creates `dir` and its missing parents with mode 0700, and makes `dir` itself 0700.
pub(crate) fn private_dir(dir: &Path) -> Result<(), GitError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| map_io("cannot create the saved-work directory", &e))
}

/// Opens a store (bare) with the cache's objects readable through an in-memory
/// alternate; nothing about the cache is written into the store.
pub(crate) fn open_store(store: &Path, cache_dir: &Path) -> Result<Repository, GitError> {
    // The store is grove's own (private, never mounted), opened with grove's config.
    let repo = crate::trusted::open_cache(store).map_err(local)?;
    add_alternate(&repo, cache_dir)?;
    Ok(repo)
}

pub(crate) fn add_alternate(repo: &Repository, cache_dir: &Path) -> Result<(), GitError> {
    let objects = cache_dir.join("objects");
    if objects.is_dir() {
        let odb = repo.odb().map_err(local)?;
        odb.add_disk_alternate(&objects.to_string_lossy())
            .map_err(local)?;
    }
    Ok(())
}

/// Copies `id` and every object it reaches into `dst`, children before parents,
/// stopping at objects `dst` already has (a present object always has its closure).
pub(crate) fn copy_closure(src: &Repository, dst: &Odb<'_>, id: Oid) -> Result<(), GitError> {
    let src_odb = src.odb().map_err(local)?;
    let mut done: HashSet<Oid> = HashSet::new();
    let mut stack: Vec<(Oid, bool)> = vec![(id, false)];
    while let Some((id, expanded)) = stack.pop() {
        if done.contains(&id) || (!expanded && dst.exists(id)) {
            continue;
        }
        if expanded {
            let obj = src_odb.read(id).map_err(local)?;
            let written = dst.write(obj.kind(), obj.data()).map_err(local)?;
            if written != id {
                return Err(GitError::Other(format!(
                    "copying object {id} wrote {written}"
                )));
            }
            done.insert(id);
            continue;
        }
        stack.push((id, true));
        let (_, kind) = src_odb.read_header(id).map_err(local)?;
        let children: Vec<Oid> = match kind {
            ObjectType::Commit => {
                let c = src.find_commit(id).map_err(local)?;
                std::iter::once(c.tree_id()).chain(c.parent_ids()).collect()
            }
            ObjectType::Tree => {
                let t = src.find_tree(id).map_err(local)?;
                t.iter()
                    // Gitlinks name commits of another repository.
                    .filter(|e| e.kind() != Some(ObjectType::Commit))
                    .map(|e| e.id())
                    .collect()
            }
            ObjectType::Tag => vec![src.find_tag(id).map_err(local)?.target_id()],
            _ => Vec::new(),
        };
        for child in children {
            if !done.contains(&child) && !dst.exists(child) {
                stack.push((child, false));
            }
        }
    }
    Ok(())
}

/// The store directory's whole life for one save: built aside, then swapped in.
pub(crate) fn save_work(req: &SaveWorkRequest<'_>) -> Result<SaveWorkReport, GitError> {
    // `open`, not `discover`: a missing checkout must not save an enclosing repo.
    let ws = crate::trusted::open_workspace(req.workspace_dir)?;
    // Its walk reads the workspace's rule files: none may block it.
    let checked = crate::rules::check_workspace(&ws, req.workspace_dir)?;
    // Every blob and tree the snapshots write stays in memory, not in the workspace.
    let odb = ws.odb().map_err(local)?;
    odb.add_new_mempack_backend(1000).map_err(local)?;
    let snap = snapshot(&ws, req.ignored_budget_bytes)?;
    checked.verify()?;

    let head_id = Oid::from_str(snap.head.commit()).map_err(local)?;
    let at_base = Oid::from_str(req.base_commit).ok() == Some(head_id);
    let trivial = !snap.dirty
        && at_base
        && snap.stash.is_empty()
        && snap.ignored_kept == 0
        && snap.refs.iter().all(|r| {
            r.name.starts_with("refs/remotes/")
                || matches!(&snap.head, HeadState::Branch { name, .. } if *name == r.name)
        });
    let parent = req.store_dir.parent().map(Path::to_path_buf);
    if trivial {
        remove_path(req.store_dir).map_err(|e| map_io("cannot remove a stale store", &e))?;
        return Ok(SaveWorkReport {
            dirty: false,
            head_commit: head_id.to_string(),
            saved: None,
            omitted: named(&snap.omitted),
        });
    }
    private_dir(&parent.unwrap_or_else(|| PathBuf::from(".")))?;
    remove_stale_partials(req.store_dir)
        .map_err(|e| map_io("cannot remove a stale partial store", &e))?;
    let partial = PartialDir::new(
        partial_sibling(req.store_dir).map_err(|e| map_io("cannot name a partial store", &e))?,
    );
    let manifest = write_store(&ws, partial.path(), req, &snap)?;
    install(partial, req.store_dir)?;
    tracing::info!(
        workspace = %req.workspace_dir.display(),
        dirty = snap.dirty,
        refs = manifest.refs.len(),
        stash = manifest.stash.len(),
        "workspace work saved in its private store"
    );
    let patch_path = snap
        .dirty
        .then(|| req.store_dir.join(PATCH).to_string_lossy().into_owned());
    Ok(SaveWorkReport {
        dirty: snap.dirty,
        head_commit: head_id.to_string(),
        saved: Some(SavedWork {
            ref_name: WORK_REF.to_string(),
            commit: manifest.work_commit.clone(),
            head_commit: head_id.to_string(),
            patch_path,
        }),
        omitted: named(&manifest.omitted),
    })
}

/// The omissions as one line each, at most [`MAX_NAMED_OMISSIONS`] plus a count.
fn named(omitted: &[Omission]) -> Vec<String> {
    let mut out: Vec<String> = omitted
        .iter()
        .take(MAX_NAMED_OMISSIONS)
        .map(|o| format!("{}: {}", o.what, o.why))
        .collect();
    if omitted.len() > MAX_NAMED_OMISSIONS {
        out.push(format!(
            "and {} more (listed in the store's manifest)",
            omitted.len() - MAX_NAMED_OMISSIONS
        ));
    }
    out
}

/// What was read from the workspace (trees written into its in-memory backend).
struct Snapshot {
    head: HeadState,
    index_tree: Oid,
    work_tree: Oid,
    dirty: bool,
    refs: Vec<KeptRef>,
    stash: Vec<StashEntry>,
    ignored_kept: usize,
    omitted: Vec<Omission>,
}

fn snapshot(ws: &Repository, budget: u64) -> Result<Snapshot, GitError> {
    let mut omitted = Vec::new();
    let head = head_state(ws)?;
    let head_commit = ws
        .find_commit(Oid::from_str(head.commit()).map_err(local)?)
        .map_err(local)?;
    let head_tree = head_commit.tree_id();
    let mut index = ws.index().map_err(local)?;
    let index_tree = if index.has_conflicts() {
        omitted.push(Omission {
            what: "the index".into(),
            why: "it held unresolved merge conflicts; HEAD's tree is kept as the staged state"
                .into(),
        });
        head_tree
    } else {
        index.write_tree().map_err(local)?
    };
    // The working tree: tracked, modified and untracked files, then ignored ones.
    index
        .add_all(["*"], IndexAddOption::DEFAULT, None)
        .map_err(local)?;
    index.update_all(["*"], None).map_err(local)?;
    let ignored = ignored_files(ws)?;
    let mut used = 0u64;
    let mut ignored_kept = 0;
    for (path, size) in ignored {
        let shown = String::from_utf8_lossy(path.as_os_str().as_bytes()).into_owned();
        if used.saturating_add(size) > budget {
            omitted.push(Omission {
                what: format!("ignored file {shown} ({size} bytes)"),
                why: format!("over the ignored-file budget of {budget} bytes"),
            });
            continue;
        }
        match index.add_path(&path) {
            Ok(()) => {
                used += size;
                ignored_kept += 1;
            }
            Err(e) => omitted.push(Omission {
                what: format!("ignored file {shown}"),
                why: format!("it could not be read: {}", e.message()),
            }),
        }
    }
    let work_tree = index.write_tree().map_err(local)?;
    // Dropped without `write`: the workspace's index file is untouched.
    drop(index);
    let unignored_dirty = index_tree != head_tree || work_differs(ws, head_tree, work_tree)?;
    let (refs, more) = all_refs(ws)?;
    omitted.extend(more);
    omitted.push(Omission {
        what:
            "reflogs other than the stash's, empty directories, the repository's config and hooks"
                .into(),
        why: "not part of the work: the restored checkout gets grove's own config".into(),
    });
    Ok(Snapshot {
        stash: stash_entries(ws)?,
        head,
        index_tree,
        work_tree,
        dirty: unignored_dirty,
        refs,
        ignored_kept,
        omitted,
    })
}

/// Whether the working tree differs from HEAD outside ignored files.
fn work_differs(ws: &Repository, head_tree: Oid, work_tree: Oid) -> Result<bool, GitError> {
    if head_tree == work_tree {
        return Ok(false);
    }
    let mut opts = StatusOptions::new();
    opts.include_untracked(true)
        .include_ignored(false)
        .exclude_submodules(true);
    Ok(!ws.statuses(Some(&mut opts)).map_err(local)?.is_empty())
}

fn head_state(ws: &Repository) -> Result<HeadState, GitError> {
    let head = ws
        .find_reference("HEAD")
        .map_err(|e| GitError::Other(format!("workspace HEAD: {}", e.message())))?;
    let commit = ws
        .head()
        .and_then(|h| h.peel_to_commit())
        .map_err(|e| GitError::Other(format!("workspace HEAD: {}", e.message())))?
        .id()
        .to_string();
    Ok(match head.symbolic_target().map_err(local)? {
        Some(name) => HeadState::Branch {
            name: name.to_string(),
            commit,
        },
        None => HeadState::Detached { commit },
    })
}

/// Ignored files (not directories) with their apparent sizes, in path order.
fn ignored_files(ws: &Repository) -> Result<Vec<(PathBuf, u64)>, GitError> {
    let Some(root) = ws.workdir().map(Path::to_path_buf) else {
        return Ok(Vec::new());
    };
    let mut opts = StatusOptions::new();
    opts.include_ignored(true)
        .recurse_ignored_dirs(true)
        .include_untracked(false)
        .exclude_submodules(true);
    let statuses = ws.statuses(Some(&mut opts)).map_err(local)?;
    let mut out = Vec::new();
    for entry in statuses.iter() {
        if !entry.status().is_ignored() {
            continue;
        }
        let rel = PathBuf::from(OsStr::from_bytes(entry.path_bytes()));
        match std::fs::symlink_metadata(root.join(&rel)) {
            Ok(m) if m.is_file() || m.file_type().is_symlink() => out.push((rel, m.len())),
            _ => {}
        }
    }
    out.sort();
    Ok(out)
}

/// Every ref but HEAD: direct ones with their target, symbolic ones by name.
fn all_refs(ws: &Repository) -> Result<(Vec<KeptRef>, Vec<Omission>), GitError> {
    let mut refs = Vec::new();
    let mut omitted = Vec::new();
    for r in ws.references().map_err(local)? {
        let r = r.map_err(local)?;
        let Ok(name) = r.name().map(str::to_string) else {
            omitted.push(Omission {
                what: "a ref whose name is not UTF-8".into(),
                why: "grove keeps refs by name".into(),
            });
            continue;
        };
        if !name.starts_with("refs/") || name.starts_with("refs/grove/") {
            continue;
        }
        refs.push(KeptRef {
            target: r.target().map(|t| t.to_string()),
            symbolic: r.symbolic_target().ok().flatten().map(str::to_string),
            name,
        });
    }
    refs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((refs, omitted))
}

/// The stash list, oldest first.
fn stash_entries(ws: &Repository) -> Result<Vec<StashEntry>, GitError> {
    let log = match ws.reflog("refs/stash") {
        Ok(log) => log,
        Err(e) if e.code() == ErrorCode::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(local(e)),
    };
    let mut out: Vec<StashEntry> = log
        .iter()
        .map(|e| {
            let who = e.committer();
            StashEntry {
                commit: e.id_new().to_string(),
                message: e.message().ok().flatten().unwrap_or_default().to_string(),
                name: who.name().unwrap_or("grove").to_string(),
                email: who.email().unwrap_or("grove@grove.invalid").to_string(),
                time: who.when().seconds(),
                offset_minutes: who.when().offset_minutes(),
            }
        })
        .collect();
    out.reverse();
    Ok(out)
}

/// Fills the (partial) store: objects, snapshot commits, refs, patch, manifest.
fn write_store(
    ws: &Repository,
    dir: &Path,
    req: &SaveWorkRequest<'_>,
    snap: &Snapshot,
) -> Result<Manifest, GitError> {
    private_dir(dir)?;
    Repository::init_bare(dir).map_err(local)?;
    let store = open_store(dir, req.cache_dir)?;
    let dst = store.odb().map_err(local)?;
    let head = Oid::from_str(snap.head.commit()).map_err(local)?;
    let mut roots = vec![head, snap.index_tree, snap.work_tree];
    roots.extend(
        snap.refs
            .iter()
            .filter_map(|r| r.target.as_deref())
            .filter_map(|t| Oid::from_str(t).ok()),
    );
    roots.extend(
        snap.stash
            .iter()
            .filter_map(|s| Oid::from_str(&s.commit).ok()),
    );
    for id in roots {
        copy_closure(ws, &dst, id)?;
    }
    let sig = Signature::now(SAVER_NAME, SAVER_EMAIL).map_err(local)?;
    let head_commit = store.find_commit(head).map_err(local)?;
    let commit_of = |tree: Oid, what: &str| -> Result<Oid, GitError> {
        if tree == head_commit.tree_id() {
            return Ok(head);
        }
        let tree = store.find_tree(tree).map_err(local)?;
        let msg = format!("{}\n\n{what}", req.message);
        store
            .commit(None, &sig, &sig, &msg, &tree, &[&head_commit])
            .map_err(local)
    };
    let index_commit = commit_of(snap.index_tree, "the index (staged changes)")?;
    let work_commit = commit_of(snap.work_tree, "the working tree")?;
    for r in &snap.refs {
        if let Some(t) = r.target.as_deref().and_then(|t| Oid::from_str(t).ok()) {
            store
                .reference(&r.name, t, true, "grove: saved")
                .map_err(local)?;
        }
    }
    store
        .reference(INDEX_REF, index_commit, true, "grove: saved")
        .map_err(local)?;
    store
        .reference(WORK_REF, work_commit, true, "grove: saved")
        .map_err(local)?;
    if snap.dirty {
        let old = head_commit.tree().map_err(local)?;
        let new = store.find_tree(snap.work_tree).map_err(local)?;
        write_file(&dir.join(PATCH), &diff_patch(&store, &old, &new)?)?;
    }
    let manifest = Manifest {
        version: 1,
        head: snap.head.clone(),
        index_commit: index_commit.to_string(),
        work_commit: work_commit.to_string(),
        refs: snap.refs.clone(),
        stash: snap.stash.clone(),
        omitted: snap.omitted.clone(),
    };
    write_manifest(dir, &manifest)?;
    Ok(manifest)
}

pub(crate) fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), GitError> {
    let json = serde_json::to_vec_pretty(manifest)
        .map_err(|e| GitError::Other(format!("cannot encode the manifest: {e}")))?;
    write_file(&dir.join(MANIFEST), &json)
}

/// Reads a store's manifest (`None`: no store there).
pub(crate) fn read_manifest(store: &Path) -> Result<Option<Manifest>, GitError> {
    match std::fs::read(store.join(MANIFEST)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| GitError::Other(format!("the saved-work manifest is unreadable: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(map_io("cannot read the saved-work manifest", &e)),
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), GitError> {
    std::fs::write(path, bytes)
        .and_then(|()| std::fs::File::open(path)?.sync_all())
        .map_err(|e| map_io("cannot write into the saved-work store", &e))
}

/// Puts a finished partial store at `store`, replacing an older one.
pub(crate) fn install(partial: PartialDir, store: &Path) -> Result<(), GitError> {
    let io = |e: std::io::Error| map_io("cannot move the saved-work store into place", &e);
    if std::fs::symlink_metadata(store).is_ok() {
        // The old store goes to a partial name first: a crash here leaves it for the
        // next attempt's stale-partial sweep, and the workspace (still in place) is the
        // truth until the eviction is recorded.
        let old = partial_sibling(store).map_err(io)?;
        std::fs::rename(store, &old).map_err(io)?;
        partial.commit_to(store).map_err(io)?;
        remove_path(&old).map_err(io)?;
    } else {
        partial.commit_to(store).map_err(io)?;
    }
    Ok(())
}

/// `git diff --binary --full-index` from `old` to `new`, as bytes.
pub(crate) fn diff_patch(
    repo: &Repository,
    old: &git2::Tree<'_>,
    new: &git2::Tree<'_>,
) -> Result<Vec<u8>, GitError> {
    let mut opts = DiffOptions::new();
    opts.show_binary(true).id_abbrev(40);
    let diff = repo
        .diff_tree_to_tree(Some(old), Some(new), Some(&mut opts))
        .map_err(local)?;
    let mut out = Vec::new();
    diff.print(DiffFormat::Patch, |_delta, _hunk, line| {
        if matches!(line.origin(), '+' | '-' | ' ') {
            out.push(line.origin() as u8);
        }
        out.extend_from_slice(line.content());
        true
    })
    .map_err(local)?;
    Ok(out)
}

/// Deletes a workspace's store (absent is Ok).
pub(crate) fn discard_store(store: &Path) -> Result<(), GitError> {
    remove_path(store).map_err(|e| map_io("cannot remove a saved-work store", &e))
}

/// Moves work an older version saved in the repo cache (`saved.ref_name` there) into a
/// private store: HEAD on `branch` (or detached) at `saved.head_commit`, the working
/// tree of `saved.commit`, the index at HEAD (that version did not keep the staged
/// state). The cache's ref is left for the caller to drop once this is recorded.
pub(crate) fn move_out_of_cache(
    cache_dir: &Path,
    saved: &SavedWork,
    branch: Option<&str>,
    store_dir: &Path,
) -> Result<SavedWork, GitError> {
    let cache = crate::preserve::open_cache(cache_dir)?;
    let head = Oid::from_str(&saved.head_commit).map_err(local)?;
    let work = Oid::from_str(&saved.commit).map_err(local)?;
    for id in [head, work] {
        cache
            .find_commit(id)
            .map_err(|_| GitError::RefNotFound(id.to_string()))?;
    }
    if let Some(parent) = store_dir.parent() {
        private_dir(parent)?;
    }
    remove_stale_partials(store_dir)
        .map_err(|e| map_io("cannot remove a stale partial store", &e))?;
    let partial = PartialDir::new(
        partial_sibling(store_dir).map_err(|e| map_io("cannot name a partial store", &e))?,
    );
    let dir = partial.path();
    private_dir(dir)?;
    Repository::init_bare(dir).map_err(local)?;
    let store = open_store(dir, cache_dir)?;
    let head_state = match branch {
        Some(b) => HeadState::Branch {
            name: format!("refs/heads/{b}"),
            commit: head.to_string(),
        },
        None => HeadState::Detached {
            commit: head.to_string(),
        },
    };
    let mut refs = Vec::new();
    if let HeadState::Branch { name, .. } = &head_state {
        store
            .reference(name, head, true, "grove: moved")
            .map_err(local)?;
        refs.push(KeptRef {
            name: name.clone(),
            target: Some(head.to_string()),
            symbolic: None,
        });
    }
    store
        .reference(INDEX_REF, head, true, "grove: moved")
        .map_err(local)?;
    store
        .reference(WORK_REF, work, true, "grove: moved")
        .map_err(local)?;
    let patch_path = if let (true, Some(p)) = (saved.has_changes(), saved.patch_path.as_deref()) {
        match std::fs::read(p) {
            Ok(bytes) => {
                write_file(&dir.join(PATCH), &bytes)?;
                Some(store_dir.join(PATCH).to_string_lossy().into_owned())
            }
            Err(_) => None,
        }
    } else {
        None
    };
    let manifest = Manifest {
        version: 1,
        head: head_state,
        index_commit: head.to_string(),
        work_commit: work.to_string(),
        refs,
        stash: Vec::new(),
        omitted: vec![Omission {
            what: "the staged state, other refs, the stash and ignored files".into(),
            why: "the work was saved by a version that did not keep them".into(),
        }],
    };
    write_manifest(dir, &manifest)?;
    drop(store);
    install(partial, store_dir)?;
    Ok(SavedWork {
        ref_name: WORK_REF.to_string(),
        commit: work.to_string(),
        head_commit: head.to_string(),
        patch_path,
    })
}
