//! Saving a workspace's whole state into a private store and restoring it identical:
//! branches, tags, stash, HEAD state, staged vs unstaged, untracked and ignored files,
//! modes and symlinks.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use grove_core::model::SavedWork;
use grove_core::ports::{GitPort, RestoreRequest, SaveWorkRequest};
use grove_git::Git2Adapter;

use crate::support::{git, git_cmd, Fixture};

/// Everything a workspace is, as text: files (bytes, exec bit, symlink targets; `.git`
/// left out), HEAD, refs, the stash list, the index and status with ignored files.
pub fn state(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .to_string();
            if rel == ".git" {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let v = if meta.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                stack.push(path.clone());
                continue;
            } else {
                let bytes = std::fs::read(&path).unwrap();
                format!("file {:o} {:?}", meta.permissions().mode() & 0o111, bytes)
            };
            out.insert(format!("path {rel}"), v);
        }
    }
    let head = git_cmd(dir)
        .args(["symbolic-ref", "-q", "HEAD"])
        .output()
        .unwrap();
    out.insert(
        "HEAD".into(),
        format!(
            "{} {}",
            String::from_utf8_lossy(&head.stdout).trim(),
            git(dir, &["rev-parse", "HEAD"])
        ),
    );
    for (k, args) in [
        (
            "refs",
            vec!["for-each-ref", "--format=%(refname) %(objectname)"],
        ),
        ("stash", vec!["stash", "list", "--format=%H %gs"]),
        ("index", vec!["ls-files", "-s"]),
        (
            "status",
            vec!["status", "--porcelain", "--ignored", "-uall"],
        ),
    ] {
        out.insert(k.into(), git(dir, &args));
    }
    out
}

/// A workspace on its branch with a second branch, a tag, two stash entries, staged
/// and unstaged edits, untracked and ignored files, an executable and a symlink.
pub fn busy_workspace(fx: &Fixture, cache: &Path, ws: &Path) {
    Git2Adapter::new()
        .create_checkout(&fx.request(cache, ws, "main", Some("agent/edits-c1")))
        .unwrap();
    let w = |p: &str, c: &str| {
        std::fs::create_dir_all(ws.join(p).parent().unwrap()).unwrap();
        std::fs::write(ws.join(p), c).unwrap();
    };
    w("committed.txt", "on the branch\n");
    git(ws, &["add", "committed.txt"]);
    git(ws, &["commit", "-q", "-m", "agent commit"]);
    git(ws, &["branch", "side"]);
    git(ws, &["checkout", "-q", "side"]);
    w("side.txt", "side work\n");
    git(ws, &["add", "side.txt"]);
    git(ws, &["commit", "-q", "-m", "side commit"]);
    git(ws, &["tag", "-a", "agent-v1", "-m", "agent tag"]);
    git(ws, &["tag", "light"]);
    git(ws, &["checkout", "-q", "agent/edits-c1"]);
    w("README.md", "stashed once\n");
    git(ws, &["stash", "push", "-q", "-m", "first stash"]);
    w("src/lib.rs", "stashed twice\n");
    git(ws, &["stash", "push", "-q", "-m", "second stash"]);
    w("README.md", "staged version\n");
    git(ws, &["add", "README.md"]);
    w("README.md", "unstaged on top\n");
    w("staged-new.txt", "staged new\n");
    git(ws, &["add", "staged-new.txt"]);
    std::fs::remove_file(ws.join("src/lib.rs")).unwrap();
    w("untracked/deep/file.bin", "\u{0}\u{1}binary\u{ff}");
    w("debug.log", "ignored but kept\n");
    w("run.sh", "#!/bin/sh\necho hi\n");
    std::fs::set_permissions(ws.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("README.md", ws.join("link")).unwrap();
}

fn save(cache: &Path, ws: &Path, store: &Path, budget: u64) -> grove_core::ports::SaveWorkReport {
    Git2Adapter::new()
        .save_work(&SaveWorkRequest {
            workspace_dir: ws,
            cache_dir: cache,
            store_dir: store,
            ignored_budget_bytes: budget,
            base_commit: "0000000000000000000000000000000000000000",
            message: "grove: saved",
        })
        .unwrap()
}

fn restore(fx: &Fixture, cache: &Path, ws: &Path, store: &Path, saved: &SavedWork) {
    Git2Adapter::new()
        .restore_checkout(&RestoreRequest {
            cache_dir: cache,
            workspace_dir: ws,
            base_ref: "main",
            base_commit: &fx.main,
            branch: Some("agent/edits-c1"),
            head_commit: &saved.head_commit,
            work_commit: Some(&saved.commit),
            upstream_url: "https://example.invalid/acme/repo.git",
            store_dir: Some(store),
        })
        .unwrap();
}

#[test]
fn everything_an_agent_made_is_saved_privately_and_restored_identical() {
    let fx = Fixture::new();
    let cache = fx.cache();
    let ws = fx.path("ws/edit");
    busy_workspace(&fx, &cache, &ws);
    let before = state(&ws);
    let index_bytes = std::fs::read(ws.join(".git/index")).unwrap();
    let objects_before = crate::support::list_files(&ws.join(".git/objects"));
    let cache_objects = crate::support::list_files(&cache.join("objects"));
    let store = fx.path("home/saved/u/ws1");

    let report = save(&cache, &ws, &store, 1 << 20);
    assert!(report.dirty);
    assert!(
        report.omitted.iter().all(|o| !o.contains("debug.log")),
        "{:?}",
        report.omitted
    );
    let saved = report.saved.expect("saved");
    assert!(!saved.in_cache());
    // Saving wrote nothing into the workspace or the shared cache.
    assert_eq!(state(&ws), before);
    assert_eq!(std::fs::read(ws.join(".git/index")).unwrap(), index_bytes);
    assert_eq!(
        crate::support::list_files(&ws.join(".git/objects")),
        objects_before
    );
    assert_eq!(
        crate::support::list_files(&cache.join("objects")),
        cache_objects
    );
    assert_eq!(git(&cache, &["for-each-ref", "refs/grove"]), "");
    // The store is private.
    for dir in [&store, store.parent().unwrap()] {
        let mode = std::fs::metadata(dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", dir.display());
    }

    std::fs::remove_dir_all(&ws).unwrap();
    restore(&fx, &cache, &ws, &store, &saved);
    let after = state(&ws);
    for (k, v) in &before {
        assert_eq!(after.get(k), Some(v), "{k} differs after the restore");
    }
    assert_eq!(after, before);
    git(&ws, &["fsck", "--no-dangling", "--connectivity-only"]);
    // The stash still applies, and the store is not borrowed by the workspace.
    let alternates = std::fs::read_to_string(ws.join(".git/objects/info/alternates")).unwrap();
    assert!(!alternates.contains("saved"), "{alternates}");
}

#[test]
fn ignored_files_over_the_budget_are_named_and_a_detached_head_comes_back_detached() {
    let fx = Fixture::new();
    let cache = fx.cache();
    let ws = fx.path("ws/edit");
    Git2Adapter::new()
        .create_checkout(&fx.request(&cache, &ws, "main", Some("agent/edits-c1")))
        .unwrap();
    git(&ws, &["checkout", "-q", "--detach", &fx.first]);
    std::fs::write(ws.join("small.log"), "s\n").unwrap();
    std::fs::write(ws.join("zbig.log"), vec![b'x'; 4096]).unwrap();
    let store = fx.path("home/saved/u/ws2");
    let report = save(&cache, &ws, &store, 100);
    let saved = report
        .saved
        .expect("a detached HEAD and ignored files are kept");
    assert!(
        report
            .omitted
            .iter()
            .any(|o| o.contains("zbig.log") && o.contains("budget")),
        "{:?}",
        report.omitted
    );
    std::fs::remove_dir_all(&ws).unwrap();
    restore(&fx, &cache, &ws, &store, &saved);
    assert!(git(&ws, &["status"]).contains("HEAD detached"));
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), fx.first);
    assert_eq!(
        std::fs::read_to_string(ws.join("small.log")).unwrap(),
        "s\n"
    );
    assert!(!ws.join("zbig.log").exists());
}

#[test]
fn a_clean_workspace_at_its_base_saves_nothing_and_leaves_no_store() {
    let fx = Fixture::new();
    let cache = fx.cache();
    let ws = fx.path("ws/task");
    Git2Adapter::new()
        .create_checkout(&fx.request(&cache, &ws, "main", Some("agent/task-t1")))
        .unwrap();
    let store = fx.path("home/saved/u/t1");
    let report = Git2Adapter::new()
        .save_work(&SaveWorkRequest {
            workspace_dir: &ws,
            cache_dir: &cache,
            store_dir: &store,
            ignored_budget_bytes: 1 << 20,
            base_commit: &fx.main,
            message: "grove: saved",
        })
        .unwrap();
    assert_eq!((report.dirty, report.saved), (false, None));
    assert!(!store.exists());
}

#[test]
fn work_saved_in_the_cache_by_an_older_version_moves_to_a_store_and_restores() {
    let fx = Fixture::new();
    let cache = fx.cache();
    let ws = fx.path("ws/old");
    Git2Adapter::new()
        .create_checkout(&fx.request(&cache, &ws, "main", Some("agent/edits-c9")))
        .unwrap();
    std::fs::write(ws.join("secret.txt"), "uncommitted secret\n").unwrap();
    git(&ws, &["add", "secret.txt"]);
    git(
        &ws,
        &[
            "-c",
            "user.name=a",
            "-c",
            "user.email=a@b",
            "commit",
            "-q",
            "-m",
            "wip",
        ],
    );
    let work = git(&ws, &["rev-parse", "HEAD"]);
    // What an older version left: the commit and its objects in the cache, a ref to it.
    git(
        &cache,
        &[
            "fetch",
            "-q",
            ws.to_str().unwrap(),
            &format!("{work}:refs/grove/saved/w9"),
        ],
    );
    let adapter = Git2Adapter::new();
    assert_eq!(
        adapter.cache_saved_refs(&cache).unwrap(),
        vec!["refs/grove/saved/w9"]
    );
    let legacy = SavedWork {
        ref_name: "refs/grove/saved/w9".into(),
        commit: work.clone(),
        head_commit: fx.main.clone(),
        patch_path: None,
    };
    // Before the move, a restore reads the cache's ref as that version did.
    let early = fx.path("ws/early");
    adapter
        .restore_checkout(&RestoreRequest {
            cache_dir: &cache,
            workspace_dir: &early,
            base_ref: "main",
            base_commit: &fx.main,
            branch: Some("agent/edits-c9"),
            head_commit: &legacy.head_commit,
            work_commit: Some(&legacy.commit),
            upstream_url: "https://example.invalid/acme/repo.git",
            store_dir: None,
        })
        .unwrap();
    assert_eq!(git(&early, &["status", "--porcelain"]), "?? secret.txt");
    let store = fx.path("home/saved/u/w9");
    let moved = adapter
        .move_saved_out_of_cache(&cache, &legacy, Some("agent/edits-c9"), &store)
        .unwrap();
    assert!(!moved.in_cache() && moved.has_changes());
    adapter
        .drop_cache_ref(&cache, "refs/grove/saved/w9")
        .unwrap();
    assert_eq!(git(&cache, &["for-each-ref", "refs/grove"]), "");
    assert!(adapter.cache_saved_refs(&cache).unwrap().is_empty());
    std::fs::remove_dir_all(&ws).unwrap();
    restore(&fx, &cache, &ws, &store, &moved);
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), fx.main);
    assert_eq!(git(&ws, &["status", "--porcelain"]), "?? secret.txt");
    // Destroying the workspace deletes its store.
    adapter
        .discard_saved_work(&cache, "refs/grove/saved/w9", &store)
        .unwrap();
    assert!(!store.exists());
}
