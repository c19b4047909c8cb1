//! Workspace history (ADR 28) through the real binary: a scripted session of 20
//! commands and edits, then `grove history` list, diff, show, fork, rewind and undo
//! compared with copies of the tree taken along the way; bad input; and the attacks
//! (symlinks out of the workspace at snapshot and rewind time, a hostile `.git`).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use grove_e2e::{acquire_args, git, text, TestEnv};
use serde_json::Value;

use crate::env_or_skip;

/// A file of the working tree: bytes (and whether executable), or a symlink's target.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    File(Vec<u8>, bool),
    Link(PathBuf),
}

type Tree = BTreeMap<String, Entry>;

/// Every file and symlink under `dir` but `.git`, by relative path.
fn tree_of(dir: &Path) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            if rel == ".git" {
                continue;
            }
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.file_type().is_symlink() {
                out.insert(rel, Entry::Link(std::fs::read_link(&p).unwrap()));
            } else if meta.is_dir() {
                stack.push(p);
            } else {
                let exec = meta.permissions().mode() & 0o111 != 0;
                out.insert(rel, Entry::File(std::fs::read(&p).unwrap(), exec));
            }
        }
    }
    out
}

/// (added, modified, deleted) from `a` to `b`.
fn counts(a: &Tree, b: &Tree) -> (u64, u64, u64) {
    let added = b.keys().filter(|k| !a.contains_key(*k)).count() as u64;
    let deleted = a.keys().filter(|k| !b.contains_key(*k)).count() as u64;
    let modified = b
        .iter()
        .filter(|(k, v)| a.get(*k).is_some_and(|old| old != *v))
        .count() as u64;
    (added, modified, deleted)
}

/// The paths that differ between two trees, sorted.
fn changed(a: &Tree, b: &Tree) -> Vec<String> {
    let mut keys: Vec<String> = a.keys().chain(b.keys()).cloned().collect();
    keys.sort();
    keys.dedup();
    keys.into_iter().filter(|k| a.get(k) != b.get(k)).collect()
}

fn write_tree(dir: &Path, tree: &Tree) {
    for (path, entry) in tree {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        match entry {
            Entry::File(bytes, exec) => {
                std::fs::write(&p, bytes).unwrap();
                let mode = if *exec { 0o755 } else { 0o644 };
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            }
            Entry::Link(target) => std::os::unix::fs::symlink(target, &p).unwrap(),
        }
    }
}

/// One step of the scripted session.
enum Step {
    Exec(&'static str),
    Tool(&'static [&'static str]),
}

const SESSION: [Step; 20] = [
    Step::Exec("mkdir -p src/a && echo one > src/a/one.txt"),
    Step::Tool(&["write", "notes.md", "--content", "notes\n"]),
    Step::Exec("echo more >> README.md"),
    Step::Tool(&[
        "str-replace",
        "src/lib.rs",
        "--old",
        "alpha",
        "--new",
        "beta",
    ]),
    Step::Exec("rm README.md"),
    Step::Exec("printf 'x\\ny\\n' > src/b.txt && ln -s b.txt src/link"),
    Step::Tool(&["create", "docs/guide.md", "--content", "# guide\n"]),
    Step::Tool(&["commit", "-m", "first"]),
    Step::Exec("echo nine > nine.txt && chmod +x nine.txt"),
    Step::Exec("mv notes.md notes2.md"),
    Step::Tool(&["insert", "src/lib.rs", "--line", "0", "--text", "// top\n"]),
    Step::Exec("rm -rf src/a"),
    Step::Exec("echo 13 > thirteen.txt"),
    Step::Tool(&["write", "src/b.txt", "--content", "rewritten\n"]),
    Step::Exec("true"),
    Step::Exec("echo failing > failed.txt; exit 3"),
    Step::Tool(&["commit", "-m", "second"]),
    Step::Exec("echo 18 >> nine.txt"),
    Step::Exec("mkdir -p deep/er && echo d > deep/er/file"),
    Step::Tool(&["write", "deep/er/file2", "--content", "two\n"]),
];

struct Session {
    id: String,
    dir: PathBuf,
    url: String,
}

async fn start(env: &mut TestEnv) -> Session {
    env.spawn_worker().await;
    let url = env.fixture_repo(
        "fixture",
        &[
            ("src/lib.rs", "pub fn alpha() {}\n"),
            ("src/util.rs", "pub fn util() {}\n"),
            ("README.md", "# fixture\n"),
        ],
    );
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    Session {
        id: ws["id"].as_str().unwrap().to_string(),
        dir: PathBuf::from(ws["local_path"].as_str().unwrap()),
        url,
    }
}

async fn run_step(env: &TestEnv, id: &str, step: &Step) {
    match step {
        Step::Exec(script) => {
            // A failing command is a change like any other (its exit code is recorded).
            let out = env.grove(&["exec", id, "--", "sh", "-c", script]).await;
            assert!(out.status.code().is_some(), "{:?}", text(&out));
        }
        Step::Tool(args) => {
            let mut all = vec!["tool", id];
            all.extend_from_slice(args);
            env.grove_json(&all).await;
        }
    }
}

fn head_of(dir: &Path) -> (String, String) {
    let head = git(dir, &["rev-parse", "HEAD"]).trim().to_string();
    let branch = git(dir, &["symbolic-ref", "-q", "HEAD"]).trim().to_string();
    (head, branch)
}

async fn history(env: &TestEnv, id: &str, args: &[&str]) -> Value {
    let mut all = vec!["history", id];
    all.extend_from_slice(args);
    env.grove_json(&all).await
}

async fn history_fails(env: &TestEnv, id: &str, args: &[&str]) -> (i32, String) {
    let mut all = vec!["history", id];
    all.extend_from_slice(args);
    let out = env.grove(&all).await;
    assert!(
        !out.status.success(),
        "{args:?} succeeded: {}",
        text(&out).0
    );
    (out.status.code().unwrap(), text(&out).1)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_of_twenty_changes_is_listed_diffed_forked_rewound_and_undone() {
    let mut env =
        env_or_skip!("a_session_of_twenty_changes_is_listed_diffed_forked_rewound_and_undone");
    let s = start(&mut env).await;
    let mut trees = vec![tree_of(&s.dir)];
    let mut heads = vec![head_of(&s.dir)];
    for step in &SESSION {
        run_step(&env, &s.id, step).await;
        trees.push(tree_of(&s.dir));
        heads.push(head_of(&s.dir));
    }

    // history: the creation and all 20 changes, each with its counts.
    let h = history(&env, &s.id, &["list", "--limit", "100"]).await;
    assert_eq!(h["output"], "history");
    assert_eq!(h["total"], 21);
    let points = h["points"].as_array().unwrap();
    assert_eq!(points.len(), 21);
    assert_eq!(points[0]["operation"]["kind"], "created");
    for (n, p) in points.iter().enumerate() {
        assert_eq!(p["number"], n as u64);
        let want = if n == 0 {
            counts(&Tree::new(), &trees[0])
        } else {
            counts(&trees[n - 1], &trees[n])
        };
        let got = (
            p["changes"]["added"].as_u64().unwrap(),
            p["changes"]["modified"].as_u64().unwrap(),
            p["changes"]["deleted"].as_u64().unwrap(),
        );
        assert_eq!(got, want, "point {n}: {p}");
        assert_eq!(p["head"], heads[n].0.as_str(), "point {n}");
        if n > 0 {
            let kind = match SESSION[n - 1] {
                Step::Exec(_) => "exec",
                Step::Tool(_) => "tool",
            };
            assert_eq!(p["operation"]["kind"], kind, "point {n}");
        }
    }
    assert_eq!(points[16]["operation"]["exit_code"], 3);
    let page = history(&env, &s.id, &["list", "--offset", "19", "--limit", "5"]).await;
    assert_eq!(page["points"].as_array().unwrap().len(), 2);

    // diff 5..12: the files that differ between the two trees, and a patch that turns
    // a copy of 5 into 12.
    let d = history(&env, &s.id, &["diff", "5", "12"]).await;
    let mut files: Vec<String> = d["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    files.sort();
    assert_eq!(files, changed(&trees[5], &trees[12]));
    let scratch = env.dir.path().join("at5");
    write_tree(&scratch, &trees[5]);
    git(&scratch, &["init", "-q"]);
    std::fs::write(
        env.dir.path().join("5-12.patch"),
        d["patch"].as_str().unwrap(),
    )
    .unwrap();
    git(&scratch, &["apply", "--binary", "../5-12.patch"]);
    let mut applied = tree_of(&scratch);
    applied.retain(|k, _| !k.starts_with(".git"));
    assert_eq!(applied, trees[12]);
    // And it equals git's own diff of the two trees, file for file.
    let names = git_name_status(&env, &trees[5], &trees[12]);
    assert_eq!(files, names);

    // A file at a point.
    let f = history(&env, &s.id, &["show", "3", "README.md"]).await;
    assert_eq!(f["content"], "# fixture\nmore\n");

    // fork at 9: a second workspace equal to the tree at 9; the source keeps its state.
    let fork = history(&env, &s.id, &["fork", "9", "--scope", "c2"]).await;
    assert_eq!(fork["output"], "forked");
    assert_eq!(fork["point"], 9);
    let fork_dir = PathBuf::from(fork["local_path"].as_str().unwrap());
    assert_eq!(tree_of(&fork_dir), trees[9]);
    assert_eq!(head_of(&fork_dir).0, heads[9].0);
    assert_eq!(head_of(&fork_dir).1, "refs/heads/agent/edits-c2");
    assert_eq!(tree_of(&s.dir), trees[20], "the source is unchanged");
    let fork_id = fork["workspace_id"].as_str().unwrap();
    let fh = history(&env, fork_id, &["list", "--limit", "100"]).await;
    assert_eq!(
        fh["total"], 10,
        "the fork's history is the source's up to 9"
    );
    assert_eq!(fh["points"][9]["snapshot"], points[9]["snapshot"]);
    // The fork's first change of its own is point 10, counted against point 9.
    run_step(&env, fork_id, &Step::Exec("echo fork > fork.txt")).await;
    let fh = history(&env, fork_id, &["list", "--limit", "100"]).await;
    assert_eq!(fh["total"], 11);
    let own = &fh["points"][10];
    assert_eq!(own["number"], 10);
    assert_eq!(
        own["changes"],
        serde_json::json!({"added": 1, "modified": 0, "deleted": 0})
    );

    // rewind to 9: files, HEAD and branch as they were at 9.
    let r = history(&env, &s.id, &["rewind", "9"]).await;
    assert_eq!(r["output"], "rewound");
    assert_eq!(r["to"], 9);
    assert_eq!(r["kept"], Value::Null, "nothing uncommitted to keep");
    assert_eq!(tree_of(&s.dir), trees[9]);
    assert_eq!(head_of(&s.dir), heads[9]);

    // undo after a destructive command brings it back.
    run_step(&env, &s.id, &Step::Exec("rm -rf src")).await;
    assert!(!s.dir.join("src").exists());
    let u = history(&env, &s.id, &["undo"]).await;
    assert_eq!(u["output"], "rewound");
    assert_eq!(tree_of(&s.dir), trees[9]);

    let verify = env.grove(&["replay", "--verify"]).await;
    assert!(verify.status.success(), "{:?}", text(&verify));
    let _ = &s.url;
}

/// `git diff --name-only` between two trees, committed in a scratch repository.
fn git_name_status(env: &TestEnv, a: &Tree, b: &Tree) -> Vec<String> {
    let dir = env.dir.path().join("gitdiff");
    std::fs::create_dir_all(&dir).unwrap();
    git(&dir, &["init", "-q"]);
    write_tree(&dir, a);
    git(&dir, &["add", "-A"]);
    git(&dir, &["commit", "-q", "--allow-empty", "-m", "a"]);
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        if entry.file_name() != ".git" {
            grove_rm(&entry.path());
        }
    }
    write_tree(&dir, b);
    git(&dir, &["add", "-A"]);
    let out = git(
        &dir,
        &["diff", "--cached", "--name-only", "--no-renames", "HEAD"],
    );
    let mut names: Vec<String> = out.lines().map(str::to_string).collect();
    names.sort();
    names
}

fn grove_rm(p: &Path) {
    let meta = std::fs::symlink_metadata(p).unwrap();
    if meta.is_dir() {
        std::fs::remove_dir_all(p).unwrap();
    } else {
        std::fs::remove_file(p).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_points_forks_onto_existing_keys_and_rewinds_racing_a_command_change_nothing() {
    let mut env = env_or_skip!(
        "bad_points_forks_onto_existing_keys_and_rewinds_racing_a_command_change_nothing"
    );
    let s = start(&mut env).await;
    run_step(&env, &s.id, &Step::Exec("echo a > a.txt")).await;
    let other = env
        .grove_json(&acquire_args(&s.url, "edit", &["--conversation", "other"]))
        .await;
    let other_id = other["id"].as_str().unwrap().to_string();
    run_step(&env, &other_id, &Step::Exec("echo b > b.txt")).await;
    let theirs = history(&env, &other_id, &["list"]).await["points"][1]["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    let before = tree_of(&s.dir);
    let events = env.count_events("workspace.snapshot_taken").await;

    // An unknown point, another workspace's point: not found, nothing changed.
    for bad in ["99", theirs.as_str()] {
        let (code, err) = history_fails(&env, &s.id, &["rewind", bad]).await;
        assert_eq!(code, 3, "{bad}: {err}");
        assert!(err.contains("not in the history"), "{err}");
    }
    let (code, _) = history_fails(&env, &s.id, &["diff", "0", &theirs]).await;
    assert_eq!(code, 3);
    let (code, _) = history_fails(&env, &s.id, &["rewind", "HEAD~1"]).await;
    assert_eq!(code, 2, "not a point at all");
    // A fork onto a key that exists: conflict.
    let (code, err) = history_fails(&env, &s.id, &["fork", "0", "--scope", "other"]).await;
    assert_eq!(code, 4, "{err}");
    assert_eq!(tree_of(&s.dir), before);
    assert_eq!(env.count_events("workspace.snapshot_taken").await, events);
    assert_eq!(env.count_events("workspace.forked").await, 0);

    // A rewind while a command runs is refused, not queued behind it.
    let mut running = env
        .command(&[
            "exec",
            &s.id,
            "--",
            "sh",
            "-c",
            "sleep 3; echo late > late.txt",
        ])
        .spawn()
        .unwrap();
    wait_for_exec_start(&env).await;
    let (code, err) = history_fails(&env, &s.id, &["rewind", "0"]).await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("running another command"), "{err}");
    assert!(running.wait().await.unwrap().success());
    assert!(s.dir.join("a.txt").exists(), "the rewind changed nothing");
    assert_eq!(
        std::fs::read_to_string(s.dir.join("late.txt")).unwrap(),
        "late\n"
    );
}

async fn wait_for_exec_start(env: &TestEnv) {
    let started = env.count_events("exec.started").await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let now: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM grove.events e WHERE event_type = 'exec.started'
             AND NOT EXISTS (SELECT 1 FROM grove.events f WHERE f.event_type = 'exec.finished'
                             AND f.payload->>'exec_id' = e.payload->>'exec_id')",
        )
        .fetch_one(&env.pool)
        .await
        .unwrap();
        if now > 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no exec started ({started})"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn symlinks_out_of_the_workspace_and_a_hostile_git_dir_reach_nothing_on_the_host() {
    let mut env = env_or_skip!(
        "symlinks_out_of_the_workspace_and_a_hostile_git_dir_reach_nothing_on_the_host"
    );
    let s = start(&mut env).await;
    let outside = env.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("keep.txt"), "host\n").unwrap();
    let marker = env.dir.path().join("pwned");

    // At snapshot time: a link to /etc and to a host directory are kept as links.
    let script = format!(
        "ln -s /etc etc_link && ln -s {} out_link && mkdir victim && echo mine > victim/x.txt",
        outside.display()
    );
    let out = env.grove(&["exec", &s.id, "--", "sh", "-c", &script]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    let h = history(&env, &s.id, &["list"]).await;
    let p1 = &h["points"][1];
    assert_eq!(p1["changes"]["added"], 3, "two links and one file: {p1}");
    let (code, _) = history_fails(&env, &s.id, &["show", "1", "etc_link/passwd"]).await;
    assert_eq!(code, 3, "no host file is in a point");
    let link = history(&env, &s.id, &["show", "1", "etc_link"]).await;
    assert_eq!(link["content"], "/etc");

    // A hostile .git: fsmonitor, hooks, a filter driver named by .gitattributes.
    let git_dir = s.dir.join(".git");
    let hook = format!("#!/bin/sh\ntouch {}\n", marker.display());
    std::fs::create_dir_all(git_dir.join("hooks")).unwrap();
    std::fs::write(git_dir.join("hooks/pre-commit"), &hook).unwrap();
    std::fs::set_permissions(
        git_dir.join("hooks/pre-commit"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let mut config = std::fs::read_to_string(git_dir.join("config")).unwrap();
    config.push_str(&format!(
        "[core]\n\tfsmonitor = touch {m}\n\thooksPath = {h}\n[filter \"evil\"]\n\tclean = touch {m}\n\tsmudge = touch {m}\n",
        m = marker.display(),
        h = git_dir.join("hooks").display()
    ));
    std::fs::write(git_dir.join("config"), config).unwrap();
    std::fs::write(
        s.dir.join(".gitattributes"),
        "* filter=evil\r\n*.txt text eol=crlf\n",
    )
    .unwrap();
    std::fs::write(s.dir.join("crlf.txt"), "a\nb\n").unwrap();
    let cp = history(&env, &s.id, &["checkpoint", "hostile"]).await;
    assert_eq!(cp["output"], "point");
    let kept = history(&env, &s.id, &["show", "2", "crlf.txt"]).await;
    assert_eq!(kept["content"], "a\nb\n", "bytes as on disk, no conversion");

    // At rewind time: the directory a point's file goes in is now a link out.
    let script = format!("rm -rf victim && ln -s {} victim", outside.display());
    let out = env.grove(&["exec", &s.id, "--", "sh", "-c", &script]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    history(&env, &s.id, &["rewind", "1"]).await;
    assert!(
        !outside.join("x.txt").exists(),
        "nothing written through the link"
    );
    assert_eq!(tree_of(&outside).len(), 1);
    assert_eq!(
        std::fs::read_to_string(outside.join("keep.txt")).unwrap(),
        "host\n"
    );
    let victim = std::fs::symlink_metadata(s.dir.join("victim")).unwrap();
    assert!(victim.is_dir(), "a real directory again");
    assert_eq!(
        std::fs::read_to_string(s.dir.join("victim/x.txt")).unwrap(),
        "mine\n"
    );
    assert_eq!(
        std::fs::read_link(s.dir.join("etc_link")).unwrap(),
        PathBuf::from("/etc")
    );
    assert!(!marker.exists(), "no hook, fsmonitor or filter ran");
    let history_root = env.home().join("history");
    let mode = std::fs::metadata(&history_root)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700, "the history store is private");
}

#[tokio::test(flavor = "multi_thread")]
async fn over_http_an_agent_checkpoints_diffs_and_undoes_and_another_tenant_sees_404() {
    use grove_e2e::http::{Server, ALICE, BOB};
    use reqwest::StatusCode;
    use serde_json::json;
    let env =
        env_or_skip!("over_http_an_agent_checkpoints_diffs_and_undoes_and_another_tenant_sees_404");
    let url = env.fixture_repo("fixture", &[("src/lib.rs", "pub fn alpha() {}\n")]);
    let server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "c1").await;
    let call = |tool: &'static str, token: &'static str, args: Value| {
        let path = format!("/v1/workspaces/{ws}/tools/{tool}");
        let server = &server;
        async move { server.post(&path, token, args).await }
    };
    let (status, cp) = call("checkpoint", ALICE, json!({"name": "start"})).await;
    assert_eq!(status, StatusCode::OK, "{cp}");
    assert_eq!(cp["operation"]["name"], "start");
    let (status, w) = call(
        "write_file",
        ALICE,
        json!({"path": "src/lib.rs", "content": "broken\n"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{w}");
    let (status, d) = call(
        "history_diff",
        ALICE,
        json!({"since": cp["number"].to_string()}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{d}");
    assert_eq!(d["to_point"], Value::Null, "against now");
    assert_eq!(
        d["files"],
        json!([{"path": "src/lib.rs", "status": "modified"}])
    );
    assert!(d["patch"].as_str().unwrap().contains("+broken"), "{d}");
    let (status, u) = call("undo", ALICE, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{u}");
    let (_, body) = server.get(&format!("/v1/workspaces/{ws}"), ALICE).await;
    let dir = PathBuf::from(body["local_path"].as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(dir.join("src/lib.rs")).unwrap(),
        "pub fn alpha() {}\n"
    );
    let (status, h) = call("history", ALICE, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{h}");
    let kinds: Vec<&str> = h["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["operation"]["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["created", "checkpoint", "tool", "rewind"]);

    // Another tenant: 404 for every history tool, and nothing changed.
    for (tool, args) in [
        ("history", json!({})),
        ("history_diff", json!({"since": "0"})),
        ("rewind", json!({"point": "0"})),
        ("fork", json!({"point": "0", "scope": "bob"})),
    ] {
        let (status, body) = call(tool, BOB, args).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{tool}: {body}");
    }
    assert_eq!(env.count_events("workspace.forked").await, 0);
    let (_, again) = call("history", ALICE, json!({})).await;
    assert_eq!(again["total"], 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_eviction_sweep_thins_old_points_by_the_retention_policy() {
    let mut env = env_or_skip!("the_eviction_sweep_thins_old_points_by_the_retention_policy");
    env.spawn_worker_env(&[
        ("GROVE_ALLOW_CLOCK_OVERRIDE", "1"),
        ("GROVE_EVICT_MEASURE_EVERY", "0"),
        ("GROVE_HISTORY_KEEP_DAYS", "1"),
    ])
    .await;
    let url = env.fixture_repo("fixture", &[("src/lib.rs", "pub fn alpha() {}\n")]);
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let id = ws["id"].as_str().unwrap().to_string();
    let dir = PathBuf::from(ws["local_path"].as_str().unwrap());
    for i in 0..3 {
        run_step(
            &env,
            &id,
            &Step::Exec(["echo 0 > a", "echo 1 > b", "echo 2 > c"][i]),
        )
        .await;
    }
    let until = (chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339();
    env.grove_json(&["workspace", "pin", &id, "--until", &until])
        .await;
    let before = tree_of(&dir);
    let last = history(&env, &id, &["list"]).await["points"][3]["snapshot"].clone();

    // Now: nothing is old enough.
    env.grove_json(&["evict"]).await;
    assert_eq!(history(&env, &id, &["list"]).await["total"], 4);
    // Three days on: the day's points are thinned to its last.
    let later = (chrono::Utc::now() + chrono::Duration::days(3)).to_rfc3339();
    env.grove_json(&["evict", "--now", &later]).await;
    let h = history(&env, &id, &["list"]).await;
    assert_eq!(h["total"], 1, "{h}");
    assert_eq!(h["points"][0]["number"], 3);
    assert_eq!(h["points"][0]["snapshot"], last);
    assert_eq!(env.count_events("workspace.history_pruned").await, 1);
    assert_eq!(tree_of(&dir), before, "pruning changes no file");
    let store = store_of(&env, &id);
    let packs = std::fs::read_dir(store.join("objects/pack"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "pack"))
        .count();
    assert_eq!(packs, 1, "the pruned store was repacked");
    let (code, _) = history_fails(&env, &id, &["rewind", "1"]).await;
    assert_eq!(code, 3, "a dropped point is gone");
    let verify = env.grove(&["replay", "--verify"]).await;
    assert!(verify.status.success(), "{:?}", text(&verify));
}

/// The commit-order id of the newest event of `event_type` in workspace `id`'s stream.
async fn tx_of(env: &TestEnv, id: &str, event_type: &str) -> String {
    sqlx::query_scalar(
        "SELECT tx_id::text FROM grove.events WHERE stream_id = $1 AND event_type = $2
         ORDER BY position DESC LIMIT 1",
    )
    .bind(format!("workspace:{id}"))
    .bind(event_type)
    .fetch_one(&env.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_merge_back_is_a_point_with_the_files_it_brought() {
    let mut env = env_or_skip!("a_merge_back_is_a_point_with_the_files_it_brought");
    let s = start(&mut env).await;
    let task = env
        .grove_json(&acquire_args(&s.url, "task", &["--task", "t1"]))
        .await;
    let task_id = task["id"].as_str().unwrap().to_string();
    let task_dir = PathBuf::from(task["local_path"].as_str().unwrap());
    // The task's work: two files added, one modified, one deleted, in one commit.
    std::fs::create_dir_all(task_dir.join("docs")).unwrap();
    std::fs::write(task_dir.join("docs/new.md"), "new\n").unwrap();
    std::fs::write(task_dir.join("feature.txt"), "feature\n").unwrap();
    std::fs::write(task_dir.join("README.md"), "# from the task\n").unwrap();
    std::fs::remove_file(task_dir.join("src/util.rs")).unwrap();
    git(&task_dir, &["add", "-A"]);
    git(&task_dir, &["commit", "-q", "-m", "task work"]);
    let before = tree_of(&s.dir);

    let merged = env
        .grove_json(&[
            "workspace",
            "merge-back",
            &s.id,
            "--task",
            &task_id,
            "--strategy",
            "merge",
        ])
        .await;
    assert_eq!(merged["fast_forward"], true, "{merged}");
    let after = tree_of(&s.dir);
    assert_eq!(counts(&before, &after), (2, 1, 1));

    let h = history(&env, &s.id, &["list"]).await;
    assert_eq!(h["total"], 2, "{h}");
    let p = &h["points"][1];
    assert_eq!(p["operation"]["kind"], "merge_back", "{p}");
    assert_eq!(p["operation"]["task_workspace_id"], task_id.as_str());
    assert_eq!(p["operation"]["commits"], 1);
    assert_eq!(p["operation"]["fast_forward"], true);
    assert_eq!(
        (
            p["changes"]["added"].as_u64().unwrap(),
            p["changes"]["modified"].as_u64().unwrap(),
            p["changes"]["deleted"].as_u64().unwrap(),
        ),
        (2, 1, 1)
    );
    assert_eq!(p["head"], merged["new_head"]);
    assert_eq!(
        tx_of(&env, &s.id, "workspace.snapshot_taken").await,
        tx_of(&env, &s.id, "workspace.merged_back").await,
        "the point commits with the merge-back's own events"
    );
    // The merge-back can be undone like any change.
    history(&env, &s.id, &["undo"]).await;
    assert_eq!(tree_of(&s.dir), before);
    let verify = env.grove(&["replay", "--verify"]).await;
    assert!(verify.status.success(), "{:?}", text(&verify));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restore_continues_the_timeline_kept_through_eviction_and_rewinds_before_it() {
    let mut env = env_or_skip!(
        "a_restore_continues_the_timeline_kept_through_eviction_and_rewinds_before_it"
    );
    env.spawn_worker_env(&[
        ("GROVE_EVICT_SCHEDULE", "off"),
        ("GROVE_EVICT_MEASURE_EVERY", "0"),
        ("GROVE_ALLOW_CLOCK_OVERRIDE", "1"),
        ("GROVE_DISK_BUDGET", "1"),
        ("GROVE_PRESSURE_GRACE", "60"),
    ])
    .await;
    let url = env.fixture_repo("fixture", &[("README.md", "# fixture\n")]);
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let id = ws["id"].as_str().unwrap().to_string();
    let dir = PathBuf::from(ws["local_path"].as_str().unwrap());
    let mut trees = vec![tree_of(&dir)];
    for step in [
        "echo one > a.txt",
        "echo two > b.txt && echo changed > README.md",
    ] {
        run_step(&env, &id, &Step::Exec(step)).await;
        trees.push(tree_of(&dir));
    }
    let out = env.grove(&["workspace", "release", &id]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    env.grove_json(&["evict", "--now", &later]).await;
    let state: String =
        sqlx::query_scalar("SELECT state FROM grove.sandbox_workspaces WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(state, "evicted");
    assert!(!dir.exists(), "the files are gone");
    assert!(
        store_of(&env, &id).is_dir(),
        "eviction keeps the history store"
    );

    let restored = env.grove_json(&["workspace", "restore", &id]).await;
    assert_eq!(restored["state"], "ready", "{restored}");
    assert_eq!(tree_of(&dir), trees[2], "the saved work is back");
    let h = history(&env, &id, &["list"]).await;
    assert_eq!(h["total"], 4, "{h}");
    let p = &h["points"][3];
    assert_eq!(p["number"], 3);
    assert_eq!(p["operation"]["kind"], "restore", "{p}");
    assert_eq!(
        p["changes"],
        serde_json::json!({"added": 0, "modified": 0, "deleted": 0})
    );
    assert_eq!(
        tx_of(&env, &id, "workspace.snapshot_taken").await,
        tx_of(&env, &id, "workspace.restored").await,
        "the point commits with the restore's own events"
    );

    // A point taken before the eviction is still one to rewind to.
    let r = history(&env, &id, &["rewind", "1"]).await;
    assert_eq!(r["output"], "rewound", "{r}");
    assert_eq!(tree_of(&dir), trees[1]);
    let verify = env.grove(&["replay", "--verify"]).await;
    assert!(verify.status.success(), "{:?}", text(&verify));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_workspace_acquired_with_history_ignored_keeps_ignored_files_within_the_budget() {
    let mut env = env_or_skip!(
        "a_workspace_acquired_with_history_ignored_keeps_ignored_files_within_the_budget"
    );
    env.spawn_worker_env(&[("GROVE_HISTORY_IGNORED_BUDGET_BYTES", "1000")])
        .await;
    let url = env.fixture_repo(
        "fixture",
        &[
            ("README.md", "# fixture\n"),
            (".gitignore", "build/\n*.log\n"),
        ],
    );
    let mut args = acquire_args(&url, "edit", &["--conversation", "c1"]);
    args.push("--history-ignored");
    let ws = env.grove_json(&args).await;
    assert_eq!(ws["history_ignored"], true, "{ws}");
    let id = ws["id"].as_str().unwrap().to_string();
    let plain = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c2"]))
        .await;
    let plain_id = plain["id"].as_str().unwrap().to_string();
    assert_eq!(plain["history_ignored"], false);

    // Build output within the budget, a link out, and a log over it.
    let script = "mkdir -p build && printf 'object code\\n' > build/out.o \
                  && ln -s /etc/passwd build/passwd && head -c 5000 /dev/zero > big.log";
    for ws_id in [&id, &plain_id] {
        run_step(&env, ws_id, &Step::Exec(script)).await;
    }
    let h = history(&env, &id, &["list"]).await;
    let p = &h["points"][1];
    assert_eq!(
        p["changes"]["added"], 2,
        "build/out.o and build/passwd: {p}"
    );
    assert_eq!(p["ignored_omitted"], 1, "big.log: {p}");
    let out = history(&env, &id, &["show", "1", "build/out.o"]).await;
    assert_eq!(out["content"], "object code\n");
    let link = history(&env, &id, &["show", "1", "build/passwd"]).await;
    assert_eq!(link["content"], "/etc/passwd", "a link, not the host file");
    let (code, _) = history_fails(&env, &id, &["show", "1", "big.log"]).await;
    assert_eq!(code, 3);
    let omitted: Vec<i64> = sqlx::query_scalar(
        "SELECT (payload->>'ignored_omitted')::bigint FROM grove.events
         WHERE event_type = 'workspace.snapshot_taken' AND payload ? 'ignored_omitted'",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(omitted, [1], "the event says what was left out");
    let ph = history(&env, &plain_id, &["list"]).await;
    assert_eq!(
        ph["points"][1]["changes"]["added"], 0,
        "ignored files excluded by default"
    );
    assert_eq!(ph["points"][1]["ignored_omitted"], 0);
    let dirty: bool =
        sqlx::query_scalar("SELECT dirty FROM grove.sandbox_workspaces WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert!(!dirty, "ignored files never make a workspace dirty");

    // Gone, then back by undo.
    let dir = PathBuf::from(ws["local_path"].as_str().unwrap());
    run_step(&env, &id, &Step::Exec("rm -rf build")).await;
    assert!(!dir.join("build").exists());
    history(&env, &id, &["undo"]).await;
    assert_eq!(
        std::fs::read_to_string(dir.join("build/out.o")).unwrap(),
        "object code\n"
    );
    assert_eq!(
        std::fs::read_link(dir.join("build/passwd")).unwrap(),
        PathBuf::from("/etc/passwd")
    );
    let verify = env.grove(&["replay", "--verify"]).await;
    assert!(verify.status.success(), "{:?}", text(&verify));
}

/// The history store of workspace `id` (`$GROVE_HOME/history/<user>/<id>`).
fn store_of(env: &TestEnv, id: &str) -> PathBuf {
    let stores: Vec<PathBuf> = std::fs::read_dir(env.home().join("history"))
        .unwrap()
        .flatten()
        .map(|user| user.path().join(id))
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(stores.len(), 1, "{stores:?}");
    stores[0].clone()
}

/// Every file of `tree` is at point `n` with its bytes (or link target), and the point
/// counts `want` against the one before.
async fn assert_point_is(env: &TestEnv, id: &str, n: usize, tree: &Tree, want: (u64, u64, u64)) {
    let h = history(env, id, &["list", "--limit", "100"]).await;
    let p = &h["points"][n];
    let got = (
        p["changes"]["added"].as_u64().unwrap(),
        p["changes"]["modified"].as_u64().unwrap(),
        p["changes"]["deleted"].as_u64().unwrap(),
    );
    assert_eq!(got, want, "point {n}: {p}");
    for (path, entry) in tree {
        let shown = history(env, id, &["show", &n.to_string(), path]).await;
        let want = match entry {
            Entry::File(bytes, _) => String::from_utf8_lossy(bytes).into_owned(),
            Entry::Link(target) => target.to_string_lossy().into_owned(),
        };
        assert_eq!(shown["content"], want.as_str(), "point {n}, {path}");
    }
}

/// The worker reads only what its change tracker saw change (ADR 32). Changes made
/// between calls by a process outside any exec (as one an exec left running would:
/// written here from the host, so that the runtime's own ending of a command's
/// processes does not decide the test) are in the next call's point: new files, a
/// `mkdir -p` with files inside, a renamed directory, a deleted one, and a watched
/// directory swapped for a link to `/etc` (stored as a link, nothing of `/etc` read).
#[tokio::test(flavor = "multi_thread")]
async fn changes_made_between_calls_outside_any_exec_are_in_the_next_point_exactly() {
    let mut env =
        env_or_skip!("changes_made_between_calls_outside_any_exec_are_in_the_next_point_exactly");
    let s = start(&mut env).await;
    // The first change's point walks the tree and starts the tracker.
    run_step(
        &env,
        &s.id,
        &Step::Exec("mkdir -p keep/inner && echo k > keep/inner/k.txt"),
    )
    .await;
    let mut prev = tree_of(&s.dir);

    std::fs::write(s.dir.join("late.txt"), "written after the exec answered\n").unwrap();
    std::fs::write(s.dir.join("README.md"), "# changed from outside\n").unwrap();
    std::fs::create_dir_all(s.dir.join("x/y/z")).unwrap();
    std::fs::write(s.dir.join("x/y/z/f.txt"), "deep\n").unwrap();
    run_step(
        &env,
        &s.id,
        &Step::Tool(&["write", "w.txt", "--content", "tool\n"]),
    )
    .await;
    let now = tree_of(&s.dir);
    assert_point_is(&env, &s.id, 2, &now, counts(&prev, &now)).await;
    prev = now;

    std::fs::rename(s.dir.join("x"), s.dir.join("x2")).unwrap();
    std::fs::write(s.dir.join("x2/y/z/f.txt"), "moved and changed\n").unwrap();
    run_step(&env, &s.id, &Step::Exec("true")).await;
    let now = tree_of(&s.dir);
    assert_point_is(&env, &s.id, 3, &now, counts(&prev, &now)).await;
    prev = now;

    std::fs::remove_dir_all(s.dir.join("x2")).unwrap();
    std::fs::remove_dir_all(s.dir.join("keep")).unwrap();
    std::os::unix::fs::symlink("/etc", s.dir.join("keep")).unwrap();
    run_step(&env, &s.id, &Step::Exec("true")).await;
    let now = tree_of(&s.dir);
    assert_point_is(&env, &s.id, 4, &now, counts(&prev, &now)).await;
    let (code, _) = history_fails(&env, &s.id, &["show", "4", "keep/passwd"]).await;
    assert_eq!(code, 3, "no host file is in a point");

    let verify = env.grove(&["replay", "--verify"]).await;
    assert!(verify.status.success(), "{:?}", text(&verify));
}
