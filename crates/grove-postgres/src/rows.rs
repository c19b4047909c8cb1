//! Reading and writing projection rows, in the live `grove` schema or a replay scratch schema.
//!
//! The same write functions serve live handlers and `grove replay`, so a rebuilt row is
//! written exactly as a live one would be.

use grove_core::model::{
    Capabilities, RepoCacheRow, RuntimeRow, SavedWork, WorkspaceMode, WorkspaceRow,
};
use grove_core::projection::{Projections, Reads, Touched};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use crate::{trusted, StoreError};

/// The live schema.
pub const LIVE: &str = "grove";

pub const REPO_CACHE_COLUMNS: &str = "id, node, identity, repo_name, repo_url, provider, provider_host, local_path, auth_scope_hash, last_fetched_at, last_used_at, size_bytes, state, created_at, updated_at";
pub const WORKSPACE_COLUMNS: &str = "id, repo_cache_id, node, project_id, user_id, mode, conversation_id, task_id, base_ref, base_commit, branch_name, local_path, state, dirty, pinned_until, last_used_at, size_bytes, writable, isolated, persistent, created_at, updated_at, size_measured_at, evicted_at, saved_ref, saved_commit, saved_head, saved_patch, history_ignored";
pub const RUNTIME_COLUMNS: &str = "id, workspace_id, backend_kind, backend_runtime_id, image, state, last_started_at, last_used_at, expires_at, created_at, updated_at";

/// A row's `state` column as its type; a value this build does not know is
/// [`StoreError::Corrupt`].
fn parse_state<T>(r: &PgRow) -> Result<T, StoreError>
where
    T: std::str::FromStr<Err = grove_core::state::UnknownState>,
{
    let text: String = r.try_get("state")?;
    text.parse()
        .map_err(|e: grove_core::state::UnknownState| StoreError::Corrupt(e.to_string()))
}

pub fn repo_cache_from_row(r: &PgRow) -> Result<RepoCacheRow, StoreError> {
    Ok(RepoCacheRow {
        id: r.try_get("id")?,
        node: r.try_get("node")?,
        identity: r.try_get("identity")?,
        repo_name: r.try_get("repo_name")?,
        repo_url: r.try_get("repo_url")?,
        provider: r.try_get("provider")?,
        provider_host: r.try_get("provider_host")?,
        local_path: r.try_get("local_path")?,
        auth_scope_hash: r.try_get("auth_scope_hash")?,
        last_fetched_at: r.try_get("last_fetched_at")?,
        last_used_at: r.try_get("last_used_at")?,
        size_bytes: r.try_get("size_bytes")?,
        state: parse_state(r)?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
    })
}

pub fn workspace_from_row(r: &PgRow) -> Result<WorkspaceRow, StoreError> {
    let mode: String = r.try_get("mode")?;
    Ok(WorkspaceRow {
        id: r.try_get("id")?,
        repo_cache_id: r.try_get("repo_cache_id")?,
        node: r.try_get("node")?,
        project_id: r.try_get("project_id")?,
        user_id: r.try_get("user_id")?,
        mode: WorkspaceMode::parse(&mode).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        conversation_id: r.try_get("conversation_id")?,
        task_id: r.try_get("task_id")?,
        base_ref: r.try_get("base_ref")?,
        base_commit: r.try_get("base_commit")?,
        branch_name: r.try_get("branch_name")?,
        local_path: r.try_get("local_path")?,
        state: parse_state(r)?,
        dirty: r.try_get("dirty")?,
        pinned_until: r.try_get("pinned_until")?,
        last_used_at: r.try_get("last_used_at")?,
        size_bytes: r.try_get("size_bytes")?,
        capabilities: Capabilities {
            writable: r.try_get("writable")?,
            isolated: r.try_get("isolated")?,
            persistent: r.try_get("persistent")?,
        },
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
        size_measured_at: r.try_get("size_measured_at")?,
        evicted_at: r.try_get("evicted_at")?,
        saved: saved_from_row(r)?,
        history_ignored: r.try_get("history_ignored")?,
    })
}

/// The saved work of an evicted workspace: all of ref, commit and head, or none.
fn saved_from_row(r: &PgRow) -> Result<Option<SavedWork>, StoreError> {
    let ref_name: Option<String> = r.try_get("saved_ref")?;
    let commit: Option<String> = r.try_get("saved_commit")?;
    let head: Option<String> = r.try_get("saved_head")?;
    Ok(match (ref_name, commit, head) {
        (Some(ref_name), Some(commit), Some(head_commit)) => Some(SavedWork {
            ref_name,
            commit,
            head_commit,
            patch_path: r.try_get("saved_patch")?,
        }),
        (None, None, None) => None,
        _ => {
            return Err(StoreError::Corrupt(
                "saved_ref, saved_commit and saved_head must be all set or all null".into(),
            ))
        }
    })
}

pub fn runtime_from_row(r: &PgRow) -> Result<RuntimeRow, StoreError> {
    Ok(RuntimeRow {
        id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        backend_kind: r.try_get("backend_kind")?,
        backend_runtime_id: r.try_get("backend_runtime_id")?,
        image: r.try_get("image")?,
        state: parse_state(r)?,
        last_started_at: r.try_get("last_started_at")?,
        last_used_at: r.try_get("last_used_at")?,
        expires_at: r.try_get("expires_at")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
    })
}

/// Loads the rows `reads` names into a fresh [`Projections`], locking them for update.
pub async fn load_for_update(
    conn: &mut PgConnection,
    reads: &Reads,
) -> Result<Projections, StoreError> {
    let mut p = Projections::default();
    if !reads.repo_caches.is_empty() {
        let sql = format!("SELECT {REPO_CACHE_COLUMNS} FROM grove.sandbox_repo_caches WHERE id = ANY($1) FOR UPDATE");
        for r in sqlx::query(trusted(sql))
            .bind(&reads.repo_caches)
            .fetch_all(&mut *conn)
            .await?
        {
            let row = repo_cache_from_row(&r)?;
            p.repo_caches.insert(row.id, row);
        }
    }
    if !reads.workspaces.is_empty() {
        let sql = format!("SELECT {WORKSPACE_COLUMNS} FROM grove.sandbox_workspaces WHERE id = ANY($1) FOR UPDATE");
        for r in sqlx::query(trusted(sql))
            .bind(&reads.workspaces)
            .fetch_all(&mut *conn)
            .await?
        {
            let row = workspace_from_row(&r)?;
            p.workspaces.insert(row.id, row);
        }
    }
    if !reads.runtimes.is_empty() {
        let sql = format!(
            "SELECT {RUNTIME_COLUMNS} FROM grove.sandbox_runtimes WHERE id = ANY($1) FOR UPDATE"
        );
        for r in sqlx::query(trusted(sql))
            .bind(&reads.runtimes)
            .fetch_all(&mut *conn)
            .await?
        {
            let row = runtime_from_row(&r)?;
            p.runtimes.insert(row.id, row);
        }
    }
    Ok(p)
}

/// Writes the touched rows of `p` into `schema`: present rows are upserted, absent deleted.
pub async fn write_touched(
    conn: &mut PgConnection,
    schema: &str,
    p: &Projections,
    touched: &Touched,
) -> Result<(), StoreError> {
    for id in &touched.repo_caches {
        match p.repo_caches.get(id) {
            Some(row) => upsert_repo_cache(conn, schema, row).await?,
            None => delete(conn, schema, "sandbox_repo_caches", *id).await?,
        }
    }
    for id in &touched.workspaces {
        match p.workspaces.get(id) {
            Some(row) => upsert_workspace(conn, schema, row).await?,
            None => delete(conn, schema, "sandbox_workspaces", *id).await?,
        }
    }
    for id in &touched.runtimes {
        match p.runtimes.get(id) {
            Some(row) => upsert_runtime(conn, schema, row).await?,
            None => delete(conn, schema, "sandbox_runtimes", *id).await?,
        }
    }
    Ok(())
}

async fn delete(
    conn: &mut PgConnection,
    schema: &str,
    table: &str,
    id: Uuid,
) -> Result<(), StoreError> {
    sqlx::query(trusted(format!(
        "DELETE FROM {schema}.{table} WHERE id = $1"
    )))
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}

/// `INSERT ... ON CONFLICT (id) DO UPDATE SET` every column but id.
fn upsert_sql(schema: &str, table: &str, columns: &str) -> String {
    let cols: Vec<&str> = columns.split(", ").collect();
    let params: Vec<String> = (1..=cols.len()).map(|i| format!("${i}")).collect();
    let sets: Vec<String> = cols[1..]
        .iter()
        .map(|c| format!("{c} = EXCLUDED.{c}"))
        .collect();
    format!(
        "INSERT INTO {schema}.{table} ({columns}) VALUES ({}) ON CONFLICT (id) DO UPDATE SET {}",
        params.join(", "),
        sets.join(", ")
    )
}

pub async fn upsert_repo_cache(
    conn: &mut PgConnection,
    schema: &str,
    r: &RepoCacheRow,
) -> Result<(), StoreError> {
    sqlx::query(trusted(upsert_sql(
        schema,
        "sandbox_repo_caches",
        REPO_CACHE_COLUMNS,
    )))
    .bind(r.id)
    .bind(&r.node)
    .bind(&r.identity)
    .bind(&r.repo_name)
    .bind(&r.repo_url)
    .bind(&r.provider)
    .bind(&r.provider_host)
    .bind(&r.local_path)
    .bind(&r.auth_scope_hash)
    .bind(r.last_fetched_at)
    .bind(r.last_used_at)
    .bind(r.size_bytes)
    .bind(r.state.as_str())
    .bind(r.created_at)
    .bind(r.updated_at)
    .execute(conn)
    .await?;
    Ok(())
}

pub async fn upsert_workspace(
    conn: &mut PgConnection,
    schema: &str,
    r: &WorkspaceRow,
) -> Result<(), StoreError> {
    sqlx::query(trusted(upsert_sql(
        schema,
        "sandbox_workspaces",
        WORKSPACE_COLUMNS,
    )))
    .bind(r.id)
    .bind(r.repo_cache_id)
    .bind(&r.node)
    .bind(&r.project_id)
    .bind(&r.user_id)
    .bind(r.mode.as_str())
    .bind(&r.conversation_id)
    .bind(&r.task_id)
    .bind(&r.base_ref)
    .bind(&r.base_commit)
    .bind(&r.branch_name)
    .bind(&r.local_path)
    .bind(r.state.as_str())
    .bind(r.dirty)
    .bind(r.pinned_until)
    .bind(r.last_used_at)
    .bind(r.size_bytes)
    .bind(r.capabilities.writable)
    .bind(r.capabilities.isolated)
    .bind(r.capabilities.persistent)
    .bind(r.created_at)
    .bind(r.updated_at)
    .bind(r.size_measured_at)
    .bind(r.evicted_at)
    .bind(r.saved.as_ref().map(|s| &s.ref_name))
    .bind(r.saved.as_ref().map(|s| &s.commit))
    .bind(r.saved.as_ref().map(|s| &s.head_commit))
    .bind(r.saved.as_ref().and_then(|s| s.patch_path.as_ref()))
    .bind(r.history_ignored)
    .execute(conn)
    .await?;
    Ok(())
}

pub async fn upsert_runtime(
    conn: &mut PgConnection,
    schema: &str,
    r: &RuntimeRow,
) -> Result<(), StoreError> {
    sqlx::query(trusted(upsert_sql(
        schema,
        "sandbox_runtimes",
        RUNTIME_COLUMNS,
    )))
    .bind(r.id)
    .bind(r.workspace_id)
    .bind(&r.backend_kind)
    .bind(&r.backend_runtime_id)
    .bind(&r.image)
    .bind(r.state.as_str())
    .bind(r.last_started_at)
    .bind(r.last_used_at)
    .bind(r.expires_at)
    .bind(r.created_at)
    .bind(r.updated_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// Reads one workspace row from the live schema.
pub async fn workspace(
    conn: &mut PgConnection,
    id: Uuid,
) -> Result<Option<WorkspaceRow>, StoreError> {
    let sql = format!("SELECT {WORKSPACE_COLUMNS} FROM grove.sandbox_workspaces WHERE id = $1");
    sqlx::query(trusted(sql))
        .bind(id)
        .fetch_optional(conn)
        .await?
        .map(|r| workspace_from_row(&r))
        .transpose()
}

/// Lists workspaces, optionally of one user, most recently used first.
pub async fn workspaces(
    conn: &mut PgConnection,
    user: Option<&str>,
) -> Result<Vec<WorkspaceRow>, StoreError> {
    let sql = format!(
        "SELECT {WORKSPACE_COLUMNS} FROM grove.sandbox_workspaces WHERE $1::text IS NULL OR user_id = $1 ORDER BY last_used_at DESC, id"
    );
    sqlx::query(trusted(sql))
        .bind(user)
        .fetch_all(conn)
        .await?
        .iter()
        .map(workspace_from_row)
        .collect()
}

/// Finds the live workspace with a uniqueness key.
pub async fn workspace_by_key(
    conn: &mut PgConnection,
    key: &grove_core::model::WorkspaceKey,
) -> Result<Option<WorkspaceRow>, StoreError> {
    Ok(workspace_by_key_versioned(conn, key)
        .await?
        .map(|(row, _)| row))
}

/// [`workspace_by_key`] with the version (xmin) the row was read at (ADR 36).
pub async fn workspace_by_key_versioned(
    conn: &mut PgConnection,
    key: &grove_core::model::WorkspaceKey,
) -> Result<Option<(WorkspaceRow, String)>, StoreError> {
    let scope_col = match key.mode {
        WorkspaceMode::Analysis => "base_ref",
        WorkspaceMode::Edit => "conversation_id",
        WorkspaceMode::Task => "task_id",
    };
    let sql = format!(
        "SELECT {WORKSPACE_COLUMNS}, xmin::text AS row_xmin FROM grove.sandbox_workspaces WHERE user_id = $1 AND project_id = $2 AND mode = $3 AND {scope_col} = $4"
    );
    sqlx::query(trusted(sql))
        .bind(&key.user_id)
        .bind(&key.project_id)
        .bind(key.mode.as_str())
        .bind(&key.scope)
        .fetch_optional(conn)
        .await?
        .map(|r| Ok((workspace_from_row(&r)?, r.try_get("row_xmin")?)))
        .transpose()
}

/// [`repo_cache_by_identity`] with the version (xmin) the row was read at (ADR 36).
pub async fn repo_cache_by_identity_versioned(
    conn: &mut PgConnection,
    node: &str,
    identity: &str,
) -> Result<Option<(RepoCacheRow, String)>, StoreError> {
    let sql = format!("SELECT {REPO_CACHE_COLUMNS}, xmin::text AS row_xmin FROM grove.sandbox_repo_caches WHERE node = $1 AND identity = $2");
    sqlx::query(trusted(sql))
        .bind(node)
        .bind(identity)
        .fetch_optional(conn)
        .await?
        .map(|r| Ok((repo_cache_from_row(&r)?, r.try_get("row_xmin")?)))
        .transpose()
}

/// Finds the live repo cache of an identity on a node.
pub async fn repo_cache_by_identity(
    conn: &mut PgConnection,
    node: &str,
    identity: &str,
) -> Result<Option<RepoCacheRow>, StoreError> {
    Ok(repo_cache_by_identity_versioned(conn, node, identity)
        .await?
        .map(|(row, _)| row))
}

pub async fn repo_cache(
    conn: &mut PgConnection,
    id: Uuid,
) -> Result<Option<RepoCacheRow>, StoreError> {
    let sql = format!("SELECT {REPO_CACHE_COLUMNS} FROM grove.sandbox_repo_caches WHERE id = $1");
    sqlx::query(trusted(sql))
        .bind(id)
        .fetch_optional(conn)
        .await?
        .map(|r| repo_cache_from_row(&r))
        .transpose()
}

/// The runtimes attached to a workspace.
pub async fn runtimes_of(
    conn: &mut PgConnection,
    workspace_id: Uuid,
) -> Result<Vec<RuntimeRow>, StoreError> {
    let sql = format!(
        "SELECT {RUNTIME_COLUMNS} FROM grove.sandbox_runtimes WHERE workspace_id = $1 ORDER BY id"
    );
    sqlx::query(trusted(sql))
        .bind(workspace_id)
        .fetch_all(conn)
        .await?
        .iter()
        .map(runtime_from_row)
        .collect()
}

/// [`runtimes_of`], each with the version (xmin) it was read at (ADR 36).
pub async fn runtimes_of_versioned(
    conn: &mut PgConnection,
    workspace_id: Uuid,
) -> Result<Vec<(RuntimeRow, String)>, StoreError> {
    let sql = format!(
        "SELECT {RUNTIME_COLUMNS}, xmin::text AS row_xmin FROM grove.sandbox_runtimes WHERE workspace_id = $1 ORDER BY id"
    );
    sqlx::query(trusted(sql))
        .bind(workspace_id)
        .fetch_all(conn)
        .await?
        .iter()
        .map(|r| Ok((runtime_from_row(r)?, r.try_get("row_xmin")?)))
        .collect()
}

/// Every workspace record of a node (evicted ones included), for an eviction sweep.
pub async fn workspaces_of_node(
    conn: &mut PgConnection,
    node: &str,
) -> Result<Vec<WorkspaceRow>, StoreError> {
    let sql = format!(
        "SELECT {WORKSPACE_COLUMNS} FROM grove.sandbox_workspaces WHERE node = $1 ORDER BY id"
    );
    sqlx::query(trusted(sql))
        .bind(node)
        .fetch_all(conn)
        .await?
        .iter()
        .map(workspace_from_row)
        .collect()
}

/// The runtimes of a node's workspaces, plus every runtime whose workspace record is gone
/// (an orphan: the sweep of any node may destroy it).
pub async fn runtimes_of_node(
    conn: &mut PgConnection,
    node: &str,
) -> Result<Vec<RuntimeRow>, StoreError> {
    let cols: Vec<String> = RUNTIME_COLUMNS
        .split(", ")
        .map(|c| format!("r.{c}"))
        .collect();
    let sql = format!(
        "SELECT {} FROM grove.sandbox_runtimes r LEFT JOIN grove.sandbox_workspaces w ON w.id = r.workspace_id
         WHERE w.node = $1 OR w.id IS NULL ORDER BY r.id",
        cols.join(", ")
    );
    sqlx::query(trusted(sql))
        .bind(node)
        .fetch_all(conn)
        .await?
        .iter()
        .map(runtime_from_row)
        .collect()
}

/// Every repo cache record of a node (evicted ones included).
pub async fn repo_caches_of_node(
    conn: &mut PgConnection,
    node: &str,
) -> Result<Vec<RepoCacheRow>, StoreError> {
    let sql = format!(
        "SELECT {REPO_CACHE_COLUMNS} FROM grove.sandbox_repo_caches WHERE node = $1 ORDER BY id"
    );
    sqlx::query(trusted(sql))
        .bind(node)
        .fetch_all(conn)
        .await?
        .iter()
        .map(repo_cache_from_row)
        .collect()
}

/// The workspaces some queued or running command names (other than `except`).
pub async fn workspaces_with_open_commands(
    conn: &mut PgConnection,
    except: Option<Uuid>,
) -> Result<Vec<Uuid>, StoreError> {
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT payload ->> 'workspace_id' FROM grove.commands
         WHERE status IN ('queued', 'running') AND payload ? 'workspace_id'
           AND ($1::uuid IS NULL OR command_id <> $1)",
    )
    .bind(except)
    .fetch_all(conn)
    .await?;
    Ok(ids.iter().filter_map(|s| Uuid::parse_str(s).ok()).collect())
}

/// One runtime record.
pub async fn runtime(conn: &mut PgConnection, id: Uuid) -> Result<Option<RuntimeRow>, StoreError> {
    let sql = format!("SELECT {RUNTIME_COLUMNS} FROM grove.sandbox_runtimes WHERE id = $1");
    sqlx::query(trusted(sql))
        .bind(id)
        .fetch_optional(conn)
        .await?
        .map(|r| runtime_from_row(&r))
        .transpose()
}

/// How many workspace records keep a repo cache: live ones (not evicted) and evicted ones
/// whose saved work is in it.
pub async fn cache_dependents(
    conn: &mut PgConnection,
    repo_cache_id: Uuid,
) -> Result<(i64, i64), StoreError> {
    let row = sqlx::query(
        "SELECT count(*) FILTER (WHERE state <> 'evicted') AS live,
                count(*) FILTER (WHERE state = 'evicted' AND saved_ref IS NOT NULL) AS saved
         FROM grove.sandbox_workspaces WHERE repo_cache_id = $1",
    )
    .bind(repo_cache_id)
    .fetch_one(conn)
    .await?;
    Ok((row.try_get("live")?, row.try_get("saved")?))
}
