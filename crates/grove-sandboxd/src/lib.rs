//! grove-sandboxd: the exec agent that runs inside a sandbox, and its protocol.
//!
//! A runtime starts the agent once inside its sandbox (bubblewrap's namespaces for the
//! local runtime) and then sends it exec requests over the agent's stdin, reading
//! output and exit statuses from its stdout. An exec then costs a fork/exec and a
//! pipe round trip instead of building a sandbox. The runtime side (spawning,
//! multiplexing, timeouts, restarts) lives in the runtime crates; this crate is the
//! agent and the frames both sides share. See `docs/adr/18-exec-agent.md`.
//!
//! # Layout
//!
//! - [`protocol`]: frames, requests and events.
//! - [`agent`]: the agent's loop (the `grove-sandboxd` binary calls
//!   [`agent::run_stdio`]).

pub mod agent;
pub mod protocol;
