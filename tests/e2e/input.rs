//! Bad input exits 2 with a one-line message and creates nothing.

use grove_e2e::text;

use crate::env_or_skip;

async fn assert_refused(env: &grove_e2e::TestEnv, args: &[&str]) {
    let out = env.grove(args).await;
    let (_, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?} should exit 2: {stderr}"
    );
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "{args:?}: one-line message expected, got {stderr:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_exits_2_with_one_line_and_creates_nothing() {
    let env = env_or_skip!("bad_input_exits_2_with_one_line_and_creates_nothing");
    // No worker runs: a refused command must not even reach the queue.
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    for repo in ["../x", "a/b/c", "-x/y", "x", "a/..", "a b/c"] {
        assert_refused(&env, &["repo", "ensure", "--repo", repo, "--url", &url]).await;
        assert_refused(
            &env,
            &[
                "workspace",
                "acquire",
                "--user",
                "u",
                "--project",
                "p",
                "--repo",
                repo,
                "--url",
                &url,
                "--base",
                "main",
                "--mode",
                "analysis",
            ],
        )
        .await;
    }
    for base in ["a..b", "main\nx", "-x", "a b", "x.lock", "@{1}", ""] {
        assert_refused(
            &env,
            &[
                "workspace",
                "acquire",
                "--user",
                "u",
                "--project",
                "p",
                "--repo",
                "o/r",
                "--url",
                &url,
                "--base",
                base,
                "--mode",
                "analysis",
            ],
        )
        .await;
    }
    for bad_url in [
        "ext::sh -c touch /tmp/x",
        "--upload-pack=x",
        "https://u:p@host/o/r",
        "ftp://host/o/r",
        "file://rel",
    ] {
        assert_refused(&env, &["repo", "ensure", "--repo", "o/r", "--url", bad_url]).await;
    }
    for mode in ["admin", "EDIT", ""] {
        assert_refused(
            &env,
            &[
                "workspace",
                "acquire",
                "--user",
                "u",
                "--project",
                "p",
                "--repo",
                "o/r",
                "--url",
                &url,
                "--base",
                "main",
                "--mode",
                mode,
            ],
        )
        .await;
    }
    for conv in ["../c", "a/b", "-c", "a..b"] {
        assert_refused(
            &env,
            &[
                "workspace",
                "acquire",
                "--user",
                "u",
                "--project",
                "p",
                "--repo",
                "o/r",
                "--url",
                &url,
                "--base",
                "main",
                "--mode",
                "edit",
                "--conversation",
                conv,
            ],
        )
        .await;
    }
    assert_refused(
        &env,
        &[
            "workspace",
            "acquire",
            "--user",
            "../u",
            "--project",
            "p",
            "--repo",
            "o/r",
            "--url",
            &url,
            "--base",
            "main",
            "--mode",
            "analysis",
        ],
    )
    .await;
    assert_refused(&env, &["exec", "not-a-uuid", "--", "true"]).await;
    assert_refused(
        &env,
        &[
            "exec",
            "00000000-0000-0000-0000-000000000000",
            "--kind",
            "root",
            "--",
            "true",
        ],
    )
    .await;
    assert_refused(
        &env,
        &[
            "exec",
            "00000000-0000-0000-0000-000000000000",
            "--env",
            "1X=y",
            "--",
            "true",
        ],
    )
    .await;

    let commands: i64 = sqlx::query_scalar("SELECT count(*) FROM grove.commands")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM apalis.jobs")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM grove.events")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(
        (commands, jobs, events),
        (0, 0, 0),
        "bad input must enqueue nothing"
    );
    let created: Vec<_> = std::fs::read_dir(env.home()).unwrap().collect();
    assert!(
        created.is_empty(),
        "bad input must create nothing under GROVE_HOME: {created:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_ids_exit_3_and_no_worker_means_a_clear_message() {
    let env = env_or_skip!("unknown_ids_exit_3_and_no_worker_means_a_clear_message");
    let out = env
        .grove(&["exec", "00000000-0000-0000-0000-000000000000", "--", "true"])
        .await;
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
    let out = env
        .grove(&["workspace", "show", "00000000-0000-0000-0000-000000000000"])
        .await;
    assert_eq!(out.status.code(), Some(3));

    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let out = env
        .grove_env(
            &["repo", "ensure", "--repo", "o/fixture", "--url", &url],
            &[("GROVE_CLAIM_TIMEOUT", "1")],
        )
        .await;
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("grove worker"),
        "the message should say to start a worker: {stderr}"
    );
    // The withdrawn job does not run later behind the caller's back.
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM apalis.jobs")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(pending, 0);
}
