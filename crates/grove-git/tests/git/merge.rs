//! Merge-back between two workspaces of one cache: fast-forward, merge commit,
//! cherry-pick, the diff, and the rule that a conflict (or a dirty target) leaves the
//! target byte-for-byte as it was — HEAD, index, files and modes, untracked files,
//! stash and object store.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use grove_core::merge_back::{MergeBackError, MergeStrategy};
use grove_core::ports::{CheckoutRequest, GitPort, MergeBackRequest};
use grove_git::Git2Adapter;

use crate::support::{git, git_as_author, list_files, Fixture};

const EDIT: &str = "agent/edits-c1";
const TASK: &str = "agent/task-t1";

/// A fixture with an edit workspace and a task workspace, both made from `main`.
struct Pair {
    _fx: Fixture,
    edit: PathBuf,
    task: PathBuf,
}

impl Pair {
    fn new() -> Self {
        let fx = Fixture::new();
        let cache = fx.cache();
        let edit = fx.path("ws/edit");
        let task = fx.path("ws/task");
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
        Self {
            _fx: fx,
            edit,
            task,
        }
    }

    fn request(&self) -> MergeBackRequest<'_> {
        MergeBackRequest {
            edit_dir: &self.edit,
            edit_branch: EDIT,
            task_dir: &self.task,
            task_branch: TASK,
            journal: None,
        }
    }

    fn merge(
        &self,
        strategy: MergeStrategy,
    ) -> Result<grove_core::merge_back::MergeBackReport, MergeBackError> {
        Git2Adapter::new().merge_back(&self.request(), strategy)
    }
}

/// Writes `files` (a `None` content deletes) and commits them in `dir` with the git CLI.
fn commit(dir: &Path, message: &str, files: &[(&str, Option<&str>)]) -> String {
    for (path, content) in files {
        let p = dir.join(path);
        match content {
            Some(c) => {
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(&p, c).unwrap();
            }
            None => std::fs::remove_file(&p).unwrap(),
        }
    }
    git(dir, &["add", "-A"]);
    git_as_author(dir, &["commit", "-q", "-m", message]);
    git(dir, &["rev-parse", "HEAD"])
}

/// Everything a caller could observe of a workspace: HEAD (symbolic and resolved), the
/// index file's bytes, every file's content and mode outside `.git` (untracked files
/// included), `git status`, the stash, and the list of files in the object store.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    head_ref: String,
    head: String,
    index: Vec<u8>,
    files: BTreeMap<PathBuf, (Vec<u8>, u32)>,
    status: String,
    stash: String,
    objects: Vec<PathBuf>,
}

fn snapshot(dir: &Path) -> Snapshot {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if path == dir.join(".git") {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else {
                files.insert(
                    path.strip_prefix(dir).unwrap().to_path_buf(),
                    (std::fs::read(&path).unwrap(), meta.permissions().mode()),
                );
            }
        }
    }
    Snapshot {
        head_ref: std::fs::read_to_string(dir.join(".git/HEAD")).unwrap(),
        head: git(dir, &["rev-parse", "HEAD"]),
        index: std::fs::read(dir.join(".git/index")).unwrap(),
        files,
        // No optional locks: a plain `git status` may refresh and rewrite the index.
        status: git(
            dir,
            &[
                "--no-optional-locks",
                "status",
                "--porcelain=v1",
                "--untracked-files=all",
            ],
        ),
        stash: git(dir, &["stash", "list", "--format=%H %s"]),
        objects: list_files(&dir.join(".git/objects")),
    }
}

/// The target can read every object its history needs from its own store and the
/// cache alone (the task's store is no alternate of it on disk).
fn assert_complete(dir: &Path) {
    git(dir, &["rev-list", "--objects", "--all", "--quiet"]);
    git(dir, &["fsck", "--connectivity-only", "--no-dangling"]);
}

#[test]
fn a_merge_of_a_task_the_target_has_not_moved_past_is_a_fast_forward() {
    let p = Pair::new();
    let one = commit(&p.task, "add notes", &[("notes.md", Some("notes\n"))]);
    let two = commit(
        &p.task,
        "change readme",
        &[("README.md", Some("task readme\n"))],
    );
    let before = git(&p.edit, &["rev-parse", "HEAD"]);

    let r = p.merge(MergeStrategy::Merge).unwrap();

    assert!(r.fast_forward && !r.up_to_date);
    assert_eq!(r.previous_head, before);
    assert_eq!(r.new_head, two);
    assert!(r.created.is_empty());
    let ids: Vec<_> = r.commits.iter().map(|c| c.id.clone()).collect();
    assert_eq!(ids, vec![one, two.clone()]);
    assert_eq!(
        r.files,
        vec!["README.md".to_string(), "notes.md".to_string()]
    );
    assert_eq!(git(&p.edit, &["rev-parse", "HEAD"]), two);
    assert_eq!(
        git(&p.edit, &["symbolic-ref", "HEAD"]),
        format!("refs/heads/{EDIT}")
    );
    assert_eq!(
        std::fs::read_to_string(p.edit.join("notes.md")).unwrap(),
        "notes\n"
    );
    assert_eq!(
        std::fs::read_to_string(p.edit.join("README.md")).unwrap(),
        "task readme\n"
    );
    assert_eq!(git(&p.edit, &["status", "--porcelain"]), "");
    assert_complete(&p.edit);
}

#[test]
fn a_merge_after_both_branches_moved_makes_a_merge_commit_with_both_heads() {
    let p = Pair::new();
    let task_head = commit(
        &p.task,
        "task file",
        &[("task.txt", Some("from the task\n"))],
    );
    let edit_head = commit(
        &p.edit,
        "edit file",
        &[("edit.txt", Some("from the edit\n"))],
    );

    let r = p.merge(MergeStrategy::Merge).unwrap();

    assert!(!r.fast_forward);
    assert_eq!(r.created.len(), 1);
    assert_eq!(r.new_head, r.created[0]);
    let parents = git(&p.edit, &["log", "-1", "--format=%P", "HEAD"]);
    assert_eq!(parents, format!("{edit_head} {task_head}"));
    let subject = git(&p.edit, &["log", "-1", "--format=%s%n%an <%ae>", "HEAD"]);
    assert_eq!(
        subject,
        format!("Merge branch '{TASK}' into {EDIT}\ngrove agent <agent@grove.invalid>")
    );
    assert_eq!(r.files, vec!["task.txt".to_string()]);
    assert_eq!(
        std::fs::read_to_string(p.edit.join("task.txt")).unwrap(),
        "from the task\n"
    );
    assert_eq!(
        std::fs::read_to_string(p.edit.join("edit.txt")).unwrap(),
        "from the edit\n"
    );
    assert_eq!(git(&p.edit, &["status", "--porcelain"]), "");
    assert_complete(&p.edit);
}

#[test]
fn a_cherry_pick_replays_each_task_commit_with_its_author_and_a_trailer() {
    let p = Pair::new();
    let a = commit(&p.task, "add a", &[("a.txt", Some("a\n"))]);
    let b = commit(&p.task, "add b\n\nwith a body", &[("b.txt", Some("b\n"))]);
    let edit_head = commit(&p.edit, "edit file", &[("edit.txt", Some("e\n"))]);

    let r = p.merge(MergeStrategy::CherryPick).unwrap();

    assert_eq!(r.created.len(), 2);
    assert!(r.skipped.is_empty());
    assert_eq!(r.new_head, r.created[1]);
    let log = git(&p.edit, &["log", "--format=%H %P", "-3"]);
    let lines: Vec<_> = log.lines().collect();
    assert_eq!(lines[0], format!("{} {}", r.created[1], r.created[0]));
    assert_eq!(lines[1], format!("{} {edit_head}", r.created[0]));
    let first = git(
        &p.edit,
        &["log", "-1", "--format=%an|%cn|%B", &r.created[0]],
    );
    assert_eq!(
        first,
        format!("Fixture Author|grove agent|add a\n\n(cherry picked from commit {a})")
    );
    let second = git(&p.edit, &["log", "-1", "--format=%B", &r.created[1]]);
    assert_eq!(
        second,
        format!("add b\n\nwith a body\n\n(cherry picked from commit {b})")
    );
    for (f, c) in [("a.txt", "a\n"), ("b.txt", "b\n"), ("edit.txt", "e\n")] {
        assert_eq!(std::fs::read_to_string(p.edit.join(f)).unwrap(), c);
    }
    assert_eq!(git(&p.edit, &["status", "--porcelain"]), "");
    assert_complete(&p.edit);
}

#[test]
fn a_cherry_pick_of_a_change_the_target_already_has_is_skipped() {
    let p = Pair::new();
    let same = commit(&p.task, "same", &[("same.txt", Some("same\n"))]);
    commit(&p.edit, "same, made twice", &[("same.txt", Some("same\n"))]);
    let before = git(&p.edit, &["rev-parse", "HEAD"]);

    let r = p.merge(MergeStrategy::CherryPick).unwrap();

    assert_eq!(r.skipped, vec![same]);
    assert!(r.created.is_empty() && r.up_to_date);
    assert_eq!(r.new_head, before);
    assert_eq!(git(&p.edit, &["rev-parse", "HEAD"]), before);
}

/// The edit and the task both change README.md; the edit also holds an untracked file,
/// an ignored file, an executable and a stash entry.
fn conflicting_pair() -> Pair {
    let p = Pair::new();
    commit(
        &p.task,
        "task readme",
        &[("README.md", Some("the task's readme\n"))],
    );
    commit(&p.task, "task extra", &[("extra.txt", Some("extra\n"))]);
    commit(
        &p.edit,
        "edit readme",
        &[
            ("README.md", Some("the edit's readme\n")),
            ("run.sh", Some("#!/bin/sh\n")),
        ],
    );
    std::fs::set_permissions(
        p.edit.join("run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    git(&p.edit, &["add", "run.sh"]);
    git_as_author(&p.edit, &["commit", "-q", "-m", "executable"]);
    std::fs::write(p.edit.join("src/lib.rs"), "stashed change\n").unwrap();
    git_as_author(&p.edit, &["stash", "push", "-q", "-m", "kept"]);
    std::fs::write(p.edit.join("scratch.txt"), "untracked\n").unwrap();
    std::fs::create_dir_all(p.edit.join("tmp/deep")).unwrap();
    std::fs::write(p.edit.join("tmp/deep/u.bin"), [0u8, 1, 2, 255]).unwrap();
    std::fs::write(p.edit.join("debug.log"), "ignored\n").unwrap();
    p
}

#[test]
fn a_conflicting_merge_leaves_the_target_exactly_as_it_was_and_names_the_paths() {
    let p = conflicting_pair();
    let before = snapshot(&p.edit);

    let err = p.merge(MergeStrategy::Merge).unwrap_err();

    match &err {
        MergeBackError::Conflict { paths, commit } => {
            assert_eq!(paths, &vec!["README.md".to_string()]);
            assert_eq!(commit, &None);
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(err.to_string().contains("\"README.md\""), "{err}");
    assert_eq!(snapshot(&p.edit), before);
}

#[test]
fn a_conflicting_cherry_pick_leaves_the_target_exactly_as_it_was_and_names_the_commit() {
    let p = conflicting_pair();
    let task_first = git(&p.task, &["rev-parse", "HEAD~1"]);
    let before = snapshot(&p.edit);

    let err = p.merge(MergeStrategy::CherryPick).unwrap_err();

    match &err {
        MergeBackError::Conflict { paths, commit } => {
            assert_eq!(paths, &vec!["README.md".to_string()]);
            assert_eq!(commit.as_deref(), Some(task_first.as_str()));
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(snapshot(&p.edit), before);
}

#[test]
fn an_untracked_file_the_change_would_overwrite_is_a_conflict_and_stays() {
    let p = Pair::new();
    commit(
        &p.task,
        "add new.txt",
        &[("new.txt", Some("from the task\n"))],
    );
    std::fs::write(p.edit.join("new.txt"), "the agent's own\n").unwrap();
    let before = snapshot(&p.edit);

    for strategy in [MergeStrategy::Merge, MergeStrategy::CherryPick] {
        let err = p.merge(strategy).unwrap_err();
        match &err {
            MergeBackError::Conflict { paths, .. } => {
                assert_eq!(paths, &vec!["new.txt".to_string()])
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert_eq!(snapshot(&p.edit), before);
    }
}

#[test]
fn uncommitted_changes_to_tracked_files_refuse_but_untracked_files_do_not() {
    let p = Pair::new();
    commit(&p.task, "task", &[("task.txt", Some("t\n"))]);
    std::fs::write(p.edit.join("README.md"), "uncommitted\n").unwrap();
    let before = snapshot(&p.edit);
    match p.merge(MergeStrategy::Merge).unwrap_err() {
        MergeBackError::Dirty(paths) => assert_eq!(paths, vec!["README.md".to_string()]),
        other => panic!("expected dirty, got {other:?}"),
    }
    assert_eq!(snapshot(&p.edit), before);

    // Staged counts too.
    git(&p.edit, &["add", "README.md"]);
    assert!(matches!(
        p.merge(MergeStrategy::CherryPick).unwrap_err(),
        MergeBackError::Dirty(_)
    ));

    // Only untracked files: the merge goes ahead and keeps them.
    git(&p.edit, &["reset", "-q", "--hard"]);
    std::fs::write(p.edit.join("scratch.txt"), "mine\n").unwrap();
    let r = p.merge(MergeStrategy::Merge).unwrap();
    assert!(r.fast_forward);
    assert_eq!(
        std::fs::read_to_string(p.edit.join("scratch.txt")).unwrap(),
        "mine\n"
    );
    assert_eq!(
        std::fs::read_to_string(p.edit.join("task.txt")).unwrap(),
        "t\n"
    );
}

#[test]
fn the_diff_lists_the_task_commits_and_changed_files_and_changes_nothing() {
    let p = Pair::new();
    let a = commit(
        &p.task,
        "add and edit",
        &[
            ("new/a.txt", Some("1\n2\n3\n")),
            ("README.md", Some("changed\nmore\n")),
        ],
    );
    let b = commit(&p.task, "remove lib", &[("src/lib.rs", None)]);
    std::fs::write(p.task.join("wip.txt"), "uncommitted\n").unwrap();
    commit(&p.edit, "edit moved on", &[("edit.txt", Some("e\n"))]);
    let edit_before = snapshot(&p.edit);
    let task_before = snapshot(&p.task);

    let d = Git2Adapter::new().merge_back_diff(&p.request()).unwrap();

    let commits: Vec<_> = d
        .commits
        .iter()
        .map(|c| (c.id.clone(), c.summary.clone()))
        .collect();
    assert_eq!(
        commits,
        vec![
            (a, "add and edit".to_string()),
            (b.clone(), "remove lib".to_string())
        ]
    );
    assert_eq!(d.commits_total, 2);
    assert_eq!(d.task_head, b);
    assert!(!d.fast_forward && !d.up_to_date && d.task_dirty);
    let files: Vec<_> = d
        .files
        .iter()
        .map(|f| {
            (
                f.path.as_str(),
                f.status.as_str(),
                f.insertions,
                f.deletions,
            )
        })
        .collect();
    assert_eq!(
        files,
        vec![
            ("README.md", "modified", 2, 1),
            ("new/a.txt", "added", 3, 0),
            ("src/lib.rs", "deleted", 0, 1),
        ]
    );
    assert_eq!((d.insertions, d.deletions), (5, 2));
    assert_eq!(snapshot(&p.edit), edit_before);
    assert_eq!(snapshot(&p.task), task_before);
}

#[test]
fn a_task_without_new_commits_is_up_to_date_and_nothing_moves() {
    let p = Pair::new();
    commit(&p.edit, "edit only", &[("e.txt", Some("e\n"))]);
    let before = snapshot(&p.edit);
    let d = Git2Adapter::new().merge_back_diff(&p.request()).unwrap();
    assert!(d.up_to_date && d.commits.is_empty() && d.files.is_empty());
    for strategy in [MergeStrategy::Merge, MergeStrategy::CherryPick] {
        let r = p.merge(strategy).unwrap();
        assert!(r.up_to_date);
        assert_eq!(r.new_head, r.previous_head);
    }
    assert_eq!(snapshot(&p.edit), before);
}

#[test]
fn a_target_whose_head_left_its_branch_is_refused() {
    let p = Pair::new();
    commit(&p.task, "task", &[("t.txt", Some("t\n"))]);
    git(&p.edit, &["checkout", "-q", "--detach"]);
    let before = snapshot(&p.edit);
    assert!(matches!(
        p.merge(MergeStrategy::Merge).unwrap_err(),
        MergeBackError::Refused(m) if m.contains("not on its branch")
    ));
    assert_eq!(snapshot(&p.edit), before);
}

/// The tracked view of a workspace that a switch must keep all-or-nothing: HEAD, the
/// index entries, every file outside `.git` (bytes and mode), and status.
fn tracked_view(dir: &Path) -> (String, String, BTreeMap<PathBuf, (Vec<u8>, u32)>, String) {
    let s = snapshot(dir);
    (
        s.head,
        git(dir, &["ls-files", "-s"]),
        s.files,
        git(dir, &["status", "--porcelain=v1", "--untracked-files=all"]),
    )
}

/// A pair whose task changes, adds, deletes and re-types paths, merged with a journal;
/// returns the pair, the journal path and the views before and after.
#[allow(clippy::type_complexity)]
fn journaled_merge() -> (
    Pair,
    PathBuf,
    (String, String, BTreeMap<PathBuf, (Vec<u8>, u32)>, String),
    (String, String, BTreeMap<PathBuf, (Vec<u8>, u32)>, String),
) {
    let pair = Pair::new();
    commit(
        &pair.task,
        "task work",
        &[
            ("README.md", Some("task readme\n")),
            ("src/lib.rs", None),
            ("src/lib.rs/inner.rs", Some("a file became a directory\n")),
            ("new/deep/added.txt", Some("added\n")),
        ],
    );
    std::fs::write(pair.edit.join("untracked.txt"), "kept\n").unwrap();
    let before = tracked_view(&pair.edit);
    let journal = pair.edit.parent().unwrap().join("home/journals/edit.json");
    let mut req = pair.request();
    req.journal = Some(&journal);
    let report = Git2Adapter::new()
        .merge_back(&req, MergeStrategy::Merge)
        .unwrap();
    assert!(report.fast_forward);
    assert!(!journal.exists(), "a finished switch removes its journal");
    let after = tracked_view(&pair.edit);
    assert_ne!(before, after);
    (pair, journal, before, after)
}

fn write_journal(path: &Path, old: &str, new: &str) {
    let json = format!(
        r#"{{"version":1,"operation":"merge_back","branch":"refs/heads/{EDIT}","old_head":"{old}","new_head":"{new}"}}"#
    );
    std::fs::write(path, json).unwrap();
}

#[test]
fn a_switch_interrupted_before_the_branch_moved_is_rolled_back_completely() {
    let (pair, journal, before, after) = journaled_merge();
    // A crash after some files were written, before the branch moved: the branch is
    // back at its old head, the files and index are a mix.
    git(
        &pair.edit,
        &["update-ref", &format!("refs/heads/{EDIT}"), &before.0],
    );
    std::fs::write(pair.edit.join("README.md"), "half written").unwrap();
    write_journal(&journal, &before.0, &after.0);
    let r = Git2Adapter::new()
        .recover_journal(&journal, &pair.edit)
        .unwrap()
        .expect("a journal was there");
    assert!(!r.rolled_forward);
    assert_eq!(r.head, before.0);
    assert_eq!(tracked_view(&pair.edit), before);
    assert!(!journal.exists());
    assert_eq!(
        Git2Adapter::new()
            .recover_journal(&journal, &pair.edit)
            .unwrap(),
        None
    );
}

#[test]
fn a_switch_interrupted_after_the_branch_moved_is_rolled_forward_completely() {
    let (pair, journal, before, after) = journaled_merge();
    // The branch moved, but the files are half the old tree (as a crash inside the
    // checkout of a later retry could not leave, and recovery must repair anyway).
    std::fs::write(pair.edit.join("README.md"), "hello again\n").unwrap();
    std::fs::remove_dir_all(pair.edit.join("new")).unwrap();
    write_journal(&journal, &before.0, &after.0);
    let r = Git2Adapter::new()
        .recover_journal(&journal, &pair.edit)
        .unwrap()
        .expect("a journal was there");
    assert!(r.rolled_forward);
    assert_eq!(tracked_view(&pair.edit), after);
    assert!(!journal.exists());
}
