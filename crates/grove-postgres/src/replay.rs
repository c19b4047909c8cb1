//! Rebuilding the projections from the event log and diffing them against the live tables.

use std::collections::BTreeMap;

use futures::TryStreamExt;
use grove_core::events::Event;
use grove_core::projection::Projections;
use sqlx::{PgPool, Row};

use crate::rows;
use crate::{trusted, StoreError};

const TABLES: [&str; 3] = [
    "sandbox_repo_caches",
    "sandbox_workspaces",
    "sandbox_runtimes",
];

/// One difference between a live row and its replayed counterpart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowDiff {
    pub table: &'static str,
    pub id: String,
    /// `missing_in_live`, `missing_in_replay`, or the differing column's name.
    pub what: String,
    pub live: Option<serde_json::Value>,
    pub replayed: Option<serde_json::Value>,
}

impl std::fmt::Display for RowDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.what.as_str() {
            "missing_in_live" => write!(
                f,
                "{} id={}: row exists in replay but not in live table",
                self.table, self.id
            ),
            "missing_in_replay" => write!(
                f,
                "{} id={}: live row has no events that create it",
                self.table, self.id
            ),
            col => write!(
                f,
                "{} id={} column {}: live={} replayed={}",
                self.table,
                self.id,
                col,
                self.live.clone().unwrap_or_default(),
                self.replayed.clone().unwrap_or_default()
            ),
        }
    }
}

/// What a verification found.
#[derive(Debug, Clone, Default)]
pub struct ReplayReport {
    pub events: u64,
    pub diffs: Vec<RowDiff>,
}

/// Folds every event, in position order, into empty projections.
pub async fn fold_all(pool: &PgPool) -> Result<(Projections, u64), StoreError> {
    let mut conn = pool.acquire().await?;
    let mut projections = Projections::default();
    let mut count = 0u64;
    let mut stream =
        sqlx::query("SELECT event_type, payload, recorded_at FROM grove.events ORDER BY position")
            .fetch(&mut *conn);
    while let Some(row) = stream.try_next().await? {
        let event_type: String = row.try_get("event_type")?;
        let payload: serde_json::Value = row.try_get("payload")?;
        let event = Event::from_stored(&event_type, payload)?;
        projections.apply(&event, row.try_get("recorded_at")?);
        count += 1;
    }
    projections.take_touched();
    Ok((projections, count))
}

/// Rebuilds the projections in a scratch schema and diffs them against the live ones.
/// The scratch schema is dropped afterwards whatever the outcome.
pub async fn verify(pool: &PgPool) -> Result<ReplayReport, StoreError> {
    let (projections, events) = fold_all(pool).await?;
    let scratch = format!("grove_replay_{}", uuid::Uuid::new_v4().simple());
    let result = verify_in(pool, &scratch, &projections).await;
    sqlx::query(trusted(format!("DROP SCHEMA IF EXISTS {scratch} CASCADE")))
        .execute(pool)
        .await?;
    Ok(ReplayReport {
        events,
        diffs: result?,
    })
}

async fn verify_in(
    pool: &PgPool,
    scratch: &str,
    p: &Projections,
) -> Result<Vec<RowDiff>, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query(trusted(format!("CREATE SCHEMA {scratch}")))
        .execute(&mut *tx)
        .await?;
    for table in TABLES {
        sqlx::query(trusted(format!(
            "CREATE TABLE {scratch}.{table} (LIKE grove.{table} INCLUDING ALL)"
        )))
        .execute(&mut *tx)
        .await?;
    }
    for row in p.repo_caches.values() {
        rows::upsert_repo_cache(&mut tx, scratch, row).await?;
    }
    for row in p.workspaces.values() {
        rows::upsert_workspace(&mut tx, scratch, row).await?;
    }
    for row in p.runtimes.values() {
        rows::upsert_runtime(&mut tx, scratch, row).await?;
    }
    let mut diffs = Vec::new();
    for table in TABLES {
        let live = table_json(&mut tx, "grove", table).await?;
        let replayed = table_json(&mut tx, scratch, table).await?;
        diff_tables(table, &live, &replayed, &mut diffs);
    }
    tx.commit().await?;
    Ok(diffs)
}

async fn table_json(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    table: &str,
) -> Result<BTreeMap<String, serde_json::Map<String, serde_json::Value>>, StoreError> {
    let rows = sqlx::query(trusted(format!(
        "SELECT id::text AS id, to_jsonb(t) AS row FROM {schema}.{table} t"
    )))
    .fetch_all(conn)
    .await?;
    let mut out = BTreeMap::new();
    for r in rows {
        let id: String = r.try_get("id")?;
        let value: serde_json::Value = r.try_get("row")?;
        if let serde_json::Value::Object(map) = value {
            out.insert(id, map);
        }
    }
    Ok(out)
}

fn diff_tables(
    table: &'static str,
    live: &BTreeMap<String, serde_json::Map<String, serde_json::Value>>,
    replayed: &BTreeMap<String, serde_json::Map<String, serde_json::Value>>,
    diffs: &mut Vec<RowDiff>,
) {
    for (id, live_row) in live {
        let Some(replayed_row) = replayed.get(id) else {
            diffs.push(RowDiff {
                table,
                id: id.clone(),
                what: "missing_in_replay".into(),
                live: None,
                replayed: None,
            });
            continue;
        };
        for (col, lv) in live_row {
            let rv = replayed_row.get(col);
            if rv != Some(lv) {
                diffs.push(RowDiff {
                    table,
                    id: id.clone(),
                    what: col.clone(),
                    live: Some(lv.clone()),
                    replayed: rv.cloned(),
                });
            }
        }
    }
    for id in replayed.keys() {
        if !live.contains_key(id) {
            diffs.push(RowDiff {
                table,
                id: id.clone(),
                what: "missing_in_live".into(),
                live: None,
                replayed: None,
            });
        }
    }
}
