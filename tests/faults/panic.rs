//! Scenario `injected_panic`: a worker whose exec handler panics (the debug-build hook
//! `GROVE_TEST_PANIC_ON=exec`) must end each such job as failed with `internal`, log it
//! with the command id, free its slot (a worker of concurrency 1 goes on taking other
//! jobs) and free the workspace's lock (a healthy worker then runs on it at once).

use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::{
    account_commands, env_or_skip, replay_ok, scale, submit_until_decided, Figures, Fleet,
};

const PANICS: u64 = 3;
const PATIENCE: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread")]
async fn injected_panic_fails_its_job_as_internal_and_wedges_nothing() {
    if !cfg!(debug_assertions) {
        eprintln!("skipped injected_panic: the panic hook exists in debug builds only");
        return;
    }
    let env = env_or_skip!("injected_panic");
    let url = env.fixture_repo("fixture", &[("README.md", "fixture\n")]);
    // Concurrency 1: a slot kept by a panicked job would stop this worker for good.
    let mut panicky = Fleet::new(&env, &[("GROVE_TEST_PANIC_ON", "exec")], 1);
    panicky.spawn().await;
    let args = grove_e2e::acquire_args(&url, "edit", &["--conversation", "panic"]);
    let mut ids = vec![Uuid::now_v7()];
    let ws = submit_until_decided(&env, &args, ids[0], &[], PATIENCE)
        .await
        .filter(|d| d.succeeded())
        .expect("acquire");
    let ws = ws.field("id").and_then(|v| v.as_str()).unwrap().to_string();
    let panics = PANICS * scale();
    let mut figures = Figures {
        injected: panics,
        ..Default::default()
    };
    let exec = [
        "exec",
        ws.as_str(),
        "--",
        "sh",
        "-c",
        "echo ran >> .panic-runs",
    ];
    for _ in 0..panics {
        let id = Uuid::now_v7();
        ids.push(id);
        figures.trials += 2;
        let d = submit_until_decided(&env, &exec, id, &[], PATIENCE).await;
        if !d
            .as_ref()
            .is_some_and(|d| d.error_kind.as_deref() == Some("internal"))
        {
            figures.lost += 1;
            figures.note(format!(
                "{id}: a panicked exec ended as {d:?}, not failed/internal"
            ));
        }
        if !panicky.all_logs().contains(&id.to_string()) {
            figures.lost += 1;
            figures.note(format!(
                "{id}: the panic was not logged with the command id"
            ));
        }
        // The slot is free: the same worker takes the next job.
        let probe = Uuid::now_v7();
        ids.push(probe);
        let ensure = ["repo", "ensure", "--repo", "o/fixture", "--url", &url];
        if !submit_until_decided(&env, &ensure, probe, &[], PATIENCE)
            .await
            .is_some_and(|d| d.succeeded())
        {
            figures.lost += 1;
            figures.note(format!("{probe}: a job after a panic was not run"));
        }
    }
    // The workspace's lock went with the panicked job: a healthy worker runs at once.
    panicky.kill9(0).await;
    let mut healthy = Fleet::new(&env, &[], 1);
    healthy.spawn().await;
    let id = Uuid::now_v7();
    ids.push(id);
    figures.trials += 1;
    let t = Instant::now();
    let d = submit_until_decided(&env, &exec, id, &[], PATIENCE).await;
    let ran = d
        .as_ref()
        .is_some_and(|d| d.succeeded() && d.field("exit_code").and_then(|c| c.as_i64()) == Some(0));
    if !ran || t.elapsed() > Duration::from_secs(30) {
        figures.lost += 1;
        figures.note(format!(
            "an exec after the panics: {d:?} after {:?}",
            t.elapsed()
        ));
    }
    account_commands(&env.pool, &ids, &mut figures).await;
    replay_ok(&env, &mut figures).await;
    drop(healthy);
    drop(panicky);
    drop(env);
    figures.finish("injected_panic");
}
