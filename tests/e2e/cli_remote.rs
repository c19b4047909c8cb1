//! `grove exec` and `grove tool` with `GROVE_URL` set: one HTTP request to a grove
//! server, no database credentials on the caller's machine, the same output and exit
//! codes as over the database, and the same boundaries (another user's workspace, a
//! path out of the workspace).

use std::process::Output;

use grove_e2e::http::{Server, ALICE, BOB};
use grove_e2e::{text, TestEnv};

use crate::env_or_skip;

/// Runs the CLI against `server` with `token`, with no database URL and a `GROVE_HOME`
/// that does not exist: anything but the HTTP path would fail.
async fn remote(env: &TestEnv, server: &Server, token: &str, args: &[&str]) -> Output {
    let mut cmd = env.command(args);
    cmd.env_remove("DATABASE_URL")
        .env("GROVE_HOME", env.dir.path().join("no-such-home"))
        .env("GROVE_URL", &server.base)
        .env("GROVE_TOKEN", token);
    cmd.output().await.expect("run grove")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_runs_execs_and_tools_through_a_server_with_the_same_answers_and_boundaries() {
    let env = env_or_skip!(
        "the_cli_runs_execs_and_tools_through_a_server_with_the_same_answers_and_boundaries"
    );
    let server = Server::start(&env).await;
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let ws = server.acquire(ALICE, &url, "c1").await;

    let out = remote(
        &env,
        &server,
        ALICE,
        &["exec", &ws, "--", "sh", "-c", "echo hi > f; cat f"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert_eq!(text(&out).0, "hi\n");
    let out = remote(
        &env,
        &server,
        ALICE,
        &["exec", &ws, "--", "sh", "-c", "echo e >&2; exit 7"],
    )
    .await;
    assert_eq!(out.status.code(), Some(7), "the command's own exit code");
    assert_eq!(text(&out).1, "e\n");

    let out = remote(
        &env,
        &server,
        ALICE,
        &["tool", &ws, "write", "g.txt", "--content", "x y"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let out = remote(&env, &server, ALICE, &["tool", &ws, "read", "g.txt"]).await;
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let read: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(read["content"], "x y", "{read}");
    let out = remote(&env, &server, ALICE, &["tool", &ws, "search", "hello"]).await;
    assert!(text(&out).0.contains("README.md"), "{:?}", text(&out));

    // The boundaries hold as over the database, with the same exit codes.
    let out = remote(
        &env,
        &server,
        ALICE,
        &["tool", &ws, "read", "../../../etc/passwd"],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    assert!(
        !text(&out).0.contains("root:"),
        "nothing of the host is printed"
    );
    let out = remote(&env, &server, BOB, &["exec", &ws, "--", "true"]).await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "another user's workspace is not found: {:?}",
        text(&out)
    );
    assert!(
        text(&out).1.starts_with("grove: not_found:"),
        "{:?}",
        text(&out)
    );
    let out = remote(
        &env,
        &server,
        "wrong-token-0123456789",
        &["tool", &ws, "read", "f"],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    assert!(
        text(&out).1.starts_with("grove: auth_failed:"),
        "{:?}",
        text(&out)
    );
    let (o, e) = text(&out);
    assert!(
        !o.contains("wrong-token") && !e.contains("wrong-token"),
        "the token is never printed"
    );

    // A server that does not answer is `unavailable`, not a hang or a panic.
    let mut cmd = env.command(&["exec", &ws, "--", "true"]);
    cmd.env_remove("DATABASE_URL")
        .env("GROVE_URL", "http://127.0.0.1:9")
        .env("GROVE_TOKEN", ALICE);
    let out = cmd.output().await.unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).1.starts_with("grove: unavailable:"),
        "{:?}",
        text(&out)
    );
    assert!(!text(&out).1.contains(ALICE));
}
