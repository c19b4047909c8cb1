//! The local runtime against the runtime contract (with bubblewrap, and with
//! isolation forced off), plus the local-only rules: refusals without isolation,
//! `limited` network refused, bwrap argv shape and failure classification.
//!
//! Scratch roots live under `/var/tmp/grove-tests/`, whatever the checkout's or
//! `$TMPDIR`'s location: the sandbox shows no host path but its mounts, so a sibling
//! workspace is invisible wherever it lies, and these tests hold from any clone. The
//! attacker's suite (`grove_runtime_contract::attacks`) runs with and without the
//! exec agent.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use grove_core::error::RuntimeError;
use grove_core::ports::{ExecRequest, NetworkPolicy, Runtime, RuntimeProvider};
use grove_local::LocalRuntimeProvider;
use grove_runtime_contract::{self as contract, default_spec, request, Harness};

struct Local {
    provider: LocalRuntimeProvider,
    root: tempfile::TempDir,
}

impl Harness for Local {
    fn provider(&self) -> &dyn RuntimeProvider {
        &self.provider
    }
    fn scratch_root(&self) -> &Path {
        self.root.path()
    }
}

fn scratch_root() -> tempfile::TempDir {
    let base = PathBuf::from("/var/tmp/grove-tests");
    std::fs::create_dir_all(&base).unwrap();
    tempfile::Builder::new()
        .prefix("grove-home-")
        .tempdir_in(base)
        .unwrap()
}

/// The provider the worker would use: bwrap when it works, the scratch root hidden.
fn detected() -> Local {
    let root = scratch_root();
    let provider = LocalRuntimeProvider::detect(root.path());
    if let Some(why) = provider.isolation_unavailable_reason() {
        eprintln!("note: no OS isolation here ({why}); isolation checks will be skipped");
    }
    Local { provider, root }
}

/// bwrap as `detect` finds it, but no exec agent: every exec builds its own sandbox.
fn detected_without_agent() -> Local {
    let mut h = detected();
    h.provider = h.provider.with_agent(None);
    h
}

fn unisolated() -> Local {
    let root = scratch_root();
    let provider = LocalRuntimeProvider::without_isolation(root.path());
    Local { provider, root }
}

/// Prints why and returns true when bwrap does not work on this machine.
fn no_bwrap(h: &Local, test: &str) -> bool {
    match h.provider.isolation_unavailable_reason() {
        Some(why) => {
            eprintln!("skipped: {test}: {why}");
            true
        }
        None => false,
    }
}

macro_rules! contract_tests {
    ($harness:ident: $($check:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $check() {
                let h = super::$harness();
                let _ = grove_runtime_contract::$check(&h).await;
            }
        )*
    };
}

macro_rules! all_contract_tests {
    ($harness:ident) => {
        contract_tests!($harness:
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
    };
}

/// The contract with whatever `detect` found (bwrap on this machine and in CI).
mod with_bubblewrap {
    all_contract_tests!(detected);
}

/// The contract with bwrap but without the exec agent (the fallback path).
mod with_bubblewrap_without_agent {
    all_contract_tests!(detected_without_agent);
}

/// The attacker's suite with what `detect` finds, and without the exec agent.
mod attacks {
    grove_runtime_contract::attack_tests!(super::detected);
}

mod attacks_without_agent {
    grove_runtime_contract::attack_tests!(super::detected_without_agent);
}

/// A new workspace in the scratch root, handed to the sandbox identity as the worker
/// does before the first command.
fn handed_over(h: &Local) -> PathBuf {
    let ws = tempfile::Builder::new()
        .prefix("ws-")
        .tempdir_in(h.root.path())
        .unwrap()
        .keep();
    if let Some(id) = h.provider.sandbox_identity() {
        contract::hand_over(&ws, id.uid, id.gid);
    }
    ws
}

/// The contract with isolation forced off: the checks that need isolation or writes
/// report themselves skipped; the rest must hold for the direct-spawn fallback too.
mod without_isolation {
    all_contract_tests!(unisolated);
}

async fn create(h: &Local, writable: bool) -> Box<dyn Runtime> {
    let ws = handed_over(h);
    h.provider
        .create(default_spec(&ws, writable, NetworkPolicy::None))
        .await
        .expect("create")
}

#[tokio::test]
async fn without_isolation_a_mutating_request_is_refused() {
    let h = unisolated();
    let rt = create(&h, true).await;
    let mut req = request(&["touch", "x"]);
    req.mutating = true;
    match rt.exec(req).await {
        Err(RuntimeError::CommandRejected(msg)) => {
            assert!(msg.contains("isolation is unavailable"), "message: {msg}")
        }
        other => panic!("expected CommandRejected, got {other:?}"),
    }
}

#[tokio::test]
async fn without_isolation_a_mutating_stream_is_refused_too() {
    let h = unisolated();
    let rt = create(&h, true).await;
    let mut req = request(&["touch", "x"]);
    req.mutating = true;
    assert!(matches!(
        rt.exec_stream(req).await.map(|_| ()),
        Err(RuntimeError::CommandRejected(_))
    ));
}

#[tokio::test]
async fn without_isolation_a_read_request_runs() {
    let h = unisolated();
    let rt = create(&h, false).await;
    let r = rt.exec(request(&["echo", "read"])).await.unwrap();
    assert_eq!(r.stdout, b"read\n");
    assert_eq!(r.exit_code, 0);
}

#[tokio::test]
async fn without_isolation_capabilities_report_nothing_enforced() {
    let h = unisolated();
    let caps = h.provider.capabilities();
    assert_eq!(h.provider.kind(), "local");
    assert!(!caps.isolated && !caps.writable && !caps.network_none && !caps.network_limited);
    assert!(!caps.snapshot && !caps.preview_url && !caps.interactive_session);
    assert!(
        h.provider.sessions().is_none(),
        "no unsandboxed interactive shells"
    );
}

#[tokio::test]
async fn with_bubblewrap_capabilities_claim_isolation_writes_network_none_and_sessions_only() {
    let h = detected();
    if no_bwrap(
        &h,
        "with_bubblewrap_capabilities_claim_isolation_writes_network_none_and_sessions_only",
    ) {
        return;
    }
    let caps = h.provider.capabilities();
    assert!(caps.isolated && caps.writable && caps.network_none && caps.interactive_session);
    assert!(!caps.network_limited && !caps.snapshot && !caps.preview_url);
}

#[tokio::test]
async fn limited_network_is_refused_at_create_with_or_without_isolation() {
    for h in [detected(), unisolated()] {
        let spec = default_spec(h.root.path(), false, NetworkPolicy::Limited);
        match h.provider.create(spec).await.map(|_| ()) {
            Err(RuntimeError::CommandRejected(msg)) => assert_eq!(
                msg,
                "network policy 'limited' is not enforceable by the local runtime"
            ),
            other => panic!("expected CommandRejected, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_missing_workspace_is_not_found_at_create() {
    let h = detected();
    let spec = default_spec(&h.root.path().join("gone"), true, NetworkPolicy::None);
    assert!(matches!(
        h.provider.create(spec).await.map(|_| ()),
        Err(RuntimeError::NotFound(_))
    ));
}

#[tokio::test]
async fn a_missing_program_exits_127_in_both_modes() {
    for h in [detected(), unisolated()] {
        let rt = create(&h, false).await;
        let r = rt
            .exec(request(&["grove-local-no-such-program"]))
            .await
            .unwrap();
        assert_eq!(r.exit_code, 127, "{r:?}");
    }
}

#[tokio::test]
async fn invalid_request_env_is_rejected() {
    let h = detected();
    let rt = create(&h, false).await;
    let mut req = request(&["true"]);
    req.env.insert("NOT=VALID".into(), "x".into());
    assert!(matches!(
        rt.exec(req).await,
        Err(RuntimeError::CommandRejected(_))
    ));
}

#[tokio::test]
async fn a_mutating_request_on_a_read_only_workspace_is_refused_up_front() {
    let h = detected();
    if no_bwrap(
        &h,
        "a_mutating_request_on_a_read_only_workspace_is_refused_up_front",
    ) {
        return;
    }
    let rt = create(&h, false).await;
    let mut req = request(&["touch", "x"]);
    req.mutating = true;
    assert!(matches!(
        rt.exec(req).await,
        Err(RuntimeError::CommandRejected(_))
    ));
}

#[tokio::test]
async fn host_run_home_and_root_are_empty_or_absent_inside_the_sandbox() {
    let h = detected();
    if no_bwrap(
        &h,
        "host_run_home_and_root_are_empty_or_absent_inside_the_sandbox",
    ) {
        return;
    }
    let rt = create(&h, false).await;
    for dir in ["/run", "/home", "/root", "/sys", "/var/lib", "/srv", "/opt"] {
        let r = rt.exec(request(&["ls", "-A", dir])).await.unwrap();
        if r.exit_code != 0 {
            // Not there at all: the allow-list does not include it.
            continue;
        }
        // The exec agent's binary is bind-mounted into /run (read-only), and only it.
        let allowed = if dir == "/run" && h.provider.agent().is_some() {
            ".grove-sandboxd\n"
        } else {
            ""
        };
        assert_eq!(
            String::from_utf8_lossy(&r.stdout),
            allowed,
            "{dir} holds more than it should inside"
        );
    }
}

/// The filesystem is an allow-list: with nothing hidden, a sibling workspace is
/// still invisible (no host path is there unless mounted), while the same file is
/// readable on the host (so the check is not passing for a missing file).
#[tokio::test]
async fn without_hidden_dirs_a_sibling_workspace_is_still_invisible() {
    let h = detected();
    if no_bwrap(
        &h,
        "without_hidden_dirs_a_sibling_workspace_is_still_invisible",
    ) {
        return;
    }
    let root = scratch_root();
    let exposed = Local {
        provider: LocalRuntimeProvider::detect_hiding(root.path(), Vec::new()),
        root,
    };
    let fx = contract::Fixture::new(&exposed);
    let rt = exposed
        .provider
        .create(default_spec(fx.ws(), false, NetworkPolicy::None))
        .await
        .unwrap();
    let secret = fx.other_workspace.path().join("secret.txt");
    let r = rt
        .exec(request(&["cat", secret.to_str().unwrap()]))
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), fx.secret);
    assert_ne!(r.exit_code, 0);
    assert!(!String::from_utf8_lossy(&r.stdout).contains(&fx.secret));
}

#[tokio::test]
async fn commands_run_as_the_sandbox_identity_without_capabilities() {
    let h = detected();
    if no_bwrap(
        &h,
        "commands_run_as_the_sandbox_identity_without_capabilities",
    ) {
        return;
    }
    for h in [detected(), detected_without_agent()] {
        let rt = create(&h, true).await;
        let r = rt
            .exec(request(&[
                "sh",
                "-c",
                "id -u; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; touch made",
            ]))
            .await
            .unwrap();
        let out = String::from_utf8_lossy(&r.stdout).into_owned();
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let expected = h.provider.runs_as().map_or(me, |id| id.uid);
        assert!(out.starts_with(&format!("{expected}\n")), "{out}");
        assert!(out.contains("CapEff:\t0000000000000000"), "{out}");
        assert!(out.contains("NoNewPrivs:\t1"), "{out}");
        assert!(out.contains("Seccomp:\t2"), "{out}");
        let protections = h.provider.protections().unwrap();
        assert!(protections.contains("seccomp"), "{protections}");
    }
}

#[tokio::test]
async fn a_bwrap_setup_failure_is_unavailable_not_a_command_failure() {
    let h = detected();
    if no_bwrap(
        &h,
        "a_bwrap_setup_failure_is_unavailable_not_a_command_failure",
    ) {
        return;
    }
    let ws = tempfile::Builder::new()
        .prefix("ws-")
        .tempdir_in(h.root.path())
        .unwrap();
    let mut spec = default_spec(ws.path(), false, NetworkPolicy::None);
    // bwrap cannot create a mount point in the read-only system tree.
    spec.mounts.push(grove_core::ports::Mount {
        source: ws.path().to_path_buf(),
        target: "/usr/grove-local-test-no-such-dir/x".into(),
        writable: false,
    });
    let rt = h.provider.create(spec).await.unwrap();
    match rt.exec(request(&["true"])).await {
        Err(RuntimeError::Unavailable(msg)) => assert!(msg.contains("bwrap:"), "{msg}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // A command's own exit 1 with stderr is still a plain result.
    let rt = create(&h, false).await;
    let r = rt
        .exec(request(&[
            "sh",
            "-c",
            "echo 'bwrap: lookalike' >&2; exit 1",
        ]))
        .await;
    if h.provider.agent().is_some() {
        // Through the exec agent bwrap's errors never mix with a command's stderr.
        assert_eq!(r.map(|r| r.exit_code).ok(), Some(1));
    } else {
        // Documented limit of the heuristic: this exact shape is misread as a setup
        // failure; anything with stdout output is not.
        assert!(matches!(r, Err(RuntimeError::Unavailable(_))), "{r:?}");
    }
    let r = rt
        .exec(request(&[
            "sh",
            "-c",
            "echo out; echo 'bwrap: lookalike' >&2; exit 1",
        ]))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 1);
}

#[tokio::test]
async fn the_bwrap_argv_hides_the_host_and_ends_with_the_command() {
    let h = detected();
    if no_bwrap(
        &h,
        "the_bwrap_argv_hides_the_host_and_ends_with_the_command",
    ) {
        return;
    }
    let ws = tempfile::Builder::new()
        .prefix("ws-")
        .tempdir_in(h.root.path())
        .unwrap();
    std::fs::create_dir(ws.path().join("sub")).unwrap();
    let rt = h
        .provider
        .create_local(default_spec(ws.path(), true, NetworkPolicy::None))
        .unwrap();
    let mut req = request(&["echo", "hi"]);
    req.cwd = Some("sub".into());
    req.env.insert("FOO".into(), "bar".into());
    let argv: Vec<String> = rt
        .sandbox_argv(&req)
        .unwrap()
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    eprintln!("bwrap argv: {argv:?}");
    let joined = argv.join(" ");
    let ws_path = std::fs::canonicalize(ws.path()).unwrap();
    assert!(!joined.contains("--ro-bind / /"), "{joined}");
    for expected in [
        "--ro-bind /usr /usr".to_string(),
        "--dev /dev --proc /proc --tmpfs /tmp --tmpfs /var/tmp --tmpfs /run".to_string(),
        format!("--bind {0} {0}", ws_path.display()),
        "--unshare-user --disable-userns --unshare-pid --unshare-ipc --unshare-uts --unshare-cgroup-try --die-with-parent --new-session --cap-drop ALL --clearenv --unshare-net".into(),
        "--setenv FOO bar --setenv HOME /tmp --setenv LANG C.UTF-8 --setenv PATH /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        format!("--chdir {}/sub -- echo hi", ws_path.display()),
    ] {
        assert!(joined.contains(&expected), "{expected:?} missing from {joined}");
    }
    assert!(joined.ends_with("-- echo hi"));
}

#[tokio::test]
async fn dropping_an_exec_future_kills_the_command() {
    let h = detected();
    let rt = create(&h, false).await;
    let nap = format!("3602.{}", contract::unique_token());
    let script = format!("sleep {nap}");
    let req = ExecRequest {
        argv: vec!["sh".into(), "-c".into(), script],
        timeout: Some(Duration::from_secs(60)),
        ..ExecRequest::default()
    };
    // Polled long enough to start the command, then abandoned.
    let _ = tokio::time::timeout(Duration::from_millis(500), rt.exec(req)).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    while !contract::host_processes_matching(&nap).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the abandoned command is still running"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_background_process_does_not_outlive_its_command_in_either_mode() {
    for h in [detected(), unisolated()] {
        let rt = create(&h, false).await;
        let nap = format!("3603.{}", contract::unique_token());
        let t0 = Instant::now();
        let r = rt
            .exec(request(&[
                "sh",
                "-c",
                &format!("sleep {nap} & echo started"),
            ]))
            .await
            .unwrap();
        assert_eq!(r.stdout, b"started\n");
        assert!(!r.timed_out);
        // The straggler holds stdout open; it must be killed, not waited for.
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "took {:?}",
            t0.elapsed()
        );
        let deadline = Instant::now() + Duration::from_secs(3);
        while !contract::host_processes_matching(&nap).is_empty() {
            assert!(
                Instant::now() < deadline,
                "the background sleep outlived its command"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test]
async fn hibernating_a_runtime_ends_its_interactive_sessions() {
    let h = detected();
    if no_bwrap(&h, "hibernating_a_runtime_ends_its_interactive_sessions") {
        return;
    }
    let ws = tempfile::Builder::new()
        .prefix("ws-")
        .tempdir_in(h.root.path())
        .unwrap();
    let mut spec = default_spec(ws.path(), false, NetworkPolicy::None);
    spec.labels
        .insert("grove.runtime".into(), "rt-hibernate".into());
    let backend_id = h.provider.backend_id(&spec);
    let sessions = h.provider.sessions().expect("sessions with bubblewrap");
    let info = sessions
        .start(
            spec,
            grove_core::ports::SessionRequest {
                argv: vec!["cat".into()],
                ..Default::default()
            },
        )
        .await
        .expect("start");
    assert_eq!(info.backend_id, backend_id);
    h.provider.stop(&backend_id).await.expect("stop");
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        let out = sessions
            .poll(&info.id, Duration::from_millis(200))
            .await
            .unwrap();
        if let Some(exit) = out.exit {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "the session outlived its runtime"
        );
    };
    assert!(exit.killed, "{exit:?}");
}

/// The provider with bwrap and the exec agent, or the printed reason to skip `test`.
fn with_agent(test: &str) -> Option<Local> {
    let h = detected();
    if no_bwrap(&h, test) {
        return None;
    }
    if h.provider.agent().is_none() {
        let why = LocalRuntimeProvider::find_agent().err().unwrap_or_default();
        eprintln!("skipped: {test}: no exec agent ({why}; `cargo build -p grove-sandboxd`)");
        return None;
    }
    Some(h)
}

fn new_workspace(h: &Local) -> PathBuf {
    handed_over(h)
}

#[tokio::test]
async fn execs_of_one_sandbox_view_share_an_agent_and_a_read_view_stays_read_only() {
    let test = "execs_of_one_sandbox_view_share_an_agent_and_a_read_view_stays_read_only";
    let Some(h) = with_agent(test) else { return };
    let ws = new_workspace(&h);
    let writer = h
        .provider
        .create(default_spec(&ws, true, NetworkPolicy::None))
        .await
        .unwrap();
    let reader = h
        .provider
        .create(default_spec(&ws, false, NetworkPolicy::None))
        .await
        .unwrap();
    for i in 0..3 {
        let mut req = request(&["sh", "-c", &format!("echo {i} >> log")]);
        req.mutating = true;
        assert_eq!(writer.exec(req).await.unwrap().exit_code, 0);
    }
    let r = reader
        .exec(request(&["sh", "-c", "cat log; echo no > log"]))
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "0\n1\n2\n");
    assert_ne!(r.exit_code, 0, "the read view let a command write");
    assert_eq!(
        std::fs::read_to_string(ws.join("log")).unwrap(),
        "0\n1\n2\n"
    );
    assert_eq!(
        h.provider.running_agents(),
        2,
        "one agent per view: writable and read-only"
    );
    h.provider
        .destroy(
            &h.provider
                .backend_id(&default_spec(&ws, true, NetworkPolicy::None)),
        )
        .await
        .unwrap();
    assert_eq!(
        h.provider.running_agents(),
        0,
        "destroy stops the runtime's agents"
    );
}

#[tokio::test]
async fn an_agent_killed_mid_exec_fails_that_exec_once_and_the_next_exec_gets_a_new_one() {
    let test = "an_agent_killed_mid_exec_fails_that_exec_once_and_the_next_exec_gets_a_new_one";
    let Some(h) = with_agent(test) else { return };
    let ws = new_workspace(&h);
    let rt = h
        .provider
        .create(default_spec(&ws, true, NetworkPolicy::None))
        .await
        .unwrap();
    // The command's parent is the agent.
    let mut req = request(&["sh", "-c", "echo ran >> runs; kill -9 $PPID; sleep 5"]);
    req.mutating = true;
    match rt.exec(req).await {
        Err(RuntimeError::Unavailable(msg)) => assert!(msg.contains("agent"), "{msg}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(
        std::fs::read_to_string(ws.join("runs")).unwrap(),
        "ran\n",
        "the exec ran once and was not retried"
    );
    let r = rt.exec(request(&["echo", "again"])).await.unwrap();
    assert_eq!((r.exit_code, r.stdout.as_slice()), (0, &b"again\n"[..]));
}

#[tokio::test]
async fn processes_that_leave_their_group_do_not_outlive_the_exec() {
    let test = "processes_that_leave_their_group_do_not_outlive_the_exec";
    let Some(h) = with_agent(test) else { return };
    let ws = new_workspace(&h);
    let rt = h
        .provider
        .create(default_spec(&ws, false, NetworkPolicy::None))
        .await
        .unwrap();
    let nap = format!("3600.{}", contract::unique_token());
    let r = rt
        .exec(request(&[
            "sh",
            "-c",
            &format!("setsid sleep {nap} >/dev/null 2>&1 </dev/null & echo left"),
        ]))
        .await
        .unwrap();
    assert_eq!(r.stdout, b"left\n");
    let t0 = Instant::now();
    while !contract::host_processes_matching(&nap).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "a process that left its group survived the exec"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn env_and_cwd_do_not_carry_over_between_execs_of_one_agent() {
    let test = "env_and_cwd_do_not_carry_over_between_execs_of_one_agent";
    let Some(h) = with_agent(test) else { return };
    let ws = new_workspace(&h);
    std::fs::create_dir(ws.join("sub")).unwrap();
    let rt = h
        .provider
        .create(default_spec(&ws, false, NetworkPolicy::None))
        .await
        .unwrap();
    let mut first = request(&["sh", "-c", "pwd; echo $ONCE"]);
    first.env.insert("ONCE".into(), "set".into());
    first.cwd = Some("sub".into());
    let r = rt.exec(first).await.unwrap();
    assert!(
        String::from_utf8_lossy(&r.stdout).ends_with("/sub\nset\n"),
        "{r:?}"
    );
    let r = rt
        .exec(request(&["sh", "-c", "pwd; echo \"[$ONCE]\""]))
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&r.stdout).into_owned();
    assert!(!out.contains("/sub") && out.ends_with("[]\n"), "{out}");
}

#[tokio::test]
async fn an_unusable_agent_binary_falls_back_to_a_sandbox_per_exec() {
    let test = "an_unusable_agent_binary_falls_back_to_a_sandbox_per_exec";
    let h = detected();
    if no_bwrap(&h, test) {
        return;
    }
    // A file that is no agent: it says no hello.
    let fake = h.root.path().join("not-an-agent");
    std::fs::write(&fake, "#!/bin/sh\nexit 3\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let h = Local {
        provider: h.provider.with_agent(Some(fake)),
        root: h.root,
    };
    let rt = create(&h, false).await;
    let r = rt.exec(request(&["echo", "fallback"])).await.unwrap();
    assert_eq!((r.exit_code, r.stdout.as_slice()), (0, &b"fallback\n"[..]));
    assert_eq!(h.provider.running_agents(), 0);
}

/// The `pids` and `memory` cgroup directories of runtime `id`, or the printed reason
/// to skip `test` (limits are cgroups of the worker's own only as root on cgroup v1).
fn cgroup_dirs(h: &Local, test: &str, id: &str) -> Option<[PathBuf; 2]> {
    if no_bwrap(h, test) {
        return None;
    }
    if let grove_local::LimitMode::Rlimits(why) = h.provider.limit_mode() {
        eprintln!("skipped: {test}: no cgroups of our own ({why})");
        return None;
    }
    let dirs = h.provider.cgroup_dirs(&format!("local:{id}"));
    assert!(dirs.is_some(), "cgroup limits without cgroup directories");
    dirs
}

/// Waits up to 10 s for every path in `dirs` to be gone; whether they went.
async fn gone(dirs: &[PathBuf]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while dirs.iter().any(|d| d.exists()) {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

async fn cgroup_runtime(h: &Local, id: &str, run: bool) -> Box<dyn Runtime> {
    let ws = handed_over(h);
    let mut spec = default_spec(&ws, false, NetworkPolicy::None);
    spec.labels.insert("grove.runtime".into(), id.into());
    let rt = h.provider.create(spec).await.expect("create");
    if run {
        let r = rt.exec(request(&["true"])).await.expect("exec");
        assert_eq!(r.exit_code, 0, "{r:?}");
    }
    rt
}

#[tokio::test]
async fn a_dropped_runtime_leaves_no_cgroup_directory() {
    let test = "a_dropped_runtime_leaves_no_cgroup_directory";
    let h = detected_without_agent();
    let token = grove_runtime_contract::unique_token();
    for (id, run) in [
        (format!("cg-{token}-a"), false),
        (format!("cg-{token}-b"), true),
    ] {
        let Some(dirs) = cgroup_dirs(&h, test, &id) else {
            return;
        };
        let rt = cgroup_runtime(&h, &id, run).await;
        assert!(dirs.iter().all(|d| d.is_dir()), "no cgroup made for {id}");
        // A second handle on the same runtime shares the directories.
        let again = cgroup_runtime(&h, &id, false).await;
        drop(rt);
        assert!(
            dirs.iter().all(|d| d.is_dir()),
            "removed under a live handle"
        );
        let r = again.exec(request(&["true"])).await.expect("exec");
        assert_eq!(r.exit_code, 0, "{r:?}");
        drop(again);
        assert!(
            gone(&dirs).await,
            "{dirs:?} left after the runtime was dropped"
        );
    }
}

#[tokio::test]
async fn an_agents_cgroup_goes_with_the_agent_and_stale_ones_go_at_start() {
    let test = "an_agents_cgroup_goes_with_the_agent_and_stale_ones_go_at_start";
    let Some(h) = with_agent(test) else {
        return;
    };
    let id = format!("cg-{}-agent", grove_runtime_contract::unique_token());
    let Some(dirs) = cgroup_dirs(&h, test, &id) else {
        return;
    };
    let rt = cgroup_runtime(&h, &id, true).await;
    drop(rt);
    h.provider.destroy(&format!("local:{id}")).await.unwrap();
    assert!(gone(&dirs).await, "{dirs:?} left after the agent ended");

    // An empty directory an earlier worker of this deployment left is removed when a
    // provider of the same home starts, and so is one of the layout before deployments;
    // another deployment's empty directory is not.
    let stale = format!("cg-{}-stale", grove_runtime_contract::unique_token());
    let stale_dirs = cgroup_dirs(&h, test, &stale).unwrap();
    let other = detected();
    let foreign_dirs = cgroup_dirs(&other, test, &stale).unwrap();
    let legacy_dirs = ["pids", "memory"].map(|c| {
        Path::new("/sys/fs/cgroup")
            .join(c)
            .join("grove-local")
            .join(format!("local_{stale}"))
    });
    for d in stale_dirs.iter().chain(&foreign_dirs).chain(&legacy_dirs) {
        std::fs::create_dir_all(d).unwrap();
    }
    let _later = LocalRuntimeProvider::detect(h.root.path());
    let left = foreign_dirs.iter().all(|d| d.is_dir());
    for d in &foreign_dirs {
        let _ = std::fs::remove_dir(d);
    }
    assert!(
        stale_dirs.iter().all(|d| !d.exists()),
        "a stale empty cgroup survived a provider's start"
    );
    assert!(
        legacy_dirs.iter().all(|d| !d.exists()),
        "an empty cgroup of the old layout survived a provider's start"
    );
    assert!(
        left,
        "a provider's start removed another deployment's cgroup"
    );
}

/// Two deployments on one host (different `$GROVE_HOME`s) with a runtime of the same
/// backend id: each gets a cgroup of its own with its own limits, and destroying one
/// deployment's runtime leaves a command running in the other's undisturbed.
#[tokio::test]
async fn two_deployments_with_the_same_runtime_id_never_share_a_cgroup() {
    let test = "two_deployments_with_the_same_runtime_id_never_share_a_cgroup";
    let (a, b) = (detected_without_agent(), detected_without_agent());
    let id = format!("cg-{}-shared", grove_runtime_contract::unique_token());
    let (Some(dirs_a), Some(dirs_b)) = (cgroup_dirs(&a, test, &id), cgroup_dirs(&b, test, &id))
    else {
        return;
    };
    assert_ne!(dirs_a, dirs_b, "two deployments share one cgroup");
    let spec = |h: &Local, pids: u64| {
        let ws = handed_over(h);
        let mut spec = default_spec(&ws, false, NetworkPolicy::None);
        spec.labels.insert("grove.runtime".into(), id.clone());
        spec.resources.pids = Some(pids);
        spec
    };
    let rt_a = a.provider.create(spec(&a, 300)).await.expect("create a");
    let rt_b = b.provider.create(spec(&b, 400)).await.expect("create b");
    let pids_max = |dirs: &[PathBuf; 2]| std::fs::read_to_string(dirs[0].join("pids.max")).unwrap();
    assert_eq!(pids_max(&dirs_a).trim(), "300");
    assert_eq!(pids_max(&dirs_b).trim(), "400", "b runs under a's limits");

    // b's command is running in b's cgroup when a's runtime is destroyed.
    let running = tokio::spawn(async move {
        rt_b.exec(request(&["sh", "-c", "sleep 2; echo done"]))
            .await
    });
    let procs = dirs_b[0].join("cgroup.procs");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&procs)
        .unwrap_or_default()
        .trim()
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "b's command never joined b's cgroup"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(rt_a);
    a.provider.destroy(&format!("local:{id}")).await.unwrap();
    assert!(
        gone(&dirs_a).await,
        "{dirs_a:?} left after a's runtime was destroyed"
    );
    assert!(
        dirs_b.iter().all(|d| d.is_dir()),
        "a's destroy removed b's cgroup"
    );
    let r = running.await.unwrap().expect("b's exec");
    assert_eq!(
        (r.exit_code, r.stdout.as_slice()),
        (0, &b"done\n"[..]),
        "{r:?}"
    );
}
