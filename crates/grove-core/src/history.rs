//! Workspace history as data: the points of a workspace's timeline (one snapshot of
//! its files, HEAD and branch per change), what each change was, how a caller names a
//! point, and the port the git adapter implements to take, compare and restore them.
//! No IO; the store lives under `$GROVE_HOME/history` (`layout::Layout::history_dir`).

use std::path::Path;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::GitError;
use crate::events::{Event, RecordedEvent};

/// Most points one `history` page returns.
pub const MAX_HISTORY_PAGE: usize = 500;
/// Points in a `history` page when the request does not say.
pub const DEFAULT_HISTORY_PAGE: usize = 50;
/// Longest checkpoint name.
pub const MAX_CHECKPOINT_NAME: usize = 200;

/// What change a point records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Operation {
    /// The workspace was created (its first point).
    Created,
    /// A mutating command ran.
    Exec {
        argv: Vec<String>,
        exit_code: Option<i32>,
        duration_ms: u64,
    },
    /// A write tool ran (`path` for file tools, the message for `git_commit`).
    Tool {
        tool: String,
        path: Option<String>,
        message: Option<String>,
    },
    /// A named point an agent asked for.
    Checkpoint { name: String },
    /// The workspace's state just before a rewind discarded it.
    BeforeRewind,
    /// The workspace was rewound to the point `to` (a snapshot id).
    Rewind { to: String },
    /// A task workspace's commits were merged back into this one (`commits`: how many
    /// were brought in).
    MergeBack {
        task_workspace_id: Uuid,
        commits: u32,
        fast_forward: bool,
    },
    /// The evicted workspace was checked out again from its repo cache and saved work.
    Restore,
}

/// Files changed since the previous point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileCounts {
    pub added: u32,
    pub modified: u32,
    pub deleted: u32,
}

/// One snapshot as the store took it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The snapshot's id: a commit of the history store (40 hex digits).
    pub id: String,
    /// HEAD's commit at the time.
    pub head: String,
    /// The branch HEAD was on (`refs/heads/...`), none when detached.
    pub branch: Option<String>,
    pub changes: FileCounts,
    /// The working tree differs from HEAD's tree (untracked files included, ignored
    /// ones not): the workspace's `dirty`, from the same walk.
    pub dirty: bool,
    /// Ignored files left out of the point because they did not fit the budget
    /// (always 0 when ignored files are excluded).
    pub ignored_omitted: u32,
}

/// Which ignored files (matched by the workspace's `.gitignore` files and not in HEAD's
/// tree) a point keeps: a per-workspace choice made when it is acquired.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IgnoredFiles {
    /// None (the default): a point holds tracked and untracked files only.
    #[default]
    Excluded,
    /// Those that fit in `budget_bytes` per point, taken in path order (a file that
    /// does not fit is left out and the next ones are tried); a file over the budget
    /// is never read past it.
    Included { budget_bytes: u64 },
}

/// One point of a workspace's timeline, as `history` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Point {
    /// Its number in the timeline: 0 is the creation, then one per change.
    pub number: u64,
    pub snapshot: String,
    /// The event that recorded it (`workspace.snapshot_taken`), its log position
    /// (absent in the answer of the command that records it: not yet appended).
    pub position: Option<i64>,
    /// When it was recorded (RFC 3339).
    pub at: String,
    /// The workspace whose change it was (a fork lists its source's points first).
    pub workspace_id: Uuid,
    pub operation: Operation,
    pub head: String,
    pub branch: Option<String>,
    pub changes: FileCounts,
    /// Ignored files the point left out over its budget (workspaces that keep ignored
    /// files only).
    #[serde(default)]
    pub ignored_omitted: u32,
}

/// How a caller names a point: its number in the timeline or its snapshot id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PointRef {
    Number(u64),
    Snapshot(String),
}

impl PointRef {
    /// Parses `"12"` (a number) or a 40-hex snapshot id.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        if let Ok(n) = raw.parse::<u64>() {
            if raw.len() < 40 {
                return Ok(Self::Number(n));
            }
        }
        if raw.len() == 40 && raw.chars().all(|c| c.is_ascii_hexdigit()) {
            return Ok(Self::Snapshot(raw.to_ascii_lowercase()));
        }
        Err(format!(
            "point {:?} is neither a point number nor a snapshot id (40 hex digits)",
            raw.chars().take(64).collect::<String>()
        ))
    }

    /// The point of `timeline` this names, if it is one of its points.
    pub fn find<'a>(&self, timeline: &'a [Point]) -> Option<&'a Point> {
        match self {
            Self::Number(n) => timeline.iter().find(|p| p.number == *n),
            Self::Snapshot(id) => timeline.iter().rev().find(|p| p.snapshot == *id),
        }
    }
}

/// One file changed between two points.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangedFile {
    pub path: String,
    /// `added`, `modified`, `deleted` or `typechange`.
    pub status: String,
}

/// The difference between two trees of the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeDiff {
    pub files: Vec<ChangedFile>,
    /// A unified diff (`git diff --binary` shape).
    pub patch: String,
    /// The patch was cut at the size limit.
    pub truncated: bool,
}

/// What a rewind changed in the workspace, and the point of the state it left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RewindReport {
    pub files_written: u32,
    pub files_removed: u32,
    /// The point after the rewind (counts against the point it started from), made
    /// from the files it wrote: no second walk of the tree.
    pub point: Snapshot,
}

/// Where one workspace's history lives and what it borrows.
#[derive(Debug, Clone, Copy)]
pub struct HistoryPaths<'a> {
    /// The private store (`Layout::history_dir`), created on first use with mode 0700.
    pub store_dir: &'a Path,
    /// The workspace checkout (hostile: read without following links).
    pub workspace_dir: &'a Path,
    /// The repo cache, read (never written) for the commits the workspace borrows.
    pub cache_dir: &'a Path,
}

/// The history operations of the git adapter. Calls are blocking.
pub trait HistoryPort: Send + Sync {
    /// Records the workspace's working tree (tracked and untracked files, and the
    /// ignored ones `ignored` lets in), HEAD and branch as a point of the store; counts
    /// are against `previous` (none: against an empty tree). The workspace's index,
    /// refs and objects are not touched.
    fn snapshot(
        &self,
        paths: &HistoryPaths<'_>,
        workspace_id: Uuid,
        previous: Option<&str>,
        ignored: IgnoredFiles,
    ) -> Result<Snapshot, GitError>;
    /// [`HistoryPort::snapshot`], reading only the paths this process's change tracker
    /// of the workspace saw change since its last point (ADR 32); without one (a first
    /// call, a worker restart, a tracker that lost track, ignored files kept) by a walk
    /// of the whole tree, which (re)starts the tracker. The same point either way.
    fn tracked_snapshot(
        &self,
        paths: &HistoryPaths<'_>,
        workspace_id: Uuid,
        previous: Option<&str>,
        ignored: IgnoredFiles,
    ) -> Result<Snapshot, GitError> {
        self.snapshot(paths, workspace_id, previous, ignored)
    }
    /// Drops this process's change tracker of a workspace (released, evicted or
    /// destroyed): its watches and pending paths go.
    fn forget_tracker(&self, workspace_id: Uuid) {
        let _ = workspace_id;
    }
    /// The first point of a checkout grove has just made (nothing has run in it): the
    /// store's private index starts as a copy of the checkout's own, whose stat data
    /// grove wrote, so no file is hashed.
    fn first_snapshot(
        &self,
        paths: &HistoryPaths<'_>,
        workspace_id: Uuid,
    ) -> Result<Snapshot, GitError>;
    /// The diff from snapshot `from` to snapshot `to` of one store.
    fn history_diff(
        &self,
        paths: &HistoryPaths<'_>,
        from: &str,
        to: &str,
        max_bytes: usize,
    ) -> Result<TreeDiff, GitError>;
    /// A file's bytes at a snapshot (`None`: no such file there).
    fn history_file(
        &self,
        paths: &HistoryPaths<'_>,
        snapshot: &str,
        path: &str,
    ) -> Result<Option<Vec<u8>>, GitError>;
    /// Puts the workspace's files, HEAD and branch back to snapshot `to`, given that it
    /// is now at snapshot `now` (taken just before), and records the point after it.
    /// Writes relative to the workspace root and never follows a link in it. `branch`
    /// (a full `refs/heads/...` name) puts HEAD on that branch instead of the point's
    /// own (a fork's new branch).
    fn rewind(
        &self,
        paths: &HistoryPaths<'_>,
        workspace_id: Uuid,
        now: &str,
        to: &str,
        branch: Option<&str>,
    ) -> Result<RewindReport, GitError>;
    /// Gives the store `to` every point of the store `from` (created when absent; an
    /// existing store keeps what it has, its private index included). Objects are
    /// hard links where the filesystem allows (they never change), refs copies.
    fn copy_history(&self, from: &Path, to: &Path) -> Result<(), GitError>;
    /// Drops the points not in `keep` from the store, then deletes the objects only they
    /// held and packs the rest (the cache's objects stay out of the store). Returns how
    /// many were dropped.
    fn prune_history(&self, paths: &HistoryPaths<'_>, keep: &[String]) -> Result<usize, GitError>;
    /// Deletes a store (absent is Ok).
    fn discard_history(&self, store_dir: &Path) -> Result<(), GitError>;
    /// The store's loose objects, estimated from one fan-out directory as
    /// `git gc --auto` does (0: none, or no store).
    fn history_loose_objects(&self, store_dir: &Path) -> usize;
    /// Packs the store's objects into one pack (deltas between versions of a file or
    /// tree; the cache's objects stay out) and its refs, removing the loose ones; points
    /// are unchanged. Returns how many loose objects were packed.
    fn pack_history(&self, paths: &HistoryPaths<'_>) -> Result<usize, GitError>;
}

/// Where a workspace's timeline starts: its own creation, or a point of its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Created,
    Forked {
        source_workspace_id: Uuid,
        number: u64,
    },
}

/// The origin a workspace's history events name (its `workspace.forked`, if any).
pub fn origin(events: &[RecordedEvent]) -> Origin {
    events
        .iter()
        .find_map(|e| match &e.event {
            Event::WorkspaceForked {
                source_workspace_id,
                number,
                ..
            } => Some(Origin::Forked {
                source_workspace_id: *source_workspace_id,
                number: *number,
            }),
            _ => None,
        })
        .unwrap_or(Origin::Created)
}

/// Folds a workspace's history events (`workspace.snapshot_taken`, `workspace.forked`,
/// `workspace.history_pruned`, oldest first) onto `inherited` (its source's points up
/// to the fork, or none). Numbers are stable: a pruned point keeps its number's place,
/// and a fork's own points follow the number its `workspace.forked` names even when the
/// source later pruned that point.
pub fn timeline(workspace_id: Uuid, inherited: Vec<Point>, events: &[RecordedEvent]) -> Vec<Point> {
    let mut next = inherited.last().map_or(0, |p| p.number + 1);
    let mut points = inherited;
    for e in events {
        match &e.event {
            Event::WorkspaceSnapshotTaken {
                snapshot,
                head,
                branch,
                operation,
                changes,
                ignored_omitted,
                ..
            } => {
                points.push(Point {
                    number: next,
                    snapshot: snapshot.clone(),
                    position: Some(e.position),
                    at: e.recorded_at.to_rfc3339(),
                    workspace_id,
                    operation: operation.clone(),
                    head: head.clone(),
                    branch: branch.clone(),
                    changes: *changes,
                    ignored_omitted: *ignored_omitted,
                });
                next += 1;
            }
            Event::WorkspaceForked { number, .. } => next = number + 1,
            Event::WorkspaceHistoryPruned { dropped, .. } => {
                points.retain(|p| !dropped.contains(&p.snapshot));
            }
            _ => {}
        }
    }
    points
}

/// Which points of a workspace's own timeline its retention policy drops at `now`:
/// every point younger than `keep_all_days` stays; older ones are thinned to the last
/// point of each UTC day; the latest point, inherited points (a fork's source's) and
/// any snapshot a kept point shares stay. `keep_all_days` 0: nothing is dropped.
pub fn to_prune(
    workspace_id: Uuid,
    points: &[Point],
    now: chrono::DateTime<chrono::Utc>,
    keep_all_days: u64,
) -> Vec<String> {
    if keep_all_days == 0 || points.len() < 2 {
        return Vec::new();
    }
    let cutoff = now - chrono::Duration::days(keep_all_days.min(36_500) as i64);
    let day_of = |p: &Point| {
        chrono::DateTime::parse_from_rfc3339(&p.at)
            .ok()
            .map(|t| t.with_timezone(&chrono::Utc))
    };
    let last = points.len() - 1;
    let dropped: Vec<bool> = points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let Some(at) = day_of(p) else { return false };
            let next_same_day = points
                .get(i + 1)
                .and_then(day_of)
                .is_some_and(|n| n.date_naive() == at.date_naive());
            i != last && p.workspace_id == workspace_id && at < cutoff && next_same_day
        })
        .collect();
    let kept: Vec<&str> = points
        .iter()
        .zip(&dropped)
        .filter(|(_, d)| !**d)
        .map(|(p, _)| p.snapshot.as_str())
        .collect();
    let mut drop: Vec<String> = points
        .iter()
        .zip(&dropped)
        .filter(|(p, d)| **d && !kept.contains(&p.snapshot.as_str()))
        .map(|(p, _)| p.snapshot.clone())
        .collect();
    drop.dedup();
    drop
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_named_by_number_or_snapshot_id() {
        assert_eq!(PointRef::parse("12"), Ok(PointRef::Number(12)));
        let id = "a".repeat(40);
        assert_eq!(PointRef::parse(&id), Ok(PointRef::Snapshot(id.clone())));
        assert_eq!(PointRef::parse(&"A".repeat(40)), Ok(PointRef::Snapshot(id)));
        for bad in ["", "-1", "HEAD~1", "abc", "../x", &"1".repeat(41)] {
            assert!(PointRef::parse(bad).is_err(), "{bad}");
        }
        // Forty decimal digits are a snapshot id, not a number.
        assert!(matches!(
            PointRef::parse(&"1".repeat(40)),
            Ok(PointRef::Snapshot(_))
        ));
    }

    fn recorded(position: i64, event: Event) -> RecordedEvent {
        RecordedEvent {
            position,
            tx_id: position,
            stream_id: String::new(),
            stream_version: position,
            event_type: event.event_type().to_string(),
            event_version: 1,
            event,
            metadata: crate::events::Metadata {
                command_id: Uuid::nil(),
                correlation: Default::default(),
                worker_id: String::new(),
                node: String::new(),
            },
            recorded_at: chrono::DateTime::from_timestamp(position, 0).unwrap(),
        }
    }

    fn taken(ws: Uuid, snapshot: &str) -> Event {
        Event::WorkspaceSnapshotTaken {
            workspace_id: ws,
            snapshot: snapshot.into(),
            head: "h".into(),
            branch: None,
            operation: Operation::Created,
            changes: FileCounts::default(),
            ignored_omitted: 0,
        }
    }

    #[test]
    fn a_fork_continues_its_sources_numbers_and_pruning_keeps_them() {
        let (src, fork) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let src_events: Vec<_> = (0..4)
            .map(|i| recorded(i, taken(src, &format!("s{i}"))))
            .collect();
        let source = timeline(src, Vec::new(), &src_events);
        assert_eq!(
            source.iter().map(|p| p.number).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        let fork_events = vec![
            recorded(
                10,
                Event::WorkspaceForked {
                    workspace_id: fork,
                    source_workspace_id: src,
                    snapshot: "s1".into(),
                    number: 1,
                },
            ),
            recorded(11, taken(fork, "f0")),
            recorded(
                12,
                Event::WorkspaceHistoryPruned {
                    workspace_id: fork,
                    dropped: vec!["s0".into()],
                },
            ),
            recorded(13, taken(fork, "f1")),
        ];
        assert_eq!(
            origin(&fork_events),
            Origin::Forked {
                source_workspace_id: src,
                number: 1
            }
        );
        let inherited = source.into_iter().filter(|p| p.number <= 1).collect();
        let t = timeline(fork, inherited, &fork_events);
        let seen: Vec<(u64, &str)> = t.iter().map(|p| (p.number, p.snapshot.as_str())).collect();
        assert_eq!(seen, [(1, "s1"), (2, "f0"), (3, "f1")]);
        assert_eq!(PointRef::Number(2).find(&t).unwrap().snapshot, "f0");
        assert!(PointRef::Number(0).find(&t).is_none(), "pruned");
        assert!(PointRef::Snapshot("zz".into()).find(&t).is_none());
    }

    #[test]
    fn a_forks_numbers_stay_when_its_source_later_prunes_the_point_it_forked_at() {
        let (src, fork) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let mut src_events: Vec<_> = (0..3)
            .map(|i| recorded(i, taken(src, &format!("s{i}"))))
            .collect();
        src_events.push(recorded(
            20,
            Event::WorkspaceHistoryPruned {
                workspace_id: src,
                dropped: vec!["s1".into()],
            },
        ));
        let fork_events = vec![
            recorded(
                10,
                Event::WorkspaceForked {
                    workspace_id: fork,
                    source_workspace_id: src,
                    snapshot: "s1".into(),
                    number: 1,
                },
            ),
            recorded(11, taken(fork, "f0")),
        ];
        let inherited: Vec<Point> = timeline(src, Vec::new(), &src_events)
            .into_iter()
            .filter(|p| p.number <= 1)
            .collect();
        assert_eq!(inherited.len(), 1, "the source dropped its point 1");
        let t = timeline(fork, inherited, &fork_events);
        let seen: Vec<(u64, &str)> = t.iter().map(|p| (p.number, p.snapshot.as_str())).collect();
        assert_eq!(seen, [(0, "s0"), (2, "f0")]);
    }

    #[test]
    fn retention_thins_old_points_to_one_a_day_and_keeps_recent_inherited_and_latest() {
        let ws = Uuid::from_u128(1);
        let day =
            |d: i64, h: i64| chrono::DateTime::from_timestamp(d * 86_400 + h * 3_600, 0).unwrap();
        let point = |n: u64, at: chrono::DateTime<chrono::Utc>, owner: Uuid| Point {
            number: n,
            snapshot: format!("s{n}"),
            position: Some(n as i64),
            at: at.to_rfc3339(),
            workspace_id: owner,
            operation: Operation::Created,
            head: "h".into(),
            branch: None,
            changes: FileCounts::default(),
            ignored_omitted: 0,
        };
        let source = Uuid::from_u128(9);
        let points = vec![
            point(0, day(0, 1), source),
            point(1, day(0, 2), source),
            point(2, day(1, 1), ws),
            point(3, day(1, 2), ws),
            point(4, day(1, 3), ws),
            point(5, day(30, 1), ws),
            point(6, day(30, 2), ws),
        ];
        let now = day(31, 0);
        // Older than 7 days: day 1 keeps its last point; day 0 is inherited; day 30 is recent.
        assert_eq!(to_prune(ws, &points, now, 7), ["s2", "s3"]);
        assert!(to_prune(ws, &points, now, 0).is_empty());
        assert!(
            to_prune(ws, &points, day(400, 0), 7).len() == 3,
            "day 30 thinned too, never the latest"
        );
        // A snapshot shared with a kept point is not dropped.
        let mut shared = points.clone();
        shared[3].snapshot = "s4".into();
        assert_eq!(to_prune(ws, &shared, now, 7), ["s2"]);
    }
}
