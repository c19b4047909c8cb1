//! Tests of workspace checkouts: branch/detached forms, alternates isolation from the
//! cache, ref resolution, leftovers, dirtiness and removal.

use grove_core::error::GitError;
use grove_core::ports::GitPort;
use grove_git::{dir_size_bytes, Git2Adapter};

use crate::support::{git, git_cmd, list_files, partial_siblings, Fixture};

#[test]
fn an_edit_checkout_is_on_its_branch_and_commits_made_in_it_stay_out_of_the_cache() {
    let fx = Fixture::new();
    let cache = fx.cache();
    let ws = fx.path("workspaces/edit-1");
    let adapter = Git2Adapter::new();
    let cache_objects_before = list_files(&cache.join("objects"));

    let report = adapter
        .create_checkout(&fx.request(&cache, &ws, "main", Some("grove/conv-1")))
        .unwrap();
    assert_eq!(report.base_commit, fx.main);
    assert_eq!(report.size_bytes, dir_size_bytes(&ws).unwrap());
    assert!(partial_siblings(&ws).is_empty());

    // The branch is checked out at the base commit, with the base's files.
    assert_eq!(
        git(&ws, &["symbolic-ref", "HEAD"]),
        "refs/heads/grove/conv-1"
    );
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), fx.main);
    assert_eq!(
        std::fs::read_to_string(ws.join("README.md")).unwrap(),
        "hello again\n"
    );
    assert_eq!(git(&ws, &["status", "--porcelain"]), "");
    assert!(!adapter.is_dirty(&ws).unwrap());
    assert_eq!(git(&ws, &["rev-parse", "origin/main"]), fx.main);
    assert_eq!(
        git(&ws, &["config", "remote.origin.url"]),
        "https://example.invalid/acme/repo.git"
    );
    // The workspace reads history through alternates; it has no objects of its own.
    assert_eq!(
        std::fs::read_to_string(ws.join(".git/objects/info/alternates"))
            .unwrap()
            .trim(),
        std::path::absolute(cache.join("objects"))
            .unwrap()
            .to_string_lossy()
    );
    assert_eq!(git(&ws, &["log", "--format=%s", "-1", "HEAD~1"]), "first");
    git(&ws, &["fsck", "--connectivity-only"]);

    // An edit makes it dirty; diff against the base works.
    std::fs::write(ws.join("src/lib.rs"), "pub fn f() { todo!() }\n").unwrap();
    assert!(adapter.is_dirty(&ws).unwrap());
    assert!(git(&ws, &["diff", "origin/main", "--stat"]).contains("src/lib.rs"));

    // Commit with the git CLI, relying on the workspace's own user config.
    git(&ws, &["add", "-A"]);
    git(&ws, &["commit", "-q", "-m", "agent change"]);
    assert!(!adapter.is_dirty(&ws).unwrap());
    assert_eq!(
        git(&ws, &["log", "-1", "--format=%an <%ae>"]),
        "grove agent <agent@grove.invalid>"
    );
    assert_eq!(git(&ws, &["rev-parse", "HEAD~1"]), fx.main);

    // The cache did not receive the workspace's objects, index or HEAD.
    assert_eq!(list_files(&cache.join("objects")), cache_objects_before);
    assert!(!cache.join("index").exists());
    assert!(!cache.join("worktrees").exists());
    assert_eq!(git(&cache, &["symbolic-ref", "HEAD"]), "refs/heads/main");
    assert_eq!(git(&cache, &["rev-parse", "refs/heads/main"]), fx.main);
    let new_head = git(&ws, &["rev-parse", "HEAD"]);
    let out = git_cmd(&cache)
        .args(["cat-file", "-e", &new_head])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the new commit is not in the cache");
}

#[test]
fn an_analysis_checkout_is_detached_at_the_base_commit() {
    let fx = Fixture::new();
    let cache = fx.cache();
    let ws = fx.path("workspaces/analysis");
    let report = Git2Adapter::new()
        .create_checkout(&fx.request(&cache, &ws, "feature", None))
        .unwrap();
    assert_eq!(report.base_commit, fx.feature);
    let out = git_cmd(&ws)
        .args(["symbolic-ref", "-q", "HEAD"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "HEAD is detached");
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), fx.feature);
    assert_eq!(git(&ws, &["rev-parse", "origin/feature"]), fx.feature);
    assert!(ws.join("feature.txt").exists());
    assert_eq!(git(&ws, &["status", "--porcelain"]), "");
    assert_eq!(git(&ws, &["branch", "--show-current"]), "");
}

#[test]
fn an_unknown_base_ref_is_ref_not_found_and_leaves_no_directory_behind() {
    let fx = Fixture::new();
    let cache = fx.cache();
    let adapter = Git2Adapter::new();
    for bad in [
        "no-such-branch",
        "main~1",
        "HEAD",
        "0000000",
        "v1^{tree}",
        "",
        "../main",
    ] {
        let ws = fx.path("workspaces/bad");
        let err = adapter
            .create_checkout(&fx.request(&cache, &ws, bad, Some("b")))
            .unwrap_err();
        assert_eq!(err, GitError::RefNotFound(bad.to_string()), "{bad:?}");
        assert!(!ws.exists(), "{bad:?}");
        assert!(partial_siblings(&ws).is_empty(), "{bad:?}");
    }
}

#[test]
fn a_leftover_directory_at_the_workspace_path_is_replaced_by_a_fresh_checkout() {
    let fx = Fixture::new();
    let cache = fx.cache();
    let ws = fx.path("workspaces/edit-2");
    std::fs::create_dir_all(ws.join("half/done")).unwrap();
    std::fs::write(ws.join("half/done/file"), "from a crashed attempt").unwrap();
    std::fs::create_dir_all(fx.path("workspaces/.edit-2.partial-0123")).unwrap();

    let adapter = Git2Adapter::new();
    adapter
        .create_checkout(&fx.request(&cache, &ws, "main", Some("b")))
        .unwrap();
    assert!(!ws.join("half").exists());
    assert!(partial_siblings(&ws).is_empty());
    assert_eq!(git(&ws, &["status", "--porcelain"]), "");

    // Doing it again over a complete checkout (a redelivered job) also works.
    std::fs::write(ws.join("scratch.txt"), "x").unwrap();
    adapter
        .create_checkout(&fx.request(&cache, &ws, "main", Some("b")))
        .unwrap();
    assert!(!ws.join("scratch.txt").exists());
    assert!(!adapter.is_dirty(&ws).unwrap());
}

#[test]
fn a_checkout_from_a_tag_starts_at_the_tagged_commit() {
    let fx = Fixture::new();
    let cache = fx.cache();
    let ws = fx.path("workspaces/tag");
    let report = Git2Adapter::new()
        .create_checkout(&fx.request(&cache, &ws, "v1", Some("from-tag")))
        .unwrap();
    assert_eq!(report.base_commit, fx.first);
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), fx.first);
    assert_eq!(git(&ws, &["symbolic-ref", "HEAD"]), "refs/heads/from-tag");
    assert_eq!(
        std::fs::read_to_string(ws.join("README.md")).unwrap(),
        "hello\n"
    );
    // A tag is not a branch: no origin/<tag> ref is made.
    let out = git_cmd(&ws)
        .args(["rev-parse", "-q", "--verify", "refs/remotes/origin/v1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn a_checkout_from_a_full_or_abbreviated_commit_id_works() {
    let fx = Fixture::new();
    let cache = fx.cache();
    let adapter = Git2Adapter::new();

    let ws = fx.path("workspaces/full");
    let report = adapter
        .create_checkout(&fx.request(&cache, &ws, &fx.first, None))
        .unwrap();
    assert_eq!(report.base_commit, fx.first);
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), fx.first);

    let short = &fx.feature[..10];
    let ws = fx.path("workspaces/short");
    let report = adapter
        .create_checkout(&fx.request(&cache, &ws, short, Some("from-sha")))
        .unwrap();
    assert_eq!(report.base_commit, fx.feature);
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), fx.feature);
    assert!(ws.join("feature.txt").exists());
}

#[test]
fn a_full_branch_ref_name_resolves_like_the_short_name() {
    let fx = Fixture::new();
    let cache = fx.cache();
    let ws = fx.path("workspaces/full-ref");
    let report = Git2Adapter::new()
        .create_checkout(&fx.request(&cache, &ws, "refs/heads/feature", None))
        .unwrap();
    assert_eq!(report.base_commit, fx.feature);
    assert_eq!(git(&ws, &["rev-parse", "origin/feature"]), fx.feature);
}

#[test]
fn is_dirty_sees_staged_deleted_and_untracked_files_but_not_ignored_ones() {
    let fx = Fixture::new();
    let cache = fx.cache();
    let ws = fx.path("workspaces/dirty");
    let adapter = Git2Adapter::new();
    adapter
        .create_checkout(&fx.request(&cache, &ws, "main", Some("b")))
        .unwrap();

    std::fs::write(ws.join("build.log"), "ignored").unwrap();
    assert!(
        !adapter.is_dirty(&ws).unwrap(),
        "ignored files are not dirt"
    );

    std::fs::create_dir_all(ws.join("newdir/deeper")).unwrap();
    std::fs::write(ws.join("newdir/deeper/new.txt"), "x").unwrap();
    assert!(adapter.is_dirty(&ws).unwrap(), "untracked");
    std::fs::remove_dir_all(ws.join("newdir")).unwrap();
    assert!(!adapter.is_dirty(&ws).unwrap());

    std::fs::remove_file(ws.join("README.md")).unwrap();
    assert!(adapter.is_dirty(&ws).unwrap(), "deleted");
    git(&ws, &["checkout", "--", "README.md"]);
    assert!(!adapter.is_dirty(&ws).unwrap());

    std::fs::write(ws.join("README.md"), "changed\n").unwrap();
    git(&ws, &["add", "README.md"]);
    std::fs::write(ws.join("README.md"), "hello again\n").unwrap();
    assert!(adapter.is_dirty(&ws).unwrap(), "staged");

    assert!(adapter.is_dirty(&fx.path("workspaces/absent")).is_err());
}

#[test]
fn removing_a_checkout_is_idempotent_and_leaves_the_cache_intact() {
    let fx = Fixture::new();
    let cache = fx.cache();
    let cache_files = list_files(&cache);
    let ws = fx.path("workspaces/gone");
    let adapter = Git2Adapter::new();
    adapter
        .create_checkout(&fx.request(&cache, &ws, "main", Some("b")))
        .unwrap();
    // Read-only directories (as Go's module cache makes) do not block removal.
    std::fs::create_dir_all(ws.join("ro/inner")).unwrap();
    std::fs::write(ws.join("ro/inner/f"), "x").unwrap();
    set_mode(&ws.join("ro/inner"), 0o555);
    set_mode(&ws.join("ro"), 0o555);

    adapter.remove_checkout(&ws).unwrap();
    assert!(!ws.exists());
    adapter.remove_checkout(&ws).unwrap();
    assert_eq!(list_files(&cache), cache_files);
    git(&cache, &["fsck", "--connectivity-only"]);
}

#[test]
fn remove_checkout_refuses_to_delete_a_bare_repository() {
    let fx = Fixture::new();
    let cache = fx.cache();
    let err = Git2Adapter::new().remove_checkout(&cache).unwrap_err();
    assert!(matches!(err, GitError::Other(_)), "{err:?}");
    assert!(cache.join("objects").exists());
}

#[test]
fn a_missing_cache_is_an_error_not_a_panic() {
    let fx = Fixture::new();
    let ws = fx.path("workspaces/x");
    let missing = fx.path("caches/none.git");
    let err = Git2Adapter::new()
        .create_checkout(&fx.request(&missing, &ws, "main", None))
        .unwrap_err();
    assert!(matches!(err, GitError::Other(_)), "{err:?}");
    assert!(!ws.exists());
}

fn set_mode(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}
