//! Merge-back of a task workspace into an edit workspace through the real binary and
//! a real `grove serve`: clean merge and cherry-pick, a conflict that leaves the edit
//! workspace byte-for-byte as it was, tenancy, different repositories, a dirty target
//! and an analysis target.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use grove_e2e::{acquire_args, git, text, TestEnv};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

use crate::env_or_skip;

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef";

/// A running `grove serve` with tokens for alice and bob, killed when dropped.
struct Server {
    base: String,
    http: reqwest::Client,
    _child: Child,
}

impl Server {
    async fn start(env: &TestEnv) -> Self {
        let log = std::fs::File::create(env.dir.path().join("serve.log")).unwrap();
        let mut cmd = env.command(&["serve", "--bind", "127.0.0.1:0"]);
        cmd.env("GROVE_API_TOKENS", format!("{ALICE}=alice,{BOB}=bob"))
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        let mut child = cmd.spawn().expect("spawn grove serve");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("grove serve printed its address within 60 s")
            .unwrap()
            .expect("a first line");
        let base = first
            .strip_prefix("grove: listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {first}"))
            .to_string();
        Self {
            base,
            http: reqwest::Client::new(),
            _child: child,
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status();
        let text = resp.text().await.unwrap();
        let value = serde_json::from_str(&text).unwrap_or(Value::Null);
        (status, value)
    }

    /// Acquires a workspace for the token's user; returns (id, local path).
    async fn acquire(&self, token: &str, url: &str, mode: &str, scope: &str) -> (String, PathBuf) {
        let mut body = json!({
            "project_id": "p1",
            "repo_name": "o/fixture",
            "repo_url": url,
            "base_ref": "main",
            "mode": mode,
        });
        match mode {
            "edit" => body["conversation_id"] = json!(scope),
            "task" => body["task_id"] = json!(scope),
            _ => {}
        }
        let (status, body) = self
            .call(reqwest::Method::POST, "/v1/sessions", token, Some(body))
            .await;
        assert_eq!(status, StatusCode::OK, "acquire: {body}");
        (
            body["session_id"].as_str().unwrap().to_string(),
            PathBuf::from(body["workspace"]["local_path"].as_str().unwrap()),
        )
    }

    async fn merge_back(
        &self,
        token: &str,
        edit: &str,
        task: &str,
        strategy: &str,
    ) -> (StatusCode, Value) {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/workspaces/{edit}/merge-back"),
            token,
            Some(json!({"task_workspace_id": task, "strategy": strategy})),
        )
        .await
    }

    async fn diff(&self, token: &str, edit: &str, task: &str) -> (StatusCode, Value) {
        self.call(
            reqwest::Method::GET,
            &format!("/v1/workspaces/{edit}/merge-back/{task}"),
            token,
            None,
        )
        .await
    }
}

/// Writes `files` and commits them in a workspace with the git CLI; returns the commit.
fn commit(dir: &Path, message: &str, files: &[(&str, &str)]) -> String {
    for (path, content) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", message]);
    git(dir, &["rev-parse", "HEAD"]).trim().to_string()
}

fn head(dir: &Path) -> String {
    git(dir, &["rev-parse", "HEAD"]).trim().to_string()
}

/// Everything observable of a workspace: HEAD (symbolic and resolved), the index
/// file's bytes, every file's content and mode outside `.git` (untracked included),
/// `git status` (read without optional locks, so it cannot rewrite the index), the
/// stash, and the files of its object store.
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

fn walk(root: &Path, skip_git: bool) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
    let mut files = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if skip_git && path == root.join(".git") {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else {
                files.insert(
                    path.strip_prefix(root).unwrap().to_path_buf(),
                    (std::fs::read(&path).unwrap(), meta.permissions().mode()),
                );
            }
        }
    }
    files
}

fn snapshot(dir: &Path) -> Snapshot {
    Snapshot {
        head_ref: std::fs::read_to_string(dir.join(".git/HEAD")).unwrap(),
        head: head(dir),
        index: std::fs::read(dir.join(".git/index")).unwrap(),
        files: walk(dir, true),
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
        objects: walk(&dir.join(".git/objects"), false).into_keys().collect(),
    }
}

async fn payloads(env: &TestEnv, event_type: &str) -> Vec<Value> {
    sqlx::query_scalar("SELECT payload FROM grove.events WHERE event_type = $1 ORDER BY position")
        .bind(event_type)
        .fetch_all(&env.pool)
        .await
        .unwrap()
}

fn fixture(env: &TestEnv, name: &str) -> String {
    env.fixture_repo(
        name,
        &[
            ("README.md", "# fixture\n"),
            ("src/lib.rs", "pub fn alpha() {}\n"),
        ],
    )
}

/// Acquires through the CLI (user u1, project p1); returns (id, local path).
async fn acquire_cli(env: &TestEnv, url: &str, mode: &str, scope: &[&str]) -> (String, PathBuf) {
    let ws = env.grove_json(&acquire_args(url, mode, scope)).await;
    (
        ws["id"].as_str().unwrap().to_string(),
        PathBuf::from(ws["local_path"].as_str().unwrap()),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clean_merge_and_a_clean_cherry_pick_bring_the_task_commits_into_the_edit_branch_and_tree(
) {
    let mut env = env_or_skip!(
        "a_clean_merge_and_a_clean_cherry_pick_bring_the_task_commits_into_the_edit_branch_and_tree"
    );
    env.spawn_worker().await;
    let url = fixture(&env, "fixture");
    let (edit, edit_dir) = acquire_cli(&env, &url, "edit", &["--conversation", "c1"]).await;
    let (task, task_dir) = acquire_cli(&env, &url, "task", &["--task", "t1"]).await;
    let base = head(&edit_dir);

    // The task's work: one commit, seen in the diff first.
    let first = commit(&task_dir, "add feature", &[("feature.txt", "one\ntwo\n")]);
    let diff = env
        .grove_json(&["workspace", "merge-back-diff", &edit, "--task", &task])
        .await;
    assert_eq!(diff["commits"][0]["id"], first.as_str());
    assert_eq!(diff["commits"][0]["summary"], "add feature");
    assert_eq!(
        diff["files"],
        json!([{"path": "feature.txt", "status": "added", "insertions": 2, "deletions": 0, "binary": false}])
    );
    assert_eq!(diff["fast_forward"], true);
    assert_eq!(head(&edit_dir), base, "the diff changed nothing");

    let merged = env
        .grove_json(&[
            "workspace",
            "merge-back",
            &edit,
            "--task",
            &task,
            "--strategy",
            "merge",
        ])
        .await;
    assert_eq!(merged["fast_forward"], true);
    assert_eq!(merged["previous_head"], base.as_str());
    assert_eq!(merged["new_head"], first.as_str());
    assert_eq!(head(&edit_dir), first);
    assert_eq!(
        git(&edit_dir, &["symbolic-ref", "HEAD"]).trim(),
        "refs/heads/agent/edits-c1"
    );
    assert_eq!(
        std::fs::read_to_string(edit_dir.join("feature.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert_eq!(git(&edit_dir, &["status", "--porcelain"]), "");

    // More task work while the edit branch moved on: cherry-picked on top of it.
    let second = commit(
        &task_dir,
        "change readme",
        &[("README.md", "# from the task\n")],
    );
    let edit_own = commit(&edit_dir, "edit's own", &[("edit.txt", "mine\n")]);
    let picked = env
        .grove_json(&[
            "workspace",
            "merge-back",
            &edit,
            "--task",
            &task,
            "--strategy",
            "cherry-pick",
        ])
        .await;
    let created = picked["created"].as_array().unwrap();
    assert_eq!(created.len(), 1);
    assert_eq!(picked["new_head"], created[0]);
    assert_eq!(picked["commits"][0]["id"], second.as_str());
    let new_head = head(&edit_dir);
    assert_eq!(picked["new_head"], new_head.as_str());
    assert_eq!(
        git(&edit_dir, &["log", "-1", "--format=%P"]).trim(),
        edit_own
    );
    assert!(git(&edit_dir, &["log", "-1", "--format=%B"])
        .contains(&format!("(cherry picked from commit {second})")));
    assert_eq!(
        std::fs::read_to_string(edit_dir.join("README.md")).unwrap(),
        "# from the task\n"
    );
    assert_eq!(
        std::fs::read_to_string(edit_dir.join("edit.txt")).unwrap(),
        "mine\n"
    );
    assert_eq!(git(&edit_dir, &["status", "--porcelain"]), "");
    // The edit workspace holds every object it needs (the task's are copied in).
    git(&edit_dir, &["fsck", "--connectivity-only", "--no-dangling"]);

    let events = payloads(&env, "workspace.merged_back").await;
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["workspace_id"], edit.as_str());
    assert_eq!(events[0]["task_workspace_id"], task.as_str());
    assert_eq!(events[0]["strategy"], "merge");
    assert_eq!(events[0]["new_head"], first.as_str());
    assert_eq!(events[1]["strategy"], "cherry_pick");
    assert_eq!(events[1]["new_head"], new_head.as_str());
    assert_eq!(events[1]["commits"], json!([second]));

    // Picking again finds the change already there: skipped, nothing moves, no event.
    let again = env
        .grove_json(&[
            "workspace",
            "merge-back",
            &edit,
            "--task",
            &task,
            "--strategy",
            "cherry-pick",
        ])
        .await;
    assert_eq!(again["skipped"], json!([second]));
    assert_eq!(again["up_to_date"], true);
    assert_eq!(head(&edit_dir), new_head);
    assert_eq!(env.count_events("workspace.merged_back").await, 2);

    let out = env.grove(&["replay", "--verify"]).await;
    assert!(out.status.success(), "replay: {:?}", text(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_conflicting_merge_back_leaves_the_edit_workspace_byte_for_byte_and_lists_the_paths() {
    let env = env_or_skip!(
        "a_conflicting_merge_back_leaves_the_edit_workspace_byte_for_byte_and_lists_the_paths"
    );
    let url = fixture(&env, "fixture");
    let server = Server::start(&env).await;
    let (edit, edit_dir) = server.acquire(ALICE, &url, "edit", "c1").await;
    let (task, task_dir) = server.acquire(ALICE, &url, "task", "t1").await;

    commit(
        &task_dir,
        "task changes",
        &[
            ("README.md", "# the task's\n"),
            ("src/lib.rs", "pub fn task() {}\n"),
        ],
    );
    commit(&task_dir, "task extra", &[("extra.txt", "extra\n")]);
    commit(
        &edit_dir,
        "edit changes",
        &[
            ("README.md", "# the edit's\n"),
            ("src/lib.rs", "pub fn edit() {}\n"),
            ("run.sh", "#!/bin/sh\necho hi\n"),
        ],
    );
    std::fs::set_permissions(
        edit_dir.join("run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    git(&edit_dir, &["add", "run.sh"]);
    git(&edit_dir, &["commit", "-q", "-m", "executable"]);
    // A stash entry, untracked files (one binary, one nested) and an ignored-looking file.
    std::fs::write(edit_dir.join("README.md"), "# stashed\n").unwrap();
    git(&edit_dir, &["stash", "push", "-q", "-m", "kept"]);
    std::fs::write(edit_dir.join("notes.txt"), "untracked\n").unwrap();
    std::fs::create_dir_all(edit_dir.join("tmp/deep")).unwrap();
    std::fs::write(edit_dir.join("tmp/deep/blob.bin"), [0u8, 1, 2, 254, 255]).unwrap();
    let before = snapshot(&edit_dir);

    for strategy in ["merge", "cherry_pick"] {
        let (status, body) = server.merge_back(ALICE, &edit, &task, strategy).await;
        assert_eq!(status, StatusCode::CONFLICT, "{strategy}: {body}");
        assert_eq!(body["error"]["kind"], "conflict");
        assert_eq!(body["error"]["paths"], json!(["README.md", "src/lib.rs"]));
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("\"README.md\"") && message.contains("\"src/lib.rs\""),
            "{message}"
        );
        assert_eq!(
            snapshot(&edit_dir),
            before,
            "{strategy} changed the edit workspace"
        );
    }

    // The CLI says the same, in one line, with exit code 4.
    let out = env
        .grove(&[
            "workspace",
            "merge-back",
            &edit,
            "--task",
            &task,
            "--strategy",
            "merge",
        ])
        .await;
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("\"README.md\"") && stderr.contains("\"src/lib.rs\""));
    assert_eq!(snapshot(&edit_dir), before);

    let conflicts = payloads(&env, "workspace.merge_back_conflicted").await;
    assert_eq!(conflicts.len(), 3);
    assert_eq!(conflicts[0]["paths"], json!(["README.md", "src/lib.rs"]));
    assert_eq!(conflicts[0]["strategy"], "merge");
    assert_eq!(conflicts[1]["strategy"], "cherry_pick");
    assert!(conflicts[1]["commit"].is_string());
    assert_eq!(env.count_events("workspace.merged_back").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn another_users_workspaces_are_not_found_and_other_repositories_or_an_analysis_target_are_refused(
) {
    let env = env_or_skip!(
        "another_users_workspaces_are_not_found_and_other_repositories_or_an_analysis_target_are_refused"
    );
    let url = fixture(&env, "fixture");
    let other_url = fixture(&env, "other");
    let server = Server::start(&env).await;
    let (edit, edit_dir) = server.acquire(ALICE, &url, "edit", "c1").await;
    let (task, task_dir) = server.acquire(ALICE, &url, "task", "t1").await;
    let (bob_task, bob_dir) = server.acquire(BOB, &url, "task", "t1").await;
    commit(&task_dir, "alice's task", &[("a.txt", "a\n")]);
    commit(&bob_dir, "bob's task", &[("b.txt", "b\n")]);
    let before = snapshot(&edit_dir);

    // Bob's task workspace does not exist for alice, nor alice's edit workspace for bob.
    for (status, body) in [
        server.merge_back(ALICE, &edit, &bob_task, "merge").await,
        server.diff(ALICE, &edit, &bob_task).await,
        server.merge_back(BOB, &edit, &bob_task, "merge").await,
        server.diff(BOB, &edit, &bob_task).await,
    ] {
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert_eq!(body["error"]["kind"], "not_found");
    }

    // A task of another repository (same user and project).
    let (other_task, other_dir) = {
        let mut body = json!({
            "project_id": "p1", "repo_name": "o/other", "repo_url": other_url,
            "base_ref": "main", "mode": "task", "task_id": "t2",
        });
        body["idempotency_key"] = json!("other-task");
        let (status, body) = server
            .call(reqwest::Method::POST, "/v1/sessions", ALICE, Some(body))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        (
            body["session_id"].as_str().unwrap().to_string(),
            PathBuf::from(body["workspace"]["local_path"].as_str().unwrap()),
        )
    };
    commit(&other_dir, "other repo work", &[("o.txt", "o\n")]);
    let (status, body) = server.merge_back(ALICE, &edit, &other_task, "merge").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["kind"], "rejected");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("different repositories"));
    let (status, _) = server.diff(ALICE, &edit, &other_task).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    // An analysis workspace is no target.
    let (analysis, analysis_dir) = server.acquire(ALICE, &url, "analysis", "").await;
    let analysis_before = snapshot(&analysis_dir);
    let (status, body) = server.merge_back(ALICE, &analysis, &task, "merge").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("read-only"));
    assert_eq!(snapshot(&analysis_dir), analysis_before);

    // The same workspace twice is bad input.
    let (status, body) = server.merge_back(ALICE, &edit, &edit, "merge").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // Through the CLI (no caller identity), two users' workspaces are still refused by
    // the worker.
    let out = env
        .grove(&[
            "workspace",
            "merge-back",
            &edit,
            "--task",
            &bob_task,
            "--strategy",
            "merge",
        ])
        .await;
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("different users"), "{stderr}");

    assert_eq!(snapshot(&edit_dir), before);
    assert_eq!(env.count_events("workspace.merged_back").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dirty_edit_workspace_is_refused_with_its_uncommitted_paths_and_left_as_it_was() {
    let env = env_or_skip!(
        "a_dirty_edit_workspace_is_refused_with_its_uncommitted_paths_and_left_as_it_was"
    );
    let url = fixture(&env, "fixture");
    let server = Server::start(&env).await;
    let (edit, edit_dir) = server.acquire(ALICE, &url, "edit", "c1").await;
    let (task, task_dir) = server.acquire(ALICE, &url, "task", "t1").await;
    let task_head = commit(&task_dir, "task", &[("task.txt", "t\n")]);

    std::fs::write(edit_dir.join("README.md"), "# not committed\n").unwrap();
    let before = snapshot(&edit_dir);
    for strategy in ["merge", "cherry_pick"] {
        let (status, body) = server.merge_back(ALICE, &edit, &task, strategy).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["error"]["kind"], "rejected");
        assert_eq!(body["error"]["paths"], json!(["README.md"]));
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("uncommitted changes"));
        assert_eq!(snapshot(&edit_dir), before);
    }

    // Untracked files alone do not refuse: the merge goes ahead and keeps them.
    git(&edit_dir, &["checkout", "-q", "--", "README.md"]);
    std::fs::write(edit_dir.join("scratch.txt"), "mine\n").unwrap();
    let (status, body) = server.merge_back(ALICE, &edit, &task, "merge").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["new_head"], task_head.as_str());
    assert_eq!(head(&edit_dir), task_head);
    assert_eq!(
        std::fs::read_to_string(edit_dir.join("scratch.txt")).unwrap(),
        "mine\n"
    );
    assert_eq!(
        std::fs::read_to_string(edit_dir.join("task.txt")).unwrap(),
        "t\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn merge_backs_between_two_workspaces_in_opposite_directions_both_finish() {
    let mut env =
        env_or_skip!("merge_backs_between_two_workspaces_in_opposite_directions_both_finish");
    // Two workers, so both jobs run at once and each takes its first lock.
    env.spawn_worker().await;
    env.spawn_worker().await;
    let url = fixture(&env, "fixture");
    let (a, a_dir) = acquire_cli(&env, &url, "task", &["--task", "ta"]).await;
    let (b, b_dir) = acquire_cli(&env, &url, "task", &["--task", "tb"]).await;
    commit(&a_dir, "a's work", &[("a.txt", "a\n")]);
    commit(&b_dir, "b's work", &[("b.txt", "b\n")]);

    let ab_args = [
        "workspace",
        "merge-back",
        &b,
        "--task",
        &a,
        "--strategy",
        "merge",
        "--json",
    ];
    let ba_args = [
        "workspace",
        "merge-back",
        &a,
        "--task",
        &b,
        "--strategy",
        "merge",
        "--json",
    ];
    let (ab, ba) = tokio::join!(env.grove(&ab_args), env.grove(&ba_args));
    for out in [&ab, &ba] {
        assert!(out.status.success(), "{:?}", text(out));
    }
    // Whichever ran second also brought the first one's merge commit along, so both
    // workspaces hold both files.
    for dir in [&a_dir, &b_dir] {
        assert_eq!(std::fs::read_to_string(dir.join("a.txt")).unwrap(), "a\n");
        assert_eq!(std::fs::read_to_string(dir.join("b.txt")).unwrap(), "b\n");
        assert_eq!(git(dir, &["status", "--porcelain"]), "");
    }
    assert_eq!(env.count_events("workspace.merged_back").await, 2);
}

/// HEAD, index entries and status of a workspace: what a switch must keep whole.
fn switch_view(dir: &Path) -> (String, String, String, String) {
    (
        git(dir, &["rev-parse", "HEAD"]),
        git(dir, &["ls-files", "-s"]),
        git(dir, &["status", "--porcelain", "-uall"]),
        std::fs::read_to_string(dir.join("README.md")).unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_merge_back_journal_left_by_a_dead_worker_is_rolled_back_before_the_next_command() {
    let mut env = env_or_skip!(
        "a_merge_back_journal_left_by_a_dead_worker_is_rolled_back_before_the_next_command"
    );
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("README.md", "base\n"), ("a.txt", "a\n")]);
    let edit = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let task = env
        .grove_json(&acquire_args(&url, "task", &["--task", "t1"]))
        .await;
    let (edit_id, task_id) = (
        edit["id"].as_str().unwrap().to_string(),
        task["id"].as_str().unwrap().to_string(),
    );
    let edit_dir = PathBuf::from(edit["local_path"].as_str().unwrap());
    let script = "echo task > README.md && rm a.txt && mkdir -p n && echo n > n/new.txt && git add -A && git commit -qm task";
    let out = env
        .grove(&["exec", &task_id, "--", "sh", "-c", script])
        .await;
    assert!(out.status.success(), "{:?}", text(&out));
    let before = switch_view(&edit_dir);
    let out = env
        .grove(&[
            "workspace",
            "merge-back",
            &edit_id,
            "--task",
            &task_id,
            "--strategy",
            "merge",
        ])
        .await;
    assert!(out.status.success(), "{:?}", text(&out));
    let after = switch_view(&edit_dir);
    assert_ne!(before, after);
    let journals = env.home().join("journals");
    assert!(
        std::fs::read_dir(&journals).map(|d| d.count()).unwrap_or(0) == 0,
        "a finished merge-back leaves no journal"
    );
    // What a worker killed after writing the files but before moving the branch
    // leaves: the files and index at the new tree, the branch at the old head, and the
    // journal under $GROVE_HOME.
    let branch = edit["branch_name"].as_str().unwrap();
    git(
        &edit_dir,
        &[
            "update-ref",
            &format!("refs/heads/{branch}"),
            before.0.trim(),
        ],
    );
    std::fs::create_dir_all(&journals).unwrap();
    std::fs::write(
        journals.join(format!("{edit_id}.json")),
        serde_json::to_vec(&json!({
            "version": 1,
            "operation": "merge_back",
            "branch": format!("refs/heads/{branch}"),
            "old_head": before.0.trim(),
            "new_head": after.0.trim(),
        }))
        .unwrap(),
    )
    .unwrap();
    // The next command on the workspace settles it first.
    let out = env
        .grove(&["exec", &edit_id, "--", "cat", "README.md"])
        .await;
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(
        text(&out).0,
        "base\n",
        "the command saw the rolled-back tree"
    );
    assert_eq!(switch_view(&edit_dir), before);
    assert!(!journals.join(format!("{edit_id}.json")).exists());
    let recovered: Vec<Value> = sqlx::query_scalar(
        "SELECT payload FROM grove.events WHERE event_type = 'workspace.merge_back_recovered'",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(recovered.len(), 1);
    assert_eq!(recovered[0]["outcome"], "rolled_back");
    assert_eq!(recovered[0]["head"], before.0.trim());
    let out = env.grove(&["replay", "--verify"]).await;
    assert!(out.status.success(), "{:?}", text(&out));
}
