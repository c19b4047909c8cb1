//! Reads the worker needs outside the projections' row functions: a node's disk usage
//! as its records state it, and the runtime records of one backend.

use sqlx::PgPool;
use uuid::Uuid;

/// The cached sizes of `node`'s live workspaces and repo caches, summed (bytes).
pub async fn node_usage_bytes(pool: &PgPool, node: &str) -> Result<i64, sqlx::Error> {
    let used: Option<i64> = sqlx::query_scalar(
        "SELECT ((SELECT coalesce(sum(size_bytes), 0) FROM grove.sandbox_workspaces WHERE node = $1 AND state <> 'evicted')
              + (SELECT coalesce(sum(size_bytes), 0) FROM grove.sandbox_repo_caches WHERE node = $1 AND state <> 'evicted'))::bigint",
    )
    .bind(node)
    .fetch_one(pool)
    .await?;
    Ok(used.unwrap_or(0))
}

/// The ids of every runtime record of `backend_kind` (any node, any state).
pub async fn runtime_ids_of_kind(
    pool: &PgPool,
    backend_kind: &str,
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM grove.sandbox_runtimes WHERE backend_kind = $1")
        .bind(backend_kind)
        .fetch_all(pool)
        .await
}
