//! Workspaces placed in a remote runtime (ADR 15) through the real CLI and worker,
//! against the loopback fakes of Daytona and E2B: acquire `--runtime daytona|e2b`
//! clones inside the provider's sandbox, exec runs there with the same request shape
//! as on a host, one sandbox per (user, project) and one upstream clone in it however
//! many conversations acquire at once, a restarted worker finds the sandbox again by
//! its labels, destroy removes the clone and the last one deletes the sandbox, and a
//! mismatch between placement and runtime is a typed error that changes nothing. Only
//! workers with the provider configured take those jobs (queue `grove:provider:<name>`).

use std::path::Path;

use grove_e2e::{acquire_args, git, text, TestEnv};
use serde_json::json;

use crate::daytona_fake::FakeDaytona;
use crate::e2b_fake::FakeE2b;

const TOKEN: &str = "tok_remote_placement_must_not_leak";

/// What the test reads from a provider's fake.
trait Fake {
    fn creates(&self) -> u64;
    fn live_sandboxes(&self) -> usize;
    /// Clones from upstream (those carrying the token), where the fake can tell.
    fn upstream_clones(&self) -> Option<usize>;
}

impl Fake for FakeDaytona {
    fn creates(&self) -> u64 {
        FakeDaytona::creates(self)
    }
    fn live_sandboxes(&self) -> usize {
        self.sandboxes().len()
    }
    fn upstream_clones(&self) -> Option<usize> {
        let passwords = self.clone_passwords();
        assert!(passwords.iter().all(|p| p == TOKEN), "{passwords:?}");
        Some(passwords.len())
    }
}

impl Fake for FakeE2b {
    fn creates(&self) -> u64 {
        FakeE2b::creates(self)
    }
    fn live_sandboxes(&self) -> usize {
        self.sandboxes().len()
    }
    fn upstream_clones(&self) -> Option<usize> {
        None
    }
}

async fn acquire(
    env: &TestEnv,
    url: &str,
    runtime: &str,
    conversation: &str,
) -> std::process::Output {
    let mut args = acquire_args(url, "edit", &["--conversation", conversation]);
    args.extend(["--runtime", runtime, "--token-env", "GT", "--json"]);
    env.grove_env(&args, &[("GT", TOKEN)]).await
}

async fn acquired(
    env: &TestEnv,
    url: &str,
    runtime: &str,
    conversation: &str,
) -> serde_json::Value {
    let out = acquire(env, url, runtime, conversation).await;
    assert!(
        out.status.success(),
        "acquire {conversation}: {}",
        text(&out).1
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Runs `argv` in workspace `id` with `--runtime runtime`; stdout, asserting exit 0.
async fn run(env: &TestEnv, id: &str, runtime: &str, argv: &[&str]) -> String {
    let mut args = vec!["exec", id, "--runtime", runtime, "--"];
    args.extend_from_slice(argv);
    let r = env.grove_json(&args).await;
    assert_eq!(r["exit_code"], 0, "{argv:?}: {r}");
    r["stdout"].as_str().unwrap().to_string()
}

async fn placement_lifecycle(test: &str, provider: &str, fake: &dyn Fake, vars: &[(&str, &str)]) {
    let Some(mut env) = TestEnv::new(test).await else {
        return;
    };
    // A worker without the provider: it places host workspaces only.
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let upstream = env.dir.path().join("upstream").join("fixture");
    let head = git(&upstream, &["rev-parse", "HEAD"]).trim().to_string();

    // An unknown placement is refused before anything is enqueued or created.
    let out = acquire(&env, &url, "nowhere", "c1").await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out).1);
    assert!(
        text(&out).1.contains("unknown workspace runtime"),
        "{}",
        text(&out).1
    );
    let commands: i64 = sqlx::query_scalar("SELECT count(*) FROM grove.commands")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM grove.events")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!((commands, events, fake.creates()), (0, 0, 0));

    // A placement in the provider goes to the provider's queue, which only workers with
    // the provider configured take: the plain worker leaves it alone.
    let mut args = acquire_args(&url, "edit", &["--conversation", "c1"]);
    args.extend(["--runtime", provider]);
    let out = env.grove_env(&args, &[("GROVE_CLAIM_TIMEOUT", "1")]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out).1);
    assert!(
        text(&out).1.contains(&format!(
            "no grove worker with the {provider} runtime configured"
        )),
        "{}",
        text(&out).1
    );
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM grove.events")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!((events, fake.creates()), (0, 0));

    // Two worker processes with the provider, one job at a time each, so the first two
    // acquires of one (user, project) run at once in two processes: the sandbox lock,
    // not a process's memory, is what keeps them to one sandbox and one upstream clone.
    let mut workers = vec![
        single_slot_worker(&env, vars, "a").await,
        single_slot_worker(&env, vars, "b").await,
    ];
    let (ws1, ws2) = tokio::join!(
        acquired(&env, &url, provider, "c1"),
        acquired(&env, &url, provider, "c2")
    );
    assert_eq!(fake.creates(), 1, "one sandbox per (user, project)");
    if let Some(clones) = fake.upstream_clones() {
        assert_eq!(
            clones, 1,
            "the repository is cloned from upstream once per sandbox"
        );
    }
    let claimed_by: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT metadata->>'worker_id' FROM grove.events
         WHERE event_type = 'workspace.created'",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        claimed_by.len(),
        2,
        "both workers placed one: {claimed_by:?}"
    );

    // The workspace lives in the provider: node = provider, path inside the sandbox.
    let id1 = ws1["id"].as_str().unwrap().to_string();
    let path1 = ws1["local_path"].as_str().unwrap().to_string();
    assert_eq!(ws1["node"], provider);
    assert!(path1.contains("/grove/workspaces/"), "{path1}");
    assert!(!Path::new(&path1).starts_with(env.home()), "{path1}");
    assert_eq!(ws1["base_commit"], head.as_str());
    assert_eq!(ws1["branch_name"], "agent/edits-c1");
    assert_eq!(ws1["capabilities"]["isolated"], false);
    assert_ne!(ws1["local_path"], ws2["local_path"]);

    // Exec: the same request as on a host, run inside the sandbox's checkout.
    assert_eq!(
        run(&env, &id1, provider, &["git", "rev-parse", "HEAD"])
            .await
            .trim(),
        head
    );
    assert_eq!(run(&env, &id1, provider, &["cat", "f"]).await, "x\n");
    // Without --json the output streams through and the exit code is the command's.
    let out = env
        .grove(&[
            "exec",
            &id1,
            "--runtime",
            provider,
            "--",
            "sh",
            "-c",
            "cat f; exit 3",
        ])
        .await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out).1);
    assert_eq!(text(&out).0, "x\n");
    assert_eq!(
        run(&env, &id1, provider, &["git", "branch", "--show-current"])
            .await
            .trim(),
        "agent/edits-c1"
    );

    // The same key again: the same workspace, nothing made.
    let again = acquired(&env, &url, provider, "c1").await;
    assert_eq!(again["id"], ws1["id"]);
    assert_eq!(env.count_events("workspace.acquired").await, 1);

    // A third conversation: a third directory, still one sandbox and one clone.
    let ws3 = acquired(&env, &url, provider, "c3").await;
    let (id2, id3) = (ws2["id"].as_str().unwrap(), ws3["id"].as_str().unwrap());
    assert_ne!(id2, id3);
    assert_eq!(fake.creates(), 1);
    if let Some(clones) = fake.upstream_clones() {
        assert_eq!(clones, 1);
    }
    assert_eq!(
        run(&env, id2, provider, &["sh", "-c", "ls .. | wc -l"])
            .await
            .trim(),
        "3"
    );
    assert_eq!(
        run(&env, id2, provider, &["sh", "-c", "ls ../../repos | wc -l"])
            .await
            .trim(),
        "1"
    );
    assert_eq!(env.count_events("repo_cache.created").await, 1);

    // read_file runs in the sandbox; a symlink out of the workspace, a directory, an
    // absent file and a lexical escape are refused.
    let read = env.grove_json(&["tool", &id1, "read", "f"]).await;
    assert_eq!(
        (&read["content"], &read["size_bytes"]),
        (&json!("x\n"), &json!(2))
    );
    run(
        &env,
        &id1,
        provider,
        &["sh", "-c", "ln -s ../../repos out && mkdir d"],
    )
    .await;
    for (path, code, says) in [
        ("out/x", 3, "not found"),
        ("out", 1, "outside the workspace"),
        ("d", 1, "not a regular file"),
        ("nope", 3, "not found"),
        ("../f", 2, ""),
    ] {
        let out = env.grove(&["tool", &id1, "read", path]).await;
        assert_eq!(out.status.code(), Some(code), "{path}: {}", text(&out).1);
        assert!(text(&out).1.contains(says), "{path}: {}", text(&out).1);
    }

    // write_file too: parents made, created then replaced, one event each with the
    // content's hash; a symlink out of the workspace or into .git is refused.
    let w = env
        .grove_json(&["tool", &id1, "write", "new/dir/g", "--content", "hello\n"])
        .await;
    assert_eq!((&w["created"], &w["size_bytes"]), (&json!(true), &json!(6)));
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"hello\n"));
    assert_eq!(w["sha256"], sha.as_str());
    let w = env
        .grove_json(&["tool", &id1, "write", "new/dir/g", "--content", "again\n"])
        .await;
    assert_eq!(w["created"], false);
    assert_eq!(
        run(&env, &id1, provider, &["cat", "new/dir/g"]).await,
        "again\n"
    );
    assert_eq!(env.count_events("workspace.file_written").await, 2);
    run(&env, &id1, provider, &["ln", "-s", ".git", "g"]).await;
    for (path, says) in [
        ("out/evil", "outside the workspace"),
        ("g/config", "inside .git"),
        (".git/config", "inside .git"),
        ("d", "not a regular file"),
    ] {
        let out = env
            .grove(&["tool", &id1, "write", path, "--content", "x"])
            .await;
        assert_eq!(out.status.code(), Some(1), "{path}: {}", text(&out).1);
        assert!(text(&out).1.contains(says), "{path}: {}", text(&out).1);
    }
    assert_eq!(env.count_events("workspace.file_written").await, 2);
    assert_eq!(
        run(
            &env,
            &id1,
            provider,
            &["sh", "-c", "ls ../../repos | wc -l"]
        )
        .await
        .trim(),
        "1",
        "nothing was written next to the sandbox's clone"
    );

    // Mismatches are typed refusals that record nothing.
    let started = env.count_events("exec.started").await;
    let out = env
        .grove(&["exec", &id1, "--runtime", "local", "--", "true"])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out).1);
    assert!(
        text(&out).1.contains(&format!("lives inside {provider}")),
        "{}",
        text(&out).1
    );
    let out = env.grove(&["tool", &id1, "status"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out)
            .1
            .contains(&format!("not available on a {provider} workspace")),
        "{}",
        text(&out).1
    );
    let host = env
        .grove(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    assert_eq!(host.status.code(), Some(4), "{}", text(&host).1);
    assert_eq!(env.count_events("exec.started").await, started);

    // A host workspace is not reachable from the remote runtime.
    let host = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "h1"]))
        .await;
    let host_id = host["id"].as_str().unwrap();
    let out = env
        .grove(&["exec", host_id, "--runtime", provider, "--", "true"])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out).1);
    assert!(text(&out).1.contains("lives on node"), "{}", text(&out).1);
    assert_eq!(env.count_events("exec.started").await, started);

    // A new worker process (a new provider instance) finds the sandbox by its labels.
    for (child, _) in &mut workers {
        child.kill().await.unwrap();
    }
    env.spawn_worker_env(vars).await;
    assert_eq!(run(&env, id2, provider, &["cat", "f"]).await, "x\n");
    assert_eq!(
        fake.creates(),
        1,
        "the restarted worker recreated the sandbox"
    );

    // Destroy removes the clone, not the sandbox; the last destroy deletes it.
    let out = env.grove(&["workspace", "destroy", &id1]).await;
    assert!(out.status.success(), "{}", text(&out).1);
    assert_eq!(
        run(&env, id2, provider, &["sh", "-c", "ls .. | wc -l"])
            .await
            .trim(),
        "2"
    );
    assert_eq!(fake.live_sandboxes(), 1);
    for id in [id2, id3] {
        let out = env.grove(&["workspace", "destroy", id]).await;
        assert!(out.status.success(), "{}", text(&out).1);
    }
    assert_eq!(
        fake.live_sandboxes(),
        0,
        "the last destroy deletes the sandbox"
    );

    let out = env.grove(&["replay", "--verify"]).await;
    assert!(
        out.status.success(),
        "replay: {} {}",
        text(&out).0,
        text(&out).1
    );
    let events = env.grove(&["events", "--json"]).await;
    assert!(
        !text(&events).0.contains(TOKEN),
        "the token reached an event"
    );
    assert!(
        !env.worker_logs().contains(TOKEN),
        "the token reached a log"
    );
    for (_, log) in &workers {
        let log = std::fs::read_to_string(log).unwrap();
        assert!(!log.contains(TOKEN), "the token reached a log");
    }
}

/// A `grove worker --concurrency 1` with `vars`, registered; killed when dropped.
async fn single_slot_worker(
    env: &TestEnv,
    vars: &[(&str, &str)],
    name: &str,
) -> (tokio::process::Child, std::path::PathBuf) {
    let log = env.dir.path().join(format!("single-slot-{name}.log"));
    let file = std::fs::File::create(&log).unwrap();
    let live = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM apalis.workers WHERE last_seen > now() - interval '10 seconds'",
        )
        .fetch_one(&env.pool)
        .await
        .unwrap()
    };
    let before = live().await;
    let mut cmd = env.command(&["worker", "--concurrency", "1"]);
    cmd.envs(vars.iter().copied())
        .stdout(std::process::Stdio::from(file.try_clone().unwrap()))
        .stderr(std::process::Stdio::from(file));
    let child = cmd.spawn().expect("spawn worker");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while live().await <= before {
        assert!(
            std::time::Instant::now() < deadline,
            "worker {name} did not register"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    (child, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_placed_in_daytona_lives_runs_and_goes_away_inside_one_sandbox() {
    let fake = FakeDaytona::start().await;
    let vars = [
        ("GROVE_DAYTONA_API_URL", fake.url.as_str()),
        ("GROVE_DAYTONA_API_KEY", fake.key.as_str()),
    ];
    placement_lifecycle(
        "a_workspace_placed_in_daytona_lives_runs_and_goes_away_inside_one_sandbox",
        "daytona",
        &fake,
        &vars,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_placed_in_e2b_lives_runs_and_goes_away_inside_one_sandbox() {
    let fake = FakeE2b::start().await;
    let envd = fake.envd_template();
    let vars = [
        ("GROVE_E2B_API_URL", fake.url.as_str()),
        ("GROVE_E2B_API_KEY", fake.key.as_str()),
        ("GROVE_E2B_ENVD_URL", envd.as_str()),
    ];
    placement_lifecycle(
        "a_workspace_placed_in_e2b_lives_runs_and_goes_away_inside_one_sandbox",
        "e2b",
        &fake,
        &vars,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_session_placed_in_daytona_runs_its_exec_there_and_a_bad_runtime_is_400() {
    use grove_e2e::http::{Server, ALICE};
    use reqwest::StatusCode;

    let fake = FakeDaytona::start().await;
    let Some(env) = TestEnv::new(
        "an_http_session_placed_in_daytona_runs_its_exec_there_and_a_bad_runtime_is_400",
    )
    .await
    else {
        return;
    };
    let server = Server::start_with(
        &env,
        &[
            ("GROVE_DAYTONA_API_URL", fake.url.as_str()),
            ("GROVE_DAYTONA_API_KEY", fake.key.as_str()),
        ],
    )
    .await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let body = |runtime: &str| {
        json!({"project_id": "p1", "repo_name": "o/fixture", "repo_url": url,
               "base_ref": "main", "mode": "edit", "conversation_id": "c1",
               "runtime": runtime})
    };

    let (status, answer) = server.post("/v1/sessions", ALICE, body("nowhere")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["kind"], "invalid_input");
    assert_eq!(fake.creates(), 0);

    let (status, session) = server.post("/v1/sessions", ALICE, body("daytona")).await;
    assert_eq!(status, StatusCode::OK, "{session}");
    assert_eq!(session["workspace"]["node"], "daytona");
    let ws = session["session_id"].as_str().unwrap();
    let (status, exec) = server
        .post(
            &format!("/v1/workspaces/{ws}/exec"),
            ALICE,
            json!({"argv": ["cat", "f"], "runtime": "daytona"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{exec}");
    assert_eq!(exec["stdout"], "x\n");
    assert_eq!(fake.creates(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_sweep_under_pressure_takes_host_workspaces_and_leaves_remote_ones_alone() {
    let fake = FakeDaytona::start().await;
    let Some(mut env) = TestEnv::new(
        "an_eviction_sweep_under_pressure_takes_host_workspaces_and_leaves_remote_ones_alone",
    )
    .await
    else {
        return;
    };
    // Everything is above a 1-byte budget, nothing is spared for being recent.
    env.spawn_worker_env(&[
        ("GROVE_DAYTONA_API_URL", fake.url.as_str()),
        ("GROVE_DAYTONA_API_KEY", fake.key.as_str()),
        ("GROVE_EVICT_MEASURE_EVERY", "0"),
        ("GROVE_DISK_BUDGET", "1"),
        ("GROVE_PRESSURE_GRACE", "0"),
    ])
    .await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let remote = acquired(&env, &url, "daytona", "c1").await;
    let remote_id = remote["id"].as_str().unwrap();
    let host = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "h1"]))
        .await;
    let host_id = host["id"].as_str().unwrap();

    let report = env.grove_json(&["evict"]).await;
    let show = |id: &str| {
        let id = id.to_string();
        let env = &env;
        async move { env.grove_json(&["workspace", "show", &id]).await }
    };
    assert_eq!(show(host_id).await["state"], "evicted", "{report}");
    assert_eq!(show(remote_id).await["state"], "ready", "{report}");
    assert!(!report.to_string().contains(remote_id), "{report}");
    assert_eq!(run(&env, remote_id, "daytona", &["cat", "f"]).await, "x\n");

    // A provider is not a node: there is nothing of it to sweep, and no worker or
    // server may take its name as its node.
    let out = env.grove(&["evict", "--node", "daytona"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out).1);
    let out = env
        .grove(&["evict", "--node", "daytona", "--dry-run"])
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out).1);
    for args in [
        &["worker", "--node", "e2b"][..],
        &["serve", "--no-worker", "--node", "daytona"][..],
    ] {
        let out = env.grove(args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out).1);
        assert!(text(&out).1.contains("reserved"), "{}", text(&out).1);
    }

    let out = env.grove(&["replay", "--verify"]).await;
    assert!(out.status.success(), "replay: {}", text(&out).1);
}
