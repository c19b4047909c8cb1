//! What a restore does with a workspace, by its state and what is on disk.

use crate::error::{CommandError, ErrorKind};
use crate::model::WorkspaceRow;
use crate::state::WorkspaceState;

/// The branch a restore takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreStep {
    /// Check the workspace out again from its repo cache and saved work. With
    /// `reuse_checkout`, a finished checkout is already at its path (a restore whose
    /// worker died after moving it into place): it is kept and only measured.
    Rebuild { reuse_checkout: bool },
    /// An interrupted eviction whose files are still in place: roll it back
    /// (`workspace.eviction_blocked`, back to `ready`).
    RollBack,
    /// Not evicted: nothing to do.
    Unchanged,
}

/// Decides the restore of `ws` on `node` given whether its directory, and a `.git`
/// inside it, exist. A workspace of another node is a conflict; a live record whose
/// directory is gone is a transient conflict (the next sweep records it as evicted).
pub fn restore_step(
    ws: &WorkspaceRow,
    node: &str,
    dir_exists: bool,
    git_dir_exists: bool,
) -> Result<RestoreStep, CommandError> {
    if ws.node != node {
        return Err(CommandError::new(
            ErrorKind::Conflict,
            format!(
                "workspace {} lives on node {}; restore it there",
                ws.id, ws.node
            ),
        ));
    }
    match ws.state {
        // An eviction moves the directory away before it records `evicted`: a
        // directory found at the path of an `evicted` record is a finished restore.
        WorkspaceState::Evicted => Ok(RestoreStep::Rebuild {
            reuse_checkout: dir_exists && git_dir_exists,
        }),
        WorkspaceState::Evicting if dir_exists => Ok(RestoreStep::RollBack),
        WorkspaceState::Evicting => Ok(RestoreStep::Rebuild {
            reuse_checkout: false,
        }),
        WorkspaceState::Ready | WorkspaceState::Released if dir_exists => {
            Ok(RestoreStep::Unchanged)
        }
        WorkspaceState::Ready | WorkspaceState::Released => Err(CommandError::new(
            ErrorKind::Conflict,
            format!(
                "workspace {} has a record but its directory is missing and it was not evicted; the next eviction sweep records it as evicted, then restore it",
                ws.id
            ),
        )
        .transient()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::fixtures::row;
    use crate::model::WorkspaceMode::Task;
    use RestoreStep::*;

    /// (node, state, dir exists, .git exists, expected)
    type Case = (
        &'static str,
        &'static str,
        bool,
        bool,
        Result<RestoreStep, ErrorKind>,
    );

    #[test]
    fn a_restore_rebuilds_rolls_back_keeps_or_refuses() {
        // (node, state, dir exists, .git exists, expected)
        let cases: &[Case] = &[
            (
                "n1",
                "evicted",
                false,
                false,
                Ok(Rebuild {
                    reuse_checkout: false,
                }),
            ),
            (
                "n1",
                "evicted",
                true,
                false,
                Ok(Rebuild {
                    reuse_checkout: false,
                }),
            ),
            (
                "n1",
                "evicted",
                true,
                true,
                Ok(Rebuild {
                    reuse_checkout: true,
                }),
            ),
            ("n1", "evicting", true, true, Ok(RollBack)),
            (
                "n1",
                "evicting",
                false,
                false,
                Ok(Rebuild {
                    reuse_checkout: false,
                }),
            ),
            ("n1", "ready", true, true, Ok(Unchanged)),
            ("n1", "released", true, false, Ok(Unchanged)),
            ("n1", "ready", false, false, Err(ErrorKind::Conflict)),
            ("n2", "evicted", false, false, Err(ErrorKind::Conflict)),
        ];
        for (node, state, dir, git, want) in cases {
            let ws = row(Task, node, state);
            let got = restore_step(&ws, "n1", *dir, *git);
            assert_eq!(
                &got.as_ref().map_err(|e| e.kind).copied(),
                want,
                "{node} {state} {dir} {git}"
            );
        }
        let missing = restore_step(&row(Task, "n1", "ready"), "n1", false, false).unwrap_err();
        assert!(missing.transient, "the next sweep settles it");
    }
}
