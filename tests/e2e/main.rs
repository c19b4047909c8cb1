//! End-to-end tests: the real `grove` binary, real worker processes, real Postgres and git.

mod api;
mod concurrency;
mod crash;
mod docker;
mod eviction;
mod input;
mod lifecycle;
mod mcp;
mod merge_back;
mod pulls;
mod queue;
mod reader;
mod remote;
mod replay;
mod runtimes;
mod secrets;
mod tools;
mod tools_http;

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
