//! `search`: ripgrep-like line matches over the working tree. The walk goes by
//! descriptors (each directory opened relative to its parent, each file relative to its
//! directory, never following a link), so a directory swapped for a symlink mid-walk
//! reads nothing outside the workspace; gitignore rules and glob overrides leave paths
//! out, `.git` is skipped.

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use grove_core::tools::{SearchHit, DEFAULT_SEARCH_HITS};
use ignore::overrides::{Override, OverrideBuilder};
use ignore::Match;
use regex::bytes::{Regex, RegexBuilder};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::error::ToolError;
use crate::path::RelPath;
use crate::rules::{self, Rules};
use crate::Workspace;

/// Files larger than this are not searched (generated or data files, usually).
pub const MAX_SEARCH_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// Directories deeper than this below the search's start are not searched.
pub const MAX_SEARCH_DEPTH: usize = 256;
/// A file with a NUL byte in its first this-many bytes is binary and skipped.
const BINARY_PROBE: usize = 8 * 1024;
/// Longest line text returned per hit.
pub const MAX_HIT_CHARS: usize = 1_000;

/// The line matcher of a search: `pattern` as a regular expression or a literal.
pub fn matcher(pattern: &str, regex: bool, case_sensitive: bool) -> Result<Regex, ToolError> {
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

/// Where and what one search looks for, and what it found so far.
struct Search<'q> {
    matcher: Regex,
    /// The pattern over a whole file (lines as `^`/`$` boundaries), when a file without
    /// a match for it surely has no matching line: most files are dismissed by one
    /// scan of their bytes instead of one match per line.
    whole: Option<Regex>,
    overrides: Option<Override>,
    rules: Rules,
    root_path: &'q std::path::Path,
    max: usize,
    hits: Vec<SearchHit>,
    truncated: bool,
}

impl Workspace {
    /// Hits sorted by path then line, at most `max_results`; the flag says more exist.
    ///
    /// The walk holds a descriptor per directory and opens each entry relative to it
    /// without following links (a symlink is neither searched nor entered); `.git` is
    /// skipped at every depth; ignore rules come from [`Rules`] (read by descriptor).
    pub fn search(&self, q: &SearchQuery<'_>) -> Result<(Vec<SearchHit>, bool), ToolError> {
        let start = RelPath::parse(q.path.unwrap_or(""))?;
        // The start must resolve inside the root before anything walks it.
        if self.root.stat(&start)?.is_none() {
            return Err(ToolError::NotFound {
                path: start.as_str().into(),
            });
        }
        let root = rules::open_dir(self.root.fd(), ".")
            .ok_or_else(|| ToolError::NotFound { path: ".".into() })?;
        let mut search = Search {
            matcher: matcher(q.pattern, q.regex, q.case_sensitive)?,
            whole: whole_file_matcher(q),
            overrides: overrides(&self.root_path, q.globs)?,
            rules: Rules::at_root(root.as_fd(), &self.root_path),
            root_path: &self.root_path,
            max: q.max_results.unwrap_or(DEFAULT_SEARCH_HITS).max(1),
            hits: Vec::new(),
            truncated: false,
        };
        search.start(root, start.as_str());
        Ok((search.hits, search.truncated))
    }
}

impl Search<'_> {
    /// Walks down to `start` (reading the rules of each directory on the way), then
    /// searches it: a file alone, a directory recursively.
    fn start(&mut self, root: OwnedFd, start: &str) {
        let mut dir = root;
        let mut at = String::new();
        self.rules.push(dir.as_fd(), "", self.root_path);
        let names: Vec<&str> = start.split('/').filter(|n| !n.is_empty()).collect();
        for (i, name) in names.iter().enumerate() {
            let path = join(&at, name);
            if i + 1 == names.len() && self.is_file(dir.as_fd(), name) {
                self.file(dir.as_fd(), name, path);
                return;
            }
            let Some(next) = rules::open_dir(dir.as_fd(), name) else {
                return;
            };
            self.rules
                .push(next.as_fd(), &path, &self.root_path.join(&path));
            (dir, at) = (next, path);
        }
        self.dir(dir.as_fd(), &at, 0);
    }

    fn is_file(&self, dir: BorrowedFd<'_>, name: &str) -> bool {
        rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
    }

    /// Searches the entries of `dir` (at `at`) in name order, depth first.
    /// `depth`: directories above this one below the start; one deeper than
    /// [`MAX_SEARCH_DEPTH`] is not entered (a tree nested a hundred thousand deep must
    /// not exhaust the walking thread's stack).
    fn dir(&mut self, dir: BorrowedFd<'_>, at: &str, depth: usize) {
        for (name, kind) in entries(dir) {
            if self.truncated {
                return;
            }
            if name == ".git" {
                continue;
            }
            let path = join(at, &name);
            let is_dir = kind == FileType::Directory;
            if !is_dir && kind != FileType::RegularFile || self.excluded(&path, is_dir) {
                continue;
            }
            if !is_dir {
                self.file(dir, &name, path);
                continue;
            }
            if depth >= MAX_SEARCH_DEPTH {
                continue;
            }
            let Some(child) = rules::open_dir(dir, &name) else {
                continue;
            };
            let pushed = self
                .rules
                .push(child.as_fd(), &path, &self.root_path.join(&path));
            self.dir(child.as_fd(), &path, depth + 1);
            if pushed {
                self.rules.pop();
            }
        }
    }

    /// Whether the globs or the ignore rules leave `path` out (a glob that names it
    /// wins over the rules).
    fn excluded(&self, path: &str, is_dir: bool) -> bool {
        if let Some(o) = &self.overrides {
            match o.matched(path, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
        self.rules.ignored(path, is_dir)
    }

    /// Adds the hits of the file `name` in `dir` (at `path`).
    fn file(&mut self, dir: BorrowedFd<'_>, name: &str, path: String) {
        let Some(bytes) = searchable(dir, name) else {
            return;
        };
        if self.whole.as_ref().is_some_and(|w| !w.is_match(&bytes)) {
            return;
        }
        for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if !self.matcher.is_match(line) {
                continue;
            }
            if self.hits.len() == self.max {
                self.truncated = true;
                return;
            }
            self.hits.push(SearchHit {
                path: path.clone(),
                line: i as u64 + 1,
                text: String::from_utf8_lossy(line)
                    .chars()
                    .take(MAX_HIT_CHARS)
                    .collect(),
            });
        }
    }
}

/// The names and kinds of `dir`'s entries (no `.`, `..`), sorted by name; a kind the
/// directory does not report is read with `lstat`.
fn entries(dir: BorrowedFd<'_>) -> Vec<(String, FileType)> {
    let Ok(mut listing) = rustix::fs::Dir::read_from(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    while let Some(Ok(entry)) = listing.read() {
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        let kind = match entry.file_type() {
            FileType::Unknown => match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => FileType::from_raw_mode(st.st_mode),
                Err(_) => continue,
            },
            kind => kind,
        };
        out.push((name.to_string(), kind));
    }
    out.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    out
}

fn join(at: &str, name: &str) -> String {
    if at.is_empty() {
        name.to_string()
    } else {
        format!("{at}/{name}")
    }
}

/// The content of a file worth searching: regular (opened without following a link or
/// blocking), with one name only, small enough, not binary.
fn searchable(dir: BorrowedFd<'_>, name: &str) -> Option<Vec<u8>> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
    let fd = rustix::fs::openat(dir, name, flags | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let stat = rustix::fs::fstat(&fd).ok()?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile
        || stat.st_nlink > 1
        || stat.st_size as u64 > MAX_SEARCH_FILE_BYTES
    {
        return None;
    }
    let mut bytes = Vec::with_capacity(stat.st_size as usize);
    std::fs::File::from(fd)
        .take(MAX_SEARCH_FILE_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes[..bytes.len().min(BINARY_PROBE)].contains(&0) {
        return None;
    }
    Some(bytes)
}

/// The whole-file form of the query's pattern: a literal as is; a regular expression
/// with `^` and `$` at line boundaries, unless it names the text's own start or end or
/// sets its own flags (then every line is matched on its own).
fn whole_file_matcher(q: &SearchQuery<'_>) -> Option<Regex> {
    let source = if q.regex {
        if ["\\A", "\\z", "(?"].iter().any(|s| q.pattern.contains(s)) {
            return None;
        }
        q.pattern.to_string()
    } else {
        regex::escape(q.pattern)
    };
    RegexBuilder::new(&source)
        .case_insensitive(!q.case_sensitive)
        .multi_line(true)
        .crlf(true)
        .size_limit(16 * 1024 * 1024)
        .build()
        .ok()
}

fn overrides(root: &std::path::Path, globs: &[String]) -> Result<Option<Override>, ToolError> {
    if globs.is_empty() {
        return Ok(None);
    }
    let mut builder = OverrideBuilder::new(root);
    for g in globs {
        builder.add(g).map_err(|e| {
            ToolError::InvalidInput(format!("invalid glob {g:?}: {}", one_line(&e.to_string())))
        })?;
    }
    let built = builder.build().map_err(|e| {
        ToolError::InvalidInput(format!("invalid glob: {}", one_line(&e.to_string())))
    })?;
    Ok(Some(built))
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
