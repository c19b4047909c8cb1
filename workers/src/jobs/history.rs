//! Workspace history (ADR 28): a point after every change of a workspace on this node
//! (`after_change`, called by exec, the write tools, merge-back and restore; and
//! `first_point` by acquire), and the history tools
//! (`history`, `history_diff`, `history_file`, `checkpoint`, `rewind`, `undo`, `fork`)
//! over the store `$GROVE_HOME/history/<user>/<workspace id>` through the git port.

use std::path::PathBuf;
use std::time::Duration;

use grove_core::commands::{AcquireWorkspace, CommandResult};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::events::Event;
use grove_core::history::{
    origin, timeline, HistoryPaths, IgnoredFiles, Operation, Origin, Point, PointRef, Snapshot,
    DEFAULT_HISTORY_PAGE,
};
use grove_core::model::{WorkspaceMode, WorkspaceRow};
use grove_core::placement::Placement;
use grove_core::ports::GitToken;
use grove_core::tools::{ToolOp, ToolOutput, ToolRequest};
use grove_postgres::history::PointBase;
use grove_postgres::locks::AdvisoryLock;
use grove_postgres::rows;
use uuid::Uuid;

use crate::context::{blocking, correlation_of, now, store_error, Handled, JobContext};

/// Deepest chain of forks a timeline follows back.
const MAX_FORK_DEPTH: usize = 32;
/// How long a rewind waits for a running command before it is refused.
const REWIND_WAIT: Duration = Duration::from_millis(200);
/// Loose objects (estimated) at which the sweep packs a history store: about 200
/// points' worth.
const PACK_AT_LOOSE: usize = 1024;
/// Largest patch a `history_diff` returns.
const MAX_DIFF_BYTES: usize = super::tools::MAX_DIFF_BYTES;

/// The paths of one workspace's history, owned.
struct Paths {
    store: PathBuf,
    workspace: PathBuf,
    cache: PathBuf,
}

impl Paths {
    fn borrow(&self) -> HistoryPaths<'_> {
        HistoryPaths {
            store_dir: &self.store,
            workspace_dir: &self.workspace,
            cache_dir: &self.cache,
        }
    }
}

fn not_found(what: String) -> CommandError {
    CommandError::new(ErrorKind::NotFound, what)
}

/// A point's base (the cache's path and the newest point) being read beside the
/// caller's other work: started once the workspace's exclusive lock is held, so no other
/// point can be taken before the caller's. Dropped unused, the read is abandoned.
#[derive(Default)]
pub(crate) struct PointPrefetch(
    Option<tokio::task::JoinHandle<Result<PointBase, grove_postgres::StoreError>>>,
);

impl Drop for PointPrefetch {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

impl JobContext {
    /// Deletes a destroyed workspace's history store (failures are logged).
    pub(crate) async fn discard_workspace_history(&self, ws: &WorkspaceRow) {
        self.drop_tracker(ws.id).await;
        let git = self.git.clone();
        let store = self.history_dir(ws);
        if let Err(e) = blocking(move || git.discard_history(&store)).await {
            tracing::warn!(workspace = %ws.id, error = %e, "history store not removed");
        }
    }

    /// Retention (ADR 28), a step of the eviction sweep: each workspace of this node
    /// whose timeline has points the policy drops, and whose command lock is free, gets
    /// them dropped from its store and a `workspace.history_pruned` committed; a store
    /// holding many loose objects gets them packed. Busy workspaces and failures are
    /// left for the next sweep (logged).
    pub(crate) async fn prune_histories(
        &self,
        command_id: Uuid,
        at: chrono::DateTime<chrono::Utc>,
    ) {
        let workspaces = {
            let Ok(mut conn) = self.conn().await else {
                return;
            };
            match rows::workspaces_of_node(&mut conn, &self.config.node).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "history retention: no workspace list");
                    return;
                }
            }
        };
        for ws in workspaces.iter().filter(|w| w.state.has_files()) {
            if self.config.history_keep_days > 0 {
                if let Err(e) = self.prune_history_of(ws, command_id, at).await {
                    tracing::info!(workspace = %ws.id, error = %e, "history retention: skipped");
                }
            }
            if let Err(e) = self.pack_history_of(ws).await {
                tracing::info!(workspace = %ws.id, error = %e, "history packing: skipped");
            }
        }
    }

    /// Packs the store's loose objects once there are [`PACK_AT_LOOSE`] of them (a
    /// point leaves a few small files each; a pack keeps them as deltas in one).
    async fn pack_history_of(&self, ws: &WorkspaceRow) -> Result<(), CommandError> {
        let git = self.git.clone();
        let probe = self.history_dir(ws);
        if blocking(move || Ok(git.history_loose_objects(&probe))).await? < PACK_AT_LOOSE {
            return Ok(());
        }
        let paths = self.history_paths(ws).await?;
        let (_, lock) = self.lock_for_history(ws.id, false, REWIND_WAIT).await?;
        let git = self.git.clone();
        let packed = blocking(move || git.pack_history(&paths.borrow())).await;
        lock.release().await.ok();
        tracing::info!(workspace = %ws.id, objects = packed?, "history store packed");
        Ok(())
    }

    async fn prune_history_of(
        &self,
        ws: &WorkspaceRow,
        command_id: Uuid,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), CommandError> {
        let points = self.timeline(ws.id).await?;
        let drop = grove_core::history::to_prune(ws.id, &points, at, self.config.history_keep_days);
        if drop.is_empty() {
            return Ok(());
        }
        let (ws, lock) = self.lock_for_history(ws.id, false, REWIND_WAIT).await?;
        let keep: Vec<String> = points
            .iter()
            .map(|p| p.snapshot.clone())
            .filter(|s| !drop.contains(s))
            .collect();
        let git = self.git.clone();
        let result = match self.history_paths(&ws).await {
            Ok(paths) => blocking(move || git.prune_history(&paths.borrow(), &keep)).await,
            Err(e) => Err(e),
        };
        let recorded = match result {
            Ok(_) => {
                let event = Event::WorkspaceHistoryPruned {
                    workspace_id: ws.id,
                    dropped: drop,
                };
                self.record(command_id, correlation_of(&ws), &[event]).await
            }
            Err(e) => Err(e),
        };
        lock.release().await.ok();
        recorded
    }

    /// The history store of a workspace.
    pub(crate) fn history_dir(&self, ws: &WorkspaceRow) -> PathBuf {
        self.layout.history_dir(&ws.user_id, ws.id)
    }

    async fn history_paths(&self, ws: &WorkspaceRow) -> Result<Paths, CommandError> {
        let mut conn = self.conn().await?;
        let cache = rows::repo_cache(&mut conn, ws.repo_cache_id)
            .await
            .map_err(store_error)?
            .ok_or_else(|| not_found(format!("the repo cache of workspace {}", ws.id)))?;
        Ok(self.paths(ws, cache.local_path))
    }

    fn paths(&self, ws: &WorkspaceRow, cache_path: String) -> Paths {
        Paths {
            store: self.history_dir(ws),
            workspace: PathBuf::from(&ws.local_path),
            cache: PathBuf::from(cache_path),
        }
    }

    /// The workspace's timeline: its source's points up to the fork (if it is a fork),
    /// then its own.
    pub(crate) async fn timeline(&self, id: Uuid) -> Result<Vec<Point>, CommandError> {
        let mut conn = self.conn().await?;
        let mut chain = Vec::new();
        let (mut current, mut cut) = (id, None);
        for _ in 0..MAX_FORK_DEPTH {
            let events = grove_postgres::history::history_events(&mut conn, current)
                .await
                .map_err(store_error)?;
            let from = origin(&events);
            chain.push((current, events, cut));
            match from {
                Origin::Created => break,
                Origin::Forked {
                    source_workspace_id,
                    number,
                } => (current, cut) = (source_workspace_id, Some(number)),
            }
        }
        let mut points = Vec::new();
        for (workspace_id, events, cut) in chain.into_iter().rev() {
            points = timeline(workspace_id, points, &events);
            if let Some(n) = cut {
                points.retain(|p| p.number <= n);
            }
        }
        Ok(points)
    }

    /// Takes a snapshot (recorded by the caller's event, or not at all), from what this
    /// process's change tracker saw change when it knows (ADR 32), else by a walk.
    async fn take(
        &self,
        ws: &WorkspaceRow,
        paths: &Paths,
        previous: Option<String>,
    ) -> Result<Snapshot, CommandError> {
        let git = self.git.clone();
        let (store, workspace, cache, id) = (
            paths.store.clone(),
            paths.workspace.clone(),
            paths.cache.clone(),
            ws.id,
        );
        let ignored = if ws.history_ignored {
            IgnoredFiles::Included {
                budget_bytes: self.config.history_ignored_budget,
            }
        } else {
            IgnoredFiles::Excluded
        };
        blocking(move || {
            let paths = HistoryPaths {
                store_dir: &store,
                workspace_dir: &workspace,
                cache_dir: &cache,
            };
            git.tracked_snapshot(&paths, id, previous.as_deref(), ignored)
        })
        .await
    }

    /// Drops this process's change tracker of a workspace (ADR 32): released, evicted
    /// or destroyed. Another process's tracker of it turns unknown by itself when the
    /// checkout moves or goes (its root's watch reports it).
    pub(crate) async fn drop_tracker(&self, id: Uuid) {
        let git = self.git.clone();
        let _ = blocking(move || {
            git.forget_tracker(id);
            Ok(())
        })
        .await;
    }

    /// The snapshot of the workspace's newest point: one index probe, not a fold of
    /// its timeline (which grows with every change).
    /// [`Self::history_paths`] and the workspace's newest point, in one query.
    async fn paths_and_latest(
        &self,
        ws: &WorkspaceRow,
        mut prefetch: PointPrefetch,
    ) -> Result<(Paths, Option<String>), CommandError> {
        let fetched = match prefetch.0.take() {
            Some(task) => task.await.ok(),
            None => None,
        };
        let base = match fetched {
            Some(base) => base.map_err(store_error)?,
            None => {
                let mut conn = self.conn().await?;
                grove_postgres::history::point_base(&mut conn, ws.id, ws.repo_cache_id)
                    .await
                    .map_err(store_error)?
            }
        };
        let cache = base
            .cache_path
            .ok_or_else(|| not_found(format!("the repo cache of workspace {}", ws.id)))?;
        Ok((self.paths(ws, cache), base.latest))
    }

    /// Takes a point after the workspace's newest; returns its event and whether the
    /// working tree differs from HEAD's.
    async fn record_point(
        &self,
        ws: &WorkspaceRow,
        operation: Operation,
        prefetch: PointPrefetch,
    ) -> Result<(Event, bool), CommandError> {
        let (paths, previous) = self.paths_and_latest(ws, prefetch).await?;
        let snap = self.take(ws, &paths, previous).await?;
        let dirty = snap.dirty;
        Ok((snapshot_event(ws.id, snap, operation), dirty))
    }

    /// After a change: the point and `workspace.dirty_changed` from the same walk of the
    /// tree (the snapshot tells whether the working tree differs from HEAD); without
    /// history (off, remote, or a failed snapshot) git's dirty check alone.
    pub(crate) async fn after_change(&self, ws: &WorkspaceRow, operation: Operation) -> Vec<Event> {
        self.after_change_with(ws, operation, PointPrefetch::default())
            .await
    }

    /// Whether a change of `ws` takes a history point.
    fn takes_points(&self, ws: &WorkspaceRow) -> bool {
        self.config.history && !Placement::of_node(&ws.node).is_remote()
    }

    /// Starts reading the base of the point a change of `ws` will take, beside the
    /// caller's other work (the caller holds the workspace's exclusive lock).
    pub(crate) fn prefetch_point(&self, ws: &WorkspaceRow) -> PointPrefetch {
        if !self.takes_points(ws) {
            return PointPrefetch::default();
        }
        let (pool, id, cache) = (self.pool.clone(), ws.id, ws.repo_cache_id);
        PointPrefetch(Some(tokio::spawn(async move {
            let mut conn = pool.acquire().await?;
            grove_postgres::history::point_base(&mut conn, id, cache).await
        })))
    }

    /// [`Self::after_change`] with its point's base read ahead ([`Self::prefetch_point`]).
    pub(crate) async fn after_change_with(
        &self,
        ws: &WorkspaceRow,
        operation: Operation,
        prefetch: PointPrefetch,
    ) -> Vec<Event> {
        if self.takes_points(ws) {
            match self.record_point(ws, operation, prefetch).await {
                Ok((event, dirty)) => {
                    let mut events = Vec::new();
                    if dirty != ws.dirty {
                        events.push(Event::WorkspaceDirtyChanged {
                            workspace_id: ws.id,
                            dirty,
                        });
                    }
                    events.push(event);
                    return events;
                }
                Err(e) => tracing::warn!(workspace = %ws.id, error = %e, "history: no point taken"),
            }
        }
        self.dirty_change(ws).await.into_iter().collect()
    }

    /// After a mutating exec: its point (from its `exec.finished`) and dirtiness.
    pub(crate) async fn after_exec(
        &self,
        ws: &WorkspaceRow,
        argv: &[String],
        events: &[Event],
        prefetch: PointPrefetch,
    ) -> Vec<Event> {
        let (exit_code, duration_ms) = events
            .iter()
            .find_map(|e| match e {
                Event::ExecFinished {
                    exit_code,
                    duration_ms,
                    ..
                } => Some((*exit_code, *duration_ms)),
                _ => None,
            })
            .unwrap_or((None, 0));
        let operation = Operation::Exec {
            argv: argv.to_vec(),
            exit_code,
            duration_ms,
        };
        self.after_change_with(ws, operation, prefetch).await
    }

    /// After a write tool: its point and dirtiness (a push changes no file: only git's
    /// dirty check).
    pub(crate) async fn after_tool(
        &self,
        ws: &WorkspaceRow,
        op: &ToolOp,
        prefetch: PointPrefetch,
    ) -> Vec<Event> {
        let (path, message) = match op {
            ToolOp::Create { path, .. }
            | ToolOp::StrReplace { path, .. }
            | ToolOp::Insert { path, .. }
            | ToolOp::WriteFile { path, .. } => (Some(path.clone()), None),
            ToolOp::GitCommit { message, .. } => (None, Some(message.clone())),
            _ => return self.dirty_change(ws).await.into_iter().collect(),
        };
        let tool = op.name().to_string();
        self.after_change_with(
            ws,
            Operation::Tool {
                tool,
                path,
                message,
            },
            prefetch,
        )
        .await
    }

    /// The first point of a workspace just created at `local_path` from `cache_dir`.
    pub(crate) async fn first_point(&self, created: &Event, cache_dir: &str) -> Option<Event> {
        let Event::WorkspaceCreated {
            workspace_id,
            user_id,
            local_path,
            ..
        } = created
        else {
            return None;
        };
        if !self.config.history {
            return None;
        }
        let paths = Paths {
            store: self.layout.history_dir(user_id, *workspace_id),
            workspace: PathBuf::from(local_path),
            cache: PathBuf::from(cache_dir),
        };
        let git = self.git.clone();
        let id = *workspace_id;
        match blocking(move || git.first_snapshot(&paths.borrow(), id)).await {
            Ok(snap) => Some(snapshot_event(id, snap, Operation::Created)),
            Err(e) => {
                tracing::warn!(workspace = %id, error = %e, "history: no first point");
                None
            }
        }
    }

    /// A history tool (ADR 28): reads under the shared command lock, a rewind, undo or
    /// checkpoint under the exclusive one, refused (`conflict`) if another command holds
    /// it instead of waiting behind it.
    pub(crate) async fn history_tool(
        &self,
        req: &ToolRequest,
        token: Option<&GitToken>,
    ) -> Result<Handled, CommandError> {
        let ws = self.workspace(req.workspace_id).await?;
        if Placement::of_node(&ws.node).is_remote() {
            return Err(CommandError::new(
                ErrorKind::Rejected,
                format!(
                    "workspace {} lives in {}: history is kept for workspaces on a node",
                    ws.id, ws.node
                ),
            ));
        }
        let op = &req.op;
        let exclusive = op.is_write() || matches!(op, ToolOp::HistoryDiff { until: None, .. });
        let wait = if op.is_write() {
            REWIND_WAIT
        } else {
            self.config.lock_timeout
        };
        let (ws, lock) = self.lock_for_history(ws.id, !exclusive, wait).await?;
        let correlation = correlation_of(&ws);
        match self.run_history(&ws, op, token).await {
            Ok((output, events, mut locks)) => {
                locks.insert(0, lock);
                Ok(Handled {
                    result: Ok(CommandResult::Tool(output)),
                    events,
                    locks,
                    correlation,
                })
            }
            Err(e) => {
                lock.release().await.ok();
                Err(e)
            }
        }
    }

    async fn lock_for_history(
        &self,
        id: Uuid,
        shared: bool,
        wait: Duration,
    ) -> Result<(WorkspaceRow, AdvisoryLock), CommandError> {
        let (lock, ws) = AdvisoryLock::acquire_workspace(&self.pool, id, shared, wait)
            .await
            .map_err(|e| match e {
                grove_postgres::StoreError::Locked(_) if !shared => CommandError::new(
                    ErrorKind::Conflict,
                    format!(
                        "workspace {id} is running another command; try again when it has finished"
                    ),
                ),
                other => store_error(other),
            })?;
        match ws {
            Some(ws) if ws.state.has_files() => Ok((ws, lock)),
            Some(_) => {
                lock.release().await.ok();
                Err(CommandError::new(
                    ErrorKind::Conflict,
                    format!("workspace {id} is evicted; restore it first"),
                ))
            }
            None => {
                lock.release().await.ok();
                Err(not_found(format!("workspace {id} not found")))
            }
        }
    }

    async fn run_history(
        &self,
        ws: &WorkspaceRow,
        op: &ToolOp,
        token: Option<&GitToken>,
    ) -> Result<(ToolOutput, Vec<Event>, Vec<AdvisoryLock>), CommandError> {
        let plain = |o: ToolOutput| Ok((o, Vec::new(), Vec::new()));
        match op {
            ToolOp::History { offset, limit } => {
                let points = self.timeline(ws.id).await?;
                let total = points.len() as u64;
                let page = points
                    .into_iter()
                    .skip(offset.unwrap_or(0) as usize)
                    .take(limit.unwrap_or(DEFAULT_HISTORY_PAGE))
                    .collect();
                plain(ToolOutput::History {
                    points: page,
                    total,
                })
            }
            ToolOp::HistoryDiff { since, until } => {
                plain(self.history_diff(ws, since, until.as_deref()).await?)
            }
            ToolOp::HistoryFile { point, path } => plain(self.history_file(ws, point, path).await?),
            ToolOp::Checkpoint { name } => {
                let number = self
                    .timeline(ws.id)
                    .await?
                    .last()
                    .map_or(0, |p| p.number + 1);
                let (event, _) = self
                    .record_point(
                        ws,
                        Operation::Checkpoint { name: name.clone() },
                        PointPrefetch::default(),
                    )
                    .await?;
                let point = point_of(&event, number);
                Ok((ToolOutput::Point(point), vec![event], Vec::new()))
            }
            ToolOp::Rewind { point } => {
                let (o, e) = self.rewind(ws, Some(point)).await?;
                Ok((o, e, Vec::new()))
            }
            ToolOp::Undo => {
                let (o, e) = self.rewind(ws, None).await?;
                Ok((o, e, Vec::new()))
            }
            ToolOp::Fork { point, scope } => self.fork(ws, point, scope, token).await,
            other => Err(crate::context::internal(format!(
                "{} is not a history tool",
                other.name()
            ))),
        }
    }

    /// The point `raw` names in the workspace's timeline, or a typed `not_found`.
    fn resolve<'a>(
        &self,
        ws: &WorkspaceRow,
        timeline: &'a [Point],
        raw: &str,
    ) -> Result<&'a Point, CommandError> {
        let r = PointRef::parse(raw).map_err(|m| CommandError::new(ErrorKind::InvalidInput, m))?;
        r.find(timeline).ok_or_else(|| {
            not_found(format!(
                "point {raw:?} is not in the history of workspace {}",
                ws.id
            ))
        })
    }

    async fn history_diff(
        &self,
        ws: &WorkspaceRow,
        from: &str,
        to: Option<&str>,
    ) -> Result<ToolOutput, CommandError> {
        let points = self.timeline(ws.id).await?;
        let a = self.resolve(ws, &points, from)?;
        let paths = self.history_paths(ws).await?;
        let (b, to_number) = match to {
            Some(raw) => {
                let p = self.resolve(ws, &points, raw)?;
                (p.snapshot.clone(), Some(p.number))
            }
            None => (self.take(ws, &paths, None).await?.id, None),
        };
        let git = self.git.clone();
        let a_id = a.snapshot.clone();
        let diff =
            blocking(move || git.history_diff(&paths.borrow(), &a_id, &b, MAX_DIFF_BYTES)).await?;
        Ok(ToolOutput::HistoryDiff {
            from_point: a.number,
            to_point: to_number,
            files: diff.files,
            patch: diff.patch,
            truncated: diff.truncated,
        })
    }

    async fn history_file(
        &self,
        ws: &WorkspaceRow,
        point: &str,
        path: &str,
    ) -> Result<ToolOutput, CommandError> {
        let rel = grove_tools::path::RelPath::parse(path).map_err(CommandError::from)?;
        let points = self.timeline(ws.id).await?;
        let p = self.resolve(ws, &points, point)?;
        let git = self.git.clone();
        let paths = self.history_paths(ws).await?;
        let (id, shown) = (p.snapshot.clone(), rel.as_str().to_string());
        let q = shown.clone();
        let bytes = blocking(move || git.history_file(&paths.borrow(), &id, &q))
            .await?
            .ok_or_else(|| not_found(format!("{shown} is not a file at point {}", p.number)))?;
        Ok(ToolOutput::File {
            path: shown,
            size_bytes: bytes.len() as u64,
            content: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }
}

/// The event of a point just taken.
fn snapshot_event(workspace_id: Uuid, snap: Snapshot, operation: Operation) -> Event {
    Event::WorkspaceSnapshotTaken {
        workspace_id,
        snapshot: snap.id,
        head: snap.head,
        branch: snap.branch,
        operation,
        changes: snap.changes,
        ignored_omitted: snap.ignored_omitted,
    }
}

/// A point as its (not yet appended) event describes it.
fn point_of(event: &Event, number: u64) -> Point {
    let Event::WorkspaceSnapshotTaken {
        workspace_id,
        snapshot,
        head,
        branch,
        operation,
        changes,
        ignored_omitted,
    } = event
    else {
        unreachable!("a point is made from workspace.snapshot_taken")
    };
    Point {
        number,
        snapshot: snapshot.clone(),
        position: None,
        at: now().to_rfc3339(),
        workspace_id: *workspace_id,
        operation: operation.clone(),
        head: head.clone(),
        branch: branch.clone(),
        changes: *changes,
        ignored_omitted: *ignored_omitted,
    }
}

/// The acquire that makes a fork of `ws` under `scope`.
fn fork_acquire(
    ws: &WorkspaceRow,
    repo_name: String,
    repo_url: String,
    scope: &str,
) -> AcquireWorkspace {
    AcquireWorkspace {
        user_id: ws.user_id.clone(),
        project_id: ws.project_id.clone(),
        repo_name,
        repo_url,
        base_ref: ws.base_ref.clone(),
        mode: ws.mode,
        conversation_id: (ws.mode == WorkspaceMode::Edit).then(|| scope.to_string()),
        task_id: (ws.mode == WorkspaceMode::Task).then(|| scope.to_string()),
        runtime: None,
        history_ignored: ws.history_ignored,
    }
}

mod rewind;
