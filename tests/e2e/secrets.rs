//! A token given for a clone is found nowhere it must not be.

use grove_e2e::{acquire_args, files_containing, text};

use crate::env_or_skip;

#[tokio::test(flavor = "multi_thread")]
async fn a_token_given_to_ensure_and_acquire_is_found_nowhere() {
    let mut env = env_or_skip!("a_token_given_to_ensure_and_acquire_is_found_nowhere");
    env.spawn_worker_env(&[("GROVE_LOG", "debug")]).await;
    let token = format!("ghp_{}", uuid::Uuid::new_v4().simple());
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let vars = [("GIT_TOKEN_FOR_TEST", token.as_str())];
    let mut outputs = Vec::new();
    let out = env
        .grove_env(
            &[
                "repo",
                "ensure",
                "--repo",
                "o/fixture",
                "--url",
                &url,
                "--token-env",
                "GIT_TOKEN_FOR_TEST",
                "--json",
            ],
            &vars,
        )
        .await;
    assert!(out.status.success(), "{:?}", text(&out));
    outputs.push(out);
    let args = acquire_args(
        &url,
        "edit",
        &[
            "--conversation",
            "c1",
            "--token-env",
            "GIT_TOKEN_FOR_TEST",
            "--json",
        ],
    );
    let out = env.grove_env(&args, &vars).await;
    assert!(out.status.success(), "{:?}", text(&out));
    outputs.push(out);
    // A failing clone with a token: the error path must not leak it either.
    let out = env
        .grove_env(
            &[
                "repo",
                "ensure",
                "--repo",
                "o/missing",
                "--url",
                "file:///nonexistent/grove/repo",
                "--token-env",
                "GIT_TOKEN_FOR_TEST",
            ],
            &vars,
        )
        .await;
    assert!(!out.status.success());
    outputs.push(out);

    for out in &outputs {
        let (o, e) = text(out);
        assert!(
            !o.contains(&token) && !e.contains(&token),
            "token in CLI output"
        );
    }
    let hits = files_containing(&env.home(), token.as_bytes());
    assert!(hits.is_empty(), "token found under GROVE_HOME: {hits:?}");
    assert!(!env.worker_logs().contains(&token), "token in worker logs");
    let in_db: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM grove.events WHERE payload::text LIKE '%' || $1 || '%' OR metadata::text LIKE '%' || $1 || '%')
              + (SELECT count(*) FROM grove.commands WHERE payload::text LIKE '%' || $1 || '%' OR coalesce(result::text, '') LIKE '%' || $1 || '%' OR coalesce(error::text, '') LIKE '%' || $1 || '%')
              + (SELECT count(*) FROM apalis.jobs WHERE convert_from(job, 'UTF8') LIKE '%' || $1 || '%' OR coalesce(last_result::text, '') LIKE '%' || $1 || '%')
              + (SELECT count(*) FROM grove.command_secrets)",
    )
    .bind(&token)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        in_db, 0,
        "token (or a leftover secret row) found in the database"
    );
    // The cache's remote is the clean URL.
    let cache = env.home().join("repos");
    assert!(files_containing(&cache, b"x-access-token").is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cache_cloned_with_a_token_is_served_to_other_credentials_only_after_their_own_fetch() {
    let mut env = env_or_skip!(
        "a_cache_cloned_with_a_token_is_served_to_other_credentials_only_after_their_own_fetch"
    );
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let ensure = [
        "repo",
        "ensure",
        "--repo",
        "o/fixture",
        "--url",
        url.as_str(),
        "--token-env",
        "TOK",
    ];
    let out = env.grove_env(&ensure, &[("TOK", "token-of-alice")]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    // The same credentials within the freshness window: no fetch.
    env.grove_env(&ensure, &[("TOK", "token-of-alice")]).await;
    assert_eq!(env.count_events("repo_cache.fetched").await, 0);
    // No credentials, or other ones: the cache is served only after a fetch with them
    // succeeds (for a private remote, that fetch is what refuses an outsider).
    let anonymous = env
        .grove(&["repo", "ensure", "--repo", "o/fixture", "--url", &url])
        .await;
    assert!(anonymous.status.success());
    assert_eq!(env.count_events("repo_cache.fetched").await, 1);
    env.grove_env(&ensure, &[("TOK", "token-of-bob")]).await;
    assert_eq!(env.count_events("repo_cache.fetched").await, 2);
}
