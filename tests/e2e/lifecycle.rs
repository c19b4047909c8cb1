//! Repo caches and workspaces through the CLI: clone once, keys, branches, modes, dirty.

use grove_e2e::{acquire_args, text};

use crate::env_or_skip;

#[tokio::test(flavor = "multi_thread")]
async fn ensuring_a_cache_twice_clones_once() {
    let mut env = env_or_skip!("ensuring_a_cache_twice_clones_once");
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let first = env
        .grove_json(&["repo", "ensure", "--repo", "o/fixture", "--url", &url])
        .await;
    let second = env
        .grove_json(&["repo", "ensure", "--repo", "o/fixture", "--url", &url])
        .await;
    assert_eq!(first["id"], second["id"]);
    assert_eq!(first["local_path"], second["local_path"]);
    assert_eq!(env.count_events("repo_cache.created").await, 1);
    assert_eq!(
        env.count_events("repo_cache.fetched").await,
        0,
        "a fresh cache must not be fetched again"
    );
    assert_eq!(env.count_events("repo_cache.used").await, 1);
    let repos: Vec<_> = std::fs::read_dir(env.home().join("repos"))
        .unwrap()
        .collect();
    assert_eq!(repos.len(), 1, "one cache directory");
    assert_eq!(
        env.worker_logs().matches("cloning repo cache").count(),
        1,
        "one clone in the worker log"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn url_forms_of_one_repository_share_one_cache_and_fetch_brings_new_commits() {
    let mut env =
        env_or_skip!("url_forms_of_one_repository_share_one_cache_and_fetch_brings_new_commits");
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("a", "1\n")]);
    let first = env
        .grove_json(&["repo", "ensure", "--repo", "o/fixture", "--url", &url])
        .await;
    // Same repository, trailing slash: one identity.
    let slash = format!("{url}/");
    let again = env
        .grove_json(&["repo", "ensure", "--repo", "o/fixture", "--url", &slash])
        .await;
    assert_eq!(first["id"], again["id"]);
    let upstream = env.dir.path().join("upstream/fixture");
    std::fs::write(upstream.join("b"), "2\n").unwrap();
    grove_e2e::git(&upstream, &["add", "b"]);
    grove_e2e::git(&upstream, &["commit", "-q", "-m", "second"]);
    env.grove_json(&[
        "repo",
        "ensure",
        "--repo",
        "o/fixture",
        "--url",
        &url,
        "--fetch",
    ])
    .await;
    assert_eq!(env.count_events("repo_cache.fetched").await, 1);
    let head = grove_e2e::git(&upstream, &["rev-parse", "HEAD"]);
    let cache = first["local_path"].as_str().unwrap();
    let cached = grove_e2e::git(
        std::path::Path::new(cache),
        &["rev-parse", "refs/heads/main"],
    );
    assert_eq!(head, cached);
}

#[tokio::test(flavor = "multi_thread")]
async fn acquiring_an_edit_workspace_twice_returns_the_same_workspace_and_other_keys_get_their_own()
{
    let mut env = env_or_skip!(
        "acquiring_an_edit_workspace_twice_returns_the_same_workspace_and_other_keys_get_their_own"
    );
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("src/lib.rs", "fn main() {}\n")]);
    let a1 = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let a2 = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    assert_eq!(a1["id"], a2["id"]);
    assert_eq!(a1["local_path"], a2["local_path"]);
    assert_eq!(a1["branch_name"], "agent/edits-c1");
    assert_eq!(a1["capabilities"]["writable"], true);

    let b = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c2"]))
        .await;
    assert_ne!(a1["id"], b["id"]);
    assert_ne!(a1["local_path"], b["local_path"]);
    assert_eq!(b["branch_name"], "agent/edits-c2");

    let t = env
        .grove_json(&acquire_args(&url, "task", &["--task", "t9"]))
        .await;
    assert_eq!(t["branch_name"], "agent/task-t9");
    assert_eq!(t["mode"], "task");

    let an = env.grove_json(&acquire_args(&url, "analysis", &[])).await;
    assert_eq!(an["branch_name"], serde_json::Value::Null);
    assert_eq!(an["capabilities"]["writable"], false);

    for ws in [&a1, &b, &t] {
        let dir = std::path::Path::new(ws["local_path"].as_str().unwrap());
        let branch = grove_e2e::git(dir, &["rev-parse", "--abbrev-ref", "HEAD"]);
        assert_eq!(branch.trim(), ws["branch_name"].as_str().unwrap());
        assert!(dir.join("src/lib.rs").is_file());
    }
    assert_eq!(env.count_events("workspace.created").await, 4);
    let listed = env
        .grove(&["workspace", "list", "--user", "u1", "--json"])
        .await;
    assert_eq!(text(&listed).0.lines().count(), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_in_an_analysis_workspace_fails_and_a_write_in_an_edit_workspace_marks_it_dirty() {
    let mut env = env_or_skip!(
        "a_write_in_an_analysis_workspace_fails_and_a_write_in_an_edit_workspace_marks_it_dirty"
    );
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("f.txt", "one\n")]);
    let analysis = env.grove_json(&acquire_args(&url, "analysis", &[])).await;
    let an_id = analysis["id"].as_str().unwrap();
    let an_dir = std::path::PathBuf::from(analysis["local_path"].as_str().unwrap());

    // A write-class command is refused outright on a read-only workspace.
    let refused = env
        .grove(&[
            "exec",
            an_id,
            "--kind",
            "write",
            "--",
            "sh",
            "-c",
            "echo x > new.txt",
        ])
        .await;
    assert_eq!(refused.status.code(), Some(1), "{:?}", text(&refused));
    assert!(
        text(&refused).1.contains("read-only"),
        "{:?}",
        text(&refused)
    );
    // A read command that tries to write anyway hits a read-only filesystem.
    let blocked = env
        .grove(&["exec", an_id, "--", "sh", "-c", "echo x > new.txt"])
        .await;
    assert_ne!(blocked.status.code(), Some(0));
    assert!(
        !an_dir.join("new.txt").exists(),
        "nothing may be written to an analysis workspace"
    );
    let shown = env.grove_json(&["workspace", "show", an_id]).await;
    assert_eq!(shown["dirty"], false);

    let edit = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let ed_id = edit["id"].as_str().unwrap();
    assert_eq!(edit["dirty"], false);
    let ok = env
        .grove(&["exec", ed_id, "--", "sh", "-c", "echo two >> f.txt"])
        .await;
    assert!(ok.status.success(), "{:?}", text(&ok));
    let shown = env.grove_json(&["workspace", "show", ed_id]).await;
    assert_eq!(shown["dirty"], true);
    let ed_dir = std::path::PathBuf::from(edit["local_path"].as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(ed_dir.join("f.txt")).unwrap(),
        "one\ntwo\n"
    );

    // git inside the workspace works: commit, and the workspace is clean again.
    let commit = env
        .grove(&[
            "exec",
            ed_id,
            "--",
            "sh",
            "-c",
            "git add -A && git commit -qm edit && git status --porcelain",
        ])
        .await;
    assert!(commit.status.success(), "{:?}", text(&commit));
    assert_eq!(text(&commit).0, "");
    assert_eq!(
        env.grove_json(&["workspace", "show", ed_id]).await["dirty"],
        false
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_returns_output_exit_codes_timeouts_and_truncation() {
    let mut env = env_or_skip!("exec_returns_output_exit_codes_timeouts_and_truncation");
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let id = ws["id"].as_str().unwrap();

    let out = env
        .grove(&[
            "exec",
            id,
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 7",
        ])
        .await;
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(text(&out).0, "out\n");
    assert!(text(&out).1.contains("err"));

    let t0 = std::time::Instant::now();
    let out = env
        .grove(&[
            "exec",
            id,
            "--timeout",
            "1",
            "--",
            "sh",
            "-c",
            "echo before; sleep 30",
        ])
        .await;
    assert_eq!(out.status.code(), Some(124));
    assert_eq!(text(&out).0, "before\n");
    assert!(t0.elapsed() < std::time::Duration::from_secs(10));

    let json = env
        .grove_json(&[
            "exec",
            id,
            "--max-output",
            "100",
            "--",
            "sh",
            "-c",
            "head -c 5000 /dev/zero | tr '\\0' a",
        ])
        .await;
    assert_eq!(json["truncated"], true);
    assert!(json["stdout"].as_str().unwrap().len() <= 100);

    let env_out = env
        .grove_json(&["exec", id, "--env", "FOO=bar", "--", "env"])
        .await;
    let printed = env_out["stdout"].as_str().unwrap();
    assert!(printed.contains("FOO=bar"));
    assert!(
        !printed.contains("DATABASE_URL"),
        "the worker's environment leaked: {printed}"
    );

    let escape = env.grove(&["exec", id, "--cwd", "..", "--", "pwd"]).await;
    assert_eq!(escape.status.code(), Some(2), "{:?}", text(&escape));

    let stdin = {
        use tokio::io::AsyncWriteExt;
        let mut cmd = env.command(&["exec", id, "--stdin", "--", "cat"]);
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"piped input")
            .await
            .unwrap();
        child.wait_with_output().await.unwrap()
    };
    assert_eq!(text(&stdin).0, "piped input");
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_get_no_network_unless_they_ask_and_limited_is_refused_not_widened() {
    let mut env =
        env_or_skip!("commands_get_no_network_unless_they_ask_and_limited_is_refused_not_widened");
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let id = ws["id"].as_str().unwrap();
    let interfaces = |out: &serde_json::Value| -> Vec<String> {
        out["stdout"]
            .as_str()
            .unwrap()
            .lines()
            .skip(2)
            .filter_map(|l| l.split(':').next())
            .map(|s| s.trim().to_string())
            .collect()
    };
    let none = env
        .grove_json(&["exec", id, "--", "cat", "/proc/net/dev"])
        .await;
    assert_eq!(interfaces(&none), vec!["lo".to_string()]);
    let host_ifaces = std::fs::read_to_string("/proc/net/dev")
        .unwrap()
        .lines()
        .count()
        - 2;
    if host_ifaces > 1 {
        let default = env
            .grove_json(&[
                "exec",
                id,
                "--network",
                "default",
                "--",
                "cat",
                "/proc/net/dev",
            ])
            .await;
        assert!(
            interfaces(&default).len() > 1,
            "network default should see the host's interfaces"
        );
    } else {
        eprintln!("note: this host has only loopback; the network-default half of the check proves nothing here");
    }
    let limited = env
        .grove(&["exec", id, "--network", "limited", "--", "true"])
        .await;
    assert_eq!(limited.status.code(), Some(1), "{:?}", text(&limited));
    assert!(text(&limited).1.contains("limited"), "{:?}", text(&limited));
}
