//! Scenario `fencing`: a private Postgres cluster is restarted (`-m immediate`) while
//! mutating execs run on a few workspaces, two clients per workspace competing for its
//! lock. Each command writes its own timeline (start, a tick every 0.1 s, end, with
//! nanosecond timestamps) into the workspace. No two commands of one workspace may
//! overlap in time, every command that reached its end must have its real exit code in
//! the ledger, and none may run twice.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use grove_e2e::TestEnv;
use uuid::Uuid;

use crate::postgres_restart::Cluster;
use crate::{
    account_commands, drain, replay_ok, scale, submit_until_decided, Decided, Figures, Fleet, Rng,
};

/// Restarts in the default run; scaled by `GROVE_FAULTS_SCALE`.
const RESTARTS: u64 = 3;
const WORKSPACES: usize = 2;
const CLIENTS_PER_WORKSPACE: usize = 2;
const CLIENT_ENV: &[(&str, &str)] = &[("GROVE_CLAIM_TIMEOUT", "300")];

/// The command each exec runs: its timeline into `.timeline`, then its exit code.
const SCRIPT: &str = r#"echo "start $FAULT_ID $(date +%s%N)" >> .timeline
i=0
while [ "$i" -lt "$TICKS" ]; do echo "tick $FAULT_ID $(date +%s%N)" >> .timeline; sleep 0.1; i=$((i+1)); done
echo "end $FAULT_ID $(date +%s%N)" >> .timeline
exit "$CODE""#;

/// One exec a client submitted.
struct Submitted {
    workspace: usize,
    marker: String,
    code: i64,
    decided: Option<Decided>,
}

/// What one command wrote into its workspace's timeline.
#[derive(Default)]
struct Span {
    first: u128,
    last: u128,
    starts: u64,
    ended: bool,
}

fn spans(timeline: &str) -> HashMap<String, Span> {
    let mut out: HashMap<String, Span> = HashMap::new();
    for line in timeline.lines() {
        let mut parts = line.split_whitespace();
        let (Some(what), Some(marker), Some(ts)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Ok(ts) = ts.parse::<u128>() else { continue };
        let span = out.entry(marker.to_string()).or_default();
        span.first = if span.first == 0 {
            ts
        } else {
            span.first.min(ts)
        };
        span.last = span.last.max(ts);
        match what {
            "start" => span.starts += 1,
            "end" => span.ended = true,
            _ => {}
        }
    }
    out
}

/// Pairs of commands of one timeline that overlap in time.
fn overlaps(spans: &HashMap<String, Span>) -> Vec<(String, String)> {
    let mut sorted: Vec<(&String, &Span)> = spans.iter().collect();
    sorted.sort_by_key(|(_, s)| s.first);
    let mut found = Vec::new();
    let mut latest: Option<(&String, u128)> = None;
    for (marker, span) in sorted {
        if let Some((prev, until)) = latest {
            if span.first <= until {
                found.push((prev.clone(), marker.clone()));
            }
        }
        if latest.is_none_or(|(_, until)| span.last > until) {
            latest = Some((marker, span.last));
        }
    }
    found
}

async fn acquire(env: &TestEnv, url: &str, n: usize) -> (String, PathBuf) {
    let conversation = format!("fence-{n}");
    let args = grove_e2e::acquire_args(url, "edit", &["--conversation", &conversation]);
    let d = submit_until_decided(
        env,
        &args,
        Uuid::now_v7(),
        CLIENT_ENV,
        Duration::from_secs(120),
    )
    .await
    .filter(|d| d.succeeded())
    .expect("acquiring a workspace for the fencing scenario");
    let id = d.field("id").and_then(|v| v.as_str()).unwrap().to_string();
    let path = d.field("local_path").and_then(|v| v.as_str()).unwrap();
    (id, PathBuf::from(path))
}

/// One client: writing execs on workspace `n` until `stop`.
async fn client(
    env: &TestEnv,
    ws: &str,
    n: usize,
    stop: &AtomicBool,
    out: &Mutex<Vec<(Uuid, Submitted)>>,
) {
    while !stop.load(Ordering::SeqCst) {
        let id = Uuid::now_v7();
        let marker = Uuid::new_v4().simple().to_string();
        let r = Uuid::new_v4().as_u128();
        let (code, ticks) = ((r % 4) as i64, 3 + (r >> 8) % 8);
        let envs = [
            format!("FAULT_ID={marker}"),
            format!("CODE={code}"),
            format!("TICKS={ticks}"),
        ];
        let args = [
            "exec", ws, "--env", &envs[0], "--env", &envs[1], "--env", &envs[2], "--", "sh", "-c",
            SCRIPT,
        ];
        let decided =
            submit_until_decided(env, &args, id, CLIENT_ENV, Duration::from_secs(240)).await;
        out.lock().unwrap().push((
            id,
            Submitted {
                workspace: n,
                marker,
                code,
                decided,
            },
        ));
    }
}

/// Restarts the cluster `restarts` times, each once an exec is running.
async fn restarter(env: &TestEnv, cluster: &Cluster, restarts: u64, rng: &mut Rng) -> u64 {
    let mut inside = 0;
    for _ in 0..restarts {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let running: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM grove.commands WHERE kind = 'exec' AND status = 'running'",
            )
            .fetch_one(&env.pool)
            .await
            .unwrap_or(0);
            if running > 0 {
                inside += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.range(50, 400))).await;
        cluster.stop("immediate");
        tokio::time::sleep(Duration::from_millis(rng.range(0, 1500))).await;
        cluster.start_again();
        tokio::time::sleep(Duration::from_millis(rng.range(2000, 4000))).await;
    }
    inside
}

/// Checks each command against its timeline: real exit codes, no second run.
fn check(
    submitted: &[(Uuid, Submitted)],
    timelines: &[HashMap<String, Span>],
    figures: &mut Figures,
) {
    for (id, s) in submitted {
        let span = timelines[s.workspace].get(&s.marker);
        let Some(d) = &s.decided else { continue }; // counted by account_commands
        let exit = d.field("exit_code").and_then(|c| c.as_i64());
        match span {
            Some(span) if span.starts > 1 => {
                figures.duplicated += span.starts - 1;
                figures.note(format!("{id}: ran {} times", span.starts));
            }
            Some(span) if span.ended && !(d.succeeded() && exit == Some(s.code)) => {
                figures.lost += 1;
                figures.note(format!(
                    "{id}: finished with exit {} but the ledger says {} {:?} exit {exit:?}",
                    s.code, d.status, d.error_kind
                ));
            }
            None if d.succeeded() => {
                figures.lost += 1;
                figures.note(format!("{id}: succeeded without running"));
            }
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn fencing_restarts_inside_mutating_execs_never_overlap_and_keep_exit_codes() {
    let require = std::env::var("GROVE_TEST_REQUIRE_DB").is_ok_and(|v| v == "1");
    let cluster = match Cluster::start() {
        Ok(c) => c,
        Err(why) if !require => {
            eprintln!("skipped fencing: {why}");
            return;
        }
        Err(why) => panic!("fencing: GROVE_TEST_REQUIRE_DB=1 but {why}"),
    };
    let env = TestEnv::on_server(&cluster.url).await;
    let mut rng = Rng::new("fencing");
    let url = env.fixture_repo("fixture", &[("README.md", "fixture\n")]);
    let mut fleet = Fleet::new(&env, &[("GROVE_LOG", "info,grove_workers=debug")], 2);
    for _ in 0..2 {
        fleet.spawn().await;
    }
    let mut workspaces = Vec::new();
    for n in 0..WORKSPACES {
        workspaces.push(acquire(&env, &url, n).await);
    }
    let restarts = RESTARTS * scale();
    let stop = AtomicBool::new(false);
    let submitted = Mutex::new(Vec::new());
    let clients = futures::future::join_all((0..WORKSPACES * CLIENTS_PER_WORKSPACE).map(|c| {
        let n = c % WORKSPACES;
        client(&env, &workspaces[n].0, n, &stop, &submitted)
    }));
    let restarting = async {
        let inside = restarter(&env, &cluster, restarts, &mut rng).await;
        stop.store(true, Ordering::SeqCst);
        inside
    };
    let (_, inside) = tokio::join!(clients, restarting);
    let submitted = submitted.into_inner().unwrap();
    let ids: Vec<Uuid> = submitted.iter().map(|(id, _)| *id).collect();
    drain(&env.pool, &ids, Duration::from_secs(180)).await;

    let mut figures = Figures {
        trials: submitted.len() as u64,
        injected: restarts,
        ..Default::default()
    };
    let timelines: Vec<HashMap<String, Span>> = workspaces
        .iter()
        .map(|(_, path)| {
            spans(&std::fs::read_to_string(path.join(".timeline")).unwrap_or_default())
        })
        .collect();
    let mut overlapping = 0u64;
    for (n, t) in timelines.iter().enumerate() {
        for (a, b) in overlaps(t) {
            overlapping += 1;
            figures.note(format!("workspace {n}: commands {a} and {b} overlap"));
        }
    }
    figures.duplicated += overlapping;
    check(&submitted, &timelines, &mut figures);
    let finished = timelines
        .iter()
        .flat_map(|t| t.values())
        .filter(|s| s.ended)
        .count();
    let stopped = timelines
        .iter()
        .flat_map(|t| t.values())
        .filter(|s| !s.ended)
        .count();
    eprintln!(
        "fencing: {restarts} restarts ({inside} with an exec running), {} execs, {finished} finished, {stopped} stopped part-way, overlaps={overlapping}",
        submitted.len()
    );
    account_commands(&env.pool, &ids, &mut figures).await;
    replay_ok(&env, &mut figures).await;
    // What the workers said about each command a figure counts, for the failure.
    let logs = fleet.all_logs();
    for note in figures.notes.clone() {
        let Some(id) = note
            .split(':')
            .next()
            .filter(|id| Uuid::parse_str(id).is_ok())
        else {
            continue;
        };
        for line in logs.lines().filter(|l| l.contains(id)) {
            eprintln!("fencing: worker log for {id}: {line}");
        }
        let job: Option<(Option<serde_json::Value>, i32, String)> = sqlx::query_as(
            "SELECT j.last_result, j.attempts, j.status FROM apalis.jobs j
               JOIN grove.commands c ON c.job_id = j.id WHERE c.command_id = $1::uuid",
        )
        .bind(id)
        .fetch_optional(&env.pool)
        .await
        .ok()
        .flatten();
        eprintln!("fencing: job of {id}: {job:?}");
    }
    for line in logs.lines().filter(|l| {
        l.contains("handed back") || l.contains("recovered jobs") || l.contains("lease")
    }) {
        eprintln!("fencing: worker log: {line}");
    }
    drop(fleet);
    drop(env);
    drop(cluster);
    figures.finish("fencing");
}
