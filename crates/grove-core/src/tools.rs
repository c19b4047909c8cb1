//! The agent tool surface as data: the operations a `tool` command carries (text
//! editor, files, search, git) and what each returns. No IO; `grove-tools` runs the file
//! and search operations, `GitPort` the git ones.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::history::{ChangedFile, Point, PointRef, MAX_CHECKPOINT_NAME, MAX_HISTORY_PAGE};
use crate::validate::{validate_ref, ValidationError};

/// Largest file content a `create` / `write_file` may carry through the queue.
pub const MAX_WRITE_BYTES: usize = 8 * 1024 * 1024;
/// Largest commit message.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// Most search hits a request may ask for.
pub const MAX_SEARCH_HITS: usize = 10_000;
/// Search hits when the request does not say.
pub const DEFAULT_SEARCH_HITS: usize = 200;
/// Most log entries a request may ask for.
pub const MAX_LOG_ENTRIES: usize = 1_000;

/// One tool operation on one workspace (job `tool`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolRequest {
    pub workspace_id: Uuid,
    #[serde(flatten)]
    pub op: ToolOp,
}

/// What to diff the working tree against.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "against", content = "ref", rename_all = "snake_case")]
pub enum DiffAgainst {
    /// The current commit (`git diff HEAD`, untracked files included).
    #[default]
    Head,
    /// The commit the workspace was created at.
    Base,
    /// A branch, tag or commit of the workspace's repository.
    Ref(String),
}

/// The operations. Paths are relative to the workspace root; every one is validated
/// against it (symlinks resolved) by the code that runs the operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ToolOp {
    /// A file with numbered lines (optionally lines `start..=end`, 1-based; `end` absent
    /// or -1: to the end), or a directory listing two levels deep without hidden entries.
    View {
        path: String,
        #[serde(default)]
        range: Option<(u64, i64)>,
    },
    /// Creates a file (and its parent directories); fails if it exists.
    Create {
        path: String,
        content: String,
    },
    /// Replaces the one occurrence of `old_str`; zero or several occurrences fail.
    StrReplace {
        path: String,
        old_str: String,
        new_str: String,
    },
    /// Inserts `text` after line `insert_line` (0: at the top).
    Insert {
        path: String,
        insert_line: u64,
        text: String,
    },
    ReadFile {
        path: String,
    },
    /// Writes a file whole, creating it and its parent directories if needed.
    WriteFile {
        path: String,
        content: String,
    },
    ListDir {
        #[serde(default)]
        path: Option<String>,
    },
    /// Searches the working tree (uncommitted edits included; `.git` and ignored files
    /// skipped) line by line.
    Search {
        pattern: String,
        /// `pattern` is a regular expression (else a literal string).
        #[serde(default)]
        regex: bool,
        #[serde(default = "yes")]
        case_sensitive: bool,
        /// gitignore-style globs a file must match (`*.rs`, `src/**`); `!` excludes.
        #[serde(default)]
        glob: Vec<String>,
        /// A file or directory to search under (default: the root).
        #[serde(default)]
        path: Option<String>,
        #[serde(default)]
        max_results: Option<usize>,
    },
    GitStatus,
    GitDiff {
        #[serde(default, flatten)]
        against: DiffAgainst,
        /// Limits the diff to these paths.
        #[serde(default)]
        paths: Vec<String>,
    },
    GitLog {
        #[serde(default)]
        max_count: Option<usize>,
    },
    /// Commits the given paths (all changes, untracked files included, when empty).
    GitCommit {
        message: String,
        #[serde(default)]
        paths: Vec<String>,
        #[serde(default)]
        author_name: Option<String>,
        #[serde(default)]
        author_email: Option<String>,
    },
    /// Pushes a branch (default: the current one) to `origin`, with the request's token.
    GitPush {
        #[serde(default)]
        branch: Option<String>,
        /// Overwrite the remote branch only if it is where we last saw it.
        #[serde(default)]
        force_with_lease: bool,
        /// The commit the remote branch must be at for a forced push (default: our
        /// remote-tracking ref; no tracking ref: the branch must not exist there).
        #[serde(default)]
        expect: Option<String>,
        #[serde(default)]
        set_upstream: bool,
    },
    /// The workspace's history: its points oldest first (`offset`, `limit` page it).
    History {
        #[serde(default)]
        offset: Option<u64>,
        #[serde(default)]
        limit: Option<usize>,
    },
    /// The diff from point `since` to point `until` (absent: the workspace as it is
    /// now). Points are numbers of the timeline or snapshot ids.
    HistoryDiff {
        since: String,
        #[serde(default)]
        until: Option<String>,
    },
    /// A file's content at a point.
    HistoryFile {
        point: String,
        path: String,
    },
    /// Records the workspace as it is now as a named point.
    Checkpoint {
        name: String,
    },
    /// Puts the workspace's files, HEAD and branch back to a point (the state it
    /// discards is kept as a point of its own).
    Rewind {
        point: String,
    },
    /// Rewinds to the point before the latest one.
    Undo,
    /// A new workspace at a point: `scope` is its conversation id (edit) or task id
    /// (task); the source is unchanged.
    Fork {
        point: String,
        scope: String,
    },
}

fn yes() -> bool {
    true
}

impl ToolOp {
    /// The tool's name (the `op` tag).
    pub fn name(&self) -> &'static str {
        match self {
            Self::View { .. } => "view",
            Self::Create { .. } => "create",
            Self::StrReplace { .. } => "str_replace",
            Self::Insert { .. } => "insert",
            Self::ReadFile { .. } => "read_file",
            Self::WriteFile { .. } => "write_file",
            Self::ListDir { .. } => "list_dir",
            Self::Search { .. } => "search",
            Self::GitStatus => "git_status",
            Self::GitDiff { .. } => "git_diff",
            Self::GitLog { .. } => "git_log",
            Self::GitCommit { .. } => "git_commit",
            Self::GitPush { .. } => "git_push",
            Self::History { .. } => "history",
            Self::HistoryDiff { .. } => "history_diff",
            Self::HistoryFile { .. } => "history_file",
            Self::Checkpoint { .. } => "checkpoint",
            Self::Rewind { .. } => "rewind",
            Self::Undo => "undo",
            Self::Fork { .. } => "fork",
        }
    }

    /// Whether the operation changes the workspace (files, index, refs) or the remote:
    /// refused on a read-only workspace, run under the exclusive command lock.
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Self::Create { .. }
                | Self::StrReplace { .. }
                | Self::Insert { .. }
                | Self::WriteFile { .. }
                | Self::GitCommit { .. }
                | Self::GitPush { .. }
                | Self::Checkpoint { .. }
                | Self::Rewind { .. }
                | Self::Undo
                | Self::Fork { .. }
        )
    }

    /// Whether the operation is one of the workspace history's (ADR 28).
    pub fn is_history(&self) -> bool {
        matches!(
            self,
            Self::History { .. }
                | Self::HistoryDiff { .. }
                | Self::HistoryFile { .. }
                | Self::Checkpoint { .. }
                | Self::Rewind { .. }
                | Self::Undo
                | Self::Fork { .. }
        )
    }

    /// Whether running it twice leaves the same result as running it once. An edit
    /// (`str_replace`, `insert`, `create`) or a commit or push is not: a job whose worker
    /// died after the effect ends as `worker_lost` instead of running again.
    pub fn is_idempotent(&self) -> bool {
        !self.is_write() || matches!(self, Self::WriteFile { .. })
    }

    /// Checks what can be checked without the workspace (sizes, refs, counts). Paths are
    /// checked against the workspace root by the code that runs the operation.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let req = |m: &str| Err(ValidationError::Request(m.to_string()));
        // No argument may carry a NUL: no path can hold one, and the ledger's JSON
        // cannot store one.
        if let Some(field) = self.strings().find(|(_, s)| s.contains('\0')) {
            return Err(ValidationError::Request(format!(
                "{} contains a NUL byte",
                field.0
            )));
        }
        match self {
            Self::Create { content, .. } | Self::WriteFile { content, .. }
                if content.len() > MAX_WRITE_BYTES =>
            {
                return req("content exceeds 8 MiB");
            }
            Self::StrReplace { old_str, .. } if old_str.is_empty() => {
                return req("old_str must not be empty");
            }
            Self::StrReplace {
                old_str, new_str, ..
            } if old_str.len() + new_str.len() > MAX_WRITE_BYTES => {
                return req("old_str and new_str exceed 8 MiB");
            }
            Self::Insert { text, .. } if text.len() > MAX_WRITE_BYTES => {
                return req("text exceeds 8 MiB");
            }
            Self::View {
                range: Some((start, end)),
                ..
            } => {
                if *start == 0 {
                    return req("view range starts at line 1");
                }
                if *end != -1 && (*end < 0 || (*end as u64) < *start) {
                    return req("view range end must be -1 or at least its start");
                }
            }
            Self::Search {
                pattern,
                max_results,
                glob,
                ..
            } => {
                if pattern.is_empty() {
                    return req("search pattern must not be empty");
                }
                if pattern.len() > 4096 || glob.iter().any(|g| g.len() > 1024) {
                    return req("search pattern or glob too long");
                }
                if max_results.is_some_and(|m| m == 0 || m > MAX_SEARCH_HITS) {
                    return req("max_results must be between 1 and 10000");
                }
            }
            Self::GitDiff {
                against: DiffAgainst::Ref(r),
                ..
            } => validate_ref(r)?,
            Self::GitLog { max_count }
                if max_count.is_some_and(|n| n == 0 || n > MAX_LOG_ENTRIES) =>
            {
                return req("max_count must be between 1 and 1000");
            }
            Self::GitCommit {
                message,
                author_name,
                author_email,
                ..
            } => {
                if message.trim().is_empty() {
                    return req("commit message must not be empty");
                }
                if message.len() > MAX_MESSAGE_BYTES {
                    return req("commit message exceeds 64 KiB");
                }
                if author_name.is_some() != author_email.is_some() {
                    return req("author_name and author_email go together");
                }
                for v in [author_name, author_email].into_iter().flatten() {
                    if v.is_empty()
                        || v.len() > 256
                        || v.chars().any(|c| c.is_control() || "<>".contains(c))
                    {
                        return req("author name and email must be 1-256 characters without control characters or < >");
                    }
                }
            }
            Self::GitPush { branch, expect, .. } => {
                if let Some(b) = branch {
                    validate_ref(b)?;
                    if b.starts_with("refs/") {
                        return req("push names a branch, not a full ref");
                    }
                }
                if let Some(e) = expect {
                    if !(4..=64).contains(&e.len()) || !e.chars().all(|c| c.is_ascii_hexdigit()) {
                        return req("expect must be a commit id (hex)");
                    }
                }
            }
            _ => self.validate_history()?,
        }
        Ok(())
    }

    fn validate_history(&self) -> Result<(), ValidationError> {
        let req = |m: String| Err(ValidationError::Request(m));
        let point = |p: &str| {
            PointRef::parse(p)
                .map(|_| ())
                .map_err(ValidationError::Request)
        };
        match self {
            Self::History { limit, .. }
                if limit.is_some_and(|l| l == 0 || l > MAX_HISTORY_PAGE) =>
            {
                req(format!("limit must be between 1 and {MAX_HISTORY_PAGE}"))
            }
            Self::HistoryDiff { since, until } => {
                point(since)?;
                until.as_deref().map_or(Ok(()), point)
            }
            Self::HistoryFile { point: p, .. } | Self::Rewind { point: p } => point(p),
            Self::Checkpoint { name }
                if name.trim().is_empty()
                    || name.len() > MAX_CHECKPOINT_NAME
                    || name.chars().any(char::is_control) =>
            {
                req(format!(
                    "a checkpoint name is 1-{MAX_CHECKPOINT_NAME} bytes without control characters"
                ))
            }
            Self::Fork { point: p, scope } => {
                point(p)?;
                crate::validate::validate_branch_scope_id("scope", scope)
            }
            _ => Ok(()),
        }
    }
}

impl ToolOp {
    /// Every string argument, with its name.
    fn strings(&self) -> impl Iterator<Item = (&'static str, &str)> {
        let mut out: Vec<(&'static str, &str)> = Vec::new();
        match self {
            Self::View { path, .. } | Self::ReadFile { path } => out.push(("path", path.as_str())),
            Self::Create { path, content } | Self::WriteFile { path, content } => {
                out.extend([("path", path.as_str()), ("content", content.as_str())])
            }
            Self::StrReplace {
                path,
                old_str,
                new_str,
            } => out.extend([
                ("path", path.as_str()),
                ("old_str", old_str.as_str()),
                ("new_str", new_str.as_str()),
            ]),
            Self::Insert { path, text, .. } => {
                out.extend([("path", path.as_str()), ("text", text.as_str())])
            }
            Self::ListDir { path } => out.extend(path.as_deref().map(|p| ("path", p))),
            Self::Search {
                pattern,
                glob,
                path,
                ..
            } => {
                out.push(("pattern", pattern));
                out.extend(glob.iter().map(|g| ("glob", g.as_str())));
                out.extend(path.as_deref().map(|p| ("path", p)));
            }
            Self::GitStatus | Self::GitLog { .. } => {}
            Self::GitDiff { against, paths } => {
                if let DiffAgainst::Ref(r) = against {
                    out.push(("ref", r));
                }
                out.extend(paths.iter().map(|p| ("paths", p.as_str())));
            }
            Self::GitCommit {
                message,
                paths,
                author_name,
                author_email,
            } => {
                out.push(("message", message));
                out.extend(paths.iter().map(|p| ("paths", p.as_str())));
                out.extend(author_name.as_deref().map(|p| ("author_name", p)));
                out.extend(author_email.as_deref().map(|p| ("author_email", p)));
            }
            Self::GitPush { branch, expect, .. } => {
                out.extend(branch.as_deref().map(|p| ("branch", p)));
                out.extend(expect.as_deref().map(|p| ("expect", p)));
            }
            Self::History { .. } | Self::Undo => {}
            Self::HistoryDiff { since, until } => {
                out.push(("since", since));
                out.extend(until.as_deref().map(|p| ("until", p)));
            }
            Self::HistoryFile { point, path } => {
                out.extend([("point", point.as_str()), ("path", path.as_str())])
            }
            Self::Checkpoint { name } => out.push(("name", name)),
            Self::Rewind { point } => out.push(("point", point)),
            Self::Fork { point, scope } => {
                out.extend([("point", point.as_str()), ("scope", scope.as_str())])
            }
        }
        out.into_iter()
    }
}

/// A tool as offered to an agent for one workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// The tool changes the workspace or its remote (absent from read-only workspaces).
    pub writes: bool,
    /// JSON Schema (draft 2020-12) of the tool's arguments, an object.
    pub input_schema: serde_json::Value,
    /// JSON Schema (draft 2020-12) of the tool's output (`tool_outputs`).
    pub output_schema: serde_json::Value,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// Relative to the workspace root, `/`-separated.
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    pub size: u64,
}

/// One search hit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchHit {
    pub path: String,
    /// 1-based.
    pub line: u64,
    /// The line without its terminator, cut to 1,000 characters.
    pub text: String,
}

/// A file written by a tool: what its event records (never the content).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WrittenFile {
    pub path: String,
    pub size_bytes: u64,
    /// SHA-256 of the file's new content, lowercase hex.
    pub sha256: String,
    /// The file did not exist before.
    pub created: bool,
}

/// One changed path in `git status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusEntry {
    pub path: String,
    /// Index against HEAD: `added`, `modified`, `deleted`, `renamed`, `typechange`, or null.
    pub staged: Option<String>,
    /// Working tree against the index: the same words, `untracked`, or null.
    pub unstaged: Option<String>,
}

/// `git status` of a workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitStatus {
    /// The checked-out branch, or null when HEAD is detached.
    pub branch: Option<String>,
    pub head: Option<String>,
    pub entries: Vec<StatusEntry>,
}

/// A unified diff.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitDiff {
    /// The commit diffed against.
    pub against: String,
    /// Changed paths.
    pub files: Vec<String>,
    pub patch: String,
    /// The patch was cut at the output cap.
    pub truncated: bool,
}

/// One commit of `git log`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub commit: String,
    pub author_name: String,
    pub author_email: String,
    /// Author time, seconds since the epoch.
    pub time: i64,
    pub summary: String,
}

/// A commit made by `git_commit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committed {
    pub commit: String,
    pub branch: Option<String>,
    /// Paths the commit changed relative to its parent.
    pub files: Vec<String>,
}

/// A push made by `git_push`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pushed {
    pub branch: String,
    pub commit: String,
    /// What the remote branch was before (null: it did not exist).
    pub previous: Option<String>,
    pub forced: bool,
}

/// What a tool operation returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "output", rename_all = "snake_case")]
pub enum ToolOutput {
    /// `view`: numbered lines or a listing, as text for the agent.
    Text {
        text: String,
    },
    /// `read_file`: the content (UTF-8, lossy) and its size in bytes.
    File {
        path: String,
        content: String,
        size_bytes: u64,
    },
    /// `list_dir`.
    Dir {
        entries: Vec<DirEntry>,
    },
    /// `create`, `str_replace`, `insert`, `write_file`.
    Written(WrittenFile),
    Search {
        hits: Vec<SearchHit>,
        /// More hits exist than `max_results`.
        truncated: bool,
    },
    Status(GitStatus),
    Diff(GitDiff),
    Log {
        entries: Vec<LogEntry>,
    },
    Committed(Committed),
    Pushed(Pushed),
    /// `history`: one page of points, and how many the timeline has.
    History {
        points: Vec<Point>,
        total: u64,
    },
    /// `history_diff`: `to_point` absent means the workspace as it was when asked.
    HistoryDiff {
        from_point: u64,
        to_point: Option<u64>,
        files: Vec<ChangedFile>,
        patch: String,
        truncated: bool,
    },
    /// `checkpoint`: the point it recorded.
    Point(Point),
    /// `rewind`, `undo`: the point rewound to, the new point the rewind recorded, and
    /// the point that keeps the discarded state (absent: nothing was discarded).
    Rewound {
        to: u64,
        point: Point,
        kept: Option<u64>,
        files_written: u32,
        files_removed: u32,
    },
    /// `fork`: the new workspace.
    Forked {
        workspace_id: Uuid,
        branch: Option<String>,
        local_path: String,
        point: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_request_round_trips_with_its_op_tag_flattened() {
        let req = ToolRequest {
            workspace_id: Uuid::nil(),
            op: ToolOp::GitDiff {
                against: DiffAgainst::Ref("main".into()),
                paths: vec![],
            },
        };
        let json = serde_json::to_value(&req).unwrap();
        assert_eq!(json["op"], "git_diff");
        assert_eq!(json["against"], "ref");
        assert_eq!(json["ref"], "main");
        assert_eq!(serde_json::from_value::<ToolRequest>(json).unwrap(), req);
        let search: ToolOp =
            serde_json::from_value(serde_json::json!({"op": "search", "pattern": "x"})).unwrap();
        assert!(matches!(
            search,
            ToolOp::Search {
                case_sensitive: true,
                regex: false,
                ..
            }
        ));
    }

    #[test]
    fn writes_are_classified_and_edits_are_not_idempotent() {
        let sr = ToolOp::StrReplace {
            path: "a".into(),
            old_str: "x".into(),
            new_str: "y".into(),
        };
        assert!(sr.is_write() && !sr.is_idempotent());
        let w = ToolOp::WriteFile {
            path: "a".into(),
            content: "x".into(),
        };
        assert!(w.is_write() && w.is_idempotent());
        assert!(!ToolOp::GitStatus.is_write() && ToolOp::GitStatus.is_idempotent());
    }

    #[test]
    fn bad_requests_are_refused_before_they_reach_a_workspace() {
        let bad = [
            ToolOp::StrReplace {
                path: "a".into(),
                old_str: "".into(),
                new_str: "y".into(),
            },
            ToolOp::View {
                path: "a".into(),
                range: Some((0, 3)),
            },
            ToolOp::View {
                path: "a".into(),
                range: Some((5, 3)),
            },
            ToolOp::GitDiff {
                against: DiffAgainst::Ref("a..b".into()),
                paths: vec![],
            },
            ToolOp::GitPush {
                branch: Some("-f".into()),
                force_with_lease: false,
                expect: None,
                set_upstream: false,
            },
            ToolOp::GitCommit {
                message: " ".into(),
                paths: vec![],
                author_name: None,
                author_email: None,
            },
        ];
        for op in bad {
            assert!(op.validate().is_err(), "{op:?} was accepted");
        }
        let nul = [
            ToolOp::ReadFile {
                path: "a\0b".into(),
            },
            ToolOp::WriteFile {
                path: "a".into(),
                content: "x\0".into(),
            },
            ToolOp::Search {
                pattern: "x".into(),
                regex: false,
                case_sensitive: true,
                glob: vec!["*\0".into()],
                path: None,
                max_results: None,
            },
        ];
        for op in nul {
            let e = op.validate().unwrap_err().to_string();
            assert!(e.contains("NUL"), "{op:?}: {e}");
        }
        assert!(ToolOp::View {
            path: "a".into(),
            range: Some((2, -1))
        }
        .validate()
        .is_ok());
    }
}
