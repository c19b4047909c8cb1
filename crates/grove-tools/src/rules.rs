//! Ignore rules for `search`, read by descriptor: a directory's `.gitignore` and
//! `.ignore`, and the root's `.git/info/exclude`, each opened relative to the
//! directory's descriptor without following a link and without blocking, and used only
//! when it is a regular file. A rule file that is a symlink (to a host file, whose
//! lines would otherwise become rules and tell an agent whether a guessed line is in
//! it), a FIFO (which would block the walk) or anything else is treated as absent.

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::Match;
use rustix::fs::{FileType, Mode, OFlags};

/// A rule file larger than this is not read (treated as absent).
const MAX_RULE_FILE_BYTES: u64 = 1 << 20;

const RULE_FILE: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);

/// The rules of one directory, most specific file first (`.ignore` wins over
/// `.gitignore`, as ripgrep has it).
struct DirRules {
    /// The directory, relative to the workspace root ("" for the root).
    dir: String,
    matchers: Vec<Gitignore>,
}

/// The rules in force at a point of the walk: those of every directory from the root
/// down to the one being walked, plus the root's `.git/info/exclude`.
#[derive(Default)]
pub(crate) struct Rules {
    stack: Vec<DirRules>,
    exclude: Option<Gitignore>,
}

impl Rules {
    /// Starts with the root's `.git/info/exclude` (when `.git` is a real directory).
    pub(crate) fn at_root(root: BorrowedFd<'_>, root_path: &Path) -> Self {
        let exclude = open_dir(root, ".git")
            .and_then(|git| open_dir(git.as_fd(), "info"))
            .and_then(|info| matcher(info.as_fd(), "exclude", root_path));
        Self {
            stack: Vec::new(),
            exclude,
        }
    }

    /// Reads the rule files of the directory `dir` (open as `fd`, at `dir_path` on
    /// disk); returns whether it had any (then [`Rules::pop`] when leaving it).
    pub(crate) fn push(&mut self, fd: BorrowedFd<'_>, dir: &str, dir_path: &Path) -> bool {
        let matchers: Vec<Gitignore> = [".ignore", ".gitignore"]
            .into_iter()
            .filter_map(|name| matcher(fd, name, dir_path))
            .collect();
        if matchers.is_empty() {
            return false;
        }
        self.stack.push(DirRules {
            dir: dir.to_string(),
            matchers,
        });
        true
    }

    pub(crate) fn pop(&mut self) {
        self.stack.pop();
    }

    /// Whether `path` (relative to the root) is ignored: the deepest directory whose
    /// rules say anything decides; `.git/info/exclude` last.
    pub(crate) fn ignored(&self, path: &str, is_dir: bool) -> bool {
        for level in self.stack.iter().rev() {
            let Some(rel) = beneath(&level.dir, path) else {
                continue;
            };
            for m in &level.matchers {
                match m.matched(rel, is_dir) {
                    Match::Ignore(_) => return true,
                    Match::Whitelist(_) => return false,
                    Match::None => {}
                }
            }
        }
        self.exclude
            .as_ref()
            .is_some_and(|m| m.matched(path, is_dir).is_ignore())
    }
}

/// `path` relative to `dir` (both relative to the root), when it lies beneath it.
fn beneath<'p>(dir: &str, path: &'p str) -> Option<&'p str> {
    if dir.is_empty() {
        return Some(path);
    }
    path.strip_prefix(dir)?.strip_prefix('/')
}

/// A subdirectory of `parent`, opened without following a link.
pub(crate) fn open_dir(parent: BorrowedFd<'_>, name: &str) -> Option<std::os::fd::OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(parent, name, flags, Mode::empty()).ok()
}

/// The rules of the file `name` in `dir`, when it is a regular file of sane size.
fn matcher(dir: BorrowedFd<'_>, name: &str, dir_path: &Path) -> Option<Gitignore> {
    let fd = rustix::fs::openat(dir, name, RULE_FILE, Mode::empty()).ok()?;
    let stat = rustix::fs::fstat(&fd).ok()?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile
        || stat.st_size as u64 > MAX_RULE_FILE_BYTES
    {
        return None;
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_RULE_FILE_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    let mut builder = GitignoreBuilder::new(dir_path);
    for line in String::from_utf8_lossy(&bytes).lines() {
        // A line that is not a valid glob is skipped, as git skips it.
        let _ = builder.add_line(None, line);
    }
    builder.build().ok()
}
