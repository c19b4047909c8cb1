//! Runtime kinds and where a workspace lives: on a host node (the `local` and `docker`
//! runtimes mount its directory) or inside a remote provider's sandbox (`daytona`,
//! `e2b`; ADR 15), whose name is then the workspace's `node`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::validate::ValidationError;

/// A runtime provider a request may name (whether one is configured on the worker that
/// takes the job is that worker's answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// A sandboxed process on the workspace's host.
    Local,
    /// A container on the workspace's host, its directory bind-mounted.
    Docker,
    /// A Daytona sandbox holding the workspace's files.
    Daytona,
    /// An E2B sandbox holding the workspace's files.
    E2b,
}

impl RuntimeKind {
    /// Every kind, in the order help texts list them.
    pub const ALL: &'static [RuntimeKind] = &[
        RuntimeKind::Local,
        RuntimeKind::Docker,
        RuntimeKind::Daytona,
        RuntimeKind::E2b,
    ];

    /// The name requests, queues and records use.
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Local => "local",
            RuntimeKind::Docker => "docker",
            RuntimeKind::Daytona => "daytona",
            RuntimeKind::E2b => "e2b",
        }
    }

    /// Whether a workspace placed in this runtime lives inside the provider's sandbox
    /// rather than on a host node.
    pub fn is_remote(self) -> bool {
        match self {
            RuntimeKind::Local | RuntimeKind::Docker => false,
            RuntimeKind::Daytona | RuntimeKind::E2b => true,
        }
    }

    /// `name` as a runtime kind, or a request error listing the known ones (`what`
    /// names the field in the message, e.g. "runtime" or "workspace runtime").
    pub fn parse_named(what: &str, name: &str) -> Result<Self, ValidationError> {
        name.parse().map_err(|_| {
            let known: Vec<_> = Self::ALL.iter().map(|k| k.as_str()).collect();
            ValidationError::Request(format!(
                "unknown {what} {:?}: expected one of {}",
                name.chars().take(40).collect::<String>(),
                known.join(", ")
            ))
        })
    }
}

impl fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for RuntimeKind {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        Self::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or(())
    }
}

/// Where a workspace's files are, read from its `node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement<'a> {
    /// On this host node's disk, under its `$GROVE_HOME`.
    Node(&'a str),
    /// Inside a remote provider's sandbox (the node is the provider's name).
    Remote(RuntimeKind),
}

impl<'a> Placement<'a> {
    /// The placement a workspace's `node` names. No worker node may take a remote
    /// provider's name, so the two cannot be confused.
    pub fn of_node(node: &'a str) -> Self {
        match node.parse::<RuntimeKind>() {
            Ok(kind) if kind.is_remote() => Placement::Remote(kind),
            _ => Placement::Node(node),
        }
    }

    /// Whether the files live in a remote provider's sandbox.
    pub fn is_remote(self) -> bool {
        matches!(self, Placement::Remote(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_remote_providers_names_are_remote_placements() {
        assert_eq!(
            Placement::of_node("daytona"),
            Placement::Remote(RuntimeKind::Daytona)
        );
        assert_eq!(
            Placement::of_node("e2b"),
            Placement::Remote(RuntimeKind::E2b)
        );
        for node in ["local", "docker", "n1", "E2B", "", "daytona "] {
            assert_eq!(Placement::of_node(node), Placement::Node(node), "{node:?}");
        }
    }

    #[test]
    fn kinds_round_trip_and_unknown_names_are_typed_request_errors() {
        for &kind in RuntimeKind::ALL {
            assert_eq!(kind.as_str().parse::<RuntimeKind>(), Ok(kind));
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{kind}\""));
        }
        let err = RuntimeKind::parse_named("runtime", "podman").unwrap_err();
        assert_eq!(
            err.to_string(),
            ValidationError::Request(
                "unknown runtime \"podman\": expected one of local, docker, daytona, e2b".into()
            )
            .to_string()
        );
        let long = "x".repeat(500);
        let msg = RuntimeKind::parse_named("runtime", &long)
            .unwrap_err()
            .to_string();
        assert!(msg.len() < 150, "the echoed name is cut: {msg}");
    }
}
