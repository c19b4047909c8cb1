//! A follower of the event log sees every event exactly once under concurrent commits.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use grove_core::events::{Correlation, Event, Metadata};
use grove_postgres::reader::{read_after, Cursor};
use grove_postgres::store;

use crate::env_or_skip;

#[tokio::test(flavor = "multi_thread")]
async fn a_follower_sees_every_event_exactly_once_while_transactions_commit_out_of_order() {
    let env = env_or_skip!(
        "a_follower_sees_every_event_exactly_once_while_transactions_commit_out_of_order"
    );
    let pool = env.pool.clone();
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
