//! Workspace checkouts: standalone non-bare repos that borrow the cache's objects
//! through `objects/info/alternates` (like `git clone --shared`), plus the dirty check
//! and removal.
//!
//! Why not `git worktree`: a worktree keeps its HEAD, index and refs inside the cache,
//! and every commit an agent makes lands in the cache's object store. With alternates
//! the cache is only ever read; the workspace's own objects, index and refs stay in
//! the workspace and vanish with it.

use std::path::{Path, PathBuf};

use git2::build::CheckoutBuilder;
use git2::{ErrorCode, ObjectType, Oid, Repository, RepositoryInitOptions, Status, StatusOptions};
use grove_core::error::GitError;
use grove_core::ports::{CheckoutReport, CheckoutRequest};

use crate::errors::{map_git2, map_io, Phase};
use crate::fsutil::{
    dir_size_bytes, ensure_parent, partial_sibling, remove_path, remove_stale_partials, PartialDir,
};

const AGENT_NAME: &str = "grove agent";
const AGENT_EMAIL: &str = "agent@grove.invalid";

fn local(e: git2::Error) -> GitError {
    map_git2(&e, Phase::Local, None)
}

/// What `base_ref` resolved to in the cache.
struct Base {
    commit: Oid,
    /// The branch name when `base_ref` named a branch (it gets an `origin/<name>` ref).
    branch: Option<String>,
}

pub(crate) fn create_checkout(req: &CheckoutRequest<'_>) -> Result<CheckoutReport, GitError> {
    let cache = crate::trusted::open_cache(req.cache_dir).map_err(|e| {
        GitError::Other(format!(
            "cannot open the repo cache: {}",
            crate::errors::scrub(e.message(), None)
        ))
    })?;
    // Resolve before touching the filesystem: an unknown ref leaves nothing behind.
    let base = resolve_base(&cache, req.base_ref)?;
    let objects = std::path::absolute(req.cache_dir.join("objects"))
        .map_err(|e| map_io("cannot resolve the cache's object directory", &e))?;
    drop(cache);

    let ws = req.workspace_dir;
    ensure_parent(ws).map_err(|e| map_io("cannot create the workspace's parent", &e))?;
    remove_stale_partials(ws).map_err(|e| map_io("cannot remove a stale partial workspace", &e))?;
    // A directory here is the leftover of a crashed attempt (callers hold the
    // workspace creation lock and only call this for a workspace not yet recorded).
    remove_path(ws).map_err(|e| map_io("cannot remove a leftover workspace directory", &e))?;

    let partial = PartialDir::new(
        partial_sibling(ws).map_err(|e| map_io("cannot name a partial workspace", &e))?,
    );
    build(partial.path(), &objects, &base, req)?;
    partial
        .commit_to(ws)
        .map_err(|e| map_io("cannot move the checkout into place", &e))?;
    // After the rename: a crash in between leaves a workspace that adopts its record
    // (ADR 23), never a record without a workspace.
    crate::trusted::record_cache(ws, &objects)?;

    let size_bytes = dir_size_bytes(ws).map_err(|e| map_io("cannot measure the workspace", &e))?;
    tracing::info!(path = %ws.display(), base = %base.commit, "workspace checkout created");
    Ok(CheckoutReport {
        base_commit: base.commit.to_string(),
        size_bytes,
    })
}

/// `refs/heads/<ref>`, then `refs/tags/<ref>` peeled to a commit, then a full or
/// abbreviated commit id. Never revparse syntax (`main~1`, `@{u}`, `:/text`): the ref
/// is untrusted input and means one of the three, nothing more.
fn resolve_base(cache: &Repository, base_ref: &str) -> Result<Base, GitError> {
    let not_found = || GitError::RefNotFound(base_ref.to_string());
    if base_ref.is_empty() {
        return Err(not_found());
    }
    let (branch_name, tag_name) = if let Some(b) = base_ref.strip_prefix("refs/heads/") {
        (Some(b), None)
    } else if let Some(t) = base_ref.strip_prefix("refs/tags/") {
        (None, Some(t))
    } else {
        (Some(base_ref), Some(base_ref))
    };

    if let Some(name) = branch_name {
        if let Some(commit) = lookup_commit(cache, &format!("refs/heads/{name}"))? {
            return Ok(Base {
                commit,
                branch: Some(name.to_string()),
            });
        }
    }
    if let Some(name) = tag_name {
        if let Some(commit) = lookup_commit(cache, &format!("refs/tags/{name}"))? {
            return Ok(Base {
                commit,
                branch: None,
            });
        }
    }
    let is_hex = base_ref.bytes().all(|b| b.is_ascii_hexdigit());
    if is_hex && (4..=64).contains(&base_ref.len()) {
        match cache.find_object_by_prefix(base_ref, Some(ObjectType::Commit)) {
            Ok(obj) => {
                return Ok(Base {
                    commit: obj.id(),
                    branch: None,
                })
            }
            // Not there, ambiguous, or not a commit: none of those is a base.
            Err(e)
                if matches!(
                    e.code(),
                    ErrorCode::NotFound | ErrorCode::Ambiguous | ErrorCode::InvalidSpec
                ) || e.class() == git2::ErrorClass::Invalid
                    || e.class() == git2::ErrorClass::Object =>
            {
                return Err(not_found())
            }
            Err(e) => return Err(local(e)),
        }
    }
    Err(not_found())
}

/// The commit a reference peels to; `None` when the reference does not exist, has an
/// invalid name, or does not lead to a commit.
fn lookup_commit(repo: &Repository, refname: &str) -> Result<Option<Oid>, GitError> {
    let reference = match repo.find_reference(refname) {
        Ok(r) => r,
        Err(e) if matches!(e.code(), ErrorCode::NotFound | ErrorCode::InvalidSpec) => {
            return Ok(None)
        }
        Err(e) => return Err(local(e)),
    };
    match reference.peel_to_commit() {
        Ok(commit) => Ok(Some(commit.id())),
        Err(e)
            if matches!(e.code(), ErrorCode::NotFound | ErrorCode::InvalidSpec)
                || e.class() == git2::ErrorClass::Object
                || e.class() == git2::ErrorClass::Invalid =>
        {
            Ok(None)
        }
        Err(e) => Err(local(e)),
    }
}

/// Builds the checkout in `dir` (a fresh partial directory).
fn build(
    dir: &Path,
    cache_objects: &Path,
    base: &Base,
    req: &CheckoutRequest<'_>,
) -> Result<(), GitError> {
    let mut opts = RepositoryInitOptions::new();
    opts.bare(false).no_reinit(true).mkpath(true);
    crate::trusted::init();
    let repo = Repository::init_opts(dir, &opts).map_err(local)?;
    let info_dir: PathBuf = repo.path().join("objects").join("info");
    drop(repo);
    std::fs::create_dir_all(&info_dir).map_err(|e| map_io("cannot create objects/info", &e))?;
    let mut alternates = cache_objects.as_os_str().as_encoded_bytes().to_vec();
    alternates.push(b'\n');
    std::fs::write(info_dir.join("alternates"), alternates)
        .map_err(|e| map_io("cannot write objects/info/alternates", &e))?;

    // Reopen so the object database loads the alternates file just written.
    let repo = crate::trusted::open_fresh(dir)?;
    let commit = repo.find_commit(base.commit).map_err(local)?;

    if let Some(branch) = &base.branch {
        // So `git diff origin/<base>` and `git log origin/<base>..` work in the workspace.
        repo.reference(
            &format!("refs/remotes/origin/{branch}"),
            base.commit,
            true,
            "grove: base",
        )
        .map_err(local)?;
    }
    repo.remote("origin", req.upstream_url).map_err(local)?;
    {
        let mut config = repo.config().map_err(local)?;
        config.set_str("user.name", AGENT_NAME).map_err(local)?;
        config.set_str("user.email", AGENT_EMAIL).map_err(local)?;
    }

    match req.branch {
        Some(name) => {
            let branch = repo.branch(name, &commit, true).map_err(local)?;
            let refname = branch
                .get()
                .name()
                .map_err(|_| GitError::Other("branch name is not UTF-8".to_string()))?
                .to_string();
            repo.set_head(&refname).map_err(local)?;
        }
        None => repo.set_head_detached(base.commit).map_err(local)?,
    }

    drop(commit);
    drop(repo);
    write_tree(dir, git_cli())
}

/// Writes HEAD's tree and the index into the empty working tree `dir`.
///
/// Through the git CLI `git` (`read-tree -u --reset HEAD`, with parallel checkout) where one
/// is installed: on the benchmark's 5,000-file repository it writes the tree 2–3 times
/// faster than libgit2's checkout (ADR 03). The CLI runs through
/// [`crate::trusted::git_command`] on the fresh repository grove just built (its config
/// is grove's, checked anyway). Without one (`None`),
/// libgit2 does the same in one forced checkout of HEAD.
fn write_tree(dir: &Path, git: Option<&Path>) -> Result<(), GitError> {
    if let Some(git) = git {
        let out = crate::trusted::git_command(git, &dir.join(".git"), dir)?
            .args(["-c", "checkout.workers=0"])
            .args(["read-tree", "-u", "--reset", "HEAD"])
            .output()
            .map_err(|e| map_io("cannot run git read-tree", &e))?;
        if !out.status.success() {
            return Err(GitError::Other(crate::errors::scrub(
                &format!(
                    "git read-tree failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ),
                None,
            )));
        }
        return Ok(());
    }
    // One pass: the working tree and index are empty, so a forced checkout of HEAD
    // writes every file once and the index with it.
    let repo = crate::trusted::open_fresh(dir)?;
    let mut checkout = CheckoutBuilder::new();
    checkout.force();
    repo.checkout_head(Some(&mut checkout)).map_err(local)
}

/// The git CLI grove writes working trees with, looked up once on `PATH`; `None` when
/// there is none (then libgit2 writes them).
pub(crate) fn git_cli() -> Option<&'static Path> {
    static GIT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    GIT.get_or_init(|| {
        let found = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("git"))
                .find(|p| p.is_file())
        });
        if found.is_none() {
            tracing::info!("no git binary on PATH: workspace trees are written by libgit2");
        }
        found
    })
    .as_deref()
}

pub(crate) fn is_dirty(workspace_dir: &Path) -> Result<bool, GitError> {
    crate::rules::retrying(|| is_dirty_once(workspace_dir))
}

fn is_dirty_once(workspace_dir: &Path) -> Result<bool, GitError> {
    let repo = crate::trusted::open_workspace(workspace_dir)?;
    // No rule file the status walk reads may block it (a FIFO named `.gitignore`).
    let checked = crate::rules::check_workspace(&repo, workspace_dir)?;
    let mut opts = StatusOptions::new();
    opts.include_untracked(true)
        .include_ignored(false)
        .include_unmodified(false)
        // One untracked entry is enough to answer; no need to list a whole new tree.
        .recurse_untracked_dirs(false)
        .exclude_submodules(true);
    let statuses = repo.statuses(Some(&mut opts)).map_err(local)?;
    checked.verify()?;
    Ok(statuses.iter().any(|entry| {
        let s = entry.status();
        s != Status::CURRENT && !s.contains(Status::IGNORED)
    }))
}

pub(crate) fn remove_checkout(workspace_dir: &Path) -> Result<(), GitError> {
    // Guard against a wiring mistake handing us a cache: a workspace has a `.git`
    // entry, a bare cache does not. Deleting a workspace itself never affects the
    // cache, since alternates only point from the workspace to the cache.
    let has_dot_git = std::fs::symlink_metadata(workspace_dir.join(".git")).is_ok();
    if !has_dot_git && crate::trusted::open_cache(workspace_dir).is_ok() {
        return Err(GitError::Other(format!(
            "refusing to remove {}: it is a bare repository, not a workspace",
            workspace_dir.display()
        )));
    }
    remove_path(workspace_dir).map_err(|e| map_io("cannot remove the workspace", &e))?;
    crate::trusted::forget_cache(workspace_dir)?;
    tracing::info!(path = %workspace_dir.display(), "workspace checkout removed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A repository whose HEAD names a commit with a nested file, an executable and a
    /// symlink, and an empty working tree: what `build` hands to `write_tree`.
    fn unwritten_checkout(dir: &Path) {
        let src = dir.join("src");
        let repo = Repository::init(&src).unwrap();
        std::fs::create_dir_all(src.join("a/b")).unwrap();
        std::fs::write(src.join("a/b/c.txt"), "nested\n").unwrap();
        std::fs::write(src.join("run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(src.join("run.sh"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::os::unix::fs::symlink("a/b/c.txt", src.join("link")).unwrap();
        let mut index = repo.index().unwrap();
        index
            .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
            .unwrap();
        let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
        let sig = git2::Signature::now("t", "t@t.invalid").unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "one", &tree, &[])
            .unwrap();
        // The workspace borrows the objects through alternates, as `build` sets it up.
        let ws = Repository::init(dir.join("ws")).unwrap();
        let objects = std::path::absolute(src.join(".git/objects")).unwrap();
        std::fs::write(
            ws.path().join("objects/info/alternates"),
            format!("{}\n", objects.display()),
        )
        .unwrap();
        crate::trusted::record_cache(&dir.join("ws"), &objects).unwrap();
        let ws = Repository::open(dir.join("ws")).unwrap();
        ws.set_head_detached(repo.head().unwrap().target().unwrap())
            .unwrap();
    }

    fn written(dir: &Path) -> Vec<(String, String)> {
        let ws = dir.join("ws");
        let repo = Repository::open(&ws).unwrap();
        let index = repo.index().unwrap();
        let mut out: Vec<(String, String)> = index
            .iter()
            .map(|e| {
                let path = String::from_utf8(e.path.clone()).unwrap();
                let meta = std::fs::symlink_metadata(ws.join(&path)).unwrap();
                let what = if meta.file_type().is_symlink() {
                    format!(
                        "link->{}",
                        std::fs::read_link(ws.join(&path)).unwrap().display()
                    )
                } else {
                    format!(
                        "{:o} {}",
                        meta.permissions().mode() & 0o111,
                        std::fs::read_to_string(ws.join(&path)).unwrap()
                    )
                };
                (path, format!("{:o} {what}", e.mode))
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn the_git_cli_and_libgit2_write_the_same_tree_and_index() {
        let Some(git) = git_cli() else {
            eprintln!("skipped: no git binary on PATH, only the libgit2 path exists here");
            return;
        };
        let (cli, lib) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        unwritten_checkout(cli.path());
        unwritten_checkout(lib.path());
        write_tree(&cli.path().join("ws"), Some(git)).unwrap();
        write_tree(&lib.path().join("ws"), None).unwrap();
        let (a, b) = (written(cli.path()), written(lib.path()));
        assert_eq!(a.len(), 3, "{a:?}");
        assert_eq!(a, b);
        assert!(!is_dirty(&cli.path().join("ws")).unwrap());
        assert!(!is_dirty(&lib.path().join("ws")).unwrap());
    }
}
