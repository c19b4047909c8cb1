//! Scenario `contention`: many clients acquiring one key, writers and readers on one
//! workspace, acquire racing destroy, exec racing release. One key gives one workspace;
//! writes are serialized and reads run together (shown by the commands' own output: a
//! read-modify-write counter that only adds up when writes never interleave, and
//! timestamps printed by each command, compared as intervals); races end decided and
//! leave records and directories that agree.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use grove_e2e::{acquire_args, TestEnv};
use uuid::Uuid;

use crate::{
    account_commands, drain, env_or_skip, leaked_dirs, replay_ok, scale, submit_until_decided,
    Decided, Figures, Fleet,
};

const ROUNDS: u64 = 2;

#[derive(Default)]
struct Submitter {
    ids: Mutex<Vec<Uuid>>,
    undecided: AtomicU64,
}

impl Submitter {
    async fn run(&self, env: &TestEnv, args: &[&str]) -> Option<Decided> {
        let id = Uuid::now_v7();
        self.ids.lock().unwrap().push(id);
        let d = submit_until_decided(env, args, id, &[], Duration::from_secs(180)).await;
        if d.is_none() {
            self.undecided.fetch_add(1, Ordering::SeqCst);
        }
        d
    }
}

/// `[start, end]` in nanoseconds from an exec's stdout of two `date +%s%N` lines.
fn interval(d: &Decided) -> Option<(u128, u128)> {
    let out = d.field("stdout")?.as_str()?;
    let mut it = out.lines().filter_map(|l| l.trim().parse::<u128>().ok());
    Some((it.next()?, it.next()?))
}

fn overlap(a: (u128, u128), b: (u128, u128)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

#[tokio::test(flavor = "multi_thread")]
async fn contention_gives_one_workspace_per_key_serial_writes_and_decided_races() {
    let env =
        env_or_skip!("contention_gives_one_workspace_per_key_serial_writes_and_decided_races");
    let url = env.fixture_repo("fixture", &[("README.md", "fixture\n")]);
    let mut fleet = Fleet::new(&env, &[], 8);
    fleet.spawn().await;
    fleet.spawn().await;
    let s = Submitter::default();
    let mut figures = Figures::default();
    let rounds = ROUNDS * scale();
    let mut reads_overlapped = 0;

    for round in 0..rounds {
        // Many clients, one key: one workspace.
        let conv = format!("same-{round}");
        let args = acquire_args(&url, "edit", &["--conversation", &conv]);
        let acquired = futures::future::join_all((0..10).map(|_| s.run(&env, &args))).await;
        figures.injected += 10;
        let ids: std::collections::BTreeSet<String> = acquired
            .iter()
            .flatten()
            .filter(|d| d.succeeded())
            .filter_map(|d| d.field("id").and_then(|v| v.as_str()).map(str::to_string))
            .collect();
        if ids.len() != 1 {
            figures.duplicated += ids.len().saturating_sub(1) as u64;
            figures.note(format!("one key gave workspaces {ids:?}"));
        }
        let Some(ws) = ids.into_iter().next() else {
            continue;
        };

        // Writers and readers on that workspace, all at once.
        let writer = [
            "exec", &ws, "--kind", "write", "--", "sh", "-c",
            "date +%s%N; n=$(cat counter 2>/dev/null || echo 0); sleep 0.2; echo $((n+1)) > counter; date +%s%N",
        ];
        let reader = [
            "exec",
            &ws,
            "--kind",
            "read",
            "--",
            "sh",
            "-c",
            "date +%s%N; sleep 1; date +%s%N",
        ];
        // Four writers among six readers, interleaved.
        let pattern = [
            true, false, false, true, false, false, true, false, true, false,
        ];
        let mut jobs = Vec::new();
        for is_write in pattern {
            let args: &[&str] = if is_write { &writer } else { &reader };
            let (s, env) = (&s, &env);
            jobs.push(async move { (is_write, s.run(env, args).await) });
        }
        let results = futures::future::join_all(jobs).await;
        figures.injected += results.len() as u64;
        let mut w_iv = Vec::new();
        let mut r_iv = Vec::new();
        for (is_write, d) in &results {
            let Some(d) = d.as_ref().filter(|d| d.succeeded()) else {
                figures.lost += 1;
                figures.note(format!("an exec on {ws} did not succeed: {d:?}"));
                continue;
            };
            match interval(d) {
                Some(iv) if *is_write => w_iv.push(iv),
                Some(iv) => r_iv.push(iv),
                None => figures.note(format!("no timestamps in {:?}", d.result)),
            }
        }
        let counted = std::fs::read_to_string(
            std::path::Path::new(
                &sqlx::query_scalar::<_, String>(
                    "SELECT local_path FROM grove.sandbox_workspaces WHERE id = $1::uuid",
                )
                .bind(&ws)
                .fetch_one(&env.pool)
                .await
                .unwrap(),
            )
            .join("counter"),
        )
        .unwrap_or_default();
        if counted.trim() != w_iv.len().to_string() {
            figures.lost += 1;
            figures.note(format!(
                "{} serialized writes left the counter at {counted:?}",
                w_iv.len()
            ));
        }
        for (i, a) in w_iv.iter().enumerate() {
            for b in w_iv.iter().skip(i + 1).chain(r_iv.iter()) {
                if overlap(*a, *b) {
                    figures.duplicated += 1;
                    figures.note(format!("a write {a:?} overlapped another command {b:?}"));
                }
            }
        }
        for (i, a) in r_iv.iter().enumerate() {
            if r_iv.iter().skip(i + 1).any(|b| overlap(*a, *b)) {
                reads_overlapped += 1;
                break;
            }
        }

        // Exec racing release, then acquire racing destroy, on the same workspace.
        let exec = ["exec", &ws, "--", "sh", "-c", "echo raced >> raced"];
        let release = ["workspace", "release", &ws, "--destroy-runtime"];
        let (a, b) = tokio::join!(s.run(&env, &exec), s.run(&env, &release));
        figures.injected += 2;
        for d in [a, b].iter().flatten() {
            if !d.succeeded() {
                figures.note(format!("exec/release race: {d:?}"));
            }
        }
        let destroy = ["workspace", "destroy", &ws];
        let (a, b) = tokio::join!(s.run(&env, &destroy), s.run(&env, &args));
        figures.injected += 2;
        let _ = (a, b);
        // Whatever order they ran in, the record and the directory agree.
        let row: Option<String> = sqlx::query_scalar(
            "SELECT local_path FROM grove.sandbox_workspaces
              WHERE user_id = 'u1' AND conversation_id = $1",
        )
        .bind(&conv)
        .fetch_optional(&env.pool)
        .await
        .unwrap();
        if let Some(path) = row {
            if !std::path::Path::new(&path).join("README.md").is_file() {
                figures.lost += 1;
                figures.note(format!(
                    "workspace of {conv} has a record but no files at {path}"
                ));
            }
        }
    }
    if reads_overlapped == 0 {
        figures.note("no two reads ever ran at the same time".to_string());
    }
    let ids = s.ids.lock().unwrap().clone();
    figures.trials = ids.len() as u64;
    drain(&env.pool, &ids, Duration::from_secs(60)).await;
    figures.lost += s.undecided.load(Ordering::SeqCst);
    account_commands(&env.pool, &ids, &mut figures).await;
    leaked_dirs(&env, &mut figures).await;
    replay_ok(&env, &mut figures).await;
    drop(fleet);
    figures.finish("contention");
    assert!(reads_overlapped > 0, "reads should run concurrently");
}
