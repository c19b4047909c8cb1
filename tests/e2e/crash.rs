//! Workers killed with SIGKILL mid-job: nothing stuck, nothing run twice behind the caller.

use std::time::{Duration, Instant};

use grove_core::model::{WorkspaceKey, WorkspaceMode};
use grove_e2e::{acquire_args, text};
use grove_postgres::locks::{lock_key, LockScope};

use crate::env_or_skip;

/// The documented bound: a worker silent for 15 s is lost, checked every 2 s.
const WORKER_LOST_BOUND: Duration = Duration::from_secs(30);

async fn wait_for(pool: &sqlx::PgPool, sql: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string()))
            .fetch_one(pool)
            .await
            .unwrap();
        if n > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn processes_with(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(needle)
                })
                .unwrap_or(false)
        })
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_killed_during_exec_ends_the_exec_as_worker_lost_within_the_bound() {
    let mut env =
        env_or_skip!("a_worker_killed_during_exec_ends_the_exec_as_worker_lost_within_the_bound");
    let a = env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let id = ws["id"].as_str().unwrap().to_string();
    let marker = format!(
        "{}.{}",
        40 + (std::process::id() % 50),
        uuid::Uuid::new_v4().as_u128() % 1000
    );
    let waiting = env.command(&["exec", &id, "--", "sleep", &marker]).output();
    let waiting = tokio::spawn(waiting);
    wait_for(
        &env.pool,
        "SELECT count(*) FROM grove.events WHERE event_type = 'exec.started'",
        "the exec to start",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        processes_with(&format!("sleep {marker}")) > 0,
        "the command should be running"
    );
    env.worker(a).kill9().await;
    let killed_at = Instant::now();
    env.spawn_worker().await;
    let out = waiting.await.unwrap().unwrap();
    let elapsed = killed_at.elapsed();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("worker_lost"), "{stderr}");
    assert!(elapsed < WORKER_LOST_BOUND, "worker_lost took {elapsed:?}");
    assert_eq!(
        processes_with(&format!("sleep {marker}")),
        0,
        "the command died with its worker"
    );
    assert_eq!(env.count_events("exec.started").await, 1);
    assert_eq!(
        env.count_events("exec.finished").await,
        1,
        "the exec was not re-run"
    );
    let outcome: String = sqlx::query_scalar(
        "SELECT payload->>'outcome' FROM grove.events WHERE event_type = 'exec.finished'",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(outcome, "worker_lost");
    // The workspace is intact and usable.
    let again = env.grove(&["exec", &id, "--", "cat", "f"]).await;
    assert_eq!(text(&again).0, "x\n");
    let verify = env.grove(&["replay", "--verify"]).await;
    assert!(verify.status.success(), "{:?}", text(&verify));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_acquire_is_retried_by_another_worker_and_completes_once() {
    let mut env = env_or_skip!("a_killed_acquire_is_retried_by_another_worker_and_completes_once");
    let a = env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    env.grove_json(&["repo", "ensure", "--repo", "o/fixture", "--url", &url])
        .await;
    // Hold the workspace-key lock so worker A blocks inside the handler, mid-job.
    let key = WorkspaceKey {
        node: "local".into(),
        user_id: "u1".into(),
        project_id: "p1".into(),
        mode: WorkspaceMode::Edit,
        scope: "c1".into(),
    };
    let mut holder = env.pool.acquire().await.unwrap();
    let lock = lock_key(LockScope::WorkspaceKey, &key.lock_string());
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(lock)
        .execute(&mut *holder)
        .await
        .unwrap();

    let args: Vec<String> = acquire_args(&url, "edit", &["--conversation", "c1", "--json"])
        .iter()
        .map(|s| s.to_string())
        .collect();
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let waiting = tokio::spawn(env.command(&refs).output());
    wait_for(&env.pool, "SELECT count(*) FROM grove.commands WHERE kind = 'acquire_workspace' AND status = 'running'", "A to start the acquire").await;
    env.worker(a).kill9().await;
    env.spawn_worker().await;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(lock)
        .execute(&mut *holder)
        .await
        .unwrap();
    drop(holder);

    let out = waiting.await.unwrap().unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    let ws: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ws["branch_name"], "agent/edits-c1");
    assert!(std::path::Path::new(ws["local_path"].as_str().unwrap())
        .join("f")
        .is_file());
    assert_eq!(env.count_events("workspace.created").await, 1);
    let attempts: i32 =
        sqlx::query_scalar("SELECT attempts FROM grove.commands WHERE kind = 'acquire_workspace'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(attempts, 2, "retried once, by the second worker");
    let per_command: i64 = sqlx::query_scalar(
        "SELECT max(n) FROM (SELECT command_id, event_type, count(*) AS n FROM grove.events GROUP BY 1, 2) t",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(per_command, 1, "each command's events appear once");
}
