//! git as an agent tool inside one workspace: status, diff, log, commit and push.
//!
//! Paths arrive already validated against the workspace root (by `grove-tools`); they
//! are still given to libgit2 as literal paths (pathspec matching disabled), never as
//! patterns. A push token reaches libgit2 only through the credentials callback
//! ([`crate::cache::Auth`]), exactly as for clones and fetches.

use std::cell::RefCell;
use std::path::Path;

use git2::{
    DiffFormat, DiffOptions, Direction, ErrorCode, IndexAddOption, Oid, PushOptions, Repository,
    Signature, Sort, Status, StatusOptions,
};
use grove_core::error::GitError;
use grove_core::ports::{CommitRequest, PushRequest};
use grove_core::tools::{
    Committed, DiffAgainst, GitDiff, GitStatus, LogEntry, Pushed, StatusEntry,
};

use crate::cache::{redact_url, Auth};
use crate::errors::{map_git2, Phase};

const REMOTE: &str = "origin";

fn local(e: git2::Error) -> GitError {
    map_git2(&e, Phase::Local, None)
}

fn open(dir: &Path) -> Result<Repository, GitError> {
    crate::trusted::open_workspace(dir)
}

/// The checked-out branch's short name, or `None` when HEAD is detached or unborn.
fn current_branch(repo: &Repository) -> Option<String> {
    let head = repo.head().ok()?;
    if !head.is_branch() {
        return None;
    }
    head.shorthand().ok().map(str::to_string)
}

fn head_commit(repo: &Repository) -> Result<Option<Oid>, GitError> {
    match repo.head() {
        Ok(h) => Ok(h.target()),
        Err(e) if matches!(e.code(), ErrorCode::UnbornBranch | ErrorCode::NotFound) => Ok(None),
        Err(e) => Err(local(e)),
    }
}

/// The commit a reference peels to; `None` when it does not exist or is no commit.
fn peel(repo: &Repository, refname: &str) -> Option<Oid> {
    repo.find_reference(refname)
        .ok()?
        .peel_to_commit()
        .ok()
        .map(|c| c.id())
}

/// Resolves a validated ref the way an agent means it in a workspace: a local branch,
/// the upstream's branch (`origin/<name>`, where the base branch lives), a tag, a full
/// ref, or a commit id (prefix). Never revparse syntax.
fn resolve(repo: &Repository, name: &str) -> Result<Oid, GitError> {
    let candidates = [
        name.to_string(),
        format!("refs/heads/{name}"),
        format!("refs/remotes/{REMOTE}/{name}"),
        format!("refs/tags/{name}"),
    ];
    for c in candidates.iter().filter(|c| c.starts_with("refs/")) {
        if let Some(oid) = peel(repo, c) {
            return Ok(oid);
        }
    }
    if (4..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_hexdigit()) {
        if let Ok(obj) = repo.find_object_by_prefix(name, Some(git2::ObjectType::Commit)) {
            return Ok(obj.id());
        }
    }
    Err(GitError::RefNotFound(name.to_string()))
}

pub(crate) fn status(dir: &Path) -> Result<GitStatus, GitError> {
    crate::rules::retrying(|| status_once(dir))
}

fn status_once(dir: &Path) -> Result<GitStatus, GitError> {
    let repo = open(dir)?;
    let checked = crate::rules::check_workspace(&repo, dir)?;
    let mut opts = StatusOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false)
        .exclude_submodules(true);
    let statuses = repo.statuses(Some(&mut opts)).map_err(local)?;
    checked.verify()?;
    let mut entries = Vec::new();
    for e in statuses.iter() {
        let s = e.status();
        let staged = if s.contains(Status::INDEX_NEW) {
            Some("added")
        } else if s.contains(Status::INDEX_MODIFIED) {
            Some("modified")
        } else if s.contains(Status::INDEX_DELETED) {
            Some("deleted")
        } else if s.contains(Status::INDEX_RENAMED) {
            Some("renamed")
        } else if s.contains(Status::INDEX_TYPECHANGE) {
            Some("typechange")
        } else {
            None
        };
        let unstaged = if s.contains(Status::WT_NEW) {
            Some("untracked")
        } else if s.contains(Status::WT_MODIFIED) {
            Some("modified")
        } else if s.contains(Status::WT_DELETED) {
            Some("deleted")
        } else if s.contains(Status::WT_RENAMED) {
            Some("renamed")
        } else if s.contains(Status::WT_TYPECHANGE) {
            Some("typechange")
        } else {
            None
        };
        if staged.is_none() && unstaged.is_none() {
            continue;
        }
        entries.push(StatusEntry {
            path: String::from_utf8_lossy(e.path_bytes()).into_owned(),
            staged: staged.map(str::to_string),
            unstaged: unstaged.map(str::to_string),
        });
    }
    Ok(GitStatus {
        branch: current_branch(&repo),
        head: head_commit(&repo)?.map(|o| o.to_string()),
        entries,
    })
}

pub(crate) fn diff(
    dir: &Path,
    against: &DiffAgainst,
    paths: &[String],
    max_bytes: usize,
) -> Result<GitDiff, GitError> {
    crate::rules::retrying(|| diff_once(dir, against, paths, max_bytes))
}

fn diff_once(
    dir: &Path,
    against: &DiffAgainst,
    paths: &[String],
    max_bytes: usize,
) -> Result<GitDiff, GitError> {
    let repo = open(dir)?;
    let checked = crate::rules::check_workspace(&repo, dir)?;
    let commit = match against {
        DiffAgainst::Head => head_commit(&repo)?
            .ok_or_else(|| GitError::InvalidInput("the workspace has no commit yet".into()))?,
        // The caller resolves `Base` to the workspace's base commit.
        DiffAgainst::Base => {
            return Err(GitError::InvalidInput(
                "diff against base needs the base commit".into(),
            ))
        }
        DiffAgainst::Ref(r) => resolve(&repo, r)?,
    };
    let tree = repo
        .find_commit(commit)
        .and_then(|c| c.tree())
        .map_err(local)?;
    let mut opts = DiffOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .show_untracked_content(true)
        .disable_pathspec_match(true);
    for p in paths {
        opts.pathspec(p);
    }
    let diff = repo
        .diff_tree_to_workdir_with_index(Some(&tree), Some(&mut opts))
        .map_err(local)?;
    let files = diff
        .deltas()
        .filter_map(|d| {
            d.new_file()
                .path()
                .or_else(|| d.old_file().path())
                .map(|p| p.to_string_lossy().into_owned())
        })
        .collect();
    let mut patch = Vec::new();
    let mut truncated = false;
    let printed = diff.print(DiffFormat::Patch, |_delta, _hunk, line| {
        let mut chunk = Vec::new();
        if matches!(line.origin(), '+' | '-' | ' ') {
            chunk.push(line.origin() as u8);
        }
        chunk.extend_from_slice(line.content());
        if patch.len() + chunk.len() > max_bytes {
            truncated = true;
            return false;
        }
        patch.extend_from_slice(&chunk);
        true
    });
    // Stopping the callback makes libgit2 report a user abort: that is the cap.
    if let Err(e) = printed {
        if !truncated {
            return Err(local(e));
        }
    }
    checked.verify()?;
    Ok(GitDiff {
        against: commit.to_string(),
        files,
        patch: String::from_utf8_lossy(&patch).into_owned(),
        truncated,
    })
}

pub(crate) fn log(dir: &Path, max_count: usize) -> Result<Vec<LogEntry>, GitError> {
    let repo = open(dir)?;
    if head_commit(&repo)?.is_none() {
        return Ok(Vec::new());
    }
    let mut walk = repo.revwalk().map_err(local)?;
    walk.set_sorting(Sort::TOPOLOGICAL | Sort::TIME)
        .map_err(local)?;
    walk.push_head().map_err(local)?;
    let mut out = Vec::new();
    for oid in walk.take(max_count) {
        let commit = repo.find_commit(oid.map_err(local)?).map_err(local)?;
        let author = commit.author();
        out.push(LogEntry {
            commit: commit.id().to_string(),
            author_name: String::from_utf8_lossy(author.name_bytes()).into_owned(),
            author_email: String::from_utf8_lossy(author.email_bytes()).into_owned(),
            time: author.when().seconds(),
            summary: String::from_utf8_lossy(commit.summary_bytes().unwrap_or_default())
                .into_owned(),
        });
    }
    Ok(out)
}

pub(crate) fn commit(req: &CommitRequest<'_>) -> Result<Committed, GitError> {
    let repo = open(req.workspace_dir)?;
    let checked = crate::rules::check_workspace(&repo, req.workspace_dir)?;
    crate::trusted::check_ref_writable(&repo, &crate::trusted::head_ref_name(&repo)?)?;
    let mut index = repo.index().map_err(local)?;
    if req.paths.is_empty() {
        // Everything, like `git add -A`: new, changed and deleted files; ignored ones not.
        index
            .add_all(["*"], IndexAddOption::DEFAULT, None)
            .map_err(local)?;
        index.update_all(["*"], None).map_err(local)?;
    } else {
        for p in req.paths {
            let full = req.workspace_dir.join(p);
            match std::fs::symlink_metadata(&full) {
                Ok(meta) if meta.is_dir() => {
                    index
                        .add_all([p.as_str()], IndexAddOption::DISABLE_PATHSPEC_MATCH, None)
                        .map_err(local)?;
                    index.update_all([p.as_str()], None).map_err(local)?;
                }
                Ok(_) => index.add_path(Path::new(p)).map_err(local)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    // A deleted file is staged as a removal; a path git never knew is a
                    // mistake worth saying.
                    if index.get_path(Path::new(p), 0).is_none() {
                        return Err(GitError::InvalidInput(format!(
                            "path {p:?} is neither in the working tree nor in the index"
                        )));
                    }
                    index.remove_path(Path::new(p)).map_err(local)?;
                }
                Err(e) => return Err(crate::errors::map_io("cannot inspect a path", &e)),
            }
        }
    }
    // Nothing is written when the rules the staging read may have come from elsewhere.
    checked.verify()?;
    index.write().map_err(local)?;
    let tree_id = index.write_tree().map_err(local)?;
    let tree = repo.find_tree(tree_id).map_err(local)?;
    let parent = match head_commit(&repo)? {
        Some(oid) => Some(repo.find_commit(oid).map_err(local)?),
        None => None,
    };
    if parent.as_ref().is_some_and(|p| p.tree_id() == tree_id) {
        return Err(GitError::NothingToCommit);
    }
    let sig = match req.author {
        Some((name, email)) => Signature::now(name, email).map_err(local)?,
        None => repo.signature().map_err(local)?,
    };
    let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
    let oid = repo
        .commit(Some("HEAD"), &sig, &sig, req.message, &tree, &parents)
        .map_err(local)?;
    let parent_tree = parent
        .as_ref()
        .map(|p| p.tree())
        .transpose()
        .map_err(local)?;
    let changed = repo
        .diff_tree_to_tree(parent_tree.as_ref(), Some(&tree), None)
        .map_err(local)?;
    let files = changed
        .deltas()
        .filter_map(|d| {
            d.new_file()
                .path()
                .or_else(|| d.old_file().path())
                .map(|p| p.to_string_lossy().into_owned())
        })
        .collect();
    Ok(Committed {
        commit: oid.to_string(),
        branch: current_branch(&repo),
        files,
    })
}

pub(crate) fn push(req: &PushRequest<'_>) -> Result<Pushed, GitError> {
    let repo = open(req.workspace_dir)?;
    let branch = match req.branch {
        Some(b) => b.to_string(),
        None => current_branch(&repo).ok_or_else(|| {
            GitError::InvalidInput("HEAD is detached: name the branch to push".into())
        })?,
    };
    let local_ref = format!("refs/heads/{branch}");
    let tracking_ref = format!("refs/remotes/{REMOTE}/{branch}");
    let oid = peel(&repo, &local_ref).ok_or_else(|| GitError::RefNotFound(branch.clone()))?;
    // grove's record, never `remote.origin.url`/`pushurl`/`insteadOf` of the workspace
    // (the repository's config is grove's own here: no `url.*` rewrite exists).
    let url = req.remote_url.to_string();
    let mut remote = repo.remote_anonymous(&url).map_err(local)?;
    let auth = Auth::for_url(req.token, &url);
    let remote_err = |e: git2::Error| -> GitError {
        if auth.refused.get() {
            return GitError::AuthFailed;
        }
        if e.code() == ErrorCode::NotFastForward {
            return GitError::Rejected(format!(
                "{branch} on the remote is not an ancestor of the local branch (fetch, or push with force-with-lease)"
            ));
        }
        if e.code() == ErrorCode::BareRepo {
            // libgit2's local transport pushes only into bare repositories; like git's
            // "refusing to update checked out branch", the remote refuses the update.
            return GitError::Rejected(
                "the remote is a repository with a work tree; push to a bare repository".into(),
            );
        }
        let mapped = map_git2(&e, Phase::Remote, req.token);
        tracing::warn!(url = %redact_url(&url), error = %mapped, "push failed");
        mapped
    };

    // One connection: the lease is checked against the refs this connection advertises,
    // and the push sends those same values as the old ids, so the server refuses the
    // update if the branch moved in between (receive-pack compares under its ref lock).
    let mut conn = remote
        .connect_auth(Direction::Push, Some(auth.callbacks()), None)
        .map_err(remote_err)?;
    let previous = conn
        .list()
        .map_err(remote_err)?
        .iter()
        .find(|h| h.name() == local_ref)
        .map(|h| h.oid());
    if req.force_with_lease {
        let expected = match req.expect {
            Some(hex) => Some(hex.to_ascii_lowercase()),
            None => peel(&repo, &tracking_ref).map(|o| o.to_string()),
        };
        let holds = match (&previous, &expected) {
            (None, None) => true,
            (Some(p), Some(e)) => p.to_string().starts_with(e.as_str()),
            _ => false,
        };
        if !holds {
            let show = |o: Option<String>| o.unwrap_or_else(|| "absent".into());
            return Err(GitError::Rejected(format!(
                "stale lease: {branch} on the remote is {}, expected {}",
                show(previous.map(|o| o.to_string())),
                show(expected)
            )));
        }
    }
    let refspec = format!(
        "{}{local_ref}:{local_ref}",
        if req.force_with_lease { "+" } else { "" }
    );
    let refused: RefCell<Option<String>> = RefCell::new(None);
    {
        let mut callbacks = auth.callbacks();
        callbacks.push_update_reference(|_name, status| {
            if let Some(msg) = status {
                *refused.borrow_mut() = Some(msg.to_string());
            }
            Ok(())
        });
        let mut opts = PushOptions::new();
        opts.remote_callbacks(callbacks)
            .proxy_options(git2::ProxyOptions::new());
        conn.remote()
            .push(&[refspec.as_str()], Some(&mut opts))
            .map_err(remote_err)?;
    }
    drop(conn);
    if let Some(msg) = refused.into_inner() {
        return Err(GitError::Rejected(crate::errors::scrub(&msg, req.token)));
    }
    crate::trusted::check_ref_writable(&repo, &tracking_ref)?;
    repo.reference(&tracking_ref, oid, true, "grove: push")
        .map_err(local)?;
    if req.set_upstream {
        crate::trusted::set_upstream(req.workspace_dir, &branch, REMOTE)?;
    }
    Ok(Pushed {
        branch,
        commit: oid.to_string(),
        previous: previous.map(|o| o.to_string()),
        forced: req.force_with_lease
            && previous
                .is_some_and(|p| !repo.graph_descendant_of(oid, p).unwrap_or(false) && p != oid),
    })
}
