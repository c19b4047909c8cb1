//! The runtime contract: behaviour every [`RuntimeProvider`] must show, as reusable
//! async checks, so local, Docker and remote providers are held to the same suite.
//!
//! A provider's test crate implements [`Harness`] and calls each check from its own
//! `#[tokio::test]` (or [`run_all`]). Each check panics with a sentence saying what
//! broke. Checks that need a capability the provider does not claim (isolation,
//! writes, network `none`) print `skipped: ...` on stderr and return
//! [`Outcome::Skipped`]; they are never silently passed.
//!
//! [`remote`] holds what the remote providers' test crates share on top.
//!
//! Checks look at the host only through the workspace directories and `/proc`, and
//! address files relative to the workspace root, so they hold whatever path the
//! workspace is mounted at inside the runtime.

pub mod attacks;
pub mod remote;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use grove_core::error::RuntimeError;
use grove_core::ports::{
    ExecChunk, ExecRequest, ExecResult, Mount, NetworkPolicy, Runtime, RuntimeProvider,
    RuntimeSpec, SessionExit, SessionId, SessionInput, SessionRequest, Sessions, SnapshotRequest,
    StreamKind,
};

/// A host variable set in the test process; it must never be visible inside.
pub const HOST_SECRET_VAR: &str = "GROVE_CONTRACT_HOST_SECRET";
const HOST_SECRET_VALUE: &str = "host-secret-must-not-leak";

/// Timeout given to every check's command that is not about timeouts, so a broken
/// runtime fails the check instead of hanging the suite.
const SAFETY_TIMEOUT: Duration = Duration::from_secs(30);

/// How a provider under test is set up.
pub trait Harness: Sync {
    fn provider(&self) -> &dyn RuntimeProvider;
    /// A host dir the provider hides from commands; fixtures create workspaces in it,
    /// so the "other workspace" of a fixture is exactly what must stay invisible.
    fn scratch_root(&self) -> &Path;
    /// The spec for a runtime on `workspace`; by default [`default_spec`].
    fn spec(&self, workspace: &Path, writable: bool, network: NetworkPolicy) -> RuntimeSpec {
        default_spec(workspace, writable, network)
    }
}

/// The workspace mounted at its own path, nothing else.
pub fn default_spec(workspace: &Path, writable: bool, network: NetworkPolicy) -> RuntimeSpec {
    RuntimeSpec {
        image: None,
        workdir: workspace.to_path_buf(),
        mounts: vec![Mount {
            source: workspace.to_path_buf(),
            target: workspace.to_path_buf(),
            writable,
        }],
        env: BTreeMap::new(),
        resources: Default::default(),
        network,
        labels: BTreeMap::new(),
    }
}

/// What a check concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    /// The provider does not claim what the check needs; the reason was printed.
    Skipped(String),
}

/// Two workspaces side by side in the harness's scratch root; the other one holds a
/// secret file that commands in `workspace` must not read.
pub struct Fixture {
    pub workspace: tempfile::TempDir,
    pub other_workspace: tempfile::TempDir,
    /// Content of `other_workspace/secret.txt`.
    pub secret: String,
}

impl Fixture {
    pub fn new(h: &dyn Harness) -> Self {
        let dir = |prefix: &str| {
            tempfile::Builder::new()
                .prefix(prefix)
                .tempdir_in(h.scratch_root())
                .expect("creating a fixture workspace in the scratch root")
        };
        let workspace = dir("ws-");
        let other_workspace = dir("other-ws-");
        // As the worker does before the first command: a provider whose commands run
        // as a sandbox identity gets the workspace handed over to it.
        if let Some(id) = h.provider().sandbox_identity() {
            hand_over(workspace.path(), id.uid, id.gid);
        }
        let secret = format!("other-workspace-secret-{}", unique_token());
        std::fs::write(other_workspace.path().join("secret.txt"), &secret)
            .expect("writing the other workspace's secret");
        Self {
            workspace,
            other_workspace,
            secret,
        }
    }

    pub fn ws(&self) -> &Path {
        self.workspace.path()
    }
}

/// Re-owns a test's own tree (it holds nothing hostile yet), symlinks themselves.
pub fn hand_over(dir: &Path, uid: u32, gid: u32) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = std::fs::symlink_metadata(&p).expect("reading the fixture tree");
        if meta.is_dir() {
            for e in std::fs::read_dir(&p).expect("listing the fixture tree") {
                stack.push(e.expect("listing the fixture tree").path());
            }
        }
        std::os::unix::fs::lchown(&p, Some(uid), Some(gid)).expect("handing over the fixture");
    }
}

/// A string unique in this process and very likely across processes (pid, counter,
/// clock), made of digits only so it can serve as a `sleep` fraction.
pub fn unique_token() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}{:04}{:09}", std::process::id(), n, nanos)
}

/// A request with the suite's safety timeout.
pub fn request(argv: &[&str]) -> ExecRequest {
    ExecRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        timeout: Some(SAFETY_TIMEOUT),
        ..ExecRequest::default()
    }
}

fn sh(script: &str) -> ExecRequest {
    request(&["sh", "-c", script])
}

async fn runtime(
    h: &dyn Harness,
    workspace: &Path,
    writable: bool,
    network: NetworkPolicy,
) -> Box<dyn Runtime> {
    runtime_from(h, h.spec(workspace, writable, network)).await
}

async fn runtime_from(h: &dyn Harness, spec: RuntimeSpec) -> Box<dyn Runtime> {
    let kind = h.provider().kind();
    match h.provider().create(spec).await {
        Ok(rt) => rt,
        Err(e) => panic!("provider '{kind}' failed to create a runtime: {e}"),
    }
}

async fn run(rt: &dyn Runtime, req: ExecRequest) -> ExecResult {
    let argv = req.argv.clone();
    match rt.exec(req).await {
        Ok(r) => r,
        Err(e) => panic!("exec of {argv:?} failed: {e}"),
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[derive(Clone, Copy)]
enum Need {
    Isolated,
    Writable,
    NetworkNone,
}

/// Prints and returns the reason to skip `check`, if the provider lacks a need.
fn skip(h: &dyn Harness, check: &str, needs: &[Need]) -> Option<Outcome> {
    let caps = h.provider().capabilities();
    let kind = h.provider().kind();
    for need in needs {
        let (has, what) = match need {
            Need::Isolated => (caps.isolated, "isolated"),
            Need::Writable => (caps.writable, "writable"),
            Need::NetworkNone => (caps.network_none, "network_none"),
        };
        if !has {
            let reason = format!("provider '{kind}' reports {what}: false");
            eprintln!("skipped: {check}: {reason}");
            return Some(Outcome::Skipped(reason));
        }
    }
    None
}

/// Sets [`HOST_SECRET_VAR`] in this process once. Setting a variable while other
/// threads may read the environment is only sound-ish; it is done once, early in the
/// check that needs it, and the value is constant.
fn plant_host_secret() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::env::set_var(HOST_SECRET_VAR, HOST_SECRET_VALUE));
}

/// Pids of host processes whose command line contains `needle` (never this process).
/// Scans `/proc` directly, so it needs no `pgrep` and sees processes in any pid
/// namespace below ours.
pub fn host_processes_matching(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    let c: Vec<u8> = c
                        .into_iter()
                        .map(|b| if b == 0 { b' ' } else { b })
                        .collect();
                    text(&c).contains(needle)
                })
                .unwrap_or(false)
        })
        .collect()
}

/// Waits until a process whose command line holds `needle` runs on the host: a
/// command's first output (`echo started; sleep …`) can come before the processes it
/// starts next exist.
async fn assert_processes_appear(needle: &str, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    while host_processes_matching(needle).is_empty() {
        if Instant::now() >= deadline {
            panic!("{what}: no process running `{needle}` within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until no host process mentions `needle`, panicking after `within`.
async fn assert_processes_gone(needle: &str, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    loop {
        let left = host_processes_matching(needle);
        if left.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("{what}: processes running `{needle}` still alive after {within:?}: {left:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------
// The checks.
// ---------------------------------------------------------------------------------

/// `echo` output arrives on stdout, stderr stays apart, and exit codes (including
/// death by signal, reported as 128 + signal) pass through unchanged.
pub async fn echo_and_exit_codes_pass_through(h: &dyn Harness) -> Outcome {
    let fx = Fixture::new(h);
    let rt = runtime(h, fx.ws(), false, NetworkPolicy::None).await;

    let r = run(&*rt, request(&["echo", "hello", "grove"])).await;
    assert_eq!(text(&r.stdout), "hello grove\n", "echo's stdout");
    assert_eq!(r.exit_code, 0, "exit code of echo");
    assert!(
        !r.timed_out && !r.truncated,
        "small output is neither timed out nor truncated: {r:?}"
    );

    let r = run(&*rt, sh("echo out; echo err >&2")).await;
    assert_eq!(
        text(&r.stdout),
        "out\n",
        "stdout of a command writing to both streams"
    );
    assert_eq!(
        text(&r.stderr),
        "err\n",
        "stderr of a command writing to both streams"
    );

    let r = run(&*rt, sh("exit 7")).await;
    assert_eq!(r.exit_code, 7, "`sh -c 'exit 7'` must report 7");

    let r = run(&*rt, sh("kill -9 $$")).await;
    assert_eq!(
        r.exit_code,
        128 + 9,
        "a command killed by SIGKILL reports 137"
    );
    Outcome::Passed
}

/// A program that does not exist is a failed command (non-zero exit), not a runtime
/// error: the runtime works, the command does not.
pub async fn a_missing_program_is_a_failed_command(h: &dyn Harness) -> Outcome {
    let fx = Fixture::new(h);
    let rt = runtime(h, fx.ws(), false, NetworkPolicy::None).await;
    let r = run(&*rt, request(&["grove-contract-no-such-program"])).await;
    assert_ne!(r.exit_code, 0, "a missing program must fail: {r:?}");
    Outcome::Passed
}

/// Request stdin reaches the command and is closed after; without stdin the command
/// sees EOF at once. A large stdin and its echo flow without deadlock.
pub async fn stdin_reaches_the_command(h: &dyn Harness) -> Outcome {
    let fx = Fixture::new(h);
    let rt = runtime(h, fx.ws(), false, NetworkPolicy::None).await;

    let mut req = request(&["cat"]);
    req.stdin = Some(b"line one\nline two\n".to_vec());
    let r = run(&*rt, req).await;
    assert_eq!(
        text(&r.stdout),
        "line one\nline two\n",
        "cat must echo stdin"
    );
    assert_eq!(r.exit_code, 0);

    let r = run(&*rt, request(&["cat"])).await;
    assert!(
        !r.timed_out,
        "cat without stdin must see EOF, not wait for input"
    );
    assert_eq!(r.stdout, b"", "cat without stdin prints nothing");

    // Bigger than any pipe buffer in both directions: stdin must be written while
    // stdout is read.
    let big: Vec<u8> = (0..2 * 1024 * 1024)
        .map(|i| b'a' + (i % 26) as u8)
        .collect();
    let mut req = request(&["cat"]);
    req.stdin = Some(big.clone());
    req.max_output_bytes = Some(4 * 1024 * 1024);
    let r = run(&*rt, req).await;
    assert!(!r.timed_out, "2 MiB through cat must not deadlock");
    assert!(
        r.stdout == big,
        "2 MiB through cat came back altered ({} bytes)",
        r.stdout.len()
    );
    Outcome::Passed
}

/// The spec's and the request's env are visible (the request wins); the test
/// process's own variables are not.
pub async fn only_the_given_env_is_visible(h: &dyn Harness) -> Outcome {
    plant_host_secret();
    let fx = Fixture::new(h);
    let token = unique_token();
    let mut spec = h.spec(fx.ws(), false, NetworkPolicy::None);
    spec.env
        .insert("GROVE_CONTRACT_FROM_SPEC".into(), "spec".into());
    spec.env
        .insert("GROVE_CONTRACT_OVERRIDDEN".into(), "spec".into());
    let rt = runtime_from(h, spec).await;

    let mut req = request(&["env"]);
    req.env
        .insert("GROVE_CONTRACT_VISIBLE".into(), token.clone());
    req.env
        .insert("GROVE_CONTRACT_OVERRIDDEN".into(), "request".into());
    let r = run(&*rt, req).await;
    assert_eq!(r.exit_code, 0, "env failed: {}", text(&r.stderr));
    let out = text(&r.stdout);
    let lines: Vec<&str> = out.lines().collect();
    for expected in [
        format!("GROVE_CONTRACT_VISIBLE={token}"),
        "GROVE_CONTRACT_FROM_SPEC=spec".to_string(),
        "GROVE_CONTRACT_OVERRIDDEN=request".to_string(),
    ] {
        assert!(
            lines.contains(&expected.as_str()),
            "{expected} missing from env:\n{out}"
        );
    }
    assert!(
        !out.contains(HOST_SECRET_VAR) && !out.contains(HOST_SECRET_VALUE),
        "the host variable {HOST_SECRET_VAR} leaked into the command:\n{out}"
    );
    // cargo sets these in test processes; none may be inherited.
    for (k, v) in std::env::vars() {
        if k.starts_with("CARGO") || k.starts_with("RUST") {
            assert!(
                !lines.contains(&format!("{k}={v}").as_str()),
                "host variable {k} leaked into the command"
            );
        }
    }
    Outcome::Passed
}

/// A relative cwd inside the workspace is honoured.
pub async fn cwd_inside_the_workspace_works(h: &dyn Harness) -> Outcome {
    let fx = Fixture::new(h);
    std::fs::create_dir_all(fx.ws().join("sub/deeper")).unwrap();
    std::fs::write(fx.ws().join("sub/deeper/marker.txt"), "here").unwrap();
    let rt = runtime(h, fx.ws(), false, NetworkPolicy::None).await;

    let mut req = request(&["sh", "-c", "pwd; cat marker.txt"]);
    req.cwd = Some("sub/deeper".into());
    let r = run(&*rt, req).await;
    assert_eq!(
        r.exit_code,
        0,
        "command in sub/deeper failed: {}",
        text(&r.stderr)
    );
    let out = text(&r.stdout);
    assert!(
        out.starts_with('/') && out.lines().next().unwrap().ends_with("/sub/deeper"),
        "pwd: {out}"
    );
    assert!(
        out.ends_with("here"),
        "marker.txt not read from the cwd: {out}"
    );

    let mut req = request(&["cat", "sub/deeper/marker.txt"]);
    req.cwd = Some(".".into());
    let r = run(&*rt, req).await;
    assert_eq!(text(&r.stdout), "here", "cwd '.' is the workspace root");
    Outcome::Passed
}

/// A cwd that leaves the workspace (`..`, absolute, or through a symlink) is
/// rejected before anything runs.
pub async fn cwd_escaping_the_workspace_is_rejected(h: &dyn Harness) -> Outcome {
    let fx = Fixture::new(h);
    std::fs::create_dir_all(fx.ws().join("sub")).unwrap();
    std::os::unix::fs::symlink(fx.other_workspace.path(), fx.ws().join("escape")).unwrap();
    let rt = runtime(h, fx.ws(), false, NetworkPolicy::None).await;

    let escapes: [PathBuf; 6] = [
        "../".into(),
        "..".into(),
        "sub/../..".into(),
        "/etc".into(),
        fx.other_workspace.path().to_path_buf(),
        "escape".into(),
    ];
    for cwd in escapes {
        let mut req = request(&["pwd"]);
        req.cwd = Some(cwd.clone());
        match rt.exec(req).await {
            Err(RuntimeError::CommandRejected(_)) => {}
            other => panic!("cwd {cwd:?} must be rejected with CommandRejected, got {other:?}"),
        }
    }
    Outcome::Passed
}

/// A read-only workspace is read-only by the kernel: a command that writes anyway
/// (even one not declared mutating) fails and nothing lands on the host.
pub async fn a_read_only_workspace_refuses_writes(h: &dyn Harness) -> Outcome {
    if let Some(o) = skip(h, "a_read_only_workspace_refuses_writes", &[Need::Isolated]) {
        return o;
    }
    let fx = Fixture::new(h);
    std::fs::write(fx.ws().join("existing.txt"), "original").unwrap();
    let rt = runtime(h, fx.ws(), false, NetworkPolicy::None).await;

    // Declared read-only but writing: only the mount can stop it.
    let r = run(&*rt, sh("echo x > sneaky.txt")).await;
    assert_ne!(
        r.exit_code, 0,
        "a write into a read-only workspace succeeded"
    );
    assert!(
        !fx.ws().join("sneaky.txt").exists(),
        "a file written into a read-only workspace reached the host"
    );
    // A privileged-looking command trying to undo the read-only mount: works only if
    // the runtime left the command capabilities (e.g. root without --cap-drop).
    let r = run(
        &*rt,
        sh("mount -o remount,rw,bind \"$PWD\" 2>/dev/null; echo x > remounted.txt"),
    )
    .await;
    assert_ne!(
        r.exit_code, 0,
        "remounting the read-only workspace read-write worked"
    );
    assert!(
        !fx.ws().join("remounted.txt").exists(),
        "a remount made the read-only workspace writable"
    );
    let r = run(&*rt, sh("echo changed > existing.txt")).await;
    assert_ne!(
        r.exit_code, 0,
        "overwriting a file of a read-only workspace succeeded"
    );
    assert_eq!(
        std::fs::read_to_string(fx.ws().join("existing.txt")).unwrap(),
        "original"
    );

    // Declared mutating: refused up front or failing, never landing.
    let mut req = sh("echo x > declared.txt");
    req.mutating = true;
    match rt.exec(req).await {
        Err(RuntimeError::CommandRejected(_)) => {}
        Ok(r) => assert_ne!(
            r.exit_code, 0,
            "a mutating command wrote to a read-only workspace"
        ),
        Err(e) => panic!("a mutating command on a read-only workspace failed oddly: {e}"),
    }
    assert!(
        !fx.ws().join("declared.txt").exists(),
        "a mutating command wrote to a read-only workspace"
    );
    Outcome::Passed
}

/// In a writable workspace writes land on the host.
pub async fn a_writable_workspace_keeps_writes_on_the_host(h: &dyn Harness) -> Outcome {
    if let Some(o) = skip(
        h,
        "a_writable_workspace_keeps_writes_on_the_host",
        &[Need::Writable],
    ) {
        return o;
    }
    let fx = Fixture::new(h);
    let rt = runtime(h, fx.ws(), true, NetworkPolicy::None).await;
    let mut req = sh("mkdir -p a/b && echo written > a/b/out.txt");
    req.mutating = true;
    let r = run(&*rt, req).await;
    assert_eq!(
        r.exit_code,
        0,
        "write in a writable workspace failed: {}",
        text(&r.stderr)
    );
    let landed = std::fs::read_to_string(fx.ws().join("a/b/out.txt"))
        .expect("the written file must exist on the host");
    assert_eq!(landed, "written\n");
    Outcome::Passed
}

/// Network `none` leaves only the loopback interface.
pub async fn network_none_leaves_only_loopback(h: &dyn Harness) -> Outcome {
    if let Some(o) = skip(
        h,
        "network_none_leaves_only_loopback",
        &[Need::Isolated, Need::NetworkNone],
    ) {
        return o;
    }
    let fx = Fixture::new(h);
    let rt = runtime(h, fx.ws(), false, NetworkPolicy::None).await;
    let r = run(&*rt, request(&["cat", "/proc/net/dev"])).await;
    assert_eq!(
        r.exit_code,
        0,
        "reading /proc/net/dev failed: {}",
        text(&r.stderr)
    );
    let out = text(&r.stdout);
    let interfaces: Vec<&str> = out
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(
        interfaces,
        ["lo"],
        "network none must leave only lo:\n{out}"
    );
    Outcome::Passed
}

/// A command past its timeout is killed with all its descendants; what it printed
/// before is returned with `timed_out`.
pub async fn a_timeout_kills_the_whole_process_tree(h: &dyn Harness) -> Outcome {
    let fx = Fixture::new(h);
    let rt = runtime(h, fx.ws(), false, NetworkPolicy::None).await;
    // A sleep duration no other process uses, so the host scan finds only ours.
    let nap = format!("3600.{}", unique_token());
    let mut req = sh(&format!("sleep {nap} & echo started; sleep {nap}"));
    let timeout = Duration::from_secs(1);
    req.timeout = Some(timeout);
    let t0 = Instant::now();
    let r = run(&*rt, req).await;
    let took = t0.elapsed();
    assert!(
        took < timeout + Duration::from_secs(2),
        "timed-out exec took {took:?}"
    );
    assert!(r.timed_out, "timed_out must be set: {r:?}");
    assert!(
        text(&r.stdout).contains("started"),
        "output before the timeout is kept: {r:?}"
    );
    assert_processes_gone(&nap, Duration::from_secs(3), "after a timeout").await;
    Outcome::Passed
}

/// Output past the cap is dropped (the command still runs to completion) and the
/// result says so.
pub async fn output_over_the_cap_is_truncated(h: &dyn Harness) -> Outcome {
    let fx = Fixture::new(h);
    let rt = runtime(h, fx.ws(), false, NetworkPolicy::None).await;
    let cap = 1000;
    // 8 MiB on both streams: far beyond the cap and any pipe buffer, so a runtime
    // that stops reading at the cap would block the command into its timeout.
    let mut req = sh("head -c 4194304 /dev/zero; head -c 4194304 /dev/zero >&2");
    req.max_output_bytes = Some(cap);
    let r = run(&*rt, req).await;
    assert!(
        !r.timed_out,
        "the command must finish: output past the cap is drained"
    );
    assert_eq!(r.exit_code, 0, "the capped command failed");
    assert!(r.truncated, "truncated must be set");
    let kept = r.stdout.len() + r.stderr.len();
    assert!(
        kept > 0 && kept <= cap,
        "kept {kept} bytes with a cap of {cap}"
    );
    Outcome::Passed
}

/// `exec_stream` yields output as it is produced, then the result.
pub async fn exec_stream_delivers_output_as_it_is_produced(h: &dyn Harness) -> Outcome {
    let fx = Fixture::new(h);
    let rt = runtime(h, fx.ws(), false, NetworkPolicy::None).await;
    let t0 = Instant::now();
    let mut stream = rt
        .exec_stream(sh("echo a; sleep 2; echo b"))
        .await
        .unwrap_or_else(|e| panic!("exec_stream failed: {e}"));
    let mut seen = Vec::new();
    let mut first_a = None;
    let mut finished = None;
    while let Some(item) = stream.next().await {
        match item.unwrap_or_else(|e| panic!("stream item failed: {e}")) {
            ExecChunk::Output { stream: kind, data } => {
                assert_eq!(
                    kind,
                    StreamKind::Stdout,
                    "unexpected stderr: {}",
                    text(&data)
                );
                seen.extend_from_slice(&data);
                if first_a.is_none() && seen.contains(&b'a') {
                    first_a = Some(t0.elapsed());
                }
            }
            ExecChunk::Finished(r) => {
                assert!(finished.is_none(), "two results");
                finished = Some((r, t0.elapsed()));
            }
        }
    }
    let first_a = first_a.expect("the chunk with 'a' never came");
    assert!(
        first_a < Duration::from_millis(1500),
        "'a' arrived after {first_a:?}: not streamed"
    );
    let (r, at) = finished.expect("the stream ended without a result");
    assert!(
        at >= Duration::from_secs(2),
        "result before the command ended ({at:?})"
    );
    assert_eq!(text(&seen), "a\nb\n");
    assert_eq!(r.exit_code, 0);
    assert!(
        r.stdout.is_empty() && r.stderr.is_empty(),
        "streamed output is not repeated in the result"
    );
    Outcome::Passed
}

/// Dropping an `exec_stream` before the command ends kills it.
pub async fn dropping_an_exec_stream_kills_the_command(h: &dyn Harness) -> Outcome {
    let fx = Fixture::new(h);
    let rt = runtime(h, fx.ws(), false, NetworkPolicy::None).await;
    let nap = format!("3601.{}", unique_token());
    let mut stream = rt
        .exec_stream(sh(&format!("echo started; sleep {nap} & sleep {nap}")))
        .await
        .unwrap_or_else(|e| panic!("exec_stream failed: {e}"));
    match stream.next().await {
        Some(Ok(ExecChunk::Output { .. })) => {}
        other => panic!("expected the 'started' chunk, got {other:?}"),
    }
    assert_processes_appear(
        &nap,
        Duration::from_secs(5),
        "the command should be running",
    )
    .await;
    drop(stream);
    assert_processes_gone(&nap, Duration::from_secs(3), "after dropping the stream").await;
    Outcome::Passed
}

/// Another workspace in the same scratch root is neither readable nor listable.
pub async fn other_workspaces_are_not_visible(h: &dyn Harness) -> Outcome {
    if let Some(o) = skip(h, "other_workspaces_are_not_visible", &[Need::Isolated]) {
        return o;
    }
    let fx = Fixture::new(h);
    let rt = runtime(h, fx.ws(), false, NetworkPolicy::None).await;
    let other = fx.other_workspace.path();
    let secret_path = other.join("secret.txt");
    let r = run(&*rt, request(&["cat", secret_path.to_str().unwrap()])).await;
    assert_ne!(r.exit_code, 0, "the other workspace's secret was readable");
    assert!(
        !text(&r.stdout).contains(&fx.secret),
        "the other workspace's secret leaked"
    );

    let name = other.file_name().unwrap().to_str().unwrap();
    let root = h.scratch_root().to_str().unwrap().to_string();
    let r = run(&*rt, request(&["ls", "-a", &root])).await;
    assert!(
        !text(&r.stdout).contains(name),
        "the other workspace is listed in the scratch root:\n{}",
        text(&r.stdout)
    );
    Outcome::Passed
}

/// Each optional capability is reported exactly when its accessor answers `Some`: a
/// caller asking a provider without it gets `None`, never an error, and a provider
/// claiming it must hand it out.
pub async fn capability_accessors_match_capabilities(h: &dyn Harness) -> Outcome {
    let p = h.provider();
    let caps = p.capabilities();
    let kind = p.kind();
    let pairs = [
        ("snapshot", caps.snapshot, p.snapshotter().is_some()),
        ("preview_url", caps.preview_url, p.preview_urls().is_some()),
        (
            "interactive_session",
            caps.interactive_session,
            p.sessions().is_some(),
        ),
    ];
    for (what, claimed, present) in pairs {
        assert_eq!(
            claimed,
            present,
            "provider '{kind}' reports {what}: {claimed} but its accessor is {}",
            if present { "Some" } else { "None" }
        );
    }
    let policies = caps.network_policies();
    assert_eq!(
        policies.contains(&NetworkPolicy::None),
        caps.network_none,
        "network_policies must list `none` exactly when network_none"
    );
    assert_eq!(
        policies.contains(&NetworkPolicy::Limited),
        caps.network_limited,
        "network_policies must list `limited` exactly when network_limited"
    );
    Outcome::Passed
}

/// The provider's sessions, or the printed reason to skip `check` when it reports no
/// `interactive_session` (a provider that reports it must hand them out).
fn sessions_or_skip<'a>(h: &'a dyn Harness, check: &str) -> Result<&'a dyn Sessions, Outcome> {
    let kind = h.provider().kind();
    if !h.provider().capabilities().interactive_session {
        let reason = format!("provider '{kind}' reports interactive_session: false");
        eprintln!("skipped: {check}: {reason}");
        return Err(Outcome::Skipped(reason));
    }
    Ok(h.provider().sessions().unwrap_or_else(|| {
        panic!("provider '{kind}' reports interactive_session but has no sessions()")
    }))
}

fn session_request(argv: &[&str]) -> SessionRequest {
    SessionRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        ..SessionRequest::default()
    }
}

async fn start_session(
    sessions: &dyn Sessions,
    h: &dyn Harness,
    workspace: &Path,
    req: SessionRequest,
) -> SessionId {
    let argv = req.argv.clone();
    let spec = h.spec(workspace, false, NetworkPolicy::None);
    match sessions.start(spec, req).await {
        Ok(info) => {
            assert_eq!(info.argv, argv, "the session's info names its argv");
            assert!(info.exit.is_none(), "a new session has not ended: {info:?}");
            info.id
        }
        Err(e) => panic!("starting a session of {argv:?} failed: {e}"),
    }
}

async fn write(sessions: &dyn Sessions, id: &SessionId, data: &str, close: bool) {
    sessions
        .write(
            id,
            SessionInput {
                data: data.as_bytes().to_vec(),
                close,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("writing {data:?} to session {id} failed: {e}"));
}

/// Polls until `done(all output so far, exit)` holds, checking that polls never repeat
/// or skip bytes (each poll's offset is where the previous one ended). Panics after
/// the safety timeout rather than hang.
async fn poll_until(
    sessions: &dyn Sessions,
    id: &SessionId,
    cursor: &mut u64,
    what: &str,
    done: impl Fn(&str, Option<&SessionExit>) -> bool,
) -> (String, Option<SessionExit>) {
    let deadline = Instant::now() + SAFETY_TIMEOUT;
    let mut seen = Vec::new();
    loop {
        let out = sessions
            .poll(id, Duration::from_millis(200))
            .await
            .unwrap_or_else(|e| panic!("polling session {id} failed: {e}"));
        assert_eq!(
            out.offset, *cursor,
            "a poll must start where the previous one ended"
        );
        assert_eq!(
            out.dropped_bytes, 0,
            "nothing is dropped while polls keep up"
        );
        seen.extend_from_slice(&out.data);
        *cursor += out.data.len() as u64;
        let all = text(&seen);
        if done(&all, out.exit.as_ref()) {
            return (all, out.exit);
        }
        if Instant::now() >= deadline {
            panic!("session {id}: {what} did not happen within {SAFETY_TIMEOUT:?}; output so far: {all:?}, exit: {:?}", out.exit);
        }
    }
}

/// `cat` in a session echoes each write as it comes, and ends with exit 0 when its
/// stdin is closed; a poll after the end reports the exit and no new output.
pub async fn a_cat_session_echoes_each_write_and_ends_when_stdin_closes(
    h: &dyn Harness,
) -> Outcome {
    let sessions = match sessions_or_skip(
        h,
        "a_cat_session_echoes_each_write_and_ends_when_stdin_closes",
    ) {
        Ok(s) => s,
        Err(o) => return o,
    };
    let fx = Fixture::new(h);
    let id = start_session(sessions, h, fx.ws(), session_request(&["cat"])).await;
    let mut cursor = 0;

    write(sessions, &id, "first line\n", false).await;
    let (out, exit) = poll_until(
        sessions,
        &id,
        &mut cursor,
        "echo of the first write",
        |o, _| o.contains("first line\n"),
    )
    .await;
    assert_eq!(out, "first line\n", "cat echoes exactly the first write");
    assert!(exit.is_none(), "cat still runs while its stdin is open");

    write(sessions, &id, "second line\n", true).await;
    let (out, exit) = poll_until(sessions, &id, &mut cursor, "the end of cat", |_, e| {
        e.is_some()
    })
    .await;
    assert_eq!(
        out, "second line\n",
        "the second poll returns only the second write"
    );
    let exit = exit.expect("checked by poll_until");
    assert_eq!(
        (exit.exit_code, exit.killed),
        (0, false),
        "cat ends by itself with 0 at end of input: {exit:?}"
    );

    let again = sessions
        .poll(&id, Duration::ZERO)
        .await
        .expect("poll after the end");
    assert!(again.data.is_empty(), "no output after the end: {again:?}");
    assert_eq!(again.exit, Some(exit), "every later poll reports the exit");
    match sessions
        .write(
            &id,
            SessionInput {
                data: b"late\n".to_vec(),
                close: false,
            },
        )
        .await
    {
        Err(RuntimeError::CommandRejected(_)) => {}
        other => panic!("a write to an ended session must be CommandRejected, got {other:?}"),
    }
    Outcome::Passed
}

/// A shell session keeps its state between writes (a variable set by one write is
/// seen by the next) and reports the code it exits with.
pub async fn a_shell_session_keeps_its_state_between_writes(h: &dyn Harness) -> Outcome {
    let sessions = match sessions_or_skip(h, "a_shell_session_keeps_its_state_between_writes") {
        Ok(s) => s,
        Err(o) => return o,
    };
    let fx = Fixture::new(h);
    std::fs::write(fx.ws().join("marker.txt"), "in the workspace").unwrap();
    let id = start_session(sessions, h, fx.ws(), session_request(&["sh"])).await;
    let mut cursor = 0;

    let token = unique_token();
    write(
        sessions,
        &id,
        &format!("GROVE_SESSION_VAR={token}\n"),
        false,
    )
    .await;
    write(
        sessions,
        &id,
        "echo \"value=$GROVE_SESSION_VAR\"; cat marker.txt; echo\n",
        false,
    )
    .await;
    let (out, _) = poll_until(sessions, &id, &mut cursor, "the shell's echo", |o, _| {
        o.contains("in the workspace\n")
    })
    .await;
    assert!(
        out.contains(&format!("value={token}\n")),
        "the variable set by the first write is gone: {out:?}"
    );
    write(sessions, &id, "echo oops >&2; exit 7\n", false).await;
    let (out, exit) = poll_until(sessions, &id, &mut cursor, "the shell's exit", |_, e| {
        e.is_some()
    })
    .await;
    assert!(
        out.contains("oops\n"),
        "stderr is part of the session's output: {out:?}"
    );
    let exit = exit.expect("checked by poll_until");
    assert_eq!(exit.exit_code, 7, "the shell's own exit code: {exit:?}");
    assert!(!exit.killed);
    Outcome::Passed
}

/// Output past the session's ring keeps the newest bytes: a poll after the burst
/// returns exactly the last `max_buffer_bytes` bytes and counts the rest as dropped.
pub async fn session_output_over_the_cap_keeps_the_newest_bytes(h: &dyn Harness) -> Outcome {
    let sessions = match sessions_or_skip(h, "session_output_over_the_cap_keeps_the_newest_bytes") {
        Ok(s) => s,
        Err(o) => return o,
    };
    let fx = Fixture::new(h);
    let cap = 4096;
    let mut req = session_request(&["sh", "-c", "seq 1 20000; echo tail-marker"]);
    req.max_buffer_bytes = Some(cap);
    let id = start_session(sessions, h, fx.ws(), req).await;
    let mut expected: String = (1..=20000).map(|i| format!("{i}\n")).collect();
    expected.push_str("tail-marker\n");

    // Wait for the end without consuming output (info does not read).
    let deadline = Instant::now() + SAFETY_TIMEOUT;
    let info = loop {
        let info = sessions.info(&id).expect("info of a running session");
        if info.exit.is_some() {
            break info;
        }
        assert!(Instant::now() < deadline, "the burst did not end: {info:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        info.output_bytes,
        expected.len() as u64,
        "every byte printed is counted"
    );
    let out = sessions.poll(&id, Duration::ZERO).await.expect("poll");
    assert_eq!(out.data.len(), cap, "the ring holds exactly its size");
    assert_eq!(
        text(&out.data),
        expected[expected.len() - cap..],
        "the newest bytes are kept"
    );
    assert_eq!(out.offset, (expected.len() - cap) as u64);
    assert_eq!(
        out.dropped_bytes,
        (expected.len() - cap) as u64,
        "the lost bytes are counted"
    );
    assert_eq!(out.exit.map(|e| e.exit_code), Some(0));
    Outcome::Passed
}

/// Killing a session ends its whole process tree; a poll after the kill reports the
/// exit as killed; writes are refused after; a second kill is fine; unknown ids are
/// `NotFound`.
pub async fn killing_a_session_ends_it_and_a_poll_reports_the_exit(h: &dyn Harness) -> Outcome {
    let sessions =
        match sessions_or_skip(h, "killing_a_session_ends_it_and_a_poll_reports_the_exit") {
            Ok(s) => s,
            Err(o) => return o,
        };
    let fx = Fixture::new(h);
    let nap = format!("3602.{}", unique_token());
    let script = format!("echo started; sleep {nap} & sleep {nap}");
    let id = start_session(
        sessions,
        h,
        fx.ws(),
        session_request(&["sh", "-c", &script]),
    )
    .await;
    let mut cursor = 0;
    poll_until(sessions, &id, &mut cursor, "the start", |o, _| {
        o.contains("started\n")
    })
    .await;
    let what = "the session's processes should be running";
    assert_processes_appear(&nap, Duration::from_secs(5), what).await;

    sessions.kill(&id).await.expect("kill");
    let (_, exit) = poll_until(sessions, &id, &mut cursor, "the end after kill", |_, e| {
        e.is_some()
    })
    .await;
    let exit = exit.expect("checked by poll_until");
    assert!(exit.killed, "the exit says killed: {exit:?}");
    assert_eq!(
        exit.exit_code, 137,
        "a killed session reports 128 + SIGKILL"
    );
    assert_processes_gone(&nap, Duration::from_secs(5), "after killing a session").await;
    assert!(
        matches!(
            sessions
                .write(
                    &id,
                    SessionInput {
                        data: b"x".to_vec(),
                        close: false
                    }
                )
                .await,
            Err(RuntimeError::CommandRejected(_))
        ),
        "a write after the kill is refused"
    );
    sessions
        .kill(&id)
        .await
        .expect("killing an ended session is fine");
    let listed = sessions.list();
    assert!(
        listed.iter().any(|i| i.id == id && i.exit.is_some()),
        "the ended session is still listed with its exit"
    );

    let unknown = SessionId::from(format!("no-such-session-{}", unique_token()));
    assert!(matches!(
        sessions.poll(&unknown, Duration::ZERO).await,
        Err(RuntimeError::NotFound(_))
    ));
    assert!(matches!(
        sessions.write(&unknown, SessionInput::default()).await,
        Err(RuntimeError::NotFound(_))
    ));
    assert!(matches!(
        sessions.kill(&unknown).await,
        Err(RuntimeError::NotFound(_))
    ));
    Outcome::Passed
}

/// A snapshot keeps the runtime's state outside the workspace: a file written under
/// `$HOME` (outside the workspace), removed after the snapshot, is back in the runtime
/// restored from it. Unknown runtimes and snapshots are refused, not guessed.
pub async fn a_snapshot_restores_state_outside_the_workspace(h: &dyn Harness) -> Outcome {
    let p = h.provider();
    let kind = p.kind();
    if !p.capabilities().snapshot {
        let reason = format!("provider '{kind}' reports snapshot: false");
        eprintln!("skipped: a_snapshot_restores_state_outside_the_workspace: {reason}");
        return Outcome::Skipped(reason);
    }
    let snapshotter = p
        .snapshotter()
        .unwrap_or_else(|| panic!("provider '{kind}' reports snapshot but has no snapshotter()"));
    let fx = Fixture::new(h);
    // Writable: a read-only (analysis) runtime empties `$HOME` before every exec.
    let spec = h.spec(fx.ws(), true, NetworkPolicy::None);
    let rt = runtime_from(h, spec.clone()).await;
    let token = unique_token();
    let r = run(
        &*rt,
        sh(&format!(
            "echo snap-{token} > \"$HOME/grove-snapshot-check\""
        )),
    )
    .await;
    assert_eq!(
        r.exit_code,
        0,
        "writing under $HOME failed: {}",
        text(&r.stderr)
    );

    let snap = snapshotter
        .snapshot(SnapshotRequest {
            backend_id: p.backend_id(&spec),
            label: Some("contract".into()),
        })
        .await
        .unwrap_or_else(|e| panic!("snapshot failed: {e}"));
    assert_eq!(snap.label.as_deref(), Some("contract"));
    let r = run(&*rt, sh("rm \"$HOME/grove-snapshot-check\"")).await;
    assert_eq!(r.exit_code, 0);
    drop(rt);

    let restored = snapshotter
        .restore(&snap.id, spec.clone())
        .await
        .unwrap_or_else(|e| panic!("restoring {} failed: {e}", snap.id));
    let r = run(&*restored, sh("cat \"$HOME/grove-snapshot-check\"")).await;
    assert_eq!(
        text(&r.stdout),
        format!("snap-{token}\n"),
        "the restored runtime lacks the state taken in the snapshot: {}",
        text(&r.stderr)
    );

    match snapshotter
        .snapshot(SnapshotRequest {
            backend_id: format!("no-such-runtime-{token}"),
            label: None,
        })
        .await
    {
        Err(RuntimeError::NotFound(_)) => {}
        other => panic!("a snapshot of an unknown runtime must be NotFound, got {other:?}"),
    }
    match snapshotter
        .restore(&format!("no-such-snapshot-{token}"), spec)
        .await
    {
        Err(RuntimeError::NotFound(_) | RuntimeError::CommandRejected(_)) => {}
        Err(e) => panic!("restoring an unknown snapshot failed oddly: {e}"),
        Ok(_) => panic!("restoring an unknown snapshot succeeded"),
    }
    Outcome::Passed
}

/// Every check in order; prints skips as the checks do. For providers whose tests
/// do not want one test per check.
pub async fn run_all(h: &dyn Harness) -> Vec<(&'static str, Outcome)> {
    vec![
        (
            "capability_accessors_match_capabilities",
            capability_accessors_match_capabilities(h).await,
        ),
        (
            "echo_and_exit_codes_pass_through",
            echo_and_exit_codes_pass_through(h).await,
        ),
        (
            "a_missing_program_is_a_failed_command",
            a_missing_program_is_a_failed_command(h).await,
        ),
        (
            "stdin_reaches_the_command",
            stdin_reaches_the_command(h).await,
        ),
        (
            "only_the_given_env_is_visible",
            only_the_given_env_is_visible(h).await,
        ),
        (
            "cwd_inside_the_workspace_works",
            cwd_inside_the_workspace_works(h).await,
        ),
        (
            "cwd_escaping_the_workspace_is_rejected",
            cwd_escaping_the_workspace_is_rejected(h).await,
        ),
        (
            "a_read_only_workspace_refuses_writes",
            a_read_only_workspace_refuses_writes(h).await,
        ),
        (
            "a_writable_workspace_keeps_writes_on_the_host",
            a_writable_workspace_keeps_writes_on_the_host(h).await,
        ),
        (
            "network_none_leaves_only_loopback",
            network_none_leaves_only_loopback(h).await,
        ),
        (
            "a_timeout_kills_the_whole_process_tree",
            a_timeout_kills_the_whole_process_tree(h).await,
        ),
        (
            "output_over_the_cap_is_truncated",
            output_over_the_cap_is_truncated(h).await,
        ),
        (
            "exec_stream_delivers_output_as_it_is_produced",
            exec_stream_delivers_output_as_it_is_produced(h).await,
        ),
        (
            "dropping_an_exec_stream_kills_the_command",
            dropping_an_exec_stream_kills_the_command(h).await,
        ),
        (
            "other_workspaces_are_not_visible",
            other_workspaces_are_not_visible(h).await,
        ),
        (
            "a_snapshot_restores_state_outside_the_workspace",
            a_snapshot_restores_state_outside_the_workspace(h).await,
        ),
        (
            "a_cat_session_echoes_each_write_and_ends_when_stdin_closes",
            a_cat_session_echoes_each_write_and_ends_when_stdin_closes(h).await,
        ),
        (
            "a_shell_session_keeps_its_state_between_writes",
            a_shell_session_keeps_its_state_between_writes(h).await,
        ),
        (
            "session_output_over_the_cap_keeps_the_newest_bytes",
            session_output_over_the_cap_keeps_the_newest_bytes(h).await,
        ),
        (
            "killing_a_session_ends_it_and_a_poll_reports_the_exit",
            killing_a_session_ends_it_and_a_poll_reports_the_exit(h).await,
        ),
    ]
}
