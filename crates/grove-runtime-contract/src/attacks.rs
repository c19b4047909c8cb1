//! The attacker's suite: hostile workloads every isolating runtime must contain.
//!
//! Each attack is what a command in an ordinary workspace could try (kernel knobs,
//! host files, other tenants' data, host processes, namespaces, resource exhaustion,
//! state planted for the next command). Each asserts that the attack failed AND that
//! the host is unchanged afterwards. An attack on a kernel setting that unexpectedly
//! succeeds is undone by the test (when it can) before the test fails, so a broken
//! sandbox never leaves the machine running the suite changed.
//!
//! A provider's test crate runs them with [`attack_tests!`](crate::attack_tests) (one
//! `#[tokio::test]` per attack) or [`run_attacks`]. Providers that do not claim
//! isolation are skipped with a printed reason; an attack whose tool is missing in
//! the runtime's image (exit 127) is skipped the same way, never passed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use grove_core::error::RuntimeError;
use grove_core::ports::{ExecRequest, ExecResult, NetworkPolicy, Runtime};

use crate::{runtime, runtime_from, skip, text, unique_token, Fixture, Harness, Need, Outcome};

/// Timeout of an attack command (the resource attacks end by their limits first).
const ATTACK_TIMEOUT: Duration = Duration::from_secs(20);

fn attack(script: &str, mutating: bool) -> ExecRequest {
    ExecRequest {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        timeout: Some(ATTACK_TIMEOUT),
        mutating,
        ..ExecRequest::default()
    }
}

async fn try_run(rt: &dyn Runtime, req: ExecRequest) -> Result<ExecResult, RuntimeError> {
    rt.exec(req).await
}

/// Runs an attack that must be a command that ran and failed (not a runtime error).
async fn run_attack(rt: &dyn Runtime, script: &str, mutating: bool) -> ExecResult {
    match try_run(rt, attack(script, mutating)).await {
        Ok(r) => r,
        Err(e) => panic!("the attack `{script}` did not run at all: {e}"),
    }
}

/// `Some(Skipped)` when the attack's tool is not in the runtime (exit 127).
fn missing_tool(check: &str, tool: &str, r: &ExecResult) -> Option<Outcome> {
    if r.exit_code == 127 {
        let reason = format!("`{tool}` is not available inside the runtime");
        eprintln!("skipped: {check}: {reason}");
        return Some(Outcome::Skipped(reason));
    }
    None
}

fn isolated_or_skip(h: &dyn Harness, check: &str) -> Option<Outcome> {
    skip(h, check, &[Need::Isolated, Need::Writable])
}

/// A kernel setting read before an attack and put back if the attack changed it.
struct Sysctl {
    path: PathBuf,
    before: Option<String>,
}

impl Sysctl {
    fn read(path: &str) -> Self {
        let path = PathBuf::from(path);
        let before = std::fs::read_to_string(&path).ok();
        Self { path, before }
    }

    /// Panics (after restoring) when the value changed.
    fn assert_unchanged(&self, what: &str) {
        let now = std::fs::read_to_string(&self.path).ok();
        if now != self.before {
            let restored = match &self.before {
                Some(v) => std::fs::write(&self.path, v.trim_end()).is_ok(),
                None => false,
            };
            panic!(
                "{what}: the sandbox changed {} from {:?} to {now:?} (restored: {restored})",
                self.path.display(),
                self.before
            );
        }
    }
}

/// `kernel.core_pattern` set to a pipe into a workspace script, then a crash: the
/// kernel would run the script as host root. The write must fail and the setting
/// stay as it was.
pub async fn core_pattern_and_crash(h: &dyn Harness) -> Outcome {
    if let Some(o) = isolated_or_skip(h, "core_pattern_and_crash") {
        return o;
    }
    let fx = Fixture::new(h);
    let rt = runtime(h, fx.ws(), true, NetworkPolicy::None).await;
    let guard = Sysctl::read("/proc/sys/kernel/core_pattern");
    let marker = fx.ws().join("core-helper-ran");
    let script = format!(
        "printf '#!/bin/sh\\ntouch {m}\\n' > h.sh; chmod +x h.sh; \
         echo \"|$PWD/h.sh\" > /proc/sys/kernel/core_pattern; w=$?; \
         sh -c 'ulimit -c unlimited 2>/dev/null; kill -SEGV $$'; exit $w",
        m = marker.display()
    );
    let r = run_attack(&*rt, &script, true).await;
    std::thread::sleep(Duration::from_millis(200));
    guard.assert_unchanged("core_pattern attack");
    assert_ne!(
        r.exit_code, 0,
        "writing core_pattern succeeded inside the sandbox"
    );
    assert!(!marker.exists(), "the core helper ran on the host");
    Outcome::Passed
}

/// Any `/proc/sys` key (a host-wide one: `vm.swappiness`, `kernel.hostname` of the
/// host's namespace is not reachable either way).
pub async fn proc_sys_writes_fail(h: &dyn Harness) -> Outcome {
    if let Some(o) = isolated_or_skip(h, "proc_sys_writes_fail") {
        return o;
    }
    let fx = Fixture::new(h);
    let rt = runtime(h, fx.ws(), true, NetworkPolicy::None).await;
    for (key, value) in [
        ("/proc/sys/vm/swappiness", "17"),
        ("/proc/sys/kernel/sysrq", "1"),
        ("/proc/sys/fs/protected_symlinks", "0"),
    ] {
        let guard = Sysctl::read(key);
        let r = run_attack(&*rt, &format!("echo {value} > {key}"), true).await;
        guard.assert_unchanged("/proc/sys attack");
        assert_ne!(r.exit_code, 0, "writing {key} succeeded inside the sandbox");
    }
    Outcome::Passed
}

/// `/proc/sysrq-trigger` (with `h`, the harmless help request, should it get through).
pub async fn sysrq_trigger_is_closed(h: &dyn Harness) -> Outcome {
    if let Some(o) = isolated_or_skip(h, "sysrq_trigger_is_closed") {
        return o;
    }
    let fx = Fixture::new(h);
    let rt = runtime(h, fx.ws(), true, NetworkPolicy::None).await;
    let r = run_attack(&*rt, "echo h > /proc/sysrq-trigger", true).await;
    assert_ne!(r.exit_code, 0, "writing /proc/sysrq-trigger succeeded");
    Outcome::Passed
}

/// `/etc/shadow`, and a host file the test plants outside the workspace.
pub async fn host_secrets_are_unreadable(h: &dyn Harness) -> Outcome {
    if let Some(o) = isolated_or_skip(h, "host_secrets_are_unreadable") {
        return o;
    }
    let fx = Fixture::new(h);
    let rt = runtime(h, fx.ws(), true, NetworkPolicy::None).await;
    let r = run_attack(&*rt, "cat /etc/shadow", false).await;
    assert_ne!(r.exit_code, 0, "/etc/shadow was readable");
    assert!(!text(&r.stdout).contains("root:"), "/etc/shadow leaked");

    let token = unique_token();
    let planted = h.scratch_root().join(format!("planted-{token}.txt"));
    std::fs::write(&planted, format!("host-secret-{token}")).unwrap();
    let r = run_attack(&*rt, &format!("cat {}", planted.display()), false).await;
    assert!(
        !text(&r.stdout).contains(&token),
        "a host file outside the workspace was readable"
    );
    assert_eq!(
        std::fs::read_to_string(&planted).unwrap(),
        format!("host-secret-{token}")
    );
    Outcome::Passed
}

/// Another workspace and another user's repo cache, by guessing their paths (the
/// test knows them; an attacker would guess them from the layout).
pub async fn other_tenants_are_unreachable(h: &dyn Harness) -> Outcome {
    if let Some(o) = isolated_or_skip(h, "other_tenants_are_unreachable") {
        return o;
    }
    let fx = Fixture::new(h);
    let cache = h
        .scratch_root()
        .join(format!("repos/other-user-{}/repo", unique_token()));
    std::fs::create_dir_all(&cache).unwrap();
    let cache_secret = format!("cache-secret-{}", unique_token());
    std::fs::write(cache.join("config"), &cache_secret).unwrap();
    let rt = runtime(h, fx.ws(), true, NetworkPolicy::None).await;
    let other = fx.other_workspace.path();
    let script = format!(
        "ls -a {o}; cat {o}/secret.txt; ls -a {c}; cat {c}/config; \
         echo pwned > {o}/planted.txt",
        o = other.display(),
        c = cache.display()
    );
    let r = run_attack(&*rt, &script, true).await;
    let out = text(&r.stdout);
    assert!(!out.contains(&fx.secret), "another workspace was readable");
    assert!(
        !out.contains(&cache_secret),
        "another user's repo cache was readable"
    );
    assert!(
        !other.join("planted.txt").exists(),
        "another workspace was writable"
    );
    Outcome::Passed
}

/// `$GROVE_HOME/postgres` and the Postgres socket (stand-ins the test makes in its
/// scratch root, which plays `$GROVE_HOME`).
pub async fn the_database_is_unreachable(h: &dyn Harness) -> Outcome {
    if let Some(o) = isolated_or_skip(h, "the_database_is_unreachable") {
        return o;
    }
    let fx = Fixture::new(h);
    let pg = h
        .scratch_root()
        .join(format!("postgres-{}", unique_token()));
    std::fs::create_dir_all(&pg).unwrap();
    std::fs::write(pg.join("PG_VERSION"), "17\n").unwrap();
    let socket = pg.join(".s.PGSQL.5432");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let rt = runtime(h, fx.ws(), true, NetworkPolicy::None).await;
    let script = format!(
        "ls -a {p} && echo LISTED; cat {p}/PG_VERSION; [ -S {s} ] && echo SOCKET",
        p = pg.display(),
        s = socket.display()
    );
    let r = run_attack(&*rt, &script, false).await;
    let out = text(&r.stdout);
    assert!(
        !out.contains("LISTED"),
        "the database directory was listable:\n{out}"
    );
    assert!(!out.contains("17"), "PG_VERSION was readable:\n{out}");
    assert!(
        !out.contains("SOCKET"),
        "the database socket was visible:\n{out}"
    );
    Outcome::Passed
}

/// Signalling a host process by pid (and reading its environment).
pub async fn host_processes_are_out_of_reach(h: &dyn Harness) -> Outcome {
    if let Some(o) = isolated_or_skip(h, "host_processes_are_out_of_reach") {
        return o;
    }
    let fx = Fixture::new(h);
    let mut victim = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .expect("starting a host process to attack");
    let pid = victim.id();
    let rt = runtime(h, fx.ws(), true, NetworkPolicy::None).await;
    let r = run_attack(
        &*rt,
        &format!("kill -9 {pid}; cat /proc/{pid}/environ && echo READ"),
        true,
    )
    .await;
    let alive = victim.try_wait().map(|s| s.is_none()).unwrap_or(false);
    let _ = victim.kill();
    let _ = victim.wait();
    assert!(alive, "the sandbox killed a host process");
    assert!(
        !text(&r.stdout).contains("READ"),
        "a host process's environ was readable"
    );
    Outcome::Passed
}

/// `mount`, `unshare -U` (regaining capabilities in a new user namespace), keyctl.
pub async fn namespaces_mounts_and_keyrings_are_refused(h: &dyn Harness) -> Outcome {
    let check = "namespaces_mounts_and_keyrings_are_refused";
    if let Some(o) = isolated_or_skip(h, check) {
        return o;
    }
    let fx = Fixture::new(h);
    let rt = runtime(h, fx.ws(), true, NetworkPolicy::None).await;
    std::fs::create_dir_all(fx.ws().join("m")).unwrap();
    let r = run_attack(
        &*rt,
        "mount -t tmpfs none m && touch m/x && echo MOUNTED",
        true,
    )
    .await;
    assert!(!text(&r.stdout).contains("MOUNTED"), "mount succeeded");
    assert_ne!(r.exit_code, 0, "mount succeeded");

    let r = run_attack(&*rt, "unshare -U -r id -u", true).await;
    if let Some(o) = missing_tool(check, "unshare", &r) {
        return o;
    }
    assert_ne!(r.exit_code, 0, "unshare -U succeeded: {}", text(&r.stdout));

    // add_key(2) through python (x86_64 numbers; elsewhere the tool check skips).
    let r = run_attack(
        &*rt,
        "python3 -c 'import ctypes,os,platform,sys\n\
         if platform.machine()!=\"x86_64\": sys.exit(127)\n\
         l=ctypes.CDLL(None,use_errno=True)\n\
         r=l.syscall(248,b\"user\",b\"grove\",b\"v\",1,-3)\n\
         print(\"KEY\" if r>=0 else \"refused\",ctypes.get_errno())\n\
         sys.exit(0 if r>=0 else 1)'",
        true,
    )
    .await;
    if let Some(o) = missing_tool(check, "python3 on x86_64", &r) {
        return o;
    }
    assert!(!text(&r.stdout).contains("KEY"), "add_key succeeded");
    Outcome::Passed
}

/// Network `none`: a listener on the host's loopback is not reachable.
pub async fn network_none_cannot_reach_the_host(h: &dyn Harness) -> Outcome {
    let check = "network_none_cannot_reach_the_host";
    if let Some(o) = skip(h, check, &[Need::Isolated, Need::NetworkNone]) {
        return o;
    }
    let fx = Fixture::new(h);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let rt = runtime(h, fx.ws(), false, NetworkPolicy::None).await;
    let r = run_attack(
        &*rt,
        &format!("command -v bash >/dev/null || exit 127; bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}' && echo CONNECTED"),
        false,
    )
    .await;
    if let Some(o) = missing_tool(check, "bash", &r) {
        return o;
    }
    assert!(
        !text(&r.stdout).contains("CONNECTED"),
        "reached the host's loopback"
    );
    assert!(
        listener.accept().is_err(),
        "the host listener got a connection"
    );
    Outcome::Passed
}

/// A spec with small limits, so the resource attacks end quickly.
fn limited_spec(h: &dyn Harness, ws: &Path) -> grove_core::ports::RuntimeSpec {
    let mut spec = h.spec(ws, true, NetworkPolicy::None);
    spec.resources.pids = Some(128);
    spec.resources.memory_mb = Some(256);
    spec
}

/// After a resource attack: the host still answers quickly and the runtime's next
/// exec works.
async fn assert_recovered(rt: &dyn Runtime, what: &str) {
    let t = Instant::now();
    let status = std::process::Command::new("true").status().unwrap();
    assert!(status.success());
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "{what}: the host took {:?} to spawn `true`",
        t.elapsed()
    );
    let r = match try_run(rt, attack("echo next", true)).await {
        Ok(r) => r,
        Err(e) => panic!("{what}: the next exec failed: {e}"),
    };
    assert_eq!((r.exit_code, text(&r.stdout).trim()), (0, "next"), "{what}");
}

async fn resource_attack(h: &dyn Harness, check: &str, script: &str) -> Outcome {
    if let Some(o) = isolated_or_skip(h, check) {
        return o;
    }
    let fx = Fixture::new(h);
    let rt = runtime_from(h, limited_spec(h, fx.ws())).await;
    let mut req = attack(script, true);
    req.timeout = Some(Duration::from_secs(30));
    match try_run(&*rt, req).await {
        Err(RuntimeError::ResourceLimit(_)) => {}
        other => panic!("{check}: expected a resource_limit error, got {other:?}"),
    }
    assert_recovered(&*rt, check).await;
    Outcome::Passed
}

/// A fork bomb ends as `resource_limit`; the host stays responsive.
pub async fn a_fork_bomb_is_a_resource_limit(h: &dyn Harness) -> Outcome {
    // Each level keeps a process alive for a while, so the bomb meets the limit
    // however loaded the machine is (a pure `f | f &` can burn out before it does).
    resource_attack(
        h,
        "a_fork_bomb_is_a_resource_limit",
        "f() { sleep 2 & f | f & }; f; wait",
    )
    .await
}

/// A memory hog ends as `resource_limit`; the host stays responsive.
pub async fn a_memory_hog_is_a_resource_limit(h: &dyn Harness) -> Outcome {
    resource_attack(
        h,
        "a_memory_hog_is_a_resource_limit",
        "x=0123456789abcdef; while :; do x=\"$x$x\"; done",
    )
    .await
}

/// A symlink planted in the workspace pointing at host paths, read by the next
/// command: it resolves inside the sandbox, where those paths are not the host's.
pub async fn a_planted_symlink_reads_nothing_of_the_host(h: &dyn Harness) -> Outcome {
    if let Some(o) = isolated_or_skip(h, "a_planted_symlink_reads_nothing_of_the_host") {
        return o;
    }
    let fx = Fixture::new(h);
    let token = unique_token();
    let planted = h.scratch_root().join(format!("symlink-target-{token}"));
    std::fs::write(&planted, format!("host-{token}")).unwrap();
    let rt = runtime(h, fx.ws(), true, NetworkPolicy::None).await;
    let plant = format!(
        "ln -s /etc/shadow l1 && ln -s {p} l2 && ln -s {o} l3",
        p = planted.display(),
        o = fx.other_workspace.path().join("secret.txt").display()
    );
    let r = run_attack(&*rt, &plant, true).await;
    assert_eq!(
        r.exit_code,
        0,
        "planting symlinks failed: {}",
        text(&r.stderr)
    );
    let r = run_attack(&*rt, "cat l1; cat l2; cat l3", false).await;
    let out = text(&r.stdout);
    assert!(!out.contains("root:"), "/etc/shadow read through a symlink");
    assert!(!out.contains(&token), "a host file read through a symlink");
    assert!(
        !out.contains(&fx.secret),
        "another workspace read through a symlink"
    );
    assert_eq!(
        std::fs::read_to_string(&planted).unwrap(),
        format!("host-{token}")
    );
    Outcome::Passed
}

/// A `/tmp` (and `$HOME`) plant in an analysis (read-only) workspace is not seen by
/// the next exec: a plant there could change what a later command does (a git alias).
pub async fn an_analysis_tmp_plant_does_not_reach_the_next_exec(h: &dyn Harness) -> Outcome {
    let check = "an_analysis_tmp_plant_does_not_reach_the_next_exec";
    if let Some(o) = skip(h, check, &[Need::Isolated]) {
        return o;
    }
    let fx = Fixture::new(h);
    let rt = runtime(h, fx.ws(), false, NetworkPolicy::None).await;
    let token = unique_token();
    let r = run_attack(
        &*rt,
        &format!(
            "echo {token} > /tmp/plant && mkdir -p \"$HOME\" && \
             printf '[alias]\\n\\tst = !echo {token}\\n' > \"$HOME/.gitconfig\" && echo planted"
        ),
        false,
    )
    .await;
    assert!(
        text(&r.stdout).contains("planted"),
        "planting failed: {}",
        text(&r.stderr)
    );
    let r = run_attack(&*rt, "cat /tmp/plant \"$HOME/.gitconfig\"", false).await;
    assert!(
        !text(&r.stdout).contains(&token),
        "the next analysis exec saw the plant: {}",
        text(&r.stdout)
    );
    Outcome::Passed
}

/// Every attack in order; prints skips as the attacks do.
pub async fn run_attacks(h: &dyn Harness) -> Vec<(&'static str, Outcome)> {
    vec![
        ("core_pattern_and_crash", core_pattern_and_crash(h).await),
        ("proc_sys_writes_fail", proc_sys_writes_fail(h).await),
        ("sysrq_trigger_is_closed", sysrq_trigger_is_closed(h).await),
        (
            "host_secrets_are_unreadable",
            host_secrets_are_unreadable(h).await,
        ),
        (
            "other_tenants_are_unreachable",
            other_tenants_are_unreachable(h).await,
        ),
        (
            "the_database_is_unreachable",
            the_database_is_unreachable(h).await,
        ),
        (
            "host_processes_are_out_of_reach",
            host_processes_are_out_of_reach(h).await,
        ),
        (
            "namespaces_mounts_and_keyrings_are_refused",
            namespaces_mounts_and_keyrings_are_refused(h).await,
        ),
        (
            "network_none_cannot_reach_the_host",
            network_none_cannot_reach_the_host(h).await,
        ),
        (
            "a_fork_bomb_is_a_resource_limit",
            a_fork_bomb_is_a_resource_limit(h).await,
        ),
        (
            "a_memory_hog_is_a_resource_limit",
            a_memory_hog_is_a_resource_limit(h).await,
        ),
        (
            "a_planted_symlink_reads_nothing_of_the_host",
            a_planted_symlink_reads_nothing_of_the_host(h).await,
        ),
        (
            "an_analysis_tmp_plant_does_not_reach_the_next_exec",
            an_analysis_tmp_plant_does_not_reach_the_next_exec(h).await,
        ),
    ]
}

/// One `#[tokio::test]` per attack against the harness `$make()` returns:
/// `grove_runtime_contract::attack_tests!(my_harness);` inside a test module.
#[macro_export]
macro_rules! attack_tests {
    ($make:path) => {
        $crate::attack_tests!(@each $make:
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
    };
    (@each $make:path: $($attack:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $attack() {
                let h = $make();
                let _ = $crate::attacks::$attack(&h).await;
            }
        )*
    };
}
