//! The one way grove opens a repository or runs the git CLI on a workspace or a cache.
//!
//! Everything inside a workspace, its `.git` included, is written by hostile code; the
//! host side (often root) must never let it choose what grove reads, writes, executes
//! or where it sends a token. So:
//!
//! - libgit2 never reads a system, global or XDG config (its search paths are emptied
//!   once per process, before any repository is opened);
//! - a workspace is opened from the paths grove recorded: its `.git` must be a real
//!   directory (a `gitdir:` file or a symlink is refused, never followed), without a
//!   `commondir` redirect, with its `objects` and `refs` real directories;
//! - the workspace's `.git/config` is replaced, in memory, by a fixed grove config
//!   (`core.worktree`, `core.excludesFile`, `core.attributesFile`, `url.*`,
//!   `remote.*`, `http.*`, `include.*`, filters, textconv: none of them exists for
//!   host-side git); the working tree is the recorded directory, never `core.worktree`;
//! - the object database is built by grove from two directories: the workspace's own
//!   `.git/objects` and the repo cache's `objects` named in grove's record next to
//!   the workspace (`.<name>.grove-cache`, outside the mounted tree). The workspace's
//!   `objects/info/alternates` is never read on the host side;
//! - the git CLI only ever runs through [`git_command`]: a cleared environment, no
//!   system or global config, every key that can redirect or execute overridden, and
//!   only on a git directory whose local config holds none of those keys.

use std::ffi::CString;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use git2::{Binding, Config, ConfigLevel, Odb, Repository};
use grove_core::error::GitError;

use crate::errors::{map_git2, map_io, Phase};

/// The only configuration libgit2 sees in a workspace opened by grove.
const GROVE_CONFIG: &str = "\
[core]
\trepositoryformatversion = 0
\tbare = false
\tfilemode = true
\tsymlinks = true
\tignorecase = false
\tlogallrefupdates = false
\tautocrlf = false
[user]
\tname = grove agent
\temail = agent@grove.invalid
";

/// Local config keys (lower-cased) the git CLI must never see: each can make git run
/// a program, read a host file, or send data somewhere else. (`remote.*` may stay:
/// the CLI runs with every network protocol disallowed.)
const CLI_FORBIDDEN: &[&str] = &[
    "include.",
    "includeif.",
    "filter.",
    "url.",
    "credential.",
    "core.worktree",
    "core.hookspath",
    "core.fsmonitor",
    "core.sshcommand",
    "core.gitproxy",
    "core.askpass",
    "core.editor",
    "core.pager",
    "core.excludesfile",
    "core.attributesfile",
    "http.",
    "protocol.",
    "uploadpack.",
    "receivepack.",
];

/// The largest `alternates` file grove reads to adopt a record for an older workspace.
const MAX_ALTERNATES_BYTES: u64 = 4096;

fn local(e: git2::Error) -> GitError {
    map_git2(&e, Phase::Local, None)
}

fn refuse(dir: &Path, why: &str) -> GitError {
    GitError::Untrusted(format!("workspace {}: {why}", dir.display()))
}

/// Process-wide libgit2 settings, applied once before the first repository is opened:
/// no system, global, XDG or ProgramData config, and no owner check. The owner check is
/// off because sandbox users own the workspace trees the worker inspects; it is safe
/// because grove opens only directories named by its own records, never a path found
/// by searching upwards or read from a workspace.
pub(crate) fn init() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        for level in [
            ConfigLevel::System,
            ConfigLevel::Global,
            ConfigLevel::XDG,
            ConfigLevel::ProgramData,
        ] {
            // SAFETY: runs once, under the OnceLock, before any repository is opened by
            // this crate (every open goes through this module).
            if let Err(e) = unsafe { git2::opts::set_search_path(level, "") } {
                tracing::error!(error = %e, "cannot empty libgit2's config search path");
            }
        }
        // SAFETY: as above.
        if let Err(e) = unsafe { git2::opts::set_verify_owner_validation(false) } {
            tracing::error!(error = %e, "cannot turn off libgit2's owner check");
        }
    });
}

/// What kind of entry a path is, without following a symlink.
enum Entry {
    Missing,
    Dir,
    File,
    Other(&'static str),
}

fn entry(path: &Path) -> Result<Entry, GitError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Ok(Entry::Other("a symlink")),
        Ok(m) if m.is_dir() => Ok(Entry::Dir),
        Ok(m) if m.is_file() => Ok(Entry::File),
        Ok(_) => Ok(Entry::Other("not a regular file")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Entry::Missing),
        Err(e) => Err(map_io("cannot inspect a workspace path", &e)),
    }
}

/// Refuses a workspace whose `.git` could send libgit2 anywhere but where grove put it.
fn check_git_dir(dir: &Path) -> Result<PathBuf, GitError> {
    match entry(dir)? {
        Entry::Dir => {}
        Entry::Missing => return Err(GitError::Other(format!("{} is missing", dir.display()))),
        _ => return Err(refuse(dir, "the workspace root is not a directory")),
    }
    let git_dir = dir.join(".git");
    match entry(&git_dir)? {
        Entry::Dir => {}
        Entry::File => return Err(refuse(dir, ".git is a file (a gitdir link), not followed")),
        Entry::Other(what) => return Err(refuse(dir, &format!(".git is {what}"))),
        Entry::Missing => return Err(GitError::Other(format!("{} has no .git", dir.display()))),
    }
    if !matches!(entry(&git_dir.join("commondir"))?, Entry::Missing) {
        return Err(refuse(dir, ".git/commondir redirects the repository"));
    }
    for sub in ["objects", "objects/pack", "refs"] {
        match entry(&git_dir.join(sub))? {
            Entry::Dir | Entry::Missing => {}
            _ => return Err(refuse(dir, &format!(".git/{sub} is not a directory"))),
        }
    }
    // libgit2 writes loose objects into `objects/<xx>/` by path: none may be a link.
    if let Ok(entries) = std::fs::read_dir(git_dir.join("objects")) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_symlink()) {
                return Err(refuse(dir, "an entry of .git/objects is a symlink"));
            }
        }
    }
    // libgit2 opens these by path with a blocking open(): a FIFO would stall it.
    match entry(&git_dir.join("info"))? {
        Entry::Dir | Entry::Missing => {}
        _ => return Err(refuse(dir, ".git/info is not a directory")),
    }
    let files = [
        "config",
        "HEAD",
        "index",
        "packed-refs",
        "info/exclude",
        "info/attributes",
    ];
    for file in files {
        match entry(&git_dir.join(file))? {
            Entry::File | Entry::Missing => {}
            _ => return Err(refuse(dir, &format!(".git/{file} is not a regular file"))),
        }
    }
    Ok(git_dir)
}

/// Opens the workspace at `dir` (a path from grove's records) the trusted way; see the
/// module documentation.
pub(crate) fn open_workspace(dir: &Path) -> Result<Repository, GitError> {
    init();
    let git_dir = check_git_dir(dir)?;
    let cache_objects = recorded_cache_objects(dir, &git_dir)?;
    // libgit2 parses `.git/config` (and what it includes) while opening, before it is
    // replaced: a config it cannot parse is the workspace's doing, refused as such.
    let repo = Repository::open_bare(&git_dir).map_err(|e| match e.class() {
        git2::ErrorClass::Config => refuse(
            dir,
            &format!(
                "its .git/config is unusable: {}",
                crate::errors::scrub(e.message(), None)
            ),
        ),
        _ => local(e),
    })?;
    replace_config(&repo)?;
    let odb = Odb::new().map_err(local)?;
    add_objects(&odb, &git_dir.join("objects"), false)?;
    if let Some(cache) = &cache_objects {
        add_objects(&odb, cache, true)?;
    }
    repo.set_odb(&odb).map_err(local)?;
    repo.set_workdir(dir, false).map_err(local)?;
    Ok(repo)
}

/// Refuses to write the loose reference `refname` (a full `refs/...` name) of a workspace
/// repository opened by [`open_workspace`] when any part of its path under `.git` is a
/// symlink: libgit2 writes a loose reference through a symlink, which would let a
/// workspace make grove overwrite any host file.
pub(crate) fn check_ref_writable(repo: &Repository, refname: &str) -> Result<(), GitError> {
    let git_dir = repo.path();
    let refuse_ref = |why: &str| {
        GitError::Untrusted(format!(
            "workspace {}: reference {refname:?} {why}",
            git_dir.display()
        ))
    };
    if refname
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(refuse_ref("has an invalid name"));
    }
    let parts: Vec<&str> = refname.split('/').collect();
    let mut path = git_dir.to_path_buf();
    for (i, part) in parts.iter().enumerate() {
        path.push(part);
        let last = i + 1 == parts.len();
        match entry(&path)? {
            Entry::Missing => return Ok(()),
            Entry::Dir if !last => {}
            Entry::File if last => {}
            _ => return Err(refuse_ref("is stored through a symlink or a special file")),
        }
    }
    Ok(())
}

/// The reference a commit on HEAD writes: HEAD's branch, or `HEAD` itself when detached.
pub(crate) fn head_ref_name(repo: &Repository) -> Result<String, GitError> {
    let head = repo.find_reference("HEAD").map_err(local)?;
    Ok(head.symbolic_target_bytes().map_or_else(
        || "HEAD".to_string(),
        |t| String::from_utf8_lossy(t).into_owned(),
    ))
}

/// Opens a repo cache: a bare repository grove cloned, mounted read-only into sandboxes,
/// so its own config (its `origin` remote) is grove's.
pub(crate) fn open_cache(cache_dir: &Path) -> Result<Repository, git2::Error> {
    init();
    match std::fs::symlink_metadata(cache_dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(git2::Error::from_str(
                "the repo cache path is not a directory",
            ))
        }
        Err(_) => {
            return Err(git2::Error::new(
                git2::ErrorCode::NotFound,
                git2::ErrorClass::Repository,
                "the repo cache does not exist",
            ))
        }
    }
    Repository::open_bare(cache_dir)
}

/// Opens one of grove's private bare repositories (a history store: never mounted,
/// written only by grove) with grove's fixed config.
pub(crate) fn open_private(dir: &Path) -> Result<Repository, GitError> {
    init();
    let repo = Repository::open_bare(dir).map_err(local)?;
    replace_config(&repo)?;
    Ok(repo)
}

/// Opens a repository grove is building in a fresh partial directory (not yet visible
/// to any sandbox): its files are grove's own.
pub(crate) fn open_fresh(dir: &Path) -> Result<Repository, GitError> {
    init();
    Repository::open_ext(dir, git2::RepositoryOpenFlags::NO_SEARCH, [] as [&Path; 0]).map_err(local)
}

fn check_rc(rc: std::os::raw::c_int) -> Result<(), GitError> {
    if rc < 0 {
        return Err(GitError::Other(crate::errors::scrub(
            git2::Error::last_error(rc).message(),
            None,
        )));
    }
    Ok(())
}

/// Replaces the repository's configuration with a read-only snapshot of grove's.
fn replace_config(repo: &Repository) -> Result<(), GitError> {
    let mut config = Config::open(grove_config_path()?).map_err(local)?;
    let snapshot = config.snapshot().map_err(local)?;
    // SAFETY: both pointers are live git2 handles; libgit2 takes its own reference.
    let rc = unsafe { libgit2_sys::git_repository_set_config(repo.raw(), snapshot.raw()) };
    check_rc(rc)
}

/// grove's fixed config file, written once per process into a fresh 0700 directory.
fn grove_config_path() -> Result<&'static Path, GitError> {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| write_grove_config().map_err(|e| e.to_string()))
        .as_deref()
        .map_err(|e| GitError::Other(format!("cannot write grove's git config: {e}")))
}

fn write_grove_config() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    for attempt in 0..16u32 {
        let name = format!(
            "grove-git-{}-{}-{attempt}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        );
        let dir = base.join(name);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
        let path = dir.join("config");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        std::io::Write::write_all(&mut file, GROVE_CONFIG.as_bytes())?;
        return Ok(path);
    }
    Err(std::io::Error::other("no free private directory name"))
}

/// Adds the loose and packed objects of `objects` (never its `info/alternates`) to
/// `odb`, as the place new objects go (`alternate` false) or as a read-only source.
pub(crate) fn add_objects(odb: &Odb<'_>, objects: &Path, alternate: bool) -> Result<(), GitError> {
    let path = CString::new(objects.as_os_str().as_bytes())
        .map_err(|_| GitError::Other("an object directory path holds a NUL byte".into()))?;
    // Priorities as libgit2's defaults: loose objects before packs.
    let backends: [(bool, i32); 2] = [(true, 2), (false, 1)];
    for (loose, priority) in backends {
        let mut backend = std::ptr::null_mut();
        // SAFETY: `path` outlives the calls; on success libgit2 hands over `backend`,
        // which `git_odb_add_*` then owns.
        unsafe {
            let rc = if loose {
                libgit2_sys::git_odb_backend_loose(&mut backend, path.as_ptr(), -1, 0, 0, 0)
            } else {
                libgit2_sys::git_odb_backend_pack(&mut backend, path.as_ptr())
            };
            check_rc(rc)?;
            let rc = if alternate {
                libgit2_sys::git_odb_add_alternate(odb.raw(), backend, priority)
            } else {
                libgit2_sys::git_odb_add_backend(odb.raw(), backend, priority)
            };
            check_rc(rc)?;
        }
    }
    Ok(())
}

/// The file beside a workspace (outside the tree a sandbox sees) where grove records the
/// repo cache object directory the workspace borrows from.
fn record_path(dir: &Path) -> Result<PathBuf, GitError> {
    let name = dir
        .file_name()
        .ok_or_else(|| GitError::Other("the workspace path has no final component".into()))?;
    let mut record = std::ffi::OsString::from(".");
    record.push(name);
    record.push(".grove-cache");
    Ok(dir.with_file_name(record))
}

/// Records that the workspace at `dir` borrows `cache_objects` (an absolute path).
/// Written right after the workspace is moved into place (before any sandbox sees it).
/// A record half-written by an attempt that died (its partial sibling) is removed
/// first: callers hold the workspace's creation lock, so no live attempt owns it.
pub(crate) fn record_cache(dir: &Path, cache_objects: &Path) -> Result<(), GitError> {
    let path = record_path(dir)?;
    crate::fsutil::remove_stale_partials(&path)
        .map_err(|e| map_io("cannot remove a stale workspace record", &e))?;
    let tmp = crate::fsutil::partial_sibling(&path)
        .map_err(|e| map_io("cannot name a workspace record", &e))?;
    let mut bytes = cache_objects.as_os_str().as_bytes().to_vec();
    bytes.push(b'\n');
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &bytes))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(map_io("cannot write the workspace record", &e));
    }
    Ok(())
}

/// Removes the record of a workspace that is gone, and any half-written one an attempt
/// that died left beside it.
pub(crate) fn forget_cache(dir: &Path) -> Result<(), GitError> {
    let path = record_path(dir)?;
    crate::fsutil::remove_stale_partials(&path)
        .map_err(|e| map_io("cannot remove a stale workspace record", &e))?;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(map_io("cannot remove the workspace record", &e))
        }
        _ => Ok(()),
    }
}

fn read_small(path: &Path, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut out = Vec::new();
    file.take(limit).read_to_end(&mut out)?;
    Ok(Some(out))
}

/// The cache object directory grove recorded for the workspace at `dir`. A workspace
/// made before records existed adopts what its `alternates` names once, if that is a
/// single absolute path to the `objects` directory of a bare repository; otherwise it
/// borrows nothing (its own objects only).
fn recorded_cache_objects(dir: &Path, git_dir: &Path) -> Result<Option<PathBuf>, GitError> {
    let record = record_path(dir)?;
    let text = |b: Vec<u8>| std::ffi::OsStr::from_bytes(b.trim_ascii()).to_owned();
    if let Some(bytes) = read_small(&record, MAX_ALTERNATES_BYTES)
        .map_err(|e| map_io("cannot read the workspace record", &e))?
    {
        return Ok(Some(PathBuf::from(text(bytes))));
    }
    let alternates = git_dir.join("objects/info/alternates");
    let Ok(Some(bytes)) = read_small(&alternates, MAX_ALTERNATES_BYTES) else {
        return Ok(None);
    };
    let named = PathBuf::from(text(bytes));
    let plausible = named.is_absolute()
        && !named.as_os_str().as_bytes().contains(&b'\n')
        && named.file_name().is_some_and(|n| n == "objects")
        && named.parent().is_some_and(is_bare_repo);
    if !plausible {
        tracing::warn!(workspace = %dir.display(), "workspace alternates ignored: not a repo cache");
        return Ok(None);
    }
    record_cache(dir, &named)?;
    tracing::info!(workspace = %dir.display(), "workspace record adopted from its alternates");
    Ok(Some(named))
}

/// Whether `dir` is a bare repository by its own config (`core.bare = true`), as repo
/// caches are; a workspace's `.git` says `false`.
fn is_bare_repo(dir: &Path) -> bool {
    matches!(entry(&dir.join("config")), Ok(Entry::File))
        && Config::open(&dir.join("config"))
            .and_then(|c| c.get_bool("core.bare"))
            .unwrap_or(false)
}

/// Refuses a git directory whose local config holds a key the git CLI must not see.
pub(crate) fn check_cli_config(git_dir: &Path) -> Result<(), GitError> {
    let path = git_dir.join("config");
    match entry(&path)? {
        Entry::Missing => return Ok(()),
        Entry::File => {}
        Entry::Dir | Entry::Other(_) => {
            return Err(refuse(git_dir, "config is not a regular file"))
        }
    }
    let config = Config::open(&path).map_err(local)?;
    let mut entries = config.entries(None).map_err(local)?;
    while let Some(e) = entries.next() {
        let e = e.map_err(local)?;
        let name = String::from_utf8_lossy(e.name_bytes()).to_ascii_lowercase();
        let textconv = name.starts_with("diff.") && name.ends_with(".textconv");
        if textconv || CLI_FORBIDDEN.iter().any(|k| name.starts_with(k)) {
            return Err(refuse(
                git_dir,
                &format!("its config sets {name}, which host-side git never honours"),
            ));
        }
    }
    Ok(())
}

/// A git CLI command on `git_dir` with work tree `work_tree`: a cleared environment, no
/// system or global config, no hooks, fsmonitor, ssh or proxy commands, no credential
/// helper, no network protocol, and `safe.directory` open (the path is grove's).
/// Refuses when the local config holds any key on the forbidden list.
pub(crate) fn git_command(
    git: &Path,
    git_dir: &Path,
    work_tree: &Path,
) -> Result<std::process::Command, GitError> {
    check_cli_config(git_dir)?;
    let ceiling = work_tree.parent().unwrap_or(Path::new("/"));
    let mut cmd = std::process::Command::new(git);
    cmd.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", "/nonexistent")
        .env("LC_ALL", "C")
        .env("GIT_DIR", git_dir)
        .env("GIT_WORK_TREE", work_tree)
        .env("GIT_CEILING_DIRECTORIES", ceiling)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("GIT_NO_REPLACE_OBJECTS", "1")
        .env("GIT_PROTOCOL_FROM_USER", "0")
        .env("GIT_ALLOW_PROTOCOL", "")
        .current_dir(work_tree)
        .stdin(std::process::Stdio::null());
    for kv in [
        "safe.directory=*",
        "core.hooksPath=/dev/null",
        "core.fsmonitor=false",
        "core.sshCommand=false",
        "core.gitProxy=",
        "core.askPass=",
        "credential.helper=",
        "protocol.allow=never",
        "http.proxy=",
    ] {
        cmd.args(["-c", kv]);
    }
    Ok(cmd)
}

/// Opens `name` inside the directory `dir_fd` without following a symlink.
fn open_at(
    dir_fd: &std::fs::File,
    name: &str,
    flags: i32,
    mode: u32,
) -> std::io::Result<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let name = CString::new(name).map_err(std::io::Error::other)?;
    // SAFETY: a valid directory descriptor and a NUL-terminated name; the returned
    // descriptor is owned by the File.
    let fd = unsafe {
        libc::openat(
            dir_fd.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Records `remote/branch` as `branch`'s upstream in the workspace's own `.git/config`
/// (the file git inside the sandbox reads), without following a symlink anywhere: the
/// workspace and `.git` are opened by descriptor, the new config is built by libgit2 in
/// a grove-private copy, written beside the old one by descriptor, given the old file's
/// owner, and renamed over it within the same directory descriptor.
pub(crate) fn set_upstream(dir: &Path, branch: &str, remote: &str) -> Result<(), GitError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let io = |e: std::io::Error| map_io("cannot record the upstream branch", &e);
    let dir_flags = libc::O_RDONLY | libc::O_DIRECTORY;
    let root = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
        .map_err(io)?;
    let git = open_at(&root, ".git", dir_flags, 0).map_err(io)?;
    let old = open_at(&git, "config", libc::O_RDONLY | libc::O_NONBLOCK, 0).map_err(io)?;
    let meta = old.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(refuse(dir, ".git/config is not a regular file"));
    }
    let mut text = Vec::new();
    old.take(1 << 20).read_to_end(&mut text).map_err(io)?;
    // Edited as a private copy: a hostile include in it is never written back.
    let scratch = grove_config_path()?.with_file_name(format!("edit-{}", uuid::Uuid::new_v4()));
    std::fs::write(&scratch, &text).map_err(io)?;
    let edited = (|| {
        let mut cfg = Config::open(&scratch)?;
        cfg.set_str(&format!("branch.{branch}.remote"), remote)?;
        cfg.set_str(
            &format!("branch.{branch}.merge"),
            &format!("refs/heads/{branch}"),
        )
    })();
    let new_text = std::fs::read(&scratch);
    let _ = std::fs::remove_file(&scratch);
    edited.map_err(local)?;
    let new_text = new_text.map_err(io)?;
    let tmp_name = format!("config.grove-{}", uuid::Uuid::new_v4().simple());
    let mut tmp = open_at(
        &git,
        &tmp_name,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        0o644,
    )
    .map_err(io)?;
    let tmp_c = CString::new(tmp_name)
        .map_err(std::io::Error::other)
        .map_err(io)?;
    let cfg_c = c"config";
    let done = std::io::Write::write_all(&mut tmp, &new_text)
        .and_then(|()| std::os::unix::fs::fchown(&tmp, Some(meta.uid()), Some(meta.gid())))
        .and_then(|()| {
            // SAFETY: a valid directory descriptor and NUL-terminated names.
            let rc = unsafe {
                libc::renameat(
                    git.as_raw_fd(),
                    tmp_c.as_ptr(),
                    git.as_raw_fd(),
                    cfg_c.as_ptr(),
                )
            };
            if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    if let Err(e) = done {
        // SAFETY: as above.
        unsafe { libc::unlinkat(git.as_raw_fd(), tmp_c.as_ptr(), 0) };
        return Err(io(e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git_bin() -> Option<PathBuf> {
        let found = ["/usr/bin/git", "/usr/local/bin/git", "/bin/git"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_file());
        if found.is_none() {
            eprintln!("skipping: no git binary installed");
        }
        found
    }

    fn repo(dir: &Path) -> PathBuf {
        let repo = Repository::init(dir).unwrap();
        let sig = git2::Signature::now("t", "t@t.invalid").unwrap();
        let tree = repo
            .find_tree(repo.index().unwrap().write_tree().unwrap())
            .unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "empty", &tree, &[])
            .unwrap();
        dir.join(".git")
    }

    #[test]
    fn a_record_half_written_by_a_dead_attempt_is_removed_by_the_next_record_and_by_forget() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("edit-c1");
        std::fs::create_dir(&ws).unwrap();
        let stale = || {
            dir.path()
                .join("..edit-c1.grove-cache.partial-0123456789abcdef")
        };
        // A neighbour's record and its partial stay: they are another workspace's.
        let other = dir
            .path()
            .join("..edit-c10.grove-cache.partial-0123456789abcdef");
        std::fs::write(&other, "/elsewhere\n").unwrap();

        std::fs::write(stale(), "/half").unwrap();
        record_cache(&ws, Path::new("/cache/objects")).unwrap();
        assert!(!stale().exists(), "the next record removes it");
        let record = dir.path().join(".edit-c1.grove-cache");
        assert_eq!(
            std::fs::read_to_string(&record).unwrap(),
            "/cache/objects\n"
        );

        std::fs::write(stale(), "/half").unwrap();
        forget_cache(&ws).unwrap();
        assert!(!stale().exists() && !record.exists(), "forget removes both");
        assert!(other.exists(), "another workspace's is left alone");
    }

    #[test]
    fn the_git_cli_is_refused_on_a_config_with_any_redirecting_key() {
        let Some(git) = git_bin() else { return };
        for (key, value) in [
            ("include.path", "/etc/hostname"),
            ("includeIf.gitdir:/.path", "/etc/hostname"),
            ("filter.x.clean", "touch /tmp/x"),
            ("diff.x.textconv", "cat"),
            ("core.worktree", "/etc"),
            ("core.hooksPath", "/tmp"),
            ("core.fsmonitor", "true"),
            ("core.sshCommand", "touch /tmp/x"),
            ("url.http://127.0.0.1:9/.insteadOf", "https://"),
            ("credential.helper", "store"),
            ("http.proxy", "http://127.0.0.1:9"),
            ("protocol.ext.allow", "always"),
        ] {
            let tmp = tempfile::tempdir().unwrap();
            let git_dir = repo(tmp.path());
            Config::open(&git_dir.join("config"))
                .unwrap()
                .set_str(key, value)
                .unwrap();
            let r = git_command(&git, &git_dir, tmp.path());
            assert!(matches!(r, Err(GitError::Untrusted(_))), "{key}: {r:?}");
        }
    }

    #[test]
    fn the_git_cli_runs_no_hook_and_sees_no_caller_environment() {
        let Some(git) = git_bin() else { return };
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        let git_dir = repo(&ws);
        let marker = tmp.path().join("hook-ran");
        let hook = git_dir.join("hooks/pre-commit");
        std::fs::create_dir_all(hook.parent().unwrap()).unwrap();
        std::fs::write(&hook, format!("#!/bin/sh\ntouch '{}'\n", marker.display())).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = git_command(&git, &git_dir, &ws)
            .unwrap()
            .args(["-c", "user.name=t", "-c", "user.email=t@t.invalid"])
            .args(["commit", "-q", "--allow-empty", "-m", "x"])
            .env_remove("NOT_SET")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!marker.exists(), "the pre-commit hook ran");
        let env = git_command(&git, &git_dir, &ws).unwrap();
        let names: Vec<_> = env.get_envs().map(|(k, _)| k.to_os_string()).collect();
        assert!(names
            .iter()
            .all(|n| n != "GIT_ASKPASS" && n != "SSH_AUTH_SOCK"));
    }

    #[test]
    fn origin_check_compares_scheme_host_and_port() {
        use crate::cache::origin_of;
        assert_eq!(
            origin_of("https://x:y@GitHub.com/a/b.git"),
            "https://github.com"
        );
        assert_ne!(
            origin_of("https://github.com/a/b.git"),
            origin_of("https://github.com:8443/a/b.git")
        );
        assert_ne!(
            origin_of("https://github.com/a"),
            origin_of("http://github.com/a")
        );
    }
}
