//! What an acquire of a key does with the workspace recorded under it, if any.

use crate::error::{CommandError, ErrorKind};
use crate::model::WorkspaceRow;
use crate::placement::Placement;

/// The branch an acquire takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireStep<'a> {
    /// No workspace under the key: create one on this node from its repo cache.
    Create,
    /// No workspace under the key: create one inside the remote `provider` (ADR 15).
    CreateRemote { provider: &'a str },
    /// The workspace exists and is whole: use it again (`workspace.acquired`).
    Reacquire,
    /// The workspace was evicted (or its eviction was interrupted): restore it, same
    /// id, path and branch.
    Restore,
}

/// Decides an acquire for `node` (this worker's node, or the remote placement asked
/// for, `remote_placement`) given the workspace recorded under the key and whether
/// its directory exists on this host. A workspace of another node is a conflict that
/// says where it lives; a host workspace whose directory vanished without an eviction
/// is an internal error.
pub fn acquire_step<'a>(
    existing: Option<&WorkspaceRow>,
    node: &str,
    remote_placement: Option<&'a str>,
    dir_exists: bool,
) -> Result<AcquireStep<'a>, CommandError> {
    let Some(row) = existing else {
        return Ok(match remote_placement {
            Some(provider) => AcquireStep::CreateRemote { provider },
            None => AcquireStep::Create,
        });
    };
    if row.node != node {
        let place = match (Placement::of_node(&row.node), remote_placement) {
            (Placement::Remote(provider), _) => {
                format!("inside {provider}; acquire it with --runtime {provider}")
            }
            (Placement::Node(other), Some(_)) => {
                format!("on node {other}; acquire it without --runtime {node}")
            }
            (Placement::Node(other), None) => format!("on node {other}; acquire it there"),
        };
        return Err(CommandError::new(
            ErrorKind::Conflict,
            format!("workspace {} lives {place}", row.id),
        ));
    }
    if Placement::of_node(&row.node).is_remote() {
        // Its files are in the provider's sandbox: nothing to check on this host.
        return Ok(AcquireStep::Reacquire);
    }
    if !row.state.has_files() {
        return Ok(AcquireStep::Restore);
    }
    if !dir_exists {
        return Err(CommandError::new(
            ErrorKind::Internal,
            format!(
                "workspace {} has a record but its directory is missing; destroy it and acquire again",
                row.id
            ),
        ));
    }
    Ok(AcquireStep::Reacquire)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::fixtures::row;
    use crate::model::WorkspaceMode::Edit;
    use AcquireStep::*;

    type Want = Result<AcquireStep<'static>, ErrorKind>;
    type Case = (
        Option<(&'static str, &'static str)>,
        &'static str,
        Option<&'static str>,
        bool,
        Want,
    );

    #[test]
    fn an_acquire_creates_reuses_restores_or_refuses() {
        // (recorded (node, state), acquiring node, placement, dir exists, expected)
        let cases: &[Case] = &[
            (None, "n1", None, false, Ok(Create)),
            (
                None,
                "daytona",
                Some("daytona"),
                false,
                Ok(CreateRemote {
                    provider: "daytona",
                }),
            ),
            (Some(("n1", "ready")), "n1", None, true, Ok(Reacquire)),
            (Some(("n1", "released")), "n1", None, true, Ok(Reacquire)),
            (
                Some(("n1", "ready")),
                "n1",
                None,
                false,
                Err(ErrorKind::Internal),
            ),
            (Some(("n1", "evicted")), "n1", None, false, Ok(Restore)),
            (Some(("n1", "evicting")), "n1", None, true, Ok(Restore)),
            (
                Some(("n2", "ready")),
                "n1",
                None,
                true,
                Err(ErrorKind::Conflict),
            ),
            (
                Some(("daytona", "ready")),
                "n1",
                None,
                false,
                Err(ErrorKind::Conflict),
            ),
            (
                Some(("n1", "ready")),
                "e2b",
                Some("e2b"),
                true,
                Err(ErrorKind::Conflict),
            ),
            // A remote workspace's directory is not on this host.
            (
                Some(("e2b", "ready")),
                "e2b",
                Some("e2b"),
                false,
                Ok(Reacquire),
            ),
        ];
        for (recorded, node, placement, dir, want) in cases {
            let ws = recorded.map(|(n, s)| row(Edit, n, s));
            let got = acquire_step(ws.as_ref(), node, *placement, *dir).map_err(|e| e.kind);
            assert_eq!(
                &got, want,
                "{recorded:?} acquired on {node} ({placement:?})"
            );
        }
    }

    #[test]
    fn a_conflict_says_where_the_workspace_lives() {
        let remote = row(Edit, "daytona", "ready");
        let e = acquire_step(Some(&remote), "n1", None, false).unwrap_err();
        assert!(e
            .message
            .contains("inside daytona; acquire it with --runtime daytona"));
        let host = row(Edit, "n2", "ready");
        let e = acquire_step(Some(&host), "e2b", Some("e2b"), false).unwrap_err();
        assert!(e
            .message
            .contains("on node n2; acquire it without --runtime e2b"));
        let e = acquire_step(Some(&host), "n1", None, false).unwrap_err();
        assert!(e.message.contains("on node n2; acquire it there"));
    }
}
