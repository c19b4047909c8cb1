//! A warm acquire or ensure of something whose use was recorded within the recent-use
//! window answers from its row, recording nothing (ADR 40), against a real `grove
//! serve` and its in-process worker: the same answer as the queued path, no ledger row,
//! no event, no lock; a released workspace or a use older than the window is recorded
//! as before; another user's identical call never reaches the workspace; a known
//! command id still answers its recorded outcome or is refused as another command's;
//! a workspace whose lock is held exclusively (an eviction or an exec under way) is not
//! answered from its row; `replay --verify` stays exact.

use std::time::Duration;

use grove_e2e::http::{Server, ALICE, BOB};
use grove_e2e::TestEnv;
use grove_postgres::locks::{lock_key, LockScope};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::env_or_skip;
use crate::inline_acquire::{ensure, fixture, replay_ok, session, stable};

/// A window no test outlives.
const MINUTE: &[(&str, &str)] = &[("GROVE_RECORD_USE_AFTER", "60")];

async fn ledger_rows(env: &TestEnv, kind: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM grove.commands WHERE kind = $1")
        .bind(kind)
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

async fn all_events(env: &TestEnv) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM grove.events")
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

async fn post_ok(server: &Server, path: &str, token: &str, body: Value) -> Value {
    let (status, answer) = server.post(path, token, body).await;
    assert_eq!(status, StatusCode::OK, "{path}: {answer}");
    answer
}

#[tokio::test(flavor = "multi_thread")]
async fn a_recently_used_workspace_and_cache_answer_as_the_queue_does_recording_nothing() {
    let env = env_or_skip!(
        "a_recently_used_workspace_and_cache_answer_as_the_queue_does_recording_nothing"
    );
    let url = fixture(&env);
    let home = Server::start_with(&env, MINUTE).await;
    // The same node without a worker: its commands take the queue and are recorded.
    let queue = Server::start_args(&env, &["--no-worker"], MINUTE).await;
    let created = home.acquire(ALICE, &url, "c1").await;
    let (acquires, acquired) = (
        ledger_rows(&env, "acquire_workspace").await,
        env.count_events("workspace.acquired").await,
    );
    let (ensures, used) = (
        ledger_rows(&env, "ensure_repo_cache").await,
        env.count_events("repo_cache.used").await,
    );
    let events_before = all_events(&env).await;

    let recent = post_ok(&home, "/v1/sessions", ALICE, session(&url, "c1")).await;
    assert_eq!(recent["session_id"], created.as_str());
    let recent_cache = post_ok(&home, "/v1/repo-caches/ensure", ALICE, ensure(&url)).await;
    assert_eq!(
        ledger_rows(&env, "acquire_workspace").await,
        acquires,
        "no ledger row for a recent use"
    );
    assert_eq!(ledger_rows(&env, "ensure_repo_cache").await, ensures);
    assert_eq!(all_events(&env).await, events_before, "no event");

    let queued = post_ok(&queue, "/v1/sessions", ALICE, session(&url, "c1")).await;
    let queued_cache = post_ok(&queue, "/v1/repo-caches/ensure", ALICE, ensure(&url)).await;
    assert_eq!(stable(recent), stable(queued), "the queued path's answer");
    assert_eq!(stable(recent_cache), stable(queued_cache));
    assert_eq!(
        env.count_events("workspace.acquired").await,
        acquired + 1,
        "the queued path records"
    );
    assert_eq!(env.count_events("repo_cache.used").await, used + 1);

    // Bob's identical call is his own key: a workspace of his, never Alice's.
    let bobs = post_ok(&home, "/v1/sessions", BOB, session(&url, "c1")).await;
    assert_ne!(bobs["session_id"], created.as_str());
    assert_eq!(bobs["workspace"]["user_id"], "bob");
    replay_ok(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_released_workspace_and_a_use_older_than_the_window_are_recorded() {
    let env = env_or_skip!("a_released_workspace_and_a_use_older_than_the_window_are_recorded");
    let url = fixture(&env);
    // A window long enough for two calls on a loaded machine, short enough to outwait.
    let home = Server::start_with(&env, &[("GROVE_RECORD_USE_AFTER", "5")]).await;
    let created = home.acquire(ALICE, &url, "c1").await;
    let before = env.count_events("workspace.acquired").await;

    // Released: only a recorded acquire turns it ready again.
    let path = format!("/v1/sessions/{created}/release");
    let (status, released) = home.post(&path, ALICE, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{released}");
    assert_eq!(released["state"], "released");
    let again = post_ok(&home, "/v1/sessions", ALICE, session(&url, "c1")).await;
    assert_eq!(again["workspace"]["state"], "ready");
    assert_eq!(env.count_events("workspace.acquired").await, before + 1);

    // Within the window: nothing recorded; past it: recorded again.
    post_ok(&home, "/v1/sessions", ALICE, session(&url, "c1")).await;
    assert_eq!(env.count_events("workspace.acquired").await, before + 1);
    let used = env.count_events("repo_cache.used").await;
    tokio::time::sleep(Duration::from_millis(5100)).await;
    post_ok(&home, "/v1/sessions", ALICE, session(&url, "c1")).await;
    assert_eq!(env.count_events("workspace.acquired").await, before + 2);
    post_ok(&home, "/v1/repo-caches/ensure", ALICE, ensure(&url)).await;
    assert_eq!(env.count_events("repo_cache.used").await, used + 1);
    replay_ok(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_known_command_id_answers_its_record_or_is_refused_on_the_recent_path() {
    let env =
        env_or_skip!("a_known_command_id_answers_its_record_or_is_refused_on_the_recent_path");
    let url = fixture(&env);
    let home = Server::start_with(&env, MINUTE).await;
    let mut first = session(&url, "c1");
    first["idempotency_key"] = json!("turn-1");
    let created = post_ok(&home, "/v1/sessions", ALICE, first.clone()).await;
    let events = all_events(&env).await;

    // The same key again, within the window: the recorded outcome, the same command id.
    let retried = post_ok(&home, "/v1/sessions", ALICE, first).await;
    assert_eq!(retried["command_id"], created["command_id"]);
    assert_eq!(retried["session_id"], created["session_id"]);
    // The key of that acquire on an ensure: another command, refused.
    let mut other = ensure(&url);
    other["idempotency_key"] = json!("turn-1");
    let (status, refused) = home.post("/v1/repo-caches/ensure", ALICE, other).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(all_events(&env).await, events, "nothing recorded");
    assert_eq!(ledger_rows(&env, "ensure_repo_cache").await, 0);
    replay_ok(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_workspace_held_exclusively_is_not_answered_from_its_row() {
    let env = env_or_skip!("a_workspace_held_exclusively_is_not_answered_from_its_row");
    let url = fixture(&env);
    let home = Server::start_with(&env, MINUTE).await;
    let created = home.acquire(ALICE, &url, "c1").await;
    let before = env.count_events("workspace.acquired").await;

    // Another session holds the workspace's command lock, as an eviction saving its
    // work or an exec does: the acquire takes the locked path and records its use.
    let mut holder = env.pool.acquire().await.unwrap();
    let key = lock_key(LockScope::WorkspaceCommands, &created);
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(key)
        .execute(&mut *holder)
        .await
        .unwrap();
    let answer = post_ok(&home, "/v1/sessions", ALICE, session(&url, "c1")).await;
    assert_eq!(answer["session_id"], created.as_str());
    assert_eq!(
        env.count_events("workspace.acquired").await,
        before + 1,
        "not answered from the row while the lock is held"
    );
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .execute(&mut *holder)
        .await
        .unwrap();

    // Free again (and its use just recorded): answered from the row.
    post_ok(&home, "/v1/sessions", ALICE, session(&url, "c1")).await;
    assert_eq!(env.count_events("workspace.acquired").await, before + 1);
    replay_ok(&env).await;
}
