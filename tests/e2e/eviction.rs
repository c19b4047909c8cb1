//! Eviction against real workspaces, real git and real worker processes: tiny budgets,
//! dirty work saved and restored, idle runtimes, one sweep per tick, races, crashes, and
//! dry runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrono::Utc;
use grove_e2e::{acquire_args, text, TestEnv};

use crate::env_or_skip;

/// Worker settings every eviction test uses: no schedule, sizes re-measured at every sweep,
/// clock overrides accepted.
const BASE: &[(&str, &str)] = &[
    ("GROVE_EVICT_SCHEDULE", "off"),
    ("GROVE_EVICT_MEASURE_EVERY", "0"),
    ("GROVE_ALLOW_CLOCK_OVERRIDE", "1"),
];

fn with<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut v: Vec<(&str, &str)> = BASE.to_vec();
    v.extend_from_slice(extra);
    v
}

/// An RFC 3339 time `secs` from now (for `grove evict --now`).
fn from_now(secs: i64) -> String {
    (Utc::now() + chrono::Duration::seconds(secs)).to_rfc3339()
}

/// Every file under `dir` outside `.git`: relative path -> (bytes, executable bit).
fn snapshot(dir: &Path) -> BTreeMap<String, (Vec<u8>, bool)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let rel = path
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .to_string();
            if rel == ".git" {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else {
                out.insert(
                    rel,
                    (
                        std::fs::read(&path).unwrap(),
                        meta.permissions().mode() & 0o111 != 0,
                    ),
                );
            }
        }
    }
    out
}

/// Apparent bytes of every file under `dir` (what grove's sizes count).
fn apparent_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let meta = std::fs::symlink_metadata(entry.path()).unwrap();
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

/// Deterministic pseudo-random bytes that neither compress nor look like text.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

async fn workspace(env: &TestEnv, id: &str) -> serde_json::Value {
    env.grove_json(&["workspace", "show", id]).await
}

async fn state_of(env: &TestEnv, id: &str) -> String {
    workspace(env, id).await["state"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn events_of(env: &TestEnv, event_type: &str) -> Vec<serde_json::Value> {
    sqlx::query_scalar("SELECT payload FROM grove.events WHERE event_type = $1 ORDER BY position")
        .bind(event_type)
        .fetch_all(&env.pool)
        .await
        .unwrap()
}

async fn replay_ok(env: &TestEnv) {
    let verify = env.grove(&["replay", "--verify"]).await;
    assert!(verify.status.success(), "replay: {:?}", text(&verify));
}

/// `grove evict` with these extra arguments, asserting success; the sweep report.
async fn sweep(env: &TestEnv, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["evict"];
    args.extend_from_slice(extra);
    env.grove_json(&args).await
}

fn id_of(ws: &serde_json::Value) -> String {
    ws["id"].as_str().unwrap().to_string()
}

fn dir_of(ws: &serde_json::Value) -> PathBuf {
    PathBuf::from(ws["local_path"].as_str().unwrap())
}

/// Asserts the invariant of every test here: no record is left `evicting`, a live record
/// has its whole directory, an evicted one has none, and the trash is empty.
async fn assert_records_match_disk(env: &TestEnv) {
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT id::text, state, local_path FROM grove.sandbox_workspaces ORDER BY id",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    for (id, state, path) in rows {
        let dir = Path::new(&path);
        match state.as_str() {
            "evicted" => assert!(!dir.exists(), "evicted {id} still has {path}"),
            "ready" | "released" => {
                assert!(
                    dir.join(".git/HEAD").is_file(),
                    "{state} {id}: {path} is not a whole checkout"
                );
                assert!(
                    dir.join("f.txt").is_file(),
                    "{state} {id}: {path} lost its files"
                );
            }
            other => panic!("workspace {id} left in state {other}"),
        }
    }
    let trash = env.home().join("trash");
    let left: Vec<_> = std::fs::read_dir(&trash)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "trash not emptied: {left:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dirty_workspace_is_evicted_with_its_work_saved_and_restored_byte_identical() {
    let mut env = env_or_skip!(
        "a_dirty_workspace_is_evicted_with_its_work_saved_and_restored_byte_identical"
    );
    // Everything is above a 1-byte budget; the grace keeps what was used in the last
    // minute, so only the sweeps run with a clock an hour ahead evict anything.
    env.spawn_worker_env(&with(&[
        ("GROVE_DISK_BUDGET", "1"),
        ("GROVE_PRESSURE_GRACE", "60"),
    ]))
    .await;
    let url = env.fixture_repo(
        "fixture",
        &[
            ("f.txt", "one\n"),
            ("keep.txt", "keep\n"),
            ("gone.txt", "bye\n"),
        ],
    );
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let id = id_of(&ws);
    let dir = dir_of(&ws);
    // A local commit, then uncommitted work: a modified and a deleted tracked file, a new
    // untracked binary file (NUL bytes included) in a new directory, a new executable.
    let script = "set -e
        echo committed > committed.txt && git add committed.txt && git commit -qm 'agent commit'
        echo two >> f.txt
        rm gone.txt
        mkdir -p out/bin && printf 'GROVE\\000\\001\\002\\377\\376binary\\000end' > out/bin/data.bin
        printf '#!/bin/sh\\necho hi\\n' > run.sh && chmod +x run.sh";
    let out = env.grove(&["exec", &id, "--", "sh", "-c", script]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(workspace(&env, &id).await["dirty"], true);
    let head = grove_e2e::git(&dir, &["rev-parse", "HEAD"]);
    let status = grove_e2e::git(&dir, &["status", "--porcelain"]);
    let files = snapshot(&dir);
    assert!(files["out/bin/data.bin"].0.contains(&0u8));
    let out = env.grove(&["workspace", "release", &id]).await;
    assert!(out.status.success(), "{:?}", text(&out));

    let report = sweep(&env, &["--now", &from_now(3600)]).await;
    assert!(
        report["actions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["outcome"] == "done" && a["action"]["kind"]["kind"] == "evict_workspace"),
        "{report}"
    );
    assert_eq!(state_of(&env, &id).await, "evicted");
    assert!(!dir.exists(), "the files are gone");
    let evicted = events_of(&env, "workspace.evicted").await;
    assert_eq!(evicted.len(), 1);
    let e = &evicted[0];
    assert_eq!(e["cause"]["cause"], "policy");
    assert_eq!(e["cause"]["reason"], "disk_pressure");
    assert_eq!(e["cause"]["pressure"]["budget_bytes"], 1);
    assert!(e["bytes_freed"].as_i64().unwrap() > 0);
    let saved = &e["saved"];
    assert_eq!(saved["ref_name"], format!("refs/grove/saved/{id}"));
    assert_eq!(saved["head_commit"], head.trim());
    let patch = PathBuf::from(saved["patch_path"].as_str().unwrap());
    assert_eq!(patch, env.home().join("saved").join(format!("{id}.patch")));
    let patch_text = String::from_utf8_lossy(&std::fs::read(&patch).unwrap()).to_string();
    assert!(patch_text.contains("GIT binary patch"), "{patch_text}");
    assert!(patch_text.contains("out/bin/data.bin") && patch_text.contains("gone.txt"));
    // The saved commit and the local commit live in the repo cache now.
    let cache: String = sqlx::query_scalar("SELECT local_path FROM grove.sandbox_repo_caches")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    let cache = Path::new(&cache);
    assert_eq!(
        grove_e2e::git(cache, &["rev-parse", &format!("refs/grove/saved/{id}")]).trim(),
        saved["commit"].as_str().unwrap()
    );
    assert_eq!(
        grove_e2e::git(cache, &["rev-parse", &format!("refs/grove/saved/{id}^")]).trim(),
        head.trim()
    );
    // An exec on an evicted workspace is refused with what to do.
    let refused = env.grove(&["exec", &id, "--", "true"]).await;
    assert_eq!(refused.status.code(), Some(4), "{:?}", text(&refused));
    assert!(text(&refused).1.contains("restore"), "{:?}", text(&refused));

    let restored = env.grove_json(&["workspace", "restore", &id]).await;
    assert_eq!(restored["id"], id.as_str());
    assert_eq!(restored["state"], "ready");
    assert_eq!(restored["dirty"], true);
    assert_eq!(dir_of(&restored), dir, "same path");
    assert_eq!(
        snapshot(&dir),
        files,
        "byte-identical, executable bits included"
    );
    assert_eq!(grove_e2e::git(&dir, &["rev-parse", "HEAD"]), head);
    assert_eq!(
        grove_e2e::git(&dir, &["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        "agent/edits-c1"
    );
    assert_eq!(grove_e2e::git(&dir, &["status", "--porcelain"]), status);
    let cat = env.grove(&["exec", &id, "--", "cat", "f.txt"]).await;
    assert_eq!(text(&cat).0, "one\ntwo\n");

    // Evicted again, an acquire of the same key brings it back under the same id.
    env.grove(&["workspace", "release", &id]).await;
    sweep(&env, &["--now", &from_now(3600)]).await;
    assert_eq!(state_of(&env, &id).await, "evicted");
    let again = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    assert_eq!(id_of(&again), id);
    assert_eq!(snapshot(&dir), files);
    assert_eq!(env.count_events("workspace.restored").await, 2);
    assert_records_match_disk(&env).await;
    replay_ok(&env).await;
}
