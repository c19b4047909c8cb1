//! Scenario `inline_kill`: `grove serve` is SIGKILLed while its in-process worker runs
//! file writes (in one workspace) and an exec (in another) inline (ADR 31), then started
//! again. The exec it was running
//! ends `worker_lost` and never runs again, also when retried with its key; every
//! acknowledged write survives with exactly one event; no write is half-recorded (an
//! event whose file is not what it says); a write cut off by the kill, retried with its
//! key, completes; no command is left undecided; replay verifies. Warm acquires of the
//! writes' workspace run inline beside them (ADR 34): each answered one is recorded
//! with exactly one `workspace.acquired`, one cut off by the kill has at most one and,
//! retried with its key, answers that workspace with one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use grove_e2e::TestEnv;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::server::{Server, ALICE};
use crate::{env_or_skip, replay_ok, scale, Figures, Rng};

/// Kills in the default run; `GROVE_FAULTS_SCALE` multiplies it.
const KILLS: u64 = 3;
/// A lost worker is noticed after this many seconds of silence.
const SERVER_ENV: &[(&str, &str)] = &[("GROVE_WORKER_LOST_AFTER", "3")];

/// What a write's client saw: answered (200), or no answer (the server died).
type Answers = Arc<Mutex<HashMap<String, bool>>>;

fn content_of(path: &str) -> String {
    format!("the content of {path}\n")
}

/// How a client reaches the server (without owning its process).
#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    fn of(server: &Server) -> Self {
        Self {
            http: server.http.clone(),
            base: server.base.clone(),
        }
    }
}

async fn write(client: &Client, ws: &str, path: &str) -> Option<StatusCode> {
    let resp = client
        .http
        .post(format!(
            "{}/v1/workspaces/{ws}/tools/write_file",
            client.base
        ))
        .bearer_auth(ALICE)
        .header("Idempotency-Key", format!("write-{path}"))
        .json(&json!({"path": path, "content": content_of(path)}))
        .send()
        .await
        .ok()?;
    let status = resp.status();
    resp.bytes().await.ok()?;
    Some(status)
}

/// Writes files one after another (as an agent does) until the server stops answering.
async fn writer(client: Client, ws: String, round: u64, answers: Answers) {
    for i in 0.. {
        let path = format!("w-{round}-{i}.txt");
        answers.lock().unwrap().insert(path.clone(), false);
        match write(&client, &ws, &path).await {
            Some(StatusCode::OK) => {
                answers.lock().unwrap().insert(path, true);
            }
            Some(other) => panic!("a write answered {other}"),
            None => return,
        }
    }
}

fn exec_body(round: u64) -> Value {
    json!({
        "argv": ["sh", "-c", format!("sleep 4; echo {round} >> ran.txt")],
        "idempotency_key": format!("exec-{round}"),
    })
}

/// The ledger status and error kind of the exec of `round`, once decided.
async fn exec_outcome(env: &TestEnv, round: u64, patience: Duration) -> Option<(String, String)> {
    let deadline = Instant::now() + patience;
    let marker = format!("%echo {round} >>%");
    while Instant::now() < deadline {
        let row: Option<(String, Option<String>)> = sqlx::query_as(
            "SELECT status, error->>'kind' FROM grove.commands
             WHERE kind = 'exec' AND payload->'argv'->>2 LIKE $1",
        )
        .bind(&marker)
        .fetch_optional(&env.pool)
        .await
        .unwrap();
        if let Some((status, kind)) = row.filter(|(s, _)| s == "succeeded" || s == "failed") {
            return Some((status, kind.unwrap_or_default()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

async fn wait_for_exec_start(env: &TestEnv, started: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while env.count_events("exec.started").await < started {
        assert!(Instant::now() < deadline, "the exec never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks every write of the round once the server is back: an answered write is there
/// with one event; one cut off has at most one event, which matches its file; retried
/// with its key it completes.
async fn account_writes(
    env: &TestEnv,
    server: &Server,
    ws: &str,
    dir: &std::path::Path,
    answers: &HashMap<String, bool>,
    figures: &mut Figures,
) {
    for (path, answered) in answers {
        figures.trials += 1;
        let hashes: Vec<String> = sqlx::query_scalar(
            "SELECT payload->>'sha256' FROM grove.events
             WHERE event_type = 'workspace.file_written' AND payload->>'path' = $1",
        )
        .bind(path)
        .fetch_all(&env.pool)
        .await
        .unwrap();
        let on_disk = std::fs::read_to_string(dir.join(path)).ok();
        let whole = Some(content_of(path));
        let want = hex::encode(Sha256::digest(content_of(path).as_bytes()));
        if hashes.len() > 1 {
            figures.duplicated += 1;
            figures.note(format!("{path}: {} events", hashes.len()));
        }
        if hashes.iter().any(|h| *h != want) || (!hashes.is_empty() && on_disk != whole) {
            figures.lost += 1;
            figures.note(format!("{path}: an event that its file does not match"));
        }
        if *answered && (hashes.is_empty() || on_disk != whole) {
            figures.lost += 1;
            figures.note(format!("{path}: acknowledged, then gone ({on_disk:?})"));
        }
        if !answered {
            // Cut off by the kill: the retry with the same key completes it.
            let retried = write(&Client::of(server), ws, path).await;
            let now = std::fs::read_to_string(dir.join(path)).ok();
            if retried != Some(StatusCode::OK) || now != whole {
                figures.lost += 1;
                figures.note(format!(
                    "{path}: its retry answered {retried:?}, file {now:?}"
                ));
            }
        }
    }
}

/// The session body of the writes' workspace, `c2`, with an idempotency key.
fn warm_acquire_body(url: &str, key: &str) -> Value {
    json!({"project_id": "p1", "repo_name": "o/fixture", "repo_url": url, "base_ref": "main",
           "mode": "edit", "conversation_id": "c2", "idempotency_key": key})
}

/// Acquires `c2` again and again, each under a key of its own, until the server stops
/// answering; records each key and whether it was answered with that workspace.
async fn acquirer(client: Client, url: String, ws: String, round: u64, answers: Answers) {
    for i in 0.. {
        let key = format!("acquire-{round}-{i}");
        answers.lock().unwrap().insert(key.clone(), false);
        let sent = client
            .http
            .post(format!("{}/v1/sessions", client.base))
            .bearer_auth(ALICE)
            .json(&warm_acquire_body(&url, &key))
            .send()
            .await;
        let Ok(resp) = sent else { return };
        let status = resp.status();
        let Ok(body) = resp.json::<Value>().await else {
            return;
        };
        assert_eq!(status, StatusCode::OK, "a warm acquire answered {body}");
        if body["session_id"] == ws.as_str() {
            answers.lock().unwrap().insert(key, true);
        }
    }
}

/// Checks every warm acquire of the round once the server is back: one answered has
/// exactly one `workspace.acquired` under its command id; one cut off has at most one,
/// and its retry answers the workspace, leaving exactly one.
async fn account_acquires(
    env: &TestEnv,
    server: &Server,
    url: &str,
    ws: &str,
    answers: &HashMap<String, bool>,
    figures: &mut Figures,
) {
    let scope = grove_core::idempotency::user_scope("alice");
    for (key, answered) in answers {
        figures.trials += 1;
        let command = grove_core::idempotency::command_id_for_key(&scope, key);
        let acquired = || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM grove.events
                 WHERE event_type = 'workspace.acquired' AND command_id = $1",
            )
            .bind(command)
            .fetch_one(&env.pool)
            .await
            .unwrap()
        };
        let seen = acquired().await;
        if seen > 1 {
            figures.duplicated += 1;
            figures.note(format!("{key}: {seen} events"));
        }
        if *answered && seen != 1 {
            figures.lost += 1;
            figures.note(format!("{key}: answered, then {seen} events"));
        }
        if !answered {
            let retried = server
                .call(
                    Method::POST,
                    "/v1/sessions",
                    Some(ALICE),
                    Some(&warm_acquire_body(url, key)),
                )
                .await;
            let ok = retried
                .as_ref()
                .is_some_and(|(s, b)| *s == StatusCode::OK && b.contains(ws));
            if !ok || acquired().await != 1 {
                figures.lost += 1;
                figures.note(format!("{key}: its retry answered {retried:?}"));
            }
        }
    }
}

/// An edit session of `conversation`: its workspace id and directory.
async fn acquire(server: &Server, url: &str, conversation: &str) -> (String, std::path::PathBuf) {
    let (status, body) = server
        .call(
            Method::POST,
            "/v1/sessions",
            Some(ALICE),
            Some(
                &json!({"project_id": "p1", "repo_name": "o/fixture", "repo_url": url,
                         "base_ref": "main", "mode": "edit", "conversation_id": conversation}),
            ),
        )
        .await
        .expect("acquire");
    assert_eq!(status, StatusCode::OK, "{body}");
    let session: Value = serde_json::from_str(&body).unwrap();
    let ws = session["session_id"].as_str().unwrap().to_string();
    let dir = session["workspace"]["local_path"].as_str().unwrap().into();
    (ws, dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn inline_kill_keeps_acknowledged_writes_and_never_reruns_an_exec() {
    let env = env_or_skip!("inline_kill_keeps_acknowledged_writes_and_never_reruns_an_exec");
    let mut rng = Rng::new("inline_kill");
    let url = env.fixture_repo("fixture", &[("README.md", "fixture\n")]);
    let mut server = Server::start(&env, &[], SERVER_ENV).await;
    // The exec runs in one workspace (holding its lock), the writes in the other.
    let (ws, dir) = acquire(&server, &url, "c1").await;
    let (files, files_dir) = acquire(&server, &url, "c2").await;
    let kills = KILLS * scale();
    let mut figures = Figures {
        injected: kills,
        ..Default::default()
    };

    for round in 0..kills {
        let client = Client::of(&server);
        let exec = {
            let (client, ws) = (client.clone(), ws.clone());
            tokio::spawn(async move {
                let url = format!("{}/v1/workspaces/{ws}/exec", client.base);
                let sent = client
                    .http
                    .post(url)
                    .bearer_auth(ALICE)
                    .json(&exec_body(round));
                sent.send().await.map(|r| r.status()).ok()
            })
        };
        wait_for_exec_start(&env, round as i64 + 1).await;
        let answers: Answers = Arc::default();
        let writes = tokio::spawn(writer(
            client.clone(),
            files.clone(),
            round,
            answers.clone(),
        ));
        let acquired: Answers = Arc::default();
        let acquires = tokio::spawn(acquirer(
            client,
            url.clone(),
            files.clone(),
            round,
            acquired.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(rng.range(100, 1500))).await;
        server.kill9().await;
        let _ = (exec.await, writes.await);
        if let Err(e) = acquires.await {
            // A warm acquire answered anything but its workspace while the server ran.
            std::panic::resume_unwind(e.into_panic());
        }
        server = Server::start(&env, &[], SERVER_ENV).await;

        // The exec was running: the restarted server's worker ends it as worker_lost.
        figures.trials += 1;
        match exec_outcome(&env, round, Duration::from_secs(90)).await {
            Some((status, kind)) if status == "failed" && kind == "worker_lost" => {}
            other => {
                figures.lost += 1;
                figures.note(format!("exec {round}: {other:?}"));
            }
        }
        // Retried with its key, it answers that outcome and does not run.
        let retried = server
            .call(
                Method::POST,
                &format!("/v1/workspaces/{ws}/exec"),
                Some(ALICE),
                Some(&exec_body(round)),
            )
            .await;
        if !retried
            .as_ref()
            .is_some_and(|(_, b)| b.contains("worker_lost"))
        {
            figures.note(format!("exec {round} retried: {retried:?}"));
            figures.lost += 1;
        }
        let answers = answers.lock().unwrap().clone();
        account_writes(&env, &server, &files, &files_dir, &answers, &mut figures).await;
        let acquired = acquired.lock().unwrap().clone();
        account_acquires(&env, &server, &url, &files, &acquired, &mut figures).await;
    }
    // No exec ever reached its end (each was killed, none re-run).
    tokio::time::sleep(Duration::from_secs(5)).await;
    if let Ok(ran) = std::fs::read_to_string(dir.join("ran.txt")) {
        figures.duplicated += ran.lines().count() as u64;
        figures.note(format!("execs that ran after all: {ran:?}"));
    }
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM grove.commands WHERE status NOT IN ('succeeded', 'failed')",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    if open > 0 {
        figures.leaked += open as u64;
        figures.note(format!("{open} commands left undecided"));
    }
    // The warm acquires ran inline (their ledger rows started as they were inserted).
    let inline_acquires: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM grove.commands
         WHERE kind = 'acquire_workspace' AND enqueued_at = started_at",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert!(inline_acquires > 0, "no warm acquire ran inline");
    replay_ok(&env, &mut figures).await;
    figures.finish("inline_kill");
}
