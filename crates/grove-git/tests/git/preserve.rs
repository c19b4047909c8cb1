//! Saving a workspace's work into the cache and restoring it byte-identical.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use grove_core::ports::{GitPort, RestoreRequest, SaveWorkRequest};
use grove_git::Git2Adapter;

use crate::support::{git, Fixture};

/// Every file under `dir` outside `.git`, with its bytes and mode (symlinks: target).
fn snapshot(dir: &Path) -> BTreeMap<String, (Vec<u8>, u32)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let rel = path
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .to_string();
            if rel == ".git" {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(
                    rel,
                    (target.to_string_lossy().as_bytes().to_vec(), 0o120000),
                );
            } else {
                out.insert(
                    rel,
                    (
                        std::fs::read(&path).unwrap(),
                        meta.permissions().mode() & 0o111,
                    ),
                );
            }
        }
    }
    out
}

#[test]
fn dirty_work_and_local_commits_are_saved_in_the_cache_and_restored_byte_identical() {
    let fx = Fixture::new();
    let cache = fx.cache();
    let ws = fx.path("ws/edit");
    let adapter = Git2Adapter::new();
    adapter
        .create_checkout(&fx.request(&cache, &ws, "main", Some("agent/edits-c1")))
        .unwrap();
    // A local commit the cache does not have.
    std::fs::write(ws.join("committed.txt"), "local commit\n").unwrap();
    git(&ws, &["add", "committed.txt"]);
    git(&ws, &["commit", "-q", "-m", "agent commit"]);
    let local_head = git(&ws, &["rev-parse", "HEAD"]);
    // Uncommitted: a modified tracked file, a deleted one, a staged new file, an
    // untracked binary file in a new directory, an executable, a symlink, an ignored file.
    std::fs::write(ws.join("README.md"), "changed by the agent\n").unwrap();
    std::fs::remove_file(ws.join("src/lib.rs")).unwrap();
    std::fs::write(ws.join("staged.txt"), "staged\n").unwrap();
    git(&ws, &["add", "staged.txt"]);
    std::fs::create_dir_all(ws.join("assets/bin")).unwrap();
    let binary: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 256) as u8).collect();
    std::fs::write(ws.join("assets/bin/blob.dat"), &binary).unwrap();
    std::fs::write(ws.join(".hidden"), "dot file\n").unwrap();
    std::fs::write(ws.join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(ws.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("README.md", ws.join("link")).unwrap();
    std::fs::write(ws.join("debug.log"), "ignored\n").unwrap();
    let status_before = git(&ws, &["status", "--porcelain"]);
    let index_before = std::fs::read(ws.join(".git/index")).unwrap();

    let patch = fx.path("saved/ws.patch");
    let report = adapter
        .save_work(&SaveWorkRequest {
            workspace_dir: &ws,
            cache_dir: &cache,
            ref_name: "refs/grove/saved/w1",
            patch_path: &patch,
            base_commit: &fx.main,
            message: "grove: saved work",
        })
        .unwrap();
    assert!(report.dirty);
    assert_eq!(report.head_commit, local_head);
    let saved = report.saved.expect("saved");
    assert_eq!(saved.head_commit, local_head);
    assert_ne!(saved.commit, local_head);
    // The workspace is untouched by saving.
    assert_eq!(git(&ws, &["status", "--porcelain"]), status_before);
    assert_eq!(std::fs::read(ws.join(".git/index")).unwrap(), index_before);
    // The cache has the ref and the whole history it needs, on its own.
    assert_eq!(
        git(&cache, &["rev-parse", "refs/grove/saved/w1"]),
        saved.commit
    );
    assert_eq!(
        git(&cache, &["rev-parse", "refs/grove/saved/w1^"]),
        local_head
    );
    git(&cache, &["fsck", "--no-dangling", "--connectivity-only"]);
    let tree = git(
        &cache,
        &["ls-tree", "-r", "--name-only", "refs/grove/saved/w1"],
    );
    assert!(tree.contains("assets/bin/blob.dat") && tree.contains("committed.txt"));
    assert!(!tree.contains("debug.log"), "ignored files are not saved");
    assert!(!tree.contains("src/lib.rs"), "the deletion is saved");
    // The patch is binary-safe and applies to the saved HEAD.
    let patch_bytes = std::fs::read(&patch).unwrap();
    assert!(String::from_utf8_lossy(&patch_bytes).contains("GIT binary patch"));
    let check = fx.path("check");
    git(
        fx.root.path(),
        &[
            "clone",
            "-q",
            cache.to_str().unwrap(),
            check.to_str().unwrap(),
        ],
    );
    git(&check, &["checkout", "-q", &local_head]);
    git(&check, &["apply", "--index", patch.to_str().unwrap()]);
    assert_eq!(
        git(&check, &["write-tree"]),
        git(&cache, &["rev-parse", "refs/grove/saved/w1^{tree}"])
    );

    let mut expected = snapshot(&ws);
    expected.remove("debug.log");
    std::fs::remove_dir_all(&ws).unwrap();
    adapter
        .restore_checkout(&RestoreRequest {
            cache_dir: &cache,
            workspace_dir: &ws,
            base_ref: "main",
            base_commit: &fx.main,
            branch: Some("agent/edits-c1"),
            head_commit: &saved.head_commit,
            work_commit: Some(&saved.commit),
            upstream_url: "https://example.invalid/acme/repo.git",
        })
        .unwrap();
    assert_eq!(
        snapshot(&ws),
        expected,
        "files are byte-identical, modes included"
    );
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), local_head);
    assert_eq!(
        git(&ws, &["rev-parse", "--abbrev-ref", "HEAD"]),
        "agent/edits-c1"
    );
    assert_eq!(git(&ws, &["rev-parse", "origin/main"]), fx.main);
    let status_after = git(&ws, &["status", "--porcelain"]);
    // The staged file comes back as untracked: the index is HEAD's.
    assert!(status_after.contains("?? staged.txt"), "{status_after}");
    assert!(status_after.contains("M README.md"), "{status_after}");
    assert!(status_after.contains(" D src/lib.rs"), "{status_after}");
    assert!(status_after.contains("?? assets/"), "{status_after}");
    assert!(adapter.is_dirty(&ws).unwrap());
    // Restoring over an existing directory is refused.
    let again = adapter.restore_checkout(&RestoreRequest {
        cache_dir: &cache,
        workspace_dir: &ws,
        base_ref: "main",
        base_commit: &fx.main,
        branch: Some("agent/edits-c1"),
        head_commit: &saved.head_commit,
        work_commit: Some(&saved.commit),
        upstream_url: "https://example.invalid/acme/repo.git",
    });
    assert!(again.is_err());
    // Discarding removes the ref and the patch.
    adapter
        .discard_saved_work(&cache, "refs/grove/saved/w1", &patch)
        .unwrap();
    assert!(!patch.exists());
    let refs = git(&cache, &["for-each-ref", "refs/grove"]);
    assert_eq!(refs, "");
}

#[test]
fn a_clean_workspace_at_its_base_saves_nothing_and_local_commits_alone_are_kept() {
    let fx = Fixture::new();
    let cache = fx.cache();
    let ws = fx.path("ws/task");
    let adapter = Git2Adapter::new();
    adapter
        .create_checkout(&fx.request(&cache, &ws, "main", Some("agent/task-t1")))
        .unwrap();
    let patch = fx.path("saved/t.patch");
    let req = SaveWorkRequest {
        workspace_dir: &ws,
        cache_dir: &cache,
        ref_name: "refs/grove/saved/t1",
        patch_path: &patch,
        base_commit: &fx.main,
        message: "grove: saved work",
    };
    let report = adapter.save_work(&req).unwrap();
    assert!(!report.dirty);
    assert_eq!(report.saved, None);
    assert_eq!(git(&cache, &["for-each-ref", "refs/grove"]), "");

    std::fs::write(ws.join("new.txt"), "n\n").unwrap();
    git(&ws, &["add", "new.txt"]);
    git(&ws, &["commit", "-q", "-m", "local"]);
    let head = git(&ws, &["rev-parse", "HEAD"]);
    let report = adapter.save_work(&req).unwrap();
    assert!(!report.dirty);
    let saved = report.saved.expect("local commits are saved");
    assert_eq!(
        (saved.commit.as_str(), saved.head_commit.as_str()),
        (head.as_str(), head.as_str())
    );
    assert_eq!(saved.patch_path, None);
    assert!(!patch.exists());
    assert_eq!(git(&cache, &["rev-parse", "refs/grove/saved/t1"]), head);

    std::fs::remove_dir_all(&ws).unwrap();
    adapter
        .restore_checkout(&RestoreRequest {
            cache_dir: &cache,
            workspace_dir: &ws,
            base_ref: "main",
            base_commit: &fx.main,
            branch: Some("agent/task-t1"),
            head_commit: &saved.head_commit,
            work_commit: None,
            upstream_url: "https://example.invalid/acme/repo.git",
        })
        .unwrap();
    assert_eq!(git(&ws, &["status", "--porcelain"]), "");
    assert_eq!(std::fs::read_to_string(ws.join("new.txt")).unwrap(), "n\n");
}

#[test]
fn remove_trash_refuses_a_path_outside_a_trash_directory() {
    let fx = Fixture::new();
    let cache = fx.cache();
    assert!(Git2Adapter::new().remove_trash(&cache).is_err());
    assert!(cache.is_dir());
    let trash = fx.path("trash/cache-1");
    std::fs::create_dir_all(fx.path("trash")).unwrap();
    std::fs::rename(&cache, &trash).unwrap();
    Git2Adapter::new().remove_trash(&trash).unwrap();
    assert!(!trash.exists());
}
