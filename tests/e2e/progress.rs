//! Clones through the worker (ADR 25): the progress of a slow one (written to the
//! command's ledger row while git runs, shown by `GET /v1/progress` to the key's owner
//! only, drawn as a bar by `grove repo ensure` on a terminal; replay untouched), and a
//! connection cut mid-pack (typed failure, nothing recorded, the next ensure clean).

use std::path::Path;
use std::time::{Duration, Instant};

use grove_e2e::http::{Server, ALICE, BOB};
use grove_e2e::{git, text};
use grove_gitserver::{GitServer, Options};
use reqwest::StatusCode;
use serde_json::json;

use crate::env_or_skip;

/// A bare repository `acme/slow.git` under `root` with about 3 MiB of incompressible
/// blobs, served with a throttle so its clone takes several seconds.
fn slow_remote(root: &Path) -> (GitServer, String) {
    remote_with(
        root,
        Options {
            throttle_bytes_per_sec: Some(512 << 10),
            ..Options::default()
        },
    )
}

/// The same repository served with `options`.
fn remote_with(root: &Path, options: Options) -> (GitServer, String) {
    let work = root.join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["-c", "init.defaultBranch=main", "init", "-q"]);
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for i in 0..12 {
        let bytes: Vec<u8> = (0..256 * 1024)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        std::fs::write(work.join(format!("blob-{i}.bin")), bytes).unwrap();
    }
    git(&work, &["add", "-A"]);
    git(
        &work,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t.invalid",
            "commit",
            "-q",
            "-m",
            "slow",
        ],
    );
    let srv = root.join("srv/acme");
    std::fs::create_dir_all(&srv).unwrap();
    let bare = srv.join("slow.git");
    git(
        root,
        &[
            "clone",
            "-q",
            "--bare",
            work.to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
    );
    let server = GitServer::start(&root.join("srv"), options).unwrap();
    let url = format!("{}/acme/slow.git", server.base);
    (server, url)
}

#[tokio::test(flavor = "multi_thread")]
async fn progress_of_a_slow_clone_is_readable_by_its_key_while_it_runs() {
    let env = env_or_skip!("progress_of_a_slow_clone_is_readable_by_its_key_while_it_runs");
    let (_git, url) = slow_remote(&env.dir.path().join("remote"));
    let server = Server::start(&env).await;
    let key = "slow-clone-1";
    let (base, http) = (server.base.clone(), server.http.clone());
    let body = json!({"repo_name": "acme/slow", "repo_url": url, "idempotency_key": key});
    let ensure = tokio::spawn(async move {
        let resp = http
            .post(format!("{base}/v1/repo-caches/ensure"))
            .bearer_auth(ALICE)
            .json(&body)
            .send()
            .await
            .unwrap();
        (resp.status(), resp.text().await.unwrap())
    });

    let path = format!("/v1/progress?idempotency_key={key}");
    let started = Instant::now();
    let mut seen_receiving = None;
    while started.elapsed() < Duration::from_secs(60) && !ensure.is_finished() {
        let (status, body) = server.get(&path, ALICE).await;
        if status == StatusCode::OK
            && body["status"] == "running"
            && body["progress"]["phase"] == "receiving"
            && body["progress"]["bytes_received"].as_u64() > Some(0)
        {
            seen_receiving = Some(body);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = seen_receiving.expect("progress while the clone ran");
    assert_eq!(seen["kind"], "ensure_repo_cache");
    assert!(
        seen["progress"]["objects_total"].as_u64() > Some(0),
        "{seen}"
    );
    // Keys are per user: another user's same key names nothing of Alice's.
    let (status, _) = server.get(&path, BOB).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, answer) = ensure.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, done) = server.get(&path, ALICE).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(done["status"], "succeeded");
    assert_eq!(done["progress"]["phase"], "done", "{done}");
    assert!(
        done["progress"]["bytes_received"].as_u64() > Some(2 << 20),
        "{done}"
    );
    // Progress is not an event: the log replays to the same projections.
    let replay = env.grove(&["replay", "--verify"]).await;
    assert!(replay.status.success(), "{:?}", text(&replay));
}

#[tokio::test(flavor = "multi_thread")]
async fn grove_repo_ensure_draws_a_progress_bar_on_a_terminal() {
    let mut env = env_or_skip!("grove_repo_ensure_draws_a_progress_bar_on_a_terminal");
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped grove_repo_ensure_draws_a_progress_bar_on_a_terminal: no `script` (util-linux) to give the CLI a terminal");
        return;
    }
    let (_git, url) = slow_remote(&env.dir.path().join("remote"));
    env.spawn_worker().await;
    // `script` runs the CLI on a pseudo-terminal and copies what it drew.
    let argv = format!(
        "{} repo ensure --repo acme/slow --url {url}",
        grove_e2e::grove_bin().display()
    );
    let capture = env.dir.path().join("tty.txt");
    let grove_env: Vec<(std::ffi::OsString, std::ffi::OsString)> = env
        .command(&[])
        .as_std()
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
        .collect();
    let out = tokio::process::Command::new("script")
        .env_clear()
        .envs(grove_env)
        .env("TERM", "xterm")
        .args(["-qefc", &argv, capture.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    let drawn = std::fs::read_to_string(&capture).unwrap_or_default();
    assert!(out.status.success(), "{:?}\n{drawn}", text(&out));
    assert!(
        drawn.contains("receiving"),
        "no progress bar drawn: {drawn:?}"
    );
    assert!(drawn.contains("objects"), "{drawn:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clone_cut_mid_pack_fails_unavailable_and_records_nothing() {
    let mut env = env_or_skip!("a_clone_cut_mid_pack_fails_unavailable_and_records_nothing");
    let root = env.dir.path().join("remote");
    let (_cut, cut_url) = remote_with(
        &root,
        Options {
            cut_after_bytes: Some(256 << 10),
            ..Options::default()
        },
    );
    env.spawn_worker().await;
    let out = env
        .grove(&["repo", "ensure", "--repo", "acme/slow", "--url", &cut_url])
        .await;
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("unavailable"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert_eq!(env.count_events("repo_cache.created").await, 0);
    let repos = env.home().join("repos");
    let left: Vec<_> = std::fs::read_dir(&repos)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "a half cache was left: {left:?}");
    // The same repository from a healthy server clones cleanly afterwards.
    let healthy = GitServer::start(&root.join("srv"), Options::default()).unwrap();
    let url = format!("{}/acme/slow.git", healthy.base);
    let out = env
        .grove(&["repo", "ensure", "--repo", "acme/slow", "--url", &url])
        .await;
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(env.count_events("repo_cache.created").await, 1);
}
