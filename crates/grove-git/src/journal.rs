//! The journal that makes a merge-back's switch all-or-nothing across a crash.
//!
//! Before a merge-back writes anything into the target's working tree, every object of
//! the result is already in the target's object store, and a journal naming the branch,
//! the old and new heads and their trees is written (temp file, fsync, rename) to a path
//! grove owns (`$GROVE_HOME/journals/<workspace id>.json`, never inside the workspace,
//! which the agent controls). Then the files and index are switched, then the branch is
//! moved with a compare-and-swap — the commit point — and the journal is removed.
//!
//! [`recover`] finishes an interrupted switch: when the branch already points at the
//! new head, every path the change touches is rolled forward to the new tree;
//! otherwise back to the old one. The index entries of those paths follow the files.
//! Both directions read only the object store, so recovery is idempotent: a crash
//! during recovery is recovered by the next run.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use git2::{ObjectType, Oid, Repository, Tree};
use grove_core::error::GitError;
use grove_core::ports::JournalRecovery;
use serde::{Deserialize, Serialize};

use crate::errors::{map_git2, map_io, Phase};

/// One switch in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    pub version: u32,
    pub operation: String,
    /// The full name of the branch that moves (`refs/heads/...`).
    pub branch: String,
    pub old_head: String,
    pub new_head: String,
}

fn local(e: git2::Error) -> GitError {
    map_git2(&e, Phase::Local, None)
}

/// Writes the journal durably (temp file, fsync, rename, fsync of the directory).
pub(crate) fn begin(path: &Path, journal: &Journal) -> Result<(), GitError> {
    let io = |e: std::io::Error| map_io("cannot write the merge-back journal", &e);
    let dir = path
        .parent()
        .ok_or_else(|| GitError::Other("the journal path has no directory".into()))?;
    crate::saved::private_dir(dir)?;
    let tmp = path.with_extension("tmp");
    let bytes = serde_json::to_vec(journal)
        .map_err(|e| GitError::Other(format!("cannot encode the journal: {e}")))?;
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(&bytes)
        .and_then(|()| f.sync_all())
        .map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)
}

/// Removes the journal once the switch is complete.
pub(crate) fn finish(path: &Path) -> Result<(), GitError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(map_io("cannot remove the merge-back journal", &e))
        }
        _ => Ok(()),
    }
}

fn read(path: &Path) -> Result<Option<Journal>, GitError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| GitError::Other(format!("the merge-back journal is unreadable: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(map_io("cannot read the merge-back journal", &e)),
    }
}

/// Finishes or undoes the switch a journal at `path` describes (`None`: no journal).
pub(crate) fn recover(
    path: &Path,
    workspace_dir: &Path,
) -> Result<Option<JournalRecovery>, GitError> {
    let Some(j) = read(path)? else {
        return Ok(None);
    };
    let repo = crate::trusted::open_workspace(workspace_dir)?;
    let parse = |s: &str| Oid::from_str(s).map_err(local);
    let (old_head, new_head) = (parse(&j.old_head)?, parse(&j.new_head)?);
    let at = repo.find_reference(&j.branch).ok().and_then(|r| r.target());
    let forward = match at {
        Some(id) if id == new_head => true,
        Some(id) if id == old_head => false,
        _ => {
            return Err(GitError::Other(format!(
                "an interrupted merge-back cannot be recovered: {} is neither at its old nor its new head",
                j.branch
            )))
        }
    };
    let tree_of = |id: Oid| repo.find_commit(id).and_then(|c| c.tree()).map_err(local);
    let (old_tree, new_tree) = (tree_of(old_head)?, tree_of(new_head)?);
    let target = if forward { &new_tree } else { &old_tree };
    let paths = changed_paths(&repo, &old_tree, &new_tree)?;
    for rel in &paths {
        put_path(&repo, workspace_dir, rel, target)?;
    }
    // Removals first, so a path that changes between file and directory never
    // collides with its old self in the index.
    let mut index = repo.index().map_err(local)?;
    let is_file = |rel: &Path| {
        target
            .get_path(rel)
            .is_ok_and(|e| e.kind() == Some(ObjectType::Blob))
    };
    for rel in paths.iter().filter(|p| !is_file(p)) {
        let _ = index.remove_path(rel);
    }
    for rel in paths.iter().filter(|p| is_file(p)) {
        index.add_path(rel).map_err(local)?;
    }
    index.write().map_err(local)?;
    finish(path)?;
    let head = if forward { new_head } else { old_head };
    tracing::warn!(workspace = %workspace_dir.display(), forward, %head, "interrupted merge-back recovered from its journal");
    Ok(Some(JournalRecovery {
        rolled_forward: forward,
        previous_head: j.old_head,
        new_head: j.new_head,
        head: head.to_string(),
    }))
}

fn changed_paths(
    repo: &Repository,
    old: &Tree<'_>,
    new: &Tree<'_>,
) -> Result<Vec<PathBuf>, GitError> {
    let diff = repo
        .diff_tree_to_tree(Some(old), Some(new), None)
        .map_err(local)?;
    let mut out: Vec<PathBuf> = diff
        .deltas()
        .flat_map(|d| [d.old_file().path(), d.new_file().path()])
        .flatten()
        .map(Path::to_path_buf)
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// Makes `rel` under `root` what `target` says: its blob or symlink, or nothing.
fn put_path(repo: &Repository, root: &Path, rel: &Path, target: &Tree<'_>) -> Result<(), GitError> {
    let io = |e: std::io::Error| map_io("cannot switch a file of the workspace", &e);
    let full = root.join(rel);
    let entry = target.get_path(rel).ok();
    let entry = entry.filter(|e| e.kind() == Some(ObjectType::Blob));
    let Some(entry) = entry else {
        // Absent in the target (or a directory there, filled by its own paths).
        if let Ok(m) = std::fs::symlink_metadata(&full) {
            if !m.is_dir() {
                std::fs::remove_file(&full).map_err(io)?;
            }
        }
        remove_empty_parents(root, rel);
        return Ok(());
    };
    real_parents(root, rel).map_err(io)?;
    if std::fs::symlink_metadata(&full).is_ok_and(|m| m.is_dir()) {
        crate::tree::remove_tree(&full).map_err(io)?;
    }
    let blob = repo.find_blob(entry.id()).map_err(local)?;
    let tmp = full.with_file_name(format!(
        ".{}.grove-journal",
        full.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    ));
    let _ = std::fs::remove_file(&tmp);
    if entry.filemode() == 0o120000 {
        use std::os::unix::ffi::OsStrExt;
        std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(blob.content()), &tmp)
            .map_err(io)?;
    } else {
        std::fs::write(&tmp, blob.content()).map_err(io)?;
        let mode = if entry.filemode() == 0o100755 {
            0o755
        } else {
            0o644
        };
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).map_err(io)?;
    }
    std::fs::rename(&tmp, &full).map_err(io)
}

/// Every parent of `rel` is made a real directory: a symlink or file standing there
/// (left by the other side of the switch, or planted) is removed, never followed.
fn real_parents(root: &Path, rel: &Path) -> std::io::Result<()> {
    let mut at = root.to_path_buf();
    let Some(parent) = rel.parent() else {
        return Ok(());
    };
    for part in parent.components() {
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                std::fs::remove_file(&at)?;
                std::fs::create_dir(&at)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir(&at)?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn remove_empty_parents(root: &Path, rel: &Path) {
    let mut p = rel.parent();
    while let Some(dir) = p.filter(|d| !d.as_os_str().is_empty()) {
        if std::fs::remove_dir(root.join(dir)).is_err() {
            break;
        }
        p = dir.parent();
    }
}
