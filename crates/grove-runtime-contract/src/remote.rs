//! Test helpers the remote providers' test crates (Daytona, E2B) share: the contract
//! run once per check against a fresh fake, a spec naming a (user, project), an echo
//! that must come back, a fixture repository to clone inside a sandbox, and workers
//! racing to create one sandbox.

use std::path::Path;

use grove_core::ports::{NetworkPolicy, Runtime, RuntimeProvider, RuntimeSpec};

use crate::{default_spec, request};

/// The skips a remote provider may report: per-workspace isolation (workspaces of a
/// (user, project) share a sandbox) and the optional capabilities it does not claim.
pub const ALLOWED_REMOTE_SKIPS: [&str; 3] = [
    "isolated: false",
    "interactive_session: false",
    "snapshot: false",
];

/// Panics unless `outcome` passed or skipped for one of [`ALLOWED_REMOTE_SKIPS`].
pub fn expect_remote_outcome(outcome: crate::Outcome) {
    if let crate::Outcome::Skipped(why) = outcome {
        assert!(
            ALLOWED_REMOTE_SKIPS.iter().any(|w| why.contains(w)),
            "unexpected skip: {why}"
        );
    }
}

/// One `#[tokio::test]` per contract check, each against the harness `$make`
/// builds (a fresh fake each time). `capability_accessors_match_capabilities` is
/// left to each crate's own capability test: its last rule (writable implies
/// isolated) guards against writes in a host subprocess, which a remote sandbox never
/// is; remote providers are writable and report `isolated: false` because workspaces
/// of one (user, project) share a sandbox, not because writes escape one.
#[macro_export]
macro_rules! remote_contract_tests {
    ($make:expr) => {
        $crate::remote_contract_tests!(@each $make;
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
            a_cat_session_echoes_each_write_and_ends_when_stdin_closes,
            a_shell_session_keeps_its_state_between_writes,
            session_output_over_the_cap_keeps_the_newest_bytes,
            killing_a_session_ends_it_and_a_poll_reports_the_exit,
            a_snapshot_restores_state_outside_the_workspace,
        );
    };
    (@each $make:expr; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let env = $make;
                $crate::remote::expect_remote_outcome($crate::$check(&env).await);
            }
        )*
    };
}

/// A writable runtime on `ws` with network none, for the sandbox of (user, project).
pub fn spec_for(ws: &Path, user: &str, project: &str) -> RuntimeSpec {
    let mut spec = default_spec(ws, true, NetworkPolicy::None);
    spec.labels.insert("grove.user".into(), user.into());
    spec.labels.insert("grove.project".into(), project.into());
    spec
}

/// Creates the runtime and checks that `echo word` comes back.
pub async fn echo(provider: &dyn RuntimeProvider, spec: RuntimeSpec, word: &str) {
    let rt = provider.create(spec).await.expect("create");
    let r = rt.exec(request(&["echo", word])).await.expect("exec");
    assert_eq!(String::from_utf8_lossy(&r.stdout), format!("{word}\n"));
}

/// A repository with one commit on `main` (`README.md`: `hello`) under `root`, as a
/// file:// URL; git runs with an isolated identity.
pub fn fixture_repo(root: &Path) -> String {
    let dir = root.join("upstream");
    std::fs::create_dir_all(&dir).unwrap();
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.com",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    git(&["init", "-q"]);
    std::fs::write(dir.join("README.md"), "hello\n").unwrap();
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "first"]);
    format!("file://{}", dir.display())
}

/// The trimmed `.git/HEAD` of the checkout at `path` (a host path in the fakes).
pub fn head_of(path: &str) -> String {
    std::fs::read_to_string(format!("{path}/.git/HEAD"))
        .unwrap()
        .trim()
        .to_string()
}

/// Creates `spec`'s runtime through every worker at once (each its own provider, as
/// separate grove workers would) and returns the runtimes, all of which must succeed.
pub async fn create_racing(
    workers: &[&dyn RuntimeProvider],
    spec: &RuntimeSpec,
) -> Vec<Box<dyn Runtime>> {
    futures::future::join_all(workers.iter().map(|w| w.create(spec.clone())))
        .await
        .into_iter()
        .map(|r| r.expect("every racer ends with a runtime"))
        .collect()
}

/// Checks that every runtime's commands see `home` as `$HOME`: they all run in the
/// one sandbox whose home that is.
pub async fn assert_all_run_in(runtimes: &[Box<dyn Runtime>], home: &str) {
    for rt in runtimes {
        let r = rt
            .exec(request(&["sh", "-c", "echo $HOME"]))
            .await
            .expect("exec");
        assert_eq!(
            String::from_utf8_lossy(&r.stdout).trim(),
            home.trim_end_matches('/'),
            "every racer's commands run in the kept sandbox"
        );
    }
}
