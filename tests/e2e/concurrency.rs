//! Many callers, several worker processes, one key: one workspace.

use grove_e2e::acquire_args;

use crate::env_or_skip;

#[tokio::test(flavor = "multi_thread")]
async fn twenty_concurrent_acquires_of_one_key_through_two_workers_give_one_workspace() {
    let mut env = env_or_skip!(
        "twenty_concurrent_acquires_of_one_key_through_two_workers_give_one_workspace"
    );
    env.spawn_worker().await;
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("a.txt", "a\n"), ("b/c.txt", "c\n")]);
    let env = std::sync::Arc::new(env);
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let env = env.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let args = acquire_args(&url, "edit", &["--conversation", "shared"]);
            env.grove_json(&args).await
        }));
    }
    let mut ids = std::collections::BTreeSet::new();
    let mut paths = std::collections::BTreeSet::new();
    for t in tasks {
        let ws = t.await.unwrap();
        ids.insert(ws["id"].as_str().unwrap().to_string());
        paths.insert(ws["local_path"].as_str().unwrap().to_string());
    }
    assert_eq!(ids.len(), 1, "one workspace id: {ids:?}");
    assert_eq!(paths.len(), 1, "one directory: {paths:?}");
    assert_eq!(env.count_events("workspace.created").await, 1);
    assert_eq!(env.count_events("repo_cache.created").await, 1);
    assert_eq!(env.count_events("workspace.acquired").await, 19);
    let project_dir = std::path::Path::new(paths.iter().next().unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    // Beside the workspace lies only its record of the repo cache (`.<name>.grove-cache`).
    let ws_path = std::path::Path::new(paths.iter().next().unwrap());
    let record = format!(
        ".{}.grove-cache",
        ws_path.file_name().unwrap().to_string_lossy()
    );
    let dirs: Vec<_> = std::fs::read_dir(project_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy() != record)
        .collect();
    assert_eq!(dirs.len(), 1, "no stray partial directories: {dirs:?}");
    // Both workers took part (the queue spreads the load), and each command ran once.
    let per_command: Vec<i64> = sqlx::query_scalar("SELECT attempts::bigint FROM grove.commands")
        .fetch_all(&env.pool)
        .await
        .unwrap();
    assert_eq!(per_command.len(), 20);
    assert!(per_command.iter().all(|a| *a == 1), "{per_command:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_command_id_submitted_twice_runs_once() {
    let mut env = env_or_skip!("the_same_command_id_submitted_twice_runs_once");
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let id = ws["id"].as_str().unwrap();
    let cid = uuid::Uuid::now_v7().to_string();
    let a = env
        .grove_json(&[
            "exec",
            id,
            "--command-id",
            &cid,
            "--",
            "sh",
            "-c",
            "echo run >> runs.txt; cat runs.txt",
        ])
        .await;
    let b = env
        .grove_json(&[
            "exec",
            id,
            "--command-id",
            &cid,
            "--",
            "sh",
            "-c",
            "echo run >> runs.txt; cat runs.txt",
        ])
        .await;
    assert_eq!(a, b, "the second submission returns the recorded outcome");
    let dir = std::path::Path::new(ws["local_path"].as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(dir.join("runs.txt")).unwrap(),
        "run\n",
        "the command ran once"
    );
    assert_eq!(env.count_events("exec.finished").await, 1);
}
