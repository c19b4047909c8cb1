//! grove-sandboxd: the exec agent that runs inside a sandbox, and its protocol.
//!
//! A runtime starts the agent once inside its sandbox (bubblewrap's namespaces for the
//! local runtime) and then sends it exec requests over the agent's stdin, reading
//! output and exit statuses from its stdout. An exec then costs a fork/exec and a
//! pipe round trip instead of building a sandbox. This crate is the agent, the frames
//! both sides share and (feature `host`) the agent's client, which the runtime crates
//! drive over their own transports (spawning, restarts and pools stay theirs). See
//! `docs/adr/18-exec-agent.md`.
//!
//! # Layout
//!
//! - [`protocol`]: frames, requests and events.
//! - [`agent`]: the agent's loop (the `grove-sandboxd` binary calls
//!   [`agent::run_stdio`]).
//! - `host` (feature `host`): the client of a running agent over any transport, the
//!   exec stream of a host runtime, and where a workspace appears inside a sandbox.

pub mod agent;
#[cfg(feature = "host")]
pub mod host;
pub mod protocol;
