//! Appends folded onto rows a lock holds (ADR 36): the rows written through
//! `grove.append_folded` equal those the usual append writes for the same events; a row
//! changed since it was read (by a writer outside the lock, or a runtime row created
//! meanwhile) is refused as stale and nothing of the append is written.

use std::time::Duration;

use chrono::{DateTime, Utc};
use grove_core::events::{Correlation, Event, Metadata};
use grove_core::model::{Capabilities, WorkspaceMode};
use grove_postgres::folded::is_stale;
use grove_postgres::locks::{AdvisoryLock, LeaseCommit};
use grove_postgres::{rows, store};
use sqlx::PgPool;
use uuid::Uuid;

use crate::env_or_skip;

fn md() -> Metadata {
    Metadata {
        command_id: Uuid::now_v7(),
        correlation: Correlation::default(),
        worker_id: "w-folded".into(),
        node: "n-folded".into(),
    }
}

/// A time with sub-microsecond digits, which Postgres does not keep.
fn at(seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + seconds, 123_456_789).unwrap()
}

fn created(id: Uuid) -> Event {
    Event::WorkspaceCreated {
        workspace_id: id,
        repo_cache_id: Uuid::nil(),
        node: "n-folded".into(),
        user_id: "u".into(),
        project_id: "p".into(),
        mode: WorkspaceMode::Edit,
        conversation_id: Some(format!("c-{id}")),
        task_id: None,
        base_ref: "main".into(),
        base_commit: "0".repeat(40),
        branch_name: Some("grove/c".into()),
        local_path: "/nonexistent/folded".into(),
        capabilities: Capabilities::from_mode(WorkspaceMode::Edit),
        size_bytes: 7,
        history_ignored: false,
    }
}

/// Events that change the workspace row and create, then stop, its runtime.
fn changes(ws: Uuid, runtime: Uuid) -> Vec<Vec<Event>> {
    vec![
        vec![
            Event::WorkspaceDirtyChanged {
                workspace_id: ws,
                dirty: true,
            },
            Event::RuntimeStarted {
                runtime_id: runtime,
                workspace_id: ws,
                backend_kind: "local".into(),
                backend_runtime_id: format!("local-{runtime}"),
                image: None,
            },
        ],
        vec![Event::WorkspacePinned {
            workspace_id: ws,
            until: Some(at(3600)),
        }],
        vec![Event::RuntimeStopped {
            runtime_id: runtime,
            reason: "idle".into(),
        }],
    ]
}

async fn append(pool: &PgPool, events: &[Event], at: DateTime<Utc>) {
    let mut tx = pool.begin().await.unwrap();
    store::append(&mut tx, events, &md(), at).await.unwrap();
    tx.commit().await.unwrap();
}

async fn lock(pool: &PgPool, ws: Uuid) -> AdvisoryLock {
    let (lock, row) = AdvisoryLock::acquire_workspace_with(
        pool,
        ws,
        false,
        Duration::from_secs(5),
        LeaseCommit::WithNextCommit,
    )
    .await
    .unwrap();
    assert!(row.is_some(), "the workspace row is read with its lock");
    lock
}

async fn stream_len(pool: &PgPool, ws: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM grove.events WHERE stream_id = $1")
        .bind(grove_core::events::workspace_stream(ws))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_folded_append_writes_exactly_the_rows_the_usual_append_writes() {
    let env = env_or_skip!("a_folded_append_writes_exactly_the_rows_the_usual_append_writes");
    let (ws, twin) = (Uuid::now_v7(), Uuid::now_v7());
    let (rt, twin_rt) = (Uuid::now_v7(), Uuid::now_v7());
    append(&env.pool, &[created(ws)], at(0)).await;
    append(&env.pool, &[created(twin)], at(0)).await;
    let mut held = lock(&env.pool, ws).await;
    held.hold_runtime(rt, None);
    for (i, (events, twin_events)) in changes(ws, rt)
        .into_iter()
        .zip(changes(twin, twin_rt))
        .enumerate()
    {
        let when = at(10 * (i as i64 + 1));
        let folded = held
            .held_rows()
            .fold(&events, &md(), when)
            .unwrap()
            .expect("every row the events read is held");
        let version = store::append_folded(held.conn(), &folded).await.unwrap();
        held.absorb(folded, version);
        append(&env.pool, &twin_events, when).await;
    }
    held.release().await.unwrap();
    let mut conn = env.pool.acquire().await.unwrap();
    let mut folded = rows::workspace(&mut conn, ws).await.unwrap().unwrap();
    let usual = rows::workspace(&mut conn, twin).await.unwrap().unwrap();
    assert!(folded.dirty && folded.pinned_until.is_some(), "{folded:?}");
    folded.id = twin;
    folded.conversation_id = usual.conversation_id.clone();
    assert_eq!(folded, usual);
    let mut runtime = rows::runtime(&mut conn, rt).await.unwrap().unwrap();
    let usual = rows::runtime(&mut conn, twin_rt).await.unwrap().unwrap();
    runtime.id = twin_rt;
    runtime.workspace_id = twin;
    runtime.backend_runtime_id = usual.backend_runtime_id.clone();
    assert_eq!(runtime, usual);
    assert_eq!(
        stream_len(&env.pool, ws).await,
        stream_len(&env.pool, twin).await
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_row_changed_outside_the_lock_is_stale_and_nothing_is_appended() {
    let env = env_or_skip!("a_row_changed_outside_the_lock_is_stale_and_nothing_is_appended");
    let (ws, rt) = (Uuid::now_v7(), Uuid::now_v7());
    append(&env.pool, &[created(ws)], at(0)).await;
    let mut held = lock(&env.pool, ws).await;
    // A writer that does not take the lock changes the row after it was read.
    append(
        &env.pool,
        &[Event::WorkspaceDirtyChanged {
            workspace_id: ws,
            dirty: true,
        }],
        at(1),
    )
    .await;
    let before = stream_len(&env.pool, ws).await;
    let events = [Event::WorkspacePinned {
        workspace_id: ws,
        until: Some(at(60)),
    }];
    let folded = held
        .held_rows()
        .fold(&events, &md(), at(2))
        .unwrap()
        .unwrap();
    let err = store::append_folded(held.conn(), &folded)
        .await
        .unwrap_err();
    assert!(is_stale(&err), "{err}");
    assert_eq!(
        stream_len(&env.pool, ws).await,
        before,
        "a stale fold appended"
    );
    let mut conn = env.pool.acquire().await.unwrap();
    let row = rows::workspace(&mut conn, ws).await.unwrap().unwrap();
    assert!(row.dirty && row.pinned_until.is_none(), "{row:?}");
    drop(conn);

    // A runtime held as absent that someone created meanwhile is stale too.
    held.forget_rows();
    held.release().await.unwrap();
    let mut held = lock(&env.pool, ws).await;
    held.hold_runtime(rt, None);
    let start = |backend: &str| Event::RuntimeStarted {
        runtime_id: rt,
        workspace_id: ws,
        backend_kind: "local".into(),
        backend_runtime_id: backend.into(),
        image: None,
    };
    append(&env.pool, &[start("outside")], at(3)).await;
    let folded = held
        .held_rows()
        .fold(&[start("inside")], &md(), at(4))
        .unwrap()
        .unwrap();
    let err = store::append_folded(held.conn(), &folded)
        .await
        .unwrap_err();
    assert!(is_stale(&err), "{err}");
    held.release().await.unwrap();
    let mut conn = env.pool.acquire().await.unwrap();
    let runtime = rows::runtime(&mut conn, rt).await.unwrap().unwrap();
    assert_eq!(runtime.backend_runtime_id, "outside");
}

#[tokio::test(flavor = "multi_thread")]
async fn events_that_read_a_row_not_held_do_not_fold() {
    let env = env_or_skip!("events_that_read_a_row_not_held_do_not_fold");
    let ws = Uuid::now_v7();
    append(&env.pool, &[created(ws)], at(0)).await;
    let held = lock(&env.pool, ws).await;
    // A runtime neither read nor known absent: the fold must read it first.
    let events = [Event::RuntimeStopped {
        runtime_id: Uuid::now_v7(),
        reason: "idle".into(),
    }];
    assert!(held
        .held_rows()
        .fold(&events, &md(), at(1))
        .unwrap()
        .is_none());
    held.release().await.unwrap();
}
