//! Merge-back: a task workspace's commits brought into an edit workspace's branch,
//! computed in memory, written only when clean.
//!
//! Both workspaces are standalone repositories borrowing the same repo cache's objects
//! (ADR 03); the task's own commits live only in the task's `.git/objects`. The target
//! repository is opened with two in-memory additions that never touch its files: the
//! task's object directory as an alternate (so the task's commits can be read), and a
//! mempack backend of the highest priority (so every tree and commit the merge or the
//! cherry-picks write stays in memory). The merge runs on `merge_commits` /
//! `cherrypick_commit` into in-memory indexes. Only when that is clean, and a dry-run
//! checkout finds nothing in the way (an untracked file the change would overwrite),
//! are the objects the new head needs copied into the target's object store, the
//! working tree and index checked out (safe mode, from the old head), and the branch
//! moved with a compare-and-swap on its old value. A conflict therefore leaves HEAD,
//! the index, the working tree, untracked files and the stash exactly as they were.

use std::path::Path;

use git2::build::CheckoutBuilder;
use git2::{
    Commit, Delta, DiffFindOptions, DiffOptions, ErrorCode, Index, MergeOptions, Oid, Patch,
    Repository, RepositoryState, Signature, Sort, StatusOptions,
};
use grove_core::merge_back::{
    BranchCommit, ChangedFile, MergeBackDiff, MergeBackError, MergeBackReport, MergeStrategy,
    MAX_DIFF_COMMITS, MAX_DIFF_FILES,
};
use grove_core::ports::MergeBackRequest;
use uuid::Uuid;

use crate::errors::{map_git2, Phase};

fn local(e: git2::Error) -> MergeBackError {
    MergeBackError::Git(map_git2(&e, Phase::Local, None))
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The target opened for an in-memory merge, with the two heads.
struct Pair {
    edit: Repository,
    edit_head: Oid,
    task_head: Oid,
}

/// Opens the target with the task's objects readable (in memory only) and checks that
/// its HEAD is on the branch that will move.
fn open_pair(req: &MergeBackRequest<'_>) -> Result<Pair, MergeBackError> {
    let edit = crate::trusted::open_workspace(req.edit_dir).map_err(MergeBackError::Git)?;
    let task = crate::trusted::open_workspace(req.task_dir).map_err(MergeBackError::Git)?;
    let edit_ref = format!("refs/heads/{}", req.edit_branch);
    let head = match edit.head() {
        Ok(h) => h,
        Err(e) if matches!(e.code(), ErrorCode::UnbornBranch | ErrorCode::NotFound) => {
            return Err(MergeBackError::Refused(
                "the target workspace has no commit checked out".into(),
            ))
        }
        Err(e) => return Err(local(e)),
    };
    if head.name_bytes() != edit_ref.as_bytes() {
        return Err(MergeBackError::Refused(format!(
            "the target workspace's HEAD is not on its branch {:?}; check that branch out first",
            req.edit_branch
        )));
    }
    let edit_head = head.peel_to_commit().map_err(local)?.id();
    drop(head);
    let task_head = task
        .find_reference(&format!("refs/heads/{}", req.task_branch))
        .and_then(|r| r.peel_to_commit())
        .map_err(|_| {
            MergeBackError::Refused(format!(
                "the task workspace has no branch {:?}",
                req.task_branch
            ))
        })?
        .id();
    // The task's own objects only: never the alternates file inside its `.git`.
    {
        let odb = edit.odb().map_err(local)?;
        crate::trusted::add_objects(&odb, &task.path().join("objects"), true)
            .map_err(MergeBackError::Git)?;
    }
    Ok(Pair {
        edit,
        edit_head,
        task_head,
    })
}

/// The task commits the target lacks, oldest first (parents before children).
fn lacking(pair: &Pair) -> Result<Vec<Oid>, MergeBackError> {
    let mut walk = pair.edit.revwalk().map_err(local)?;
    walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)
        .map_err(local)?;
    walk.push(pair.task_head).map_err(local)?;
    walk.hide(pair.edit_head).map_err(local)?;
    walk.map(|id| id.map_err(local)).collect()
}

fn branch_commit(c: &Commit<'_>) -> BranchCommit {
    let author = c.author();
    BranchCommit {
        id: c.id().to_string(),
        summary: c.summary_bytes().map(lossy).unwrap_or_default(),
        author_name: lossy(author.name_bytes()),
        author_email: lossy(author.email_bytes()),
        time: author.when().seconds(),
    }
}

fn merge_base(pair: &Pair) -> Result<Option<Oid>, MergeBackError> {
    match pair.edit.merge_base(pair.edit_head, pair.task_head) {
        Ok(id) => Ok(Some(id)),
        Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
        Err(e) => Err(local(e)),
    }
}

/// What a merge-back would bring. Reads only.
pub(crate) fn diff(req: &MergeBackRequest<'_>) -> Result<MergeBackDiff, MergeBackError> {
    let pair = open_pair(req)?;
    let repo = &pair.edit;
    let ids = lacking(&pair)?;
    let base = merge_base(&pair)?;
    let mut commits = Vec::new();
    for id in ids.iter().take(MAX_DIFF_COMMITS) {
        commits.push(branch_commit(&repo.find_commit(*id).map_err(local)?));
    }
    let base_tree = match base {
        Some(b) => Some(repo.find_commit(b).and_then(|c| c.tree()).map_err(local)?),
        None => None,
    };
    let task_tree = repo
        .find_commit(pair.task_head)
        .and_then(|c| c.tree())
        .map_err(local)?;
    let mut opts = DiffOptions::new();
    opts.ignore_submodules(true);
    let mut d = repo
        .diff_tree_to_tree(base_tree.as_ref(), Some(&task_tree), Some(&mut opts))
        .map_err(local)?;
    d.find_similar(Some(DiffFindOptions::new().renames(true)))
        .map_err(local)?;
    let mut files = Vec::new();
    let (mut insertions, mut deletions) = (0u64, 0u64);
    let total = d.deltas().len();
    for idx in 0..total {
        let Some(delta) = d.get_delta(idx) else {
            continue;
        };
        let patch = Patch::from_diff(&d, idx).map_err(local)?;
        let (adds, dels) = match &patch {
            Some(p) => {
                let (_, a, r) = p.line_stats().map_err(local)?;
                (a as u64, r as u64)
            }
            None => (0, 0),
        };
        insertions += adds;
        deletions += dels;
        if files.len() >= MAX_DIFF_FILES {
            continue;
        }
        let new_path = delta.new_file().path_bytes().map(lossy);
        let old_path = delta.old_file().path_bytes().map(lossy);
        let status = match delta.status() {
            Delta::Added => "added",
            Delta::Deleted => "deleted",
            Delta::Renamed => "renamed",
            Delta::Copied => "copied",
            Delta::Typechange => "typechange",
            _ => "modified",
        };
        let path = match delta.status() {
            Delta::Deleted => old_path.clone(),
            _ => new_path.clone(),
        }
        .unwrap_or_default();
        files.push(ChangedFile {
            old_path: matches!(delta.status(), Delta::Renamed | Delta::Copied)
                .then_some(old_path)
                .flatten(),
            path,
            status: status.to_string(),
            insertions: adds,
            deletions: dels,
            binary: delta.flags().is_binary()
                || patch
                    .as_ref()
                    .is_some_and(|p| p.delta().flags().is_binary()),
        });
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let task_dirty = crate::checkout::is_dirty(req.task_dir)?;
    Ok(MergeBackDiff {
        edit_workspace_id: Uuid::nil(),
        task_workspace_id: Uuid::nil(),
        edit_branch: req.edit_branch.to_string(),
        edit_head: pair.edit_head.to_string(),
        task_branch: req.task_branch.to_string(),
        task_head: pair.task_head.to_string(),
        merge_base: base.map(|b| b.to_string()),
        commits_total: ids.len(),
        commits,
        files_total: total,
        files,
        insertions,
        deletions,
        fast_forward: !ids.is_empty() && base == Some(pair.edit_head),
        up_to_date: ids.is_empty(),
        task_dirty,
    })
}

/// Paths of tracked files whose index or working-tree state differs from HEAD.
fn tracked_changes(repo: &Repository) -> Result<Vec<String>, MergeBackError> {
    let mut opts = StatusOptions::new();
    opts.include_untracked(false)
        .include_ignored(false)
        .exclude_submodules(true);
    let statuses = repo.statuses(Some(&mut opts)).map_err(local)?;
    let mut paths: Vec<String> = statuses
        .iter()
        .filter(|e| !e.status().is_empty() && !e.status().is_ignored())
        .map(|e| lossy(e.path_bytes()))
        .collect();
    paths.sort();
    paths.dedup();
    Ok(paths)
}

fn conflict_paths(index: &Index) -> Result<Vec<String>, MergeBackError> {
    let mut paths = Vec::new();
    for c in index.conflicts().map_err(local)? {
        let c = c.map_err(local)?;
        if let Some(e) = c.our.or(c.their).or(c.ancestor) {
            paths.push(lossy(&e.path));
        }
    }
    paths.sort();
    paths.dedup();
    Ok(paths)
}

/// The signature commits made by grove in a workspace carry: its own `user.name` /
/// `user.email` (set at checkout), else grove's default.
fn signature(repo: &Repository) -> Result<Signature<'static>, MergeBackError> {
    repo.signature()
        .or_else(|_| Signature::now("grove agent", "agent@grove.invalid"))
        .map_err(local)
}

/// Paths the change from `old` to `new` would write where the working tree holds
/// something untracked: an added path that exists, or an added path under an untracked
/// file or symlink. (Tracked files are known clean at this point.)
fn blocking_paths(
    root: &Path,
    repo: &Repository,
    old: &git2::Tree<'_>,
    new: &git2::Tree<'_>,
) -> Result<Vec<String>, MergeBackError> {
    use std::os::unix::ffi::OsStrExt;
    let diff = repo
        .diff_tree_to_tree(Some(old), Some(new), None)
        .map_err(local)?;
    let mut paths = Vec::new();
    for delta in diff.deltas() {
        if delta.status() != Delta::Added {
            continue;
        }
        let Some(rel) = delta.new_file().path() else {
            continue;
        };
        let mut blocked = std::fs::symlink_metadata(root.join(rel)).is_ok();
        let mut prefix = rel.parent();
        while let (false, Some(p)) = (blocked, prefix) {
            if p.as_os_str().is_empty() {
                break;
            }
            let tracked = old.get_path(p).is_ok();
            blocked =
                !tracked && std::fs::symlink_metadata(root.join(p)).is_ok_and(|m| !m.is_dir());
            prefix = p.parent();
        }
        if blocked {
            paths.push(lossy(rel.as_os_str().as_bytes()));
        }
    }
    paths.sort();
    paths.dedup();
    Ok(paths)
}

/// Brings the task's commits into the target branch; see the module documentation.
pub(crate) fn merge_back(
    req: &MergeBackRequest<'_>,
    strategy: MergeStrategy,
) -> Result<MergeBackReport, MergeBackError> {
    let pair = open_pair(req)?;
    let repo = &pair.edit;
    if repo.state() != RepositoryState::Clean {
        return Err(MergeBackError::Refused(format!(
            "a git operation ({:?}) is in progress in the target workspace; finish or abort it first",
            repo.state()
        )));
    }
    let dirty = tracked_changes(repo)?;
    if !dirty.is_empty() {
        return Err(MergeBackError::Dirty(dirty));
    }
    // Everything written from here until the result is known stays in memory. The odb
    // handle keeps the backend's owner alive for the whole computation.
    let odb = repo.odb().map_err(local)?;
    odb.add_new_mempack_backend(1000).map_err(local)?;

    let ids = lacking(&pair)?;
    let mut commits = Vec::new();
    for id in &ids {
        commits.push(branch_commit(&repo.find_commit(*id).map_err(local)?));
    }
    let mut report = MergeBackReport {
        edit_workspace_id: Uuid::nil(),
        task_workspace_id: Uuid::nil(),
        strategy,
        edit_branch: req.edit_branch.to_string(),
        previous_head: pair.edit_head.to_string(),
        new_head: pair.edit_head.to_string(),
        commits,
        created: Vec::new(),
        skipped: Vec::new(),
        fast_forward: false,
        up_to_date: ids.is_empty(),
        files: Vec::new(),
    };
    if ids.is_empty() {
        return Ok(report);
    }
    let sig = signature(repo)?;
    let ours = repo.find_commit(pair.edit_head).map_err(local)?;
    let new_head = match strategy {
        MergeStrategy::Merge => {
            if repo
                .graph_descendant_of(pair.task_head, pair.edit_head)
                .map_err(local)?
            {
                report.fast_forward = true;
                pair.task_head
            } else {
                let theirs = repo.find_commit(pair.task_head).map_err(local)?;
                let mut index = repo
                    .merge_commits(&ours, &theirs, Some(&MergeOptions::new()))
                    .map_err(local)?;
                if index.has_conflicts() {
                    return Err(MergeBackError::Conflict {
                        paths: conflict_paths(&index)?,
                        commit: None,
                    });
                }
                let tree = index.write_tree_to(repo).map_err(local)?;
                let tree = repo.find_tree(tree).map_err(local)?;
                let message = format!(
                    "Merge branch '{}' into {}\n",
                    req.task_branch, req.edit_branch
                );
                let id = repo
                    .commit(None, &sig, &sig, &message, &tree, &[&ours, &theirs])
                    .map_err(local)?;
                report.created.push(id.to_string());
                id
            }
        }
        MergeStrategy::CherryPick => {
            let mut current = ours.clone();
            for id in &ids {
                let pick = repo.find_commit(*id).map_err(local)?;
                if pick.parent_count() > 1 {
                    return Err(MergeBackError::Refused(format!(
                        "task commit {id} is a merge commit, which cherry-pick cannot replay; merge back with strategy merge"
                    )));
                }
                let mut index = repo
                    .cherrypick_commit(&pick, &current, 0, Some(&MergeOptions::new()))
                    .map_err(local)?;
                if index.has_conflicts() {
                    return Err(MergeBackError::Conflict {
                        paths: conflict_paths(&index)?,
                        commit: Some(id.to_string()),
                    });
                }
                let tree = index.write_tree_to(repo).map_err(local)?;
                if tree == current.tree_id() {
                    // The target already has this change.
                    report.skipped.push(id.to_string());
                    continue;
                }
                let tree = repo.find_tree(tree).map_err(local)?;
                let message = format!(
                    "{}\n\n(cherry picked from commit {id})\n",
                    lossy(pick.message_bytes()).trim_end()
                );
                let made = repo
                    .commit(None, &pick.author(), &sig, &message, &tree, &[&current])
                    .map_err(local)?;
                report.created.push(made.to_string());
                current = repo.find_commit(made).map_err(local)?;
            }
            current.id()
        }
    };
    if new_head == pair.edit_head {
        report.up_to_date = true;
        return Ok(report);
    }
    let old_tree = ours.tree().map_err(local)?;
    let new_tree = repo
        .find_commit(new_head)
        .and_then(|c| c.tree())
        .map_err(local)?;
    // Untracked (or ignored) files the change would overwrite are conflicts too, found
    // before anything is written; libgit2's safe checkout would refuse them, but
    // without naming them.
    let in_the_way = blocking_paths(req.edit_dir, repo, &old_tree, &new_tree)?;
    if !in_the_way.is_empty() {
        return Err(MergeBackError::Conflict {
            paths: in_the_way,
            commit: None,
        });
    }
    // The checkouts read the target's rule files: none may block them or be a link.
    // (The checkout writes into the tree, so what the check saw is not verified after.)
    crate::rules::check_workspace(repo, req.edit_dir).map_err(MergeBackError::Git)?;
    {
        let mut cb = CheckoutBuilder::new();
        cb.safe().dry_run().overwrite_ignored(false);
        repo.checkout_tree(new_tree.as_object(), Some(&mut cb))
            .map_err(|e| match e.code() {
                ErrorCode::Conflict => MergeBackError::Refused(format!(
                    "files of the target workspace are in the way of the merge-back: {}",
                    e.message()
                )),
                _ => local(e),
            })?;
    }
    let mut changed = repo
        .diff_tree_to_tree(Some(&old_tree), Some(&new_tree), None)
        .map_err(local)?
        .deltas()
        .filter_map(|d| {
            d.new_file()
                .path_bytes()
                .or_else(|| d.old_file().path_bytes())
                .map(lossy)
        })
        .collect::<Vec<_>>();
    changed.sort();
    changed.dedup();
    report.files = changed;

    // Clean: make it real. Objects first (children before parents), then the files and
    // index, then the branch — the branch moves only if it is still where we read it.
    let target = crate::trusted::open_workspace(req.edit_dir).map_err(MergeBackError::Git)?;
    let branch_ref = format!("refs/heads/{}", req.edit_branch);
    crate::trusted::check_ref_writable(&target, &branch_ref).map_err(MergeBackError::Git)?;
    crate::preserve::copy_missing(repo, &target, new_head)?;
    drop(odb);
    switch(&target, req, pair.edit_head, new_head, strategy)?;
    report.new_head = new_head.to_string();
    Ok(report)
}

/// Switches the target's files, index and branch to `new_head` (every object already
/// in its store) under a journal: a crash is repaired by `journal::recover`, and a
/// failure here (a full disk) is rolled back at once.
fn switch(
    target: &Repository,
    req: &MergeBackRequest<'_>,
    old_head: Oid,
    new_head: Oid,
    strategy: MergeStrategy,
) -> Result<(), MergeBackError> {
    let branch = format!("refs/heads/{}", req.edit_branch);
    if let Some(path) = req.journal {
        let journal = crate::journal::Journal {
            version: 1,
            operation: "merge_back".into(),
            branch: branch.clone(),
            old_head: old_head.to_string(),
            new_head: new_head.to_string(),
        };
        crate::journal::begin(path, &journal).map_err(MergeBackError::Git)?;
    }
    let result = (|| {
        let new_tree = target
            .find_commit(new_head)
            .and_then(|c| c.tree())
            .map_err(local)?;
        let mut cb = CheckoutBuilder::new();
        cb.safe().overwrite_ignored(false);
        target
            .checkout_tree(new_tree.as_object(), Some(&mut cb))
            .map_err(local)?;
        let message = format!("merge-back ({}) of {}", strategy.as_str(), req.task_branch);
        target
            .reference_matching(&branch, new_head, true, old_head, &message)
            .map_err(local)?;
        Ok(())
    })();
    let Some(path) = req.journal else {
        return result;
    };
    match result {
        Ok(()) => crate::journal::finish(path).map_err(MergeBackError::Git),
        Err(e) => {
            if let Err(undo) = crate::journal::recover(path, req.edit_dir) {
                tracing::error!(error = %undo, "rolling back a failed merge-back failed; the journal stays for the next attempt");
            }
            Err(e)
        }
    }
}
