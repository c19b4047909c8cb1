//! Adding a working-tree file to the store's index without trusting the path: each
//! directory on the way is opened with `O_NOFOLLOW` relative to the one before, from
//! the workspace root, and the file itself is read from a descriptor (a symlink is
//! stored as a link from `readlinkat`). A process left running in the sandbox that
//! swaps a directory for a symlink between the tree walk and the read therefore makes
//! the add fail or skip, never read a file outside the workspace into the store.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use git2::{Index, IndexEntry, IndexTime, Repository};
use grove_core::error::GitError;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);
const FILE_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::CLOEXEC);

/// The workspace root, opened once per point.
pub(super) fn open_root(dir: &Path) -> Result<OwnedFd, GitError> {
    rustix::fs::open(dir, DIR_FLAGS, Mode::empty())
        .map_err(|e| GitError::Other(format!("cannot open the workspace: {e}")))
}

/// What [`add`] did with a path.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Added {
    /// A regular file or a symlink, now in the index: its size in bytes.
    Entry(u64),
    /// Nothing there a point keeps (gone, a directory, a FIFO, a socket, a device, or a
    /// path through a symlink): the index keeps no entry for it.
    Skipped,
    /// Larger than the limit it was added under: not read past it, not in the index.
    OverLimit,
}

/// Adds `path` (relative to `root`) to `index`, its content written to `store`; with a
/// `limit`, a file (or link target) larger than that many bytes is left out unread.
pub(super) fn add(
    store: &Repository,
    index: &mut Index,
    root: &OwnedFd,
    path: &Path,
    limit: Option<u64>,
) -> Result<Added, GitError> {
    let Some((parent, name)) = open_parent(root, path)? else {
        return Ok(Added::Skipped);
    };
    let Ok(stat) = rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) else {
        return Ok(Added::Skipped);
    };
    let limit = limit.unwrap_or(u64::MAX);
    let kind = FileType::from_raw_mode(stat.st_mode);
    let measured = matches!(kind, FileType::Symlink | FileType::RegularFile);
    if measured && stat.st_size.max(0) as u64 > limit {
        return Ok(Added::OverLimit);
    }
    let (bytes, mode) = match kind {
        FileType::Symlink => match rustix::fs::readlinkat(&parent, name, Vec::new()) {
            Ok(target) => (target.into_bytes(), 0o120000),
            Err(_) => return Ok(Added::Skipped),
        },
        FileType::RegularFile => match read_regular(&parent, name, limit)? {
            ReadOutcome::Bytes(bytes, executable) => {
                (bytes, if executable { 0o100755 } else { 0o100644 })
            }
            ReadOutcome::NotRegular => return Ok(Added::Skipped),
            ReadOutcome::OverLimit => return Ok(Added::OverLimit),
        },
        _ => return Ok(Added::Skipped),
    };
    if bytes.len() as u64 > limit {
        return Ok(Added::OverLimit);
    }
    let id = store.blob(&bytes).map_err(super::local)?;
    let entry = index_entry(
        &stat,
        mode,
        bytes.len() as u32,
        id,
        path.as_os_str().as_bytes(),
    );
    index.add(&entry).map_err(super::local)?;
    Ok(Added::Entry(entry.file_size.into()))
}

/// The private index's entry for a file grove read or wrote through its descriptor:
/// the stat data libgit2 compares next time, so an unchanged file is not hashed again.
pub(super) fn index_entry(
    stat: &rustix::fs::Stat,
    mode: u32,
    file_size: u32,
    id: git2::Oid,
    path: &[u8],
) -> IndexEntry {
    let time = |secs: i64, nanos: i64| IndexTime::new(secs as i32, nanos as u32);
    IndexEntry {
        ctime: time(stat.st_ctime, stat.st_ctime_nsec as i64),
        mtime: time(stat.st_mtime, stat.st_mtime_nsec as i64),
        dev: stat.st_dev as u32,
        ino: stat.st_ino as u32,
        mode,
        uid: stat.st_uid,
        gid: stat.st_gid,
        file_size,
        id,
        flags: 0,
        flags_extended: 0,
        path: path.to_vec(),
    }
}

/// The directory holding `path`'s last component, reached without following a link,
/// and that component; `None` when a component is missing, not a directory, a link,
/// or not a plain name.
fn open_parent<'p>(
    root: &OwnedFd,
    path: &'p Path,
) -> Result<Option<(OwnedFd, &'p OsStr)>, GitError> {
    let mut names = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) if n.as_bytes() != b".git" => names.push(n),
            _ => return Ok(None),
        }
    }
    let Some(last) = names.pop() else {
        return Ok(None);
    };
    let mut dir = rustix::io::dup(root).map_err(|e| GitError::Other(format!("dup: {e}")))?;
    for name in names {
        match rustix::fs::openat(dir.as_fd(), name, DIR_FLAGS, Mode::empty()) {
            Ok(next) => dir = next,
            Err(_) => return Ok(None),
        }
    }
    Ok(Some((dir, last)))
}

/// What [`read_regular`] found.
enum ReadOutcome {
    /// The file's bytes and whether it is executable.
    Bytes(Vec<u8>, bool),
    /// No longer a regular file by the time it is open.
    NotRegular,
    /// More than the limit (it grew since it was measured): read no further.
    OverLimit,
}

/// The regular file `name` in `dir`, read through its own descriptor, never more than
/// `limit` bytes and one.
fn read_regular(dir: &OwnedFd, name: &OsStr, limit: u64) -> Result<ReadOutcome, GitError> {
    let Ok(fd) = rustix::fs::openat(dir.as_fd(), name, FILE_FLAGS, Mode::empty()) else {
        return Ok(ReadOutcome::NotRegular);
    };
    let stat = rustix::fs::fstat(&fd).map_err(|e| GitError::Other(format!("fstat: {e}")))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Ok(ReadOutcome::NotRegular);
    }
    let size = stat.st_size.max(0) as u64;
    if size > limit {
        return Ok(ReadOutcome::OverLimit);
    }
    let mut bytes = Vec::with_capacity(size as usize);
    std::fs::File::from(fd)
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| GitError::Other(format!("reading a workspace file: {e}")))?;
    if bytes.len() as u64 > limit {
        return Ok(ReadOutcome::OverLimit);
    }
    Ok(ReadOutcome::Bytes(bytes, stat.st_mode & 0o111 != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixture {
        _dir: tempfile::TempDir,
        work: std::path::PathBuf,
        host: std::path::PathBuf,
        store: Repository,
    }

    /// A workspace root, a host directory outside it with a secret, and a bare store.
    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let (work, host) = (dir.path().join("work"), dir.path().join("host"));
        std::fs::create_dir_all(&work).unwrap();
        std::fs::create_dir_all(&host).unwrap();
        std::fs::write(host.join("secret"), b"host secret\n").unwrap();
        let store = Repository::init_bare(dir.path().join("store")).unwrap();
        Fixture {
            _dir: dir,
            work,
            host,
            store,
        }
    }

    fn secret_blob_in(store: &Repository) -> bool {
        let id = git2::Oid::hash_object(git2::ObjectType::Blob, b"host secret\n").unwrap();
        store.find_blob(id).is_ok()
    }

    #[test]
    fn a_path_through_a_symlinked_directory_is_skipped_and_nothing_of_the_host_is_stored() {
        let f = fixture();
        // What a running process does between the walk and the read: the directory the
        // walk saw becomes a link to a host directory with a file of the same name.
        std::os::unix::fs::symlink(&f.host, f.work.join("dir")).unwrap();
        let root = open_root(&f.work).unwrap();
        let mut index = Index::new().unwrap();
        let added = add(&f.store, &mut index, &root, Path::new("dir/secret"), None).unwrap();
        assert_eq!(added, Added::Skipped);
        assert!(index.get_path(Path::new("dir/secret"), 0).is_none());
        assert!(
            !secret_blob_in(&f.store),
            "the host file was read into the store"
        );
    }

    #[test]
    fn files_and_links_are_added_from_descriptors_and_odd_entries_skipped() {
        let f = fixture();
        std::fs::create_dir_all(f.work.join("src")).unwrap();
        std::fs::write(f.work.join("src/lib.rs"), b"fn a() {}\n").unwrap();
        std::os::unix::fs::symlink(f.host.join("secret"), f.work.join("link")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            f.work.join("fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let root = open_root(&f.work).unwrap();
        let mut index = Index::new().unwrap();
        let add_one =
            |index: &mut Index, p: &str| add(&f.store, index, &root, Path::new(p), None).unwrap();
        assert_eq!(add_one(&mut index, "src/lib.rs"), Added::Entry(10));
        let target_len = f.host.join("secret").as_os_str().len() as u64;
        assert_eq!(add_one(&mut index, "link"), Added::Entry(target_len));
        // A FIFO is neither read (it would block) nor kept.
        assert_eq!(add_one(&mut index, "fifo"), Added::Skipped);
        assert_eq!(add_one(&mut index, "../host/secret"), Added::Skipped);
        assert_eq!(add_one(&mut index, ".git/config"), Added::Skipped);

        let file = index.get_path(Path::new("src/lib.rs"), 0).unwrap();
        assert_eq!(file.mode, 0o100644);
        assert_eq!(
            f.store.find_blob(file.id).unwrap().content(),
            b"fn a() {}\n"
        );
        let link = index.get_path(Path::new("link"), 0).unwrap();
        assert_eq!(link.mode, 0o120000);
        let target = f.host.join("secret");
        assert_eq!(
            f.store.find_blob(link.id).unwrap().content(),
            target.as_os_str().as_bytes()
        );
        assert!(!secret_blob_in(&f.store), "a link's target was read");
    }

    #[test]
    fn a_file_over_the_limit_is_left_out_unread_and_one_within_it_is_added() {
        let f = fixture();
        std::fs::write(f.work.join("big.bin"), vec![7u8; 4096]).unwrap();
        std::fs::write(f.work.join("small.txt"), b"tiny\n").unwrap();
        let root = open_root(&f.work).unwrap();
        let mut index = Index::new().unwrap();
        let big = add(
            &f.store,
            &mut index,
            &root,
            Path::new("big.bin"),
            Some(4095),
        )
        .unwrap();
        assert_eq!(big, Added::OverLimit);
        assert!(index.get_path(Path::new("big.bin"), 0).is_none());
        let id = git2::Oid::hash_object(git2::ObjectType::Blob, &[7u8; 4096]).unwrap();
        assert!(f.store.find_blob(id).is_err(), "nothing of it was stored");
        let small = add(&f.store, &mut index, &root, Path::new("small.txt"), Some(5)).unwrap();
        assert_eq!(small, Added::Entry(5));
        // A link is measured by its target's length, never followed.
        std::os::unix::fs::symlink(f.host.join("secret"), f.work.join("link")).unwrap();
        let link = add(&f.store, &mut index, &root, Path::new("link"), Some(3)).unwrap();
        assert_eq!(link, Added::OverLimit);
        assert!(!secret_blob_in(&f.store));
    }
}
