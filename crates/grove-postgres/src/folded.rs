//! Appending onto projection rows a command already holds, in one statement (ADR 36).
//!
//! A command that read its workspace row under its lock (and the rows its own earlier
//! step wrote) folds its events onto those rows here, with `Projections::apply` as
//! `store::append` does, and hands the folded rows to `grove.append_folded`, which
//! checks each row's version (its xmin) is still the one folded from, writes the rows
//! and inserts the events. A row changed meanwhile raises `GRV02`
//! ([`is_stale`]): the caller then appends the usual way. Rows go to the database as
//! JSON keyed by column, with the values the typed writes of `rows` would bind.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use grove_core::events::{Event, Metadata};
use grove_core::model::{RepoCacheRow, RuntimeRow, WorkspaceRow};
use grove_core::projection::{Projections, Reads, Touched};
use serde_json::{json, Value};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::Postgres;
use uuid::Uuid;

use crate::store::EventColumns;
use crate::StoreError;

/// A projection table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Table {
    RepoCache,
    Workspace,
    Runtime,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::RepoCache => "sandbox_repo_caches",
            Table::Workspace => "sandbox_workspaces",
            Table::Runtime => "sandbox_runtimes",
        }
    }
}

/// Projection rows a command holds, each with the version (xmin) it read or wrote, or
/// none for a row known not to exist.
#[derive(Debug, Default, Clone)]
pub struct HeldRows {
    rows: Projections,
    versions: BTreeMap<(Table, Uuid), Option<String>>,
}

impl HeldRows {
    /// A workspace row and the xmin it was read at.
    pub fn workspace(row: WorkspaceRow, xmin: String) -> Self {
        let mut held = Self::default();
        held.versions.insert((Table::Workspace, row.id), Some(xmin));
        held.rows.workspaces.insert(row.id, row);
        held
    }

    /// A repo cache row and the xmin it was read at.
    pub fn repo_cache(row: RepoCacheRow, xmin: String) -> Self {
        let mut held = Self::default();
        held.versions.insert((Table::RepoCache, row.id), Some(xmin));
        held.rows.repo_caches.insert(row.id, row);
        held
    }

    /// Holds the runtime `id` too: its row and the xmin it was read at, or `None` when
    /// no row has that id. Only next to a held workspace: a fold needs both.
    pub fn hold_runtime(&mut self, id: Uuid, row: Option<(RuntimeRow, String)>) {
        if self.rows.workspaces.is_empty() {
            return;
        }
        match row {
            Some((row, xmin)) => {
                self.versions.insert((Table::Runtime, id), Some(xmin));
                self.rows.runtimes.insert(id, row);
            }
            None => {
                self.versions.insert((Table::Runtime, id), None);
                self.rows.runtimes.remove(&id);
            }
        }
    }

    /// Whether every row `reads` names is held, so a fold needs no read.
    fn covers(&self, reads: &Reads) -> bool {
        let held =
            |t: Table, ids: &[Uuid]| ids.iter().all(|id| self.versions.contains_key(&(t, *id)));
        held(Table::RepoCache, &reads.repo_caches)
            && held(Table::Workspace, &reads.workspaces)
            && held(Table::Runtime, &reads.runtimes)
    }

    /// `events` folded onto the held rows, ready to bind; `None` when they read a row
    /// that is not held.
    pub fn fold(
        &self,
        events: &[Event],
        metadata: &Metadata,
        at: DateTime<Utc>,
    ) -> Result<Option<FoldedAppend>, StoreError> {
        let reads = Reads::of(events);
        if !self.covers(&reads) {
            return Ok(None);
        }
        let mut after = self.rows.clone();
        after.take_touched();
        for event in events {
            after.apply(event, at);
        }
        let touched = after.take_touched();
        let rows = self.rows_json(&reads, &after, &touched);
        Ok(Some(FoldedAppend {
            rows,
            events: EventColumns::of(events),
            metadata: serde_json::to_value(metadata)?,
            command_id: metadata.command_id,
            at,
            after,
            touched,
        }))
    }

    /// The `p_rows` of `grove.append_folded`: the versions expected of every row read,
    /// the touched rows present after the fold (upserts) and those gone (deletes).
    fn rows_json(&self, reads: &Reads, after: &Projections, touched: &Touched) -> Value {
        let mut expect = Vec::new();
        let read = [
            (Table::RepoCache, &reads.repo_caches),
            (Table::Workspace, &reads.workspaces),
            (Table::Runtime, &reads.runtimes),
        ];
        for (table, ids) in read {
            for id in ids {
                expect.push(
                    json!({"table": table.name(), "id": id, "xmin": self.versions[&(table, *id)]}),
                );
            }
        }
        let mut delete = Vec::new();
        let mut upsert = |table: Table, ids: Vec<(Uuid, Option<Value>)>| {
            let mut present = Vec::new();
            for (id, row) in ids {
                match row {
                    Some(row) => present.push(row),
                    None => delete.push(json!({"table": table.name(), "id": id})),
                }
            }
            (table.name(), Value::Array(present))
        };
        let caches = touched
            .repo_caches
            .iter()
            .map(|id| (*id, after.repo_caches.get(id).map(repo_cache_json)))
            .collect();
        let workspaces = touched
            .workspaces
            .iter()
            .map(|id| (*id, after.workspaces.get(id).map(workspace_json)))
            .collect();
        let runtimes = touched
            .runtimes
            .iter()
            .map(|id| (*id, after.runtimes.get(id).map(runtime_json)))
            .collect();
        let upserts: serde_json::Map<String, Value> = [
            upsert(Table::RepoCache, caches),
            upsert(Table::Workspace, workspaces),
            upsert(Table::Runtime, runtimes),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        json!({"expect": expect, "upsert": upserts, "delete": delete})
    }

    /// Takes in what an append wrote: its touched rows, now at version `xmin`.
    pub fn absorb(&mut self, folded: FoldedAppend, xmin: String) {
        let xmin = Some(xmin);
        let FoldedAppend { after, touched, .. } = folded;
        for id in touched.repo_caches {
            self.versions.insert((Table::RepoCache, id), xmin.clone());
            match after.repo_caches.get(&id) {
                Some(row) => self.rows.repo_caches.insert(id, row.clone()),
                None => self.rows.repo_caches.remove(&id),
            };
        }
        for id in touched.workspaces {
            self.versions.insert((Table::Workspace, id), xmin.clone());
            match after.workspaces.get(&id) {
                Some(row) => self.rows.workspaces.insert(id, row.clone()),
                None => self.rows.workspaces.remove(&id),
            };
        }
        for id in touched.runtimes {
            self.versions.insert((Table::Runtime, id), xmin.clone());
            match after.runtimes.get(&id) {
                Some(row) => self.rows.runtimes.insert(id, row.clone()),
                None => self.rows.runtimes.remove(&id),
            };
        }
    }
}

/// A fold ready for `grove.append_folded`.
#[derive(Debug)]
pub struct FoldedAppend {
    rows: Value,
    events: EventColumns,
    metadata: Value,
    command_id: Uuid,
    at: DateTime<Utc>,
    after: Projections,
    touched: Touched,
}

impl FoldedAppend {
    /// The arguments `p_rows` .. `p_payloads`, `p_metadata` and `p_at` (the command id is
    /// the leading function's own), bound after `query`'s.
    pub fn bind_without_command<'q>(
        &'q self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments> {
        query
            .bind(&self.rows)
            .bind(&self.events.streams)
            .bind(&self.events.types)
            .bind(&self.events.versions)
            .bind(&self.events.payloads)
            .bind(&self.metadata)
            .bind(self.at)
    }

    /// The command id the events carry.
    pub fn command_id(&self) -> Uuid {
        self.command_id
    }
}

/// Whether `e` is `grove.append_folded`'s refusal of a row changed since it was read.
pub fn is_stale(e: &StoreError) -> bool {
    match e {
        StoreError::Database(sqlx::Error::Database(db)) => db.code().as_deref() == Some("GRV02"),
        _ => false,
    }
}

fn ts(t: DateTime<Utc>) -> Value {
    Value::String(t.to_rfc3339_opts(SecondsFormat::Micros, true))
}

fn opt_ts(t: Option<DateTime<Utc>>) -> Value {
    t.map(ts).unwrap_or(Value::Null)
}

fn repo_cache_json(r: &RepoCacheRow) -> Value {
    json!({
        "id": r.id, "node": r.node, "identity": r.identity, "repo_name": r.repo_name,
        "repo_url": r.repo_url, "provider": r.provider, "provider_host": r.provider_host,
        "local_path": r.local_path, "auth_scope_hash": r.auth_scope_hash,
        "last_fetched_at": opt_ts(r.last_fetched_at), "last_used_at": ts(r.last_used_at),
        "size_bytes": r.size_bytes, "state": r.state.as_str(),
        "created_at": ts(r.created_at), "updated_at": ts(r.updated_at),
    })
}

fn workspace_json(r: &WorkspaceRow) -> Value {
    let saved = r.saved.as_ref();
    json!({
        "id": r.id, "repo_cache_id": r.repo_cache_id, "node": r.node,
        "project_id": r.project_id, "user_id": r.user_id, "mode": r.mode.as_str(),
        "conversation_id": r.conversation_id, "task_id": r.task_id,
        "base_ref": r.base_ref, "base_commit": r.base_commit,
        "branch_name": r.branch_name, "local_path": r.local_path,
        "state": r.state.as_str(), "dirty": r.dirty,
        "pinned_until": opt_ts(r.pinned_until), "last_used_at": ts(r.last_used_at),
        "size_bytes": r.size_bytes, "writable": r.capabilities.writable,
        "isolated": r.capabilities.isolated, "persistent": r.capabilities.persistent,
        "created_at": ts(r.created_at), "updated_at": ts(r.updated_at),
        "size_measured_at": opt_ts(r.size_measured_at), "evicted_at": opt_ts(r.evicted_at),
        "saved_ref": saved.map(|s| &s.ref_name), "saved_commit": saved.map(|s| &s.commit),
        "saved_head": saved.map(|s| &s.head_commit),
        "saved_patch": saved.and_then(|s| s.patch_path.as_ref()),
        "history_ignored": r.history_ignored,
    })
}

fn runtime_json(r: &RuntimeRow) -> Value {
    json!({
        "id": r.id, "workspace_id": r.workspace_id, "backend_kind": r.backend_kind,
        "backend_runtime_id": r.backend_runtime_id, "image": r.image,
        "state": r.state.as_str(), "last_started_at": opt_ts(r.last_started_at),
        "last_used_at": ts(r.last_used_at), "expires_at": opt_ts(r.expires_at),
        "created_at": ts(r.created_at), "updated_at": ts(r.updated_at),
    })
}
