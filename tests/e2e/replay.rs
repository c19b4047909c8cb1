//! `grove replay --verify` after every job kind, and after tampering.

use grove_e2e::{acquire_args, text};

use crate::env_or_skip;

#[tokio::test(flavor = "multi_thread")]
async fn replay_verifies_after_every_job_kind_and_names_a_tampered_row() {
    let mut env = env_or_skip!("replay_verifies_after_every_job_kind_and_names_a_tampered_row");
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    env.grove_json(&["repo", "ensure", "--repo", "o/fixture", "--url", &url])
        .await;
    let edit = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let eid = edit["id"].as_str().unwrap().to_string();
    let task = env
        .grove_json(&acquire_args(&url, "task", &["--task", "t1"]))
        .await;
    let tid = task["id"].as_str().unwrap().to_string();
    env.grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    for args in [
        vec!["exec", &eid, "--", "sh", "-c", "echo y > y"],
        vec!["workspace", "release", &eid],
        vec!["exec", &eid, "--kind", "read", "--", "ls"],
        vec!["workspace", "hibernate", &eid],
        vec!["workspace", "destroy-runtime", &eid],
        vec!["workspace", "release", &eid, "--destroy-runtime"],
        vec!["exec", &tid, "--", "true"],
        vec!["workspace", "destroy", &tid],
    ] {
        let out = env.grove(&args).await;
        assert!(out.status.success(), "{args:?}: {:?}", text(&out));
    }
    assert!(
        !std::path::Path::new(task["local_path"].as_str().unwrap()).exists(),
        "destroyed workspace's files are gone"
    );
    assert!(
        std::path::Path::new(edit["local_path"].as_str().unwrap())
            .join("y")
            .is_file(),
        "runtime destruction keeps files"
    );
    let types: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT event_type FROM grove.events ORDER BY 1")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    for t in [
        "exec.finished",
        "exec.started",
        "repo_cache.created",
        "repo_cache.used",
        "runtime.destroyed",
        "runtime.started",
        "runtime.stopped",
        "workspace.acquired",
        "workspace.created",
        "workspace.destroyed",
        "workspace.dirty_changed",
        "workspace.released",
    ] {
        assert!(
            types.iter().any(|x| x == t),
            "scenario should emit {t}: {types:?}"
        );
    }

    let ok = env.grove(&["replay", "--verify"]).await;
    assert_eq!(ok.status.code(), Some(0), "{:?}", text(&ok));

    sqlx::query("UPDATE grove.sandbox_workspaces SET dirty = NOT dirty WHERE id = $1::uuid")
        .bind(&eid)
        .execute(&env.pool)
        .await
        .unwrap();
    let bad = env.grove(&["replay", "--verify"]).await;
    assert_ne!(bad.status.code(), Some(0));
    let (stdout, _) = text(&bad);
    assert!(
        stdout.contains("sandbox_workspaces") && stdout.contains(&eid) && stdout.contains("dirty"),
        "{stdout}"
    );

    // A row nobody's events created is named too.
    sqlx::query("UPDATE grove.sandbox_workspaces SET dirty = NOT dirty WHERE id = $1::uuid")
        .bind(&eid)
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM grove.sandbox_repo_caches")
        .execute(&env.pool)
        .await
        .unwrap();
    let bad = env.grove(&["replay", "--verify"]).await;
    assert_ne!(bad.status.code(), Some(0));
    assert!(
        text(&bad).0.contains("sandbox_repo_caches"),
        "{:?}",
        text(&bad)
    );
    // The log itself is append-only.
    let err = sqlx::query("DELETE FROM grove.events")
        .execute(&env.pool)
        .await;
    assert!(err.is_err(), "events must not be deletable");
}
