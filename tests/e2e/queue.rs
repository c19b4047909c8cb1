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

#[tokio::test(flavor = "multi_thread")]
async fn advisory_locks_exclude_time_out_as_locked_share_reads_and_leave_no_timeout_behind() {
    use grove_postgres::locks::{AdvisoryLock, LockScope};
    use grove_postgres::StoreError;
    let env = env_or_skip!(
        "advisory_locks_exclude_time_out_as_locked_share_reads_and_leave_no_timeout_behind"
    );
    // A pool of one: every lock and the check below use the same connection in turn.
    let one = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*env.pool.connect_options()).clone())
        .await
        .unwrap();
    let other = &env.pool;
    let short = Duration::from_millis(200);
    let held = AdvisoryLock::acquire(other, LockScope::WorkspaceCommands, "w1", false, short)
        .await
        .unwrap();
    let t = Instant::now();
    let err = AdvisoryLock::acquire(&one, LockScope::WorkspaceCommands, "w1", true, short)
        .await
        .err()
        .expect("a shared lock must wait for an exclusive one");
    assert!(matches!(err, StoreError::Locked(_)), "{err:?}");
    assert!(t.elapsed() >= short, "gave up after {:?}", t.elapsed());
    // Another key is free.
    let w2 = AdvisoryLock::acquire(&one, LockScope::WorkspaceCommands, "w2", false, short)
        .await
        .unwrap();
    w2.release().await.unwrap();
    held.release().await.unwrap();

    // Shared locks coexist; an exclusive one waits for both to go.
    let r1 = AdvisoryLock::acquire(other, LockScope::WorkspaceCommands, "w1", true, short)
        .await
        .unwrap();
    let r2 = AdvisoryLock::acquire(&one, LockScope::WorkspaceCommands, "w1", true, short)
        .await
        .unwrap();
    let err = AdvisoryLock::acquire(other, LockScope::WorkspaceCommands, "w1", false, short)
        .await
        .err()
        .expect("an exclusive lock must wait for shared ones");
    assert!(matches!(err, StoreError::Locked(_)), "{err:?}");
    r2.release().await.unwrap();
    // Released: its connection is back in the pool with the timeout reset.
    let timeout: String = sqlx::query_scalar("SHOW lock_timeout")
        .fetch_one(&one)
        .await
        .unwrap();
    assert_eq!(timeout, "0");
    r1.release().await.unwrap();
    let w = AdvisoryLock::acquire(other, LockScope::WorkspaceCommands, "w1", false, short)
        .await
        .unwrap();
    w.release().await.unwrap();
    one.close().await;
}
