//! Integration tests of the git2 adapter against fixture repos built with the git CLI.

mod attacks;
mod cache;
mod checkout;
mod history;
mod history_ignored;
mod merge;
mod preserve;
mod saved;
mod support;
mod transport;
mod watch;
mod workdir;
