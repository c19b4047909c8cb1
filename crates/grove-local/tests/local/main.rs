//! The local runtime against the runtime contract (with bubblewrap, and with
//! isolation forced off), plus the local-only rules: refusals without isolation,
//! `limited` network refused, bwrap argv shape and failure classification.
//!
//! Workspaces live under cargo's per-target tmp dir rather than /tmp: /tmp is covered
//! by a tmpfs inside the sandbox anyway, so only a scratch root outside it proves that
//! the provider's `hidden` dirs are what keeps other workspaces invisible.

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
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::Builder::new()
        .prefix("grove-home-")
        .tempdir_in(base)
        .unwrap()
}

/// The provider the worker would use: bwrap when it works, the scratch root hidden.
fn detected() -> Local {
    let root = scratch_root();
    let provider = LocalRuntimeProvider::detect(vec![root.path().to_path_buf()]);
    if let Some(why) = provider.isolation_unavailable_reason() {
        eprintln!("note: no OS isolation here ({why}); isolation checks will be skipped");
    }
    Local { provider, root }
}

fn unisolated() -> Local {
    let root = scratch_root();
    let provider = LocalRuntimeProvider::without_isolation(vec![root.path().to_path_buf()]);
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

/// The contract with isolation forced off: the checks that need isolation or writes
/// report themselves skipped; the rest must hold for the direct-spawn fallback too.
mod without_isolation {
    all_contract_tests!(unisolated);
}

async fn create(h: &Local, writable: bool) -> Box<dyn Runtime> {
    let ws = tempfile::Builder::new()
        .prefix("ws-")
        .tempdir_in(h.root.path())
        .unwrap()
        .keep();
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
async fn host_run_home_and_root_are_empty_inside_the_sandbox() {
    let h = detected();
    if no_bwrap(&h, "host_run_home_and_root_are_empty_inside_the_sandbox") {
        return;
    }
    let rt = create(&h, false).await;
    for dir in ["/run", "/home", "/root"] {
        if !Path::new(dir).is_dir() {
            continue;
        }
        let r = rt.exec(request(&["ls", "-A", dir])).await.unwrap();
        assert_eq!(
            r.exit_code,
            0,
            "ls {dir}: {}",
            String::from_utf8_lossy(&r.stderr)
        );
        assert!(
            r.stdout.is_empty(),
            "{dir} is not empty inside: {}",
            String::from_utf8_lossy(&r.stdout)
        );
    }
}

/// Guards the contract's hidden-workspace check against passing for the wrong reason:
/// with nothing hidden the sibling workspace is readable, so it is the provider's
/// `hidden` list (the worker's `$GROVE_HOME`) that makes it invisible.
#[tokio::test]
async fn without_hidden_dirs_a_sibling_workspace_is_visible() {
    let h = detected();
    if no_bwrap(&h, "without_hidden_dirs_a_sibling_workspace_is_visible") {
        return;
    }
    let exposed = Local {
        provider: LocalRuntimeProvider::detect(Vec::new()),
        root: scratch_root(),
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
    assert_eq!(String::from_utf8_lossy(&r.stdout), fx.secret);
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
    // bwrap cannot create a mount point on the read-only host root.
    spec.mounts.push(grove_core::ports::Mount {
        source: ws.path().to_path_buf(),
        target: "/grove-local-test-no-such-dir/x".into(),
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
    // Documented limit of the heuristic: this exact shape is misread as a setup
    // failure; anything with stdout output is not.
    assert!(matches!(r, Err(RuntimeError::Unavailable(_))), "{r:?}");
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
    let root = std::fs::canonicalize(h.root.path()).unwrap();
    for expected in [
        "--ro-bind / / --dev /dev --proc /proc --tmpfs /tmp".to_string(),
        format!("--tmpfs {}", root.display()),
        format!("--bind {0} {0}", ws_path.display()),
        "--unshare-pid --unshare-ipc --unshare-uts --die-with-parent --new-session --cap-drop ALL --clearenv --unshare-net".into(),
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
