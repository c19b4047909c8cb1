//! grove-postgres: the Postgres adapters of grove.
//!
//! # Layout
//! - [`migrate`]: apalis' schema and grove's schema under one `grove migrate`.
//! - [`rows`]: reading and writing projection rows (live schema or a replay scratch schema).
//! - [`store`]: appending events and updating projections in one transaction.
//! - [`queue`]: the command ledger and job rows: enqueue, claim, complete, retry, recover.
//! - [`locks`]: advisory locks held across workers for the length of an effect.
//! - [`output`]: the output relay of streaming execs (worker appends, servers read).
//! - [`progress`]: progress of a running clone or fetch on its ledger row.
//! - [`reader`]: reading and following the event log in commit-safe order.
//! - [`replay`]: rebuilding the projections from the log and diffing them.
//! - [`submit`]: what a waiting caller does: route, enqueue, wait for the outcome.
//! - [`console`]: the operator console's bounded reads (fleet, pages, timeline, log).
//! - [`console_actions`]: the console's commands, enqueued with who asked for them.
//! - [`fleet`]: the gauges `/metrics` reads at scrape time (queues, workers, states).
//! - [`telemetry`]: the queue's Prometheus instruments (jobs, durations, lock waits).
//! - [`trace_context`]: a command's trace context across the queue (hooks the binary installs).
//! - [`boundary`]: operator grants for local repository URLs, the fingerprint secret.
//!
//! Architecture invariant: no function here holds a transaction open while it waits on
//! anything but Postgres; effects (git, processes) happen between transactions.

pub mod api_queries;
pub mod boundary;
pub mod console;
pub mod console_actions;
pub mod error;
pub mod fleet;
pub mod folded;
pub mod history;
pub mod locks;
pub mod migrate;
pub mod output;
pub mod progress;
pub mod queue;
pub mod read_lock;
pub mod reader;
pub mod replay;
pub mod rows;
pub mod store;
pub mod submit;
pub mod telemetry;
pub mod trace_context;
pub mod worker_queries;

pub use error::StoreError;

/// Marks SQL built with `format!` as reviewed. Only for text assembled from this crate's
/// own constants and generated identifiers (schema names, column lists), never from
/// caller input: values always travel as bind parameters.
pub(crate) fn trusted(sql: String) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(sql)
}
