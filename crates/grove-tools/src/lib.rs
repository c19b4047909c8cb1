//! grove-tools: the agent tool surface on one workspace directory — the text editor,
//! file tools and search — with every path validated against the workspace root.
//!
//! # Layout
//! - [`path`]: lexical checks ([`RelPath`]) and kernel-enforced resolution beneath the
//!   root ([`Root`], `openat2` with `RESOLVE_BENEATH`).
//! - `files`: `view`, `create`, `str_replace`, `insert`, `read_file`, `write_file`,
//!   `list_dir`.
//! - `search`: line matches over the working tree.
//! - [`text`]: the editor's pure text transforms (replace, insert, numbered view),
//!   shared with the workers' path for workspaces inside a remote provider.
//! - [`error`]: [`ToolError`] and its command-level kind.
//!
//! The catalogue of tools offered for a workspace's capabilities is
//! `grove_core::tool_catalog` (the API and the MCP server use it without this crate).
//!
//! The git tools are not here: workers reach git only through `GitPort` (`grove-git`);
//! [`Workspace::check_paths`] validates the paths they are given.
//!
//! Architecture invariant: nothing outside the root is read or written — every open
//! goes through [`Root::open_beneath`]. The crate knows nothing of Postgres, queues or
//! git, and its calls are blocking (workers run them with `spawn_blocking`).

pub mod error;
mod files;
pub mod path;
mod rules;
mod search;
pub mod text;

use std::path::{Path, PathBuf};

use grove_core::tools::{ToolOp, ToolOutput, WrittenFile};

pub use error::ToolError;
pub use files::{MAX_LISTING, MAX_READ_BYTES, VIEW_DEPTH};
pub use path::{RelPath, Root};
pub use search::{matcher, SearchQuery, MAX_HIT_CHARS, MAX_SEARCH_DEPTH, MAX_SEARCH_FILE_BYTES};

/// One workspace directory, opened for tool operations.
#[derive(Debug)]
pub struct Workspace {
    root: Root,
    root_path: PathBuf,
    writable: bool,
}

impl Workspace {
    /// Opens the workspace at `dir` (a trusted path from the workspace's record).
    /// `writable: false` refuses every write tool with [`ToolError::ReadOnly`].
    pub fn open(dir: &Path, writable: bool) -> Result<Self, ToolError> {
        Ok(Self {
            root: Root::open(dir)?,
            root_path: dir.to_path_buf(),
            writable,
        })
    }

    fn require_writable(&self, op: &str) -> Result<(), ToolError> {
        if self.writable {
            Ok(())
        } else {
            Err(ToolError::ReadOnly { op: op.to_string() })
        }
    }

    /// Validates paths handed to the git tools: lexically, and that each resolves (or,
    /// for a deleted file, its absence is) beneath the root. Returns them normalized;
    /// a list naming the root itself becomes the empty list (everything).
    pub fn check_paths(&self, paths: &[String]) -> Result<Vec<String>, ToolError> {
        let checked: Vec<String> = paths
            .iter()
            .map(|p| {
                let rel = RelPath::parse(p)?;
                if rel.touches_git_dir() {
                    return Err(ToolError::InvalidPath {
                        path: p.clone(),
                        reason: "is inside .git",
                    });
                }
                match self.root.stat(&rel) {
                    Ok(_) | Err(ToolError::NotADirectory { .. }) => {}
                    Err(e) => return Err(e),
                }
                Ok(rel.as_str().to_string())
            })
            .collect::<Result<_, _>>()?;
        if checked.iter().any(String::is_empty) {
            return Ok(Vec::new());
        }
        Ok(checked)
    }

    /// Runs a file or search operation. Git operations are refused here (they go
    /// through `GitPort`); write operations on a read-only workspace are refused.
    pub fn run(&self, op: &ToolOp) -> Result<ToolOutput, ToolError> {
        if op.is_write() {
            self.require_writable(op.name())?;
        }
        let written = |w: WrittenFile| ToolOutput::Written(w);
        Ok(match op {
            ToolOp::View { path, range } => ToolOutput::Text {
                text: self.view(path, *range)?,
            },
            ToolOp::Create { path, content } => written(self.create(path, content)?),
            ToolOp::StrReplace {
                path,
                old_str,
                new_str,
            } => written(self.str_replace(path, old_str, new_str)?),
            ToolOp::Insert {
                path,
                insert_line,
                text,
            } => written(self.insert(path, *insert_line, text)?),
            ToolOp::ReadFile { path } => {
                let (content, size_bytes) = self.read_file(path)?;
                ToolOutput::File {
                    path: RelPath::parse(path)?.as_str().to_string(),
                    content,
                    size_bytes,
                }
            }
            ToolOp::WriteFile { path, content } => written(self.write_file(path, content)?),
            ToolOp::ListDir { path } => ToolOutput::Dir {
                entries: self.list_dir(path.as_deref())?,
            },
            ToolOp::Search {
                pattern,
                regex,
                case_sensitive,
                glob,
                path,
                max_results,
            } => {
                let (hits, truncated) = self.search(&SearchQuery {
                    pattern,
                    regex: *regex,
                    case_sensitive: *case_sensitive,
                    globs: glob,
                    path: path.as_deref(),
                    max_results: *max_results,
                })?;
                ToolOutput::Search { hits, truncated }
            }
            other => {
                return Err(ToolError::InvalidInput(format!(
                    "{} is a git tool; it runs through the git port",
                    other.name()
                )))
            }
        })
    }
}
