//! `ToolError`: why a tool operation was refused or failed, and its command-level kind.

use grove_core::error::{CommandError, ErrorKind};

/// A path as shown in a message: at most 200 characters, quoted and escaped.
pub(crate) fn shown(path: &str) -> String {
    let cut: String = path.chars().take(200).collect();
    format!("{cut:?}")
}

/// Failures of the tool surface. Messages name the path relative to the workspace root
/// and never a host path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The path is malformed: absolute, `..`, a NUL byte, too long. Handling: 400 / exit 2.
    #[error("invalid path {}: {reason}", shown(.path))]
    InvalidPath { path: String, reason: &'static str },
    /// The path resolves outside the workspace (through a symlink). Handling: 400 / exit 2.
    #[error("path {} resolves outside the workspace", shown(.path))]
    OutsideRoot { path: String },
    /// Handling: 404 / exit 3.
    #[error("{} does not exist", shown(.path))]
    NotFound { path: String },
    /// `create` of a path that exists. Handling: 409 / exit 4.
    #[error("{} already exists", shown(.path))]
    AlreadyExists { path: String },
    #[error("{} is not a regular file", shown(.path))]
    NotAFile { path: String },
    #[error("{} is not a directory", shown(.path))]
    NotADirectory { path: String },
    /// `str_replace` found no occurrence. Handling: 400 / exit 2; re-read the file.
    #[error("old_str was not found in {}", shown(.path))]
    NoMatch { path: String },
    /// `str_replace` found several. Handling: 400 / exit 2; give more context.
    #[error("old_str occurs {count} times in {} (lines {}); it must occur exactly once", shown(.path), lines_list(.lines))]
    MultipleMatches {
        path: String,
        count: usize,
        lines: Vec<u64>,
    },
    /// A line number beyond the file. Handling: 400 / exit 2.
    #[error("line {line} is out of range: {} has {lines} lines", shown(.path))]
    LineOutOfRange { path: String, line: u64, lines: u64 },
    /// A write tool on a read-only workspace. Handling: 422 / exit 1 (as a write exec).
    #[error("workspace is read-only: {op} is a write tool and is refused")]
    ReadOnly { op: String },
    #[error("{} is too large ({size} bytes; the limit is {limit})", shown(.path))]
    TooLarge { path: String, size: u64, limit: u64 },
    /// Not UTF-8 text where text is edited, a bad pattern or glob. Handling: 400 / exit 2.
    #[error("{0}")]
    InvalidInput(String),
    /// The kernel lacks what safe resolution needs (`openat2`). Handling: 503.
    #[error("unsupported here: {0}")]
    Unsupported(String),
    /// Any other filesystem failure.
    #[error("{} failed for {}: {message}", .what, shown(.path))]
    Io {
        what: &'static str,
        path: String,
        message: String,
    },
}

fn lines_list(lines: &[u64]) -> String {
    let mut out: Vec<String> = lines.iter().take(10).map(u64::to_string).collect();
    if lines.len() > 10 {
        out.push("...".into());
    }
    out.join(", ")
}

impl ToolError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::AlreadyExists { .. } => ErrorKind::Conflict,
            Self::ReadOnly { .. } => ErrorKind::Rejected,
            Self::Unsupported(_) => ErrorKind::Unavailable,
            Self::Io { .. } => ErrorKind::Internal,
            _ => ErrorKind::InvalidInput,
        }
    }
}

impl From<ToolError> for CommandError {
    fn from(e: ToolError) -> Self {
        CommandError::new(e.kind(), e.to_string())
    }
}
