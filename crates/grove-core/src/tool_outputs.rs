//! JSON Schemas (draft 2020-12) of what each tool of the catalogue returns: the
//! [`ToolOutput`](crate::tools::ToolOutput) variant it answers with, tagged by `output`.
//! MCP declares them as `outputSchema` (clients validate `structuredContent` against
//! them) and the OpenAPI document as each typed tool route's answer. The tests below
//! check every variant as serialized against its schema, so the two cannot drift.

use serde_json::{json, Value};

/// The schema of tool `name`'s output (`None` for a name outside the catalogue).
pub fn output_schema(name: &str) -> Option<Value> {
    let (tag, properties, required) = match name {
        "view" => ("text", json!({"text": string()}), vec!["text"]),
        "read_file" => (
            "file",
            json!({"path": string(), "content": string(), "size_bytes": count()}),
            vec!["path", "content", "size_bytes"],
        ),
        "list_dir" => (
            "dir",
            json!({"entries": array(dir_entry())}),
            vec!["entries"],
        ),
        "create" | "str_replace" | "insert" | "write_file" => (
            "written",
            json!({"path": string(), "size_bytes": count(), "sha256": string(), "created": boolean()}),
            vec!["path", "size_bytes", "sha256", "created"],
        ),
        "search" => (
            "search",
            json!({"hits": array(search_hit()), "truncated": boolean()}),
            vec!["hits", "truncated"],
        ),
        "git_status" => (
            "status",
            json!({"branch": nullable_string(), "head": nullable_string(), "entries": array(status_entry())}),
            vec!["branch", "head", "entries"],
        ),
        "git_diff" => (
            "diff",
            json!({"against": string(), "files": array(string()), "patch": string(), "truncated": boolean()}),
            vec!["against", "files", "patch", "truncated"],
        ),
        "git_log" => (
            "log",
            json!({"entries": array(log_entry())}),
            vec!["entries"],
        ),
        "git_commit" => (
            "committed",
            json!({"commit": string(), "branch": nullable_string(), "files": array(string())}),
            vec!["commit", "branch", "files"],
        ),
        "git_push" => (
            "pushed",
            json!({"branch": string(), "commit": string(), "previous": nullable_string(), "forced": boolean()}),
            vec!["branch", "commit", "previous", "forced"],
        ),
        _ => return history_output(name),
    };
    Some(tagged(tag, properties, &required))
}

/// The outputs of the history tools (ADR 28).
fn history_output(name: &str) -> Option<Value> {
    let (tag, properties, required) = match name {
        "history" => (
            "history",
            json!({"points": array(point()), "total": count()}),
            vec!["points", "total"],
        ),
        "history_diff" => (
            "history_diff",
            json!({"from_point": count(), "to_point": {"type": ["integer", "null"], "minimum": 0}, "files": array(changed_file()), "patch": string(), "truncated": boolean()}),
            vec!["from_point", "to_point", "files", "patch", "truncated"],
        ),
        "history_file" => return output_schema("read_file"),
        "checkpoint" => {
            let mut schema = point();
            schema["properties"]["output"] = json!({"type": "string", "enum": ["point"]});
            schema["required"]
                .as_array_mut()?
                .insert(0, json!("output"));
            return Some(schema);
        }
        "rewind" | "undo" => (
            "rewound",
            json!({"to": count(), "point": point(), "kept": {"type": ["integer", "null"], "minimum": 0}, "files_written": count(), "files_removed": count()}),
            vec!["to", "point", "kept", "files_written", "files_removed"],
        ),
        "fork" => (
            "forked",
            json!({"workspace_id": string(), "branch": nullable_string(), "local_path": string(), "point": count()}),
            vec!["workspace_id", "branch", "local_path", "point"],
        ),
        _ => return None,
    };
    Some(tagged(tag, properties, &required))
}

fn point() -> Value {
    object(
        json!({
            "number": count(),
            "snapshot": string(),
            "position": {"type": ["integer", "null"]},
            "at": string(),
            "workspace_id": string(),
            "operation": operation(),
            "head": string(),
            "branch": nullable_string(),
            "changes": object(json!({"added": count(), "modified": count(), "deleted": count()}), &["added", "modified", "deleted"]),
            "ignored_omitted": count()
        }),
        &[
            "number",
            "snapshot",
            "position",
            "at",
            "workspace_id",
            "operation",
            "head",
            "branch",
            "changes",
        ],
    )
}

/// What change a point records: `kind`, and the fields of that kind.
fn operation() -> Value {
    object(
        json!({
            "kind": {"type": "string", "enum": ["created", "exec", "tool", "checkpoint", "before_rewind", "rewind", "merge_back", "restore"]},
            "argv": array(string()),
            "exit_code": {"type": ["integer", "null"]},
            "duration_ms": count(),
            "tool": string(),
            "path": nullable_string(),
            "message": nullable_string(),
            "name": string(),
            "to": string(),
            "task_workspace_id": string(),
            "commits": count(),
            "fast_forward": boolean()
        }),
        &["kind"],
    )
}

fn changed_file() -> Value {
    object(
        json!({"path": string(), "status": {"type": "string", "enum": ["added", "modified", "deleted", "typechange"]}}),
        &["path", "status"],
    )
}

/// An object tagged `output: tag` with `properties`, all of `required` present.
fn tagged(tag: &str, properties: Value, required: &[&str]) -> Value {
    let mut props = properties;
    // `enum` of one value rather than `const`, which utoipa's schema model drops.
    props["output"] = json!({"type": "string", "enum": [tag]});
    let mut req = vec!["output"];
    req.extend_from_slice(required);
    object(props, &req)
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required})
}

fn string() -> Value {
    json!({"type": "string"})
}

fn nullable_string() -> Value {
    json!({"type": ["string", "null"]})
}

fn count() -> Value {
    json!({"type": "integer", "minimum": 0})
}

fn boolean() -> Value {
    json!({"type": "boolean"})
}

fn array(items: Value) -> Value {
    json!({"type": "array", "items": items})
}

fn dir_entry() -> Value {
    object(
        json!({"path": string(), "kind": {"type": "string", "enum": ["file", "dir", "symlink", "other"]}, "size": count()}),
        &["path", "kind", "size"],
    )
}

fn search_hit() -> Value {
    object(
        json!({"path": string(), "line": {"type": "integer", "minimum": 1}, "text": string()}),
        &["path", "line", "text"],
    )
}

fn status_entry() -> Value {
    object(
        json!({"path": string(), "staged": nullable_string(), "unstaged": nullable_string()}),
        &["path", "staged", "unstaged"],
    )
}

fn log_entry() -> Value {
    object(
        json!({"commit": string(), "author_name": string(), "author_email": string(), "time": {"type": "integer"}, "summary": string()}),
        &["commit", "author_name", "author_email", "time", "summary"],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{ChangedFile, FileCounts, Operation, Point};
    use crate::tool_catalog;
    use crate::tools::*;

    /// The subset of JSON Schema these schemas use: type (one or a list), enum,
    /// minimum, properties, required, items. Returns the first violation.
    fn check(schema: &Value, v: &Value, at: &str) -> Result<(), String> {
        let types: Vec<&str> = match &schema["type"] {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        let type_ok = types.iter().any(|t| match *t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            _ => false,
        });
        if !type_ok {
            return Err(format!("{at}: {v} is not {types:?}"));
        }
        if let Some(Value::Array(options)) = schema.get("enum") {
            options
                .contains(v)
                .then_some(())
                .ok_or(format!("{at}: {v} not in enum"))?;
        }
        if let (Some(min), Some(n)) = (schema.get("minimum").and_then(Value::as_i64), v.as_i64()) {
            (n >= min)
                .then_some(())
                .ok_or(format!("{at}: {n} < {min}"))?;
        }
        if let Value::Object(fields) = v {
            let props = schema["properties"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            for r in schema["required"].as_array().into_iter().flatten() {
                let r = r.as_str().unwrap();
                fields
                    .contains_key(r)
                    .then_some(())
                    .ok_or(format!("{at}: {r} missing"))?;
            }
            for (k, fv) in fields {
                let sub = props.get(k).ok_or(format!("{at}: {k} not in the schema"))?;
                check(sub, fv, &format!("{at}.{k}"))?;
            }
        }
        if let (Value::Array(items), Some(sub)) = (v, schema.get("items")) {
            for (i, item) in items.iter().enumerate() {
                check(sub, item, &format!("{at}[{i}]"))?;
            }
        }
        Ok(())
    }

    fn written() -> ToolOutput {
        ToolOutput::Written(WrittenFile {
            path: "a".into(),
            size_bytes: 1,
            sha256: "00".into(),
            created: true,
        })
    }

    /// One output of every tool, as the handlers build them (nullable fields both ways).
    fn samples() -> Vec<(&'static str, ToolOutput)> {
        vec![
            (
                "view",
                ToolOutput::Text {
                    text: "1\ta".into(),
                },
            ),
            (
                "read_file",
                ToolOutput::File {
                    path: "a".into(),
                    content: "x".into(),
                    size_bytes: 1,
                },
            ),
            (
                "list_dir",
                ToolOutput::Dir {
                    entries: vec![DirEntry {
                        path: "a".into(),
                        kind: "file".into(),
                        size: 3,
                    }],
                },
            ),
            ("create", written()),
            ("str_replace", written()),
            ("insert", written()),
            ("write_file", written()),
            (
                "search",
                ToolOutput::Search {
                    hits: vec![SearchHit {
                        path: "a".into(),
                        line: 1,
                        text: "t".into(),
                    }],
                    truncated: false,
                },
            ),
            (
                "git_status",
                ToolOutput::Status(GitStatus {
                    branch: None,
                    head: Some("c".into()),
                    entries: vec![StatusEntry {
                        path: "a".into(),
                        staged: Some("added".into()),
                        unstaged: None,
                    }],
                }),
            ),
            (
                "git_diff",
                ToolOutput::Diff(GitDiff {
                    against: "c".into(),
                    files: vec!["a".into()],
                    patch: "p".into(),
                    truncated: false,
                }),
            ),
            (
                "git_log",
                ToolOutput::Log {
                    entries: vec![LogEntry {
                        commit: "c".into(),
                        author_name: "n".into(),
                        author_email: "e".into(),
                        time: -1,
                        summary: "s".into(),
                    }],
                },
            ),
            (
                "git_commit",
                ToolOutput::Committed(Committed {
                    commit: "c".into(),
                    branch: Some("b".into()),
                    files: vec![],
                }),
            ),
            (
                "git_push",
                ToolOutput::Pushed(Pushed {
                    branch: "b".into(),
                    commit: "c".into(),
                    previous: None,
                    forced: false,
                }),
            ),
            (
                "history",
                ToolOutput::History {
                    points: vec![sample_point()],
                    total: 1,
                },
            ),
            (
                "history_diff",
                ToolOutput::HistoryDiff {
                    from_point: 1,
                    to_point: None,
                    files: vec![ChangedFile {
                        path: "a".into(),
                        status: "added".into(),
                    }],
                    patch: "p".into(),
                    truncated: false,
                },
            ),
            (
                "history_file",
                ToolOutput::File {
                    path: "a".into(),
                    content: "x".into(),
                    size_bytes: 1,
                },
            ),
            ("checkpoint", ToolOutput::Point(sample_point())),
            (
                "rewind",
                ToolOutput::Rewound {
                    to: 1,
                    point: sample_point(),
                    kept: Some(3),
                    files_written: 1,
                    files_removed: 0,
                },
            ),
            (
                "undo",
                ToolOutput::Rewound {
                    to: 1,
                    point: sample_point(),
                    kept: None,
                    files_written: 0,
                    files_removed: 1,
                },
            ),
            (
                "fork",
                ToolOutput::Forked {
                    workspace_id: uuid::Uuid::nil(),
                    branch: Some("agent/edits-c2".into()),
                    local_path: "/w".into(),
                    point: 4,
                },
            ),
        ]
    }

    fn sample_point() -> Point {
        Point {
            number: 2,
            snapshot: "ab".into(),
            position: Some(7),
            at: "2026-01-01T00:00:00Z".into(),
            workspace_id: uuid::Uuid::nil(),
            operation: Operation::Exec {
                argv: vec!["make".into()],
                exit_code: Some(0),
                duration_ms: 5,
            },
            head: "c".into(),
            branch: None,
            changes: FileCounts {
                added: 1,
                modified: 0,
                deleted: 2,
            },
            ignored_omitted: 0,
        }
    }

    #[test]
    fn every_tool_has_a_schema_its_output_fits_and_a_wrong_output_does_not() {
        let samples = samples();
        for t in tool_catalog::all_tools() {
            let schema =
                output_schema(&t.name).unwrap_or_else(|| panic!("{} has no schema", t.name));
            let (_, out) = samples
                .iter()
                .find(|(n, _)| *n == t.name)
                .expect("a sample");
            let v = serde_json::to_value(out).unwrap();
            check(&schema, &v, &t.name).unwrap();
            // Another tool's output is refused (its tag differs), as is a missing field.
            let other = if t.name == "view" {
                &samples[1].1
            } else {
                &samples[0].1
            };
            assert!(
                check(&schema, &serde_json::to_value(other).unwrap(), "x").is_err(),
                "{}",
                t.name
            );
            let mut cut = v.as_object().unwrap().clone();
            let field = cut.keys().find(|k| *k != "output").unwrap().clone();
            cut.remove(&field);
            assert!(
                check(&schema, &Value::Object(cut), "x").is_err(),
                "{} without {field}",
                t.name
            );
        }
        assert_eq!(output_schema("no_such_tool"), None);
    }
}
