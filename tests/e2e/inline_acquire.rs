//! Warm acquires and second ensures run inline (ADR 34) by a real `grove serve` and its
//! in-process worker: they answer what the queued path answers (a `--no-worker` server
//! of the same node queues the same commands to that worker) with the same events; an
//! evicted workspace's acquire still restores through the queue; another user's key
//! never reaches a workspace that is not theirs; bad input changes nothing; a retried
//! idempotency key answers its first outcome once, on either path; `replay --verify`
//! stays exact.

use grove_e2e::http::{Server, ALICE, BOB};
use grove_e2e::TestEnv;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::env_or_skip;

pub(crate) fn fixture(env: &TestEnv) -> String {
    env.fixture_repo("fixture", &[("src/lib.rs", "pub fn alpha() {}\n")])
}

pub(crate) fn session(url: &str, conversation: &str) -> Value {
    json!({
        "project_id": "p1", "repo_name": "o/fixture", "repo_url": url,
        "base_ref": "main", "mode": "edit", "conversation_id": conversation,
    })
}

pub(crate) fn ensure(url: &str) -> Value {
    json!({"repo_name": "o/fixture", "repo_url": url})
}

fn with_key(mut body: Value, key: &str) -> Value {
    body["idempotency_key"] = json!(key);
    body
}

/// An answer without what differs between two calls of the same command: its command
/// id and the times it stamps.
pub(crate) fn stable(mut answer: Value) -> Value {
    answer.as_object_mut().unwrap().remove("command_id");
    for row in ["workspace", "repo_cache"] {
        if let Some(row) = answer.get_mut(row).and_then(Value::as_object_mut) {
            for volatile in ["last_used_at", "updated_at"] {
                row.remove(volatile);
            }
        }
    }
    answer
}

/// (kind, status, started in the transaction that inserted it) of every command of
/// `kind`, in the ledger's order.
async fn ledger(env: &TestEnv, kind: &str) -> Vec<(String, bool)> {
    sqlx::query_as(
        "SELECT status, enqueued_at = started_at FROM grove.commands
         WHERE kind = $1 ORDER BY enqueued_at",
    )
    .bind(kind)
    .fetch_all(&env.pool)
    .await
    .unwrap()
}

/// Each event of `event_type`: its payload and its metadata without the command id.
async fn events(env: &TestEnv, event_type: &str) -> Vec<(Value, Value)> {
    let rows: Vec<(Value, Value)> = sqlx::query_as(
        "SELECT payload, metadata - 'command_id' FROM grove.events
         WHERE event_type = $1 ORDER BY position",
    )
    .bind(event_type)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    rows
}

async fn events_of_command(env: &TestEnv, command_id: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT event_type FROM grove.events WHERE command_id = $1::uuid ORDER BY position",
    )
    .bind(command_id)
    .fetch_all(&env.pool)
    .await
    .unwrap()
}

pub(crate) async fn replay_ok(env: &TestEnv) {
    let verify = env.grove(&["replay", "--verify"]).await;
    assert!(verify.status.success(), "{:?}", grove_e2e::text(&verify));
}

#[tokio::test(flavor = "multi_thread")]
async fn warm_acquires_and_ensures_answer_inline_as_the_queue_does_with_the_same_events() {
    let env = env_or_skip!(
        "warm_acquires_and_ensures_answer_inline_as_the_queue_does_with_the_same_events"
    );
    let url = fixture(&env);
    let home = Server::start(&env).await;
    // The same node without a worker: every command it receives takes the queue, to
    // the first server's worker.
    let queue = Server::start_args(&env, &["--no-worker"], &[]).await;
    let created = home.acquire(ALICE, &url, "c1").await;

    let (status, inline) = home.post("/v1/sessions", ALICE, session(&url, "c1")).await;
    assert_eq!(status, StatusCode::OK, "{inline}");
    let (status, queued) = queue.post("/v1/sessions", ALICE, session(&url, "c1")).await;
    assert_eq!(status, StatusCode::OK, "{queued}");
    assert_eq!(inline["session_id"], created.as_str());
    assert_eq!(
        stable(inline),
        stable(queued),
        "the same answer on both paths"
    );

    let (status, inline) = home
        .post("/v1/repo-caches/ensure", ALICE, ensure(&url))
        .await;
    assert_eq!(status, StatusCode::OK, "{inline}");
    let (status, queued) = queue
        .post("/v1/repo-caches/ensure", ALICE, ensure(&url))
        .await;
    assert_eq!(status, StatusCode::OK, "{queued}");
    assert_eq!(
        stable(inline),
        stable(queued),
        "the same answer on both paths"
    );

    // The create and the queued acquire went through a claim; the warm acquire and
    // ensure answered by `home` ran inline, with their job closed.
    let acquires = ledger(&env, "acquire_workspace").await;
    let succeeded = |inline: bool| ("succeeded".to_string(), inline);
    assert_eq!(
        acquires,
        vec![succeeded(false), succeeded(true), succeeded(false)]
    );
    let ensures = ledger(&env, "ensure_repo_cache").await;
    assert_eq!(ensures, vec![succeeded(true), succeeded(false)]);
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM apalis.jobs WHERE status NOT IN ('Done', 'Killed')",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(open, 0, "no job left open");

    // The same events, with the same metadata but for the command id.
    // (The create cloned the cache: `repo_cache.created`, no `repo_cache.used`.)
    for event_type in ["workspace.acquired", "repo_cache.used"] {
        let seen = events(&env, event_type).await;
        assert_eq!(seen.len(), 2, "{event_type}: {seen:?}");
        assert_eq!(seen[0], seen[1], "{event_type}");
    }
    replay_ok(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_evicted_workspace_is_restored_by_its_acquire_through_the_queue() {
    let env = env_or_skip!("an_evicted_workspace_is_restored_by_its_acquire_through_the_queue");
    let url = fixture(&env);
    let home = Server::start_with(
        &env,
        &[
            ("GROVE_EVICT_SCHEDULE", "off"),
            ("GROVE_EVICT_MEASURE_EVERY", "0"),
            ("GROVE_ALLOW_CLOCK_OVERRIDE", "1"),
            ("GROVE_DISK_BUDGET", "1"),
            ("GROVE_PRESSURE_GRACE", "60"),
        ],
    )
    .await;
    let ws = home.acquire(ALICE, &url, "c1").await;
    let (status, body) = home
        .post(&format!("/v1/sessions/{ws}/release"), ALICE, json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let out = env.grove(&["evict", "--now", &later, "--json"]).await;
    assert!(out.status.success(), "{:?}", grove_e2e::text(&out));
    let (_, row) = home.get(&format!("/v1/workspaces/{ws}"), ALICE).await;
    assert_eq!(row["state"], "evicted", "{row}");

    let (status, restored) = home.post("/v1/sessions", ALICE, session(&url, "c1")).await;
    assert_eq!(status, StatusCode::OK, "{restored}");
    assert_eq!(restored["session_id"], ws.as_str());
    assert_eq!(restored["workspace"]["state"], "ready", "{restored}");
    let command = restored["command_id"].as_str().unwrap();
    let restore = events_of_command(&env, command).await;
    assert!(
        restore.iter().any(|e| e == "workspace.restored")
            && !restore.iter().any(|e| e == "workspace.acquired"),
        "restored, not merely re-acquired: {restore:?}"
    );
    assert!(std::path::Path::new(restored["workspace"]["local_path"].as_str().unwrap()).is_dir());
    // Restored through the queue; the next acquire finds it whole and runs inline.
    let (status, warm) = home.post("/v1/sessions", ALICE, session(&url, "c1")).await;
    assert_eq!(status, StatusCode::OK, "{warm}");
    assert_eq!(
        events_of_command(&env, warm["command_id"].as_str().unwrap()).await,
        ["workspace.acquired"]
    );
    let acquires = ledger(&env, "acquire_workspace").await;
    let inline: Vec<bool> = acquires.iter().map(|(_, inline)| *inline).collect();
    assert_eq!(
        inline,
        [false, false, true],
        "create, restore, warm: {acquires:?}"
    );
    replay_ok(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn another_users_acquire_never_reaches_a_workspace_and_bad_input_changes_nothing() {
    let env = env_or_skip!(
        "another_users_acquire_never_reaches_a_workspace_and_bad_input_changes_nothing"
    );
    let url = fixture(&env);
    let home = Server::start(&env).await;
    let alices = home.acquire(ALICE, &url, "c1").await;
    let (status, warm) = home.post("/v1/sessions", ALICE, session(&url, "c1")).await;
    assert_eq!(status, StatusCode::OK, "{warm}");
    assert_eq!(warm["session_id"], alices.as_str());

    // Bob's acquire of the same project and conversation is his own key: a new
    // workspace of his, made through the queue, never Alice's.
    let bobs = home.acquire(BOB, &url, "c1").await;
    assert_ne!(bobs, alices);
    let (status, again) = home.post("/v1/sessions", BOB, session(&url, "c1")).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["session_id"], bobs.as_str());
    assert_eq!(again["workspace"]["user_id"], "bob", "{again}");
    let acquired: Vec<(Value, Value)> = events(&env, "workspace.acquired").await;
    assert_eq!(acquired.len(), 2);
    assert_eq!(acquired[1].0["workspace_id"], bobs.as_str());
    assert_eq!(acquired[1].1["correlation"]["user_id"], "bob");

    // Bad input: a typed 4xx, nothing recorded.
    let count = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM grove.commands")
            .fetch_one(&env.pool)
            .await
            .unwrap()
    };
    let before = count().await;
    let mut no_conversation = session(&url, "c1");
    no_conversation
        .as_object_mut()
        .unwrap()
        .remove("conversation_id");
    let mut bad_repo = session(&url, "c1");
    bad_repo["repo_name"] = json!("../etc");
    let mut bad_ref = session(&url, "c1");
    bad_ref["base_ref"] = json!("main..x");
    for (what, body) in [
        ("no conversation", no_conversation),
        ("repo name", bad_repo),
        ("ref", bad_ref),
        ("bad key", with_key(session(&url, "c1"), "")),
    ] {
        let (status, body) = home.post("/v1/sessions", ALICE, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {body}");
    }
    let mut bad_ensure = ensure(&url);
    bad_ensure["repo_name"] = json!("no-slash");
    let (status, body) = home.post("/v1/repo-caches/ensure", ALICE, bad_ensure).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // A local repository outside the allowed roots is refused before anything runs,
    // though a workspace of the key exists.
    let mut outside = session(&url, "c1");
    outside["repo_url"] = json!("file:///etc");
    let (status, body) = home.post("/v1/sessions", ALICE, outside).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(count().await, before, "nothing recorded");
    assert_eq!(events(&env, "workspace.acquired").await.len(), 2);
    // Without a token, no key is anyone's.
    let resp = home
        .http
        .post(home.url("/v1/sessions"))
        .json(&session(&url, "c1"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    replay_ok(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retried_idempotency_key_answers_its_first_outcome_once_on_either_path() {
    let env =
        env_or_skip!("a_retried_idempotency_key_answers_its_first_outcome_once_on_either_path");
    let url = fixture(&env);
    let home = Server::start(&env).await;
    let queue = Server::start_args(&env, &["--no-worker"], &[]).await;
    home.acquire(ALICE, &url, "c1").await;

    // Inline, then retried inline and through the queue: one event, the first answer.
    let body = with_key(session(&url, "c1"), "k-acquire");
    let (status, first) = home.post("/v1/sessions", ALICE, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    for server in [&home, &queue, &home] {
        let (status, again) = server.post("/v1/sessions", ALICE, body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{again}");
        assert_eq!(again, first, "the first outcome, times and all");
    }
    let command = first["command_id"].as_str().unwrap();
    assert_eq!(
        events_of_command(&env, command).await,
        ["workspace.acquired"]
    );
    // The same key for another acquire is refused, not answered with the first's.
    let other = with_key(session(&url, "c2"), "k-acquire");
    let (status, body) = home.post("/v1/sessions", ALICE, other).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    // Queued first, then retried inline.
    let body = with_key(session(&url, "c1"), "k-queued");
    let (status, first) = queue.post("/v1/sessions", ALICE, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, again) = home.post("/v1/sessions", ALICE, body).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again, first);
    let command = first["command_id"].as_str().unwrap();
    assert_eq!(
        events_of_command(&env, command).await,
        ["workspace.acquired"]
    );

    // An ensure, retried.
    let body = with_key(ensure(&url), "k-ensure");
    let (status, first) = home
        .post("/v1/repo-caches/ensure", ALICE, body.clone())
        .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, again) = home.post("/v1/repo-caches/ensure", ALICE, body).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again, first);
    let command = first["command_id"].as_str().unwrap();
    assert_eq!(events_of_command(&env, command).await, ["repo_cache.used"]);
    // The same key under another user is another command: Bob's ensure is his own.
    let (status, bobs) = home
        .post(
            "/v1/repo-caches/ensure",
            BOB,
            with_key(ensure(&url), "k-ensure"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{bobs}");
    assert_ne!(bobs["command_id"], first["command_id"]);
    replay_ok(&env).await;
}
