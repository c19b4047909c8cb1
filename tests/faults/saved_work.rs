//! Scenarios `saved_work_identity` and `saved_work_kill`: a workspace with branches,
//! tags, a stash, staged and unstaged edits, untracked and ignored files, an executable
//! and a symlink is evicted and restored, and must come back identical in all of it;
//! the same while the worker is SIGKILLed at random moments of the eviction and of the
//! restore (the workspace must then be either whole at its path or whole in its store,
//! and come back identical once a fresh worker finished the job).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use grove_e2e::{acquire_args, text, TestEnv};

use crate::{env_or_skip, replay_ok, scale, Figures, Fleet, Rng};

const IDENTITY_TRIALS: u64 = 3;
const KILL_TRIALS: u64 = 4;

/// Worker settings: no schedule, everything over budget, clock overrides accepted.
const WORKER: &[(&str, &str)] = &[
    ("GROVE_EVICT_SCHEDULE", "off"),
    ("GROVE_EVICT_MEASURE_EVERY", "0"),
    ("GROVE_ALLOW_CLOCK_OVERRIDE", "1"),
    ("GROVE_DISK_BUDGET", "1"),
    ("GROVE_PRESSURE_GRACE", "60"),
    ("GROVE_WORKER_LOST_AFTER", "3"),
];

/// Everything a workspace is, as text: files (bytes, mode bits, symlink targets; `.git`
/// left out), HEAD (symbolic and resolved), refs, the stash list, the index entries and
/// status with untracked and ignored files.
pub fn workspace_view(dir: &Path) -> BTreeMap<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in rd.flatten() {
            let path = entry.path();
            let rel = path
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .to_string();
            if rel == ".git" {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let v = if meta.file_type().is_symlink() {
                format!("link {:?}", std::fs::read_link(&path).unwrap_or_default())
            } else if meta.is_dir() {
                stack.push(path);
                continue;
            } else {
                let bytes = std::fs::read(&path).unwrap_or_default();
                format!("{:o} {}", meta.permissions().mode() & 0o111, hash(&bytes))
            };
            out.insert(format!("path {rel}"), v);
        }
    }
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

/// A content fingerprint (FNV-1a 64) plus the length, to keep views small.
fn hash(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}/{}", bytes.len())
}

/// Makes the agent's mess in `id`: `files` extra untracked files, plus every kind of
/// state eviction must keep.
async fn agent_mess(env: &TestEnv, id: &str, files: u64, tag: u64) {
    let script = format!(
        "set -e
        echo a{tag} > a.txt && git add a.txt && git commit -qm 'on the branch'
        git branch side{tag} && git checkout -q side{tag}
        echo s > s.txt && git add s.txt && git commit -qm side && git tag -a t{tag} -m tag && git tag light{tag}
        git checkout -q -
        echo stash1 > f.txt && git stash push -q -m one
        echo stash2 > g.txt && git stash push -q -m two
        echo staged > f.txt && git add f.txt && echo unstaged > f.txt
        echo new > staged-new.txt && git add staged-new.txt
        rm g.txt
        mkdir -p many && i=0; while [ $i -lt {files} ]; do echo $i-{tag} > many/f$i; i=$((i+1)); done
        printf 'bin\\000ary' > many/b.bin
        echo kept > small.log
        printf '#!/bin/sh\\n' > run.sh && chmod +x run.sh
        ln -s f.txt link"
    );
    let out = env.grove(&["exec", id, "--", "sh", "-c", &script]).await;
    assert!(out.status.success(), "{:?}", text(&out));
}

fn far() -> String {
    (chrono::Utc::now() + chrono::Duration::seconds(3600)).to_rfc3339()
}

async fn state_of(env: &TestEnv, id: &str) -> String {
    sqlx::query_scalar("SELECT state FROM grove.sandbox_workspaces WHERE id::text = $1")
        .bind(id)
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

/// A fresh edit workspace with the mess made, released; its id, path and view.
async fn prepared(
    env: &TestEnv,
    url: &str,
    n: u64,
    files: u64,
) -> (String, PathBuf, BTreeMap<String, String>) {
    let conv = format!("c{n}");
    let ws = env
        .grove_json(&acquire_args(url, "edit", &["--conversation", &conv]))
        .await;
    let id = ws["id"].as_str().unwrap().to_string();
    let dir = PathBuf::from(ws["local_path"].as_str().unwrap());
    agent_mess(env, &id, files, n).await;
    let view = workspace_view(&dir);
    let out = env.grove(&["workspace", "release", &id]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    (id, dir, view)
}

/// Compares the restored workspace with what it was; a difference is a loss.
fn compare(figures: &mut Figures, id: &str, dir: &Path, before: &BTreeMap<String, String>) {
    let after = workspace_view(dir);
    let diffs: Vec<&String> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .collect();
    if !diffs.is_empty() {
        figures.lost += 1;
        figures.note(format!("workspace {id} came back different in {diffs:?}"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn saved_work_identity_everything_an_agent_made_comes_back() {
    let env = env_or_skip!("saved_work_identity_everything_an_agent_made_comes_back");
    let url = env.fixture_repo(
        "fixture",
        &[
            ("f.txt", "one\n"),
            ("g.txt", "g\n"),
            (".gitignore", "*.log\n"),
        ],
    );
    let mut fleet = Fleet::new(&env, WORKER, 2);
    fleet.spawn().await;
    let mut figures = Figures::default();
    for n in 0..IDENTITY_TRIALS * scale() {
        let (id, dir, before) = prepared(&env, &url, n, 50 * (n + 1)).await;
        let out = env.grove(&["evict", "--now", &far(), "--json"]).await;
        assert!(out.status.success(), "{:?}", text(&out));
        figures.trials += 1;
        if state_of(&env, &id).await != "evicted" || dir.exists() {
            figures.lost += 1;
            figures.note(format!("workspace {id} was not evicted"));
            continue;
        }
        let out = env.grove(&["workspace", "restore", &id]).await;
        assert!(out.status.success(), "{:?}", text(&out));
        compare(&mut figures, &id, &dir, &before);
    }
    replay_ok(&env, &mut figures).await;
    figures.finish("saved_work_identity");
}

#[tokio::test(flavor = "multi_thread")]
async fn saved_work_kill_an_eviction_or_restore_killed_anywhere_loses_nothing() {
    let env = env_or_skip!("saved_work_kill_an_eviction_or_restore_killed_anywhere_loses_nothing");
    let mut rng = Rng::new("saved_work_kill");
    let url = env.fixture_repo(
        "fixture",
        &[
            ("f.txt", "one\n"),
            ("g.txt", "g\n"),
            (".gitignore", "*.log\n"),
        ],
    );
    let mut fleet = Fleet::new(&env, WORKER, 2);
    fleet.spawn().await;
    let mut figures = Figures::default();
    for n in 0..KILL_TRIALS * scale() {
        let (id, dir, before) = prepared(&env, &url, n, 2000).await;
        figures.trials += 1;
        // Kill the worker somewhere inside the eviction, then let a fresh one repair.
        let evict = env.command(&["evict", "--now", &far(), "--json"]).output();
        let evict = tokio::spawn(evict);
        tokio::time::sleep(Duration::from_millis(rng.range(50, 1500))).await;
        fleet.kill9(0).await;
        figures.injected += 1;
        fleet.spawn().await;
        let _ = evict.await;
        let out = env.grove(&["evict", "--now", &far(), "--json"]).await;
        assert!(out.status.success(), "{:?}", text(&out));
        // Kill it again somewhere inside the restore, then restore with a fresh one.
        let restore = tokio::spawn(env.command(&["workspace", "restore", &id]).output());
        tokio::time::sleep(Duration::from_millis(rng.range(20, 1200))).await;
        fleet.kill9(0).await;
        figures.injected += 1;
        fleet.spawn().await;
        let _ = restore.await;
        let mut restored = false;
        for _ in 0..20 {
            let out = env.grove(&["workspace", "restore", &id]).await;
            if out.status.success() {
                restored = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if !restored || state_of(&env, &id).await != "ready" {
            figures.lost += 1;
            figures.note(format!("workspace {id} could not be restored"));
            continue;
        }
        compare(&mut figures, &id, &dir, &before);
    }
    crate::leaked_dirs(&env, &mut figures).await;
    replay_ok(&env, &mut figures).await;
    figures.finish("saved_work_kill");
}
