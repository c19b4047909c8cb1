//! The queue's own guarantees: backoff that survives a restart, pruning.

use std::time::{Duration, Instant};

use grove_e2e::text;

use crate::env_or_skip;

#[tokio::test(flavor = "multi_thread")]
async fn a_transient_failure_is_retried_with_backoff_that_survives_a_worker_restart() {
    let mut env =
        env_or_skip!("a_transient_failure_is_retried_with_backoff_that_survives_a_worker_restart");
    let first = env.spawn_worker().await;
    let started = Instant::now();
    let missing = format!("file://{}/not-there-yet", env.dir.path().display());
    let waiting = tokio::spawn(
        env.command(&["repo", "ensure", "--repo", "o/late", "--url", &missing])
            .output(),
    );
    // Wait for the first failed attempt to be scheduled for later.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let due_later: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM grove.commands c JOIN apalis.jobs j ON j.id = c.job_id
             WHERE c.status = 'queued' AND c.attempts >= 1 AND j.run_at > now()",
        )
        .fetch_one(&env.pool)
        .await
        .unwrap();
        if due_later > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no retry was scheduled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The worker dies during the backoff; a new one takes over the schedule from Postgres.
    env.worker(first).kill9().await;
    env.spawn_worker().await;
    let out = waiting.await.unwrap().unwrap();
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    assert!(text(&out).1.contains("unavailable"), "{:?}", text(&out));
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM grove.commands")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(attempts, 5, "an idempotent command gets five attempts");
    // Backoff 1 + 2 + 4 + 8 s between the five attempts.
    assert!(
        started.elapsed() >= Duration::from_secs(15),
        "retries came too fast: {:?}",
        started.elapsed()
    );
    assert_eq!(env.count_events("repo_cache.created").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn finished_jobs_and_ledger_rows_are_pruned_but_events_stay() {
    let mut env = env_or_skip!("finished_jobs_and_ledger_rows_are_pruned_but_events_stay");
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    env.grove_json(&["repo", "ensure", "--repo", "o/fixture", "--url", &url])
        .await;
    env.grove_json(&["repo", "ensure", "--repo", "o/fixture", "--url", &url])
        .await;
    let count = |sql: &'static str| {
        let pool = env.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(count("SELECT count(*) FROM apalis.jobs").await, 2);
    // Nothing is old enough yet under the default window.
    grove_postgres::queue::prune(&env.pool, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(count("SELECT count(*) FROM apalis.jobs").await, 2);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    grove_postgres::queue::prune(&env.pool, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(count("SELECT count(*) FROM apalis.jobs").await, 0);
    assert_eq!(count("SELECT count(*) FROM grove.commands").await, 0);
    assert_eq!(count("SELECT count(*) FROM grove.events").await, 2);
    let verify = env.grove(&["replay", "--verify"]).await;
    assert!(verify.status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn advisory_locks_exclude_time_out_as_locked_share_reads_and_leave_no_timeout_behind() {
    use grove_postgres::locks::{AdvisoryLock, LockScope};
    use grove_postgres::StoreError;
    let env = env_or_skip!(
        "advisory_locks_exclude_time_out_as_locked_share_reads_and_leave_no_timeout_behind"
    );
    // A pool of one: every lock and the check below use the same connection in turn.
    let one = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*env.pool.connect_options()).clone())
        .await
        .unwrap();
    let other = &env.pool;
    let short = Duration::from_millis(200);
    let held = AdvisoryLock::acquire(other, LockScope::WorkspaceCommands, "w1", false, short)
        .await
        .unwrap();
    let t = Instant::now();
    let err = AdvisoryLock::acquire(&one, LockScope::WorkspaceCommands, "w1", true, short)
        .await
        .err()
        .expect("a shared lock must wait for an exclusive one");
    assert!(matches!(err, StoreError::Locked(_)), "{err:?}");
    assert!(t.elapsed() >= short, "gave up after {:?}", t.elapsed());
    // Another key is free.
    let w2 = AdvisoryLock::acquire(&one, LockScope::WorkspaceCommands, "w2", false, short)
        .await
        .unwrap();
    w2.release().await.unwrap();
    held.release().await.unwrap();

    // Shared locks coexist; an exclusive one waits for both to go.
    let r1 = AdvisoryLock::acquire(other, LockScope::WorkspaceCommands, "w1", true, short)
        .await
        .unwrap();
    let r2 = AdvisoryLock::acquire(&one, LockScope::WorkspaceCommands, "w1", true, short)
        .await
        .unwrap();
    let err = AdvisoryLock::acquire(other, LockScope::WorkspaceCommands, "w1", false, short)
        .await
        .err()
        .expect("an exclusive lock must wait for shared ones");
    assert!(matches!(err, StoreError::Locked(_)), "{err:?}");
    r2.release().await.unwrap();
    // Released: its connection is back in the pool with the timeout reset.
    let timeout: String = sqlx::query_scalar("SHOW lock_timeout")
        .fetch_one(&one)
        .await
        .unwrap();
    assert_eq!(timeout, "0");
    r1.release().await.unwrap();
    let w = AdvisoryLock::acquire(other, LockScope::WorkspaceCommands, "w1", false, short)
        .await
        .unwrap();
    w.release().await.unwrap();
    one.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_claim_starts_due_jobs_closes_finished_ones_and_kills_unreadable_ones() {
    use grove_core::commands::{Command, CommandResult};
    use grove_postgres::queue::{self, Start};
    let env =
        env_or_skip!("one_claim_starts_due_jobs_closes_finished_ones_and_kills_unreadable_ones");
    let pool = &env.pool;
    let q = queue::node_queue("claimtest");
    queue::register_worker(pool, "w-claim", std::slice::from_ref(&q))
        .await
        .unwrap();
    queue::register_worker(pool, "w-other", std::slice::from_ref(&q))
        .await
        .unwrap();
    let hibernate = |i: u128| Command::HibernateRuntime {
        workspace_id: uuid::Uuid::from_u128(i),
    };
    let (run_id, done_id) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    let mut conn = pool.acquire().await.unwrap();
    queue::enqueue(&mut conn, run_id, &hibernate(1), &q, Some("tok"))
        .await
        .unwrap();
    queue::enqueue(&mut conn, done_id, &hibernate(2), &q, None)
        .await
        .unwrap();
    // A duplicate delivery: the ledger already has this command's outcome.
    sqlx::query("UPDATE grove.commands SET status = 'succeeded' WHERE command_id = $1")
        .bind(done_id)
        .execute(pool)
        .await
        .unwrap();
    // A job row grove did not write: no command id in its key.
    sqlx::query(
        "INSERT INTO apalis.jobs (job, id, job_type, status, attempts, max_attempts, run_at, priority, idempotency_key)
         VALUES ('\\x7b7d', 'rogue-job', $1, 'Pending', 0, 5, now(), 0, 'not-a-command-id')",
    )
    .bind(&q)
    .execute(pool)
    .await
    .unwrap();

    let claimed = queue::claim_and_start(pool, "w-claim", &q, 10)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 3, "{claimed:?}");
    let mut started = None;
    for (job, start) in &claimed {
        match start {
            Start::Run {
                attempt,
                resumed,
                token,
                ..
            } => {
                assert_eq!(job.command_id, run_id);
                assert_eq!((*attempt, *resumed), (1, false));
                assert_eq!(
                    token.as_deref(),
                    Some("tok"),
                    "the token comes with the start"
                );
                started = Some(job.clone());
            }
            Start::AlreadyFinished => assert_ne!(job.command_id, run_id),
        }
    }
    let started = started.expect("the queued command was started");
    let states: Vec<(String, String)> =
        sqlx::query_as("SELECT id, status FROM apalis.jobs WHERE job_type = $1 ORDER BY id")
            .bind(&q)
            .fetch_all(pool)
            .await
            .unwrap();
    for (id, status) in &states {
        let want = if id == "rogue-job" {
            "Killed"
        } else if *id == started.job_id {
            "Running"
        } else {
            "Done"
        };
        assert_eq!(status, want, "job {id}: {states:?}");
    }
    let (status, worker): (String, Option<String>) =
        sqlx::query_as("SELECT status, worker_id FROM grove.commands WHERE command_id = $1")
            .bind(run_id)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(
        (status.as_str(), worker.as_deref()),
        ("running", Some("w-claim"))
    );
    // Nothing is left to claim.
    assert!(queue::claim_and_start(pool, "w-other", &q, 10)
        .await
        .unwrap()
        .is_empty());

    // Only the attempt's owner records the outcome: another worker's is dropped whole.
    let md = grove_core::events::Metadata {
        command_id: run_id,
        correlation: Default::default(),
        worker_id: "w-other".into(),
        node: "claimtest".into(),
    };
    let ok: Result<CommandResult, grove_core::error::CommandError> = Ok(CommandResult::Done);
    let recorded = queue::finish_on(
        &mut conn,
        &started,
        "w-other",
        &ok,
        &[],
        &md,
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    assert!(
        !recorded,
        "a worker that does not hold the attempt recorded its outcome"
    );
    let status: String =
        sqlx::query_scalar("SELECT status FROM grove.commands WHERE command_id = $1")
            .bind(run_id)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(status, "running");
    let recorded = queue::finish_on(
        &mut conn,
        &started,
        "w-claim",
        &ok,
        &[],
        &md,
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    assert!(recorded);
    let (status, job_status, secrets): (String, String, i64) = sqlx::query_as(
        "SELECT c.status, j.status, (SELECT count(*) FROM grove.command_secrets s WHERE s.command_id = c.command_id)
         FROM grove.commands c JOIN apalis.jobs j ON j.id = c.job_id WHERE c.command_id = $1",
    )
    .bind(run_id)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        (status.as_str(), job_status.as_str(), secrets),
        ("succeeded", "Done", 0)
    );
}

/// The state of a command's ledger row and job: (ledger status, worker, attempts, job
/// status, job lock).
async fn ledger_and_job(
    pool: &sqlx::PgPool,
    command_id: uuid::Uuid,
) -> (String, Option<String>, i32, String, Option<String>) {
    sqlx::query_as(
        "SELECT c.status, c.worker_id, c.attempts, j.status, j.lock_by
         FROM grove.commands c JOIN apalis.jobs j ON j.id = c.job_id WHERE c.command_id = $1",
    )
    .bind(command_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_claimed_with_an_outcome_is_started_and_recovered_like_any_claimed_job() {
    use grove_core::commands::{Command, CommandResult};
    use grove_postgres::queue::{self, Finished, NextClaim, Outcome, Start};
    let env =
        env_or_skip!("a_job_claimed_with_an_outcome_is_started_and_recovered_like_any_claimed_job");
    let pool = &env.pool;
    let q = queue::node_queue("chaintest");
    let queues = vec![queue::node_queue("chaintest-empty"), q.clone()];
    for w in ["w-chain", "w-live", "w-stranger"] {
        queue::register_worker(pool, w, std::slice::from_ref(&q))
            .await
            .unwrap();
    }
    let hibernate = |i: u128| Command::HibernateRuntime {
        workspace_id: uuid::Uuid::from_u128(i),
    };
    let ids: Vec<uuid::Uuid> = (0..3).map(|_| uuid::Uuid::now_v7()).collect();
    let mut conn = pool.acquire().await.unwrap();
    for (i, id) in ids.iter().enumerate() {
        queue::enqueue(&mut conn, *id, &hibernate(i as u128 + 1), &q, None)
            .await
            .unwrap();
    }
    let claimed = queue::claim_and_start(pool, "w-chain", &q, 1)
        .await
        .unwrap();
    let (first, _) = claimed.into_iter().next().expect("a due job");
    assert_eq!(first.command_id, ids[0], "the oldest due job first");
    assert_eq!(
        ledger_and_job(pool, ids[0]).await,
        (
            "running".into(),
            Some("w-chain".into()),
            1,
            "Running".into(),
            Some("w-chain".into())
        ),
        "the claim writes the job straight to Running"
    );
    let ok: Result<CommandResult, grove_core::error::CommandError> = Ok(CommandResult::Done);
    let md = |id, worker: &str| grove_core::events::Metadata {
        command_id: id,
        correlation: Default::default(),
        worker_id: worker.into(),
        node: "chaintest".into(),
    };
    let next = NextClaim {
        queues: &queues,
        limit: 1,
    };

    // An outcome that is not recorded (another worker's attempt) claims nothing.
    let md_stranger = md(ids[0], "w-stranger");
    let stranger = Outcome {
        job: &first,
        worker_id: "w-stranger",
        outcome: &ok,
        events: &[],
        metadata: &md_stranger,
        at: chrono::Utc::now(),
    };
    let Finished {
        recorded,
        next: got,
    } = queue::finish_claiming(&mut conn, &stranger, &[], Some(&next))
        .await
        .unwrap();
    assert!(!recorded && got.is_empty(), "{got:?}");
    assert_eq!(ledger_and_job(pool, ids[1]).await.0, "queued");

    // The owner's outcome records the job and starts the next one in one transaction.
    let md_chain = md(ids[0], "w-chain");
    let done = Outcome {
        worker_id: "w-chain",
        metadata: &md_chain,
        ..stranger
    };
    let Finished {
        recorded,
        next: got,
    } = queue::finish_claiming(&mut conn, &done, &[], Some(&next))
        .await
        .unwrap();
    assert!(recorded);
    assert_eq!(ledger_and_job(pool, ids[0]).await.3, "Done");
    assert_eq!(got.len(), 1, "{got:?}");
    let (second, start) = &got[0];
    assert_eq!(second.command_id, ids[1]);
    assert!(
        matches!(
            start,
            Start::Run {
                attempt: 1,
                resumed: false,
                ..
            }
        ),
        "{start:?}"
    );
    assert_eq!(
        ledger_and_job(pool, ids[1]).await,
        (
            "running".into(),
            Some("w-chain".into()),
            1,
            "Running".into(),
            Some("w-chain".into())
        )
    );
    assert_eq!(
        ledger_and_job(pool, ids[2]).await.0,
        "queued",
        "one job per slot"
    );

    // The worker dies holding the job it claimed with that outcome: orphan recovery hands
    // it back, and its next delivery is a resumed attempt (an exec or an edit would end
    // as worker_lost, an idempotent command runs again).
    sqlx::query(
        "UPDATE apalis.workers SET last_seen = now() - interval '1 hour' WHERE id = 'w-chain'",
    )
    .execute(pool)
    .await
    .unwrap();
    let recovered = queue::recover_orphans(pool, Duration::from_secs(15))
        .await
        .unwrap();
    assert_eq!(recovered, 1);
    assert_eq!(
        ledger_and_job(pool, ids[1]).await,
        (
            "running".into(),
            Some("w-chain".into()),
            1,
            "Pending".into(),
            None
        )
    );
    let again = queue::claim_and_start(pool, "w-live", &q, 2).await.unwrap();
    let resumed: Vec<_> = again
        .iter()
        .filter(|(j, _)| j.command_id == ids[1])
        .collect();
    assert_eq!(resumed.len(), 1, "{again:?}");
    assert!(
        matches!(
            resumed[0].1,
            Start::Run {
                attempt: 2,
                resumed: true,
                ..
            }
        ),
        "{:?}",
        resumed[0].1
    );
}

/// An outcome that appends no events is one statement with its next claim
/// (`grove.finish_claiming`, ADR 37): under a lock whose lease is gone it writes
/// nothing and claims nothing; under a live lock it records, claims and ends the lease.
#[tokio::test(flavor = "multi_thread")]
async fn an_outcome_whose_lock_lost_its_lease_records_nothing_and_claims_nothing() {
    use grove_core::commands::CommandResult;
    use grove_postgres::locks::{AdvisoryLock, LockScope};
    use grove_postgres::queue::{self, NextClaim, Outcome};
    use grove_postgres::StoreError;
    let env =
        env_or_skip!("an_outcome_whose_lock_lost_its_lease_records_nothing_and_claims_nothing");
    let pool = &env.pool;
    let (q, ids, first) = hibernates_first_claimed(pool, "fencedoutcome", "w-fenced", 2).await;
    let mut conn = pool.acquire().await.unwrap();
    let lost = workspace_lock(pool, &fresh_key()).await;
    // The lease lapsed and was taken over while the holder was away.
    lease_taken_over(pool, &lost).await;
    let ok: Result<CommandResult, grove_core::error::CommandError> = Ok(CommandResult::Done);
    let md = grove_core::events::Metadata {
        command_id: ids[0],
        correlation: Default::default(),
        worker_id: "w-fenced".into(),
        node: "fencedoutcome".into(),
    };
    let done = Outcome {
        job: &first,
        worker_id: "w-fenced",
        outcome: &ok,
        events: &[],
        metadata: &md,
        at: chrono::Utc::now(),
    };
    let queues = vec![q.clone()];
    let next = NextClaim {
        queues: &queues,
        limit: 1,
    };
    let fenced = queue::finish_claiming(&mut conn, &done, &[lost.fence()], Some(&next)).await;
    assert!(matches!(fenced, Err(StoreError::Fenced(_))), "{fenced:?}");
    assert_eq!(
        (
            ledger_and_job(pool, ids[0]).await.0,
            ledger_and_job(pool, ids[0]).await.3
        ),
        ("running".into(), "Running".into()),
        "nothing of the outcome was written"
    );
    assert_eq!(
        ledger_and_job(pool, ids[1]).await.0,
        "queued",
        "nothing claimed"
    );
    drop(lost);

    let live_key = fresh_key();
    let mut live = workspace_lock(pool, &live_key).await;
    let finished = queue::finish_claiming(&mut conn, &done, &[live.fence()], Some(&next))
        .await
        .unwrap();
    assert!(finished.recorded);
    assert_eq!(ledger_and_job(pool, ids[0]).await.3, "Done");
    let claimed: Vec<_> = finished.next.iter().map(|(j, _)| j.command_id).collect();
    assert_eq!(claimed, vec![ids[1]]);
    assert_eq!(ledger_and_job(pool, ids[1]).await.0, "running");
    // The recorded outcome ended the lock's lease in its commit (ADR 39) ...
    let leases: i64 = sqlx::query_scalar("SELECT count(*) FROM grove.lock_leases WHERE key = $1")
        .bind(live.fence().key)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(leases, 0, "the outcome deletes its lock's lease");
    // ... so a holder that dies between that commit and its unlock blocks no one for
    // the lease's length (10 s): the next taker waits only for the session to end.
    live.lease_ended();
    drop(live);
    let next_holder = AdvisoryLock::acquire(
        pool,
        LockScope::WorkspaceCommands,
        &live_key,
        false,
        Duration::from_secs(3),
    )
    .await
    .expect("taken once the dead holder's session ended");
    next_holder.release().await.unwrap();
}

/// An outcome with events ends its locks' leases in its transaction too
/// (`store::end_fences`, ADR 39): when one of two locks lost its lease nothing is
/// written and the other lease is kept (the deletes roll back with the outcome); when
/// both hold, the outcome and its events are recorded and both leases are gone.
#[tokio::test(flavor = "multi_thread")]
async fn an_outcome_with_events_ends_every_lease_or_none() {
    use grove_core::commands::CommandResult;
    use grove_core::events::Event;
    use grove_postgres::locks::AdvisoryLock;
    use grove_postgres::queue::{self, Outcome};
    use grove_postgres::StoreError;
    let env = env_or_skip!("an_outcome_with_events_ends_every_lease_or_none");
    let pool = &env.pool;
    let (_, ids, job) = hibernates_first_claimed(pool, "endedleases", "w-ended", 1).await;
    let id = ids[0];
    let mut conn = pool.acquire().await.unwrap();
    let leases = |a: &AdvisoryLock, b: &AdvisoryLock| {
        let keys = vec![a.fence().key, b.fence().key];
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM grove.lock_leases WHERE key = ANY($1)",
            )
            .bind(keys)
            .fetch_one(pool)
            .await
            .unwrap()
        }
    };
    let runtime_id = uuid::Uuid::now_v7();
    let events = vec![Event::RuntimeDestroyed {
        runtime_id,
        reason: "test".into(),
    }];
    let ok: Result<CommandResult, grove_core::error::CommandError> = Ok(CommandResult::Done);
    let md = grove_core::events::Metadata {
        command_id: id,
        correlation: Default::default(),
        worker_id: "w-ended".into(),
        node: "endedleases".into(),
    };
    let done = Outcome {
        job: &job,
        worker_id: "w-ended",
        outcome: &ok,
        events: &events,
        metadata: &md,
        at: chrono::Utc::now(),
    };
    let logged = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM grove.events WHERE command_id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap()
    };

    let (kept, lost) = (
        workspace_lock(pool, &fresh_key()).await,
        workspace_lock(pool, &fresh_key()).await,
    );
    lease_taken_over(pool, &lost).await;
    let fenced =
        queue::finish_claiming(&mut conn, &done, &[kept.fence(), lost.fence()], None).await;
    assert!(matches!(fenced, Err(StoreError::Fenced(_))), "{fenced:?}");
    assert_eq!(ledger_and_job(pool, id).await.0, "running");
    assert_eq!(logged().await, 0, "no event of a fenced outcome");
    assert_eq!(
        leases(&kept, &lost).await,
        1,
        "the live lock keeps its lease"
    );
    kept.release().await.unwrap();
    drop(lost);

    let (mut a, mut b) = (
        workspace_lock(pool, &fresh_key()).await,
        workspace_lock(pool, &fresh_key()).await,
    );
    let finished = queue::finish_claiming(&mut conn, &done, &[a.fence(), b.fence()], None)
        .await
        .unwrap();
    assert!(finished.recorded);
    assert_eq!(ledger_and_job(pool, id).await.0, "succeeded");
    assert_eq!(logged().await, 1);
    assert_eq!(
        leases(&a, &b).await,
        0,
        "the outcome's commit ended both leases"
    );
    a.lease_ended();
    b.lease_ended();
    a.release().await.unwrap();
    b.release().await.unwrap();
}

/// `n` hibernate commands enqueued on `node`'s queue and the first claimed by `worker`:
/// the queue, the command ids in order, the claimed job.
async fn hibernates_first_claimed(
    pool: &sqlx::PgPool,
    node: &str,
    worker: &str,
    n: usize,
) -> (String, Vec<uuid::Uuid>, grove_postgres::queue::ClaimedJob) {
    use grove_core::commands::Command;
    use grove_postgres::queue;
    let q = queue::node_queue(node);
    queue::register_worker(pool, worker, std::slice::from_ref(&q))
        .await
        .unwrap();
    let ids: Vec<uuid::Uuid> = (0..n).map(|_| uuid::Uuid::now_v7()).collect();
    let mut conn = pool.acquire().await.unwrap();
    for id in &ids {
        let hibernate = Command::HibernateRuntime {
            workspace_id: uuid::Uuid::now_v7(),
        };
        queue::enqueue(&mut conn, *id, &hibernate, &q, None)
            .await
            .unwrap();
    }
    let (first, _) = queue::claim_and_start(pool, worker, &q, 1)
        .await
        .unwrap()
        .into_iter()
        .next()
        .expect("a due job");
    assert_eq!(first.command_id, ids[0]);
    (q, ids, first)
}

/// A `workspace_commands` lock on `key`, taken within 5 s.
async fn workspace_lock(pool: &sqlx::PgPool, key: &str) -> grove_postgres::locks::AdvisoryLock {
    use grove_postgres::locks::{AdvisoryLock, LockScope};
    AdvisoryLock::acquire(
        pool,
        LockScope::WorkspaceCommands,
        key,
        false,
        Duration::from_secs(5),
    )
    .await
    .unwrap()
}

/// A lock key no other test uses.
fn fresh_key() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// What a takeover does to `lock`'s lease row once it expired: deletes it.
async fn lease_taken_over(pool: &sqlx::PgPool, lock: &grove_postgres::locks::AdvisoryLock) {
    sqlx::query("DELETE FROM grove.lock_leases WHERE key = $1 AND holder = $2")
        .bind(lock.fence().key)
        .bind(lock.fence().holder)
        .execute(pool)
        .await
        .unwrap();
}
