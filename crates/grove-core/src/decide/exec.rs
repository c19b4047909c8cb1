//! An exec's class and the refusals checked before anything of it is recorded.

use crate::error::{CommandError, ErrorKind};
use crate::model::{ExecKind, WorkspaceRow};
use crate::placement::Placement;

/// The class of an exec: the one asked for, else `write` on a writable workspace and
/// `read` on a read-only one.
pub fn exec_kind(requested: Option<ExecKind>, ws: &WorkspaceRow) -> ExecKind {
    requested.unwrap_or(if ws.capabilities.writable {
        ExecKind::Write
    } else {
        ExecKind::Read
    })
}

/// Whether an exec of `kind` may run in `ws` through `runtime`, `configured` being the
/// runtimes this worker has. A mutating command on a read-only workspace is refused; a
/// workspace placed in a remote provider runs there only, and a remote runtime reaches
/// no host workspace; a runtime this worker lacks is unavailable.
pub fn check_exec(
    ws: &WorkspaceRow,
    kind: ExecKind,
    runtime: &str,
    configured: &[&str],
) -> Result<(), CommandError> {
    let remote = Placement::of_node(&ws.node).is_remote();
    let rejected = |msg: String| Err(CommandError::new(ErrorKind::Rejected, msg));
    if kind.is_mutating() && !ws.capabilities.writable {
        return rejected(format!(
            "workspace {} is read-only ({} mode): {:?} commands are refused",
            ws.id,
            ws.mode.as_str(),
            kind
        ));
    }
    if remote && runtime != ws.node {
        return rejected(format!(
            "workspace {} lives inside {1}: run its commands with --runtime {1}, not {2}",
            ws.id, ws.node, runtime
        ));
    }
    if !remote && Placement::of_node(runtime).is_remote() {
        return rejected(format!(
            "workspace {} lives on node {}: runtime {2} runs only workspaces placed in it (acquire with --runtime {2})",
            ws.id, ws.node, runtime
        ));
    }
    if !configured.contains(&runtime) {
        return Err(CommandError::new(
            ErrorKind::Unavailable,
            format!(
                "runtime {runtime:?} is not configured on this worker (configured: {})",
                configured.join(", ")
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::fixtures::row;
    use crate::model::WorkspaceMode::{self, Analysis, Edit};

    #[test]
    fn the_kind_defaults_to_the_workspaces_writability() {
        let cases = [
            (None, Edit, ExecKind::Write),
            (None, Analysis, ExecKind::Read),
            (Some(ExecKind::Test), Analysis, ExecKind::Test),
            (Some(ExecKind::Read), Edit, ExecKind::Read),
        ];
        for (requested, mode, want) in cases {
            let ws = row(mode, "n1", "ready");
            assert_eq!(exec_kind(requested, &ws), want, "{requested:?} on {mode:?}");
        }
    }

    /// (mode, node, kind, runtime, configured, expected kind, text in the message)
    type Case = (
        WorkspaceMode,
        &'static str,
        ExecKind,
        &'static str,
        &'static [&'static str],
        Option<ErrorKind>,
        &'static str,
    );

    #[test]
    fn refusals_come_in_order_and_name_the_way_out() {
        const BOTH: &[&str] = &["local", "docker", "daytona"];
        let cases: &[Case] = &[
            (Edit, "n1", ExecKind::Write, "local", BOTH, None, ""),
            (Analysis, "n1", ExecKind::Read, "docker", BOTH, None, ""),
            (
                Analysis,
                "n1",
                ExecKind::Install,
                "local",
                BOTH,
                Some(ErrorKind::Rejected),
                "read-only",
            ),
            (
                Edit,
                "daytona",
                ExecKind::Write,
                "local",
                BOTH,
                Some(ErrorKind::Rejected),
                "--runtime daytona, not local",
            ),
            (Edit, "daytona", ExecKind::Write, "daytona", BOTH, None, ""),
            (
                Edit,
                "n1",
                ExecKind::Write,
                "e2b",
                BOTH,
                Some(ErrorKind::Rejected),
                "runs only workspaces placed in it",
            ),
            (
                Edit,
                "n1",
                ExecKind::Write,
                "docker",
                &["local"],
                Some(ErrorKind::Unavailable),
                "configured: local",
            ),
            // Read-only is checked before placement.
            (
                Analysis,
                "daytona",
                ExecKind::Write,
                "local",
                BOTH,
                Some(ErrorKind::Rejected),
                "read-only",
            ),
        ];
        for (mode, node, kind, runtime, configured, want, text) in cases {
            let ws = row(*mode, node, "ready");
            let got = check_exec(&ws, *kind, runtime, configured);
            assert_eq!(
                got.as_ref().err().map(|e| e.kind),
                *want,
                "{mode:?} {node} {kind:?} {runtime}"
            );
            if let Err(e) = got {
                assert!(e.message.contains(text), "{}", e.message);
            }
        }
    }
}
