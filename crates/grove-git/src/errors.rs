//! Mapping of git2 and IO failures to `GitError`, with messages cut to one line and
//! scrubbed of the token.

use grove_core::error::GitError;
use grove_core::ports::GitToken;

/// Where a git2 error came from: talking to the remote, or working on local files.
/// The same error class means different things in each (an `Os` error while opening a
/// `file://` remote means the remote is missing; locally it is a disk problem).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Remote,
    Local,
}

/// Removes secrets and line breaks from a message that may reach logs or callers.
pub(crate) fn scrub(message: &str, token: Option<&GitToken>) -> String {
    let mut out = message.to_string();
    if let Some(token) = token {
        let secret = token.expose();
        if !secret.is_empty() {
            out = out.replace(secret, "***");
        }
    }
    // One line: libgit2 messages occasionally carry the remote's multi-line output.
    let first = out.lines().map(str::trim).find(|l| !l.is_empty());
    first.unwrap_or("unknown error").to_string()
}

/// Maps a git2 error to the port's error.
pub(crate) fn map_git2(err: &git2::Error, phase: Phase, token: Option<&GitToken>) -> GitError {
    use git2::{ErrorClass as C, ErrorCode as E};
    let msg = scrub(err.message(), token);
    if err.code() == E::Auth {
        return GitError::AuthFailed;
    }
    if err.class() == C::Http && (msg.contains("401") || msg.contains("403")) {
        return GitError::AuthFailed;
    }
    if phase == Phase::Local {
        return GitError::Other(msg);
    }
    match err.class() {
        // Things a local disk or a broken cache produce even while fetching: retrying
        // will not help, so they are not "unavailable".
        C::Odb | C::Index | C::Reference | C::Config | C::Filesystem | C::Checkout | C::Zlib => {
            GitError::Other(msg)
        }
        // Net, Http, Ssl, Ssh, Os (a missing `file://` path), Repository (the remote
        // path is not a repo), Callback, and the rest: the remote is the problem.
        _ => GitError::Unavailable(msg),
    }
}

/// Maps a local IO failure, prefixed with what was being done.
pub(crate) fn map_io(what: &str, err: &std::io::Error) -> GitError {
    GitError::Other(scrub(&format!("{what}: {err}"), None))
}
