//! Test support: fixture upstream repos built with the real git CLI, and helpers to
//! run git in a workspace and inspect a cache's object store.

use grove_core::transfer::TransferWatch;
use std::path::{Path, PathBuf};
use std::process::Command;

use grove_core::ports::{CheckoutRequest, GitPort};
use grove_git::Git2Adapter;
use tempfile::TempDir;

/// A git command isolated from the host's global and system config, so a developer's
/// settings (signing, hooks, default branch) cannot change what a test sees.
pub fn git_cmd(dir: &Path) -> Command {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .env_remove("GIT_OBJECT_DIRECTORY")
        .env_remove("GIT_ALTERNATE_OBJECT_DIRECTORIES")
        .env_remove("GIT_AUTHOR_NAME")
        .env_remove("GIT_AUTHOR_EMAIL")
        .env_remove("GIT_COMMITTER_NAME")
        .env_remove("GIT_COMMITTER_EMAIL");
    cmd
}

/// Runs git in `dir` and returns trimmed stdout; panics with stderr on failure.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = git_cmd(dir).args(args).output().expect("git runs");
    assert!(
        out.status.success(),
        "git {:?} in {} failed: {}",
        args,
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs git as the fixture's author (for commits in the upstream).
pub fn git_as_author(dir: &Path, args: &[&str]) -> String {
    let mut full = vec![
        "-c",
        "user.name=Fixture Author",
        "-c",
        "user.email=fixture@example.invalid",
    ];
    full.extend_from_slice(args);
    git(dir, &full)
}

/// An upstream repo with history: `main` (two commits), `feature` (one more), an
/// annotated tag `v1` on main's first commit and `.gitignore` ignoring `*.log`.
pub struct Fixture {
    pub root: TempDir,
    pub upstream: PathBuf,
    pub url: String,
    pub first: String,
    pub main: String,
    pub feature: String,
}

impl Fixture {
    pub fn new() -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let upstream = root.path().join("upstream");
        std::fs::create_dir(&upstream).unwrap();
        git(&upstream, &["-c", "init.defaultBranch=main", "init", "-q"]);
        std::fs::write(upstream.join("README.md"), "hello\n").unwrap();
        std::fs::write(upstream.join(".gitignore"), "*.log\n").unwrap();
        std::fs::create_dir(upstream.join("src")).unwrap();
        std::fs::write(upstream.join("src/lib.rs"), "pub fn f() {}\n").unwrap();
        git(&upstream, &["add", "-A"]);
        git_as_author(&upstream, &["commit", "-q", "-m", "first"]);
        let first = git(&upstream, &["rev-parse", "HEAD"]);
        git_as_author(&upstream, &["tag", "-a", "v1", "-m", "release 1"]);
        std::fs::write(upstream.join("README.md"), "hello again\n").unwrap();
        git_as_author(&upstream, &["commit", "-q", "-am", "second"]);
        let main = git(&upstream, &["rev-parse", "HEAD"]);
        git(&upstream, &["checkout", "-q", "-b", "feature"]);
        std::fs::write(upstream.join("feature.txt"), "feature\n").unwrap();
        git(&upstream, &["add", "feature.txt"]);
        git_as_author(&upstream, &["commit", "-q", "-m", "feature work"]);
        let feature = git(&upstream, &["rev-parse", "HEAD"]);
        git(&upstream, &["checkout", "-q", "main"]);
        let url = format!("file://{}", upstream.display());
        Self {
            root,
            upstream,
            url,
            first,
            main,
            feature,
        }
    }

    /// Adds a commit on `main` in the upstream and returns its id.
    pub fn commit_on_main(&self, file: &str, content: &str) -> String {
        std::fs::write(self.upstream.join(file), content).unwrap();
        git(&self.upstream, &["add", file]);
        git_as_author(&self.upstream, &["commit", "-q", "-m", file]);
        git(&self.upstream, &["rev-parse", "HEAD"])
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    /// A complete cache of the fixture at `<root>/caches/repo.git`.
    pub fn cache(&self) -> PathBuf {
        let dir = self.path("caches/repo.git");
        Git2Adapter::new()
            .ensure_cache(&self.url, &dir, None, false, &TransferWatch::none())
            .expect("cache");
        dir
    }

    pub fn request<'a>(
        &'a self,
        cache_dir: &'a Path,
        workspace_dir: &'a Path,
        base_ref: &'a str,
        branch: Option<&'a str>,
    ) -> CheckoutRequest<'a> {
        CheckoutRequest {
            cache_dir,
            workspace_dir,
            base_ref,
            branch,
            upstream_url: "https://example.invalid/acme/repo.git",
        }
    }
}

/// Every file under `dir`, relative, sorted: a fingerprint of an object store.
pub fn list_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let ft = entry.file_type().unwrap();
            if ft.is_dir() {
                stack.push(entry.path());
            } else {
                out.push(entry.path().strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// Names in `dir`'s parent that look like partial builds of `dir`.
pub fn partial_siblings(dir: &Path) -> Vec<String> {
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let prefix = format!(".{name}.partial-");
    match std::fs::read_dir(dir.parent().unwrap()) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with(&prefix))
            .collect(),
        Err(_) => Vec::new(),
    }
}
