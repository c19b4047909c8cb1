//! Who and under which limits bubblewrap runs: the sandbox identity, the seccomp
//! program, and the per-runtime cgroup (or rlimits where cgroups are not ours).
//!
//! A root worker never starts bwrap as root: the child drops to the sandbox identity
//! (`setgroups([])`, `setgid`, `setuid`) before it execs bwrap, so bwrap runs
//! unprivileged and builds its sandbox in a user namespace of that uid, where the
//! command has no capabilities on the host at all. A worker that is not root is
//! already unprivileged and runs bwrap as itself, the same way.

use std::ffi::{CString, OsStr, OsString};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// Processes (tasks) one runtime may have at once, unless the spec says otherwise.
pub const DEFAULT_PIDS: u64 = 1024;
/// Memory one runtime may use, unless the spec says otherwise.
pub const DEFAULT_MEMORY_MB: u64 = 2048;

/// Where per-runtime cgroups are made (cgroup v1 controllers).
const CGROUP_V1: &str = "/sys/fs/cgroup";
const CGROUP_DIR: &str = "grove-local";

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
}

impl Jail {
    pub fn detect(identity: (u32, u32)) -> Self {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        let limits = if !root {
            LimitMode::Rlimits("the worker is not root; cgroups are not its to make".into())
        } else {
            match probe_cgroup_v1() {
                Ok(()) => LimitMode::CgroupV1,
                Err(why) => LimitMode::Rlimits(why),
            }
        };
        Self {
            drop_to: root.then_some(identity),
            limits,
        }
    }

    /// The cgroup of one runtime, made (or found) with its limits set.
    pub fn cgroup(&self, name: &str, pids: u64, memory_mb: u64) -> Result<Option<Cgroup>, String> {
        if self.limits != LimitMode::CgroupV1 {
            return Ok(None);
        }
        Cgroup::make(name, pids, memory_mb).map(Some)
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

    /// Removes the cgroup `name` if it is empty (best effort).
    pub fn remove_cgroup(&self, name: &str) {
        if self.limits == LimitMode::CgroupV1 {
            Cgroup::at(name).remove();
        }
    }

    /// What the jail adds, for `grove runtimes`.
    pub fn describe(&self) -> String {
        let who = match self.drop_to {
            Some((uid, gid)) => format!("as {uid}:{gid}"),
            None => "as the worker's own unprivileged user".into(),
        };
        let limits = match &self.limits {
            LimitMode::CgroupV1 => "limits: cgroup v1 pids+memory per runtime".to_string(),
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

/// Gives "others" the search (`x`) bit on every directory above `path` that lacks it,
/// so the unprivileged sandbox identity can reach a mount source (bwrap resolves it
/// as that user). Search only: nothing becomes listable or readable. Directories the
/// worker does not own are left alone (and then must already allow it).
pub(crate) fn grant_search(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    for dir in path.ancestors().skip(1) {
        let meta = std::fs::symlink_metadata(dir)?;
        let mode = meta.mode() & 0o7777;
        if meta.is_dir() && mode & 0o001 == 0 && meta.uid() == me {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o001))?;
        }
    }
    Ok(())
}

fn probe_cgroup_v1() -> Result<(), String> {
    for controller in ["pids", "memory"] {
        let dir = Path::new(CGROUP_V1).join(controller);
        if !dir.join("cgroup.procs").is_file() {
            return Err(format!(
                "no cgroup v1 '{controller}' controller at {}",
                dir.display()
            ));
        }
        let ours = dir.join(CGROUP_DIR);
        std::fs::create_dir_all(&ours)
            .map_err(|e| format!("cannot make {}: {e}", ours.display()))?;
    }
    Ok(())
}

/// One runtime's cgroup (a directory in each of the `pids` and `memory` v1
/// controllers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cgroup {
    pids: PathBuf,
    memory: PathBuf,
}

/// How often the limits were hit so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Hits {
    pub pids: u64,
    pub oom_kills: u64,
}

impl Cgroup {
    fn at(name: &str) -> Self {
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
        let base = Path::new(CGROUP_V1);
        Self {
            pids: base.join("pids").join(CGROUP_DIR).join(&safe),
            memory: base.join("memory").join(CGROUP_DIR).join(&safe),
        }
    }

    fn make(name: &str, pids: u64, memory_mb: u64) -> Result<Self, String> {
        let cg = Self::at(name);
        if cg.pids.join("pids.max").is_file() && cg.memory.join("memory.limit_in_bytes").is_file() {
            // Made (and limited) by an earlier create of the same runtime.
            return Ok(cg);
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
        Ok(cg)
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

    /// Removes the cgroup once nothing runs in it (best effort).
    pub fn remove(&self) {
        for dir in [&self.pids, &self.memory] {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
