//! Leased locks with fencing (ADR 21): a lock whose connection dies keeps others out
//! until its holder releases it or its lease expires; a holder that cannot renew is told
//! before the expiry; writes under a lock whose lease was taken over are refused.

use std::time::{Duration, Instant};

use grove_postgres::locks::{lease_length, lease_margin, AdvisoryLock, LockScope};
use grove_postgres::StoreError;

use crate::env_or_skip;

/// The backend pid of a lock's own connection.
async fn pid_of(lock: &mut AdvisoryLock) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(lock.conn())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lock_whose_connection_dies_keeps_others_out_until_its_holder_releases_it() {
    let env =
        env_or_skip!("a_lock_whose_connection_dies_keeps_others_out_until_its_holder_releases_it");
    let short = Duration::from_millis(300);
    let mut held =
        AdvisoryLock::acquire(&env.pool, LockScope::WorkspaceCommands, "w", false, short)
            .await
            .unwrap();
    // The advisory lock dies with its session (as in a database restart).
    let pid = pid_of(&mut held).await;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&env.pool)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The lease still holds: neither a writer nor a reader gets in.
    for shared in [false, true] {
        let t = Instant::now();
        let err =
            AdvisoryLock::acquire(&env.pool, LockScope::WorkspaceCommands, "w", shared, short)
                .await
                .err()
                .expect("the lease of a holder that lost its connection must keep others out");
        assert!(matches!(err, StoreError::Locked(_)), "{err:?}");
        assert!(t.elapsed() >= short);
    }
    assert!(
        !held.is_lost(),
        "the lease is renewed through other connections"
    );
    // Its holder releases: the dead connection cannot, the lease goes anyway.
    let _ = held.release().await;
    let t = Instant::now();
    let next = loop {
        match AdvisoryLock::acquire(&env.pool, LockScope::WorkspaceCommands, "w", false, short)
            .await
        {
            Ok(l) => break l,
            Err(StoreError::Locked(_)) if t.elapsed() < Duration::from_secs(5) => continue,
            Err(e) => panic!("the lock stayed taken after its release: {e:?}"),
        }
    };
    next.release().await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM grove.lock_leases")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "a released lock leaves no lease");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_holder_that_cannot_renew_is_told_before_its_lease_expires() {
    let env = env_or_skip!("a_holder_that_cannot_renew_is_told_before_its_lease_expires");
    // The holder's own pool, closed under it: every renewal fails, as when the
    // database is unreachable.
    let own = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with((*env.pool.connect_options()).clone())
        .await
        .unwrap();
    let lock = AdvisoryLock::acquire(
        &own,
        LockScope::WorkspaceCommands,
        "w",
        false,
        Duration::from_secs(1),
    )
    .await
    .unwrap();
    let fence = lock.fence();
    let taken = Instant::now();
    let closing = tokio::spawn({
        let own = own.clone();
        async move { own.close().await }
    });
    let lost = lock.fence_lost();
    tokio::time::timeout(lease_length(), lost)
        .await
        .expect("the holder must be told within the lease");
    let told = taken.elapsed();
    // Told a margin before the database lets anyone else in.
    let remaining: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM expires_at - clock_timestamp())::float8
           FROM grove.lock_leases WHERE key = $1 AND holder = $2",
    )
    .bind(fence.key)
    .bind(fence.holder)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    let margin = lease_margin(lease_length()).as_secs_f64();
    assert!(
        remaining >= margin * 0.8,
        "told after {told:?}, only {remaining:.2} s before the expiry (margin {margin} s)"
    );
    assert!(lock.is_lost());
    drop(lock);
    closing.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_under_a_lock_whose_lease_was_taken_over_are_refused() {
    let env = env_or_skip!("writes_under_a_lock_whose_lease_was_taken_over_are_refused");
    let mut lock = AdvisoryLock::acquire(
        &env.pool,
        LockScope::WorkspaceCommands,
        "w",
        false,
        Duration::from_secs(1),
    )
    .await
    .unwrap();
    let fence = lock.fence();
    {
        let mut tx = sqlx::Connection::begin(lock.conn()).await.unwrap();
        grove_postgres::store::end_fences(&mut tx, &[fence])
            .await
            .expect("a held lease passes");
        tx.rollback().await.unwrap();
    }
    // Expired and taken over by another holder (what a takeover does to the row).
    sqlx::query("DELETE FROM grove.lock_leases WHERE key = $1")
        .bind(fence.key)
        .execute(&env.pool)
        .await
        .unwrap();
    let mut tx = sqlx::Connection::begin(lock.conn()).await.unwrap();
    let err = grove_postgres::store::end_fences(&mut tx, &[fence])
        .await
        .expect_err("a lost lease must refuse the write");
    assert!(matches!(err, StoreError::Fenced(_)), "{err:?}");
    tx.rollback().await.unwrap();
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lease_riding_on_the_next_commit_fences_like_a_flushed_one() {
    use grove_postgres::locks::LeaseCommit;
    let env = env_or_skip!("a_lease_riding_on_the_next_commit_fences_like_a_flushed_one");
    let short = Duration::from_millis(300);
    let id = uuid::Uuid::now_v7();
    let (mut held, row) = AdvisoryLock::acquire_workspace_with(
        &env.pool,
        id,
        false,
        short,
        LeaseCommit::WithNextCommit,
    )
    .await
    .unwrap();
    assert!(row.is_none(), "no such workspace");
    // The lease is there for every other taker as soon as the lock is reported taken.
    let fence = held.fence();
    let leases: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM grove.lock_leases WHERE key = $1 AND holder = $2 AND exclusive",
    )
    .bind(fence.key)
    .bind(fence.holder)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(leases, 1);
    let err = AdvisoryLock::acquire_workspace(&env.pool, id, true, short)
        .await
        .err()
        .expect("a second holder got in");
    assert!(matches!(err, StoreError::Locked(_)), "{err:?}");
    held.make_durable().await.unwrap();
    // A lease lost before it reached disk (the database crashed) is a lost lease: making
    // it durable and writing under it are refused.
    let (mut lost, _) = {
        held.release().await.unwrap();
        AdvisoryLock::acquire_workspace_with(
            &env.pool,
            id,
            false,
            short,
            LeaseCommit::WithNextCommit,
        )
        .await
        .unwrap()
    };
    let fence = lost.fence();
    sqlx::query("DELETE FROM grove.lock_leases WHERE key = $1 AND holder = $2")
        .bind(fence.key)
        .bind(fence.holder)
        .execute(&env.pool)
        .await
        .unwrap();
    let err = lost
        .make_durable()
        .await
        .expect_err("a lost lease was made durable");
    assert!(matches!(err, StoreError::Fenced(_)), "{err:?}");
    let mut conn = env.pool.acquire().await.unwrap();
    let err = grove_postgres::store::end_fences(&mut conn, &[fence])
        .await
        .expect_err("a write under a lost lease passed the fence");
    assert!(matches!(err, StoreError::Fenced(_)), "{err:?}");
    let _ = lost.release().await;
}

/// An inline command recorded after its effect (`grove.record_inline`, ADR 35) under a
/// generic lock whose lease rides on that commit: the lease keeps other takers out at
/// once; a lost lease refuses the record and leaves no ledger row, job or event; a
/// taken command id writes nothing; otherwise the row is finished and the job closed in
/// the one statement.
#[tokio::test(flavor = "multi_thread")]
async fn an_inline_record_is_fenced_idempotent_and_whole() {
    use grove_core::commands::{Command, CommandResult, EnsureRepoCache};
    use grove_core::events::{Correlation, Metadata};
    use grove_postgres::locks::LeaseCommit;
    use grove_postgres::queue;
    let env = env_or_skip!("an_inline_record_is_fenced_idempotent_and_whole");
    let q = queue::node_queue("n");
    queue::register_worker(&env.pool, "w-inline", std::slice::from_ref(&q))
        .await
        .unwrap();
    let value = format!("inline-record-{}", uuid::Uuid::now_v7());
    let take = || {
        AdvisoryLock::acquire_with(
            &env.pool,
            LockScope::WorkspaceKey,
            &value,
            false,
            Duration::from_secs(1),
            LeaseCommit::WithNextCommit,
        )
    };
    let mut lock = take().await.unwrap();
    let other = AdvisoryLock::acquire(
        &env.pool,
        LockScope::WorkspaceKey,
        &value,
        true,
        Duration::from_millis(300),
    )
    .await;
    assert!(
        matches!(other, Err(StoreError::Locked(_))),
        "a second holder got in"
    );
    let command = Command::EnsureRepoCache(EnsureRepoCache {
        repo_name: "acme/widgets".into(),
        repo_url: "https://example.invalid/acme/widgets.git".into(),
        fetch: false,
    });
    let id = uuid::Uuid::now_v7();
    let md = Metadata {
        command_id: id,
        correlation: Correlation::default(),
        worker_id: "w-inline".into(),
        node: "n".into(),
    };
    let outcome = Ok(CommandResult::Done);
    async fn record(
        lock: &mut AdvisoryLock,
        id: uuid::Uuid,
        command: &Command,
        md: &Metadata,
        outcome: &Result<CommandResult, grove_core::error::CommandError>,
    ) -> Result<bool, StoreError> {
        let fences = [lock.fence()];
        let mut tx = sqlx::Connection::begin(lock.conn()).await.unwrap();
        let job = queue::record_inline(
            &mut tx,
            (id, command),
            &queue::node_queue("n"),
            "w-inline",
            outcome,
            &[],
            md,
            chrono::Utc::now(),
            &fences,
        )
        .await;
        if job.as_ref().is_ok_and(|j| j.is_some()) {
            tx.commit().await.unwrap();
        }
        job.map(|j| j.is_some())
    }
    let ledger = |id: uuid::Uuid| {
        sqlx::query_as::<_, (String, Option<String>)>(
            "SELECT c.status, j.status FROM grove.commands c
               LEFT JOIN apalis.jobs j ON j.id = c.job_id WHERE c.command_id = $1",
        )
        .bind(id)
        .fetch_optional(&env.pool)
    };

    // The lease lost (taken over): refused, nothing written.
    sqlx::query("DELETE FROM grove.lock_leases WHERE key = $1")
        .bind(lock.fence().key)
        .execute(&env.pool)
        .await
        .unwrap();
    let err = record(&mut lock, id, &command, &md, &outcome)
        .await
        .expect_err("a lost lease must refuse the record");
    assert!(matches!(err, StoreError::Fenced(_)), "{err:?}");
    assert!(
        ledger(id).await.unwrap().is_none(),
        "no ledger row under a lost lease"
    );
    drop(lock);

    // Held: recorded whole, then the same id again writes nothing.
    let mut lock = take().await.unwrap();
    assert!(
        record(&mut lock, id, &command, &md, &outcome)
            .await
            .unwrap(),
        "recorded"
    );
    assert_eq!(
        ledger(id).await.unwrap(),
        Some(("succeeded".into(), Some("Done".into())))
    );
    assert!(
        !record(&mut lock, id, &command, &md, &outcome)
            .await
            .unwrap(),
        "a taken command id writes nothing"
    );
    lock.release().await.unwrap();
}
