//! A follower of the event log sees every event exactly once under concurrent commits,
//! and a transaction open in another database of the cluster holds no reader back.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use grove_core::events::{Correlation, Event, Metadata};
use grove_e2e::http::{Server, ALICE};
use grove_postgres::reader::{read_after, Cursor};
use grove_postgres::store;
use sqlx::{Connection, PgConnection, PgPool};

use crate::env_or_skip;

#[tokio::test(flavor = "multi_thread")]
async fn a_follower_sees_every_event_exactly_once_while_transactions_commit_out_of_order() {
    let env = env_or_skip!(
        "a_follower_sees_every_event_exactly_once_while_transactions_commit_out_of_order"
    );
    follow_out_of_order_commits(&env.pool).await;
}

/// The same with a transaction holding an xid open in another database of the cluster
/// the whole time: the follower reads past it and still skips nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_follower_skips_nothing_while_another_database_holds_a_transaction() {
    let env = env_or_skip!("a_follower_skips_nothing_while_another_database_holds_a_transaction");
    let foreign = ForeignTransaction::open(&env).await;
    follow_out_of_order_commits(&env.pool).await;
    foreign.close(&env).await;
}

async fn follow_out_of_order_commits(pool: &PgPool) {
    let pool = pool.clone();
    let done = Arc::new(AtomicBool::new(false));

    let reader = {
        let pool = pool.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut seen: BTreeMap<i64, usize> = BTreeMap::new();
            let mut cursor = Cursor::default();
            let mut conn = pool.acquire().await.unwrap();
            loop {
                let finished = done.load(Ordering::SeqCst);
                let batch = read_after(&mut conn, cursor, None, 50).await.unwrap();
                for e in &batch {
                    *seen.entry(e.position).or_default() += 1;
                    cursor = Cursor::after(e);
                }
                if finished && batch.is_empty() {
                    return seen;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };

    let mut writers = Vec::new();
    for w in 0..6u64 {
        let pool = pool.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..20u64 {
                let mut tx = pool.begin().await.unwrap();
                let events = vec![
                    Event::RepoCacheUsed {
                        repo_cache_id: uuid::Uuid::new_v4()
                    };
                    2
                ];
                let md = Metadata {
                    command_id: uuid::Uuid::new_v4(),
                    correlation: Correlation::default(),
                    worker_id: format!("writer-{w}"),
                    node: "test".into(),
                };
                store::append(&mut tx, &events, &md, chrono::Utc::now())
                    .await
                    .unwrap();
                // Hold some transactions open after their positions were drawn, so later
                // positions commit first: a reader going by position alone would skip these.
                let hold = ((w * 7 + i * 13) % 5) * 6;
                sqlx::query("SELECT pg_sleep($1)")
                    .bind(hold as f64 / 1000.0)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    done.store(true, Ordering::SeqCst);
    let seen = reader.await.unwrap();
    let all: Vec<i64> = sqlx::query_scalar("SELECT position FROM grove.events ORDER BY position")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(all.len(), 240);
    let dupes: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(dupes.is_empty(), "seen more than once: {dupes:?}");
    let missing: Vec<_> = all.iter().filter(|p| !seen.contains_key(p)).collect();
    assert!(missing.is_empty(), "never seen: {missing:?}");
}

/// A scratch database of the same cluster with a transaction in it that holds an xid
/// (so the cluster's oldest running xid, every snapshot's `xmin`, is its).
struct ForeignTransaction {
    conn: PgConnection,
    db: String,
}

impl ForeignTransaction {
    async fn open(env: &grove_e2e::TestEnv) -> Self {
        let db = format!("grove_scratch_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
            .execute(&env.pool)
            .await
            .expect("create the scratch database");
        let url = grove_e2e::with_database(&env.db_url, &db);
        let mut conn = PgConnection::connect(&url).await.expect("connect to it");
        sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
        let xid: String = sqlx::query_scalar("SELECT pg_current_xact_id()::text")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        let xmin: String =
            sqlx::query_scalar("SELECT pg_snapshot_xmin(pg_current_snapshot())::text")
                .fetch_one(&env.pool)
                .await
                .unwrap();
        assert!(
            xmin.parse::<u64>().unwrap() <= xid.parse::<u64>().unwrap(),
            "the scratch transaction does not hold the cluster's xmin"
        );
        Self { conn, db }
    }

    async fn close(self, env: &grove_e2e::TestEnv) {
        let _ = self.conn.close().await;
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.db
        )))
        .execute(&env.pool)
        .await;
    }
}

/// The event types of workspace `ws` after `after` over the API, and the next `after`.
async fn event_types(server: &Server, ws: &str, after: Option<i64>) -> (Vec<String>, Option<i64>) {
    let query = after.map(|a| format!("&after={a}")).unwrap_or_default();
    let (status, body) = server
        .get(
            &format!("/v1/workspaces/{ws}/events?limit=1000{query}"),
            ALICE,
        )
        .await;
    assert!(status.is_success(), "{body}");
    let types = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_type"].as_str().unwrap().to_string())
        .collect();
    (types, body["next_after"].as_i64())
}

/// Polls `event_types` for up to `patience` until `want` is among them.
async fn wait_for_event(
    server: &Server,
    ws: &str,
    after: Option<i64>,
    want: &str,
    patience: Duration,
) -> (Vec<String>, Option<i64>) {
    let deadline = std::time::Instant::now() + patience;
    loop {
        let (types, next) = event_types(server, ws, after).await;
        if types.iter().any(|t| t == want) || std::time::Instant::now() > deadline {
            return (types, next);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An acquire answered over the API has its events readable at once while another
/// database of the same cluster holds a transaction open (the Python SDK's follow test
/// read nothing while any other test's transaction was open); a transaction open in
/// grove's own database still holds later commits back, since it could commit events
/// ordered before them.
#[tokio::test(flavor = "multi_thread")]
async fn an_acquires_events_are_read_at_once_while_another_database_holds_a_transaction() {
    let env = env_or_skip!(
        "an_acquires_events_are_read_at_once_while_another_database_holds_a_transaction"
    );
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let server = Server::start(&env).await;
    let foreign = ForeignTransaction::open(&env).await;

    let ws = server.acquire(ALICE, &url, "c-horizon").await;
    let (types, after) = wait_for_event(
        &server,
        &ws,
        None,
        "workspace.created",
        Duration::from_secs(5),
    )
    .await;
    assert!(
        types.iter().any(|t| t == "workspace.created"),
        "the answered acquire's events stayed unread behind another database's transaction: {types:?}"
    );

    // A transaction of this database holding an xid keeps later commits unread.
    let mut own = env.pool.begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *own)
        .await
        .unwrap();
    assert_eq!(server.acquire(ALICE, &url, "c-horizon").await, ws);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (held, _) = event_types(&server, &ws, after).await;
    assert!(
        held.is_empty(),
        "events committed after an open transaction of this database were read past it: {held:?}"
    );
    own.rollback().await.unwrap();
    let (types, _) = wait_for_event(
        &server,
        &ws,
        after,
        "workspace.acquired",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(types, vec!["workspace.acquired".to_string()]);
    foreign.close(&env).await;
}
