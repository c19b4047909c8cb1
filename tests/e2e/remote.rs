//! Remote runtimes through the real worker: Daytona and E2B are registered from the
//! worker's environment, and a node-local workspace is refused for them with a typed
//! error before any provider is contacted (their API URLs here point at a closed
//! port); the API keys appear in no output, log line or event. Workspaces placed in a
//! provider are in `remote_placement.rs`.

use grove_e2e::{acquire_args, text};

use crate::env_or_skip;

const DAYTONA_KEY: &str = "dtn_e2e_key_that_must_not_leak";
const E2B_KEY: &str = "e2b_e2e_key_that_must_not_leak";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_remote_runtimes_are_registered_and_refuse_host_workspaces_without_leaking_keys()
{
    let mut env = env_or_skip!(
        "configured_remote_runtimes_are_registered_and_refuse_host_workspaces_without_leaking_keys"
    );
    // Port 9 (discard) on loopback: nothing answers, so any contact would fail loudly.
    env.spawn_worker_env(&[
        ("GROVE_DAYTONA_API_URL", "http://127.0.0.1:9/api"),
        ("GROVE_DAYTONA_API_KEY", DAYTONA_KEY),
        ("GROVE_E2B_API_URL", "http://127.0.0.1:9"),
        ("GROVE_E2B_API_KEY", E2B_KEY),
    ])
    .await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let id = ws["id"].as_str().unwrap();

    // A remote runtime runs only workspaces placed in it (ADR 15): the worker refuses
    // a host workspace before it looks for the provider or records anything.
    for runtime in ["daytona", "e2b"] {
        let out = env
            .grove(&["exec", id, "--runtime", runtime, "--", "true"])
            .await;
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{runtime}: {stdout} {stderr}");
        assert!(
            stderr.contains("lives on node") && stderr.contains("--runtime"),
            "{runtime} must refuse a node-local workspace: {stderr}"
        );
        for key in [DAYTONA_KEY, E2B_KEY] {
            assert!(
                !stdout.contains(key) && !stderr.contains(key),
                "a key leaked"
            );
        }
    }

    let events = env.grove(&["events", "--json"]).await;
    let logs = env.worker_logs();
    for key in [DAYTONA_KEY, E2B_KEY] {
        assert!(
            !text(&events).0.contains(key),
            "a key reached the event log"
        );
        assert!(!logs.contains(key), "a key reached the worker's log");
    }
}
