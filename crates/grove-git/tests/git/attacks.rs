//! Attacks on host-side git through a workspace's `.git`: each hostile key or shape,
//! one at a time, against every git entry point grove has. Each run proves that no
//! planted program ran, no host file was read into a result, nothing was written
//! outside the workspaces, and a push went only to the recorded URL.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use grove_core::error::GitError;
use grove_core::merge_back::MergeStrategy;
use grove_core::ports::{
    CheckoutRequest, CommitRequest, GitPort, GitToken, MergeBackRequest, PushRequest,
    RestoreRequest, SaveWorkRequest,
};
use grove_core::tools::DiffAgainst;
use grove_git::Git2Adapter;

use crate::support::{git, git_as_author, list_files, Fixture};

const EDIT: &str = "agent/edits-c1";
const TASK: &str = "agent/task-t1";
const SECRET: &str = "HOST-SECRET-7f3a9c";
const TOKEN: &str = "ghs_attack_token_5d1e";

/// Counts TCP connections to a loopback port: the place a hijacked push would go.
struct Listener {
    url: String,
    hits: Arc<AtomicUsize>,
}

impl Listener {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&hits);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                seen.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        Self {
            url: format!("http://127.0.0.1:{port}/stolen.git"),
            hits,
        }
    }
}

/// An edit and a task workspace of one cache, a bare remote they push to, a host
/// directory holding a secret, and a program that leaves a marker when run.
struct Scene {
    fx: Fixture,
    cache: PathBuf,
    remote: PathBuf,
    edit: PathBuf,
    task: PathBuf,
    host: PathBuf,
    markers: PathBuf,
    evil: PathBuf,
    listener: Listener,
}

impl Scene {
    fn new() -> Self {
        let fx = Fixture::new();
        let cache = fx.cache();
        let remote = fx.path("remote.git");
        let upstream = fx.upstream.to_str().unwrap().to_string();
        git(
            fx.root.path(),
            &["clone", "-q", "--bare", &upstream, "remote.git"],
        );
        let edit = fx.path("workspaces/edit");
        let task = fx.path("workspaces/task");
        for (dir, branch) in [(&edit, EDIT), (&task, TASK)] {
            Git2Adapter::new()
                .create_checkout(&CheckoutRequest {
                    cache_dir: &cache,
                    workspace_dir: dir,
                    base_ref: "main",
                    branch: Some(branch),
                    upstream_url: "https://example.invalid/acme/repo.git",
                })
                .unwrap();
        }
        std::fs::write(task.join("task.txt"), "task work\n").unwrap();
        git_as_author(&task, &["add", "task.txt"]);
        git_as_author(&task, &["commit", "-q", "-m", "task work"]);

        let host = fx.path("host");
        std::fs::create_dir_all(host.join("sub")).unwrap();
        std::fs::write(host.join("secret.txt"), format!("{SECRET}\n")).unwrap();
        std::fs::write(host.join("README.md"), format!("{SECRET} readme\n")).unwrap();
        std::fs::write(
            host.join("included.cfg"),
            format!(
                "[core]\n\tworktree = {}\n[user]\n\tname = {SECRET}\n",
                host.display()
            ),
        )
        .unwrap();
        let markers = fx.path("markers");
        std::fs::create_dir(&markers).unwrap();
        let evil = fx.path("evil.sh");
        std::fs::write(
            &evil,
            format!("#!/bin/sh\ntouch '{}'/\"ran-$$\"\ncat\n", markers.display()),
        )
        .unwrap();
        std::fs::set_permissions(&evil, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self {
            fx,
            cache,
            remote,
            edit,
            task,
            host,
            markers,
            evil,
            listener: Listener::start(),
        }
    }

    fn remote_url(&self) -> String {
        format!("file://{}", self.remote.display())
    }

    /// Sets `key` in both workspaces' `.git/config` (as the agent would, with git).
    fn set(&self, key: &str, value: &str) {
        for dir in [&self.edit, &self.task] {
            git(dir, &["config", key, value]);
        }
    }

    /// A hook directory where every hook leaves a marker.
    fn plant_hooks(&self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        for hook in [
            "pre-commit",
            "post-commit",
            "commit-msg",
            "pre-push",
            "post-checkout",
            "post-merge",
            "reference-transaction",
            "post-index-change",
        ] {
            std::os::unix::fs::symlink(&self.evil, dir.join(hook)).unwrap();
        }
    }

    /// Host files and their contents: must be the same after every attack.
    fn host_state(&self) -> Vec<(PathBuf, Vec<u8>)> {
        list_files(&self.host)
            .into_iter()
            .map(|p| {
                let bytes = std::fs::read(self.host.join(&p)).unwrap();
                (p, bytes)
            })
            .collect()
    }

    /// Runs every git entry point grove has on the workspaces; each result as text.
    fn every_entry_point(&self) -> Vec<(&'static str, Result<String, GitError>)> {
        let g = Git2Adapter::new();
        let show = |r: Result<String, GitError>| r;
        let mut out = Vec::new();
        std::fs::write(self.edit.join("agent.txt"), "agent\n").unwrap();
        out.push((
            "is_dirty",
            show(g.is_dirty(&self.edit).map(|d| d.to_string())),
        ));
        out.push((
            "status",
            show(g.status(&self.edit).map(|s| format!("{s:?}"))),
        ));
        for (name, against) in [
            ("diff head", DiffAgainst::Head),
            ("diff base", DiffAgainst::Ref(self.fx.first.clone())),
        ] {
            let d = g.diff(&self.edit, &against, &[], 1 << 20);
            out.push((name, d.map(|d| format!("{d:?}"))));
        }
        out.push(("log", g.log(&self.edit, 50).map(|l| format!("{l:?}"))));
        let commit = g.commit(&CommitRequest {
            workspace_dir: &self.edit,
            message: "agent commit",
            paths: &[],
            author: None,
        });
        out.push(("commit", commit.map(|c| format!("{c:?}"))));
        let token = GitToken::new(TOKEN.to_string());
        let push = g.push(&PushRequest {
            workspace_dir: &self.edit,
            remote_url: &self.remote_url(),
            branch: None,
            force_with_lease: false,
            expect: None,
            set_upstream: true,
            token: Some(&token),
        });
        out.push(("push", push.map(|p| format!("{p:?}"))));
        let pair = MergeBackRequest {
            edit_dir: &self.edit,
            edit_branch: EDIT,
            task_dir: &self.task,
            task_branch: TASK,
            journal: None,
        };
        let mb = g.merge_back_diff(&pair).map(|d| format!("{d:?}"));
        out.push(("merge-back diff", mb.map_err(merge_err)));
        let mb = g.merge_back(&pair, MergeStrategy::Merge);
        out.push((
            "merge-back",
            mb.map(|r| format!("{r:?}")).map_err(merge_err),
        ));
        out.extend(self.evict_and_restore(&g));
        out.push(("measure", g.measure(&self.edit).map(|n| n.to_string())));
        out
    }

    /// Eviction's save, then (when it saved) the restore into a fresh directory.
    fn evict_and_restore(&self, g: &Git2Adapter) -> Vec<(&'static str, Result<String, GitError>)> {
        std::fs::write(self.edit.join("unsaved.txt"), "unsaved\n").unwrap();
        let store = self.fx.path("saved/edit");
        let saved = g.save_work(&SaveWorkRequest {
            workspace_dir: &self.edit,
            cache_dir: &self.cache,
            store_dir: &store,
            ignored_budget_bytes: 1 << 20,
            base_commit: &self.fx.main,
            message: "grove: saved work",
        });
        let mut out = vec![("save", saved.clone().map(|s| format!("{s:?}")))];
        if let Ok(report) = saved {
            let restored = self.fx.path("workspaces/restored");
            let work = report.saved.as_ref().map(|s| s.commit.clone());
            let r = g.restore_checkout(&RestoreRequest {
                cache_dir: &self.cache,
                workspace_dir: &restored,
                base_ref: "main",
                base_commit: &self.fx.main,
                branch: Some(EDIT),
                head_commit: &report.head_commit,
                work_commit: work.as_deref(),
                upstream_url: "https://example.invalid/acme/repo.git",
                store_dir: Some(&store),
            });
            out.push(("restore", r.map(|r| format!("{r:?}"))));
        }
        out
    }

    /// The checks every attack ends with.
    fn assert_host_untouched(
        &self,
        before: &[(PathBuf, Vec<u8>)],
        results: &[(&str, Result<String, GitError>)],
    ) {
        let ran: Vec<_> = std::fs::read_dir(&self.markers).unwrap().collect();
        assert!(ran.is_empty(), "a planted program ran: {results:?}");
        assert_eq!(self.host_state(), before, "the host directory changed");
        for (name, r) in results {
            let text = format!("{r:?}");
            assert!(!text.contains(SECRET), "{name} returned host data: {text}");
            assert!(!text.contains(TOKEN), "{name} leaked the token: {text}");
        }
        assert_eq!(
            self.listener.hits.load(Ordering::SeqCst),
            0,
            "the hijack URL was contacted"
        );
    }
}

fn merge_err(e: grove_core::merge_back::MergeBackError) -> GitError {
    GitError::Other(format!("{e:?}"))
}

fn ok<'a>(results: &'a [(&str, Result<String, GitError>)], name: &str) -> &'a str {
    let (_, r) = results.iter().find(|(n, _)| *n == name).unwrap();
    r.as_deref()
        .unwrap_or_else(|e| panic!("{name} failed: {e:?}"))
}

/// Runs one config attack: every entry point works as if the keys were absent.
fn config_attack(setup: impl FnOnce(&Scene)) {
    let s = Scene::new();
    setup(&s);
    let before = s.host_state();
    let results = s.every_entry_point();
    s.assert_host_untouched(&before, &results);
    for name in [
        "status",
        "diff head",
        "diff base",
        "log",
        "commit",
        "push",
        "save",
        "restore",
    ] {
        ok(&results, name);
    }
    assert!(!ok(&results, "status").contains("secret.txt"));
    // The push reached the recorded remote, and only it.
    let pushed = git(&s.remote, &["rev-parse", &format!("refs/heads/{EDIT}")]);
    assert!(ok(&results, "push").contains(&pushed));
    assert!(!ok(&results, "commit").contains(SECRET));
}

#[test]
fn core_worktree_pointing_at_a_host_directory_is_ignored() {
    config_attack(|s| s.set("core.worktree", s.host.to_str().unwrap()));
}

#[test]
fn hooks_in_hookspath_and_in_the_git_dir_never_run() {
    config_attack(|s| {
        let hooks = s.fx.path("hooks");
        s.plant_hooks(&hooks);
        s.set("core.hooksPath", hooks.to_str().unwrap());
        for ws in [&s.edit, &s.task] {
            s.plant_hooks(&ws.join(".git/hooks"));
        }
    });
}

#[test]
fn an_fsmonitor_program_never_runs() {
    config_attack(|s| s.set("core.fsmonitor", s.evil.to_str().unwrap()));
}

#[test]
fn clean_and_smudge_filters_never_run() {
    config_attack(|s| {
        let evil = s.evil.to_str().unwrap();
        s.set("filter.evil.clean", evil);
        s.set("filter.evil.smudge", evil);
        s.set("filter.evil.process", evil);
        s.set("filter.evil.required", "true");
        for ws in [&s.edit, &s.task] {
            std::fs::write(ws.join(".gitattributes"), "* filter=evil\n").unwrap();
        }
    });
}

#[test]
fn a_diff_textconv_or_external_diff_never_runs() {
    config_attack(|s| {
        s.set("diff.evil.textconv", s.evil.to_str().unwrap());
        s.set("diff.external", s.evil.to_str().unwrap());
        for ws in [&s.edit, &s.task] {
            std::fs::write(ws.join(".gitattributes"), "* diff=evil\n").unwrap();
        }
    });
}

#[test]
fn an_included_host_file_is_never_honoured() {
    config_attack(|s| {
        s.set(
            "include.path",
            s.host.join("included.cfg").to_str().unwrap(),
        );
        let cond = format!("includeIf.gitdir:{}/.path", s.fx.root.path().display());
        s.set(&cond, s.host.join("included.cfg").to_str().unwrap());
    });
}

#[test]
fn an_included_file_that_does_not_parse_is_refused_without_its_content() {
    let s = Scene::new();
    std::fs::write(s.host.join("shadow"), format!("{SECRET}:x:0:0\n")).unwrap();
    git(
        &s.edit,
        &[
            "config",
            "include.path",
            s.host.join("shadow").to_str().unwrap(),
        ],
    );
    let before = s.host_state();
    let results = s.every_entry_point();
    s.assert_host_untouched(&before, &results);
    let (_, r) = results.iter().find(|(n, _)| *n == "status").unwrap();
    assert!(matches!(r, Err(GitError::Untrusted(_))), "{r:?}");
}

#[test]
fn excludes_and_attributes_files_on_the_host_are_never_read() {
    config_attack(|s| {
        std::fs::write(s.host.join("attributes"), "* filter=evil diff=evil\n").unwrap();
        s.set(
            "core.attributesFile",
            s.host.join("attributes").to_str().unwrap(),
        );
        s.set(
            "core.excludesFile",
            s.host.join("secret.txt").to_str().unwrap(),
        );
        s.set("filter.evil.clean", s.evil.to_str().unwrap());
    });
}

#[test]
fn remote_urls_and_insteadof_never_redirect_a_push() {
    config_attack(|s| {
        let hijack = &s.listener.url;
        s.set("remote.origin.url", hijack);
        s.set("remote.origin.pushurl", hijack);
        s.set(&format!("url.{hijack}.insteadOf"), "file://");
        s.set(&format!("url.{hijack}.pushInsteadOf"), "file://");
        s.set("http.proxy", hijack);
        s.set("credential.helper", s.evil.to_str().unwrap());
    });
}

#[test]
fn alternates_naming_another_tenants_objects_are_not_followed() {
    let s = Scene::new();
    // Another tenant's private cache, holding a commit the agent knows the id of.
    let other = Fixture::new();
    let private = other.commit_on_main("private.txt", &format!("{SECRET}\n"));
    let other_cache = other.cache();
    let alternates = s.edit.join(".git/objects/info/alternates");
    std::fs::write(&alternates, format!("{}/objects\n", other_cache.display())).unwrap();
    let before = s.host_state();
    let g = Git2Adapter::new();
    let d = g.diff(&s.edit, &DiffAgainst::Ref(private.clone()), &[], 1 << 20);
    assert!(matches!(d, Err(GitError::RefNotFound(_))), "{d:?}");
    // The workspace's own history (through the recorded cache) still reads.
    let status = g.status(&s.edit).unwrap();
    assert_eq!(status.head.as_deref(), Some(s.fx.main.as_str()));
    let results = s.every_entry_point();
    s.assert_host_untouched(&before, &results);
    ok(&results, "log");
}

/// Replaces the edit workspace's `.git` with `shape`, then checks every workspace entry
/// point refuses with a typed error and changes nothing anywhere.
fn git_dir_shape_attack(shape: impl FnOnce(&Scene, &Path)) {
    let s = Scene::new();
    let real = s.fx.path("moved-git");
    std::fs::rename(s.edit.join(".git"), &real).unwrap();
    shape(&s, &real);
    let before_real = list_files(&real);
    let before = s.host_state();
    let results = s.every_entry_point();
    s.assert_host_untouched(&before, &results);
    for name in [
        "is_dirty",
        "status",
        "diff head",
        "log",
        "commit",
        "push",
        "save",
    ] {
        let (_, r) = results.iter().find(|(n, _)| *n == name).unwrap();
        assert!(matches!(r, Err(GitError::Untrusted(_))), "{name}: {r:?}");
    }
    let (_, mb) = results.iter().find(|(n, _)| *n == "merge-back").unwrap();
    assert!(
        mb.is_err(),
        "merge-back into a redirected workspace: {mb:?}"
    );
    assert_eq!(
        list_files(&real),
        before_real,
        "the redirected git dir changed"
    );
}

#[test]
fn a_git_file_naming_another_git_dir_is_refused() {
    git_dir_shape_attack(|s, real| {
        std::fs::write(s.edit.join(".git"), format!("gitdir: {}\n", real.display())).unwrap();
    });
}

#[test]
fn a_git_symlink_is_refused() {
    git_dir_shape_attack(|s, real| {
        std::os::unix::fs::symlink(real, s.edit.join(".git")).unwrap();
    });
}

#[test]
fn a_commondir_redirect_is_refused() {
    let s = Scene::new();
    std::fs::write(
        s.edit.join(".git/commondir"),
        format!("{}\n", s.task.join(".git").display()),
    )
    .unwrap();
    let r = Git2Adapter::new().status(&s.edit);
    assert!(matches!(r, Err(GitError::Untrusted(_))), "{r:?}");
}

#[test]
fn measuring_a_workspace_never_follows_a_symlink_out() {
    let s = Scene::new();
    let g = Git2Adapter::new();
    let before = g.measure(&s.edit).unwrap();
    std::fs::write(s.host.join("big.bin"), vec![0u8; 1 << 20]).unwrap();
    std::os::unix::fs::symlink(&s.host, s.edit.join("host-link")).unwrap();
    let after = g.measure(&s.edit).unwrap();
    let link_len = s.host.as_os_str().len() as i64;
    assert_eq!(after, before + link_len);
}
