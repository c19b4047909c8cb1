//! The Docker runtime on a real engine: the runtime contract, lifecycle, isolation,
//! limits, streaming, preview URLs (`preview.rs`) and the orphan sweep.
//!
//! Every test first asks whether an engine answers and, if none does, prints
//! `skipped: no Docker engine: ...` and returns (with `GROVE_TEST_REQUIRE_DOCKER=1` it
//! fails instead). Tests build the minimal busybox image
//! once per process (offline, from the `busybox-static` package), run in parallel, and
//! remove their containers when they end: each test's provider puts a unique
//! `grove.test` scope label on what it creates, and a guard removes everything with
//! that label on drop (also when the test panics).
//!
//! Workspaces live under cargo's per-target tmp dir and are made by root here, so the
//! harness hands each one to [`TEST_UID`] (as a deployment would create workspaces
//! owned by the sandbox user); the provider then runs commands as the workspace owner.

mod preview;
mod support;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use grove_core::error::RuntimeError;
use grove_core::ports::{
    ExecChunk, ExecRequest, Mount, NetworkPolicy, ResourceHints, Runtime, RuntimeProvider,
};
use grove_docker::{DockerRuntimeProvider, LABEL_MANAGED, LABEL_RUNTIME, LABEL_WORKSPACE};
use grove_runtime_contract::{request, unique_token};

use support::{chown_tree, env_or_skip, text, TestEnv, TEST_UID};

macro_rules! contract_tests {
    ($($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let Some(env) = env_or_skip(stringify!($check)).await else { return };
                let outcome = grove_runtime_contract::$check(&env).await;
                assert_eq!(outcome, grove_runtime_contract::Outcome::Passed,
                    "the docker runtime claims every capability the contract checks");
            }
        )*
    };
}

/// The runtime contract, one test per check.
mod contract {
    use super::*;

    contract_tests!(
        capability_accessors_match_capabilities,
        echo_and_exit_codes_pass_through,
        a_missing_program_is_a_failed_command,
        stdin_reaches_the_command,
        only_the_given_env_is_visible,
        cwd_inside_the_workspace_works,
        cwd_escaping_the_workspace_is_rejected,
        a_read_only_workspace_refuses_writes,
        a_writable_workspace_keeps_writes_on_the_host,
        network_none_leaves_only_loopback,
        a_timeout_kills_the_whole_process_tree,
        output_over_the_cap_is_truncated,
        exec_stream_delivers_output_as_it_is_produced,
        dropping_an_exec_stream_kills_the_command,
        other_workspaces_are_not_visible,
        a_snapshot_restores_state_outside_the_workspace,
        a_cat_session_echoes_each_write_and_ends_when_stdin_closes,
        a_shell_session_keeps_its_state_between_writes,
        session_output_over_the_cap_keeps_the_newest_bytes,
        killing_a_session_ends_it_and_a_poll_reports_the_exit,
    );
}

/// The attacker's suite (`grove_runtime_contract::attacks`), one test per attack.
/// Attacks whose tool the minimal image lacks print why they skip.
mod attacks {
    use super::*;

    macro_rules! attack_tests {
        ($($attack:ident),* $(,)?) => {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $attack() {
                    let Some(env) = env_or_skip(stringify!($attack)).await else { return };
                    let _ = grove_runtime_contract::attacks::$attack(&env).await;
                }
            )*
        };
    }

    attack_tests!(
        core_pattern_and_crash,
        proc_sys_writes_fail,
        sysrq_trigger_is_closed,
        host_secrets_are_unreadable,
        other_tenants_are_unreachable,
        the_database_is_unreachable,
        host_processes_are_out_of_reach,
        namespaces_mounts_and_keyrings_are_refused,
        network_none_cannot_reach_the_host,
        a_fork_bomb_is_a_resource_limit,
        a_memory_hog_is_a_resource_limit,
        a_planted_symlink_reads_nothing_of_the_host,
        an_analysis_tmp_plant_does_not_reach_the_next_exec,
    );
}

/// The contract again with the provider forbidden to look at the host's /proc and
/// cgroups: timeouts and drops fall back to restarting the container, counters are
/// read inside it.
mod contract_without_host_access {
    use super::*;

    macro_rules! no_host_tests {
        ($($check:ident),* $(,)?) => {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    let Some(mut env) = env_or_skip(stringify!($check)).await else { return };
                    env.provider = env.provider.clone().with_host_access(false);
                    let outcome = grove_runtime_contract::$check(&env).await;
                    assert_eq!(outcome, grove_runtime_contract::Outcome::Passed);
                }
            )*
        };
    }

    no_host_tests!(
        echo_and_exit_codes_pass_through,
        stdin_reaches_the_command,
        a_timeout_kills_the_whole_process_tree,
        output_over_the_cap_is_truncated,
        exec_stream_delivers_output_as_it_is_produced,
        dropping_an_exec_stream_kills_the_command,
        killing_a_session_ends_it_and_a_poll_reports_the_exit,
    );
}

/// The contract again with the exec agent (ADR 18) in every container: commands go
/// through it instead of engine execs (sessions stay engine execs).
mod contract_with_agent {
    use super::*;

    macro_rules! agent_tests {
        ($($check:ident),* $(,)?) => {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    let Some(mut env) = env_or_skip(stringify!($check)).await else { return };
                    let agent = support::static_agent().await;
                    env.provider = env.provider.clone().with_exec_agent(Some(agent));
                    let outcome = grove_runtime_contract::$check(&env).await;
                    assert_eq!(outcome, grove_runtime_contract::Outcome::Passed);
                }
            )*
        };
    }

    agent_tests!(
        echo_and_exit_codes_pass_through,
        a_missing_program_is_a_failed_command,
        stdin_reaches_the_command,
        only_the_given_env_is_visible,
        cwd_inside_the_workspace_works,
        cwd_escaping_the_workspace_is_rejected,
        a_read_only_workspace_refuses_writes,
        a_writable_workspace_keeps_writes_on_the_host,
        network_none_leaves_only_loopback,
        a_timeout_kills_the_whole_process_tree,
        output_over_the_cap_is_truncated,
        exec_stream_delivers_output_as_it_is_produced,
        dropping_an_exec_stream_kills_the_command,
        other_workspaces_are_not_visible,
        a_snapshot_restores_state_outside_the_workspace,
        a_cat_session_echoes_each_write_and_ends_when_stdin_closes,
        killing_a_session_ends_it_and_a_poll_reports_the_exit,
    );

    /// The provider of `env` with the static agent.
    async fn with_agent(env: &mut TestEnv) {
        let agent = support::static_agent().await;
        env.provider = env.provider.clone().with_exec_agent(Some(agent));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn limits_come_back_typed_through_the_agent() {
        let Some(mut env) = env_or_skip("limits_through_the_agent").await else {
            return;
        };
        with_agent(&mut env).await;
        limits_on(&env, "agent").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn limits_come_back_typed_through_the_agent_without_host_access() {
        let Some(mut env) = env_or_skip("limits_through_the_agent_inside").await else {
            return;
        };
        with_agent(&mut env).await;
        env.provider = env.provider.clone().with_host_access(false);
        limits_on(&env, "agent-inside").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn background_processes_do_not_outlive_their_command_under_the_agent() {
        let Some(mut env) = env_or_skip("background_processes_agent").await else {
            return;
        };
        with_agent(&mut env).await;
        background_on(&env).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_execs_through_one_agent_do_not_disturb_each_other() {
        let Some(mut env) = env_or_skip("concurrent_execs_agent").await else {
            return;
        };
        with_agent(&mut env).await;
        concurrent_on(&env).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn analysis_execs_start_on_empty_scratch_dirs_under_the_agent() {
        let Some(mut env) = env_or_skip("fresh_scratch_agent").await else {
            return;
        };
        with_agent(&mut env).await;
        fresh_on(&env, "fresh-agent").await;
    }

    /// A runtime with the agent on a fresh writable workspace.
    async fn agent_runtime(env: &mut TestEnv, tag: &str) -> (Box<dyn Runtime>, std::path::PathBuf) {
        with_agent(env).await;
        let ws = env.workspace(tag);
        let spec = env.spec_for(&ws, true, NetworkPolicy::None, tag);
        (env.provider.create(spec).await.unwrap(), ws)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commands_run_under_one_agent_per_container() {
        let Some(mut env) = env_or_skip("commands_run_under_one_agent_per_container").await else {
            return;
        };
        let (rt, _ws) = agent_runtime(&mut env, "one").await;
        let a = run(rt.as_ref(), sh("echo $PPID; cat /proc/$PPID/comm")).await;
        let b = run(rt.as_ref(), sh("echo $PPID; cat /proc/$PPID/comm")).await;
        assert_eq!(a.exit_code, 0, "{}", text(&a.stderr));
        assert_eq!(text(&a.stdout), text(&b.stdout), "the same parent for both");
        assert!(
            text(&a.stdout).ends_with(".grove-sandboxd\n"),
            "the parent is the agent: {}",
            text(&a.stdout)
        );
        assert_eq!(env.provider.exec_agents(), 1);
        // The engine's exec environment, and nothing of the agent's own.
        let e = run(rt.as_ref(), request(&["env"])).await;
        let mut vars: Vec<_> = text(&e.stdout).lines().map(str::to_string).collect();
        vars.sort();
        assert_eq!(
            vars,
            vec![
                "HOME=/tmp",
                "HOSTNAME=grove",
                "LANG=C.UTF-8",
                &format!("PATH={}", grove_docker::BASE_PATH),
            ]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_command_cannot_write_into_the_agents_stream() {
        let Some(mut env) = env_or_skip("a_command_cannot_write_into_the_agents_stream").await
        else {
            return;
        };
        let (rt, _ws) = agent_runtime(&mut env, "forge").await;
        // The agent's stdout is the host's stream: a command of the same user writing
        // through /proc into it could forge other execs' results.
        let r = run(
            rt.as_ref(),
            sh("printf 'garbage' > /proc/$PPID/fd/1 && echo wrote; echo done"),
        )
        .await;
        assert_eq!(text(&r.stdout), "done\n", "{}", text(&r.stderr));
        let after = run(rt.as_ref(), request(&["echo", "alive"])).await;
        assert_eq!(text(&after.stdout), "alive\n");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_agent_fails_its_exec_once_and_the_next_exec_gets_a_new_one() {
        let Some(mut env) = env_or_skip("a_dead_agent_fails_its_exec_once").await else {
            return;
        };
        let (rt, ws) = agent_runtime(&mut env, "dead").await;
        let first = run(rt.as_ref(), sh("echo $PPID")).await;
        let mut req = sh("echo ran >> runs; kill -9 $PPID; sleep 5");
        req.mutating = true;
        let r = rt.exec(req).await;
        assert!(
            matches!(r, Err(RuntimeError::Unavailable(_))),
            "the agent's death is Unavailable: {}",
            brief(&r)
        );
        assert_eq!(
            std::fs::read_to_string(ws.join("runs")).unwrap(),
            "ran\n",
            "the command ran once and was not retried"
        );
        let next = run(rt.as_ref(), sh("echo $PPID")).await;
        assert_eq!(next.exit_code, 0);
        assert_ne!(text(&first.stdout), text(&next.stdout), "a new agent");
        assert_eq!(env.provider.exec_agents(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stopping_the_container_ends_its_agent_and_the_next_exec_starts_both() {
        let Some(mut env) = env_or_skip("stopping_the_container_ends_its_agent").await else {
            return;
        };
        let (rt, _ws) = agent_runtime(&mut env, "stop").await;
        let first = run(rt.as_ref(), sh("echo $PPID")).await;
        let name = format!("grove-rt-{}-stop", env.scope());
        env.provider.stop(&name).await.unwrap();
        assert_eq!(env.provider.exec_agents(), 0);
        let next = run(rt.as_ref(), sh("echo $PPID; cat /proc/$PPID/comm")).await;
        assert_eq!(next.exit_code, 0, "{}", text(&next.stderr));
        assert!(text(&next.stdout).ends_with(".grove-sandboxd\n"));
        assert_eq!(env.state_of(&name).await, "running");
        let _ = first;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_agent_that_does_not_start_leaves_commands_to_engine_execs() {
        let Some(mut env) = env_or_skip("an_agent_that_does_not_start").await else {
            return;
        };
        // A static program that is not the agent: busybox, called `.grove-sandboxd`,
        // knows no such applet and exits.
        let not_agent = support::static_busybox();
        env.provider = env.provider.clone().with_exec_agent(Some(not_agent));
        let ws = env.workspace("fallback");
        let spec = env.spec_for(&ws, false, NetworkPolicy::None, "fallback");
        let rt = env.provider.create(spec).await.unwrap();
        let r = run(rt.as_ref(), sh("echo fine; exit 3")).await;
        assert_eq!((r.exit_code, text(&r.stdout).as_str()), (3, "fine\n"));
        assert_eq!(env.provider.exec_agents(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_a_static_binary_is_accepted_for_containers() {
        // This test binary links the host's C library dynamically.
        let dynamic = std::env::current_exe().unwrap();
        let refused = grove_docker::agent::check_binary(&dynamic).unwrap_err();
        assert!(refused.contains("dynamically"), "{refused}");
        let built = support::static_agent().await;
        assert!(grove_docker::agent::check_binary(&built).is_ok());
    }
}

fn sh(script: &str) -> ExecRequest {
    request(&["sh", "-c", script])
}

async fn run(rt: &dyn Runtime, req: ExecRequest) -> grove_core::ports::ExecResult {
    let argv = req.argv.clone();
    rt.exec(req)
        .await
        .unwrap_or_else(|e| panic!("exec of {argv:?} failed: {e}"))
}

/// A result in one line, output cut short.
fn brief(r: &Result<grove_core::ports::ExecResult, RuntimeError>) -> String {
    match r {
        Ok(r) => format!(
            "Ok(exit {}, timed_out {}, stdout {:?}, stderr {:?})",
            r.exit_code,
            r.timed_out,
            text(&r.stdout[..r.stdout.len().min(200)]),
            text(&r.stderr[..r.stderr.len().min(200)])
        ),
        Err(e) => format!("Err({e:?})"),
    }
}

async fn assert_usable(rt: &dyn Runtime, after: &str) {
    let r = run(rt, request(&["true"])).await;
    assert_eq!(r.exit_code, 0, "`true` fails after {after}: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_are_truthful_and_limited_network_is_refused() {
    let Some(env) = env_or_skip("capabilities_are_truthful_and_limited_network_is_refused").await
    else {
        return;
    };
    let caps = env.provider.capabilities();
    assert_eq!(env.provider.kind(), "docker");
    assert!(caps.writable && caps.isolated && caps.network_none);
    assert!(!caps.network_limited && caps.snapshot && caps.preview_url);
    assert!(caps.interactive_session && caps.network_default);
    assert!(env.provider.sessions().is_some() && env.provider.snapshotter().is_some());
    assert!(env.provider.preview_urls().is_some());
    env.provider.ping().await.expect("ping");

    let ws = env.workspace("limited");
    let spec = env.spec_for(&ws, true, NetworkPolicy::Limited, "limited");
    match env.provider.create(spec).await {
        Err(RuntimeError::CommandRejected(msg)) => assert!(msg.contains("limited"), "{msg}"),
        Err(e) => panic!("limited must be CommandRejected, got {e}"),
        Ok(_) => panic!("limited was accepted (the runtime cannot enforce it)"),
    }
    assert!(
        env.containers().await.is_empty(),
        "a refused spec left a container"
    );

    // No image anywhere: a clear error, never a pull.
    let bare = DockerRuntimeProvider::connect().await.unwrap();
    let mut spec = env.spec_for(&ws, true, NetworkPolicy::None, "noimage");
    spec.image = None;
    match bare.create(spec.clone()).await {
        Err(RuntimeError::Unavailable(msg)) => assert!(msg.contains("image"), "{msg}"),
        other => panic!("no image must be Unavailable, got {:?}", other.err()),
    }
    spec.image = Some(format!("grove-sandbox:does-not-exist-{}", unique_token()));
    match env.provider.create(spec).await {
        Err(RuntimeError::Unavailable(msg)) => assert!(msg.contains("never pulled"), "{msg}"),
        other => panic!("a missing image must be Unavailable, got {:?}", other.err()),
    }

    // Root is refused as the container user.
    let rooted = env.provider.clone().with_user("0:0");
    let spec = env.spec_for(&ws, true, NetworkPolicy::None, "root");
    match rooted.create(spec).await {
        Err(RuntimeError::CommandRejected(msg)) => assert!(msg.contains("root"), "{msg}"),
        other => panic!("user 0 must be refused, got {:?}", other.err()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_name_grove_the_workspace_and_the_runtime_and_create_reattaches() {
    let Some(env) = env_or_skip("labels_and_reattach").await else {
        return;
    };
    let ws = env.workspace("labels");
    let spec = env.spec_for(&ws, true, NetworkPolicy::None, "labels");
    let rid = spec.labels[LABEL_RUNTIME].clone();
    let first = env.provider.create_docker(spec.clone()).await.unwrap();
    assert_eq!(
        first.container_name(),
        DockerRuntimeProvider::container_name(&rid)
    );
    let again = env.provider.create_docker(spec.clone()).await.unwrap();
    assert_eq!(
        first.container_id(),
        again.container_id(),
        "a second create of the same runtime must re-attach"
    );
    let listed = env
        .provider
        .list_by_label(LABEL_RUNTIME, &rid)
        .await
        .unwrap();
    assert_eq!(
        listed.len(),
        1,
        "exactly one container per runtime: {listed:?}"
    );
    let c = &listed[0];
    assert_eq!(
        c.labels.get(LABEL_MANAGED).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        c.labels.get(LABEL_WORKSPACE),
        spec.labels.get(LABEL_WORKSPACE)
    );
    assert_eq!(c.runtime_id(), Some(rid.as_str()));
    assert_eq!(c.state, "running");

    // Concurrent creates of one runtime end with one container.
    let ws2 = env.workspace("race");
    let spec2 = env.spec_for(&ws2, true, NetworkPolicy::None, "race");
    let rid2 = spec2.labels[LABEL_RUNTIME].clone();
    let (a, b, c2) = tokio::join!(
        env.provider.create_docker(spec2.clone()),
        env.provider.create_docker(spec2.clone()),
        env.provider.create_docker(spec2.clone()),
    );
    let ids: HashSet<String> = [a, b, c2]
        .into_iter()
        .map(|r| r.expect("concurrent create").container_id().to_string())
        .collect();
    assert_eq!(ids.len(), 1, "concurrent creates made several containers");
    assert_eq!(
        env.provider
            .list_by_label(LABEL_RUNTIME, &rid2)
            .await
            .unwrap()
            .len(),
        1
    );

    // A changed spec replaces the container; the workspace stays.
    std::fs::write(ws.join("keep.txt"), "kept").unwrap();
    let mut changed = spec.clone();
    changed.env.insert("GROVE_TEST_CHANGED".into(), "1".into());
    let replaced = env.provider.create_docker(changed).await.unwrap();
    assert_ne!(replaced.container_id(), first.container_id());
    let r = run(&replaced, request(&["cat", "keep.txt"])).await;
    assert_eq!(text(&r.stdout), "kept");
    assert_eq!(
        env.provider
            .list_by_label(LABEL_RUNTIME, &rid)
            .await
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_survive_stop_start_and_destroy() {
    let Some(env) = env_or_skip("files_survive_stop_start_and_destroy").await else {
        return;
    };
    let ws = env.workspace("lifecycle");
    let spec = env.spec_for(&ws, true, NetworkPolicy::None, "lifecycle");
    let rt = env.provider.create_docker(spec.clone()).await.unwrap();
    let name = rt.container_name().to_string();

    // A file, and an "installed dependency" (a tool under the workspace) used later.
    let mut req = sh("echo from-container > made.txt && mkdir -p .deps/bin && \
                      printf '#!/bin/sh\\necho tool-ok\\n' > .deps/bin/tool && chmod +x .deps/bin/tool");
    req.mutating = true;
    let r = run(&rt, req).await;
    assert_eq!(r.exit_code, 0, "{}", text(&r.stderr));
    assert_eq!(
        std::fs::read_to_string(ws.join("made.txt")).unwrap(),
        "from-container\n"
    );

    let t0 = Instant::now();
    env.provider.stop(&name).await.unwrap();
    let stop_took = t0.elapsed();
    let state = env.state_of(&name).await;
    assert_eq!(state, "exited", "after stop");
    assert!(ws.join("made.txt").exists(), "stop lost the file");

    let t0 = Instant::now();
    env.provider.start(&name).await.unwrap();
    let r = run(&rt, request(&[".deps/bin/tool"])).await;
    let resume_took = t0.elapsed();
    assert_eq!(text(&r.stdout), "tool-ok\n", "{r:?}");
    let r = run(&rt, request(&["cat", "made.txt"])).await;
    assert_eq!(text(&r.stdout), "from-container\n");
    eprintln!("measured: stop {stop_took:?}, start + first exec {resume_took:?}");

    // A stopped container resumes on the next exec too.
    env.provider.stop(&name).await.unwrap();
    let r = run(&rt, request(&["cat", "made.txt"])).await;
    assert_eq!(
        text(&r.stdout),
        "from-container\n",
        "exec after stop resumes"
    );
    // And create re-attaches to a stopped container, starting it.
    env.provider.stop(&name).await.unwrap();
    let again = env.provider.create_docker(spec.clone()).await.unwrap();
    assert_eq!(again.container_id(), rt.container_id());
    assert_eq!(env.state_of(&name).await, "running");

    assert!(env.provider.destroy(&name).await.unwrap());
    assert!(
        !env.provider.destroy(&name).await.unwrap(),
        "destroy is idempotent"
    );
    assert!(env.containers().await.is_empty());
    assert_eq!(
        std::fs::read_to_string(ws.join("made.txt")).unwrap(),
        "from-container\n",
        "destroy must keep the workspace"
    );
    assert!(ws.join(".deps/bin/tool").exists());
    match rt.exec(request(&["true"])).await {
        Err(RuntimeError::NotFound(_)) => {}
        other => panic!("exec on a destroyed runtime must be NotFound, got {other:?}"),
    }
    // Creating again gives a fresh container over the same files.
    let fresh = env.provider.create_docker(spec).await.unwrap();
    let r = run(&fresh, request(&["cat", "made.txt"])).await;
    assert_eq!(text(&r.stdout), "from-container\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_none_has_only_loopback_and_the_hosts_loopback_is_unreachable() {
    let Some(env) = env_or_skip("network_none").await else {
        return;
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();

    let ws = env.workspace("net");
    let rt = env
        .provider
        .create(env.spec_for(&ws, false, NetworkPolicy::None, "net"))
        .await
        .unwrap();
    let r = run(&*rt, request(&["cat", "/proc/net/dev"])).await;
    let ifaces: Vec<String> = text(&r.stdout)
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(|s| s.trim().to_string())
        .collect();
    assert_eq!(ifaces, ["lo"]);

    // Control: nc works on the container's own loopback, so a failure below is the
    // network's doing, not a missing tool.
    let r = run(
        &*rt,
        sh(
            // On a loaded machine the listener may take a while to come up: its socket is
            // waited for in /proc/net/tcp{,6} (port 7777 is 1E61, state 0A: listening,
            // at most 30 s), then the send is retried. The listener is stopped after 15 s
            // at the latest by a killer that holds none of the exec's output pipes and is
            // itself stopped at the end, so the exec ends with its script.
            "nc -l -p 7777 > /tmp/got & L=$!; for i in $(seq 1 120); do \
             grep -qs ':1E61 0*:0000 0A' /proc/net/tcp /proc/net/tcp6 && break; \
             sleep 0.25; done; for i in $(seq 1 10); do \
             echo ping | nc -w 2 127.0.0.1 7777 && break; sleep 0.5; done; \
             (sleep 15; kill $L) >/dev/null 2>&1 & K=$!; wait $L; \
             kill $K 2>/dev/null; cat /tmp/got",
        ),
    )
    .await;
    assert!(text(&r.stdout).contains("ping"), "loopback control: {r:?}");

    let r = run(
        &*rt,
        sh(&format!(
            "echo hello | nc -w 2 127.0.0.1 {port}; echo rc=$?"
        )),
    )
    .await;
    std::thread::sleep(Duration::from_millis(200));
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Ok((_, from)) => {
            panic!("the host's loopback server was reached from the container ({from})")
        }
        Err(e) => panic!("accept: {e}"),
    }
    assert!(
        !text(&r.stdout).contains("rc=0"),
        "connecting to the host's port succeeded: {r:?}"
    );
}

/// Output a command writes just before it ends reaches the caller even when a child it
/// left behind holds its output open: the drain after the end waits for a silence
/// counted from the end, not from the last output before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_written_at_the_end_arrives_while_a_left_child_holds_the_pipe() {
    let Some(env) = env_or_skip("late_output").await else {
        return;
    };
    let ws = env.workspace("late");
    let rt = env
        .provider
        .create(env.spec_for(&ws, false, NetworkPolicy::None, "late"))
        .await
        .unwrap();
    for i in 0..5 {
        let r = run(&*rt, sh("(sleep 3) & sleep 1; echo late-marker")).await;
        assert!(text(&r.stdout).contains("late-marker"), "try {i}: {r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_shows_none_of_the_worker_environment() {
    let Some(env) = env_or_skip("env_shows_none_of_the_worker_environment").await else {
        return;
    };
    let ws = env.workspace("env");
    let mut spec = env.spec_for(&ws, false, NetworkPolicy::None, "env");
    spec.env.insert("FROM_SPEC".into(), "1".into());
    let rt = env.provider.create(spec).await.unwrap();
    let mut req = request(&["env"]);
    req.env.insert("FROM_REQUEST".into(), "2".into());
    let r = run(&*rt, req).await;
    let keys: BTreeMap<String, String> = text(&r.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let allowed = [
        "PATH",
        "HOME",
        "LANG",
        "HOSTNAME",
        "FROM_SPEC",
        "FROM_REQUEST",
    ];
    for k in keys.keys() {
        assert!(
            allowed.contains(&k.as_str()),
            "unexpected variable {k} in the container: {keys:?}"
        );
    }
    for (k, v) in std::env::vars() {
        if !["PATH", "HOME", "LANG"].contains(&k.as_str()) {
            assert!(keys.get(&k) != Some(&v), "worker variable {k} leaked");
        }
    }
    assert_eq!(keys.get("HOME").map(String::as_str), Some("/tmp"));
    assert_eq!(keys.get("FROM_SPEC").map(String::as_str), Some("1"));
    assert_eq!(keys.get("FROM_REQUEST").map(String::as_str), Some("2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_workspaces_are_invisible_the_cache_is_read_only_and_the_user_is_not_root() {
    let Some(env) = env_or_skip("isolation").await else {
        return;
    };
    let ws = env.workspace("iso");
    let other = env.workspace("other");
    std::fs::write(other.join("secret.txt"), "other-secret").unwrap();
    let cache = env.workspace("cache");
    std::fs::write(cache.join("objects.txt"), "cached").unwrap();

    let mut spec = env.spec_for(&ws, true, NetworkPolicy::None, "iso");
    spec.mounts.push(Mount {
        source: cache.clone(),
        target: cache.clone(),
        writable: false,
    });
    let rt = env.provider.create(spec).await.unwrap();

    let r = run(&*rt, request(&["id", "-u"])).await;
    assert_eq!(
        text(&r.stdout).trim(),
        TEST_UID.to_string(),
        "runs as the workspace owner"
    );
    let r = run(&*rt, request(&["cat", "/proc/self/status"])).await;
    let status = text(&r.stdout);
    for line in [
        "CapEff:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "NoNewPrivs:\t1",
    ] {
        assert!(status.contains(line), "{line} missing:\n{status}");
    }

    let r = run(
        &*rt,
        request(&["cat", other.join("secret.txt").to_str().unwrap()]),
    )
    .await;
    assert_ne!(r.exit_code, 0);
    assert!(!text(&r.stdout).contains("other-secret"));
    let r = run(&*rt, request(&["ls", "-a", env.root().to_str().unwrap()])).await;
    let listing = text(&r.stdout);
    let other_name = other.file_name().unwrap().to_str().unwrap();
    assert!(
        !listing.contains(other_name),
        "other workspace listed:\n{listing}"
    );

    let r = run(
        &*rt,
        request(&["cat", cache.join("objects.txt").to_str().unwrap()]),
    )
    .await;
    assert_eq!(text(&r.stdout), "cached", "the cache is readable");
    let mut req = sh(&format!(
        "echo x > {0}/new.txt; echo y > {0}/objects.txt",
        cache.display()
    ));
    req.mutating = true;
    let r = run(&*rt, req).await;
    assert_ne!(r.exit_code, 0, "writing the cache succeeded");
    assert!(!cache.join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(cache.join("objects.txt")).unwrap(),
        "cached"
    );

    // A root-owned workspace without a configured user runs as the sandbox identity.
    let rooted = env.workspace_owned_by_root("rooted");
    let rt = env
        .provider
        .create(env.spec_for(&rooted, false, NetworkPolicy::None, "rooted"))
        .await
        .unwrap();
    let r = run(&*rt, request(&["id", "-u"])).await;
    let id = grove_core::identity::SandboxIdentity::from_env().unwrap();
    assert_eq!(text(&r.stdout).trim(), id.uid.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_memory_hog_fork_bomb_and_timeout_each_come_back_typed() {
    let Some(env) = env_or_skip("limits").await else {
        return;
    };
    limits_on(&env, "host").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_typed_without_host_access_too() {
    let Some(mut env) = env_or_skip("limits_without_host_access").await else {
        return;
    };
    env.provider = env.provider.clone().with_host_access(false);
    limits_on(&env, "inside").await;
}

async fn limits_on(env: &TestEnv, tag: &str) {
    let ws = env.workspace("limits");
    let mut spec = env.spec_for(&ws, true, NetworkPolicy::None, &format!("limits-{tag}"));
    spec.resources = ResourceHints {
        cpu: Some(1.0),
        memory_mb: Some(64),
        pids: Some(32),
    };
    let rt = env.provider.create(spec).await.unwrap();

    let r = run(
        &*rt,
        request(&["cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]),
    )
    .await;
    if r.exit_code == 0 {
        assert_eq!(text(&r.stdout).trim(), (64u64 << 20).to_string());
    }

    let mut hog = sh("x=a; while :; do x=$x$x; done");
    hog.timeout = Some(Duration::from_secs(60));
    match rt.exec(hog).await {
        Err(RuntimeError::ResourceLimit(msg)) => {
            assert!(msg.contains("memory"), "{msg}");
            eprintln!("memory hog ({tag}): {msg}");
        }
        other => panic!("a memory hog must be ResourceLimit, got {}", brief(&other)),
    }
    assert_usable(&*rt, "the OOM kill").await;

    // A fork bomb whose processes live long enough to meet the pids limit however
    // loaded the machine is (a pure `f | f &` bomb can burn out before it gets there).
    let mut bomb = sh("f() { sleep 2 & f | f & }; f; wait");
    bomb.timeout = Some(Duration::from_secs(30));
    match rt.exec(bomb).await {
        Err(RuntimeError::ResourceLimit(msg)) => {
            assert!(msg.contains("process"), "{msg}");
            eprintln!("fork bomb ({tag}): {msg}");
        }
        other => panic!("a fork bomb must be ResourceLimit, got {}", brief(&other)),
    }
    // The bomb's leftovers are gone and new processes can start.
    let mut settle = None;
    for _ in 0..50 {
        let r = run(&*rt, request(&["true"])).await;
        if r.exit_code == 0 {
            settle = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        settle.is_some(),
        "the container never recovered from the fork bomb"
    );
    let r = run(&*rt, sh("ls /proc | grep -c '^[0-9]'")).await;
    let procs: u32 = text(&r.stdout).trim().parse().unwrap_or(99);
    assert!(
        procs <= 6,
        "fork bomb processes survived: {procs} processes"
    );

    let mut nap = request(&["sleep", "30"]);
    nap.timeout = Some(Duration::from_secs(1));
    let t0 = Instant::now();
    let r = run(&*rt, nap).await;
    assert!(r.timed_out, "{r:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "timeout took {:?}",
        t0.elapsed()
    );
    assert_usable(&*rt, "a timeout").await;

    // A command that ran normally after all that is an ordinary result.
    let r = run(&*rt, sh("exit 3")).await;
    assert_eq!(r.exit_code, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_chunk_arrives_while_the_command_runs() {
    let Some(env) = env_or_skip("the_first_chunk_arrives_while_the_command_runs").await else {
        return;
    };
    let ws = env.workspace("stream");
    let rt = env
        .provider
        .create(env.spec_for(&ws, false, NetworkPolicy::None, "stream"))
        .await
        .unwrap();
    let t0 = Instant::now();
    let mut s = rt.exec_stream(sh("echo a; sleep 2; echo b")).await.unwrap();
    let mut first = None;
    let mut out = Vec::new();
    let mut done = None;
    while let Some(item) = s.next().await {
        match item.unwrap() {
            ExecChunk::Output { data, .. } => {
                first.get_or_insert(t0.elapsed());
                out.extend(data);
            }
            ExecChunk::Finished(r) => done = Some((r, t0.elapsed())),
        }
    }
    let first = first.expect("no output");
    let (r, end) = done.expect("no result");
    eprintln!("measured: first chunk after {first:?}, result after {end:?}");
    assert!(
        first < Duration::from_millis(1500),
        "first chunk after {first:?}"
    );
    assert!(end >= Duration::from_secs(2));
    assert_eq!(text(&out), "a\nb\n");
    assert_eq!(r.exit_code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphaned_children_are_reaped_by_the_containers_init() {
    let Some(env) = env_or_skip("zombies").await else {
        return;
    };
    let ws = env.workspace("zombies");
    let rt = env
        .provider
        .create(env.spec_for(&ws, false, NetworkPolicy::None, "zombies"))
        .await
        .unwrap();
    // The subshell exits at once; its `sleep` child is orphaned, reparented to the
    // container's pid 1 and, when it ends, must be reaped by it.
    let r = run(
        &*rt,
        sh("(sleep 0.2 &); sleep 1; cat /proc/[0-9]*/stat 2>/dev/null | awk '$3 == \"Z\"' | wc -l"),
    )
    .await;
    assert_eq!(text(&r.stdout).trim(), "0", "zombies left: {r:?}");
    let r = run(&*rt, request(&["cat", "/proc/1/cmdline"])).await;
    assert!(
        text(&r.stdout).contains("init"),
        "pid 1 is {:?}",
        text(&r.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_processes_do_not_outlive_their_command() {
    let Some(env) = env_or_skip("background_processes").await else {
        return;
    };
    background_on(&env).await;
}

async fn background_on(env: &TestEnv) {
    let ws = env.workspace("bg");
    let rt = env
        .provider
        .create(env.spec_for(&ws, false, NetworkPolicy::None, "bg"))
        .await
        .unwrap();
    let nap = format!("3602.{}", unique_token());
    let t0 = Instant::now();
    let r = run(&*rt, sh(&format!("sleep {nap} & echo started"))).await;
    assert_eq!(text(&r.stdout), "started\n");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    let deadline = Instant::now() + Duration::from_secs(3);
    while !grove_runtime_contract::host_processes_matching(&nap).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the background sleep outlived its command"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_removes_unowned_containers_and_keeps_owned_ones() {
    let Some(env) = env_or_skip("sweep").await else {
        return;
    };
    let ws = env.workspace("sweep");
    let owned_spec = env.spec_for(&ws, false, NetworkPolicy::None, "owned");
    let orphan_spec = env.spec_for(&ws, false, NetworkPolicy::None, "orphan");
    let owned = env.provider.create_docker(owned_spec).await.unwrap();
    let orphan = env.provider.create_docker(orphan_spec).await.unwrap();

    let keep: HashSet<String> = [owned.runtime_id().to_string()].into();
    // A grace period spares young containers.
    let spared = env
        .provider
        .sweep_orphans_older_than(&keep, Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(spared.is_empty(), "{spared:?}");

    let removed = env.provider.sweep_orphans(&keep).await.unwrap();
    assert_eq!(removed, vec![orphan.container_name().to_string()]);
    let left: Vec<String> = env.containers().await.into_iter().map(|c| c.name).collect();
    assert_eq!(left, vec![owned.container_name().to_string()]);
    assert!(ws.exists(), "the sweep touched the workspace");
    assert_usable(&owned, "a sweep").await;
    assert!(env.provider.sweep_orphans(&keep).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_whose_home_is_gone_are_swept_from_any_scope() {
    let Some(env) = env_or_skip("containers_whose_home_is_gone_are_swept_from_any_scope").await
    else {
        return;
    };
    let (gone, kept) = (env.root().join("home-gone"), env.root().join("home-kept"));
    std::fs::create_dir(&gone).unwrap();
    std::fs::create_dir(&kept).unwrap();
    let ws = env.workspace("homes");
    let of_gone = env
        .provider
        .clone()
        .with_home_path(&gone)
        .create_docker(env.spec_for(&ws, false, NetworkPolicy::None, "gone"))
        .await
        .unwrap();
    let of_kept = env
        .provider
        .clone()
        .with_home_path(&kept)
        .create_docker(env.spec_for(&ws, false, NetworkPolicy::None, "kept"))
        .await
        .unwrap();
    // A worker of another deployment (another scope) on the same engine.
    let other = DockerRuntimeProvider::connect()
        .await
        .unwrap()
        .with_scope_label("grove.test", format!("other-{}", unique_token()));
    assert!(
        other
            .sweep_homeless(Duration::ZERO)
            .await
            .unwrap()
            .iter()
            .all(|n| n != of_gone.container_name() && n != of_kept.container_name()),
        "a container whose home exists was swept"
    );
    std::fs::remove_dir(&gone).unwrap();
    // Young containers are spared by the grace.
    let spared = other
        .sweep_homeless(Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(!spared.contains(&of_gone.container_name().to_string()));
    let removed = other.sweep_homeless(Duration::ZERO).await.unwrap();
    assert!(
        removed.contains(&of_gone.container_name().to_string()),
        "{removed:?}"
    );
    assert!(
        !removed.contains(&of_kept.container_name().to_string()),
        "{removed:?}"
    );
    let left: Vec<String> = env.containers().await.into_iter().map(|c| c.name).collect();
    assert_eq!(left, vec![of_kept.container_name().to_string()]);
    assert!(ws.exists(), "the sweep touched the workspace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_status_and_commit_work_inside_the_debian_image() {
    let Some(env) = env_or_skip("git_status_and_commit_work_inside_the_debian_image").await else {
        return;
    };
    let Some(image) = support::debian_image(&env).await else {
        return;
    };
    // A workspace checked out the way grove-git does it: a clone whose objects come
    // from a cache through alternates; the cache is mounted read-only.
    let cache = env.workspace_owned_by_root("git-cache");
    let ws = env.workspace_owned_by_root("git-ws");
    let git = |dir: &Path, args: &[&str]| {
        let out = std::process::Command::new("git")
            // The workspace belongs to the sandbox user, not to this (root) process.
            .args(["-c", "safe.directory=*"])
            .args(args)
            .current_dir(dir)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
            .output()
            .expect("git on the host");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let src = env.workspace_owned_by_root("git-src");
    git(&src, &["init", "-q", "-b", "main"]);
    std::fs::write(src.join("README"), "hello\n").unwrap();
    git(&src, &["add", "README"]);
    git(&src, &["commit", "-q", "-m", "first"]);
    std::fs::remove_dir(&cache).unwrap();
    git(
        env.root(),
        &[
            "clone",
            "-q",
            "--bare",
            src.to_str().unwrap(),
            cache.to_str().unwrap(),
        ],
    );
    std::fs::remove_dir(&ws).unwrap();
    git(
        env.root(),
        &[
            "clone",
            "-q",
            "--shared",
            cache.to_str().unwrap(),
            ws.to_str().unwrap(),
        ],
    );
    chown_tree(&ws, TEST_UID, TEST_UID);

    let mut spec = env.spec_for(&ws, true, NetworkPolicy::None, "git");
    spec.image = Some(image);
    spec.mounts.push(Mount {
        source: cache.clone(),
        target: cache.clone(),
        writable: false,
    });
    let rt = env.provider.create(spec).await.unwrap();
    let mut req = sh("echo change >> README && echo new > added.txt && git status --short");
    req.mutating = true;
    let r = run(&*rt, req).await;
    assert_eq!(r.exit_code, 0, "git status: {}", text(&r.stderr));
    assert!(text(&r.stdout).contains("README"), "{r:?}");
    assert!(text(&r.stdout).contains("added.txt"), "{r:?}");
    let mut req =
        sh("git add -A && git commit -q -m 'from the container' && git log --oneline | head -1");
    req.mutating = true;
    req.env.insert("GIT_AUTHOR_NAME".into(), "agent".into());
    req.env
        .insert("GIT_AUTHOR_EMAIL".into(), "agent@example.invalid".into());
    req.env.insert("GIT_COMMITTER_NAME".into(), "agent".into());
    req.env
        .insert("GIT_COMMITTER_EMAIL".into(), "agent@example.invalid".into());
    let r = run(&*rt, req).await;
    assert_eq!(r.exit_code, 0, "git commit: {}", text(&r.stderr));
    let log = git(&ws, &["log", "--format=%s %an", "-1"]);
    assert_eq!(
        log.trim(),
        "from the container agent",
        "commit not visible on the host"
    );
    let r = run(&*rt, request(&["git", "diff", "HEAD~1", "--stat"])).await;
    assert_eq!(r.exit_code, 0, "git diff: {}", text(&r.stderr));
    // The cache stays untouched by the container.
    let r = run(&*rt, sh(&format!("touch {}/objects/x", cache.display()))).await;
    assert_ne!(r.exit_code, 0, "the container wrote into the cache");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_execs_in_one_container_do_not_disturb_each_other() {
    let Some(env) = env_or_skip("concurrent_execs").await else {
        return;
    };
    concurrent_on(&env).await;
}

async fn concurrent_on(env: &TestEnv) {
    let ws = env.workspace("conc");
    let rt = env
        .provider
        .create(env.spec_for(&ws, false, NetworkPolicy::None, "conc"))
        .await
        .unwrap();
    let long = async {
        let r = run(&*rt, sh("sleep 1.5; echo long-done")).await;
        assert_eq!(text(&r.stdout), "long-done\n", "{r:?}");
    };
    let timed = async {
        let mut req = request(&["sleep", "20"]);
        req.timeout = Some(Duration::from_millis(300));
        let r = run(&*rt, req).await;
        assert!(r.timed_out);
    };
    let quick = async {
        for i in 0..5 {
            let r = run(&*rt, request(&["echo", &i.to_string()])).await;
            assert_eq!(text(&r.stdout), format!("{i}\n"));
        }
    };
    tokio::join!(long, timed, quick);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analysis_execs_start_on_empty_scratch_dirs_and_edit_runtimes_keep_theirs() {
    let Some(env) = env_or_skip("fresh_scratch").await else {
        return;
    };
    fresh_on(&env, "fresh").await;
}

/// Plants in every scratch dir of a read-only runtime (one behind a `chmod 000`
/// directory, one in a `$HOME` the request sets) are gone for the next exec; a
/// writable runtime's `/tmp` outlives its exec.
async fn fresh_on(env: &TestEnv, tag: &str) {
    let ws = env.workspace(&format!("{tag}-ro"));
    let ro = env
        .provider
        .create(env.spec_for(&ws, false, NetworkPolicy::None, &format!("{tag}-ro")))
        .await
        .unwrap();
    let plant = "for d in /tmp /var/tmp /dev/shm /run/lock \"$HOME\"; do \
                 [ -w \"$d\" ] && echo PLANT > \"$d/.p\"; done; \
                 mkdir -p /tmp/locked && echo PLANT > /tmp/locked/p && chmod 000 /tmp/locked; \
                 ln -s /etc/passwd /tmp/link; echo planted";
    let r = run(&*ro, sh(plant)).await;
    assert!(text(&r.stdout).contains("planted"), "{r:?}");
    let mut req = sh("mkdir -p /var/tmp/h2; echo PLANT > /var/tmp/h2/.gitconfig; echo planted");
    req.env.insert("HOME".into(), "/var/tmp/h2".into());
    assert!(text(&run(&*ro, req).await.stdout).contains("planted"));
    let look = "chmod 700 /tmp/locked 2>/dev/null; \
                cat /tmp/.p /var/tmp/.p /dev/shm/.p /run/lock/.p /tmp/locked/p \
                /var/tmp/h2/.gitconfig 2>/dev/null; ls -A /tmp /var/tmp /dev/shm; echo looked";
    let r = run(&*ro, sh(look)).await;
    let out = text(&r.stdout);
    assert!(out.contains("looked"), "{r:?}");
    assert!(
        !out.contains("PLANT"),
        "a plant reached the next exec:\n{out}"
    );
    for name in ["locked", "link", "h2", ".p"] {
        assert!(!out.contains(name), "{name} is left:\n{out}");
    }
    assert!(
        std::fs::read_to_string("/etc/passwd")
            .unwrap()
            .contains("root"),
        "the host file behind the link is intact"
    );

    let ws = env.workspace(&format!("{tag}-rw"));
    let rw = env
        .provider
        .create(env.spec_for(&ws, true, NetworkPolicy::None, &format!("{tag}-rw")))
        .await
        .unwrap();
    run(&*rw, sh("echo KEPT > /tmp/kept")).await;
    let r = run(&*rw, sh("cat /tmp/kept")).await;
    assert_eq!(text(&r.stdout), "KEPT\n", "an edit runtime keeps its /tmp");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_program_exits_127_and_a_bad_cwd_is_refused() {
    let Some(env) = env_or_skip("a_missing_program_exits_127").await else {
        return;
    };
    let ws = env.workspace("missing");
    let rt = env
        .provider
        .create(env.spec_for(&ws, false, NetworkPolicy::None, "missing"))
        .await
        .unwrap();
    let r = run(&*rt, request(&["grove-no-such-program"])).await;
    assert_eq!(r.exit_code, 127, "{}", brief(&Ok(r.clone())));
    assert!(text(&r.stderr).contains("not found"), "{}", text(&r.stderr));
    let mut req = request(&["pwd"]);
    req.cwd = Some("does/not/exist".into());
    assert!(matches!(
        rt.exec(req).await,
        Err(RuntimeError::CommandRejected(_))
    ));
    let mut req = request(&["sh", "-c", "echo x > f"]);
    req.mutating = true;
    assert!(
        matches!(rt.exec(req).await, Err(RuntimeError::CommandRejected(_))),
        "a mutating command on a read-only runtime is refused up front"
    );
}

/// Needs no engine: a socket nobody listens on is a clear `Unavailable`.
#[tokio::test]
async fn connecting_where_no_engine_answers_is_unavailable() {
    let path = std::env::temp_dir().join(format!("grove-no-engine-{}.sock", unique_token()));
    match DockerRuntimeProvider::connect_unix(path.to_str().unwrap()).await {
        Err(RuntimeError::Unavailable(msg)) => {
            assert!(msg.contains("Docker engine"), "{msg}")
        }
        Ok(_) => panic!("connected to a socket that does not exist"),
        Err(e) => panic!("expected Unavailable, got {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_is_healthy_while_its_container_runs_and_not_once_it_is_gone() {
    let Some(env) = env_or_skip("health").await else {
        return;
    };
    let ws = env.workspace("health");
    let spec = env.spec_for(&ws, true, NetworkPolicy::None, "health");
    let provider: &dyn RuntimeProvider = &env.provider;
    let name = provider.backend_id(&spec);
    env.provider.create_docker(spec).await.unwrap();
    assert!(
        provider.healthy(&name).await.unwrap(),
        "a running container is healthy"
    );
    env.provider.stop(&name).await.unwrap();
    assert!(
        !provider.healthy(&name).await.unwrap(),
        "a stopped container is not running"
    );
    RuntimeProvider::destroy(provider, &name).await.unwrap();
    assert!(
        !provider.healthy(&name).await.unwrap(),
        "a vanished container is not healthy"
    );
}
