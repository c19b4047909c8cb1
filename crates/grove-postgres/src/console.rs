//! The reads of the operator console (`/ui`, ADR 29): the fleet, a page of workspaces,
//! a workspace's timeline with its kept exec output, a filtered page of the event log,
//! and the console's `replay --verify` runs.
//!
//! Every read is bounded (a page, a top-N or a grouping over an index) so that a page
//! renders in well under 200 ms with 10,000 workspaces and a million events; the indexes
//! are in `migrations/20270120000001_console.sql`. The console owns the tenancy decisions
//! around them: each function that can return another user's rows takes the user to
//! limit them to (`None`: an operator, everyone's).

use chrono::{DateTime, Utc};
use grove_core::events::RecordedEvent;
use serde::Serialize;
use sqlx::{PgPool, Row};
use uuid::Uuid;

use crate::reader::event_from_row;
use crate::{trusted, StoreError};

/// One registered worker and what it is doing.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerInfo {
    pub id: String,
    /// From its `grove:node:` queue (`None`: it serves no node queue).
    pub node: Option<String>,
    pub queues: Vec<String>,
    pub concurrency: Option<i64>,
    pub last_seen: DateTime<Utc>,
    pub running: i64,
}

/// Jobs waiting and running in one queue.
#[derive(Debug, Clone, Serialize)]
pub struct QueueInfo {
    pub queue: String,
    pub pending: i64,
    pub running: i64,
    pub oldest_waiting: Option<DateTime<Utc>>,
}

/// Failed commands of one queue and kind in the last hour.
#[derive(Debug, Clone, Serialize)]
pub struct FailureCount {
    pub queue: String,
    pub kind: String,
    pub failed: i64,
}

/// One failed command, with its typed error.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    pub command_id: Uuid,
    pub kind: String,
    pub queue: String,
    pub finished_at: Option<DateTime<Utc>>,
    pub error_kind: Option<String>,
    pub message: Option<String>,
    pub workspace_id: Option<String>,
}

/// What the Fleet page shows.
#[derive(Debug, Clone, Serialize)]
pub struct Fleet {
    pub workers: Vec<WorkerInfo>,
    pub queues: Vec<QueueInfo>,
    pub failed_last_hour: Vec<FailureCount>,
    pub recent_failures: Vec<Failure>,
}

/// The workers, queues and failures (operators only: failures are everyone's).
pub async fn fleet(pool: &PgPool) -> Result<Fleet, StoreError> {
    Ok(Fleet {
        workers: workers(pool).await?,
        queues: queues(pool).await?,
        failed_last_hour: failed_last_hour(pool).await?,
        recent_failures: recent_failures(pool, 20).await?,
    })
}

async fn workers(pool: &PgPool) -> Result<Vec<WorkerInfo>, StoreError> {
    let rows = sqlx::query(
        "SELECT w.id, w.storage_name, w.layers, w.last_seen,
                (SELECT count(*) FROM grove.commands c
                 WHERE c.status = 'running' AND c.worker_id = w.id) AS running
         FROM apalis.workers w WHERE w.worker_type = $1
         ORDER BY w.last_seen DESC LIMIT 200",
    )
    .bind(crate::queue::WORKER_TYPE)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            let storage: String = r.try_get("storage_name")?;
            let layers: String = r.try_get("layers")?;
            let queues: Vec<String> = storage
                .split(',')
                .filter(|q| !q.is_empty())
                .map(str::to_owned)
                .collect();
            Ok(WorkerInfo {
                id: r.try_get("id")?,
                node: queues
                    .iter()
                    .find_map(|q| q.strip_prefix("grove:node:"))
                    .map(str::to_owned),
                queues,
                concurrency: layers
                    .strip_prefix("concurrency=")
                    .and_then(|n| n.parse().ok()),
                last_seen: r.try_get("last_seen")?,
                running: r.try_get("running")?,
            })
        })
        .collect()
}

async fn queues(pool: &PgPool) -> Result<Vec<QueueInfo>, StoreError> {
    let rows = sqlx::query(
        "SELECT job_type AS queue,
                count(*) FILTER (WHERE status = 'Pending') AS pending,
                count(*) FILTER (WHERE status IN ('Queued', 'Running')) AS running,
                min(run_at) FILTER (WHERE status = 'Pending') AS oldest_waiting
         FROM apalis.jobs WHERE status IN ('Pending', 'Queued', 'Running')
         GROUP BY job_type ORDER BY job_type",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(QueueInfo {
                queue: r.try_get("queue")?,
                pending: r.try_get("pending")?,
                running: r.try_get("running")?,
                oldest_waiting: r.try_get("oldest_waiting")?,
            })
        })
        .collect()
}

async fn failed_last_hour(pool: &PgPool) -> Result<Vec<FailureCount>, StoreError> {
    let rows = sqlx::query(
        "SELECT queue, kind, count(*) AS failed FROM grove.commands
         WHERE status = 'failed' AND finished_at > now() - interval '1 hour'
         GROUP BY queue, kind ORDER BY queue, kind",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(FailureCount {
                queue: r.try_get("queue")?,
                kind: r.try_get("kind")?,
                failed: r.try_get("failed")?,
            })
        })
        .collect()
}

async fn recent_failures(pool: &PgPool, limit: i64) -> Result<Vec<Failure>, StoreError> {
    let rows = sqlx::query(
        "SELECT command_id, kind, queue, finished_at, error ->> 'kind' AS error_kind,
                error ->> 'message' AS message, payload ->> 'workspace_id' AS workspace_id
         FROM grove.commands WHERE status = 'failed'
         ORDER BY finished_at DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(Failure {
                command_id: r.try_get("command_id")?,
                kind: r.try_get("kind")?,
                queue: r.try_get("queue")?,
                finished_at: r.try_get("finished_at")?,
                error_kind: r.try_get("error_kind")?,
                message: r.try_get("message")?,
                workspace_id: r.try_get("workspace_id")?,
            })
        })
        .collect()
}

/// One row of the Workspaces page.
#[derive(Debug, Clone, Serialize)]
pub struct WorkspaceListRow {
    pub id: Uuid,
    pub user_id: String,
    pub project_id: String,
    pub repo_name: Option<String>,
    pub node: String,
    pub mode: String,
    pub state: String,
    pub dirty: bool,
    pub size_bytes: i64,
    pub last_used_at: DateTime<Utc>,
    pub pinned_until: Option<DateTime<Utc>>,
    /// 1 = the next workspace an eviction of its node would take, least recently used
    /// first among live, unpinned workspaces (ties: larger, then id); `None`: not a
    /// candidate (evicted, or pinned). `grove evict --dry-run` shows the exact plan.
    pub eviction_rank: Option<i64>,
}

/// One page of workspaces, most recently used first.
#[derive(Debug, Clone, Serialize)]
pub struct WorkspacePage {
    pub rows: Vec<WorkspaceListRow>,
    pub total: i64,
}

/// A page of the workspaces of `user` (`None`: everyone's) matching `search` (a
/// substring of the user, project or repository, any case, or the start of the id).
pub async fn workspace_page(
    pool: &PgPool,
    user: Option<&str>,
    search: Option<&str>,
    offset: i64,
    limit: i64,
) -> Result<WorkspacePage, StoreError> {
    let needle = search.map(str::to_lowercase);
    let (lo, hi) = search.and_then(id_range).unzip();
    let filter = "($1::text IS NULL OR w.user_id = $1) AND ($2::text IS NULL
        OR strpos(lower(w.user_id), $2) > 0 OR strpos(lower(w.project_id), $2) > 0
        OR strpos(lower(c.repo_name), $2) > 0 OR w.id BETWEEN $3 AND $4)";
    let total: i64 = sqlx::query_scalar(trusted(format!(
        "SELECT count(*) FROM grove.sandbox_workspaces w
         LEFT JOIN grove.sandbox_repo_caches c ON c.id = w.repo_cache_id WHERE {filter}"
    )))
    .bind(user)
    .bind(needle.as_deref())
    .bind(lo)
    .bind(hi)
    .fetch_one(pool)
    .await?;
    let rows = sqlx::query(trusted(format!(
        "WITH ranked AS (
             SELECT id, row_number() OVER (PARTITION BY node
                 ORDER BY last_used_at, size_bytes DESC, id) AS eviction_rank
             FROM grove.sandbox_workspaces
             WHERE state IN ('ready', 'released')
               AND (pinned_until IS NULL OR pinned_until <= now()))
         SELECT w.id, w.user_id, w.project_id, c.repo_name, w.node, w.mode, w.state,
                w.dirty, w.size_bytes, w.last_used_at, w.pinned_until, r.eviction_rank
         FROM grove.sandbox_workspaces w
         LEFT JOIN grove.sandbox_repo_caches c ON c.id = w.repo_cache_id
         LEFT JOIN ranked r ON r.id = w.id
         WHERE {filter}
         ORDER BY w.last_used_at DESC, w.id LIMIT $5 OFFSET $6"
    )))
    .bind(user)
    .bind(needle.as_deref())
    .bind(lo)
    .bind(hi)
    .bind(limit)
    .bind(offset)
    .fetch_all(pool)
    .await?;
    let rows = rows
        .iter()
        .map(list_row)
        .collect::<Result<_, StoreError>>()?;
    Ok(WorkspacePage { rows, total })
}

fn list_row(r: &sqlx::postgres::PgRow) -> Result<WorkspaceListRow, StoreError> {
    Ok(WorkspaceListRow {
        id: r.try_get("id")?,
        user_id: r.try_get("user_id")?,
        project_id: r.try_get("project_id")?,
        repo_name: r.try_get("repo_name")?,
        node: r.try_get("node")?,
        mode: r.try_get("mode")?,
        state: r.try_get("state")?,
        dirty: r.try_get("dirty")?,
        size_bytes: r.try_get("size_bytes")?,
        last_used_at: r.try_get("last_used_at")?,
        pinned_until: r.try_get("pinned_until")?,
        eviction_rank: r.try_get("eviction_rank")?,
    })
}

/// The ids starting with `prefix` (hex digits and dashes of a UUID, any case), as the
/// lowest and highest such UUID; `None` when it cannot begin a UUID.
fn id_range(prefix: &str) -> Option<(Uuid, Uuid)> {
    const SHAPE: &str = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
    let p = prefix.trim().to_ascii_lowercase();
    if p.is_empty() || p.len() > SHAPE.len() {
        return None;
    }
    let fits = p.chars().zip(SHAPE.chars()).all(|(c, s)| match s {
        '-' => c == '-',
        _ => c.is_ascii_hexdigit(),
    });
    let fill = |digit: char| {
        let rest: String = SHAPE[p.len()..]
            .chars()
            .map(|s| if s == '-' { '-' } else { digit })
            .collect();
        Uuid::parse_str(&format!("{p}{rest}")).ok()
    };
    fits.then(|| Some((fill('0')?, fill('f')?))).flatten()
}

/// Disk use of one node against the water marks of its last sweep.
#[derive(Debug, Clone, Serialize)]
pub struct NodeDisk {
    pub node: String,
    /// Cached sizes of its live workspaces and repo caches.
    pub used_bytes: i64,
    /// From the node's most recent `eviction.sweep_finished` (`None`: never swept).
    pub marks: Option<grove_core::eviction::Marks>,
}

/// Disk use per node (everyone's workspaces: operators only).
pub async fn disk_per_node(pool: &PgPool) -> Result<Vec<NodeDisk>, StoreError> {
    let rows = sqlx::query(
        "SELECT node, sum(size_bytes)::bigint AS used FROM (
             SELECT node, size_bytes FROM grove.sandbox_workspaces
             WHERE state IN ('ready', 'released', 'evicting')
             UNION ALL
             SELECT node, size_bytes FROM grove.sandbox_repo_caches WHERE state <> 'evicted'
         ) u GROUP BY node ORDER BY node",
    )
    .fetch_all(pool)
    .await?;
    let sweeps = sqlx::query(
        "SELECT payload -> 'report' -> 'marks' AS marks, payload -> 'report' ->> 'node' AS node
         FROM grove.events WHERE event_type = 'eviction.sweep_finished'
         ORDER BY position DESC LIMIT 100",
    )
    .fetch_all(pool)
    .await?;
    let mut marks = std::collections::HashMap::new();
    for s in &sweeps {
        let node: Option<String> = s.try_get("node")?;
        let value: Option<serde_json::Value> = s.try_get("marks")?;
        if let (Some(node), Some(value)) = (node, value) {
            if let Ok(m) = serde_json::from_value(value) {
                marks.entry(node).or_insert(m);
            }
        }
    }
    rows.iter()
        .map(|r| {
            let node: String = r.try_get("node")?;
            Ok(NodeDisk {
                marks: marks.get(&node).copied(),
                used_bytes: r.try_get("used")?,
                node,
            })
        })
        .collect()
}

/// A runtime of a workspace, as the projection holds it.
#[derive(Debug, Clone, Serialize)]
pub struct RuntimeInfo {
    pub id: Uuid,
    pub backend_kind: String,
    pub state: String,
    pub image: Option<String>,
    pub last_used_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
}

/// The runtimes of a workspace.
pub async fn runtimes(pool: &PgPool, workspace_id: Uuid) -> Result<Vec<RuntimeInfo>, StoreError> {
    let rows = sqlx::query(
        "SELECT id, backend_kind, state, image, last_used_at, expires_at
         FROM grove.sandbox_runtimes WHERE workspace_id = $1 ORDER BY backend_kind",
    )
    .bind(workspace_id)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(RuntimeInfo {
                id: r.try_get("id")?,
                backend_kind: r.try_get("backend_kind")?,
                state: r.try_get("state")?,
                image: r.try_get("image")?,
                last_used_at: r.try_get("last_used_at")?,
                expires_at: r.try_get("expires_at")?,
            })
        })
        .collect()
}

/// The newest `limit` events of a workspace's own stream after `after_version`, oldest
/// first (the stream's versions are its commit order).
pub async fn workspace_timeline(
    pool: &PgPool,
    workspace_id: Uuid,
    after_version: i64,
    limit: i64,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let rows = sqlx::query(
        "SELECT * FROM (
             SELECT position, tx_id::text::bigint AS tx_id, stream_id, stream_version,
                    event_type, event_version, payload, metadata, recorded_at
             FROM grove.events WHERE stream_id = $1 AND stream_version > $2
             ORDER BY stream_version DESC LIMIT $3) e
         ORDER BY stream_version",
    )
    .bind(grove_core::events::workspace_stream(workspace_id))
    .bind(after_version)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter().map(event_from_row).collect()
}

/// What the ledger still holds of one exec: its argv and its kept output.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KeptExec {
    pub argv: Vec<String>,
    pub status: String,
    pub stdout: Option<String>,
    pub stderr: Option<String>,
    /// Why no output is shown: `not kept` (the request asked), `pruned` (older than the
    /// retention), `none` (the exec did not complete).
    pub output_note: Option<String>,
    pub error_message: Option<String>,
}

/// The ledger rows of these execs (those not pruned yet), by exec id.
pub async fn kept_execs(
    pool: &PgPool,
    exec_ids: &[Uuid],
) -> Result<std::collections::HashMap<Uuid, KeptExec>, StoreError> {
    let rows = sqlx::query(
        "SELECT command_id, status, payload -> 'argv' AS argv,
                coalesce(payload ->> 'keep_output', 'true') = 'true' AS keep,
                result, error ->> 'message' AS error_message
         FROM grove.commands WHERE command_id = ANY($1) AND kind = 'exec'",
    )
    .bind(exec_ids)
    .fetch_all(pool)
    .await?;
    let mut out = std::collections::HashMap::new();
    for r in &rows {
        let argv: Option<serde_json::Value> = r.try_get("argv")?;
        let result: Option<serde_json::Value> = r.try_get("result")?;
        let keep: bool = r.try_get("keep")?;
        let mut kept = KeptExec {
            argv: argv
                .and_then(|a| serde_json::from_value(a).ok())
                .unwrap_or_default(),
            status: r.try_get("status")?,
            error_message: r.try_get("error_message")?,
            ..Default::default()
        };
        match result {
            _ if !keep => kept.output_note = Some("not kept".into()),
            Some(res) if res.get("output_pruned").is_some() => {
                kept.output_note = Some("pruned".into())
            }
            Some(res) => {
                let text = |k: &str| res.get(k).and_then(|v| v.as_str()).map(str::to_owned);
                kept.stdout = text("stdout");
                kept.stderr = text("stderr");
            }
            None => kept.output_note = Some("none".into()),
        }
        out.insert(r.try_get("command_id")?, kept);
    }
    Ok(out)
}

/// The filters of the Events page.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub stream: Option<String>,
    pub event_type: Option<String>,
    /// Events of this user's workspaces' streams.
    pub user: Option<String>,
    /// Events recorded at or before this time.
    pub until: Option<DateTime<Utc>>,
    /// Events with a position below this one (the next page).
    pub before: Option<i64>,
}

/// The position below which events recorded at or before `until` lie.
async fn position_bound(pool: &PgPool, until: DateTime<Utc>) -> Result<i64, StoreError> {
    let bound: Option<i64> = sqlx::query_scalar(
        "SELECT position FROM grove.events WHERE recorded_at <= $1
         ORDER BY recorded_at DESC, position DESC LIMIT 1",
    )
    .bind(until)
    .fetch_optional(pool)
    .await?;
    Ok(bound.map_or(0, |p| p + 1))
}

/// The streams of `user`'s workspaces: looked up first, so that the log is read through
/// its (stream_id, stream_version) index rather than scanned for them.
async fn user_streams(pool: &PgPool, user: &str) -> Result<Vec<String>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT 'workspace:' || id FROM grove.sandbox_workspaces WHERE user_id = $1",
    )
    .bind(user)
    .fetch_all(pool)
    .await?)
}

/// Up to `limit` events matching `f`, newest first.
pub async fn events_page(
    pool: &PgPool,
    f: &EventFilter,
    limit: i64,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let mut before = f.before.unwrap_or(i64::MAX);
    if let Some(until) = f.until {
        before = before.min(position_bound(pool, until).await?);
    }
    let user_streams = match &f.user {
        Some(user) => Some(user_streams(pool, user).await?),
        None => None,
    };
    // Only the filters in use are in the statement, so each combination gets the plan
    // of its own index (a generic plan of "$n IS NULL OR ..." could scan the log).
    let mut sql = String::from(
        "SELECT position, tx_id::text::bigint AS tx_id, stream_id, stream_version,
                event_type, event_version, payload, metadata, recorded_at
         FROM grove.events WHERE position < $1",
    );
    let mut n = 1;
    let mut cond = |text: &str| {
        n += 1;
        sql.push_str(&text.replace('?', &format!("${n}")));
    };
    if f.stream.is_some() {
        cond(" AND stream_id = ?");
    }
    if f.event_type.is_some() {
        cond(" AND event_type = ?");
    }
    if user_streams.is_some() {
        cond(" AND stream_id = ANY(?)");
    }
    cond(" ORDER BY position DESC LIMIT ?");
    let mut q = sqlx::query(trusted(sql)).bind(before);
    if let Some(stream) = &f.stream {
        q = q.bind(stream);
    }
    if let Some(t) = &f.event_type {
        q = q.bind(t);
    }
    if let Some(streams) = user_streams {
        q = q.bind(streams);
    }
    let rows = q.bind(limit).fetch_all(pool).await?;
    rows.iter().map(event_from_row).collect()
}

/// One `replay --verify` run of the console.
#[derive(Debug, Clone, Serialize)]
pub struct Verification {
    pub id: i64,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub requested_by: String,
    pub events: Option<i64>,
    pub diffs: Option<i32>,
    pub report: Option<String>,
}

/// The newest run, if any.
pub async fn last_verification(pool: &PgPool) -> Result<Option<Verification>, StoreError> {
    let row = sqlx::query(
        "SELECT id, started_at, finished_at, requested_by, events, diffs, report
         FROM grove.replay_verifications ORDER BY id DESC LIMIT 1",
    )
    .fetch_optional(pool)
    .await?;
    row.map(|r| {
        Ok(Verification {
            id: r.try_get("id")?,
            started_at: r.try_get("started_at")?,
            finished_at: r.try_get("finished_at")?,
            requested_by: r.try_get("requested_by")?,
            events: r.try_get("events")?,
            diffs: r.try_get("diffs")?,
            report: r.try_get("report")?,
        })
    })
    .transpose()
}

/// Runs `replay --verify` and records it (started, then its result or its error).
pub async fn run_verification(pool: &PgPool, requested_by: &str) -> Result<i64, StoreError> {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO grove.replay_verifications (requested_by) VALUES ($1) RETURNING id",
    )
    .bind(requested_by)
    .fetch_one(pool)
    .await?;
    let (events, diffs, report) = match crate::replay::verify(pool).await {
        Ok(r) => {
            let text: Vec<String> = r.diffs.iter().take(20).map(|d| d.to_string()).collect();
            (
                Some(r.events as i64),
                Some(r.diffs.len() as i32),
                text.join("\n"),
            )
        }
        Err(e) => (None, None, format!("replay failed: {e}")),
    };
    sqlx::query(
        "UPDATE grove.replay_verifications
         SET finished_at = now(), events = $2, diffs = $3, report = $4 WHERE id = $1",
    )
    .bind(id)
    .bind(events)
    .bind(diffs)
    .bind(report)
    .execute(pool)
    .await?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_prefix_is_the_range_of_the_ids_it_begins() {
        let (lo, hi) = id_range("4414472D").unwrap();
        assert_eq!(lo.to_string(), "4414472d-0000-0000-0000-000000000000");
        assert_eq!(hi.to_string(), "4414472d-ffff-ffff-ffff-ffffffffffff");
        let full = "4414472d-18df-59a5-a5b8-3fb7ea52b17a";
        assert_eq!(id_range(full).unwrap().0.to_string(), full);
        assert_eq!(id_range("alice"), None);
        assert_eq!(id_range("4414472d1"), None, "a dash belongs there");
        assert_eq!(id_range(""), None);
    }
}
