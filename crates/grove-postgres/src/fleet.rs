//! What `/metrics` reads from the database when it is scraped: open jobs per queue and
//! the oldest due wait, live workers, and workspaces and repo caches per node and state
//! with their cached sizes. Four aggregates over indexes
//! (`migrations/20270121000001_metrics_indexes.sql`) on one connection; nothing that
//! names a user, a repository or a path is read.

use std::time::Duration;

use sqlx::{PgPool, Row};

use crate::StoreError;

/// Open jobs of one queue.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueDepth {
    pub queue: String,
    /// `Pending` jobs, due or waiting for a retry's backoff.
    pub pending: i64,
    /// Claimed jobs (`Queued` or `Running`).
    pub running: i64,
    /// How long the oldest due `Pending` job has waited (0 when none is due).
    pub oldest_due_secs: f64,
}

/// Records of one node in one state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateCount {
    pub node: String,
    pub state: String,
    pub count: i64,
    /// Their cached sizes, summed.
    pub bytes: i64,
}

/// Everything the scrape reads.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FleetGauges {
    pub queues: Vec<QueueDepth>,
    pub workers_alive: i64,
    pub workspaces: Vec<StateCount>,
    pub repo_caches: Vec<StateCount>,
}

const QUEUES: &str = "SELECT job_type AS queue,
        count(*) FILTER (WHERE status = 'Pending') AS pending,
        count(*) FILTER (WHERE status <> 'Pending') AS running,
        coalesce(extract(epoch FROM now() - min(run_at) FILTER (WHERE status = 'Pending' AND run_at <= now())), 0)::float8 AS oldest
    FROM apalis.jobs WHERE status IN ('Pending', 'Queued', 'Running')
    GROUP BY job_type ORDER BY job_type";

const WORKSPACES: &str =
    "SELECT node, state, count(*) AS n, coalesce(sum(size_bytes), 0)::bigint AS bytes
    FROM grove.sandbox_workspaces GROUP BY node, state ORDER BY node, state";

const REPO_CACHES: &str =
    "SELECT node, state, count(*) AS n, coalesce(sum(size_bytes), 0)::bigint AS bytes
    FROM grove.sandbox_repo_caches GROUP BY node, state ORDER BY node, state";

/// Reads the gauges; a worker is alive if it heart-beat within `alive_within`.
pub async fn read(pool: &PgPool, alive_within: Duration) -> Result<FleetGauges, StoreError> {
    let mut conn = pool.acquire().await?;
    let queues = sqlx::query(QUEUES)
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|r| {
            Ok(QueueDepth {
                queue: r.try_get("queue")?,
                pending: r.try_get("pending")?,
                running: r.try_get("running")?,
                oldest_due_secs: r.try_get("oldest")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
    let workers_alive = sqlx::query_scalar(
        "SELECT count(*) FROM apalis.workers WHERE worker_type = $1 AND last_seen > now() - make_interval(secs => $2)",
    )
    .bind(crate::queue::WORKER_TYPE)
    .bind(alive_within.as_secs_f64())
    .fetch_one(&mut *conn)
    .await?;
    let workspaces = state_counts(&mut conn, WORKSPACES).await?;
    let repo_caches = state_counts(&mut conn, REPO_CACHES).await?;
    Ok(FleetGauges {
        queues,
        workers_alive,
        workspaces,
        repo_caches,
    })
}

async fn state_counts(
    conn: &mut sqlx::PgConnection,
    sql: &'static str,
) -> Result<Vec<StateCount>, StoreError> {
    Ok(sqlx::query(sql)
        .fetch_all(conn)
        .await?
        .iter()
        .map(|r| {
            Ok(StateCount {
                node: r.try_get("node")?,
                state: r.try_get("state")?,
                count: r.try_get("n")?,
                bytes: r.try_get("bytes")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?)
}
