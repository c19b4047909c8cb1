//! End-to-end tests: the real `grove` binary, real worker processes, real Postgres and git.

mod api;
mod boundary;
mod cli;
mod cli_remote;
mod concurrency;
mod console;
mod console_history;
mod contract;
mod crash;
mod docker;
mod eviction;
mod fencing;
mod folded;
mod history;
mod inline_acquire;
mod inline_reads;
mod inline_writes;
mod input;
mod lifecycle;
mod mcp;
mod mcp_http;
mod merge_back;
mod metrics;
mod progress;
mod pulls;
mod queue;
mod read_lock;
mod reader;
mod recent_use;
mod remote;
mod remote_placement;
mod replay;
mod runtimes;
mod secrets;
mod states;
mod stop;
mod tools;
mod tools_http;
mod traces;

// The loopback fakes of the remote providers, shared with the adapters' own tests.
#[allow(dead_code)]
#[path = "../../crates/grove-daytona/tests/daytona/fake.rs"]
mod daytona_fake;
#[allow(dead_code)]
#[path = "../../crates/grove-e2b/tests/e2b/fake.rs"]
mod e2b_fake;

/// Skips the test (with the reason printed by `TestEnv::new`) when no database is set.
#[macro_export]
macro_rules! env_or_skip {
    ($name:expr) => {
        match grove_e2e::TestEnv::new($name).await {
            Some(env) => env,
            None => return,
        }
    };
}
