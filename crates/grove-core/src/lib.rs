//! grove-core: the domain of grove — validation, model, events, projections and ports.
//!
//! # Layout
//! - [`validate`]: untrusted input (repo names, URLs, refs, ids, commands, env).
//! - [`model`]: workspace modes, capabilities, projection rows.
//! - [`state`]: the lifecycle states of caches, workspaces, runtimes and jobs as types.
//! - [`layout`]: deterministic, hostile-safe paths under `$GROVE_HOME`.
//! - [`events`]: the event catalogue and its envelope.
//! - [`projection`]: the pure fold from events to projection rows.
//! - [`eviction`]: the eviction policy as pure data: inventory in, ordered plan out.
//! - [`sweep`]: what one eviction sweep did (its report and event payload).
//! - [`commands`]: the job kinds and their payloads.
//! - [`tools`]: the agent tool surface as data (operations, outputs).
//! - [`tool_catalog`]: the tools offered for a workspace, their argument schemas, and
//!   a tool call (name and JSON arguments) to an operation.
//! - [`tool_outputs`]: the schema of each tool's output (MCP `outputSchema`, OpenAPI).
//! - [`ports`]: the traits adapters implement (git, runtimes, optional runtime
//!   capabilities).
//! - [`session`]: interactive sessions as data, and the table providers share.
//! - [`placement`]: runtime kinds, and whether a workspace lives on a node or in a
//!   remote provider.
//! - [`merge_back`]: bringing a task workspace's commits into an edit workspace.
//! - [`platform`]: the git platform port (pull requests, comments) and its types.
//! - [`history`]: workspace history: points, snapshots, the history port.
//! - [`error`]: typed errors of this layer.
//! - [`idempotency`]: command ids derived from callers' idempotency keys.
//! - [`inline`]: reads answered by the receiving process, without the queue (ADR 24).
//! - [`local_repo`]: who may use a local repository URL (the operator's allow-list).
//! - [`fingerprint`]: keyed fingerprints of git tokens (`auth_scope_hash`).
//! - [`identity`]: the unprivileged uid/gid sandboxed commands run as.
//! - [`transfer`]: progress of a clone or fetch, and the handle that watches and stops
//!   one.
//!
//! Architecture invariant: this crate does no IO and knows nothing of sqlx, git2,
//! bollard, reqwest or tokio.

pub mod commands;
pub mod decide;
pub mod error;
pub mod events;
pub mod eviction;
pub mod fingerprint;
pub mod history;
pub mod idempotency;
pub mod identity;
pub mod inline;
pub mod layout;
pub mod local_repo;
pub mod merge_back;
pub mod model;
pub mod placement;
pub mod platform;
pub mod ports;
pub mod projection;
pub mod session;
pub mod state;
pub mod sweep;
pub mod tool_catalog;
pub mod tool_outputs;
pub mod tools;
pub mod transfer;
pub mod validate;
