//! Merge-back as data: bringing a task workspace's commits into a writable (edit)
//! workspace of the same user, project and repository — the strategies, the diff a
//! caller reads first, the report of a merge-back, and the rules both ends must meet.
//!
//! The checks here are pure (rows in, refusal out); the git work is
//! [`crate::ports::GitPort::merge_back`] and [`crate::ports::GitPort::merge_back_diff`].

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::{CommandError, ErrorKind};
use crate::model::{WorkspaceMode, WorkspaceRow};
use crate::validate::ValidationError;

/// Most commits a diff lists (the rest is counted in `commits_total`).
pub const MAX_DIFF_COMMITS: usize = 1_000;
/// Most changed files a diff lists (the rest is counted in `files_total`).
pub const MAX_DIFF_FILES: usize = 5_000;
/// Most conflicting paths named in an error message (all of them are in `paths`).
pub const MAX_PATHS_IN_MESSAGE: usize = 20;

/// How the task's commits reach the target branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MergeStrategy {
    /// A merge of the task branch: a fast-forward when the target has not moved since
    /// the task branched off, else a merge commit with both heads as parents.
    Merge,
    /// Each task commit the target lacks, replayed in order as a new commit on the
    /// target (author and message kept, `(cherry picked from commit <id>)` appended).
    CherryPick,
}

impl MergeStrategy {
    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        match raw {
            "merge" => Ok(Self::Merge),
            "cherry-pick" | "cherry_pick" => Ok(Self::CherryPick),
            other => Err(ValidationError::Request(format!(
                "unknown merge-back strategy {:?}: expected merge or cherry-pick",
                other.chars().take(40).collect::<String>()
            ))),
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Merge => "merge",
            Self::CherryPick => "cherry_pick",
        }
    }
}

/// A commit of the task branch that the target branch lacks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BranchCommit {
    pub id: String,
    /// The first line of its message.
    pub summary: String,
    pub author_name: String,
    pub author_email: String,
    /// Author time, seconds since the epoch.
    pub time: i64,
}

/// A file the task changed since it branched off the target (merge base to task head).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangedFile {
    pub path: String,
    /// `added`, `deleted`, `modified`, `renamed`, `copied` or `typechange`.
    pub status: String,
    /// The path before a rename or copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_path: Option<String>,
    pub insertions: u64,
    pub deletions: u64,
    pub binary: bool,
}

/// What a merge-back would bring: the task's commits the target lacks and the files the
/// task changed since the merge base (the three-dot diff `target...task`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeBackDiff {
    pub edit_workspace_id: Uuid,
    pub task_workspace_id: Uuid,
    /// The target's branch and its head.
    pub edit_branch: String,
    pub edit_head: String,
    pub task_branch: String,
    pub task_head: String,
    /// The best common ancestor (null when the histories are unrelated).
    pub merge_base: Option<String>,
    /// Oldest first, at most [`MAX_DIFF_COMMITS`].
    pub commits: Vec<BranchCommit>,
    pub commits_total: usize,
    /// Sorted by path, at most [`MAX_DIFF_FILES`].
    pub files: Vec<ChangedFile>,
    pub files_total: usize,
    pub insertions: u64,
    pub deletions: u64,
    /// The target's head is an ancestor of the task's: a merge is a fast-forward.
    pub fast_forward: bool,
    /// The task has nothing the target lacks.
    pub up_to_date: bool,
    /// The task workspace has uncommitted changes; only commits are merged back.
    pub task_dirty: bool,
}

/// What a merge-back did to the target branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeBackReport {
    pub edit_workspace_id: Uuid,
    pub task_workspace_id: Uuid,
    pub strategy: MergeStrategy,
    pub edit_branch: String,
    /// The target's head before and after (equal when up to date).
    pub previous_head: String,
    pub new_head: String,
    /// The task commits brought in, oldest first.
    pub commits: Vec<BranchCommit>,
    /// Commits made on the target: the merge commit, or one per cherry-picked commit
    /// (empty for a fast-forward or when up to date).
    pub created: Vec<String>,
    /// Cherry-picked task commits whose change the target already had (no commit made).
    pub skipped: Vec<String>,
    pub fast_forward: bool,
    pub up_to_date: bool,
    /// Paths that differ between the previous and the new head.
    pub files: Vec<String>,
}

/// Why a merge-back did not happen, as the git adapter reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MergeBackError {
    /// The task's change conflicts with the target's (content conflicts, or an
    /// untracked file of the target that the change would overwrite). Nothing was
    /// written. Handling: 409 / exit 4 with `paths`; resolve in the task, try again.
    #[error("{}", conflict_message(.paths, .commit.as_deref()))]
    Conflict {
        paths: Vec<String>,
        /// For a cherry-pick: the task commit that did not apply.
        commit: Option<String>,
    },
    /// The target has uncommitted changes to tracked files. Handling: 422; commit or
    /// discard them first.
    #[error("the target workspace has uncommitted changes ({}); commit or discard them before merging back", list_paths(.0))]
    Dirty(Vec<String>),
    /// The request does not fit the repositories (a branch missing, HEAD not on the
    /// workspace's branch, a merge commit to cherry-pick). Handling: 422.
    #[error("{0}")]
    Refused(String),
    /// Any other git failure.
    #[error(transparent)]
    Git(#[from] crate::error::GitError),
}

fn list_paths(paths: &[String]) -> String {
    let mut shown: Vec<String> = paths
        .iter()
        .take(MAX_PATHS_IN_MESSAGE)
        .map(|p| format!("{p:?}"))
        .collect();
    if paths.len() > MAX_PATHS_IN_MESSAGE {
        shown.push(format!("and {} more", paths.len() - MAX_PATHS_IN_MESSAGE));
    }
    shown.join(", ")
}

fn conflict_message(paths: &[String], commit: Option<&str>) -> String {
    let what = match commit {
        Some(c) => format!("cherry-picking task commit {c} conflicts"),
        None => "merging the task branch conflicts".to_string(),
    };
    format!(
        "merge-back conflict: {what} on {} path{}: {}; the target workspace was left unchanged",
        paths.len(),
        if paths.len() == 1 { "" } else { "s" },
        list_paths(paths)
    )
}

impl From<MergeBackError> for CommandError {
    fn from(e: MergeBackError) -> Self {
        match e {
            MergeBackError::Conflict { ref paths, .. } => {
                let paths = paths.clone();
                CommandError::new(ErrorKind::Conflict, e.to_string()).with_paths(paths)
            }
            MergeBackError::Dirty(ref paths) => {
                let paths = paths.clone();
                CommandError::new(ErrorKind::Rejected, e.to_string()).with_paths(paths)
            }
            MergeBackError::Refused(m) => CommandError::new(ErrorKind::Rejected, m),
            MergeBackError::Git(g) => g.into(),
        }
    }
}

/// Checks that `task` may be merged back into `edit`: two different live workspaces
/// of one user, one project and one repository (the same repo cache, hence the same
/// node), the source a task workspace, the target writable.
pub fn check_pair(edit: &WorkspaceRow, task: &WorkspaceRow) -> Result<(), CommandError> {
    let refuse = |m: String| Err(CommandError::new(ErrorKind::Rejected, m));
    if edit.id == task.id {
        return Err(CommandError::new(
            ErrorKind::InvalidInput,
            "a workspace cannot be merged back into itself",
        ));
    }
    if edit.user_id != task.user_id {
        return refuse(format!(
            "workspaces {} and {} belong to different users",
            task.id, edit.id
        ));
    }
    if task.mode != WorkspaceMode::Task {
        return refuse(format!(
            "workspace {} is a {} workspace; only a task workspace is merged back",
            task.id,
            task.mode.as_str()
        ));
    }
    if !edit.capabilities.writable {
        return refuse(format!(
            "workspace {} is read-only ({} mode): it cannot be the target of a merge-back",
            edit.id,
            edit.mode.as_str()
        ));
    }
    if edit.project_id != task.project_id {
        return refuse(format!(
            "workspaces {} and {} belong to different projects",
            task.id, edit.id
        ));
    }
    if edit.repo_cache_id != task.repo_cache_id || edit.node != task.node {
        return refuse(format!(
            "workspaces {} and {} are checkouts of different repositories",
            task.id, edit.id
        ));
    }
    if edit.branch_name.is_none() || task.branch_name.is_none() {
        return refuse("both workspaces must be on a branch".to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Capabilities;
    use chrono::Utc;

    fn row(mode: WorkspaceMode, user: &str) -> WorkspaceRow {
        let now = Utc::now();
        WorkspaceRow {
            id: Uuid::new_v4(),
            repo_cache_id: Uuid::nil(),
            node: "local".into(),
            project_id: "p".into(),
            user_id: user.into(),
            mode,
            conversation_id: None,
            task_id: None,
            base_ref: "main".into(),
            base_commit: "0".repeat(40),
            branch_name: crate::model::branch_for(mode, "s"),
            local_path: "/x".into(),
            state: crate::state::WorkspaceState::Ready,
            dirty: false,
            pinned_until: None,
            last_used_at: now,
            size_bytes: 0,
            capabilities: Capabilities::from_mode(mode),
            created_at: now,
            updated_at: now,
            size_measured_at: None,
            evicted_at: None,
            saved: None,
            history_ignored: false,
        }
    }

    #[test]
    fn a_task_of_the_same_user_project_and_repository_may_be_merged_into_an_edit() {
        let edit = row(WorkspaceMode::Edit, "u");
        let task = row(WorkspaceMode::Task, "u");
        assert!(check_pair(&edit, &task).is_ok());
    }

    #[test]
    fn an_analysis_target_another_user_another_repository_or_a_non_task_source_is_refused() {
        let task = row(WorkspaceMode::Task, "u");
        let analysis = row(WorkspaceMode::Analysis, "u");
        let e = check_pair(&analysis, &task).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Rejected);
        assert!(e.message.contains("read-only"), "{}", e.message);

        let other_user = row(WorkspaceMode::Edit, "v");
        assert!(check_pair(&other_user, &task)
            .unwrap_err()
            .message
            .contains("different users"));

        let mut other_repo = row(WorkspaceMode::Edit, "u");
        other_repo.repo_cache_id = Uuid::new_v4();
        assert!(check_pair(&other_repo, &task)
            .unwrap_err()
            .message
            .contains("different repositories"));

        let edit = row(WorkspaceMode::Edit, "u");
        let source_edit = row(WorkspaceMode::Edit, "u");
        assert!(check_pair(&edit, &source_edit)
            .unwrap_err()
            .message
            .contains("only a task workspace"));
        assert_eq!(
            check_pair(&edit, &edit).unwrap_err().kind,
            ErrorKind::InvalidInput
        );
    }

    #[test]
    fn a_conflict_becomes_a_409_kind_carrying_every_path() {
        let paths: Vec<String> = (0..25).map(|i| format!("f{i}.txt")).collect();
        let e: CommandError = MergeBackError::Conflict {
            paths: paths.clone(),
            commit: None,
        }
        .into();
        assert_eq!(e.kind, ErrorKind::Conflict);
        assert_eq!(e.paths, paths);
        assert!(e.message.contains("25 paths"), "{}", e.message);
        assert!(e.message.contains("and 5 more"), "{}", e.message);
        assert_eq!(e.message.lines().count(), 1);
    }

    #[test]
    fn given_an_edit_workspace_when_merged_back_then_it_is_used_and_a_conflict_changes_nothing() {
        use crate::events::Event;
        use crate::projection::{Projections, Reads};
        let edit = row(WorkspaceMode::Edit, "u");
        let id = edit.id;
        let mut p = Projections::default();
        p.workspaces.insert(id, edit.clone());
        let at = edit.created_at + chrono::Duration::seconds(5);
        let conflicted = Event::WorkspaceMergeBackConflicted {
            workspace_id: id,
            task_workspace_id: Uuid::nil(),
            strategy: MergeStrategy::Merge,
            paths: vec!["a.txt".into()],
            commit: None,
        };
        p.apply(&conflicted, at);
        assert_eq!(p.workspaces[&id], edit);
        assert!(p.take_touched().workspaces.is_empty());
        let merged = Event::WorkspaceMergedBack {
            workspace_id: id,
            task_workspace_id: Uuid::nil(),
            strategy: MergeStrategy::CherryPick,
            branch: "agent/edits-s".into(),
            previous_head: "a".repeat(40),
            new_head: "b".repeat(40),
            commits: vec!["c".repeat(40)],
            created: vec!["b".repeat(40)],
            fast_forward: false,
        };
        p.apply(&merged, at);
        assert_eq!(p.workspaces[&id].last_used_at, at);
        assert_eq!(p.workspaces[&id].updated_at, at);
        assert_eq!(p.workspaces[&id].dirty, edit.dirty);
        assert_eq!(
            Reads::of(std::slice::from_ref(&merged)).workspaces,
            vec![id]
        );
        let (ty, payload) = merged.to_stored();
        assert_eq!(ty, "workspace.merged_back");
        assert_eq!(payload["strategy"], "cherry_pick");
        assert_eq!(Event::from_stored(ty, payload).unwrap(), merged);
        assert_eq!(conflicted.event_type(), "workspace.merge_back_conflicted");
        assert_eq!(conflicted.stream_id(), format!("workspace:{id}"));
    }

    #[test]
    fn strategies_parse_from_their_cli_and_json_spellings() {
        assert_eq!(
            MergeStrategy::parse("cherry-pick").unwrap(),
            MergeStrategy::CherryPick
        );
        assert_eq!(MergeStrategy::parse("merge").unwrap(), MergeStrategy::Merge);
        assert!(MergeStrategy::parse("rebase").is_err());
        assert_eq!(
            serde_json::to_value(MergeStrategy::CherryPick).unwrap(),
            "cherry_pick"
        );
    }
}
