//! Clean stops (ADR 21): `grove serve` and `grove worker` stop on SIGTERM within their
//! documented bound, with jobs running and an event follow open; jobs still running
//! after a worker's grace are stopped and handed back.

use std::time::{Duration, Instant};

use grove_e2e::http::{Server, ALICE};
use uuid::Uuid;

use crate::env_or_skip;

async fn ledger(pool: &sqlx::PgPool, id: Uuid) -> Option<(String, Option<serde_json::Value>)> {
    sqlx::query_as("SELECT status, result FROM grove.commands WHERE command_id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .unwrap()
}

async fn wait_running(pool: &sqlx::PgPool, id: Uuid) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while ledger(pool, id).await.map(|l| l.0).as_deref() != Some("running") {
        assert!(Instant::now() < deadline, "{id} did not start within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Past the claim: the command itself is running.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_stops_on_sigterm_with_an_exec_running_and_a_follow_open_within_its_bound() {
    let env = env_or_skip!(
        "serve_stops_on_sigterm_with_an_exec_running_and_a_follow_open_within_its_bound"
    );
    let url = env.fixture_repo("fixture", &[("README.md", "fixture\n")]);
    let mut server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "stop").await;
    let follow = server
        .http
        .get(server.url(&format!("/v1/workspaces/{ws}/events?follow=true")))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert!(follow.status().is_success(), "{}", follow.status());
    let id = Uuid::now_v7();
    let ids = id.to_string();
    let exec = env.command(&[
        "exec",
        &ws,
        "--command-id",
        &ids,
        "--",
        "sh",
        "-c",
        "sleep 1.5; echo done",
    ]);
    let exec = tokio::spawn(async move {
        let mut exec = exec;
        exec.output().await
    });
    wait_running(&env.pool, id).await;
    let t = Instant::now();
    server.terminate();
    let status = server
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("grove serve exits after SIGTERM");
    let took = t.elapsed();
    assert!(status.success(), "{status:?}");
    // The exec in flight finished and kept its outcome; the open follow did not hold
    // the stop (it used to add 5 s).
    let (state, result) = ledger(&env.pool, id).await.unwrap();
    assert_eq!(state, "succeeded");
    assert_eq!(result.unwrap()["exit_code"], 0);
    assert!(
        took < Duration::from_millis(4500),
        "grove serve took {took:?} to stop"
    );
    tokio::time::timeout(Duration::from_secs(2), follow.bytes())
        .await
        .expect("the follow stream ended with the server")
        .ok();
    let _ = exec.await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_stops_within_its_grace_and_hands_back_what_still_runs() {
    let env = env_or_skip!("a_worker_stops_within_its_grace_and_hands_back_what_still_runs");
    let mut env = env;
    let url = env.fixture_repo("fixture", &[("README.md", "fixture\n")]);
    let w = env
        .spawn_worker_env(&[("GROVE_SHUTDOWN_GRACE_MS", "1000")])
        .await;
    let args = grove_e2e::acquire_args(&url, "edit", &["--conversation", "grace"]);
    let ws = env.grove_json(&args).await;
    let marker = std::path::Path::new(ws["local_path"].as_str().unwrap()).join("still-running");
    let ws = ws["id"].as_str().unwrap().to_string();
    let id = Uuid::now_v7();
    let ids = id.to_string();
    let script = "sleep 4; touch still-running";
    let exec = env.command(&["exec", &ws, "--command-id", &ids, "--", "sh", "-c", script]);
    let exec = tokio::spawn(async move {
        let mut exec = exec;
        exec.output().await
    });
    wait_running(&env.pool, id).await;
    let t = Instant::now();
    let status = env
        .worker(w)
        .terminate(Duration::from_secs(20))
        .await
        .expect("the worker exits after SIGTERM");
    let took = t.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(
        took < Duration::from_secs(5),
        "the worker took {took:?} (grace 1 s)"
    );
    // Handed back: the job is pending again, and the next worker ends the exec as
    // worker_lost (it may have run in part) instead of running it twice.
    let pending: String = sqlx::query_scalar(
        "SELECT j.status FROM apalis.jobs j JOIN grove.commands c ON c.job_id = j.id
          WHERE c.command_id = $1",
    )
    .bind(id)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(pending, "Pending");
    env.spawn_worker().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (state, _) = ledger(&env.pool, id).await.unwrap();
        if state == "failed" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the handed-back exec was not ended: {state}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = exec.await;
    // Past the moment the command would have finished had it not been stopped.
    tokio::time::sleep(Duration::from_secs(6).saturating_sub(t.elapsed())).await;
    assert!(!marker.exists(), "the stopped command went on running");
}
