//! The `grove-sandboxd` binary: the exec agent, speaking the protocol on stdin/stdout.

fn main() {
    std::process::exit(grove_sandboxd::agent::run_stdio());
}
