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
    assert_eq!(saved["ref_name"], "refs/grove/work");
    assert_eq!(saved["head_commit"], head.trim());
    let patch = PathBuf::from(saved["patch_path"].as_str().unwrap());
    let store = patch.parent().unwrap().to_path_buf();
    assert!(
        store.starts_with(env.home().join("saved")),
        "{}",
        store.display()
    );
    assert!(store.ends_with(&id), "{}", store.display());
    let patch_text = String::from_utf8_lossy(&std::fs::read(&patch).unwrap()).to_string();
    assert!(patch_text.contains("GIT binary patch"), "{patch_text}");
    assert!(patch_text.contains("out/bin/data.bin") && patch_text.contains("gone.txt"));
    // The saved commit and the local commit live in the private store, not the cache.
    assert_eq!(
        grove_e2e::git(&store, &["rev-parse", "refs/grove/work"]).trim(),
        saved["commit"].as_str().unwrap()
    );
    assert_eq!(
        grove_e2e::git(&store, &["rev-parse", "refs/grove/work^"]).trim(),
        head.trim()
    );
    let cache: String = sqlx::query_scalar("SELECT local_path FROM grove.sandbox_repo_caches")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(
        grove_e2e::git(Path::new(&cache), &["for-each-ref", "refs/grove"]),
        ""
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

async fn size_of(env: &TestEnv, id: &str) -> u64 {
    workspace(env, id).await["size_bytes"].as_u64().unwrap()
}

async fn cache_bytes(env: &TestEnv) -> u64 {
    sqlx::query_scalar::<_, i64>(
        "SELECT coalesce(sum(size_bytes), 0)::bigint FROM grove.sandbox_repo_caches",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap() as u64
}

async fn wait_for_count(env: &TestEnv, sql: &str, at_least: i64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string()))
            .fetch_one(&env.pool)
            .await
            .unwrap();
        if n >= at_least {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sweep_with_a_tiny_budget_evicts_in_order_keeps_pinned_and_busy_workspaces_and_ends_below_low_water(
) {
    let mut env = env_or_skip!(
        "a_sweep_with_a_tiny_budget_evicts_in_order_keeps_pinned_and_busy_workspaces_and_ends_below_low_water"
    );
    let setup = env.spawn_worker_env(BASE).await;
    // Every checkout carries a 200 kB file that does not compress: sizes are dominated by it.
    let blob = noise(200_000, 7);
    let dir = env.dir.path().join("upstream/fixture");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("big.bin"), &blob).unwrap();
    let url = env.fixture_repo("fixture", &[("f.txt", "one\n")]);
    let analysis = env.grove_json(&acquire_args(&url, "analysis", &[])).await;
    let task = env
        .grove_json(&acquire_args(&url, "task", &["--task", "t1"]))
        .await;
    let clean = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "clean"]))
        .await;
    let dirty = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "dirty"]))
        .await;
    let pinned = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "pinned"]))
        .await;
    let busy = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "busy"]))
        .await;
    let (dirty_id, pinned_id, busy_id) = (id_of(&dirty), id_of(&pinned), id_of(&busy));
    let out = env
        .grove(&["exec", &dirty_id, "--", "sh", "-c", "echo work >> f.txt"])
        .await;
    assert!(out.status.success(), "{:?}", text(&out));
    env.grove(&["workspace", "release", &dirty_id]).await;
    let until = from_now(3600);
    let pin = env
        .grove_json(&["workspace", "pin", &pinned_id, "--until", &until])
        .await;
    assert!(pin["pinned_until"].is_string());
    env.worker(setup).kill9().await;

    // A budget that holds the two kept workspaces and the cache below low water (70%),
    // with some room for the dirty workspace's patch, but far less than everything.
    // What no eviction frees: the kept workspaces, the cache, and every workspace's
    // history store (ADR 28).
    let keep = size_of(&env, &pinned_id).await
        + size_of(&env, &busy_id).await
        + cache_bytes(&env).await
        + apparent_bytes(&env.home().join("history"));
    let budget = ((keep + 30_000) as f64 / 0.7) as u64;
    let budget_s = budget.to_string();
    let mut ids = vec![];
    for ws in [&analysis, &task, &clean, &dirty, &pinned, &busy] {
        ids.push(id_of(ws));
    }
    let mut total = cache_bytes(&env).await;
    for id in &ids {
        total += size_of(&env, id).await;
    }
    assert!(
        total as f64 > budget as f64 * 0.85,
        "the workload exceeds high water"
    );
    let policy = with(&[
        ("GROVE_DISK_BUDGET", &budget_s),
        ("GROVE_PRESSURE_GRACE", "0"),
    ]);
    env.spawn_worker_env(&policy).await;
    // The busy workspace runs a command for the whole sweep.
    let long = tokio::spawn(
        env.command(&["exec", &busy_id, "--", "sleep", "20"])
            .output(),
    );
    wait_for_count(
        &env,
        "SELECT count(*) FROM grove.commands WHERE kind = 'exec' AND status = 'running'",
        1,
        "the busy workspace's command to start",
    )
    .await;
    let report = sweep(&env, &[]).await;
    let done: Vec<(String, String)> = report["actions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["outcome"] == "done")
        .map(|a| {
            (
                a["action"]["kind"]["kind"].as_str().unwrap().to_string(),
                a["action"]["id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let evicted: Vec<&str> = done
        .iter()
        .filter(|(k, _)| k == "evict_workspace")
        .map(|(_, id)| id.as_str())
        .collect();
    // Clean analysis, clean task, clean edit, then the dirty edit: the seed's order.
    assert_eq!(
        evicted,
        [
            ids[0].as_str(),
            ids[1].as_str(),
            ids[2].as_str(),
            ids[3].as_str()
        ],
        "{report:#}"
    );
    // The dirty workspace's stopped runtime was destroyed first; no repo cache went.
    assert!(
        done.iter().any(|(k, _)| k == "destroy_runtime"),
        "{report:#}"
    );
    assert!(
        !done.iter().any(|(k, _)| k == "evict_repo_cache"),
        "{report:#}"
    );
    for id in &ids[..4] {
        assert_eq!(state_of(&env, id).await, "evicted");
    }
    assert_eq!(state_of(&env, &pinned_id).await, "ready");
    assert_eq!(state_of(&env, &busy_id).await, "ready");
    assert!(dir_of(&pinned).join("big.bin").is_file());
    assert!(dir_of(&busy).join("big.bin").is_file());
    let blocked: Vec<(String, String)> = report["blocked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["id"].as_str().unwrap().to_string(),
                b["protection"]["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        blocked.contains(&(pinned_id.clone(), "pinned".into())),
        "{blocked:?}"
    );
    assert!(
        blocked.iter().any(|(id, _)| id == &busy_id),
        "the busy workspace was reached and kept: {blocked:?}"
    );
    // Usage ends below low water: by the cached sizes, and by walking $GROVE_HOME.
    let low = report["marks"]["low_water_bytes"].as_u64().unwrap();
    assert_eq!(report["budget_met"], true, "{report:#}");
    assert!(
        report["used_bytes_after"].as_u64().unwrap() <= low,
        "{report:#}"
    );
    let on_disk = apparent_bytes(&env.home());
    assert!(on_disk <= low, "{on_disk} bytes on disk > low water {low}");
    let out = long.await.unwrap().unwrap();
    assert!(
        out.status.success(),
        "the busy command was not disturbed: {:?}",
        text(&out)
    );
    assert_records_match_disk(&env).await;
    // `grove workspace list` shows the order of what is left.
    let listed = env.grove(&["workspace", "list"]).await;
    assert!(text(&listed).0.contains("evict=#"), "{:?}", text(&listed));
    replay_ok(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_runtime_is_stopped_after_the_threshold_and_destroyed_later_with_the_files_intact()
{
    let mut env = env_or_skip!(
        "an_idle_runtime_is_stopped_after_the_threshold_and_destroyed_later_with_the_files_intact"
    );
    env.spawn_worker_env(BASE).await;
    let url = env.fixture_repo("fixture", &[("f.txt", "one\n")]);
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let id = id_of(&ws);
    let out = env
        .grove(&["exec", &id, "--", "sh", "-c", "echo made > made.txt"])
        .await;
    assert!(out.status.success(), "{:?}", text(&out));
    let runtime_state = || async {
        sqlx::query_scalar::<_, String>("SELECT state FROM grove.sandbox_runtimes")
            .fetch_optional(&env.pool)
            .await
            .unwrap()
    };
    assert_eq!(runtime_state().await.as_deref(), Some("running"));
    // 29 minutes later: not idle long enough.
    sweep(&env, &["--now", &from_now(29 * 60)]).await;
    assert_eq!(runtime_state().await.as_deref(), Some("running"));
    // 31 minutes later: stopped, with the values that triggered it.
    let report = sweep(&env, &["--now", &from_now(31 * 60)]).await;
    assert_eq!(
        runtime_state().await.as_deref(),
        Some("stopped"),
        "{report:#}"
    );
    let stopped = events_of(&env, "runtime.stopped").await;
    assert_eq!(stopped.len(), 1);
    let reason = stopped[0]["reason"].as_str().unwrap();
    assert!(reason.starts_with("eviction: idle for 18"), "{reason}");
    assert!(reason.contains("threshold 1800 s"), "{reason}");
    let action = &report["actions"][0];
    assert_eq!(action["action"]["kind"]["kind"], "stop_runtime");
    assert_eq!(action["action"]["reason"]["reason"], "idle_runtime");
    assert_eq!(action["action"]["reason"]["threshold_secs"], 1800);
    // Seven hours later it has been stopped for longer than 6 h: destroyed.
    sweep(&env, &["--now", &from_now(7 * 3600)]).await;
    assert_eq!(runtime_state().await, None);
    assert_eq!(env.count_events("runtime.destroyed").await, 1);
    // The workspace was never touched.
    assert_eq!(state_of(&env, &id).await, "ready");
    let dir = dir_of(&ws);
    assert_eq!(
        std::fs::read_to_string(dir.join("made.txt")).unwrap(),
        "made\n"
    );
    assert_eq!(std::fs::read_to_string(dir.join("f.txt")).unwrap(), "one\n");
    let again = env.grove(&["exec", &id, "--", "cat", "made.txt"]).await;
    assert_eq!(text(&again).0, "made\n");
    // Without the override flag a worker refuses a clock override.
    replay_ok(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn three_workers_of_one_node_run_one_sweep_per_cron_tick() {
    let mut env = env_or_skip!("three_workers_of_one_node_run_one_sweep_per_cron_tick");
    let every_two_seconds = [("GROVE_EVICT_SCHEDULE", "*/2 * * * * *")];
    for _ in 0..3 {
        env.spawn_worker_env(&every_two_seconds).await;
    }
    wait_for_count(
        &env,
        "SELECT count(*) FROM grove.commands WHERE kind = 'evict_sweep' AND status = 'succeeded'",
        4,
        "four scheduled sweeps",
    )
    .await;
    // Let the ticks in flight finish, then compare ticks, ledger rows and sweep events.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let per_tick: Vec<(String, i64)> = sqlx::query_as(
        "SELECT payload ->> 'tick', count(*) FROM grove.commands WHERE kind = 'evict_sweep' GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert!(per_tick.len() >= 4, "{per_tick:?}");
    assert!(
        per_tick.iter().all(|(_, n)| *n == 1),
        "one ledger row per tick: {per_tick:?}"
    );
    let finished: Vec<(String, i64)> = sqlx::query_as(
        "SELECT payload -> 'report' ->> 'tick', count(*) FROM grove.events
         WHERE event_type = 'eviction.sweep_finished' GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    let succeeded: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM grove.commands WHERE kind = 'evict_sweep' AND status = 'succeeded'",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(finished.len() as i64, succeeded, "{finished:?}");
    assert!(
        finished.iter().all(|(_, n)| *n == 1),
        "one sweep per tick: {finished:?}"
    );
    // Every worker enqueued (each logs its schedule); the ledger kept one.
    assert_eq!(
        env.worker_logs()
            .matches("eviction sweeps scheduled")
            .count(),
        3
    );
    let attempts: Vec<i32> = sqlx::query_scalar(
        "SELECT attempts FROM grove.commands WHERE kind = 'evict_sweep' AND status = 'succeeded'",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert!(attempts.iter().all(|a| *a == 1), "{attempts:?}");
    replay_ok(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_eviction_racing_an_acquire_of_the_same_workspace_never_leaves_a_half_deleted_directory()
{
    let mut env = env_or_skip!(
        "an_eviction_racing_an_acquire_of_the_same_workspace_never_leaves_a_half_deleted_directory"
    );
    env.spawn_worker_env(BASE).await;
    env.spawn_worker_env(BASE).await;
    let blob = noise(300_000, 3);
    let up = env.dir.path().join("upstream/fixture");
    std::fs::create_dir_all(&up).unwrap();
    std::fs::write(up.join("big.bin"), &blob).unwrap();
    let url = env.fixture_repo("fixture", &[("f.txt", "one\n")]);
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let id = id_of(&ws);
    let dir = dir_of(&ws);
    let env = std::sync::Arc::new(env);
    // Watches the path the whole time: whenever it exists, it is a whole checkout.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (dir, stop) = (dir.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen_whole = 0u64;
            use std::os::unix::fs::MetadataExt;
            let inode = |p: &std::path::Path| std::fs::symlink_metadata(p).ok().map(|m| m.ino());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // One directory handle: a rename moves all of it or none of it. The
                // handle follows the directory it opened, so a listing counts only when
                // the same directory stood at the path before and after it: a directory
                // renamed into the trash never comes back, and the deletion there
                // (which a slow listing can watch) is not at the workspace's path.
                let before = inode(&dir);
                if let Ok(entries) = std::fs::read_dir(&dir) {
                    let names: Vec<String> = entries
                        .flatten()
                        .map(|e| e.file_name().to_string_lossy().to_string())
                        .collect();
                    if before.is_none() || inode(&dir) != before {
                        continue;
                    }
                    for expected in [".git", "f.txt", "big.bin"] {
                        assert!(
                            names.iter().any(|n| n == expected),
                            "half a workspace at {}: {names:?}",
                            dir.display()
                        );
                    }
                    seen_whole += 1;
                }
            }
            seen_whole
        })
    };
    let mut acquired = 0;
    let mut refused = 0;
    for round in 0..8 {
        let far = from_now(30 * 86_400);
        let evict = {
            let env = env.clone();
            tokio::spawn(async move { env.grove(&["evict", "--now", &far]).await })
        };
        if round % 2 == 1 {
            tokio::time::sleep(Duration::from_millis(20 * round)).await;
        }
        let args = acquire_args(&url, "edit", &["--conversation", "c1", "--json"]);
        let out = env.grove(&args).await;
        if out.status.success() {
            let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(id_of(&got), id, "the same workspace, not a new one");
            acquired += 1;
        } else {
            // The only acceptable failure: a clear, retryable conflict.
            assert_eq!(out.status.code(), Some(4), "{:?}", text(&out));
            refused += 1;
        }
        let swept = evict.await.unwrap();
        assert!(swept.status.success(), "{:?}", text(&swept));
        let state = state_of(&env, &id).await;
        assert!(state == "ready" || state == "evicted", "{state}");
        assert_eq!(
            dir.exists(),
            state == "ready",
            "record and disk agree ({state})"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = watcher
        .join()
        .expect("no half-deleted directory was ever seen");
    assert!(seen > 0);
    assert!(acquired + refused == 8);
    assert!(
        env.count_events("workspace.evicted").await >= 1,
        "evictions happened"
    );
    assert_eq!(env.count_events("workspace.created").await, 1);
    // Whatever the interleaving, the workspace can be had again and works.
    let last = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    assert_eq!(id_of(&last), id);
    assert_eq!(std::fs::read_to_string(dir.join("f.txt")).unwrap(), "one\n");
    eprintln!(
        "acquired {acquired}, refused {refused}, evicted {}, restored {}",
        env.count_events("workspace.evicted").await,
        env.count_events("workspace.restored").await
    );
    assert!(env.count_events("workspace.restored").await >= 1);
    assert_records_match_disk(&env).await;
    replay_ok(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_killed_in_the_middle_of_a_sweep_leaves_nothing_half_deleted_and_the_next_sweep_repairs_the_records(
) {
    let mut env = env_or_skip!(
        "a_worker_killed_in_the_middle_of_a_sweep_leaves_nothing_half_deleted_and_the_next_sweep_repairs_the_records"
    );
    let url = env.fixture_repo("fixture", &[("f.txt", "one\n")]);
    let pause = [("GROVE_TEST_EVICT_PAUSE_MS", "2500")];
    let fast_recovery = [("GROVE_WORKER_LOST_AFTER", "3")];
    let far = from_now(30 * 86_400);

    for (round, kill_after_ms, expect_dir) in [(0, 800u64, true), (1, 3300, false)] {
        let a = env.spawn_worker_env(&with(&pause)).await;
        let mut ids = vec![];
        for n in 0..2 {
            let conv = format!("r{round}-{n}");
            let ws = env
                .grove_json(&acquire_args(&url, "edit", &["--conversation", &conv]))
                .await;
            ids.push(ws);
        }
        let before = env.count_events("workspace.evicting").await;
        let waiting = tokio::spawn(env.command(&["evict", "--now", &far, "--json"]).output());
        wait_for_count(
            &env,
            "SELECT count(*) FROM grove.events WHERE event_type = 'workspace.evicting'",
            before + 1,
            "an eviction to start",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(kill_after_ms)).await;
        env.worker(a).kill9().await;
        let states: Vec<(String, String)> =
            sqlx::query_as("SELECT id::text, state FROM grove.sandbox_workspaces")
                .fetch_all(&env.pool)
                .await
                .unwrap();
        eprintln!("round {round}: {states:?}");
        // Killed during the first pause the files are still at their path; during the
        // second they are in the trash. Either way the record says `evicting`.
        let (id, path): (String, String) = sqlx::query_as(
            "SELECT id::text, local_path FROM grove.sandbox_workspaces WHERE state = 'evicting'",
        )
        .fetch_one(&env.pool)
        .await
        .unwrap();
        assert_eq!(Path::new(&path).exists(), expect_dir, "round {round}");
        if expect_dir {
            assert!(
                Path::new(&path).join(".git/HEAD").is_file()
                    && Path::new(&path).join("f.txt").is_file()
            );
        }
        // A new worker picks the sweep up again (the dead worker's job is recovered).
        let b = env.spawn_worker_env(&with(&fast_recovery)).await;
        let out = waiting.await.unwrap().unwrap();
        assert!(out.status.success(), "{:?}", text(&out));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let repaired = report["reconciled"].as_array().unwrap();
        assert!(
            repaired.iter().any(|r| r["id"] == id.as_str()),
            "the interrupted eviction was repaired: {report:#}"
        );
        assert_records_match_disk(&env).await;
        for ws in &ids {
            assert_eq!(state_of(&env, &id_of(ws)).await, "evicted", "{report:#}");
        }
        // And the workspace that was interrupted comes back whole.
        let restored = env.grove_json(&["workspace", "restore", &id]).await;
        assert_eq!(restored["state"], "ready");
        assert_eq!(
            std::fs::read_to_string(Path::new(&path).join("f.txt")).unwrap(),
            "one\n"
        );
        // The next round's sweep must reach a pausing worker only.
        env.worker(b).kill9().await;
    }
    replay_ok(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dry_run_prints_the_plan_and_changes_nothing() {
    let mut env = env_or_skip!("a_dry_run_prints_the_plan_and_changes_nothing");
    let policy = with(&[("GROVE_DISK_BUDGET", "1"), ("GROVE_PRESSURE_GRACE", "0")]);
    env.spawn_worker_env(BASE).await;
    let url = env.fixture_repo("fixture", &[("f.txt", "one\n")]);
    let a = env.grove_json(&acquire_args(&url, "analysis", &[])).await;
    let e = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    env.grove(&["exec", &id_of(&e), "--", "sh", "-c", "echo x >> f.txt"])
        .await;
    env.grove(&["workspace", "release", &id_of(&e)]).await;
    let snapshot_db = || async {
        let mut all = vec![];
        for table in [
            "grove.sandbox_workspaces",
            "grove.sandbox_runtimes",
            "grove.sandbox_repo_caches",
            "grove.commands",
            "grove.events",
            "apalis.jobs",
        ] {
            let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT t::text FROM {table} t ORDER BY 1"
            )))
            .fetch_all(&env.pool)
            .await
            .unwrap();
            all.push((table, rows));
        }
        all
    };
    let tree = |root: &Path| {
        let mut names = vec![];
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap().flatten() {
                let p = entry.path();
                let meta = std::fs::symlink_metadata(&p).unwrap();
                names.push((p.display().to_string(), meta.len()));
                if meta.is_dir() {
                    stack.push(p);
                }
            }
        }
        names.sort();
        names
    };
    let db_before = snapshot_db().await;
    let fs_before = tree(&env.home());
    let out = env.grove_env(&["evict", "--dry-run"], &policy).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("under pressure"), "{stdout}");
    assert!(
        stdout.contains(&format!("evict_workspace       {}", id_of(&a))),
        "{stdout}"
    );
    assert!(stdout.contains("evict_workspace+save"), "{stdout}");
    assert!(stdout.contains("frees"), "{stdout}");
    assert!(stdout.contains("disk pressure"), "{stdout}");
    let json = env
        .grove_env(&["evict", "--dry-run", "--json"], &policy)
        .await;
    assert!(json.status.success());
    let plan: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(plan["dry_run"], true);
    let actions = plan["plan"]["actions"].as_array().unwrap();
    assert!(actions.len() >= 3, "{plan:#}");
    assert_eq!(actions[0]["kind"]["kind"], "evict_workspace");
    assert_eq!(actions[0]["reason"]["reason"], "disk_pressure");
    assert!(plan["bytes_freed"].as_u64().unwrap() > 0);
    let listed = env
        .grove_env(&["workspace", "list", "--json"], &policy)
        .await;
    let first: serde_json::Value =
        serde_json::from_str(text(&listed).0.lines().next().unwrap()).unwrap();
    assert!(first["eviction"]["position"].as_u64().is_some(), "{first}");
    assert_eq!(snapshot_db().await, db_before, "no row changed");
    assert_eq!(tree(&env.home()), fs_before, "no file changed");
    assert_eq!(state_of(&env, &id_of(&a)).await, "ready");
    replay_ok(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn releasing_a_conversation_stops_its_runtimes_and_destroying_it_removes_its_workspaces() {
    let mut env = env_or_skip!(
        "releasing_a_conversation_stops_its_runtimes_and_destroying_it_removes_its_workspaces"
    );
    env.spawn_worker_env(BASE).await;
    let url = env.fixture_repo("fixture", &[("f.txt", "one\n")]);
    let c1 = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let c2 = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c2"]))
        .await;
    for ws in [&c1, &c2] {
        env.grove(&["exec", &id_of(ws), "--", "true"]).await;
    }
    let report = env
        .grove_json(&["release", "--user", "u1", "--conversation", "c1"])
        .await;
    assert_eq!(report["released"], serde_json::json!([id_of(&c1)]));
    assert_eq!(state_of(&env, &id_of(&c1)).await, "released");
    assert_eq!(
        state_of(&env, &id_of(&c2)).await,
        "ready",
        "another conversation is untouched"
    );
    let running: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM grove.sandbox_runtimes WHERE workspace_id = $1::uuid AND state = 'running'",
    )
    .bind(id_of(&c1))
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(running, 0);
    assert!(dir_of(&c1).join("f.txt").is_file(), "released, files kept");
    let report = env
        .grove_json(&[
            "release",
            "--user",
            "u1",
            "--conversation",
            "c1",
            "--destroy-workspaces",
        ])
        .await;
    assert_eq!(report["destroyed"], serde_json::json!([id_of(&c1)]));
    assert!(!dir_of(&c1).exists());
    let bad = env.grove(&["release", "--user", "u1"]).await;
    assert_eq!(bad.status.code(), Some(2), "{:?}", text(&bad));
    replay_ok(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn repo_caches_go_last_never_with_saved_work_and_come_back_on_the_next_acquire() {
    let mut env =
        env_or_skip!("repo_caches_go_last_never_with_saved_work_and_come_back_on_the_next_acquire");
    env.spawn_worker_env(&with(&[
        ("GROVE_DISK_BUDGET", "1"),
        ("GROVE_PRESSURE_GRACE", "60"),
    ]))
    .await;
    let x = env.fixture_repo("x", &[("f.txt", "x\n")]);
    let y = env.fixture_repo("y", &[("f.txt", "y\n")]);
    let mut args_x = acquire_args(&x, "analysis", &[]);
    args_x[7] = "o/x";
    let mut args_y = acquire_args(&y, "edit", &["--conversation", "c1"]);
    args_y[7] = "o/y";
    let wx = env.grove_json(&args_x).await;
    let wy = env.grove_json(&args_y).await;
    let out = env
        .grove(&["exec", &id_of(&wy), "--", "sh", "-c", "echo dirty >> f.txt"])
        .await;
    assert!(out.status.success());
    env.grove(&["workspace", "release", &id_of(&wy)]).await;
    // An on-demand sweep followed each acquire (usage is above high water), and kept what
    // was just used.
    let on_demand: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM grove.commands WHERE kind = 'evict_sweep' AND payload ->> 'trigger' = 'on_demand'",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert!(on_demand >= 1);
    assert_eq!(env.count_events("workspace.evicted").await, 0);

    let report = sweep(&env, &["--now", &from_now(3600)]).await;
    let kinds: Vec<String> = report["actions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["outcome"] == "done")
        .map(|a| a["action"]["kind"]["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("evict_repo_cache"),
        "caches go last: {report:#}"
    );
    let caches: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT repo_name, state, local_path FROM grove.sandbox_repo_caches ORDER BY repo_name",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(caches[0].0, "o/x");
    assert_eq!(caches[0].1, "evicted", "no live workspace, no saved work");
    assert!(!Path::new(&caches[0].2).exists());
    assert_eq!(
        caches[1].1, "ready",
        "holds the saved work of an evicted workspace"
    );
    assert!(Path::new(&caches[1].2).is_dir());
    assert!(report["blocked"]
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b["target"] == "repo_cache" && b["protection"]["kind"] == "saved_work"));
    // The next acquire of the analysis key clones the cache again and restores it.
    let back = env.grove_json(&args_x).await;
    assert_eq!(id_of(&back), id_of(&wx));
    assert_eq!(
        std::fs::read_to_string(dir_of(&back).join("f.txt")).unwrap(),
        "x\n"
    );
    let state: String =
        sqlx::query_scalar("SELECT state FROM grove.sandbox_repo_caches WHERE repo_name = 'o/x'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(state, "ready");
    assert!(Path::new(&caches[0].2).is_dir());
    // Destroying the evicted dirty workspace discards its saved work: ref, patch, record.
    let wy_id = id_of(&wy);
    let evicted = events_of(&env, "workspace.evicted").await;
    let wy_saved = evicted
        .iter()
        .find(|e| e["workspace_id"] == wy_id.as_str())
        .expect("wy was evicted");
    let patch = PathBuf::from(wy_saved["saved"]["patch_path"].as_str().unwrap());
    assert!(patch.is_file());
    let out = env.grove(&["workspace", "destroy", &wy_id]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    assert!(!patch.exists() && !patch.parent().unwrap().exists());
    let refs = grove_e2e::git(Path::new(&caches[1].2), &["for-each-ref", "refs/grove"]);
    assert_eq!(refs, "");
    let gone = env.grove(&["workspace", "show", &wy_id]).await;
    assert_eq!(gone.status.code(), Some(3));
    replay_ok(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dirtiness_is_decided_by_git_at_eviction_time_not_by_the_record() {
    let mut env = env_or_skip!("dirtiness_is_decided_by_git_at_eviction_time_not_by_the_record");
    let first = env.spawn_worker_env(BASE).await;
    let url = env.fixture_repo("fixture", &[("f.txt", "one\n")]);
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let id = id_of(&ws);
    // Changed behind grove's back: the record still says clean.
    std::fs::write(dir_of(&ws).join("f.txt"), "changed outside\n").unwrap();
    assert_eq!(workspace(&env, &id).await["dirty"], false);
    // Thirty days on, a clean edit workspace is past its TTL, but a dirty one never goes
    // for a TTL: the sweep asks git, records the change and keeps it.
    let report = sweep(&env, &["--now", &from_now(30 * 86_400)]).await;
    assert_eq!(state_of(&env, &id).await, "ready", "{report:#}");
    assert_eq!(workspace(&env, &id).await["dirty"], true);
    assert_eq!(env.count_events("workspace.evicted").await, 0);
    assert_eq!(
        std::fs::read_to_string(dir_of(&ws).join("f.txt")).unwrap(),
        "changed outside\n"
    );
    // Changed behind its back again, and under pressure: the plan (from the record) says
    // clean, git says dirty, the re-plan saves the work before the files go.
    env.worker(first).kill9().await;
    env.spawn_worker_env(&with(&[
        ("GROVE_DISK_BUDGET", "1"),
        ("GROVE_PRESSURE_GRACE", "0"),
    ]))
    .await;
    let out = env
        .grove(&["exec", &id, "--", "git", "checkout", "--", "f.txt"])
        .await;
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(workspace(&env, &id).await["dirty"], false);
    std::fs::write(dir_of(&ws).join("new.txt"), "untracked, outside\n").unwrap();
    env.grove(&["workspace", "release", &id]).await;
    let report = sweep(&env, &[]).await;
    assert_eq!(state_of(&env, &id).await, "evicted", "{report:#}");
    let outcomes: Vec<(String, String)> = report["actions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["action"]["kind"]["kind"] == "evict_workspace")
        .map(|a| {
            (
                a["outcome"].as_str().unwrap().to_string(),
                a["action"]["kind"]["preserve_dirty"].to_string(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("skipped".to_string(), "false".to_string()),
            ("done".to_string(), "true".to_string())
        ],
        "{report:#}"
    );
    let evicted = events_of(&env, "workspace.evicted").await;
    assert!(evicted[0]["saved"]["patch_path"].is_string(), "{evicted:?}");
    let restored = env.grove_json(&["workspace", "restore", &id]).await;
    assert_eq!(restored["dirty"], true);
    assert_eq!(
        std::fs::read_to_string(dir_of(&ws).join("new.txt")).unwrap(),
        "untracked, outside\n"
    );
    replay_ok(&env).await;
}

/// Everything a workspace is, as text: files (bytes, exec bit, symlink targets; `.git`
/// left out), HEAD (branch or detached), refs, the stash list, the index entries and
/// status with untracked and ignored files.
fn full_state(dir: &Path) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = snapshot(dir)
        .into_iter()
        .map(|(k, (bytes, exec))| (format!("path {k}"), format!("{exec} {bytes:?}")))
        .collect();
    for (k, args) in [
        ("head", vec!["rev-parse", "--symbolic-full-name", "HEAD"]),
        ("head_commit", vec!["rev-parse", "HEAD"]),
        (
            "refs",
            vec!["for-each-ref", "--format=%(refname) %(objectname)"],
        ),
        ("stash", vec!["stash", "list", "--format=%H %gs"]),
        ("index", vec!["ls-files", "-s"]),
        (
            "status",
            vec!["status", "--porcelain", "--ignored", "-uall"],
        ),
    ] {
        out.insert(k.into(), grove_e2e::git(dir, &args));
    }
    out
}

/// Evicts everything evictable (the clock an hour ahead, a 1-byte budget).
async fn evict_all(env: &TestEnv) {
    let report = sweep(env, &["--now", &from_now(3600)]).await;
    assert!(
        report["actions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["outcome"] == "done" && a["action"]["kind"]["kind"] == "evict_workspace"),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn branches_tags_stash_staged_and_ignored_files_survive_eviction_and_restore_identical() {
    let mut env = env_or_skip!(
        "branches_tags_stash_staged_and_ignored_files_survive_eviction_and_restore_identical"
    );
    env.spawn_worker_env(&with(&[
        ("GROVE_DISK_BUDGET", "1"),
        ("GROVE_PRESSURE_GRACE", "60"),
        ("GROVE_EVICT_IGNORED_BUDGET_BYTES", "1000"),
    ]))
    .await;
    let url = env.fixture_repo(
        "fixture",
        &[
            ("f.txt", "one\n"),
            ("g.txt", "g\n"),
            (".gitignore", "*.log\nbuild/\n"),
        ],
    );
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let (id, dir) = (id_of(&ws), dir_of(&ws));
    let script = "set -e
        echo a > a.txt && git add a.txt && git commit -qm 'on the branch'
        git branch side && git checkout -q side
        echo s > s.txt && git add s.txt && git commit -qm 'side' && git tag -a t1 -m tag && git tag light
        git checkout -q -
        echo stash1 > f.txt && git stash push -q -m one
        echo stash2 > g.txt && git stash push -q -m two
        echo staged > f.txt && git add f.txt && echo unstaged > f.txt
        echo new > staged-new.txt && git add staged-new.txt
        rm g.txt
        mkdir -p u/v && printf 'bin\\000ary' > u/v/w.bin
        echo kept > small.log
        mkdir -p build && head -c 5000 /dev/zero > build/big.out
        printf '#!/bin/sh\\n' > run.sh && chmod +x run.sh
        ln -s f.txt link";
    let out = env.grove(&["exec", &id, "--", "sh", "-c", script]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    let before = full_state(&dir);
    assert!(before["stash"].lines().count() == 2 && before["refs"].contains("refs/tags/t1"));
    env.grove(&["workspace", "release", &id]).await;
    evict_all(&env).await;
    assert_eq!(state_of(&env, &id).await, "evicted");
    let evicted = events_of(&env, "workspace.evicted").await;
    let omitted = evicted[0]["omitted"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        omitted
            .iter()
            .any(|o| o.as_str().unwrap().contains("build/big.out")),
        "the ignored file over the budget is named: {omitted:?}"
    );
    let restored = env.grove_json(&["workspace", "restore", &id]).await;
    assert_eq!(restored["state"], "ready");
    let mut after = full_state(&dir);
    let mut expected = before.clone();
    // The one thing left out, by the budget, and named above.
    expected.remove("path build/big.out");
    let status = |s: &str| {
        s.lines()
            .filter(|l| !l.contains("build/"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    expected.insert("status".into(), status(&expected["status"]));
    after.insert("status".into(), status(&after["status"]));
    assert_eq!(after, expected);
    replay_ok(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn another_tenant_sandbox_finds_no_trace_of_evicted_saved_work_in_the_shared_cache() {
    let mut env = env_or_skip!(
        "another_tenant_sandbox_finds_no_trace_of_evicted_saved_work_in_the_shared_cache"
    );
    env.spawn_worker_env(&with(&[
        ("GROVE_DISK_BUDGET", "1"),
        ("GROVE_PRESSURE_GRACE", "60"),
    ]))
    .await;
    let url = env.fixture_repo("fixture", &[("f.txt", "one\n")]);
    let a = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "ca"]))
        .await;
    let a_id = id_of(&a);
    let secret = "TENANT-A-SECRET-7f3a9c";
    let script = format!(
        "set -e; echo {secret} > secret.txt; echo {secret}-committed > c.txt; git add c.txt; git commit -qm wip; git stash list"
    );
    let out = env.grove(&["exec", &a_id, "--", "sh", "-c", &script]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    env.grove(&["workspace", "release", &a_id]).await;
    evict_all(&env).await;
    assert_eq!(state_of(&env, &a_id).await, "evicted");
    let evicted = events_of(&env, "workspace.evicted").await;
    let patch = evicted[0]["saved"]["patch_path"]
        .as_str()
        .unwrap()
        .to_string();
    let store = Path::new(&patch).parent().unwrap().to_path_buf();

    // Tenant B, same repository: its sandbox reads the shared cache every way it can.
    let mut args = acquire_args(&url, "edit", &["--conversation", "cb"]);
    args[3] = "u2";
    let b = env.grove_json(&args).await;
    let b_id = id_of(&b);
    let attack = format!(
        "C=$(dirname \"$(cat .git/objects/info/alternates)\")
         git --git-dir=\"$C\" for-each-ref | sed 's/^/REF /'
         git --git-dir=\"$C\" show refs/grove/saved/{a_id}:secret.txt 2>&1
         git --git-dir=\"$C\" cat-file --batch-all-objects --batch 2>&1 | grep -a -c {secret}
         cat {patch} 2>&1; ls {store} 2>&1; git --git-dir={store} show refs/grove/work:secret.txt 2>&1
         true",
        store = store.display()
    );
    let out = env.grove(&["exec", &b_id, "--", "sh", "-c", &attack]).await;
    let (stdout, stderr) = text(&out);
    assert!(
        !stdout.contains(secret) && !stderr.contains(secret),
        "tenant B read tenant A's saved work: {stdout}\n{stderr}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("REF ") && l.ends_with("refs/heads/main")),
        "the attack read the cache's refs: {stdout}"
    );
    assert!(
        !stdout
            .lines()
            .any(|l| l.starts_with("REF ") && l.contains("refs/grove")),
        "the cache lists a saved ref: {stdout}"
    );
    assert!(
        stdout.lines().any(|l| l.trim() == "0"),
        "no object of the cache holds the secret: {stdout}"
    );
    // The store itself is private to grove.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&store).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    // And A's work is still whole for A.
    let restored = env.grove_json(&["workspace", "restore", &a_id]).await;
    let dir = dir_of(&restored);
    assert_eq!(
        std::fs::read_to_string(dir.join("secret.txt"))
            .unwrap()
            .trim(),
        secret
    );
    replay_ok(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn saved_work_an_older_version_left_in_the_cache_is_moved_out_at_worker_start() {
    let mut env =
        env_or_skip!("saved_work_an_older_version_left_in_the_cache_is_moved_out_at_worker_start");
    let settings = with(&[("GROVE_DISK_BUDGET", "1"), ("GROVE_PRESSURE_GRACE", "60")]);
    let first = env.spawn_worker_env(&settings).await;
    let url = env.fixture_repo("fixture", &[("f.txt", "one\n")]);
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let (id, dir) = (id_of(&ws), dir_of(&ws));
    let out = env
        .grove(&[
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo secret > secret.txt && echo two >> f.txt",
        ])
        .await;
    assert!(out.status.success(), "{:?}", text(&out));
    env.grove(&["workspace", "release", &id]).await;
    evict_all(&env).await;
    let evicted = events_of(&env, "workspace.evicted").await;
    let store = PathBuf::from(evicted[0]["saved"]["patch_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    // Make it what an older version left: the work on `refs/grove/saved/<id>` in the
    // shared cache, the record naming that ref, and no store.
    let cache: String = sqlx::query_scalar("SELECT local_path FROM grove.sandbox_repo_caches")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    let cache = PathBuf::from(cache);
    let legacy = format!("refs/grove/saved/{id}");
    // A store borrows the cache's objects only in memory; git needs them named (the
    // store is deleted right after).
    std::fs::create_dir_all(store.join("objects/info")).unwrap();
    std::fs::write(
        store.join("objects/info/alternates"),
        format!("{}\n", cache.join("objects").display()),
    )
    .unwrap();
    grove_e2e::git(
        &cache,
        &[
            "fetch",
            "-q",
            store.to_str().unwrap(),
            &format!("refs/grove/work:{legacy}"),
        ],
    );
    std::fs::remove_dir_all(&store).unwrap();
    sqlx::query(
        "UPDATE grove.sandbox_workspaces SET saved_ref = $1, saved_patch = NULL WHERE id::text = $2",
    )
    .bind(&legacy)
    .bind(&id)
    .execute(&env.pool)
    .await
    .unwrap();
    env.worker(first).kill9().await;

    env.spawn_worker_env(&settings).await;
    wait_for_count(
        &env,
        "SELECT count(*) FROM grove.events WHERE event_type = 'workspace.saved_work_moved'",
        1,
        "the saved work to be moved",
    )
    .await;
    // The cache holds no saved ref any more; the store is back, private.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !grove_e2e::git(&cache, &["for-each-ref", "refs/grove"])
        .trim()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the cache ref was not deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(store.join("manifest.json").is_file());
    let moved = events_of(&env, "workspace.saved_work_moved").await;
    assert_eq!(moved[0]["from_ref"], legacy.as_str());
    assert_eq!(moved[0]["saved"]["ref_name"], "refs/grove/work");
    let row = workspace(&env, &id).await;
    assert_eq!(row["state"], "evicted");
    let restored = env.grove_json(&["workspace", "restore", &id]).await;
    assert_eq!(restored["state"], "ready");
    assert_eq!(
        std::fs::read_to_string(dir.join("secret.txt")).unwrap(),
        "secret\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("f.txt")).unwrap(),
        "one\ntwo\n"
    );
    replay_ok(&env).await;
}
