//! `grove runtimes`: every runtime provider grove knows, whether it is configured on
//! this machine, and its capabilities. Needs no database.

use std::process::Output;

use grove_e2e::grove_bin;
use serde_json::Value;

/// Runs `grove ARGS...` with a clean environment, a scratch GROVE_HOME and `extra`.
async fn grove(args: &[&str], extra: &[(&str, &str)]) -> Output {
    let home = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(grove_bin());
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GROVE_HOME", home.path());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.output().await.expect("run grove")
}

/// The JSON lines of `grove runtimes --json`, by kind.
async fn listing(extra: &[(&str, &str)]) -> Vec<Value> {
    let out = grove(&["runtimes", "--json"], extra).await;
    assert!(
        out.status.success(),
        "grove runtimes --json failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn find<'a>(rows: &'a [Value], kind: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["kind"] == kind)
        .unwrap_or_else(|| panic!("{kind} missing from {rows:?}"))
}

fn docker_engine_expected() -> bool {
    std::path::Path::new("/var/run/docker.sock").exists()
}

#[tokio::test]
async fn runtimes_json_lists_local_and_docker_with_every_capability_flag() {
    let rows = listing(&[]).await;
    let kinds: Vec<&str> = rows.iter().filter_map(|r| r["kind"].as_str()).collect();
    assert_eq!(
        &kinds[..2],
        ["local", "docker"],
        "local first, then docker: {kinds:?}"
    );
    for row in &rows {
        assert!(row["configured"].is_boolean(), "{row}");
        let caps = &row["capabilities"];
        for flag in [
            "snapshot",
            "preview_url",
            "interactive_session",
            "writable",
            "isolated",
        ] {
            assert!(caps[flag].is_boolean(), "{flag} missing: {row}");
        }
        assert!(caps["network_policies"].is_array(), "{row}");
    }

    let local = find(&rows, "local");
    assert_eq!(
        local["configured"], true,
        "the local runtime is always there"
    );
    let caps = &local["capabilities"];
    assert_eq!(caps["snapshot"], false);
    assert_eq!(caps["preview_url"], false);
    // Sessions and writes exactly when commands are sandboxed.
    assert_eq!(caps["interactive_session"], caps["isolated"], "{local}");
    assert_eq!(caps["writable"], caps["isolated"], "{local}");
    if caps["isolated"] == false {
        assert!(
            local["detail"]
                .as_str()
                .is_some_and(|d| d.contains("no OS isolation")),
            "an unisolated local runtime says why: {local}"
        );
    } else {
        let detail = local["detail"].as_str().unwrap_or_default();
        for protection in ["user namespace", "no capabilities", "seccomp", "limits:"] {
            assert!(
                detail.contains(protection),
                "an isolated local runtime names its protections ({protection}): {local}"
            );
        }
    }

    let docker = find(&rows, "docker");
    let caps = &docker["capabilities"];
    assert_eq!(caps["interactive_session"], true);
    assert_eq!(caps["isolated"], true);
    assert_eq!(caps["snapshot"], true);
    assert_eq!(
        caps["preview_url"], true,
        "ports published on loopback (network default)"
    );
    assert_eq!(
        caps["network_policies"],
        serde_json::json!(["none", "default"])
    );
    let engine = docker_engine_expected();
    if !engine && std::env::var("GROVE_TEST_REQUIRE_DOCKER").is_ok_and(|v| v == "1") {
        panic!("GROVE_TEST_REQUIRE_DOCKER=1 but there is no Docker engine socket");
    }
    assert_eq!(
        docker["configured"], engine,
        "docker is configured exactly when the engine answers: {docker}"
    );
}

#[tokio::test]
async fn runtimes_json_lists_docker_as_not_configured_when_no_engine_answers() {
    let rows = listing(&[("DOCKER_HOST", "unix:///nonexistent/grove-test/docker.sock")]).await;
    let docker = find(&rows, "docker");
    assert_eq!(docker["configured"], false, "{docker}");
    let detail = docker["detail"].as_str().expect("a reason");
    assert!(
        detail.contains("Docker engine"),
        "the reason names the engine: {detail}"
    );
    assert_eq!(
        docker["capabilities"]["interactive_session"], true,
        "what it would offer is still listed"
    );
    assert_eq!(find(&rows, "local")["configured"], true);
}

#[tokio::test]
async fn runtimes_without_json_prints_a_table_with_one_row_per_provider() {
    let out = grove(
        &["runtimes"],
        &[("DOCKER_HOST", "unix:///nonexistent/docker.sock")],
    )
    .await;
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with("KIND")
            && lines[0].contains("CONFIGURED")
            && lines[0].contains("SESSIONS"),
        "header: {stdout}"
    );
    assert!(lines.iter().any(|l| l.starts_with("local ")), "{stdout}");
    let docker = lines
        .iter()
        .find(|l| l.starts_with("docker "))
        .unwrap_or_else(|| panic!("no docker row: {stdout}"));
    assert!(
        docker.split_whitespace().nth(1) == Some("no"),
        "docker not configured: {docker}"
    );
}

#[tokio::test]
async fn runtimes_json_lists_the_remote_providers_with_what_each_really_offers() {
    let rows = listing(&[]).await;
    let e2b = find(&rows, "e2b");
    assert_eq!(e2b["configured"], false, "no E2B key here: {e2b}");
    let caps = &e2b["capabilities"];
    assert_eq!(
        caps["interactive_session"], true,
        "envd processes take stdin"
    );
    assert_eq!(caps["preview_url"], true);
    assert_eq!(caps["snapshot"], false, "see ADR 15: {e2b}");
    assert_eq!(caps["isolated"], false, "one sandbox per (user, project)");

    let daytona = find(&rows, "daytona");
    let caps = &daytona["capabilities"];
    assert_eq!(
        caps["interactive_session"], false,
        "Daytona's session input is line text echoed into the output, with no end of file: {daytona}"
    );
    assert_eq!(caps["preview_url"], true);
    assert_eq!(caps["snapshot"], false, "see ADR 15: {daytona}");
}
