//! grove-remote-runtime: what the remote runtime adapters (`grove-daytona`,
//! `grove-e2b`) share, so the rules they both promise are written once.
//!
//! Both adapters keep one sandbox per (user, project), labelled and found again by
//! [`SandboxKey`]'s labels; both refuse host mounts (a remote sandbox cannot see host
//! paths) and run a runtime's commands in a workspace directory inside the sandbox;
//! both place workspaces at `<home>/grove/workspaces/<user>_<scope>_<branch>`, made
//! from one clone per repository at `<home>/grove/repos/<repo>`; both find, create,
//! converge and recover their sandbox the same way ([`lifecycle`]). The crate does no
//! IO of its own and knows no provider's API: a provider lends its API calls through
//! [`lifecycle::SandboxApi`].
//!
//! # Layout
//! - [`config`]: the API root and key, both or neither.
//! - [`spec`]: sandbox keys, labels, backend ids, the checks of a runtime spec, an
//!   exec request and its cwd, and the output cap of an exec.
//! - [`placement`]: workspaces inside a sandbox (what to make, where it goes).
//! - [`race`]: which sandbox every racer keeps after a create race.
//! - [`lifecycle`]: find, create, converge and recover a provider's sandbox.
//! - [`http`]: HTTP statuses to `RuntimeError`, and path-segment encoding.

pub mod config;
pub mod http;
pub mod lifecycle;
pub mod placement;
pub mod race;
pub mod spec;

pub use http::{enc, status_error};
pub use placement::{worktree_name, RemoteWorkspace, WorkspacePlacement};
pub use race::{keep_oldest, survivor, Candidate};
pub use spec::{
    check_network, lexical_cwd, network_name, validate_exec, OutputCap, RemoteSpec, SandboxKey,
    LABEL_MANAGED, LABEL_NETWORK, LABEL_PROJECT, LABEL_USER,
};
