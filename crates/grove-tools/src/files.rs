//! The text editor (`view`, `create`, `str_replace`, `insert`) and the file tools
//! (`read_file`, `write_file`, `list_dir`), every path resolved beneath the root.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};

use grove_core::tools::{DirEntry, WrittenFile};
use rustix::fs::{FileType, Mode, OFlags, Stat};
use sha2::{Digest, Sha256};

use crate::error::ToolError;
use crate::path::{io_err, kind_of, lstat_in, RelPath};
use crate::Workspace;

/// Largest file the editor and `read_file` read.
pub const MAX_READ_BYTES: u64 = 8 * 1024 * 1024;
/// Depth of a directory `view`.
pub const VIEW_DEPTH: usize = 2;
/// Most entries a listing returns.
pub const MAX_LISTING: usize = 5_000;

fn is_regular(stat: &Stat) -> bool {
    FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile
}

impl Workspace {
    /// Opens a regular file for reading and returns it with its `stat`. A file with
    /// other hard links is refused: its other names may be outside the workspace.
    fn open_file(&self, path: &RelPath) -> Result<(OwnedFd, Stat), ToolError> {
        if path.is_root() {
            return Err(ToolError::NotAFile { path: ".".into() });
        }
        // Non-blocking, so a FIFO planted at the path cannot hang the worker.
        let fd = self.root.open_beneath(
            path,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
            Mode::empty(),
        )?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| io_err("stat", path.as_str(), e))?;
        check_file(path, &stat)?;
        Ok((fd, stat))
    }

    pub(crate) fn read_bytes(&self, path: &RelPath) -> Result<Vec<u8>, ToolError> {
        let (fd, stat) = self.open_file(path)?;
        let size = stat.st_size as u64;
        if size > MAX_READ_BYTES {
            return Err(ToolError::TooLarge {
                path: path.as_str().into(),
                size,
                limit: MAX_READ_BYTES,
            });
        }
        let mut buf = Vec::with_capacity(size as usize);
        std::fs::File::from(fd)
            .take(MAX_READ_BYTES + 1)
            .read_to_end(&mut buf)
            .map_err(|e| ToolError::Io {
                what: "reading",
                path: path.as_str().into(),
                message: e.to_string(),
            })?;
        Ok(buf)
    }

    fn read_text(&self, path: &RelPath) -> Result<String, ToolError> {
        crate::text::utf8(path.as_str(), self.read_bytes(path)?)
    }

    /// Writes `content` to `path` in place (creating parents when `create_parents`).
    fn write(
        &self,
        path: &RelPath,
        content: &[u8],
        create_new: bool,
        create_parents: bool,
    ) -> Result<WrittenFile, ToolError> {
        let Some((parent, _)) = path.split_last() else {
            return Err(ToolError::NotAFile { path: ".".into() });
        };
        if path.touches_git_dir() {
            return Err(ToolError::InvalidPath {
                path: path.as_str().into(),
                reason: "is inside .git; change the repository with the git tools",
            });
        }
        if create_parents {
            self.root.create_dirs(&parent)?;
        }
        let existing = self.root.stat(path)?;
        if let Some(stat) = &existing {
            if create_new {
                return Err(ToolError::AlreadyExists {
                    path: path.as_str().into(),
                });
            }
            check_file(path, stat)?;
        }
        let mut flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NONBLOCK | OFlags::NOCTTY;
        flags |= if create_new {
            OFlags::EXCL
        } else {
            OFlags::TRUNC
        };
        // The file is written in place, through a descriptor resolved beneath the root:
        // a symlink inside the workspace is written through to its (inside) target.
        let fd = self
            .root
            .open_beneath(path, flags, Mode::from_raw_mode(0o644))?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| io_err("stat", path.as_str(), e))?;
        check_file(path, &stat)?;
        if existing.is_none() {
            self.root.adopt(fd.as_fd(), path.as_str())?;
        }
        let mut file = std::fs::File::from(fd);
        file.write_all(content)
            .and_then(|()| file.flush())
            .map_err(|e| ToolError::Io {
                what: "writing",
                path: path.as_str().into(),
                message: e.to_string(),
            })?;
        Ok(WrittenFile {
            path: path.as_str().to_string(),
            size_bytes: content.len() as u64,
            sha256: hex::encode(Sha256::digest(content)),
            created: existing.is_none(),
        })
    }

    pub fn read_file(&self, path: &str) -> Result<(String, u64), ToolError> {
        let path = RelPath::parse(path)?;
        let bytes = self.read_bytes(&path)?;
        let size = bytes.len() as u64;
        Ok((String::from_utf8_lossy(&bytes).into_owned(), size))
    }

    pub fn write_file(&self, path: &str, content: &str) -> Result<WrittenFile, ToolError> {
        self.require_writable("write_file")?;
        self.write(&RelPath::parse(path)?, content.as_bytes(), false, true)
    }

    pub fn create(&self, path: &str, content: &str) -> Result<WrittenFile, ToolError> {
        self.require_writable("create")?;
        self.write(&RelPath::parse(path)?, content.as_bytes(), true, true)
    }

    pub fn str_replace(
        &self,
        path: &str,
        old_str: &str,
        new_str: &str,
    ) -> Result<WrittenFile, ToolError> {
        self.require_writable("str_replace")?;
        if old_str.is_empty() {
            return Err(ToolError::InvalidInput("old_str must not be empty".into()));
        }
        let path = RelPath::parse(path)?;
        let text = self.read_text(&path)?;
        let out = crate::text::replace_once(path.as_str(), &text, old_str, new_str)?;
        self.write(&path, out.as_bytes(), false, false)
    }

    pub fn insert(
        &self,
        path: &str,
        insert_line: u64,
        text: &str,
    ) -> Result<WrittenFile, ToolError> {
        self.require_writable("insert")?;
        let path = RelPath::parse(path)?;
        let old = self.read_text(&path)?;
        let out = crate::text::insert_after(path.as_str(), &old, insert_line, text)?;
        self.write(&path, out.as_bytes(), false, false)
    }

    /// A file with numbered lines (`range`: 1-based, inclusive, end -1 = to the end), or
    /// a directory listing two levels deep without hidden entries.
    pub fn view(&self, path: &str, range: Option<(u64, i64)>) -> Result<String, ToolError> {
        let rel = RelPath::parse(path)?;
        let stat = self.root.stat(&rel)?.ok_or_else(|| ToolError::NotFound {
            path: rel.as_str().into(),
        })?;
        if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
            if range.is_some() {
                return Err(ToolError::InvalidInput(
                    "a view range applies to files, not directories".into(),
                ));
            }
            let entries = self.walk(&rel, VIEW_DEPTH, false)?;
            return Ok(crate::text::directory_view(
                rel.as_str(),
                VIEW_DEPTH,
                &entries,
            ));
        }
        let bytes = self.read_bytes(&rel)?;
        crate::text::numbered(rel.as_str(), &String::from_utf8_lossy(&bytes), range)
    }

    /// One level of a directory, hidden entries included (`.git` left out).
    pub fn list_dir(&self, path: Option<&str>) -> Result<Vec<DirEntry>, ToolError> {
        let rel = RelPath::parse(path.unwrap_or(""))?;
        self.walk(&rel, 1, true)
    }

    /// Entries under `dir` to `depth` levels, sorted by path. Subdirectories are entered
    /// only when they are directories themselves (a symlink is listed, never followed).
    fn walk(&self, dir: &RelPath, depth: usize, hidden: bool) -> Result<Vec<DirEntry>, ToolError> {
        let mut out = Vec::new();
        let mut stack = vec![(dir.clone(), 1usize)];
        while let Some((at, level)) = stack.pop() {
            let fd =
                self.root
                    .open_beneath(&at, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
            let reader =
                rustix::fs::Dir::read_from(&fd).map_err(|e| io_err("listing", at.as_str(), e))?;
            for entry in reader {
                let entry = entry.map_err(|e| io_err("listing", at.as_str(), e))?;
                let raw = entry.file_name();
                let name = raw.to_string_lossy();
                if name == "." || name == ".." || name == ".git" {
                    continue;
                }
                if !hidden && name.starts_with('.') {
                    continue;
                }
                let Ok(stat) = lstat_in(fd.as_fd(), raw) else {
                    continue;
                };
                let child = at.join(&name);
                let kind = kind_of(&stat);
                if kind == "dir" && level < depth {
                    stack.push((child.clone(), level + 1));
                }
                out.push(DirEntry {
                    path: child.as_str().to_string(),
                    kind: kind.to_string(),
                    size: if kind == "file" {
                        stat.st_size as u64
                    } else {
                        0
                    },
                });
                if out.len() >= MAX_LISTING {
                    break;
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }
}

fn check_file(path: &RelPath, stat: &Stat) -> Result<(), ToolError> {
    if !is_regular(stat) {
        return Err(ToolError::NotAFile {
            path: path.as_str().into(),
        });
    }
    if stat.st_nlink > 1 {
        return Err(ToolError::InvalidPath {
            path: path.as_str().into(),
            reason: "is a file with several hard links (another may be outside the workspace)",
        });
    }
    Ok(())
}
