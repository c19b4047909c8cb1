//! The tools offered for a workspace: every tool on a writable workspace, the read
//! tools only on a read-only (analysis) one.

use grove_core::model::Capabilities;
use grove_core::tools::ToolSpec;

/// `(name, writes, description)` of every tool, in the order offered.
const TOOLS: &[(&str, bool, &str)] = &[
    ("view", false, "Show a file with numbered lines (optionally a 1-based line range), or list a directory two levels deep."),
    ("create", true, "Create a new file with the given content; fails if it exists."),
    ("str_replace", true, "Replace the single occurrence of old_str in a file with new_str; fails when old_str occurs zero or several times."),
    ("insert", true, "Insert text after line N of a file (0 inserts at the top)."),
    ("read_file", false, "Read a file whole."),
    ("write_file", true, "Write a file whole, creating it and its parent directories if needed."),
    ("list_dir", false, "List one directory level."),
    ("search", false, "Search the working tree line by line (regex or literal, glob filter, case sensitivity, hit limit)."),
    ("git_status", false, "Show the branch, HEAD and changed paths."),
    ("git_diff", false, "Diff the working tree against HEAD, the base commit, or a ref."),
    ("git_log", false, "Show the last N commits."),
    ("git_commit", true, "Commit the given paths, or every change."),
    ("git_push", true, "Push a branch to origin (force-with-lease, set-upstream)."),
];

/// The tools a workspace with `caps` offers: write tools only when it is writable.
pub fn tools_for(caps: &Capabilities) -> Vec<ToolSpec> {
    TOOLS
        .iter()
        .filter(|(_, writes, _)| caps.writable || !writes)
        .map(|(name, writes, description)| ToolSpec {
            name: (*name).to_string(),
            description: (*description).to_string(),
            writes: *writes,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use grove_core::model::WorkspaceMode;
    use grove_core::tools::ToolOp;

    #[test]
    fn a_read_only_workspace_is_offered_no_write_tool() {
        let ro = tools_for(&Capabilities::from_mode(WorkspaceMode::Analysis));
        assert!(ro.iter().all(|t| !t.writes));
        assert!(ro.iter().any(|t| t.name == "view"));
        assert!(!ro
            .iter()
            .any(|t| t.name == "str_replace" || t.name == "git_push"));
        let rw = tools_for(&Capabilities::from_mode(WorkspaceMode::Edit));
        assert_eq!(rw.len(), TOOLS.len());
    }

    #[test]
    fn the_catalog_agrees_with_the_operations_on_which_tools_write() {
        let ops = [
            ToolOp::Create {
                path: "a".into(),
                content: String::new(),
            },
            ToolOp::GitStatus,
            ToolOp::GitPush {
                branch: None,
                force_with_lease: false,
                expect: None,
                set_upstream: false,
            },
            ToolOp::ListDir { path: None },
        ];
        for op in ops {
            let spec = TOOLS.iter().find(|t| t.0 == op.name()).expect("listed");
            assert_eq!(spec.1, op.is_write(), "{}", op.name());
        }
    }
}
