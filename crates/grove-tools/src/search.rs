//! `search`: ripgrep-like line matches over the working tree. The `ignore` crate walks
//! (gitignore rules, glob overrides, `.git` skipped); every file is then read through
//! the root descriptor, so a directory swapped for a symlink mid-walk reads nothing
//! outside the workspace.

use grove_core::tools::{SearchHit, DEFAULT_SEARCH_HITS};
use ignore::overrides::OverrideBuilder;
use ignore::WalkBuilder;
use regex::bytes::RegexBuilder;
use rustix::fs::FileType;

use crate::error::ToolError;
use crate::path::RelPath;
use crate::Workspace;

/// Files larger than this are not searched (generated or data files, usually).
pub const MAX_SEARCH_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// A file with a NUL byte in its first this-many bytes is binary and skipped.
const BINARY_PROBE: usize = 8 * 1024;
/// Longest line text returned per hit.
pub const MAX_HIT_CHARS: usize = 1_000;

/// The line matcher of a search: `pattern` as a regular expression or a literal.
pub fn matcher(
    pattern: &str,
    regex: bool,
    case_sensitive: bool,
) -> Result<regex::bytes::Regex, ToolError> {
    let source = if regex {
        pattern.to_string()
    } else {
        regex::escape(pattern)
    };
    RegexBuilder::new(&source)
        .case_insensitive(!case_sensitive)
        .size_limit(16 * 1024 * 1024)
        .build()
        .map_err(|e| {
            ToolError::InvalidInput(format!("invalid pattern: {}", one_line(&e.to_string())))
        })
}

/// What to search for, and where.
#[derive(Debug, Clone, Default)]
pub struct SearchQuery<'a> {
    pub pattern: &'a str,
    pub regex: bool,
    pub case_sensitive: bool,
    pub globs: &'a [String],
    pub path: Option<&'a str>,
    pub max_results: Option<usize>,
}

impl Workspace {
    /// Hits sorted by path then line, at most `max_results`; the flag says more exist.
    pub fn search(&self, q: &SearchQuery<'_>) -> Result<(Vec<SearchHit>, bool), ToolError> {
        let matcher = matcher(q.pattern, q.regex, q.case_sensitive)?;
        let max = q.max_results.unwrap_or(DEFAULT_SEARCH_HITS).max(1);
        let start = RelPath::parse(q.path.unwrap_or(""))?;
        // The start must resolve inside the root before anything walks it.
        if self.root.stat(&start)?.is_none() {
            return Err(ToolError::NotFound {
                path: start.as_str().into(),
            });
        }
        let mut walk = WalkBuilder::new(self.root_path.join(start.as_str()));
        walk.hidden(false)
            .parents(false)
            .git_global(false)
            .require_git(false)
            .follow_links(false)
            .sort_by_file_path(|a, b| a.cmp(b))
            .filter_entry(|e| e.file_name() != ".git");
        if !q.globs.is_empty() {
            let mut overrides = OverrideBuilder::new(&self.root_path);
            for g in q.globs {
                overrides.add(g).map_err(|e| {
                    ToolError::InvalidInput(format!(
                        "invalid glob {g:?}: {}",
                        one_line(&e.to_string())
                    ))
                })?;
            }
            walk.overrides(overrides.build().map_err(|e| {
                ToolError::InvalidInput(format!("invalid glob: {}", one_line(&e.to_string())))
            })?);
        }
        let mut hits = Vec::new();
        for entry in walk.build() {
            let Ok(entry) = entry else { continue };
            if !entry.file_type().is_some_and(|t| t.is_file()) {
                continue;
            }
            let Ok(rel) = entry.path().strip_prefix(&self.root_path) else {
                continue;
            };
            let Some(rel) = rel.to_str().and_then(|r| RelPath::parse(r).ok()) else {
                continue;
            };
            let Some(bytes) = self.searchable(&rel) else {
                continue;
            };
            for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                if !matcher.is_match(line) {
                    continue;
                }
                if hits.len() == max {
                    return Ok((hits, true));
                }
                hits.push(SearchHit {
                    path: rel.as_str().to_string(),
                    line: i as u64 + 1,
                    text: String::from_utf8_lossy(line)
                        .chars()
                        .take(MAX_HIT_CHARS)
                        .collect(),
                });
            }
        }
        Ok((hits, false))
    }

    /// The content of a file worth searching: regular, small enough, not binary.
    fn searchable(&self, rel: &RelPath) -> Option<Vec<u8>> {
        let stat = self.root.stat(rel).ok()??;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile
            || stat.st_size as u64 > MAX_SEARCH_FILE_BYTES
        {
            return None;
        }
        let bytes = self.read_bytes(rel).ok()?;
        if bytes[..bytes.len().min(BINARY_PROBE)].contains(&0) {
            return None;
        }
        Some(bytes)
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
