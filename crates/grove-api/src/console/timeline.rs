//! A workspace's events told as a story: one item per command (argv, exit code,
//! duration, kept output), file write, commit, push, merge-back, eviction or restore.
//!
//! Items are plain data for the template, which escapes every string. Each item keeps
//! its event's stream version: the history work can hang a step's diff, rewind and fork
//! off it later.

use std::collections::HashMap;

use grove_core::events::{Event, RecordedEvent};
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

/// The story of `events` (oldest first), with the execs' ledger rows.
pub fn items(events: &[RecordedEvent], kept: &HashMap<Uuid, KeptExec>) -> Vec<Item> {
    let mut out: Vec<Item> = Vec::new();
    let mut exec_at: HashMap<Uuid, usize> = HashMap::new();
    for e in events {
        let base = Item {
            version: e.stream_version,
            at: e.recorded_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            ..Default::default()
        };
        match &e.event {
            Event::ExecStarted { exec_id, argv, .. } => {
                exec_at.insert(*exec_id, out.len());
                out.push(Item {
                    kind: "exec",
                    title: "command started".into(),
                    exec_id: Some(*exec_id),
                    argv: argv.clone(),
                    running: true,
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
        other => ("other", other.event_type().replace('_', " "), vec![]),
    };
    Item {
        kind,
        title,
        details,
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
        let items = items(&events, &kept);
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].argv, ["echo", "hi"]);
        assert_eq!(items[0].stdout.as_deref(), Some("hi\n"));
        assert_eq!(items[0].version, 2);
        assert!(!items[0].running);
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
