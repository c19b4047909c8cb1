//! The `shell` tool: a command line run with `sh -c` in the workspace's runtime, as a
//! `Command::Exec` through the queue. Its kind is the workspace's default (`write` on a
//! writable workspace, `read` — a read-only mount — on an analysis one), so a
//! read-only workspace's shell cannot change it.

use grove_core::commands::{Command, Exec};
use grove_core::model::ExecOutcome;
use serde_json::{json, Map, Value};
use uuid::Uuid;

/// The name of the tool.
pub const NAME: &str = "shell";

/// Longest timeout a call may ask for.
pub const MAX_TIMEOUT_SECS: u64 = 3600;

pub const DESCRIPTION: &str = "Run a command line with `sh -c` in the workspace (its root is the working directory unless cwd says otherwise); returns the exit code, stdout and stderr. No network. On a read-only workspace the files are mounted read-only.";

/// The JSON Schema of the arguments.
pub fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command line, run with sh -c."},
            "cwd": {"type": ["string", "null"], "description": "A directory relative to the workspace root."},
            "timeout_secs": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_TIMEOUT_SECS}
        },
        "required": ["command"],
        "additionalProperties": false
    })
}

/// The JSON Schema of the structured result: the exec's outcome as the API returns it
/// (`exit_code` is the command's own; the text says 124 for a timeout).
pub fn output_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "exit_code": {"type": "integer"},
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "timed_out": {"type": "boolean"},
            "truncated": {"type": "boolean"},
            "duration_ms": {"type": "integer", "minimum": 0}
        },
        "required": ["exit_code", "stdout", "stderr", "timed_out", "truncated", "duration_ms"]
    })
}

/// The exec command of a call, or a message naming what is wrong with its arguments.
pub fn command(
    workspace_id: Uuid,
    runtime: &str,
    args: Map<String, Value>,
) -> Result<Command, String> {
    if let Some(k) = args
        .keys()
        .find(|k| !["command", "cwd", "timeout_secs"].contains(&k.as_str()))
    {
        return Err(format!(
            "unknown argument {:?} (expected command, cwd, timeout_secs)",
            k.chars().take(64).collect::<String>()
        ));
    }
    let line = match args.get("command") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(Value::String(_)) => return Err("command must not be empty".into()),
        _ => return Err("command is required and must be a string".into()),
    };
    let cwd = match args.get("cwd") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        _ => return Err("cwd must be a string".into()),
    };
    let timeout_ms = match args.get("timeout_secs") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(s) if (1..=MAX_TIMEOUT_SECS).contains(&s) => Some(s * 1000),
            _ => {
                return Err(format!(
                    "timeout_secs must be an integer from 1 to {MAX_TIMEOUT_SECS}"
                ))
            }
        },
    };
    Ok(Command::Exec(Exec {
        workspace_id,
        runtime: runtime.to_string(),
        argv: vec!["sh".into(), "-c".into(), line],
        env: Default::default(),
        cwd,
        stdin: None,
        timeout_ms,
        max_output_bytes: None,
        kind: None,
        network: None,
        keep_output: true,
    }))
}

/// The result as text for the agent: the exit code (124 for a timeout, as the CLI
/// exits), then stdout and stderr.
pub fn text(o: &ExecOutcome) -> String {
    let mut out = format!("exit code {}", o.reported_exit_code());
    if o.timed_out {
        out.push_str(" (timed out)");
    }
    if o.truncated {
        out.push_str(" (output truncated)");
    }
    out.push('\n');
    if !o.stdout.is_empty() {
        out.push_str("--- stdout ---\n");
        out.push_str(&o.stdout);
        if !o.stdout.ends_with('\n') {
            out.push('\n');
        }
    }
    if !o.stderr.is_empty() {
        out.push_str("--- stderr ---\n");
        out.push_str(&o.stderr);
        if !o.stderr.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn a_shell_call_becomes_an_exec_of_sh_dash_c_with_the_workspace_default_kind() {
        let c = command(
            Uuid::nil(),
            "local",
            args(json!({"command": "echo hi > a", "timeout_secs": 5, "cwd": "src"})),
        )
        .unwrap();
        let Command::Exec(e) = &c else { panic!() };
        assert_eq!(e.argv, ["sh", "-c", "echo hi > a"]);
        assert_eq!(e.timeout_ms, Some(5000));
        assert_eq!(e.cwd.as_deref(), Some("src"));
        assert!(e.kind.is_none() && e.network.is_none() && e.env.is_empty());
        assert!(c.validate().is_ok());
    }

    #[test]
    fn bad_shell_arguments_are_named() {
        for (a, word) in [
            (json!({}), "command"),
            (json!({"command": 3}), "command"),
            (json!({"command": " "}), "empty"),
            (json!({"command": "x", "argv": []}), "argv"),
            (json!({"command": "x", "timeout_secs": 0}), "timeout_secs"),
            (json!({"command": "x", "cwd": 1}), "cwd"),
        ] {
            let e = command(Uuid::nil(), "local", args(a)).unwrap_err();
            assert!(e.contains(word), "{e}");
        }
        // A NUL byte passes the shape check and is refused by the command's validation.
        let c = command(Uuid::nil(), "local", args(json!({"command": "a\u{0}b"}))).unwrap();
        assert!(c.validate().is_err());
    }

    #[test]
    fn the_text_names_the_exit_code_and_both_streams() {
        let t = text(&ExecOutcome {
            exit_code: 3,
            stdout: "out".into(),
            stderr: "err\n".into(),
            timed_out: false,
            truncated: true,
            duration_ms: 1,
        });
        assert_eq!(
            t,
            "exit code 3 (output truncated)\n--- stdout ---\nout\n--- stderr ---\nerr\n"
        );
    }

    #[test]
    fn a_timed_out_command_reports_124_as_the_cli_exits() {
        let t = text(&ExecOutcome {
            exit_code: 137,
            stdout: String::new(),
            stderr: String::new(),
            timed_out: true,
            truncated: false,
            duration_ms: 1000,
        });
        assert_eq!(t, "exit code 124 (timed out)\n");
    }
}
