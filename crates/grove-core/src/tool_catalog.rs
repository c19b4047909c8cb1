//! The tool catalogue: every tool an agent may be offered for a workspace, with a JSON
//! Schema of its arguments, and the one conversion from a tool name plus a JSON object
//! of arguments to a [`ToolOp`]. The CLI, the HTTP API and the MCP server all use it, so
//! a tool means the same thing whichever way it is called.
//!
//! A read-only (analysis) workspace is offered the read tools only; a workspace placed
//! inside a remote provider only the tools that run there (ADR 15).

use serde_json::{json, Map, Value};

use crate::model::Capabilities;
use crate::placement::Placement;
use crate::tools::{ToolOp, ToolSpec};

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
    ("history", false, "List the workspace's history: one point per change (command, edit, commit, checkpoint, rewind) with its files added, modified and deleted; paged."),
    ("history_diff", false, "Diff two points of the history (numbers or snapshot ids), or a point and the workspace now: a unified diff and the changed files."),
    ("history_file", false, "Read a file as it was at a point of the history."),
    ("checkpoint", true, "Record the workspace as it is now as a named point to come back to."),
    ("rewind", true, "Put the workspace's files, HEAD and branch back to a point; the state it discards is kept as a point."),
    ("undo", true, "Undo the latest change: rewind to the point before it."),
    ("fork", true, "Start a new workspace (a new conversation or task id) from a point; this workspace is unchanged."),
];

/// The tools that work on a workspace placed inside a remote provider (ADR 15): they
/// run in the provider's sandbox through its exec. The others are refused there.
const REMOTE_TOOLS: &[&str] = &[
    "view",
    "create",
    "str_replace",
    "insert",
    "read_file",
    "write_file",
    "list_dir",
    "search",
];

/// Whether tool `name` works on a workspace placed inside a remote provider.
pub fn works_remotely(name: &str) -> bool {
    REMOTE_TOOLS.contains(&name)
}

/// Why a tool call could not be turned into an operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgsError {
    /// No tool has this name. Handling: 404 over HTTP, an unknown-tool error over MCP.
    #[error("unknown tool {0:?}")]
    UnknownTool(String),
    /// The arguments do not fit the tool's schema (a missing or unknown field, a wrong
    /// type). Handling: 422 over HTTP, a tool error over MCP.
    #[error("invalid arguments for {tool}: {message}")]
    Shape { tool: String, message: String },
}

/// Whether `name` is a tool of the catalogue.
pub fn is_tool(name: &str) -> bool {
    TOOLS.iter().any(|t| t.0 == name)
}

/// Every tool of the catalogue, write tools included.
pub fn all_tools() -> Vec<ToolSpec> {
    TOOLS.iter().map(spec).collect()
}

/// The tools a workspace with `caps` on `node` offers: write tools only when it is
/// writable, and on a workspace placed inside a remote provider (its `node` is the
/// provider's name) only those that work there ([`works_remotely`]).
pub fn tools_for(caps: &Capabilities, node: &str) -> Vec<ToolSpec> {
    let remote = Placement::of_node(node).is_remote();
    TOOLS
        .iter()
        .filter(|(_, writes, _)| caps.writable || !writes)
        .filter(|(name, _, _)| !remote || works_remotely(name))
        .map(spec)
        .collect()
}

fn spec(t: &(&str, bool, &str)) -> ToolSpec {
    let (name, writes, description) = *t;
    ToolSpec {
        name: name.to_string(),
        description: description.to_string(),
        writes,
        input_schema: input_schema(name),
        output_schema: crate::tool_outputs::output_schema(name)
            .expect("every tool of the catalogue has an output schema"),
    }
}

fn string(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

fn path_arg() -> Value {
    string("Relative to the workspace root (no `..`, not absolute); symlinks must stay inside.")
}

fn point_arg() -> Value {
    string("A point of the history: its number (0 is the creation) or its snapshot id.")
}

fn object(properties: Value, required: &[&str]) -> Value {
    let mut schema = json!({"type": "object", "additionalProperties": false});
    if properties.as_object().is_some_and(|p| !p.is_empty()) {
        schema["properties"] = properties;
    }
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    schema
}

/// The JSON Schema (draft 2020-12) of a tool's arguments; `{}`-accepting for a tool
/// without arguments. Panics on a name outside the catalogue (a programming error).
pub fn input_schema(name: &str) -> Value {
    match name {
        "view" => object(
            json!({
                "path": path_arg(),
                "range": {
                    "description": "[start, end]: 1-based lines (start >= 1), end -1 for the end of the file; null or absent: the whole file.",
                    "type": ["array", "null"],
                    "items": {"type": "integer", "minimum": -1},
                    "minItems": 2,
                    "maxItems": 2
                }
            }),
            &["path"],
        ),
        "create" | "write_file" => object(
            json!({"path": path_arg(), "content": string("The whole file (UTF-8, at most 8 MiB).")}),
            &["path", "content"],
        ),
        "str_replace" => object(
            json!({
                "path": path_arg(),
                "old_str": string("Text that occurs exactly once in the file."),
                "new_str": string("Its replacement.")
            }),
            &["path", "old_str", "new_str"],
        ),
        "insert" => object(
            json!({
                "path": path_arg(),
                "insert_line": {"type": "integer", "minimum": 0, "description": "Insert after this line; 0 inserts at the top."},
                "text": string("The text to insert.")
            }),
            &["path", "insert_line", "text"],
        ),
        "read_file" => object(json!({"path": path_arg()}), &["path"]),
        "list_dir" => object(
            json!({"path": {"type": ["string", "null"], "description": "A directory (default: the root)."}}),
            &[],
        ),
        "search" => object(
            json!({
                "pattern": string("What to find: a literal string, or a regular expression with regex=true."),
                "regex": {"type": "boolean", "default": false},
                "case_sensitive": {"type": "boolean", "default": true},
                "glob": {"type": "array", "items": {"type": "string"}, "description": "gitignore-style globs a file must match; `!` excludes."},
                "path": {"type": ["string", "null"], "description": "A file or directory to search under (default: the root)."},
                "max_results": {"type": ["integer", "null"], "minimum": 1, "maximum": crate::tools::MAX_SEARCH_HITS}
            }),
            &["pattern"],
        ),
        "git_status" => object(json!({}), &[]),
        "git_diff" => object(
            json!({
                "against": {"type": "string", "enum": ["head", "base", "ref"], "default": "head", "description": "HEAD, the commit the workspace was created at, or `ref`."},
                "ref": {"type": ["string", "null"], "description": "With against=ref: a branch, tag or commit id."},
                "paths": {"type": "array", "items": {"type": "string"}}
            }),
            &[],
        ),
        "git_log" => object(
            json!({"max_count": {"type": ["integer", "null"], "minimum": 1, "maximum": crate::tools::MAX_LOG_ENTRIES}}),
            &[],
        ),
        "git_commit" => object(
            json!({
                "message": string("The commit message."),
                "paths": {"type": "array", "items": {"type": "string"}, "description": "Paths to commit (default: every change, untracked files included)."},
                "author_name": {"type": ["string", "null"]},
                "author_email": {"type": ["string", "null"]}
            }),
            &["message"],
        ),
        "git_push" => object(
            json!({
                "branch": {"type": ["string", "null"], "description": "Default: the current branch."},
                "force_with_lease": {"type": "boolean", "default": false},
                "expect": {"type": ["string", "null"], "description": "With force_with_lease: the commit the remote branch must be at."},
                "set_upstream": {"type": "boolean", "default": false}
            }),
            &[],
        ),
        "history" => object(
            json!({
                "offset": {"type": ["integer", "null"], "minimum": 0, "description": "Points to skip (default 0)."},
                "limit": {"type": ["integer", "null"], "minimum": 1, "maximum": crate::history::MAX_HISTORY_PAGE, "description": "Points to return (default 50)."}
            }),
            &[],
        ),
        "history_diff" => object(
            json!({"since": point_arg(), "until": {"type": ["string", "null"], "description": "A point number or snapshot id; absent: the workspace now."}}),
            &["since"],
        ),
        "history_file" => object(
            json!({"point": point_arg(), "path": path_arg()}),
            &["point", "path"],
        ),
        "checkpoint" => object(
            json!({"name": string("The point's name (1-200 bytes).")}),
            &["name"],
        ),
        "rewind" => object(json!({"point": point_arg()}), &["point"]),
        "undo" => object(json!({}), &[]),
        "fork" => object(
            json!({"point": point_arg(), "scope": string("The new workspace's conversation id (edit) or task id (task).")}),
            &["point", "scope"],
        ),
        other => panic!("no tool {other:?} in the catalogue"),
    }
}

/// The operation of a call to tool `name` with `args` (a JSON object; `op` is not an
/// argument). Checks the shape only; [`ToolOp::validate`] checks the values.
pub fn op_from_args(name: &str, args: Map<String, Value>) -> Result<ToolOp, ArgsError> {
    if !is_tool(name) {
        return Err(ArgsError::UnknownTool(
            name.chars().take(64).collect::<String>(),
        ));
    }
    let shape = |message: String| ArgsError::Shape {
        tool: name.to_string(),
        message,
    };
    let schema = input_schema(name);
    let none = Map::new();
    let known = schema["properties"].as_object().unwrap_or(&none);
    if let Some(unknown) = args.keys().find(|k| !known.contains_key(k.as_str())) {
        let mut expected: Vec<&str> = known.keys().map(String::as_str).collect();
        expected.sort_unstable();
        return Err(shape(format!(
            "unknown argument {:?} (expected {})",
            unknown.chars().take(64).collect::<String>(),
            if expected.is_empty() {
                "none".to_string()
            } else {
                expected.join(", ")
            }
        )));
    }
    let mut object = args;
    // serde cannot default a flattened enum: `against` absent means `head`, as the
    // schema says.
    if name == "git_diff" && !object.contains_key("against") {
        object.insert("against".into(), Value::String("head".into()));
    }
    object.insert("op".into(), Value::String(name.to_string()));
    serde_json::from_value::<ToolOp>(Value::Object(object))
        .map_err(|e| shape(e.to_string().lines().next().unwrap_or("").to_string()))
}

/// The call (tool name and JSON arguments) of an operation: the inverse of
/// [`op_from_args`], for a client that holds an operation and speaks to the HTTP route.
pub fn call_of(op: &ToolOp) -> (String, Map<String, Value>) {
    let Ok(Value::Object(mut args)) = serde_json::to_value(op) else {
        unreachable!("a ToolOp serializes to an object")
    };
    let name = match args.remove("op") {
        Some(Value::String(name)) => name,
        _ => unreachable!("a ToolOp is tagged by `op`"),
    };
    (name, args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::WorkspaceMode;

    #[test]
    fn a_read_only_workspace_is_offered_no_write_tool() {
        let ro = tools_for(&Capabilities::from_mode(WorkspaceMode::Analysis), "n1");
        assert!(ro.iter().all(|t| !t.writes));
        assert!(ro.iter().any(|t| t.name == "view"));
        assert!(!ro
            .iter()
            .any(|t| t.name == "str_replace" || t.name == "git_push"));
        let rw = tools_for(&Capabilities::from_mode(WorkspaceMode::Edit), "n1");
        assert_eq!(rw.len(), TOOLS.len());
    }

    #[test]
    fn a_workspace_in_a_remote_provider_is_offered_only_what_runs_there() {
        let caps = Capabilities::from_mode(WorkspaceMode::Edit);
        for provider in crate::placement::RuntimeKind::ALL
            .iter()
            .filter(|k| k.is_remote())
            .map(|k| k.as_str())
        {
            let names: Vec<String> = tools_for(&caps, provider)
                .into_iter()
                .map(|t| t.name)
                .collect();
            assert_eq!(names, REMOTE_TOOLS, "{provider}");
        }
        let ro = tools_for(&Capabilities::from_mode(WorkspaceMode::Analysis), "e2b");
        let names: Vec<&str> = ro.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["view", "read_file", "list_dir", "search"]);
    }

    /// One call per tool, with every argument its schema names.
    fn full_calls() -> Vec<(&'static str, Value)> {
        vec![
            ("view", json!({"path": "a", "range": [1, -1]})),
            ("create", json!({"path": "a", "content": "x"})),
            (
                "str_replace",
                json!({"path": "a", "old_str": "x", "new_str": "y"}),
            ),
            (
                "insert",
                json!({"path": "a", "insert_line": 0, "text": "x"}),
            ),
            ("read_file", json!({"path": "a"})),
            ("write_file", json!({"path": "a", "content": "x"})),
            ("list_dir", json!({"path": "src"})),
            (
                "search",
                json!({"pattern": "x", "regex": true, "case_sensitive": false, "glob": ["*.rs"], "path": "src", "max_results": 3}),
            ),
            ("git_status", json!({})),
            (
                "git_diff",
                json!({"against": "ref", "ref": "main", "paths": ["a"]}),
            ),
            ("git_log", json!({"max_count": 5})),
            (
                "git_commit",
                json!({"message": "m", "paths": ["a"], "author_name": "A", "author_email": "a@x"}),
            ),
            (
                "git_push",
                json!({"branch": "b", "force_with_lease": true, "expect": "abcd", "set_upstream": true}),
            ),
            ("history", json!({"offset": 2, "limit": 10})),
            ("history_diff", json!({"since": "1", "until": "2"})),
            ("history_file", json!({"point": "3", "path": "a"})),
            ("checkpoint", json!({"name": "before refactor"})),
            ("rewind", json!({"point": "4"})),
            ("undo", json!({})),
            ("fork", json!({"point": "4", "scope": "c2"})),
        ]
    }

    #[test]
    fn every_schema_property_is_an_argument_the_operation_reads() {
        let calls = full_calls();
        assert_eq!(calls.len(), TOOLS.len());
        for (name, args) in calls {
            let args = args.as_object().unwrap().clone();
            let schema = input_schema(name);
            let none = Map::new();
            let props = schema["properties"].as_object().unwrap_or(&none);
            assert_eq!(
                props.len(),
                args.len(),
                "{name}: the sample names every property"
            );
            let op = op_from_args(name, args.clone()).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(op.name(), name);
            // Serializing the operation gives back every argument that was set.
            let back = serde_json::to_value(&op).unwrap();
            for (k, v) in &args {
                assert_eq!(&back[k], v, "{name}.{k}");
            }
            // Without a required argument the call fails on its shape.
            for req in schema["required"].as_array().into_iter().flatten() {
                let mut missing = args.clone();
                missing.remove(req.as_str().unwrap());
                assert!(
                    matches!(op_from_args(name, missing), Err(ArgsError::Shape { .. })),
                    "{name} without {req}"
                );
            }
        }
    }

    #[test]
    fn the_catalog_agrees_with_the_operations_on_which_tools_write() {
        for (name, args) in full_calls() {
            let op = op_from_args(name, args.as_object().unwrap().clone()).unwrap();
            let spec = TOOLS.iter().find(|t| t.0 == name).expect("listed");
            assert_eq!(spec.1, op.is_write(), "{name}");
        }
    }

    #[test]
    fn unknown_tools_unknown_arguments_and_wrong_types_are_told_apart() {
        assert_eq!(
            op_from_args("rm_rf", Map::new()),
            Err(ArgsError::UnknownTool("rm_rf".into()))
        );
        let args = |v: Value| v.as_object().unwrap().clone();
        let e = op_from_args("read_file", args(json!({"path": "a", "op": "write_file"})));
        assert!(
            matches!(e, Err(ArgsError::Shape { ref message, .. }) if message.contains("\"op\""))
        );
        let e = op_from_args(
            "insert",
            args(json!({"path": "a", "insert_line": "two", "text": "x"})),
        );
        assert!(matches!(e, Err(ArgsError::Shape { .. })), "{e:?}");
        assert_eq!(
            op_from_args("git_status", Map::new()).unwrap(),
            ToolOp::GitStatus
        );
        assert_eq!(
            op_from_args("git_diff", args(json!({"paths": ["a"]}))).unwrap(),
            ToolOp::GitDiff {
                against: crate::tools::DiffAgainst::Head,
                paths: vec!["a".into()]
            }
        );
    }

    #[test]
    fn every_operation_round_trips_through_its_call() {
        use crate::tools::DiffAgainst;
        let ops = [
            ToolOp::View {
                path: "a".into(),
                range: Some((2, -1)),
            },
            ToolOp::View {
                path: "a".into(),
                range: None,
            },
            ToolOp::Create {
                path: "n".into(),
                content: "x".into(),
            },
            ToolOp::StrReplace {
                path: "a".into(),
                old_str: "o".into(),
                new_str: "n".into(),
            },
            ToolOp::Insert {
                path: "a".into(),
                insert_line: 3,
                text: "t".into(),
            },
            ToolOp::ReadFile { path: "a".into() },
            ToolOp::WriteFile {
                path: "a".into(),
                content: "c".into(),
            },
            ToolOp::ListDir { path: None },
            ToolOp::Search {
                pattern: "p".into(),
                regex: true,
                case_sensitive: false,
                glob: vec!["*.rs".into()],
                path: Some("src".into()),
                max_results: Some(5),
            },
            ToolOp::GitStatus,
            ToolOp::GitDiff {
                against: DiffAgainst::Head,
                paths: vec![],
            },
            ToolOp::GitDiff {
                against: DiffAgainst::Base,
                paths: vec!["a".into()],
            },
            ToolOp::GitDiff {
                against: DiffAgainst::Ref("v1".into()),
                paths: vec![],
            },
            ToolOp::GitLog { max_count: Some(3) },
            ToolOp::GitCommit {
                message: "m".into(),
                paths: vec![],
                author_name: Some("n".into()),
                author_email: None,
            },
            ToolOp::GitPush {
                branch: None,
                force_with_lease: true,
                expect: Some("0".repeat(40)),
                set_upstream: false,
            },
            ToolOp::History {
                offset: None,
                limit: Some(5),
            },
            ToolOp::HistoryDiff {
                since: "1".into(),
                until: None,
            },
            ToolOp::HistoryFile {
                point: "a".repeat(40),
                path: "p".into(),
            },
            ToolOp::Checkpoint { name: "n".into() },
            ToolOp::Rewind { point: "2".into() },
            ToolOp::Undo,
            ToolOp::Fork {
                point: "2".into(),
                scope: "c2".into(),
            },
        ];
        let mut names = std::collections::BTreeSet::new();
        for op in ops {
            let (name, args) = call_of(&op);
            assert!(is_tool(&name), "{name}");
            assert_eq!(op_from_args(&name, args).unwrap(), op, "{name}");
            names.insert(name);
        }
        assert_eq!(names.len(), TOOLS.len(), "every tool is exercised");
    }
}
