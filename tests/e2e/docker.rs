//! The Docker runtime end to end: `grove image build`, `grove exec --runtime docker`,
//! hibernate / resume / destroy, a worker killed mid-exec. Skipped, with the reason
//! printed, where no Docker engine answers.

use std::time::{Duration, Instant};

use grove_e2e::{acquire_args, text, TestEnv};

use crate::env_or_skip;

/// Builds the image a test needs in its own GROVE_HOME (so its worker picks it up),
/// or returns why Docker cannot be used here.
async fn image(env: &TestEnv, flavour: &str) -> Result<String, String> {
    if !std::path::Path::new("/var/run/docker.sock").exists()
        && std::env::var_os("DOCKER_HOST").is_none()
    {
        return Err("no Docker engine socket".into());
    }
    let out = env.grove(&["image", "build", flavour]).await;
    let (stdout, stderr) = text(&out);
    if !out.status.success() {
        return Err(format!(
            "grove image build {flavour} failed: {}",
            stderr.trim()
        ));
    }
    Ok(stdout.lines().last().unwrap_or_default().to_string())
}

macro_rules! docker_or_skip {
    ($env:expr, $name:expr, $flavour:expr) => {
        match image(&$env, $flavour).await {
            Ok(tag) => tag,
            Err(why) => {
                if std::env::var("GROVE_TEST_REQUIRE_DOCKER").is_ok_and(|v| v == "1") {
                    panic!("{}: GROVE_TEST_REQUIRE_DOCKER=1 but {why}", $name);
                }
                eprintln!("skipped {}: {why}", $name);
                return;
            }
        }
    };
}

fn docker_cli(args: &[&str]) -> String {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .expect("docker CLI (test-side inspection only)");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn containers_of(runtime_label: &str) -> Vec<String> {
    docker_cli(&[
        "ps",
        "-a",
        "--filter",
        &format!("label=grove.workspace={runtime_label}"),
        "--format",
        "{{.Names}} {{.State}}",
    ])
    .lines()
    .map(str::to_string)
    .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_exec_writes_land_in_the_workspace_and_survive_hibernate_resume_and_destroy() {
    let mut env = env_or_skip!(
        "docker_exec_writes_land_in_the_workspace_and_survive_hibernate_resume_and_destroy"
    );
    let tag = docker_or_skip!(env, "docker_exec_writes_land_in_the_workspace", "--minimal");
    assert!(tag.starts_with("grove-sandbox:"), "{tag}");
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let id = ws["id"].as_str().unwrap();
    let dir = std::path::PathBuf::from(ws["local_path"].as_str().unwrap());

    let out = env
        .grove_json(&[
            "exec",
            id,
            "--runtime",
            "docker",
            "--",
            "sh",
            "-c",
            "echo hi > made-in-docker.txt; id -u; env",
        ])
        .await;
    let stdout = out["stdout"].as_str().unwrap();
    let uid: u32 = stdout.lines().next().unwrap().trim().parse().unwrap();
    assert_ne!(uid, 0, "the container must not run as root");
    assert!(
        !stdout.contains("DATABASE_URL") && !stdout.contains("GROVE_HOME"),
        "host env leaked: {stdout}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("made-in-docker.txt")).unwrap(),
        "hi\n"
    );
    assert_eq!(
        env.grove_json(&["workspace", "show", id]).await["dirty"],
        true
    );
    assert_eq!(
        containers_of(id).len(),
        1,
        "one long-lived container per workspace runtime"
    );

    let hibernate = env.grove(&["workspace", "hibernate", id]).await;
    assert!(hibernate.status.success(), "{:?}", text(&hibernate));
    assert!(
        containers_of(id)[0].ends_with("exited"),
        "{:?}",
        containers_of(id)
    );
    let again = env
        .grove_json(&[
            "exec",
            id,
            "--runtime",
            "docker",
            "--",
            "cat",
            "made-in-docker.txt",
        ])
        .await;
    assert_eq!(again["stdout"], "hi\n", "files survive stop -> start");
    assert!(containers_of(id)[0].ends_with("running"));

    let destroy = env.grove(&["workspace", "destroy-runtime", id]).await;
    assert!(destroy.status.success(), "{:?}", text(&destroy));
    assert!(
        containers_of(id).is_empty(),
        "destroy removes the container"
    );
    assert!(
        dir.join("made-in-docker.txt").is_file(),
        "destroying the runtime keeps the workspace"
    );

    let limited = env
        .grove(&[
            "exec",
            id,
            "--runtime",
            "docker",
            "--network",
            "limited",
            "--",
            "true",
        ])
        .await;
    assert_eq!(
        limited.status.code(),
        Some(1),
        "limited is refused, never widened: {:?}",
        text(&limited)
    );

    let timed = env
        .grove(&[
            "exec",
            id,
            "--runtime",
            "docker",
            "--timeout",
            "1",
            "--",
            "sh",
            "-c",
            "echo before; sleep 30",
        ])
        .await;
    assert_eq!(timed.status.code(), Some(124));
    assert_eq!(text(&timed).0, "before\n");
    let verify = env.grove(&["replay", "--verify"]).await;
    assert!(verify.status.success(), "{:?}", text(&verify));
    env.grove(&["workspace", "destroy", id]).await;
    assert!(containers_of(id).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_killed_mid_docker_exec_leaves_no_container_or_process_behind() {
    let mut env =
        env_or_skip!("a_worker_killed_mid_docker_exec_leaves_no_container_or_process_behind");
    docker_or_skip!(env, "a_worker_killed_mid_docker_exec", "--minimal");
    let a = env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let id = ws["id"].as_str().unwrap().to_string();
    let waiting = tokio::spawn(
        env.command(&["exec", &id, "--runtime", "docker", "--", "sleep", "300"])
            .output(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while env.count_events("exec.started").await == 0 || containers_of(&id).is_empty() {
        assert!(Instant::now() < deadline, "the docker exec did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.worker(a).kill9().await;
    env.spawn_worker().await;
    let out = waiting.await.unwrap().unwrap();
    assert!(text(&out).1.contains("worker_lost"), "{:?}", text(&out));
    assert!(
        containers_of(&id).is_empty(),
        "the lost exec's container is removed: {:?}",
        containers_of(&id)
    );
    // The workspace is intact and gets a fresh runtime.
    let again = env
        .grove_json(&["exec", &id, "--runtime", "docker", "--", "cat", "f"])
        .await;
    assert_eq!(again["stdout"], "x\n");
    env.grove(&["workspace", "destroy", &id]).await;
    let verify = env.grove(&["replay", "--verify"]).await;
    assert!(verify.status.success(), "{:?}", text(&verify));
}

#[tokio::test(flavor = "multi_thread")]
async fn git_inside_a_docker_runtime_commits_to_the_workspace_branch() {
    let mut env = env_or_skip!("git_inside_a_docker_runtime_commits_to_the_workspace_branch");
    docker_or_skip!(env, "git_inside_a_docker_runtime", "--debian");
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let id = ws["id"].as_str().unwrap();
    let out = env
        .grove_json(&[
            "exec", id, "--runtime", "docker", "--", "sh", "-c",
            "echo y >> f && git status --short && git -c user.name=a -c user.email=a@b commit -qam in-container && git log --oneline -1",
        ])
        .await;
    assert_eq!(out["exit_code"], 0, "{out}");
    assert!(out["stdout"].as_str().unwrap().contains(" M f"), "{out}");
    let dir = std::path::Path::new(ws["local_path"].as_str().unwrap());
    let log = grove_e2e::git(dir, &["log", "--format=%s", "-1", "agent/edits-c1"]);
    assert_eq!(
        log.trim(),
        "in-container",
        "the commit is visible from the host"
    );
    env.grove(&["workspace", "destroy", id]).await;
}
