//! The host side of the agent (feature `host`), shared by the runtimes that run it:
//! the agent's client over any transport, the exec stream every host exec returns,
//! and where a workspace appears inside a sandbox.
//!
//! - [`client`]: one agent's client (routing, stdin, timeouts, kills) over a
//!   transport the runtime supplies (a container's attached exec, a process's pipes).
//! - [`stream`]: the consumer's end of an exec, the kill when it is dropped early,
//!   and the output budget.
//! - [`workdir`]: mounts checked, the workspace placed inside, a request's cwd
//!   resolved.

pub mod client;
pub mod stream;
pub mod workdir;
