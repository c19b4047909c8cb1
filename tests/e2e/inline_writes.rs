//! File write tools and execs run inline (ADR 31) by a real `grove serve` and its
//! in-process worker: they answer what the queued path answers with the same events in
//! the same order, a retry with the same command id (on either path) answers the first
//! outcome without running again, another tenant's workspace does not exist for them,
//! and `replay --verify` stays exact. The path rules of inline writes are also the
//! write cases of `paths_that_leave_the_workspace…` in tests/e2e/tools_http.rs, which
//! this server now runs inline.

use grove_e2e::http::{Server, ALICE, BOB};
use grove_e2e::TestEnv;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::env_or_skip;

fn fixture(env: &TestEnv) -> String {
    env.fixture_repo("fixture", &[("src/lib.rs", "pub fn alpha() {}\n")])
}

/// A tool call, with an `Idempotency-Key` when `key` is given.
async fn tool(
    server: &Server,
    token: &str,
    ws: &str,
    name: &str,
    args: Value,
    key: Option<&str>,
) -> (StatusCode, Value) {
    let mut req = server
        .http
        .post(server.url(&format!("/v1/workspaces/{ws}/tools/{name}")))
        .bearer_auth(token)
        .json(&args);
    if let Some(key) = key {
        req = req.header("Idempotency-Key", key);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn exec(server: &Server, token: &str, ws: &str, body: Value) -> (StatusCode, Value) {
    server
        .post(&format!("/v1/workspaces/{ws}/exec"), token, body)
        .await
}

/// The calls of an agent's turn: each file write tool, a writing and a reading exec.
/// Returns each answer without what differs between two runs (ids, durations).
async fn turn(server: &Server, ws: &str) -> Vec<Value> {
    let mut answers = Vec::new();
    for (name, args) in [
        (
            "write_file",
            json!({"path": "src/new.rs", "content": "pub fn beta() {}\n"}),
        ),
        (
            "str_replace",
            json!({"path": "src/lib.rs", "old_str": "alpha", "new_str": "gamma"}),
        ),
        (
            "insert",
            json!({"path": "src/lib.rs", "insert_line": 1, "text": "// two\n"}),
        ),
        (
            "create",
            json!({"path": "src/created.rs", "content": "// created\n"}),
        ),
    ] {
        let (status, body) = tool(server, ALICE, ws, name, args, None).await;
        assert_eq!(status, StatusCode::OK, "{name}: {body}");
        answers.push(body);
    }
    for body in [
        json!({"argv": ["sh", "-c", "echo hi > e.txt; cat src/lib.rs e.txt"]}),
        json!({"argv": ["cat", "e.txt"], "kind": "read"}),
        json!({"argv": ["sh", "-c", "exit 3"]}),
    ] {
        let (status, mut answer) = exec(server, ALICE, ws, body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        for volatile in ["exec_id", "duration_ms"] {
            answer.as_object_mut().unwrap().remove(volatile);
        }
        answers.push(answer);
    }
    let (status, body) = tool(
        server,
        ALICE,
        ws,
        "str_replace",
        json!({"path": "src/lib.rs", "old_str": "absent", "new_str": "x"}),
        None,
    )
    .await;
    answers.push(json!({"status": status.as_u16(), "kind": body["error"]["kind"]}));
    answers
}

/// The types of the events about `ws`, in the log's order.
async fn event_types(env: &TestEnv, ws: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT event_type FROM grove.events WHERE payload->>'workspace_id' = $1 ORDER BY position",
    )
    .bind(ws)
    .fetch_all(&env.pool)
    .await
    .unwrap()
}

/// (kind, status, started in the same transaction as enqueued) of the commands on `ws`.
async fn commands(env: &TestEnv, ws: &str) -> Vec<(String, String, bool)> {
    sqlx::query_as(
        "SELECT kind, status, enqueued_at = started_at FROM grove.commands
         WHERE payload->>'workspace_id' = $1 ORDER BY enqueued_at",
    )
    .bind(ws)
    .fetch_all(&env.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn inline_writes_and_execs_answer_as_the_queue_does_with_the_same_events() {
    let env = env_or_skip!("inline_writes_and_execs_answer_as_the_queue_does_with_the_same_events");
    let url = fixture(&env);
    let home = Server::start(&env).await;
    let inline_ws = home.acquire(ALICE, &url, "c1").await;
    let queued_ws = home.acquire(ALICE, &url, "c2").await;
    // A server of another node: its calls on this node's workspaces take the queue, to
    // the first server's worker.
    let other = Server::start_with(&env, &[("GROVE_NODE", "n2")]).await;

    let inline = turn(&home, &inline_ws).await;
    let queued = turn(&other, &queued_ws).await;
    assert_eq!(inline, queued, "the same answers on both paths");
    assert_eq!(inline[4]["stdout"], "pub fn gamma() {}\n// two\nhi\n");
    assert_eq!(inline[6]["exit_code"], 3);
    assert_eq!(inline[7]["status"], 400, "{}", inline[7]);

    assert_eq!(
        event_types(&env, &inline_ws).await,
        event_types(&env, &queued_ws).await,
        "the same events in the same order"
    );
    let ran_inline = commands(&env, &inline_ws).await;
    let ran_queued = commands(&env, &queued_ws).await;
    // Every command on the workspace ran inline on one (its ledger row started as it
    // was inserted) and through a claim on the other.
    assert_eq!(ran_inline.len(), 8, "{ran_inline:?}");
    assert_eq!(ran_inline.len(), ran_queued.len(), "{ran_queued:?}");
    for ((kind, status, same_tx), (qkind, qstatus, qsame_tx)) in ran_inline.iter().zip(&ran_queued)
    {
        assert_eq!((kind, status), (qkind, qstatus));
        assert!(*same_tx, "{kind} ran inline: {ran_inline:?}");
        assert!(!*qsame_tx, "{kind} went through the queue: {ran_queued:?}");
    }
    // The failed str_replace is recorded as the queue records it; every job is closed.
    assert_eq!(ran_inline.last().unwrap().1, "failed");
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM apalis.jobs WHERE status NOT IN ('Done', 'Killed')",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(open, 0, "no job left open");

    let verify = env.grove(&["replay", "--verify"]).await;
    assert!(verify.status.success(), "{:?}", grove_e2e::text(&verify));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retried_command_id_answers_its_first_outcome_and_never_runs_again() {
    let env = env_or_skip!("a_retried_command_id_answers_its_first_outcome_and_never_runs_again");
    let url = fixture(&env);
    let home = Server::start(&env).await;
    let ws = home.acquire(ALICE, &url, "c1").await;
    let count = json!({"argv": ["sh", "-c", "echo run >> runs.txt; wc -l < runs.txt"]});
    let with_key = |key: &str| {
        let mut body = count.clone();
        body["idempotency_key"] = json!(key);
        body
    };

    // An exec, retried with the same key.
    let (status, first) = exec(&home, ALICE, &ws, with_key("k-exec")).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["stdout"].as_str().unwrap().trim(), "1");
    let (status, again) = exec(&home, ALICE, &ws, with_key("k-exec")).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again, first, "the first outcome, exec id and all");
    assert_eq!(env.count_events("exec.started").await, 1);

    // A write, overwritten by another call, then retried: answered, not written again.
    let write = |content: &str| json!({"path": "w.txt", "content": content});
    let (status, first) = tool(
        &home,
        ALICE,
        &ws,
        "write_file",
        write("first\n"),
        Some("k-w"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, _) = tool(&home, ALICE, &ws, "write_file", write("second\n"), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, again) = tool(
        &home,
        ALICE,
        &ws,
        "write_file",
        write("first\n"),
        Some("k-w"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again, first);
    // The same key for another command is refused, not answered with the first's outcome.
    let (status, body) = tool(
        &home,
        ALICE,
        &ws,
        "write_file",
        write("third\n"),
        Some("k-w"),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    // An edit that could not run twice: its retry would find nothing to replace.
    let edit = json!({"path": "w.txt", "old_str": "second", "new_str": "edited"});
    let (status, first) = tool(&home, ALICE, &ws, "str_replace", edit.clone(), Some("k-e")).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, again) = tool(&home, ALICE, &ws, "str_replace", edit, Some("k-e")).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again, first);
    let (_, read) = tool(
        &home,
        ALICE,
        &ws,
        "read_file",
        json!({"path": "w.txt"}),
        None,
    )
    .await;
    assert_eq!(read["content"], "edited\n", "{read}");
    let written: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM grove.events WHERE event_type = 'workspace.file_written' AND payload->>'path' = 'w.txt'",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(written, 3, "first, second and the edit: no retry wrote");

    // Across paths: an exec queued through another node's server, then retried here.
    let other = Server::start_with(&env, &[("GROVE_NODE", "n2")]).await;
    let (status, queued) = exec(&other, ALICE, &ws, with_key("k-cross")).await;
    assert_eq!(status, StatusCode::OK, "{queued}");
    assert_eq!(queued["stdout"].as_str().unwrap().trim(), "2");
    let (status, retried) = exec(&home, ALICE, &ws, with_key("k-cross")).await;
    assert_eq!(status, StatusCode::OK, "{retried}");
    assert_eq!(retried, queued);
    let (_, runs) = tool(
        &home,
        ALICE,
        &ws,
        "read_file",
        json!({"path": "runs.txt"}),
        None,
    )
    .await;
    assert_eq!(runs["content"], "run\nrun\n", "{runs}");
    assert_eq!(env.count_events("exec.started").await, 2);

    let verify = env.grove(&["replay", "--verify"]).await;
    assert!(verify.status.success(), "{:?}", grove_e2e::text(&verify));
}

#[tokio::test(flavor = "multi_thread")]
async fn inline_writes_keep_tenancy_and_never_leave_the_workspace() {
    let env = env_or_skip!("inline_writes_keep_tenancy_and_never_leave_the_workspace");
    let url = fixture(&env);
    let home = Server::start(&env).await;
    let ws = home.acquire(ALICE, &url, "c1").await;
    let (_, row) = home.get(&format!("/v1/workspaces/{ws}"), ALICE).await;
    let dir = std::path::PathBuf::from(row["local_path"].as_str().expect("local_path"));
    let ledger = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM grove.commands")
            .fetch_one(&env.pool)
            .await
            .unwrap()
    };
    let before = ledger().await;

    // Another user's workspace does not exist for them: nothing runs, nothing is kept.
    let write = json!({"path": "bob.txt", "content": "bob\n"});
    let (status, body) = tool(&home, BOB, &ws, "write_file", write, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = exec(&home, BOB, &ws, json!({"argv": ["touch", "bob.txt"]})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(!dir.join("bob.txt").exists());
    assert_eq!(ledger().await, before);

    // A link to a directory outside, planted in the workspace, is not written through.
    let outside = env.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("out")).unwrap();
    for (name, args) in [
        (
            "write_file",
            json!({"path": "out/pwned.txt", "content": "x"}),
        ),
        ("create", json!({"path": "out/pwned.txt", "content": "x"})),
        (
            "write_file",
            json!({"path": "../pwned.txt", "content": "x"}),
        ),
        (
            "write_file",
            json!({"path": outside.join("pwned.txt").to_str().unwrap(), "content": "x"}),
        ),
    ] {
        let (status, body) = tool(&home, ALICE, &ws, name, args, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {body}");
    }
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "nothing outside"
    );
    assert!(!dir.parent().unwrap().join("pwned.txt").exists());
    assert_eq!(env.count_events("workspace.file_written").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_terabyte_sparse_file_made_by_an_exec_does_not_take_the_server_down() {
    let env = env_or_skip!("a_terabyte_sparse_file_made_by_an_exec_does_not_take_the_server_down");
    let url = fixture(&env);
    let home = Server::start(&env).await;
    let ws = home.acquire(ALICE, &url, "c1").await;
    let (_, row) = home.get(&format!("/v1/workspaces/{ws}"), ALICE).await;
    let dir = std::path::PathBuf::from(row["local_path"].as_str().expect("local_path"));

    // A moment's work for the exec, a terabyte for whatever reads the file whole: the
    // point taken after this mutating exec, in the server's own process.
    let (status, body) = exec(
        &home,
        ALICE,
        &ws,
        json!({"argv": ["sh", "-c", "truncate -s 1T big.bin && echo made"]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["stdout"], "made\n", "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");

    // The server is still up: a write runs and is answered, its point taken.
    let (status, body) = tool(
        &home,
        ALICE,
        &ws,
        "write_file",
        json!({"path": "after.txt", "content": "still here\n"}),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        std::fs::read_to_string(dir.join("after.txt")).unwrap(),
        "still here\n"
    );
    // The points left the file out unread, and the workspace counts as dirty.
    let dirty: bool =
        sqlx::query_scalar("SELECT dirty FROM grove.sandbox_workspaces WHERE id = $1::uuid")
            .bind(&ws)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert!(dirty);
    assert_eq!(
        std::fs::metadata(dir.join("big.bin")).unwrap().len(),
        1 << 40
    );
    let verify = env.grove(&["replay", "--verify"]).await;
    assert!(verify.status.success(), "{:?}", grove_e2e::text(&verify));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fifo_planted_as_gitignore_never_stalls_a_command_or_its_workspace() {
    let env = env_or_skip!("a_fifo_planted_as_gitignore_never_stalls_a_command_or_its_workspace");
    let url = fixture(&env);
    let home = Server::start(&env).await;
    let ws = home.acquire(ALICE, &url, "c1").await;
    // This test's only workspace: every point is one of its.
    let points = || env.count_events("workspace.snapshot_taken");
    let before = points().await;

    // The point after this exec would open the FIFO as ignore rules and wait for good.
    let (status, body) = exec(
        &home,
        ALICE,
        &ws,
        json!({"argv": ["sh", "-c", "mkfifo .gitignore && echo planted"]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["stdout"], "planted\n", "{body}");
    // The workspace's lock is free: a write runs and is answered (its point refused).
    let write = json!({"path": "after.txt", "content": "x\n"});
    let (status, body) = tool(&home, ALICE, &ws, "write_file", write, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(points().await, before, "no point while the FIFO is there");
    // A read answered in the server's process walks the workspace too: refused, not
    // stalled (it would hold one of the server's read permits for good).
    let (status, body) = tool(&home, ALICE, &ws, "git_status", json!({}), None).await;
    assert_ne!(status, StatusCode::OK, "{body}");
    assert!(body.to_string().contains("not a regular file"), "{body}");

    // With the FIFO gone, points are taken again.
    let (status, body) = exec(&home, ALICE, &ws, json!({"argv": ["rm", ".gitignore"]})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(points().await, before + 1);
}

/// The advisory locks and lease rows the server holds in the test's database.
async fn locks_held(env: &TestEnv) -> (i64, i64) {
    let leases: i64 = sqlx::query_scalar("SELECT count(*) FROM grove.lock_leases")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    let advisory: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
          WHERE l.locktype = 'advisory' AND d.datname = current_database()",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    (leases, advisory)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_inline_call_frees_its_lock_and_announces_its_outcome_after_answering() {
    let env =
        env_or_skip!("an_inline_call_frees_its_lock_and_announces_its_outcome_after_answering");
    let url = fixture(&env);
    let home = Server::start(&env).await;
    let ws = home.acquire(ALICE, &url, "c1").await;
    let mut done = sqlx::postgres::PgListener::connect_with(&env.pool)
        .await
        .unwrap();
    done.listen("grove_command_done").await.unwrap();

    let write = json!({"path": "w.txt", "content": "one\n"});
    let (status, body) = tool(&home, ALICE, &ws, "write_file", write, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = exec(&home, ALICE, &ws, json!({"argv": ["true"]})).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Each answer came before its unlock; the unlocks and their announcements follow.
    let recorded: Vec<String> = sqlx::query_scalar(
        "SELECT command_id::text FROM grove.commands
          WHERE payload->>'workspace_id' = $1 AND kind IN ('tool', 'exec')",
    )
    .bind(&ws)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        recorded.len(),
        2,
        "the write and the exec are recorded: {recorded:?}"
    );
    let mut announced = std::collections::BTreeSet::new();
    while !recorded.iter().all(|id| announced.contains(id)) {
        let note = tokio::time::timeout(std::time::Duration::from_secs(10), done.recv())
            .await
            .unwrap_or_else(|_| {
                panic!("not announced within 10 s: {recorded:?}, saw {announced:?}")
            })
            .unwrap();
        announced.insert(note.payload().to_string());
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let held = locks_held(&env).await;
        if held == (0, 0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "locks still held 10 s after the answers: {held:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // The next call of the same workspace takes the lock as usual.
    let (status, body) = tool(
        &home,
        ALICE,
        &ws,
        "read_file",
        json!({"path": "w.txt"}),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["content"], "one\n");
}
