//! A read's lease-less hold on a workspace's command lock (ADR 24, `ReadLock`): it
//! writes no lease, keeps a writer out while held, waits for an exclusive lease whose
//! holder lost its connection, and its release fails (so the read's answer is dropped)
//! when its session ended while it was held.

use std::time::Duration;

use grove_postgres::locks::{lock_key, AdvisoryLock, LockScope};
use grove_postgres::read_lock::ReadLock;
use grove_postgres::StoreError;
use uuid::Uuid;

use crate::env_or_skip;

const SHORT: Duration = Duration::from_millis(300);

async fn leases(env: &grove_e2e::TestEnv) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM grove.lock_leases")
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

/// The backend holding an advisory lock of `key` in share mode, in this database.
async fn holder_pid(env: &grove_e2e::TestEnv, key: i64) -> i32 {
    sqlx::query_scalar(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND mode = 'ShareLock' \
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
           AND ((classid::bigint << 32) | objid::bigint) = $1",
    )
    .bind(key)
    .fetch_one(&env.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_lock_writes_no_lease_and_keeps_a_writer_out() {
    let env = env_or_skip!("a_read_lock_writes_no_lease_and_keeps_a_writer_out");
    let id = Uuid::new_v4();
    let (read, row) = ReadLock::acquire_workspace(&env.pool, id, SHORT)
        .await
        .unwrap();
    assert!(
        row.is_none(),
        "no such workspace: no row, the lock held anyway"
    );
    assert_eq!(leases(&env).await, 0, "a read takes no lease");
    let writer = AdvisoryLock::acquire(
        &env.pool,
        LockScope::WorkspaceCommands,
        &id.to_string(),
        false,
        SHORT,
    )
    .await;
    assert!(
        matches!(writer, Err(StoreError::Locked(_))),
        "a writer must wait for the read"
    );
    read.release().await.unwrap();
    let writer = AdvisoryLock::acquire(
        &env.pool,
        LockScope::WorkspaceCommands,
        &id.to_string(),
        false,
        SHORT,
    )
    .await
    .expect("free once the read released");
    writer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_waits_for_the_exclusive_lease_of_a_writer_that_lost_its_connection() {
    let env =
        env_or_skip!("a_read_waits_for_the_exclusive_lease_of_a_writer_that_lost_its_connection");
    let id = Uuid::new_v4();
    let mut writer = AdvisoryLock::acquire(
        &env.pool,
        LockScope::WorkspaceCommands,
        &id.to_string(),
        false,
        SHORT,
    )
    .await
    .unwrap();
    // The writer's session dies (a restart): its advisory lock goes, its lease stays.
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(writer.conn())
        .await
        .unwrap();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&env.pool)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let read = ReadLock::acquire_workspace(&env.pool, id, SHORT).await;
    assert!(
        matches!(read, Err(StoreError::Locked(_))),
        "a read must not run beside a writer that may still be writing"
    );
    // Once that writer lets go, the read gets in.
    let _ = writer.release().await;
    let mut got = None;
    for _ in 0..20 {
        if let Ok((lock, _)) = ReadLock::acquire_workspace(&env.pool, id, SHORT).await {
            got = Some(lock);
            break;
        }
    }
    got.expect("the read gets in after the writer's release")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_lock_lost_while_held_fails_its_release() {
    let env = env_or_skip!("a_read_lock_lost_while_held_fails_its_release");
    let id = Uuid::new_v4();
    let (read, _) = ReadLock::acquire_workspace(&env.pool, id, SHORT)
        .await
        .unwrap();
    let key = lock_key(LockScope::WorkspaceCommands, &id.to_string());
    let pid = holder_pid(&env, key).await;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&env.pool)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A writer could get in now; the read must not answer what it read.
    assert!(
        read.release().await.is_err(),
        "the release of a lost read lock must fail"
    );
}
