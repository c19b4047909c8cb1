//! A command's trace context across the queue (ADR 30): the caller's span is written as
//! a W3C `traceparent` to the ledger row in the enqueue's transaction
//! (`grove.commands.trace_parent`), and the worker that claims the job makes its spans
//! children of it. Never in the payload or an event: replay stays exact.
//!
//! The libraries name no tracing backend: the binary installs [`Hooks`] when it exports
//! traces, and without them every function here is a no-op and nothing extra is read or
//! written. Spans are `tracing` spans of target [`TARGET`] at TRACE level, so the log
//! does not show them at its usual levels.

use std::sync::OnceLock;
use std::time::SystemTime;

/// The `tracing` target of grove's trace spans.
pub const TARGET: &str = "grove_trace";

/// Records a finished span: under `traceparent`, named, from start to end, with
/// attributes.
pub type RecordFn = fn(&str, &'static str, SystemTime, SystemTime, &[(&'static str, String)]);

/// What the exporting binary supplies.
pub struct Hooks {
    /// The `traceparent` of the current span, if there is one to continue.
    pub current: fn() -> Option<String>,
    /// Makes `span` a child of the remote context in `traceparent`.
    pub adopt: fn(&tracing::Span, &str),
    /// Records a span that already ended, as a child of the remote context in
    /// `traceparent`, with its start, end and attributes.
    pub record: RecordFn,
}

static HOOKS: OnceLock<Hooks> = OnceLock::new();

/// Installs the hooks (once per process; a second call is ignored).
pub fn install(hooks: Hooks) {
    let _ = HOOKS.set(hooks);
}

/// Whether traces are exported by this process.
pub fn enabled() -> bool {
    HOOKS.get().is_some()
}

/// The current span's `traceparent`, when traces are exported.
pub fn current() -> Option<String> {
    HOOKS.get().and_then(|h| (h.current)())
}

/// Makes `span` a child of `traceparent` (a no-op without hooks).
pub fn adopt(span: &tracing::Span, traceparent: &str) {
    if let Some(h) = HOOKS.get() {
        (h.adopt)(span, traceparent);
    }
}

/// Records a finished span under `traceparent` (a no-op without hooks).
pub fn record(
    traceparent: &str,
    name: &'static str,
    start: SystemTime,
    end: SystemTime,
    attributes: &[(&'static str, String)],
) {
    if let Some(h) = HOOKS.get() {
        (h.record)(traceparent, name, start, end, attributes);
    }
}
