//! The agent tool surface as jobs: `grove tool` against a real worker — edits, search,
//! commit and push, the events that record writes, read-only refusals, path escapes.

use std::path::PathBuf;

use grove_e2e::{acquire_args, files_containing, git, text, TestEnv};
use sha2::{Digest, Sha256};

use crate::env_or_skip;

/// A worker, a fixture repository and an acquired workspace of `mode`.
async fn setup(env: &mut TestEnv, mode: &str) -> (String, PathBuf, PathBuf) {
    env.spawn_worker().await;
    env.fixture_repo(
        "fixture",
        &[
            ("src/lib.rs", "pub fn alpha() {}\n"),
            ("README.md", "# fixture\n"),
        ],
    );
    let scope: &[&str] = match mode {
        "edit" => &["--conversation", "c1"],
        _ => &[],
    };
    // A bare remote to push to (libgit2 pushes only to bare local repositories).
    let upstream = env.dir.path().join("upstream");
    git(
        &upstream,
        &["clone", "-q", "--bare", "fixture", "fixture.git"],
    );
    let bare = upstream.join("fixture.git");
    let url = format!("file://{}", bare.display());
    let ws = env.grove_json(&acquire_args(&url, mode, scope)).await;
    let id = ws["id"].as_str().unwrap().to_string();
    let dir = PathBuf::from(ws["local_path"].as_str().unwrap());
    (id, dir, bare)
}

async fn tool(env: &TestEnv, id: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["tool", id];
    all.extend_from_slice(args);
    env.grove_json(&all).await
}

async fn tool_fails(env: &TestEnv, id: &str, args: &[&str]) -> (i32, String) {
    let mut all = vec!["tool", id];
    all.extend_from_slice(args);
    let out = env.grove(&all).await;
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{args:?} succeeded: {stdout}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    (out.status.code().unwrap(), stderr)
}

async fn payloads(env: &TestEnv, event_type: &str) -> Vec<serde_json::Value> {
    sqlx::query_scalar("SELECT payload FROM grove.events WHERE event_type = $1 ORDER BY position")
        .bind(event_type)
        .fetch_all(&env.pool)
        .await
        .unwrap()
}

fn sha256(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

#[tokio::test(flavor = "multi_thread")]
async fn write_replace_search_commit_and_push_through_tool_jobs_each_write_an_event() {
    let mut env =
        env_or_skip!("write_replace_search_commit_and_push_through_tool_jobs_each_write_an_event");
    let (id, dir, upstream) = setup(&mut env, "edit").await;

    let notes = "- rename alpha\n";
    let w = tool(&env, &id, &["write", "notes/todo.md", "--content", notes]).await;
    assert_eq!(w["output"], "written");
    assert_eq!(w["created"], true);
    assert_eq!(w["sha256"], sha256(notes));
    assert_eq!(
        std::fs::read_to_string(dir.join("notes/todo.md")).unwrap(),
        notes
    );

    let r = tool(
        &env,
        &id,
        &[
            "str-replace",
            "src/lib.rs",
            "--old",
            "alpha",
            "--new",
            "beta",
        ],
    )
    .await;
    assert_eq!(r["created"], false);
    let lib = "pub fn beta() {}\n";
    assert_eq!(r["sha256"], sha256(lib));
    assert_eq!(
        std::fs::read_to_string(dir.join("src/lib.rs")).unwrap(),
        lib
    );

    // Search reads the working tree: the uncommitted edit is there, the old text is not.
    let s = tool(&env, &id, &["search", "beta", "--glob", "*.rs"]).await;
    assert_eq!(s["hits"].as_array().unwrap().len(), 1, "{s}");
    assert_eq!(s["hits"][0]["path"], "src/lib.rs");
    assert_eq!(s["hits"][0]["line"], 1);
    assert_eq!(s["hits"][0]["text"], "pub fn beta() {}");
    let s = tool(&env, &id, &["search", "alpha", "--glob", "*.rs"]).await;
    assert!(s["hits"].as_array().unwrap().is_empty(), "{s}");

    let show = env.grove_json(&["workspace", "show", &id]).await;
    assert_eq!(show["dirty"], true, "a write marks the workspace dirty");

    let view = tool(&env, &id, &["view", "src/lib.rs"]).await;
    assert_eq!(view["text"], "     1\tpub fn beta() {}\n");
    let st = tool(&env, &id, &["status"]).await;
    assert_eq!(st["branch"], "agent/edits-c1");
    assert_eq!(st["entries"].as_array().unwrap().len(), 2, "{st}");
    let d = tool(&env, &id, &["diff"]).await;
    assert!(
        d["patch"].as_str().unwrap().contains("+pub fn beta() {}"),
        "{d}"
    );

    let c = tool(&env, &id, &["commit", "-m", "Rename alpha to beta"]).await;
    let commit = c["commit"].as_str().unwrap().to_string();
    assert_eq!(
        c["files"],
        serde_json::json!(["notes/todo.md", "src/lib.rs"])
    );
    let show = env.grove_json(&["workspace", "show", &id]).await;
    assert_eq!(
        show["dirty"], false,
        "a commit of everything leaves it clean"
    );
    let log = tool(&env, &id, &["log", "-n", "1"]).await;
    assert_eq!(log["entries"][0]["commit"], commit.as_str());
    assert_eq!(log["entries"][0]["summary"], "Rename alpha to beta");
    let d = tool(&env, &id, &["diff", "--base"]).await;
    assert!(
        d["patch"].as_str().unwrap().contains("-pub fn alpha() {}"),
        "{d}"
    );

    // Push to the upstream (a real local repository) and record the upstream.
    let p = tool(&env, &id, &["push", "--set-upstream"]).await;
    assert_eq!(p["branch"], "agent/edits-c1");
    assert_eq!(p["previous"], serde_json::Value::Null);
    assert_eq!(
        git(&upstream, &["rev-parse", "agent/edits-c1"]).trim(),
        commit
    );

    // A second push with a token: it travels like an acquire's and lands nowhere.
    let token = format!("ghs_tooltoken_{}", uuid::Uuid::new_v4().simple());
    tool(&env, &id, &["write", "more.txt", "--content", "more\n"]).await;
    tool(&env, &id, &["commit", "-m", "more"]).await;
    let out = env
        .grove_env(
            &["tool", &id, "push", "--token-env", "GIT_TOKEN"],
            &[("GIT_TOKEN", &token)],
        )
        .await;
    assert!(out.status.success(), "{:?}", text(&out));
    assert!(!text(&out).0.contains(&token) && !text(&out).1.contains(&token));
    assert!(files_containing(&env.home(), token.as_bytes()).is_empty());
    assert!(!env.worker_logs().contains(&token));
    let in_db: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM grove.events WHERE payload::text LIKE '%' || $1 || '%' OR metadata::text LIKE '%' || $1 || '%')
              + (SELECT count(*) FROM grove.commands WHERE payload::text LIKE '%' || $1 || '%' OR coalesce(result::text, '') LIKE '%' || $1 || '%')
              + (SELECT count(*) FROM grove.command_secrets)",
    )
    .bind(&token)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        in_db, 0,
        "the push token (or its secret row) is in the database"
    );

    // The log says what changed, never the content.
    let written = payloads(&env, "workspace.file_written").await;
    assert_eq!(written.len(), 3);
    assert_eq!(written[0]["path"], "notes/todo.md");
    assert_eq!(written[0]["op"], "write_file");
    assert_eq!(written[0]["sha256"], sha256(notes));
    assert_eq!(written[0]["size_bytes"], notes.len());
    assert_eq!(written[1]["path"], "src/lib.rs");
    assert_eq!(written[1]["op"], "str_replace");
    assert_eq!(written[1]["sha256"], sha256(lib));
    for w in &written {
        let text = w.to_string();
        assert!(
            !text.contains("rename alpha") && !text.contains("pub fn"),
            "{text}"
        );
    }
    assert_eq!(
        payloads(&env, "workspace.committed").await[0]["commit"],
        commit.as_str()
    );
    let pushed = payloads(&env, "workspace.pushed").await;
    assert_eq!(pushed.len(), 2);
    assert_eq!(pushed[0]["commit"], commit.as_str());
    assert_eq!(pushed[1]["previous"], commit.as_str());
    let dirty: Vec<bool> = payloads(&env, "workspace.dirty_changed")
        .await
        .iter()
        .map(|p| p["dirty"].as_bool().unwrap())
        .collect();
    assert_eq!(dirty, vec![true, false, true, false]);

    let out = env.grove(&["replay", "--verify"]).await;
    assert!(out.status.success(), "{:?}", text(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_workspace_refuses_write_tools_and_offers_none() {
    let mut env = env_or_skip!("a_read_only_workspace_refuses_write_tools_and_offers_none");
    let (id, dir, _) = setup(&mut env, "analysis").await;
    for args in [
        &["write", "new.txt", "--content", "x"][..],
        &["create", "new.txt", "--content", "x"],
        &["str-replace", "README.md", "--old", "fixture", "--new", "x"],
        &["insert", "README.md", "--line", "0", "--text", "x"],
        &["commit", "-m", "x"],
        &["push"],
    ] {
        let (code, stderr) = tool_fails(&env, &id, args).await;
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains("rejected:") && stderr.contains("read-only"),
            "{args:?}: {stderr}"
        );
    }
    assert!(!dir.join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(dir.join("README.md")).unwrap(),
        "# fixture\n"
    );
    assert_eq!(env.count_events("workspace.file_written").await, 0);
    // Reads still work.
    let r = tool(&env, &id, &["read", "README.md"]).await;
    assert_eq!(r["content"], "# fixture\n");
    // The tools offered: no write tool.
    let out = env.grove(&["tool", &id, "list"]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    let tools: Vec<serde_json::Value> = text(&out)
        .0
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(tools.iter().any(|t| t["name"] == "view"));
    assert!(tools.iter().all(|t| t["writes"] == false), "{tools:?}");
    assert!(!tools.iter().any(|t| t["name"] == "str_replace"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_symlink_to_etc_and_other_escapes_are_refused_as_bad_input() {
    let mut env = env_or_skip!("a_symlink_to_etc_and_other_escapes_are_refused_as_bad_input");
    let (id, dir, _) = setup(&mut env, "edit").await;
    std::os::unix::fs::symlink("/etc", dir.join("etc")).unwrap();
    let outside = env.dir.path().join("outside.txt");
    std::fs::write(&outside, "secret\n").unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("inner.txt")).unwrap();
    for args in [
        &["read", "etc/passwd"][..],
        &["view", "etc"],
        &["ls", "etc"],
        &["write", "etc/grove-pwned", "--content", "x"],
        &["read", "inner.txt"],
        &["write", "inner.txt", "--content", "pwned"],
        &[
            "str-replace",
            "inner.txt",
            "--old",
            "secret",
            "--new",
            "pwned",
        ],
        &["read", "../../../../etc/passwd"],
        &["read", "/etc/passwd"],
        &["search", "root", "--path", "etc"],
    ] {
        let (code, stderr) = tool_fails(&env, &id, args).await;
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(
            stderr.contains("outside the workspace") || stderr.contains("invalid path"),
            "{args:?}: {stderr}"
        );
    }
    assert!(!std::path::Path::new("/etc/grove-pwned").exists());
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "secret\n");
    assert_eq!(env.count_events("workspace.file_written").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn editor_failures_have_their_exit_codes() {
    let mut env = env_or_skip!("editor_failures_have_their_exit_codes");
    let (id, _, _) = setup(&mut env, "edit").await;
    tool(&env, &id, &["write", "twice.txt", "--content", "x\nx\n"]).await;
    let (code, stderr) = tool_fails(&env, &id, &["create", "twice.txt", "--content", "y"]).await;
    assert_eq!(code, 4, "{stderr}");
    let (code, stderr) = tool_fails(
        &env,
        &id,
        &["str-replace", "twice.txt", "--old", "x", "--new", "y"],
    )
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("2 times"), "{stderr}");
    let (code, _) = tool_fails(&env, &id, &["read", "missing.txt"]).await;
    assert_eq!(code, 3);
    let (code, stderr) = tool_fails(
        &env,
        &id,
        &["insert", "twice.txt", "--line", "9", "--text", "z"],
    )
    .await;
    assert_eq!(code, 2, "{stderr}");
    let unknown = uuid::Uuid::new_v4().to_string();
    let (code, _) = tool_fails(&env, &unknown, &["status"]).await;
    assert_eq!(code, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_edit_whose_worker_died_is_not_run_again_and_ends_as_worker_lost() {
    let mut env =
        env_or_skip!("an_edit_whose_worker_died_is_not_run_again_and_ends_as_worker_lost");
    let (id, dir, _) = setup(&mut env, "edit").await;
    env.worker(0).kill9().await;
    let command_id = uuid::Uuid::new_v4();
    let cid = command_id.to_string();
    let mut cmd = env.command(&[
        "tool",
        &id,
        "str-replace",
        "src/lib.rs",
        "--old",
        "alpha",
        "--new",
        "beta",
        "--command-id",
        &cid,
    ]);
    cmd.env("GROVE_CLAIM_TIMEOUT", "60");
    let cli = tokio::spawn(async move { cmd.output().await.unwrap() });
    // The command is queued; make it look like an attempt that started on a worker that
    // then died (its job went back to the queue with the ledger left `running`).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let n = sqlx::query("UPDATE grove.commands SET status = 'running', attempts = 1 WHERE command_id = $1 AND status = 'queued'")
            .bind(command_id)
            .execute(&env.pool)
            .await
            .unwrap()
            .rows_affected();
        if n == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the command was never enqueued"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    env.spawn_worker().await;
    let out = cli.await.unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("worker_lost"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.join("src/lib.rs")).unwrap(),
        "pub fn alpha() {}\n",
        "the edit was not run again"
    );
    assert_eq!(env.count_events("workspace.file_written").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_workspace_handed_to_the_sandbox_user_stays_its_own_after_tool_writes_and_commits() {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: handing a workspace to another user needs root");
        return;
    }
    let mut env = env_or_skip!(
        "a_workspace_handed_to_the_sandbox_user_stays_its_own_after_tool_writes_and_commits"
    );
    let (id, dir, _) = setup(&mut env, "edit").await;
    // What the Docker runtime does on first use of a writable workspace.
    let chown = std::process::Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(chown.success());
    tool(
        &env,
        &id,
        &["write", "new/dir/file.txt", "--content", "x\n"],
    )
    .await;
    tool(&env, &id, &["commit", "-m", "add a file"]).await;
    let mut stack = vec![dir.clone()];
    while let Some(p) = stack.pop() {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534), "{}", p.display());
        if meta.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_git_config_in_the_workspace_redirects_no_push_and_reveals_no_host_file() {
    let mut env = env_or_skip!(
        "a_hostile_git_config_in_the_workspace_redirects_no_push_and_reveals_no_host_file"
    );
    let (id, dir, upstream) = setup(&mut env, "edit").await;
    // A listener where a hijacked push would land, and a host directory with a secret.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hijack = format!("http://{}/stolen.git", listener.local_addr().unwrap());
    listener.set_nonblocking(true).unwrap();
    let host = env.dir.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    let secret = format!("host-secret-{}", uuid::Uuid::new_v4().simple());
    std::fs::write(host.join("secret.txt"), &secret).unwrap();
    let host_dir = host.to_str().unwrap().to_string();
    // An included config file that parses and itself points the work tree at the host.
    let included = env.dir.path().join("included.cfg");
    std::fs::write(&included, format!("[core]\n\tworktree = {host_dir}\n")).unwrap();
    let keys: [(&str, &str); 5] = [
        ("remote.origin.url", &hijack),
        ("remote.origin.pushurl", &hijack),
        (&format!("url.{hijack}.insteadOf"), "file://"),
        ("core.worktree", &host_dir),
        ("include.path", included.to_str().unwrap()),
    ];
    for (key, value) in keys {
        git(&dir, &["-c", "safe.directory=*", "config", key, value]);
    }

    let status = tool(&env, &id, &["status"]).await;
    assert!(!status.to_string().contains("secret.txt"), "{status}");
    let diff = tool(&env, &id, &["diff"]).await;
    assert!(!diff.to_string().contains(&secret), "{diff}");
    tool(&env, &id, &["write", "a.txt", "--content", "a\n"]).await;
    let c = tool(&env, &id, &["commit", "-m", "a"]).await;
    let token = format!("ghs_hijack_{}", uuid::Uuid::new_v4().simple());
    let out = env
        .grove_env(
            &["tool", &id, "push", "--token-env", "GIT_TOKEN"],
            &[("GIT_TOKEN", &token)],
        )
        .await;
    assert!(out.status.success(), "{:?}", text(&out));
    // The commit reached the recorded upstream; the listener saw no connection at all.
    let pushed = git(&upstream, &["rev-parse", "agent/edits-c1"]);
    assert_eq!(pushed.trim(), c["commit"].as_str().unwrap());
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the hijack URL was contacted"
    );
    assert!(!text(&out).0.contains(&token) && !text(&out).1.contains(&token));
    assert_eq!(
        std::fs::read_to_string(host.join("secret.txt")).unwrap(),
        secret
    );
    assert_eq!(
        std::fs::read_dir(&host).unwrap().count(),
        1,
        "a file was written to the host dir"
    );
}
