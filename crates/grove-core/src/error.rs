//! Typed errors of the domain layer: git, runtimes, and the command-level error callers see.

use serde::{Deserialize, Serialize};

use crate::validate::ValidationError;

/// Failures of the git adapter. Messages never contain credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GitError {
    /// The remote refused the credentials (or asked for some). Handling: do not retry.
    #[error("authentication to the repository failed")]
    AuthFailed,
    /// The ref does not exist in the cache. Handling: do not retry; report 404/exit 3.
    #[error("ref {0:?} not found in the repo cache")]
    RefNotFound(String),
    /// The remote could not be reached or the clone broke off. Handling: retry with backoff.
    #[error("repository unavailable: {0}")]
    Unavailable(String),
    /// The remote refused an update (not a fast-forward, or a stale lease). Handling:
    /// do not retry as-is; fetch, look, decide (409 / exit 4).
    #[error("push rejected: {0}")]
    Rejected(String),
    /// A commit was asked for but nothing (of the given paths) changed. Handling: 422.
    #[error("nothing to commit")]
    NothingToCommit,
    /// The request does not fit the repository (a detached HEAD to push, a path that is
    /// not in it). Handling: do not retry; 400 / exit 2.
    #[error("{0}")]
    InvalidInput(String),
    /// A local filesystem or repository failure.
    #[error("git failed: {0}")]
    Other(String),
    /// The workspace's git directory is shaped to redirect host-side git (a `.git` file
    /// or symlink, a `commondir`, a forbidden config key for the git CLI). Handling:
    /// do not retry; nothing was read or changed (rejected).
    #[error("refused: {0}")]
    Untrusted(String),
    /// A clone or fetch ran past its time budget (`GROVE_GIT_TRANSFER_TIMEOUT_SECS`),
    /// or the disk filled up. Handling: do not retry as-is (it would hit the same
    /// limit); 429 / exit 1 with `resource_limit`.
    #[error("resource limit: {0}")]
    ResourceLimit(String),
    /// The caller stopped the clone or fetch (its job was cancelled or its worker is
    /// stopping); git was killed with its process group. Handling: retry later.
    #[error("git transfer cancelled")]
    Cancelled,
}

impl GitError {
    /// Whether retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Cancelled)
    }
}

/// Failures of a runtime, the seed's sandbox error set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    #[error("runtime not found: {0}")]
    NotFound(String),
    #[error("runtime refused the credentials: {0}")]
    Unauthorized(String),
    #[error("runtime timed out: {0}")]
    Timeout(String),
    #[error("runtime conflict: {0}")]
    Conflict(String),
    /// The runtime cannot serve this request here. Handling: 503; another runtime may.
    #[error("runtime unavailable: {0}")]
    Unavailable(String),
    /// A memory, pid or disk limit was hit. Handling: 429/507; do not retry as-is.
    #[error("resource limit: {0}")]
    ResourceLimit(String),
    /// The runtime refuses this command (e.g. a write on a read-only runtime).
    #[error("command rejected: {0}")]
    CommandRejected(String),
}

/// The kind of a failed command, stable for the CLI (exit codes) and the API (statuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Exit 2, HTTP 400.
    InvalidInput,
    /// Exit 3, HTTP 404.
    NotFound,
    /// Exit 4, HTTP 409.
    Conflict,
    /// The worker running the command died; the command was not re-run. Exit 1.
    WorkerLost,
    /// Exit 1, HTTP 401/403.
    AuthFailed,
    /// Exit 1, HTTP 429.
    ResourceLimit,
    /// Exit 1, HTTP 503.
    Unavailable,
    /// Exit 1, HTTP 422.
    Rejected,
    /// Exit 1, HTTP 500.
    Internal,
}

impl ErrorKind {
    pub fn exit_code(self) -> i32 {
        match self {
            Self::InvalidInput => 2,
            Self::NotFound => 3,
            Self::Conflict => 4,
            _ => 1,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidInput => "invalid_input",
            Self::NotFound => "not_found",
            Self::Conflict => "conflict",
            Self::WorkerLost => "worker_lost",
            Self::AuthFailed => "auth_failed",
            Self::ResourceLimit => "resource_limit",
            Self::Unavailable => "unavailable",
            Self::Rejected => "rejected",
            Self::Internal => "internal",
        }
    }
}

/// The failure of a command as recorded in the ledger and shown to the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct CommandError {
    pub kind: ErrorKind,
    /// One line, free of secrets and of host paths outside the workspace.
    pub message: String,
    /// Whether a later attempt of the same job may succeed (used by the retry policy).
    #[serde(default)]
    pub transient: bool,
    /// Workspace-relative paths the failure is about (a merge-back's conflicting paths);
    /// empty for most errors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
}

impl CommandError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        let message: String = message.into();
        Self {
            kind,
            message: message.lines().next().unwrap_or("").to_string(),
            transient: false,
            paths: Vec::new(),
        }
    }
    /// The same error, naming the paths it is about.
    pub fn with_paths(mut self, paths: Vec<String>) -> Self {
        self.paths = paths;
        self
    }
    pub fn transient(mut self) -> Self {
        self.transient = true;
        self
    }
}

impl From<ValidationError> for CommandError {
    fn from(e: ValidationError) -> Self {
        Self::new(ErrorKind::InvalidInput, e.to_string())
    }
}

impl From<GitError> for CommandError {
    fn from(e: GitError) -> Self {
        let kind = match &e {
            GitError::AuthFailed => ErrorKind::AuthFailed,
            GitError::RefNotFound(_) => ErrorKind::NotFound,
            GitError::Unavailable(_) => ErrorKind::Unavailable,
            GitError::Rejected(_) => ErrorKind::Conflict,
            GitError::NothingToCommit => ErrorKind::Rejected,
            GitError::InvalidInput(_) => ErrorKind::InvalidInput,
            GitError::Other(_) => ErrorKind::Internal,
            GitError::Untrusted(_) => ErrorKind::Rejected,
            GitError::ResourceLimit(_) => ErrorKind::ResourceLimit,
            GitError::Cancelled => ErrorKind::Unavailable,
        };
        let err = Self::new(kind, e.to_string());
        if e.is_transient() {
            err.transient()
        } else {
            err
        }
    }
}

impl From<RuntimeError> for CommandError {
    fn from(e: RuntimeError) -> Self {
        let kind = match &e {
            RuntimeError::NotFound(_) => ErrorKind::NotFound,
            RuntimeError::Unauthorized(_) => ErrorKind::AuthFailed,
            RuntimeError::Timeout(_) | RuntimeError::Unavailable(_) => ErrorKind::Unavailable,
            RuntimeError::Conflict(_) => ErrorKind::Conflict,
            RuntimeError::ResourceLimit(_) => ErrorKind::ResourceLimit,
            RuntimeError::CommandRejected(_) => ErrorKind::Rejected,
        };
        Self::new(kind, e.to_string())
    }
}
