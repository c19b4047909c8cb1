//! The pull request tools: `create_pull_request` (the workspace's branch as the head)
//! and `comment_pull_request`, as `Command::CreatePullRequest` / `CommentPullRequest`
//! through the queue. The platform token is the server's git token (`--token-env`),
//! handed to the queue with each call like a push's, never an argument.

use grove_core::commands::{Command, CommentPullRequest, CreatePullRequest};
use serde_json::{json, Map, Value};
use uuid::Uuid;

pub const CREATE: &str = "create_pull_request";
pub const COMMENT: &str = "comment_pull_request";

pub const CREATE_DESCRIPTION: &str = "Open a pull request on the git platform from the workspace's branch (push it first with git_push). base defaults to the workspace's base ref. Returns the pull request (number, url, state).";
pub const COMMENT_DESCRIPTION: &str =
    "Comment on a pull request of the workspace's repository. Returns the comment's url.";

/// The JSON Schema of `create_pull_request`'s arguments.
pub fn create_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "title": {"type": "string", "description": "The pull request's title."},
            "body": {"type": ["string", "null"], "description": "Its description (Markdown)."},
            "base": {"type": ["string", "null"], "description": "The branch to merge into; default: the workspace's base ref."},
            "draft": {"type": ["boolean", "null"], "description": "Open it as a draft."}
        },
        "required": ["title"],
        "additionalProperties": false
    })
}

/// The JSON Schema of `comment_pull_request`'s arguments.
pub fn comment_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "number": {"type": "integer", "minimum": 1, "description": "The pull request's number."},
            "body": {"type": "string", "description": "The comment (Markdown)."}
        },
        "required": ["number", "body"],
        "additionalProperties": false
    })
}

fn check_keys(args: &Map<String, Value>, allowed: &[&str]) -> Result<(), String> {
    match args.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(format!(
            "unknown argument {:?} (expected {})",
            k.chars().take(64).collect::<String>(),
            allowed.join(", ")
        )),
        None => Ok(()),
    }
}

fn optional_string(args: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        _ => Err(format!("{key} must be a string")),
    }
}

fn required_string(args: &Map<String, Value>, key: &str) -> Result<String, String> {
    optional_string(args, key)?.ok_or_else(|| format!("{key} is required and must be a string"))
}

/// The command of a `create_pull_request` call, or what is wrong with its arguments.
/// Values (title length, branch names) are checked by `Command::validate` before
/// anything is enqueued.
pub fn create(workspace_id: Uuid, args: &Map<String, Value>) -> Result<Command, String> {
    check_keys(args, &["title", "body", "base", "draft"])?;
    let draft = match args.get("draft") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        _ => return Err("draft must be a boolean".into()),
    };
    Ok(Command::CreatePullRequest(CreatePullRequest {
        workspace_id,
        base: optional_string(args, "base")?,
        title: required_string(args, "title")?,
        body: optional_string(args, "body")?,
        draft,
    }))
}

/// The command of a `comment_pull_request` call, or what is wrong with its arguments.
pub fn comment(workspace_id: Uuid, args: &Map<String, Value>) -> Result<Command, String> {
    check_keys(args, &["number", "body"])?;
    let number = args
        .get("number")
        .and_then(Value::as_u64)
        .filter(|n| *n >= 1)
        .ok_or("number is required and must be a positive integer")?;
    Ok(Command::CommentPullRequest(CommentPullRequest {
        workspace_id,
        number,
        body: required_string(args, "body")?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!("an object"),
        }
    }

    #[test]
    fn a_create_call_becomes_the_pull_request_command_of_the_bound_workspace() {
        let id = Uuid::nil();
        let c = create(
            id,
            &args(json!({"title": "Fix", "body": "b", "draft": true})),
        )
        .unwrap();
        match c {
            Command::CreatePullRequest(p) => {
                assert_eq!(p.workspace_id, id);
                assert_eq!(p.title, "Fix");
                assert_eq!(p.body.as_deref(), Some("b"));
                assert!(p.draft);
                assert_eq!(p.base, None);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn wrong_or_unknown_arguments_are_named() {
        let id = Uuid::nil();
        assert!(create(id, &args(json!({}))).unwrap_err().contains("title"));
        assert!(create(id, &args(json!({"title": 3})))
            .unwrap_err()
            .contains("title"));
        assert!(create(id, &args(json!({"title": "t", "head": "x"})))
            .unwrap_err()
            .contains("head"));
        assert!(create(id, &args(json!({"title": "t", "draft": "yes"})))
            .unwrap_err()
            .contains("draft"));
        assert!(comment(id, &args(json!({"number": 0, "body": "x"})))
            .unwrap_err()
            .contains("number"));
        assert!(comment(id, &args(json!({"number": 2})))
            .unwrap_err()
            .contains("body"));
        match comment(id, &args(json!({"number": 2, "body": "ok"}))).unwrap() {
            Command::CommentPullRequest(c) => assert_eq!((c.number, c.body.as_str()), (2, "ok")),
            other => panic!("{other:?}"),
        }
    }
}
