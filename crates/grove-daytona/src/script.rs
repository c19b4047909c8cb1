//! The shell text a command becomes inside a Daytona sandbox: Daytona's session API
//! takes one command string, so argv, env, cwd and stdin are turned into a POSIX `sh`
//! script with every value single-quoted.

use std::collections::BTreeMap;

/// `value` as one single-quoted `sh` word (`'` becomes `'\''`). NUL bytes are
/// refused earlier (`validate_command`, `validate_env`).
pub fn quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('\'');
    for c in value.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// The script run for one exec: enter `dir`, take stdin from `stdin_file` (unlinked
/// once open) or `/dev/null`, export exactly `env`, and `exec` the program, so the
/// command's exit status (128 + signal when killed) is the script's.
pub fn command_script(
    dir: &str,
    env: &BTreeMap<String, String>,
    stdin_file: Option<&str>,
    argv: &[String],
) -> String {
    let mut s = format!("cd -- {} || exit 126\n", quote(dir));
    match stdin_file {
        Some(f) => s.push_str(&format!("exec 0<{f}; rm -f -- {f}\n", f = quote(f))),
        None => s.push_str("exec 0</dev/null\n"),
    }
    for (k, v) in env {
        // Keys are validated as [A-Za-z_][A-Za-z0-9_]*; values are quoted.
        s.push_str(&format!("export {k}={}\n", quote(v)));
    }
    s.push_str("exec");
    for a in argv {
        s.push(' ');
        s.push_str(&quote(a));
    }
    s.push('\n');
    s
}

/// A script that exits 0 only when `dir` exists and its physical path (symlinks
/// resolved) is `root`'s physical path or below it.
pub fn cwd_check_script(root: &str, dir: &str) -> String {
    format!(
        "r=$(cd -- {root} && pwd -P) || exit 2\nd=$(cd -- {dir} && pwd -P) || exit 3\ncase \"$d/\" in \"$r\"/*) exit 0;; *) exit 4;; esac\n",
        root = quote(root),
        dir = quote(dir)
    )
}

/// `sh -c <script>` as one command string for the session API.
pub fn sh_c(script: &str) -> String {
    format!("sh -c {}", quote(script))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes_and_metacharacters() {
        assert_eq!(quote("a'b"), "'a'\\''b'");
        assert_eq!(quote("$(rm -rf /); `x`"), "'$(rm -rf /); `x`'");
    }

    #[test]
    fn a_command_script_runs_through_a_real_shell_unchanged() {
        let argv: Vec<String> = ["printf", "%s|", "it's", "$HOME", "a b"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let env = BTreeMap::from([("GROVE_X".to_string(), "v'1".to_string())]);
        let script = command_script("/", &env, None, &argv);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "it's|$HOME|a b|");
    }
}
