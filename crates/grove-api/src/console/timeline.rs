//! A workspace's events told as a story: one item per command (argv, exit code,
//! duration, kept output), file write, commit, push, merge-back, eviction or restore.
//!
//! Items are plain data for the template, which escapes every string. Each item keeps
//! its event's stream version. A step that recorded a history point (ADR 28: its
//! `workspace.snapshot_taken` is in the step's transaction) carries the point's number
//! and file counts, where the page hangs the step's diff and the operators' rewind and
//! fork; a point of its own (a checkpoint, a rewind) is an item of its own.

use std::collections::{BTreeSet, HashMap};

use grove_core::events::{Event, RecordedEvent};
use grove_core::history::{FileCounts, Operation};
use grove_postgres::console::KeptExec;
use serde::Serialize;
use uuid::Uuid;

/// One step of the story.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Item {
    /// The (last) event's version in the workspace's stream.
    pub version: i64,
    pub at: String,
    /// `exec`, `file`, `commit`, `push`, `merge`, `evict`, `restore`, `pull`, `workspace`,
    /// `other`.
    pub kind: &'static str,
    /// One line (the event type and what it names).
    pub title: String,
    /// Further lines (reasons, files, commits).
    pub details: Vec<String>,
    /// For an exec: its id (the DOM id lets a live update replace the running item).
    pub exec_id: Option<Uuid>,
    pub argv: Vec<String>,
    pub running: bool,
    pub exit_code: Option<i32>,
    pub duration_ms: Option<u64>,
    pub outcome: Option<String>,
    pub stdout: Option<String>,
    pub stderr: Option<String>,
    pub output_note: Option<String>,
    /// The history point this step recorded.
    pub point: Option<PointTag>,
    /// Who asked for it from the console (a rewind's point, a fork).
    pub requested_by: Option<String>,
    /// For a fork: the workspace it was forked from (a link).
    pub source: Option<Uuid>,
    /// The transaction of its (last) event: a point joins the step of its transaction.
    #[serde(skip)]
    tx: i64,
    /// A change a point can belong to (a command, a file write, a commit, a merge-back, a
    /// restore, the creation).
    #[serde(skip)]
    step: bool,
}

/// A history point as the timeline shows it.
#[derive(Debug, Clone, Serialize)]
pub struct PointTag {
    pub number: u64,
    pub added: u32,
    pub modified: u32,
    pub deleted: u32,
    /// Ignored files the point left out over the workspace's budget.
    pub ignored_omitted: u32,
    /// Dropped by the retention policy: no diff, rewind or fork from it.
    pub pruned: bool,
    /// Where the workspace's history starts: no earlier point to diff against.
    pub first: bool,
}

/// The numbers of a workspace's own points, from its history events (all of them,
/// oldest first): 0 is the creation, a fork's first own point follows the point it was
/// forked at, and a pruned point keeps its number.
#[derive(Debug, Default)]
pub struct Points {
    by_position: HashMap<i64, u64>,
    by_snapshot: HashMap<String, u64>,
    live: BTreeSet<u64>,
    /// The source and point this workspace was forked from.
    pub forked_from: Option<(Uuid, u64)>,
}

impl Points {
    pub fn of(events: &[RecordedEvent]) -> Self {
        let mut p = Points::default();
        let mut next = 0;
        let mut snapshot_of: HashMap<u64, String> = HashMap::new();
        for e in events {
            match &e.event {
                Event::WorkspaceForked {
                    source_workspace_id,
                    number,
                    ..
                } => {
                    p.forked_from = Some((*source_workspace_id, *number));
                    next = number + 1;
                }
                Event::WorkspaceSnapshotTaken { snapshot, .. } => {
                    p.by_position.insert(e.position, next);
                    // Two points may share a snapshot id: the latest names it, as
                    // `PointRef::find` resolves it.
                    p.by_snapshot.insert(snapshot.clone(), next);
                    p.live.insert(next);
                    snapshot_of.insert(next, snapshot.clone());
                    next += 1;
                }
                Event::WorkspaceHistoryPruned { dropped, .. } => {
                    p.live
                        .retain(|n| !snapshot_of.get(n).is_some_and(|s| dropped.contains(s)));
                }
                _ => {}
            }
        }
        p
    }

    /// Whether `n` is one of the workspace's own points, not pruned.
    pub fn is_live(&self, n: u64) -> bool {
        self.live.contains(&n)
    }

    /// The point a step's diff starts from: the latest own point before `n`, else (a
    /// fork's first own point) the point it was forked at. `None`: `n` is the first.
    pub fn previous(&self, n: u64) -> Option<u64> {
        self.live
            .range(..n)
            .next_back()
            .copied()
            .or(match self.forked_from {
                Some((_, at)) if at < n => Some(at),
                _ => None,
            })
    }

    /// The number of the own point recorded by the event at `position`.
    fn number_at(&self, position: i64) -> Option<u64> {
        self.by_position.get(&position).copied()
    }

    /// The own point whose snapshot is `id` (a rewind's target, when it is an own one).
    fn number_of(&self, id: &str) -> Option<u64> {
        self.by_snapshot.get(id).copied()
    }
}

/// The exec ids these events name (to read their ledger rows).
pub fn exec_ids(events: &[RecordedEvent]) -> Vec<Uuid> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Event::ExecStarted { exec_id, .. } | Event::ExecFinished { exec_id, .. } => {
                Some(*exec_id)
            }
            _ => None,
        })
        .collect()
}

/// The commands whose requester a timeline of `events` shows: those that recorded a
/// rewind's points or a fork.
pub fn action_ids(events: &[RecordedEvent]) -> Vec<Uuid> {
    let mut ids: Vec<Uuid> = events
        .iter()
        .filter(|e| match &e.event {
            Event::WorkspaceSnapshotTaken { operation, .. } => {
                matches!(
                    operation,
                    Operation::Rewind { .. } | Operation::BeforeRewind
                )
            }
            Event::WorkspaceForked { .. } => true,
            _ => false,
        })
        .map(|e| e.metadata.command_id)
        .collect();
    ids.dedup();
    ids
}

/// What the story is told with besides the events: the execs' ledger rows, the
/// workspace's point numbers and who asked for the console's actions.
pub struct Context<'a> {
    pub kept: &'a HashMap<Uuid, KeptExec>,
    pub points: &'a Points,
    pub requesters: &'a HashMap<Uuid, String>,
}

/// The story of `events` (oldest first).
pub fn items(events: &[RecordedEvent], cx: &Context<'_>) -> Vec<Item> {
    let kept = cx.kept;
    let mut out: Vec<Item> = Vec::new();
    let mut exec_at: HashMap<Uuid, usize> = HashMap::new();
    for e in events {
        let base = Item {
            version: e.stream_version,
            at: e.recorded_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            tx: e.tx_id,
            requested_by: cx.requesters.get(&e.metadata.command_id).cloned(),
            ..Default::default()
        };
        match &e.event {
            Event::WorkspaceSnapshotTaken {
                operation,
                changes,
                ignored_omitted,
                ..
            } => {
                let counts = (*changes, *ignored_omitted);
                point_item(&mut out, e, operation, counts, cx.points, base)
            }
            Event::ExecStarted { exec_id, argv, .. } => {
                exec_at.insert(*exec_id, out.len());
                out.push(Item {
                    kind: "exec",
                    title: "command started".into(),
                    exec_id: Some(*exec_id),
                    argv: argv.clone(),
                    running: true,
                    step: true,
                    ..base
                });
            }
            Event::ExecFinished {
                exec_id,
                outcome,
                exit_code,
                duration_ms,
                ..
            } => {
                let k = kept.get(exec_id);
                let item = match exec_at.get(exec_id) {
                    Some(&i) => &mut out[i],
                    None => {
                        out.push(Item {
                            kind: "exec",
                            exec_id: Some(*exec_id),
                            argv: k.map(|k| k.argv.clone()).unwrap_or_default(),
                            ..base.clone()
                        });
                        out.last_mut().expect("just pushed")
                    }
                };
                item.version = base.version;
                item.tx = base.tx;
                item.step = true;
                item.title = "command".into();
                item.running = false;
                item.exit_code = *exit_code;
                item.duration_ms = Some(*duration_ms);
                item.outcome = Some(outcome.clone());
                match k {
                    Some(k) => {
                        item.stdout = k.stdout.as_deref().map(clip);
                        item.stderr = k.stderr.as_deref().map(clip);
                        item.output_note = k.output_note.clone();
                    }
                    None => item.output_note = Some("pruned".into()),
                }
            }
            other => out.push(describe(other, base)),
        }
    }
    out
}

/// A `workspace.snapshot_taken`: its point joins the step of the same transaction, or
/// (a checkpoint, a rewind, a step not in view) is an item of its own.
fn point_item(
    out: &mut Vec<Item>,
    e: &RecordedEvent,
    operation: &Operation,
    (changes, ignored_omitted): (FileCounts, u32),
    points: &Points,
    base: Item,
) {
    let Some(number) = points.number_at(e.position) else {
        return;
    };
    let tag = PointTag {
        number,
        added: changes.added,
        modified: changes.modified,
        deleted: changes.deleted,
        ignored_omitted,
        pruned: !points.is_live(number),
        first: points.previous(number).is_none(),
    };
    let own_item = matches!(
        operation,
        Operation::Checkpoint { .. } | Operation::BeforeRewind | Operation::Rewind { .. }
    );
    let step = out
        .iter_mut()
        .rev()
        .take_while(|i| i.tx == e.tx_id)
        .filter(|i| i.step && i.point.is_none())
        .last();
    match step {
        Some(item) if !own_item => item.point = Some(tag),
        _ => out.push(Item {
            kind: "point",
            title: point_title(operation, points),
            point: Some(tag),
            ..base
        }),
    }
}

fn point_title(operation: &Operation, points: &Points) -> String {
    match operation {
        Operation::Created => "the workspace as created".into(),
        Operation::Exec { argv, .. } => format!("after command {}", argv.join(" ")),
        Operation::Tool { tool, path, .. } => match path {
            Some(p) => format!("after {tool} {p}"),
            None => format!("after {tool}"),
        },
        Operation::Checkpoint { name } => format!("checkpoint {name}"),
        Operation::BeforeRewind => "the state a rewind discarded, kept".into(),
        Operation::Rewind { to } => match points.number_of(to) {
            Some(n) => format!("rewound to point {n}"),
            None => format!("rewound to snapshot {}", short(to)),
        },
        Operation::MergeBack {
            task_workspace_id,
            commits,
            ..
        } => format!("after merging back task {task_workspace_id} ({commits} commits)"),
        Operation::Restore => "after a restore".into(),
    }
}

fn describe(event: &Event, base: Item) -> Item {
    let (kind, title, details) = match event {
        Event::WorkspaceCreated {
            base_ref,
            base_commit,
            mode,
            ..
        } => (
            "workspace",
            format!(
                "created ({}) from {base_ref} at {}",
                mode.as_str(),
                short(base_commit)
            ),
            vec![],
        ),
        Event::WorkspaceAcquired { .. } => ("workspace", "acquired".into(), vec![]),
        Event::WorkspaceReleased { .. } => ("workspace", "released".into(), vec![]),
        Event::WorkspaceDestroyed { .. } => ("workspace", "destroyed".into(), vec![]),
        Event::WorkspaceDirtyChanged { dirty, .. } => (
            "workspace",
            if *dirty {
                "has uncommitted changes"
            } else {
                "clean"
            }
            .into(),
            vec![],
        ),
        Event::WorkspacePinned { until, .. } => (
            "workspace",
            match until {
                Some(t) => format!("pinned until {}", t.format("%Y-%m-%d %H:%M:%S")),
                None => "unpinned".into(),
            },
            vec![],
        ),
        Event::WorkspaceFileWritten {
            path,
            op,
            size_bytes,
            created,
            ..
        } => (
            "file",
            format!("{op} {path}"),
            vec![format!(
                "{size_bytes} bytes{}",
                if *created { ", new file" } else { "" }
            )],
        ),
        Event::WorkspaceCommitted { commit, files, .. } => {
            ("commit", format!("commit {}", short(commit)), files.clone())
        }
        Event::WorkspacePushed {
            branch,
            commit,
            forced,
            ..
        } => (
            "push",
            format!("pushed {branch} at {}", short(commit)),
            if *forced {
                vec!["forced".into()]
            } else {
                vec![]
            },
        ),
        Event::WorkspaceMergedBack {
            task_workspace_id,
            branch,
            new_head,
            commits,
            ..
        } => (
            "merge",
            format!("merged back task {task_workspace_id} into {branch}"),
            vec![format!(
                "{} commits, head {}",
                commits.len(),
                short(new_head)
            )],
        ),
        Event::WorkspaceMergeBackConflicted { paths, .. } => {
            ("merge", "merge-back conflicted".into(), paths.clone())
        }
        Event::WorkspaceEvicting { cause, .. } => {
            ("evict", "eviction started".into(), vec![cause_text(cause)])
        }
        Event::WorkspaceEvicted {
            cause, bytes_freed, ..
        } => (
            "evict",
            "evicted".into(),
            vec![cause_text(cause), format!("{bytes_freed} bytes freed")],
        ),
        Event::WorkspaceEvictionBlocked { error, .. } => {
            ("evict", "eviction blocked".into(), vec![error.clone()])
        }
        Event::WorkspaceRestored { head_commit, .. } => (
            "restore",
            format!("restored at {}", short(head_commit)),
            vec![],
        ),
        Event::WorkspacePullRequestOpened { url, title, .. } => (
            "pull",
            format!("pull request opened: {title}"),
            vec![url.clone()],
        ),
        Event::WorkspaceForked {
            source_workspace_id,
            number,
            ..
        } => (
            "workspace",
            format!("forked from workspace {source_workspace_id} at point {number}"),
            vec![],
        ),
        other => ("other", other.event_type().replace('_', " "), vec![]),
    };
    let step = matches!(
        event,
        Event::WorkspaceCreated { .. }
            | Event::WorkspaceFileWritten { .. }
            | Event::WorkspaceCommitted { .. }
            | Event::WorkspaceMergedBack { .. }
            | Event::WorkspaceRestored { .. }
    );
    let source = match event {
        Event::WorkspaceForked {
            source_workspace_id,
            ..
        } => Some(*source_workspace_id),
        _ => None,
    };
    Item {
        kind,
        title,
        details,
        step,
        source,
        ..base
    }
}

/// Output shown per stream of one command; the rest is one `GET /v1/execs/{id}` away.
pub const SHOWN_OUTPUT_BYTES: usize = 64 * 1024;

/// `text` cut to [`SHOWN_OUTPUT_BYTES`] (at a character boundary), saying what was cut.
fn clip(text: &str) -> String {
    if text.len() <= SHOWN_OUTPUT_BYTES {
        return text.to_owned();
    }
    let cut = (0..=SHOWN_OUTPUT_BYTES)
        .rev()
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    format!(
        "{}\n… {} more bytes (GET /v1/execs/{{id}} has them all)",
        &text[..cut],
        text.len() - cut
    )
}

fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

fn cause_text(cause: &grove_core::events::EvictionCause) -> String {
    serde_json::to_string(cause).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use grove_core::events::{Correlation, Metadata};

    fn recorded(version: i64, event: Event) -> RecordedEvent {
        RecordedEvent {
            position: version,
            tx_id: 1,
            stream_id: "workspace:x".into(),
            stream_version: version,
            event_type: event.event_type().into(),
            event_version: 1,
            event,
            metadata: Metadata {
                command_id: Uuid::nil(),
                correlation: Correlation::default(),
                worker_id: "w".into(),
                node: "n".into(),
            },
            recorded_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn an_exec_is_one_item_with_its_kept_output() {
        let (ws, rt, id) = (Uuid::nil(), Uuid::nil(), Uuid::now_v7());
        let events = [
            recorded(
                1,
                Event::ExecStarted {
                    exec_id: id,
                    workspace_id: ws,
                    runtime_id: rt,
                    kind: grove_core::model::ExecKind::Write,
                    argv: vec!["echo".into(), "hi".into()],
                    env_keys: vec![],
                    timeout_ms: None,
                },
            ),
            recorded(
                2,
                Event::ExecFinished {
                    exec_id: id,
                    workspace_id: ws,
                    runtime_id: rt,
                    outcome: "completed".into(),
                    exit_code: Some(0),
                    timed_out: false,
                    truncated: false,
                    duration_ms: 5,
                    stdout_bytes: 3,
                    stderr_bytes: 0,
                },
            ),
        ];
        let kept = HashMap::from([(
            id,
            KeptExec {
                stdout: Some("hi\n".into()),
                ..Default::default()
            },
        )]);
        let cx = Context {
            kept: &kept,
            points: &Points::default(),
            requesters: &HashMap::new(),
        };
        let items = items(&events, &cx);
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].argv, ["echo", "hi"]);
        assert_eq!(items[0].stdout.as_deref(), Some("hi\n"));
        assert_eq!(items[0].version, 2);
        assert!(!items[0].running);
    }

    fn snapshot(ws: Uuid, id: &str, operation: Operation, added: u32) -> Event {
        Event::WorkspaceSnapshotTaken {
            workspace_id: ws,
            snapshot: id.into(),
            head: "h".into(),
            branch: None,
            operation,
            changes: FileCounts {
                added,
                modified: 0,
                deleted: 0,
            },
            ignored_omitted: 0,
        }
    }

    #[test]
    fn a_point_joins_the_step_of_its_transaction_and_a_rewind_is_its_own_item() {
        let ws = Uuid::nil();
        let in_tx = |v: i64, tx: i64, event: Event| RecordedEvent {
            tx_id: tx,
            ..recorded(v, event)
        };
        let events = vec![
            in_tx(
                1,
                1,
                Event::WorkspaceFileWritten {
                    workspace_id: ws,
                    path: "a.txt".into(),
                    op: "write_file".into(),
                    size_bytes: 1,
                    sha256: String::new(),
                    created: true,
                },
            ),
            in_tx(
                2,
                1,
                Event::WorkspaceDirtyChanged {
                    workspace_id: ws,
                    dirty: true,
                },
            ),
            in_tx(3, 1, snapshot(ws, "s5", Operation::Created, 1)),
            in_tx(
                4,
                2,
                snapshot(ws, "s6", Operation::Rewind { to: "s5".into() }, 0),
            ),
        ];
        // A fork at point 4 of its source: its own points are 5 and 6.
        let history = vec![
            recorded(
                0,
                Event::WorkspaceForked {
                    workspace_id: ws,
                    source_workspace_id: Uuid::from_u128(7),
                    snapshot: "s4".into(),
                    number: 4,
                },
            ),
            events[2].clone(),
            events[3].clone(),
        ];
        let points = Points::of(&history);
        assert_eq!(points.forked_from, Some((Uuid::from_u128(7), 4)));
        assert_eq!(
            (points.previous(5), points.previous(6), points.previous(4)),
            (Some(4), Some(5), None)
        );
        let cx = Context {
            kept: &HashMap::new(),
            points: &points,
            requesters: &HashMap::from([(Uuid::nil(), "ops".to_string())]),
        };
        let items = items(&events, &cx);
        let shown: Vec<(&str, Option<u64>)> = items
            .iter()
            .map(|i| (i.kind, i.point.as_ref().map(|p| p.number)))
            .collect();
        assert_eq!(
            shown,
            [("file", Some(5)), ("workspace", None), ("point", Some(6))]
        );
        assert_eq!(items[0].point.as_ref().unwrap().added, 1);
        assert_eq!(items[2].title, "rewound to point 5");
        assert_eq!(items[2].requested_by.as_deref(), Some("ops"));

        // Pruned: the number stays, the point is marked and skipped as a previous one.
        let mut pruned = history.clone();
        pruned.push(recorded(
            9,
            Event::WorkspaceHistoryPruned {
                workspace_id: ws,
                dropped: vec!["s5".into()],
            },
        ));
        let points = Points::of(&pruned);
        assert!(!points.is_live(5) && points.is_live(6));
        assert_eq!(points.previous(6), Some(4));
    }

    #[test]
    fn long_output_is_clipped_at_a_character_boundary() {
        let long = "é".repeat(SHOWN_OUTPUT_BYTES);
        let shown = clip(&long);
        assert!(shown.len() < long.len());
        assert!(shown.ends_with("more bytes (GET /v1/execs/{id} has them all)"));
        assert_eq!(clip("short"), "short");
    }
}
