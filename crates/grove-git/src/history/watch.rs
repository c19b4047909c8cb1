//! Change tracking for history points without a tree walk (ADR 32): one inotify
//! instance per process, a watch on every directory of each tracked working tree, and
//! per workspace the paths changed since its tracker's last point.
//!
//! A tracker is established by a point that walks the whole tree: its watches are
//! added first (from descriptors opened `O_NOFOLLOW` beneath the root, watched through
//! `/proc/self/fd/N`, so a symlink never makes grove watch a host directory), then the
//! walk reads the tree; what changes meanwhile is queued and read again by the next
//! point. Thereafter a point drains the queue before it reads anything and reads only
//! the paths drained; a path leaves the set only once a point has read it. A directory
//! created (or moved in) is watched when the next point drains it, and its whole
//! subtree is read then (files may have been made before its watch existed). A
//! directory renamed away, a changed `.gitignore`, `.gitattributes` or `.gitmodules`, a
//! nested `.git`, a queue overflow, a watch the kernel refuses, a tracker over its caps
//! ([`WatchLimits`], and the process's own) or any read error makes the tracker
//! unknown: its watches are dropped and the next point walks the tree again.
//!
//! A background thread drains the queue between points so that it does not overflow
//! while nobody takes a point; both drain under the same lock.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ffi::{CString, OsStr};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use git2::Index;
use grove_core::error::GitError;
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use uuid::Uuid;

use super::held::Held;
use crate::rules::push_children;

/// Caps of one workspace's tracker: past either, it becomes unknown (a full walk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchLimits {
    /// Directories watched in one working tree.
    pub dirs: usize,
    /// Changed paths held between two points.
    pub paths: usize,
    /// Index entries the process holds in memory, all trackers together, once this
    /// tracker's point settles (ADR 35): past it the least recently used held indexes
    /// are dropped (their next point walks the tree). About 150 bytes each.
    pub held_entries: usize,
}

impl Default for WatchLimits {
    fn default() -> Self {
        Self {
            dirs: 20_000,
            paths: 20_000,
            held_entries: 400_000,
        }
    }
}

impl WatchLimits {
    /// The default caps, the directory cap from `GROVE_HISTORY_WATCH_DIRS` when set (0:
    /// no tracker, every point walks the tree; a value that does not parse is logged
    /// and the default kept).
    pub fn from_env() -> Self {
        let mut limits = Self::default();
        if let Ok(raw) = std::env::var("GROVE_HISTORY_WATCH_DIRS") {
            match raw.trim().parse::<usize>() {
                Ok(dirs) => limits.dirs = dirs,
                Err(_) => {
                    tracing::error!(value = %raw, "GROVE_HISTORY_WATCH_DIRS ignored: not a number")
                }
            }
        }
        limits
    }
}

/// Watches the whole process holds at most (and never more than a quarter of the
/// host's `fs.inotify.max_user_watches`, which every process of the user shares).
const PROCESS_WATCHES: usize = 100_000;
/// Changed paths the whole process holds at most, all workspaces together.
const PROCESS_PATHS: usize = 200_000;

/// What a directory watch reports: every change to an entry's content, metadata or
/// name, and the directory's own removal.
const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR);

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Entry names whose change alters which files a walk takes (the rule files) or makes
/// a directory a nested repository: the tracker turns unknown.
const RULE_NAMES: [&[u8]; 4] = [b".gitignore", b".gitattributes", b".gitmodules", b".git"];

/// What changed in one working tree since its tracker's last point, as a point takes
/// it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ChangeSet {
    /// Files (or links, or paths now gone) to read again.
    pub files: BTreeSet<PathBuf>,
    /// Directories whose whole subtree is read again (created or removed ones).
    pub trees: BTreeSet<PathBuf>,
    /// The registry's event count when the set was taken: a path changed again after
    /// that (a later event for it) stays pending when the point settles.
    pub seq: u64,
    /// The tracker the set is of (trackers are numbered as they are established).
    pub epoch: u64,
}

/// A tracker's pending paths, each with the count of its latest event.
#[derive(Debug, Default)]
struct Pending {
    files: BTreeMap<PathBuf, u64>,
    trees: BTreeMap<PathBuf, u64>,
}

impl Pending {
    fn len(&self) -> usize {
        self.files.len() + self.trees.len()
    }
}

/// One workspace's tracker, as tests and logs see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchState {
    /// None, or changes may have been missed: the next point walks the tree.
    Unknown,
    /// `pending` changed paths wait for the next point; `dirs` directories are watched;
    /// `held`: the last point's index is in memory (ADR 35; without it the next point
    /// walks the tree).
    Known {
        pending: usize,
        dirs: usize,
        held: bool,
    },
}

/// Whether a walk enters a directory (by its path from the root, and its descriptor);
/// an error makes the tracker unknown.
pub(crate) type Enter<'a> = &'a dyn Fn(&Path, &OwnedFd) -> Result<bool, GitError>;

/// [`Enter`] given the index a point uses.
pub(crate) type EnterWith<'a> = &'a dyn Fn(&Index, &Path, &OwnedFd) -> Result<bool, GitError>;

struct Tracker {
    changes: Pending,
    /// Directories created or moved in since the last point, watched when it drains.
    new_dirs: BTreeSet<PathBuf>,
    wds: HashSet<i32>,
    limits: WatchLimits,
    epoch: u64,
    /// The private index as of the last point (ADR 35); `None` while a point uses it,
    /// when none settled since the tracker was established, or when it was dropped
    /// over the process's budget.
    held: Option<Held>,
    /// When its last point settled (the registry's clock), for that budget.
    used: u64,
}

impl Tracker {
    fn pending_len(&self) -> usize {
        self.changes.len() + self.new_dirs.len()
    }
}

struct Registry {
    fd: Arc<OwnedFd>,
    by_wd: HashMap<i32, (Uuid, PathBuf)>,
    trackers: HashMap<Uuid, Tracker>,
    watches: usize,
    watch_cap: usize,
    paths: usize,
    /// Events recorded so far (the order of changes, for [`settle`]).
    seq: u64,
    /// Trackers established so far.
    epochs: u64,
    /// The held indexes of trackers that turned unknown, for the full walk that
    /// re-establishes them to start from (their files may be behind them).
    spare: HashMap<Uuid, Held>,
    /// Entries of the held indexes in the registry (trackers' and spare).
    held_entries: usize,
    /// Points settled so far.
    clock: u64,
}

static REGISTRY: OnceLock<Option<Mutex<Registry>>> = OnceLock::new();

/// The process's registry, made (with its draining thread) on first use; `None` when
/// the kernel gives no inotify instance (every point then walks the tree).
fn registry() -> Option<MutexGuard<'static, Registry>> {
    let cell = REGISTRY.get_or_init(|| {
        let fd = match inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC) {
            Ok(fd) => Arc::new(fd),
            Err(e) => {
                tracing::warn!(error = %e, "no inotify instance: every history point walks the tree");
                return None;
            }
        };
        let drain_fd = fd.clone();
        let spawned = std::thread::Builder::new()
            .name("grove-watch".into())
            .spawn(move || drain_forever(&drain_fd));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no watch thread: every history point walks the tree");
            return None;
        }
        Some(Mutex::new(Registry {
            fd,
            by_wd: HashMap::new(),
            trackers: HashMap::new(),
            watches: 0,
            watch_cap: process_watch_cap(),
            paths: 0,
            seq: 0,
            epochs: 0,
            spare: HashMap::new(),
            held_entries: 0,
            clock: 0,
        }))
    });
    let m = cell.as_ref()?;
    Some(m.lock().unwrap_or_else(|p| p.into_inner()))
}

fn process_watch_cap() -> usize {
    let host = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(8192);
    PROCESS_WATCHES.min(host / 4)
}

/// The draining thread: waits for the queue to be readable, then drains it under the
/// registry's lock, so it never overflows between points.
fn drain_forever(fd: &OwnedFd) {
    loop {
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, the descriptor lives as long as the registry.
        let ready = unsafe { libc::poll(&mut pfd, 1, 1000) };
        if ready > 0 {
            if let Some(mut r) = registry() {
                r.drain();
            }
        }
    }
}

/// The tracker of workspace `id`.
pub(crate) fn state(id: Uuid) -> WatchState {
    let Some(mut r) = registry() else {
        return WatchState::Unknown;
    };
    r.drain();
    match r.trackers.get(&id) {
        Some(t) => WatchState::Known {
            pending: t.pending_len(),
            dirs: t.wds.len(),
            held: t.held.is_some(),
        },
        None => WatchState::Unknown,
    }
}

/// Drops workspace `id`'s tracker, its watches and its held index (released, evicted,
/// destroyed, or a point that could not use it), the index saved to its file first.
/// Called under the workspace's lock.
pub(crate) fn forget(id: Uuid) {
    let held = registry().and_then(|mut r| {
        r.unknown(id);
        r.take_spare(id)
    });
    if let Some(held) = held {
        held.save();
    }
}

/// The held index a full walk of workspace `id` starts from, when its tracker left one.
pub(crate) fn spare(id: Uuid) -> Option<Held> {
    registry()?.take_spare(id)
}

/// Drains the queue and returns what changed in workspace `id` since its tracker's
/// last point, its new directories now watched and marked for a read of their whole
/// subtree, with the index as of that point; `None`: no tracker, it turned unknown, or
/// it holds no index (a full walk is due).
pub(crate) fn take(id: Uuid, root: &OwnedFd, enter: EnterWith<'_>) -> Option<(ChangeSet, Held)> {
    let mut r = registry()?;
    r.drain();
    let t = r.trackers.get_mut(&id)?;
    let held = t.held.take()?;
    let new_dirs = std::mem::take(&mut t.new_dirs);
    r.held_entries = r.held_entries.saturating_sub(held.index.len());
    r.paths = r.paths.saturating_sub(new_dirs.len());
    let refused = {
        let enter = |rel: &Path, fd: &OwnedFd| enter(&held.index, rel, fd);
        new_dirs
            .iter()
            .any(|dir| r.watch_new(id, root, dir, &enter).is_err())
    };
    if refused {
        r.unknown(id);
        r.put_spare(id, held);
        return None;
    }
    let seq = r.seq;
    let Some(t) = r.trackers.get(&id) else {
        r.put_spare(id, held);
        return None;
    };
    let set = ChangeSet {
        files: t.changes.files.keys().cloned().collect(),
        trees: t.changes.trees.keys().cloned().collect(),
        seq,
        epoch: t.epoch,
    };
    Some((set, held))
}

/// Starts workspace `id`'s tracker afresh (before the full walk that makes its point):
/// a watch on every directory the walk enters. Its epoch, or `None`: over a cap or
/// refused (no tracker; the next point walks again).
pub(crate) fn establish(
    id: Uuid,
    root: &OwnedFd,
    limits: WatchLimits,
    enter: Enter<'_>,
) -> Option<u64> {
    if limits.dirs == 0 {
        return None;
    }
    let mut r = registry()?;
    r.drain();
    r.unknown(id);
    // The walk that follows chose its index already.
    r.take_spare(id);
    r.epochs += 1;
    let epoch = r.epochs;
    r.trackers.insert(
        id,
        Tracker {
            changes: Pending::default(),
            new_dirs: BTreeSet::new(),
            wds: HashSet::new(),
            limits,
            epoch,
            held: None,
            used: 0,
        },
    );
    let Ok(dup) = rustix::io::dup(root) else {
        r.unknown(id);
        return None;
    };
    if r.watch_subtree(id, dup, PathBuf::new(), enter).is_err() {
        r.unknown(id);
        return None;
    }
    Some(epoch)
}

/// After a point read `read`: those paths leave the set unless an event came for them
/// after it was taken (the point may have read them before that change), and `keep`
/// (paths a point must read again every time, such as files over the size limit) stay.
/// `held` (the index the point left) becomes the tracker's when the tracker is the one
/// the set was of, or spare when the tracker is gone.
pub(crate) fn settle(id: Uuid, read: &ChangeSet, keep: &[PathBuf], held: Option<Held>) {
    let Some(mut r) = registry() else {
        return;
    };
    let seq = r.seq;
    let Some(t) = r.trackers.get_mut(&id) else {
        // It turned unknown meanwhile: its next full walk starts from this index.
        if let Some(held) = held {
            r.put_spare(id, held);
        }
        return;
    };
    if t.epoch != read.epoch {
        return;
    }
    let budget = t.limits.held_entries;
    let before = t.pending_len();
    t.changes
        .files
        .retain(|p, s| *s > read.seq || !read.files.contains(p));
    t.changes
        .trees
        .retain(|p, s| *s > read.seq || !read.trees.contains(p));
    for p in keep {
        t.changes.files.entry(p.clone()).or_insert(seq);
    }
    let after = t.pending_len();
    r.paths = (r.paths + after).saturating_sub(before);
    if let Some(held) = held {
        r.install(id, held, budget);
    }
}

/// Why a watch could not be added: the tracker turns unknown.
#[derive(Debug)]
struct Refused;

impl Registry {
    /// Reads every queued event and applies it to its tracker.
    fn drain(&mut self) {
        let fd = self.fd.clone();
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 << 10];
        let mut reader = inotify::Reader::new(fd.as_fd(), &mut buf);
        loop {
            let (wd, flags, name) = match reader.next() {
                Ok(ev) => (
                    ev.wd(),
                    ev.events(),
                    ev.file_name().map(|n| n.to_bytes().to_vec()),
                ),
                Err(Errno::WOULDBLOCK) => return,
                Err(Errno::INTR) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the watch queue: every tracker reset");
                    self.all_unknown();
                    return;
                }
            };
            self.dispatch(wd, flags, name);
        }
    }

    fn all_unknown(&mut self) {
        let ids: Vec<Uuid> = self.trackers.keys().copied().collect();
        for id in ids {
            self.unknown(id);
        }
    }

    /// Applies one event; see the module documentation.
    fn dispatch(&mut self, wd: i32, flags: ReadFlags, name: Option<Vec<u8>>) {
        if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
            tracing::info!("watch queue overflowed: every tracker reset");
            return self.all_unknown();
        }
        let Some((id, dir)) = self.by_wd.get(&wd).cloned() else {
            return;
        };
        if flags.contains(ReadFlags::IGNORED) {
            self.by_wd.remove(&wd);
            self.watches = self.watches.saturating_sub(1);
            if let Some(t) = self.trackers.get_mut(&id) {
                t.wds.remove(&wd);
            }
        }
        let root_gone = flags.intersects(
            ReadFlags::IGNORED | ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF | ReadFlags::UNMOUNT,
        ) && dir.as_os_str().is_empty();
        if root_gone || flags.contains(ReadFlags::UNMOUNT) {
            return self.unknown(id);
        }
        let Some(name) = name else {
            return;
        };
        let at_root_git = dir.as_os_str().is_empty() && name == b".git";
        if at_root_git {
            return;
        }
        if RULE_NAMES.contains(&name.as_slice()) {
            return self.unknown(id);
        }
        let path = dir.join(OsStr::from_bytes(&name));
        self.record(id, flags, path);
    }

    /// Adds one changed entry to its tracker's set.
    fn record(&mut self, id: Uuid, flags: ReadFlags, path: PathBuf) {
        let Some(t) = self.trackers.get_mut(&id) else {
            return;
        };
        let before = t.pending_len();
        self.seq += 1;
        let seq = self.seq;
        if flags.contains(ReadFlags::ISDIR) {
            if flags.contains(ReadFlags::MOVED_FROM) {
                // Its watches (and those below) now name the wrong paths.
                return self.unknown(id);
            } else if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
                t.new_dirs.insert(path);
            } else if flags.contains(ReadFlags::DELETE) {
                // Empty when removed: its entries went one by one, each reported.
                t.changes.trees.insert(path, seq);
            }
        } else {
            t.changes.files.insert(path, seq);
        }
        let (held, cap) = (t.pending_len(), t.limits.paths);
        self.paths = (self.paths + held).saturating_sub(before);
        if held > cap || self.paths > PROCESS_PATHS {
            self.unknown(id);
        }
    }

    /// Puts a held index aside for workspace `id`'s next full walk (within the default
    /// budget: spare indexes are the first to go).
    fn put_spare(&mut self, id: Uuid, held: Held) {
        self.held_entries += held.index.len();
        if let Some(old) = self.spare.insert(id, held) {
            self.held_entries = self.held_entries.saturating_sub(old.index.len());
        }
        self.trim(WatchLimits::default().held_entries);
    }

    fn take_spare(&mut self, id: Uuid) -> Option<Held> {
        let held = self.spare.remove(&id)?;
        self.held_entries = self.held_entries.saturating_sub(held.index.len());
        Some(held)
    }

    /// Gives workspace `id`'s tracker its held index, then keeps the process's held
    /// entries within `budget`; an index larger than the whole budget is not held (it
    /// would push every other out).
    fn install(&mut self, id: Uuid, held: Held, budget: usize) {
        self.clock += 1;
        let (clock, entries) = (self.clock, held.index.len());
        if entries > budget {
            return;
        }
        let Some(t) = self.trackers.get_mut(&id) else {
            return;
        };
        if let Some(old) = t.held.replace(held) {
            self.held_entries = self.held_entries.saturating_sub(old.index.len());
        }
        t.used = clock;
        self.held_entries += entries;
        self.trim(budget);
    }

    /// Drops held indexes until their entries fit `budget`: spare ones first (a walk
    /// would start from them), then the trackers' least recently used.
    fn trim(&mut self, budget: usize) {
        while self.held_entries > budget {
            if let Some(id) = self.spare.keys().next().copied() {
                self.take_spare(id);
                continue;
            }
            let oldest = self
                .trackers
                .iter()
                .filter(|(_, t)| t.held.is_some())
                .min_by_key(|(_, t)| t.used)
                .map(|(id, _)| *id);
            let Some(held) = oldest.and_then(|id| self.trackers.get_mut(&id)?.held.take()) else {
                return;
            };
            self.held_entries = self.held_entries.saturating_sub(held.index.len());
        }
    }

    /// Drops a tracker and its watches.
    fn unknown(&mut self, id: Uuid) {
        let Some(mut t) = self.trackers.remove(&id) else {
            return;
        };
        if let Some(held) = t.held.take() {
            self.spare.insert(id, held);
        }
        // (its entries stay counted, now as spare)
        self.paths = self.paths.saturating_sub(t.pending_len());
        for wd in t.wds {
            // Its IN_IGNORED comes later, for a descriptor no longer mapped.
            let _ = inotify::remove_watch(self.fd.as_fd(), wd);
            self.by_wd.remove(&wd);
            self.watches = self.watches.saturating_sub(1);
        }
    }

    /// Watches a directory created since the last point (and all below it) and marks
    /// it for a read of its subtree; one gone already is marked all the same (its
    /// entries, if a point ever held any, go).
    fn watch_new(
        &mut self,
        id: Uuid,
        root: &OwnedFd,
        dir: &Path,
        enter: Enter<'_>,
    ) -> Result<(), Refused> {
        if let Some(fd) = open_beneath(root, dir) {
            if !enter(dir, &fd).map_err(|_| Refused)? {
                return Ok(());
            }
            self.watch_subtree(id, fd, dir.to_path_buf(), enter)?;
        }
        let seq = self.seq;
        let t = self.trackers.get_mut(&id).ok_or(Refused)?;
        if t.changes.trees.insert(dir.to_path_buf(), seq).is_none() {
            self.paths += 1;
        }
        Ok(())
    }

    /// Watches `top` (at `rel`) and every directory below it that `enter` admits. A
    /// directory is opened from its parent's descriptor when its turn comes, so the
    /// descriptors held grow with the tree's depth, not its width.
    fn watch_subtree(
        &mut self,
        id: Uuid,
        top: OwnedFd,
        rel: PathBuf,
        enter: Enter<'_>,
    ) -> Result<(), Refused> {
        self.watch_one(id, &top, &rel)?;
        let mut pending: Vec<(Rc<OwnedFd>, CString, PathBuf)> = Vec::new();
        push_children(&Rc::new(top), &rel, &mut pending).map_err(|_| Refused)?;
        while let Some((parent, name, rel)) = pending.pop() {
            let dir = match rustix::fs::openat(parent.as_fd(), &name, DIR_FLAGS, Mode::empty()) {
                Ok(dir) => dir,
                Err(Errno::NOTDIR | Errno::LOOP | Errno::NOENT) => continue,
                Err(_) => return Err(Refused),
            };
            drop(parent);
            if !enter(&rel, &dir).map_err(|_| Refused)? {
                continue;
            }
            self.watch_one(id, &dir, &rel)?;
            push_children(&Rc::new(dir), &rel, &mut pending).map_err(|_| Refused)?;
        }
        Ok(())
    }

    /// One watch on the directory open at `dir`, through its descriptor.
    fn watch_one(&mut self, id: Uuid, dir: &OwnedFd, rel: &Path) -> Result<(), Refused> {
        let t = self.trackers.get(&id).ok_or(Refused)?;
        if t.wds.len() >= t.limits.dirs || self.watches >= self.watch_cap {
            return Err(Refused);
        }
        let proc_path = format!("/proc/self/fd/{}", dir.as_raw_fd());
        let wd = inotify::add_watch(self.fd.as_fd(), proc_path, MASK).map_err(|_| Refused)?;
        let t = self.trackers.get_mut(&id).ok_or(Refused)?;
        if t.wds.insert(wd) {
            self.watches += 1;
        }
        self.by_wd.insert(wd, (id, rel.to_path_buf()));
        Ok(())
    }
}

/// The directory at `rel` below `root`, each component opened without following a
/// link (`None`: gone, not a directory, or through a link).
pub(crate) fn open_beneath(root: &OwnedFd, rel: &Path) -> Option<OwnedFd> {
    let mut dir = rustix::io::dup(root).ok()?;
    for c in rel.components() {
        let std::path::Component::Normal(name) = c else {
            return None;
        };
        dir = rustix::fs::openat(dir.as_fd(), name, DIR_FLAGS, Mode::empty()).ok()?;
    }
    Some(dir)
}
