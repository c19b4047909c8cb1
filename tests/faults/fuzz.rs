//! Scenario `fuzz`: the cargo-fuzz target `validate` (`fuzz/fuzz_targets/validate.rs`:
//! every parser and validator of untrusted input) run for a bounded time, 30 s times
//! `GROVE_FAULTS_SCALE` (`GROVE_FAULTS_FUZZ_SECS` overrides). Skipped, with the reason
//! printed, when cargo-fuzz is not installed, unless `GROVE_TEST_REQUIRE_FUZZ=1`.

use std::path::PathBuf;
use std::process::Command;

use crate::{scale, Figures};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the repository")
        .to_path_buf()
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // libFuzzer's instrumentation needs unstable flags; the stable toolchain accepts
    // them under RUSTC_BOOTSTRAP. The fuzz crate builds into its own target dir.
    cmd.env("RUSTC_BOOTSTRAP", "1")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .current_dir(repo_root());
    cmd
}

#[test]
fn fuzzing_the_validators_for_a_bounded_time_finds_no_crash() {
    let installed = cargo()
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        let why = "cargo-fuzz is not installed (cargo install cargo-fuzz)";
        if std::env::var("GROVE_TEST_REQUIRE_FUZZ").is_ok_and(|v| v == "1") {
            panic!("GROVE_TEST_REQUIRE_FUZZ=1 but {why}");
        }
        eprintln!("skipped fuzz: {why}");
        return;
    }
    let secs: u64 = std::env::var("GROVE_FAULTS_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30 * scale());
    let out = cargo()
        .args([
            "fuzz",
            "run",
            "validate",
            "--",
            &format!("-max_total_time={secs}"),
            "-rss_limit_mb=2048",
            "-max_len=8192",
        ])
        .output()
        .expect("run cargo fuzz");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // libFuzzer ends with "Done N runs in T second(s)".
    let runs: u64 = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("Done "))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .next_back()
        .unwrap_or(0);
    let mut figures = Figures {
        trials: runs,
        injected: runs,
        replay_ok: true,
        ..Default::default()
    };
    if !out.status.success() || runs == 0 {
        figures.lost += 1;
        let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
        figures.note(format!(
            "cargo fuzz failed ({}): {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    figures.finish("fuzz");
}
