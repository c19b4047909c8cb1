//! Who and under which limits bubblewrap runs: the sandbox identity, the seccomp
//! program, and the per-runtime cgroup (or rlimits where cgroups are not ours).
//!
//! A root worker never starts bwrap as root: the child drops to the sandbox identity
//! (`setgroups([])`, `setgid`, `setuid`) before it execs bwrap, so bwrap runs
//! unprivileged and builds its sandbox in a user namespace of that uid, where the
//! command has no capabilities on the host at all. A worker that is not root is
//! already unprivileged and runs bwrap as itself, the same way.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

/// Processes (tasks) one runtime may have at once, unless the spec says otherwise.
pub const DEFAULT_PIDS: u64 = 1024;
/// Memory one runtime may use, unless the spec says otherwise.
pub const DEFAULT_MEMORY_MB: u64 = 2048;

/// Where per-runtime cgroups are made (cgroup v1 controllers): under
/// `<controller>/grove-local/<deployment>/`, one directory per deployment.
const CGROUP_V1: &str = "/sys/fs/cgroup";
const CGROUP_DIR: &str = "grove-local";
/// The name prefix of the runtime directories of the layout before deployments: right
/// under `grove-local/`, named from a `local:` backend id.
const LEGACY_PREFIX: &str = "local_";

/// Which grove deployment a jail's cgroups belong to: `home-` and 16 hex digits of the
/// SHA-256 of its canonical `$GROVE_HOME` (no secret; the same path names the same
/// deployment). Two deployments on one host with the same workspace keys get the
/// same backend ids; their cgroups differ by this segment, so they never share limits
/// and one never removes the other's (its sweep and destroy stay inside its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment(String);

impl Deployment {
    /// The deployment of `$GROVE_HOME` at `home` (as given when it cannot be
    /// canonicalized, e.g. not made yet).
    pub fn of_home(home: &Path) -> Self {
        let canonical = std::fs::canonicalize(home).unwrap_or_else(|_| home.to_path_buf());
        let hash = grove_core::layout::short_hash(&canonical.to_string_lossy(), 16);
        Self(format!("home-{hash}"))
    }

    /// The directory segment under `grove-local/`.
    pub fn segment(&self) -> &str {
        &self.0
    }
}

/// How a runtime's resources are bounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitMode {
    /// One cgroup per runtime in the v1 `pids` and `memory` controllers; hitting a
    /// limit is detected and reported as `resource_limit`.
    CgroupV1,
    /// No cgroup of our own: `RLIMIT_NPROC` (per uid) and `RLIMIT_AS` (per process).
    Rlimits(String),
}

/// The process-wide part of the jail.
#[derive(Debug)]
pub(crate) struct Jail {
    /// The identity bwrap runs as when the worker is root; `None` when the worker is
    /// not root (bwrap then runs as the worker's own unprivileged uid).
    pub drop_to: Option<(u32, u32)>,
    pub limits: LimitMode,
    /// Whose cgroups these are.
    pub deployment: Deployment,
}

impl Jail {
    pub fn detect(identity: (u32, u32), deployment: Deployment) -> Self {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        let limits = if !root {
            LimitMode::Rlimits("the worker is not root; cgroups are not its to make".into())
        } else {
            match probe_cgroup_v1(&deployment) {
                Ok(()) => LimitMode::CgroupV1,
                Err(why) => LimitMode::Rlimits(why),
            }
        };
        Self {
            drop_to: root.then_some(identity),
            limits,
            deployment,
        }
    }

    /// The cgroup of one runtime, made (or found) with its limits set.
    pub fn cgroup(&self, name: &str, pids: u64, memory_mb: u64) -> Result<Option<Cgroup>, String> {
        if self.limits != LimitMode::CgroupV1 {
            return Ok(None);
        }
        Cgroup::make(&self.deployment, name, pids, memory_mb).map(Some)
    }

    /// A command that runs `program args` with the seccomp program on a descriptor
    /// (`--seccomp N` goes first), in `cgroup`, as the sandbox identity. The returned
    /// descriptor must stay open until the command is spawned.
    pub fn command(
        &self,
        program: &OsStr,
        args: &[OsString],
        cgroup: Option<&Cgroup>,
    ) -> Result<(std::process::Command, OwnedFd), String> {
        let bpf = crate::seccomp::program()?;
        let fd = memfd_with(bpf).map_err(|e| format!("cannot pass the seccomp filter: {e}"))?;
        let raw = fd.as_raw_fd();
        let mut cmd = std::process::Command::new(program);
        cmd.arg("--seccomp").arg(raw.to_string()).args(args);
        if let Some(cg) = cgroup {
            cg.limit()?;
        }
        let procs: Vec<CString> = cgroup.map(Cgroup::procs_files).unwrap_or_default();
        let drop_to = self.drop_to;
        let rlimits = !matches!(self.limits, LimitMode::CgroupV1);
        // SAFETY: the closure runs between fork and exec; it only makes system calls
        // (fcntl, open, write, close, setrlimit, setgroups, setgid, setuid) on data
        // prepared before the fork, and allocates nothing.
        unsafe {
            cmd.pre_exec(move || in_child(raw, &procs, drop_to, rlimits));
        }
        Ok((cmd, fd))
    }

    /// Removes the cgroup `name` if it is empty and no handle holds it (best effort).
    pub fn remove_cgroup(&self, name: &str) {
        if self.limits == LimitMode::CgroupV1 {
            let (pids, memory) = Cgroup::paths(&self.deployment, name);
            Live::try_remove(&pids, &memory);
        }
    }

    /// The `pids` and `memory` directories the cgroup `name` has (or would have), when
    /// limits are cgroups of our own.
    pub fn cgroup_dirs(&self, name: &str) -> Option<[PathBuf; 2]> {
        (self.limits == LimitMode::CgroupV1).then(|| {
            let (pids, memory) = Cgroup::paths(&self.deployment, name);
            [pids, memory]
        })
    }

    /// What the jail adds, for `grove runtimes`.
    pub fn describe(&self) -> String {
        let who = match self.drop_to {
            Some((uid, gid)) => format!("as {uid}:{gid}"),
            None => "as the worker's own unprivileged user".into(),
        };
        let limits = match &self.limits {
            LimitMode::CgroupV1 => format!(
                "limits: cgroup v1 pids+memory per runtime (under {CGROUP_DIR}/{})",
                self.deployment.segment()
            ),
            LimitMode::Rlimits(why) => format!("limits: RLIMIT_NPROC+RLIMIT_AS ({why})"),
        };
        format!("{who}; user namespace; no capabilities; no_new_privs; seccomp; {limits}")
    }
}

/// The child's side: seccomp descriptor kept across exec, cgroup joined, privileges
/// dropped. Async-signal-safe.
fn in_child(
    seccomp_fd: i32,
    procs: &[CString],
    drop_to: Option<(u32, u32)>,
    rlimits: bool,
) -> std::io::Result<()> {
    let check = |r: libc::c_int| {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY: plain system calls on descriptors and paths owned by this child.
    unsafe {
        check(libc::fcntl(seccomp_fd, libc::F_SETFD, 0))?;
        for path in procs {
            let f = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            check(f)?;
            let w = libc::write(f, b"0\n".as_ptr().cast(), 2);
            libc::close(f);
            if w < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        check(libc::setrlimit(libc::RLIMIT_CORE, &none))?;
        if rlimits {
            let nproc = libc::rlimit {
                rlim_cur: DEFAULT_PIDS,
                rlim_max: DEFAULT_PIDS,
            };
            check(libc::setrlimit(libc::RLIMIT_NPROC, &nproc))?;
            let bytes = DEFAULT_MEMORY_MB * 1024 * 1024;
            let mem = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            check(libc::setrlimit(libc::RLIMIT_AS, &mem))?;
        }
        if let Some((uid, gid)) = drop_to {
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setgid(gid))?;
            check(libc::setuid(uid))?;
            if libc::getuid() != uid || libc::geteuid() != uid {
                return Err(std::io::Error::from_raw_os_error(libc::EPERM));
            }
        }
    }
    Ok(())
}

/// An anonymous in-memory file holding `bytes`, positioned at its start.
fn memfd_with(bytes: &[u8]) -> std::io::Result<OwnedFd> {
    // SAFETY: the name is a valid C string; the result is checked.
    let raw = unsafe { libc::memfd_create(c"grove-seccomp".as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    use std::io::Seek;
    file.seek(std::io::SeekFrom::Start(0))?;
    Ok(file.into())
}

/// The cgroup name of a runtime: its backend id when that names a runtime, else
/// (a spec without the runtime label, as in tests) the backend id plus a hash of the
/// workspace path, so unrelated runtimes never share limits.
pub(crate) fn cgroup_name(backend_id: &str, workdir: &Path) -> String {
    if !backend_id.ends_with(':') {
        return backend_id.to_string();
    }
    // FNV-1a: stable across runs, no dependency.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in workdir.as_os_str().as_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100000001b3);
    }
    format!("{backend_id}{h:016x}")
}

/// Lets the sandbox identity `uid` (and only it) search every directory above `path`
/// that it could not search otherwise, so bwrap, running as that identity, can resolve
/// a mount source: a POSIX ACL entry `user:<uid>:--x` on each such directory the
/// worker owns. Search only: nothing becomes listable or readable, and no other user
/// gains anything (`$GROVE_HOME` stays private to everyone else). A filesystem without
/// ACLs is an error, never a wider mode.
pub(crate) fn grant_search(path: &Path, uid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    for dir in path.ancestors().skip(1) {
        let meta = std::fs::symlink_metadata(dir)?;
        if !meta.is_dir() || meta.mode() & 0o001 != 0 || meta.uid() != me || meta.uid() == uid {
            continue;
        }
        acl::allow_search(dir, uid, meta.mode())?;
    }
    Ok(())
}

/// The `system.posix_acl_access` extended attribute, read and written whole.
mod acl {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    const NAME: &std::ffi::CStr = c"system.posix_acl_access";
    const VERSION: u32 = 2;
    const USER_OBJ: u16 = 0x01;
    const USER: u16 = 0x02;
    const GROUP_OBJ: u16 = 0x04;
    const GROUP: u16 = 0x08;
    const MASK: u16 = 0x10;
    const OTHER: u16 = 0x20;
    const UNDEFINED: u32 = u32::MAX;
    const SEARCH: u16 = 1;

    /// (tag, perm, id)
    type Entry = (u16, u16, u32);

    /// Adds (or widens) `user:uid:--x`, keeping every other entry, with a mask that
    /// lets it through. Nothing is written when it is already there.
    pub fn allow_search(dir: &Path, uid: u32, mode: u32) -> std::io::Result<()> {
        let c = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        let mut entries = read(&c)?.unwrap_or_else(|| from_mode(mode));
        let has = |e: &[Entry], tag: u16, id: u32| {
            e.iter()
                .any(|&(t, p, i)| t == tag && i == id && p & SEARCH != 0)
        };
        if has(&entries, USER, uid) && has(&entries, MASK, UNDEFINED) {
            return Ok(());
        }
        entries.retain(|&(t, _, i)| !(t == USER && i == uid));
        entries.push((USER, SEARCH, uid));
        // The mask bounds named users and groups and the owning group: their union.
        let union = entries
            .iter()
            .filter(|(t, _, _)| matches!(*t, USER | GROUP | GROUP_OBJ))
            .fold(0, |acc, (_, p, _)| acc | p);
        entries.retain(|(t, _, _)| *t != MASK);
        entries.push((MASK, union, UNDEFINED));
        entries.sort_by_key(|&(t, _, i)| (t, i));
        write(&c, &entries)
    }

    fn from_mode(mode: u32) -> Vec<Entry> {
        let bits = |shift: u32| ((mode >> shift) & 7) as u16;
        vec![
            (USER_OBJ, bits(6), UNDEFINED),
            (GROUP_OBJ, bits(3), UNDEFINED),
            (OTHER, bits(0), UNDEFINED),
        ]
    }

    fn read(path: &CString) -> std::io::Result<Option<Vec<Entry>>> {
        let mut buf = vec![0u8; 4096];
        // SAFETY: the buffer is valid for its length; the result is checked.
        let n = unsafe {
            libc::getxattr(
                path.as_ptr(),
                NAME.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENODATA) => Ok(None),
                _ => Err(e),
            };
        }
        let buf = &buf[..n as usize];
        if buf.len() < 4 || u32::from_le_bytes(buf[..4].try_into().unwrap()) != VERSION {
            return Err(std::io::Error::other("unexpected ACL format"));
        }
        Ok(Some(
            buf[4..]
                .chunks_exact(8)
                .map(|e| {
                    (
                        u16::from_le_bytes([e[0], e[1]]),
                        u16::from_le_bytes([e[2], e[3]]),
                        u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
                    )
                })
                .collect(),
        ))
    }

    fn write(path: &CString, entries: &[Entry]) -> std::io::Result<()> {
        let mut buf = VERSION.to_le_bytes().to_vec();
        for (t, p, i) in entries {
            buf.extend_from_slice(&t.to_le_bytes());
            buf.extend_from_slice(&p.to_le_bytes());
            buf.extend_from_slice(&i.to_le_bytes());
        }
        // SAFETY: the buffer is valid for its length; the result is checked.
        let r = unsafe {
            libc::setxattr(
                path.as_ptr(),
                NAME.as_ptr(),
                buf.as_ptr().cast(),
                buf.len(),
                0,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            return Err(std::io::Error::new(
                e.kind(),
                format!("cannot add an ACL entry for the sandbox identity (the filesystem needs POSIX ACLs): {e}"),
            ));
        }
        Ok(())
    }
}

fn probe_cgroup_v1(deployment: &Deployment) -> Result<(), String> {
    for controller in ["pids", "memory"] {
        let dir = Path::new(CGROUP_V1).join(controller);
        if !dir.join("cgroup.procs").is_file() {
            return Err(format!(
                "no cgroup v1 '{controller}' controller at {}",
                dir.display()
            ));
        }
        let ours = dir.join(CGROUP_DIR).join(deployment.segment());
        std::fs::create_dir_all(&ours)
            .map_err(|e| format!("cannot make {}: {e}", ours.display()))?;
    }
    let removed = sweep_stale_cgroups(deployment);
    if removed > 0 {
        tracing::debug!(
            removed,
            "removed empty cgroup directories of earlier runtimes"
        );
    }
    Ok(())
}

/// One runtime's cgroup (a directory in each of the `pids` and `memory` v1
/// controllers). Its directories go when the last handle on them (runtime handles,
/// commands being started, the agent's owner thread) is dropped and no process is
/// left in them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cgroup {
    pids: PathBuf,
    memory: PathBuf,
    pids_max: u64,
    memory_mb: u64,
    live: Arc<Live>,
}

/// The cgroups this process holds handles on, by their `pids` directory: a handle
/// made while an older one is still alive shares it, and the last one removes the
/// directories.
static LIVE: Mutex<BTreeMap<PathBuf, Weak<Live>>> = Mutex::new(BTreeMap::new());

fn live() -> std::sync::MutexGuard<'static, BTreeMap<PathBuf, Weak<Live>>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a dropped cgroup waits for its last processes (an agent's sandbox dies
/// just after bwrap is reaped) before it is left to the next start's sweep.
const REMOVE_RETRIES: u32 = 50;
const REMOVE_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// The shared part of a [`Cgroup`]'s handles; dropping the last removes the
/// directories.
#[derive(Debug, PartialEq, Eq)]
struct Live {
    pids: PathBuf,
    memory: PathBuf,
}

impl Live {
    /// Removes the directories unless a newer handle holds them; `false` while a
    /// process is still in one of them.
    fn try_remove(pids: &Path, memory: &Path) -> bool {
        let mut live = live();
        if live.get(pids).is_some_and(|w| w.strong_count() > 0) {
            return true;
        }
        live.remove(pids);
        let mut done = true;
        for dir in [pids, memory] {
            match std::fs::remove_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(_) => done = false,
            }
        }
        done
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if Self::try_remove(&self.pids, &self.memory) {
            return;
        }
        let (pids, memory) = (self.pids.clone(), self.memory.clone());
        let _ = std::thread::Builder::new()
            .name("grove-cgroup-rm".into())
            .spawn(move || {
                for _ in 0..REMOVE_RETRIES {
                    std::thread::sleep(REMOVE_PAUSE);
                    if Self::try_remove(&pids, &memory) {
                        return;
                    }
                }
            });
    }
}

/// Removes every directory under `grove-local/<deployment>/` of both controllers that
/// no handle of this process holds, and the empty runtime directories of the layout
/// before deployments (`grove-local/local_*`, which no current worker makes); one with
/// processes in it fails to go and stays (a worker's start: runtimes of earlier
/// workers whose handles are gone). Another deployment's directories are never
/// touched.
pub(crate) fn sweep_stale_cgroups(deployment: &Deployment) -> usize {
    let live = live();
    let mut removed = 0;
    for controller in ["pids", "memory"] {
        let top = Path::new(CGROUP_V1).join(controller).join(CGROUP_DIR);
        let ours = top.join(deployment.segment());
        let pids_dir = |name: &OsStr| {
            Path::new(CGROUP_V1)
                .join("pids")
                .join(CGROUP_DIR)
                .join(deployment.segment())
                .join(name)
        };
        for entry in std::fs::read_dir(&ours).into_iter().flatten().flatten() {
            let held = live
                .get(&pids_dir(&entry.file_name()))
                .is_some_and(|w| w.strong_count() > 0);
            if !held && entry.file_type().is_ok_and(|t| t.is_dir()) {
                removed += usize::from(std::fs::remove_dir(entry.path()).is_ok());
            }
        }
        for entry in std::fs::read_dir(&top).into_iter().flatten().flatten() {
            let legacy = entry
                .file_name()
                .as_bytes()
                .starts_with(LEGACY_PREFIX.as_bytes());
            if legacy && entry.file_type().is_ok_and(|t| t.is_dir()) {
                removed += usize::from(std::fs::remove_dir(entry.path()).is_ok());
            }
        }
    }
    removed
}

/// How often the limits were hit so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Hits {
    pub pids: u64,
    pub oom_kills: u64,
}

impl Cgroup {
    /// The `pids` and `memory` directories of `name` in `deployment`.
    fn paths(deployment: &Deployment, name: &str) -> (PathBuf, PathBuf) {
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let under = |controller: &str| {
            Path::new(CGROUP_V1)
                .join(controller)
                .join(CGROUP_DIR)
                .join(deployment.segment())
                .join(&safe)
        };
        (under("pids"), under("memory"))
    }

    fn make(
        deployment: &Deployment,
        name: &str,
        pids: u64,
        memory_mb: u64,
    ) -> Result<Self, String> {
        let (pids_dir, memory_dir) = Self::paths(deployment, name);
        let mut live = live();
        let shared = live.get(&pids_dir).and_then(Weak::upgrade);
        let cg = Self {
            live: shared.unwrap_or_else(|| {
                Arc::new(Live {
                    pids: pids_dir.clone(),
                    memory: memory_dir.clone(),
                })
            }),
            pids: pids_dir,
            memory: memory_dir,
            pids_max: pids,
            memory_mb,
        };
        live.insert(cg.pids.clone(), Arc::downgrade(&cg.live));
        drop(live);
        cg.limit()?;
        Ok(cg)
    }

    /// Makes the directories and sets the limits unless both are there already
    /// (again before each spawn: another worker's sweep may have removed them while
    /// nothing ran in them).
    fn limit(&self) -> Result<(), String> {
        let cg = self;
        let (pids, memory_mb) = (self.pids_max, self.memory_mb);
        if cg.pids.join("pids.max").is_file() && cg.memory.join("memory.limit_in_bytes").is_file() {
            // Made (and limited) by an earlier create of the same runtime.
            return Ok(());
        }
        let bytes = memory_mb.saturating_mul(1024 * 1024).to_string();
        let set = |dir: &Path, file: &str, value: &str| -> Result<(), String> {
            std::fs::write(dir.join(file), value)
                .map_err(|e| format!("cannot set {}/{file}: {e}", dir.display()))
        };
        for dir in [&cg.pids, &cg.memory] {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        }
        set(&cg.pids, "pids.max", &pids.to_string())?;
        set(&cg.memory, "memory.limit_in_bytes", &bytes)?;
        // With swap, the memory limit alone would only move the hog to swap.
        if cg.memory.join("memory.memsw.limit_in_bytes").exists() {
            set(&cg.memory, "memory.memsw.limit_in_bytes", &bytes)?;
        }
        Ok(())
    }

    fn procs_files(&self) -> Vec<CString> {
        [&self.pids, &self.memory]
            .iter()
            .filter_map(|d| CString::new(d.join("cgroup.procs").as_os_str().as_bytes()).ok())
            .collect()
    }

    /// The counters now (missing files read as zero).
    pub fn hits(&self) -> Hits {
        let field = |path: PathBuf, key: &str| -> u64 {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|text| {
                    text.lines().find_map(|l| {
                        let (k, v) = l.split_once(' ')?;
                        (k == key).then(|| v.trim().parse().ok()).flatten()
                    })
                })
                .unwrap_or(0)
        };
        Hits {
            pids: field(self.pids.join("pids.events"), "max"),
            oom_kills: field(self.memory.join("memory.oom_control"), "oom_kill"),
        }
    }

    /// Which limit was hit since `before`, if any.
    pub fn hit_since(&self, before: Hits) -> Option<String> {
        let now = self.hits();
        if now.oom_kills > before.oom_kills {
            return Some("the command ran out of memory (the runtime's memory limit)".into());
        }
        if now.pids > before.pids {
            return Some("the command hit the runtime's process limit".into());
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Runs `argv` as `uid` (root only); `None` when that cannot be tried here.
    fn as_user(uid: u32, argv: &[&str]) -> Option<bool> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: switching users needs root");
            return None;
        }
        let out = std::process::Command::new("setpriv")
            .args([
                "--reuid",
                &uid.to_string(),
                "--regid",
                &uid.to_string(),
                "--clear-groups",
                "--",
            ])
            .args(argv)
            .output()
            .ok()?;
        Some(out.status.success())
    }

    #[test]
    fn search_is_granted_to_the_sandbox_identity_only() {
        let base = Path::new("/var/tmp/grove-tests");
        std::fs::create_dir_all(base).unwrap();
        let root = tempfile_dir(base);
        let inner = root.join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(root.join("a"), std::fs::Permissions::from_mode(0o700)).unwrap();
        grant_search(&inner, 60100).unwrap();
        grant_search(&inner, 60100).unwrap(); // idempotent
        let inner_s = inner.to_str().unwrap();
        let root_s = root.to_str().unwrap();
        if let Some(ok) = as_user(60100, &["stat", inner_s]) {
            assert!(ok, "the sandbox identity cannot reach {inner_s}");
            assert_eq!(as_user(60100, &["ls", root_s]), Some(false), "it can list");
            assert_eq!(
                as_user(60101, &["stat", inner_s]),
                Some(false),
                "another uid reaches it"
            );
        }
        // Others' bits are untouched.
        let mode = std::fs::metadata(&root).unwrap().permissions().mode();
        assert_eq!(mode & 0o007, 0);
        std::fs::remove_dir_all(&root).unwrap();
    }

    fn tempfile_dir(base: &Path) -> PathBuf {
        let dir = base.join(format!(
            "acl-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        dir
    }
}
