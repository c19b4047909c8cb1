//! The queue's own guarantees: backoff that survives a restart, pruning.

use std::time::{Duration, Instant};

use grove_e2e::text;

use crate::env_or_skip;

#[tokio::test(flavor = "multi_thread")]
async fn a_transient_failure_is_retried_with_backoff_that_survives_a_worker_restart() {
    let mut env =
        env_or_skip!("a_transient_failure_is_retried_with_backoff_that_survives_a_worker_restart");
    let first = env.spawn_worker().await;
    let started = Instant::now();
    let missing = format!("file://{}/not-there-yet", env.dir.path().display());
    let waiting = tokio::spawn(
        env.command(&["repo", "ensure", "--repo", "o/late", "--url", &missing])
            .output(),
    );
    // Wait for the first failed attempt to be scheduled for later.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let due_later: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM grove.commands c JOIN apalis.jobs j ON j.id = c.job_id
             WHERE c.status = 'queued' AND c.attempts >= 1 AND j.run_at > now()",
        )
        .fetch_one(&env.pool)
        .await
        .unwrap();
        if due_later > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no retry was scheduled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The worker dies during the backoff; a new one takes over the schedule from Postgres.
    env.worker(first).kill9().await;
    env.spawn_worker().await;
    let out = waiting.await.unwrap().unwrap();
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    assert!(text(&out).1.contains("unavailable"), "{:?}", text(&out));
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM grove.commands")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(attempts, 5, "an idempotent command gets five attempts");
    // Backoff 1 + 2 + 4 + 8 s between the five attempts.
    assert!(
        started.elapsed() >= Duration::from_secs(15),
        "retries came too fast: {:?}",
        started.elapsed()
    );
    assert_eq!(env.count_events("repo_cache.created").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn finished_jobs_and_ledger_rows_are_pruned_but_events_stay() {
    let mut env = env_or_skip!("finished_jobs_and_ledger_rows_are_pruned_but_events_stay");
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    env.grove_json(&["repo", "ensure", "--repo", "o/fixture", "--url", &url])
        .await;
    env.grove_json(&["repo", "ensure", "--repo", "o/fixture", "--url", &url])
        .await;
    let count = |sql: &'static str| {
        let pool = env.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(count("SELECT count(*) FROM apalis.jobs").await, 2);
    // Nothing is old enough yet under the default window.
    grove_postgres::queue::prune(&env.pool, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(count("SELECT count(*) FROM apalis.jobs").await, 2);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    grove_postgres::queue::prune(&env.pool, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(count("SELECT count(*) FROM apalis.jobs").await, 0);
    assert_eq!(count("SELECT count(*) FROM grove.commands").await, 0);
    assert_eq!(count("SELECT count(*) FROM grove.events").await, 2);
    let verify = env.grove(&["replay", "--verify"]).await;
    assert!(verify.status.success());
}
