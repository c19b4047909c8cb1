//! Points from the change tracker (ADR 32), written as attacks: every tracked point is
//! compared with the tree a full walk of the same working tree gives in a fresh store
//! (trees are content-addressed: equal ids, equal files), and whether the tracker
//! stayed known or fell back to a walk is asserted where the rule says which.

use std::path::Path;
use std::time::{Duration, Instant};

use git2::{Oid, Repository};
use grove_core::history::{HistoryPort, IgnoredFiles, Snapshot};
use grove_git::{Git2Adapter, WatchLimits, WatchState};
use uuid::Uuid;

use crate::history::{paths, Checkout};

/// A workspace whose tracker is established (one tracked point taken).
struct Tracked {
    co: Checkout,
    id: Uuid,
    last: Snapshot,
}

impl Tracked {
    fn new(limits: Option<WatchLimits>) -> Self {
        let mut co = Checkout::new("agent/watch");
        if let Some(l) = limits {
            co.git2 = co.git2.clone().with_watch_limits(l);
        }
        let id = Uuid::new_v4();
        let p = paths(&co.store, &co.ws, &co.cache);
        let first = co.git2.first_snapshot(&p, id).unwrap();
        let mut t = Self {
            co,
            id,
            last: first,
        };
        t.point();
        t
    }

    /// A tracked point after the last one.
    fn point(&mut self) -> Snapshot {
        let p = paths(&self.co.store, &self.co.ws, &self.co.cache);
        let snap = self
            .co
            .git2
            .tracked_snapshot(&p, self.id, Some(&self.last.id), IgnoredFiles::Excluded)
            .unwrap();
        self.last = snap.clone();
        snap
    }

    fn state(&self) -> WatchState {
        self.co.git2.tracker_state(self.id)
    }

    /// The last point's tree.
    fn tree(&self) -> Oid {
        tree_of(&self.co.store, &self.last.id)
    }

    /// The tree a full walk of the working tree gives now, from an empty store.
    fn truth(&self) -> Oid {
        let store = self.co.fx.path(&format!("truth/{}", Uuid::new_v4()));
        let p = paths(&store, &self.co.ws, &self.co.cache);
        let snap = Git2Adapter::new()
            .snapshot(&p, Uuid::new_v4(), None, IgnoredFiles::Excluded)
            .unwrap();
        tree_of(&store, &snap.id)
    }

    fn assert_exact(&self, what: &str) {
        assert_eq!(
            self.tree(),
            self.truth(),
            "{what}: the point differs from a full walk"
        );
    }

    fn ws(&self, rel: &str) -> std::path::PathBuf {
        self.co.ws.join(rel)
    }
}

fn tree_of(store: &Path, snapshot: &str) -> Oid {
    let repo = Repository::open_bare(store).unwrap();
    let oid = Oid::from_str(snapshot).unwrap();
    let tree = repo.find_commit(oid).unwrap().tree_id();
    tree
}

fn known(state: WatchState) -> bool {
    matches!(state, WatchState::Known { .. })
}

fn held(state: WatchState) -> bool {
    matches!(state, WatchState::Known { held: true, .. })
}

fn pending(state: WatchState) -> usize {
    match state {
        WatchState::Known { pending, .. } => pending,
        WatchState::Unknown => usize::MAX,
    }
}

#[test]
fn tracked_points_read_only_what_changed_and_equal_a_full_walk() {
    let mut t = Tracked::new(None);
    assert!(
        known(t.state()),
        "the first tracked point establishes the tracker"
    );
    assert_eq!(pending(t.state()), 0);
    std::fs::write(t.ws("README.md"), "changed\n").unwrap();
    std::fs::write(t.ws("new.txt"), "new\n").unwrap();
    std::fs::write(t.ws("debug.log"), "ignored\n").unwrap();
    std::fs::remove_file(t.ws("src/lib.rs")).unwrap();
    // mkdir -p and files inside in one go: the deeper directories exist before any
    // watch on them can.
    std::fs::create_dir_all(t.ws("a/b/c")).unwrap();
    std::fs::write(t.ws("a/b/c/deep.txt"), "deep\n").unwrap();
    std::fs::write(t.ws("a/top.txt"), "top\n").unwrap();
    assert!(pending(t.state()) > 0, "changes are pending");
    let snap = t.point();
    assert_eq!(
        (
            snap.changes.added,
            snap.changes.modified,
            snap.changes.deleted
        ),
        (3, 1, 1),
        "new.txt, a/top.txt, a/b/c/deep.txt; README.md; src/lib.rs (debug.log ignored)"
    );
    assert!(snap.dirty);
    t.assert_exact("edits and a new subtree");
    assert_eq!(pending(t.state()), 0, "what the point read left the set");

    // The new directories are watched now: a change deep inside is seen.
    std::fs::write(t.ws("a/b/c/deep.txt"), "deeper\n").unwrap();
    assert_eq!(pending(t.state()), 1);
    let snap = t.point();
    assert_eq!(snap.changes.modified, 1);
    t.assert_exact("a change inside a directory watched since the last point");

    // Another process's point (a full walk) advances the private index meanwhile: the
    // changes since this tracker's last point still cover everything.
    std::fs::write(t.ws("new.txt"), "by another process\n").unwrap();
    let p = paths(&t.co.store, &t.co.ws, &t.co.cache);
    t.co.git2
        .snapshot(&p, t.id, Some(&t.last.id), IgnoredFiles::Excluded)
        .unwrap();
    std::fs::write(t.ws("a/top.txt"), "after it\n").unwrap();
    t.point();
    t.assert_exact("after another process's point");
    assert!(known(t.state()));

    // Nothing changed: a point is still recorded, with no changes.
    let same = t.point();
    assert_eq!(same.changes, Default::default());
    t.assert_exact("nothing changed");
}

#[test]
fn a_process_left_running_that_writes_after_the_point_is_in_the_next_point() {
    let mut t = Tracked::new(None);
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg("(sleep 0.5; echo late > late.txt; echo again >> README.md) >/dev/null 2>&1 &")
        .current_dir(&t.co.ws)
        .status()
        .unwrap();
    assert!(status.success());
    // The command answered; its point is taken before the background writes.
    let early = t.point();
    assert_eq!(early.changes, Default::default(), "nothing yet");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !t.ws("late.txt").exists() || pending(t.state()) < 2 {
        assert!(
            Instant::now() < deadline,
            "the background writes never came"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(100));
    let late = t.point();
    assert_eq!((late.changes.added, late.changes.modified), (1, 1));
    t.assert_exact("writes by a lingering process");
    assert!(known(t.state()));
}

#[test]
fn a_renamed_directory_makes_the_tracker_walk_again_and_the_point_is_exact() {
    let mut t = Tracked::new(None);
    std::fs::rename(t.ws("src"), t.ws("lib")).unwrap();
    assert_eq!(
        t.state(),
        WatchState::Unknown,
        "its watches name the old paths"
    );
    let snap = t.point();
    assert_eq!((snap.changes.added, snap.changes.deleted), (1, 1));
    t.assert_exact("a renamed directory");
    assert!(known(t.state()), "the walk re-established the tracker");
    std::fs::write(t.ws("lib/lib.rs"), "moved and changed\n").unwrap();
    t.point();
    t.assert_exact("a change below the renamed directory");
}

#[test]
fn a_deleted_directory_is_exact_without_a_walk() {
    let mut t = Tracked::new(None);
    std::fs::create_dir_all(t.ws("gone/inner")).unwrap();
    std::fs::write(t.ws("gone/inner/x.txt"), "x\n").unwrap();
    t.point();
    t.assert_exact("a subtree made");
    std::fs::remove_dir_all(t.ws("gone")).unwrap();
    std::fs::remove_dir_all(t.ws("src")).unwrap();
    assert!(known(t.state()), "a removal is tracked exactly");
    let snap = t.point();
    assert_eq!(snap.changes.deleted, 2);
    t.assert_exact("deleted directories");
}

/// A named change made to a tracked workspace.
type Step = (&'static str, Box<dyn Fn(&Tracked)>);

/// A tracked point edits the last point's tree along the changed paths (ADR 35): each
/// change that reshapes the tree, compared with a full walk.
#[test]
fn tree_reshaping_changes_are_exact_without_a_walk() {
    use std::os::unix::fs::PermissionsExt;
    let mut t = Tracked::new(None);
    let steps: Vec<Step> = vec![
        (
            "a file replaced by a directory of its name",
            Box::new(|t| {
                std::fs::remove_file(t.ws("README.md")).unwrap();
                std::fs::create_dir_all(t.ws("README.md/inner")).unwrap();
                std::fs::write(t.ws("README.md/inner/x.txt"), "x\n").unwrap();
            }),
        ),
        (
            "a directory replaced by a file of its name",
            Box::new(|t| {
                std::fs::remove_dir_all(t.ws("src")).unwrap();
                std::fs::write(t.ws("src"), "now a file\n").unwrap();
            }),
        ),
        (
            "the last file of a nested directory removed",
            Box::new(|t| std::fs::remove_file(t.ws("README.md/inner/x.txt")).unwrap()),
        ),
        (
            "a mode change, a symlink and a file beside a name sorting between",
            Box::new(|t| {
                let f = t.ws("src");
                std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
                std::os::unix::fs::symlink("../outside", t.ws("link")).unwrap();
                std::fs::create_dir_all(t.ws("d/e")).unwrap();
                std::fs::write(t.ws("d/e/f.txt"), "f\n").unwrap();
                std::fs::write(t.ws("d-e"), "sorts between d and d/\n").unwrap();
            }),
        ),
        (
            "a file changed and changed back",
            Box::new(|t| {
                std::fs::write(t.ws("d/e/f.txt"), "g\n").unwrap();
                std::fs::write(t.ws("d/e/f.txt"), "f\n").unwrap();
            }),
        ),
        ("nothing", Box::new(|_| {})),
        (
            "everything but .gitignore removed (a rule file's change is a walk)",
            Box::new(|t| {
                for e in std::fs::read_dir(&t.co.ws).unwrap() {
                    let e = e.unwrap();
                    if e.file_name() == ".git" || e.file_name() == ".gitignore" {
                        continue;
                    }
                    let kind = e.file_type().unwrap();
                    if kind.is_dir() {
                        std::fs::remove_dir_all(e.path()).unwrap();
                    } else {
                        std::fs::remove_file(e.path()).unwrap();
                    }
                }
            }),
        ),
    ];
    for (what, change) in steps {
        assert!(held(t.state()), "{what}: the last point's index is held");
        change(&t);
        t.point();
        assert!(held(t.state()), "{what}: tracked without a walk");
        t.assert_exact(what);
    }
}

/// A tracker dropped (released, evicted) saves its held index, the entries changed
/// since the last walk with their times zeroed: the next point walks the tree from it,
/// hashes those files again and is exact, and a file a tracked point added stays
/// tracked when a rule written later matches it (as with the index in memory).
#[test]
fn a_dropped_tracker_saves_its_index_and_the_next_walk_is_exact_from_it() {
    let mut t = Tracked::new(None);
    std::fs::write(t.ws("README.md"), "one\n").unwrap();
    std::fs::write(t.ws("kept.txt"), "kept\n").unwrap();
    t.point();
    t.co.git2.forget_tracker(t.id);
    assert!(!known(t.state()));
    std::fs::write(t.ws("README.md"), "two\n").unwrap();
    let snap = t.point();
    assert!(known(t.state()), "the walk established a tracker again");
    assert_eq!(snap.changes.modified, 1, "README.md alone changed");
    t.assert_exact("after a dropped tracker");

    // Added by a tracked point only (the last walk's file does not hold it).
    std::fs::write(t.ws("added.txt"), "added\n").unwrap();
    assert!(held(t.state()));
    t.point();
    t.co.git2.forget_tracker(t.id);
    let ignore = std::fs::read_to_string(t.ws(".gitignore")).unwrap();
    std::fs::write(t.ws(".gitignore"), format!("{ignore}added.txt\n")).unwrap();
    let snap = t.point();
    assert_eq!(snap.changes.deleted, 0, "added.txt is tracked: it stays");
    let repo = Repository::open_bare(&t.co.store).unwrap();
    let tree = repo.find_tree(t.tree()).unwrap();
    let entry = tree.get_name("added.txt").expect("added.txt in the point");
    let blob = repo.find_blob(entry.id()).unwrap();
    assert_eq!(blob.content(), b"added\n");
}

#[test]
fn a_watched_directory_swapped_for_a_link_to_a_host_directory_stores_and_watches_nothing_of_the_host(
) {
    let mut t = Tracked::new(None);
    let host = t.co.fx.path("host-secrets");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("lib.rs"), "host secret\n").unwrap();
    // A watched directory replaced by a link to the host directory, and a new
    // directory that becomes such a link before the point opens it.
    std::fs::remove_dir_all(t.ws("src")).unwrap();
    std::os::unix::fs::symlink(&host, t.ws("src")).unwrap();
    std::fs::create_dir(t.ws("fresh")).unwrap();
    std::fs::remove_dir(t.ws("fresh")).unwrap();
    std::os::unix::fs::symlink(&host, t.ws("fresh")).unwrap();
    t.point();
    t.assert_exact("directories swapped for links");
    let store = Repository::open_bare(&t.co.store).unwrap();
    let secret = Oid::hash_object(git2::ObjectType::Blob, b"host secret\n").unwrap();
    assert!(store.find_blob(secret).is_err(), "a host file was stored");
    let tree = store.find_tree(t.tree()).unwrap();
    assert_eq!(
        tree.get_path(Path::new("src")).unwrap().filemode(),
        0o120000
    );
    // Nothing of the host is watched: a write there is no change of the workspace.
    let before = pending(t.state());
    std::fs::write(host.join("other.rs"), "host\n").unwrap();
    std::fs::write(host.join("lib.rs"), "host secret, changed\n").unwrap();
    assert_eq!(pending(t.state()), before, "a host directory is watched");
    assert_eq!(
        std::fs::read(host.join("lib.rs")).unwrap(),
        b"host secret, changed\n"
    );
}

#[test]
fn a_flood_of_directories_over_the_cap_falls_back_to_a_full_walk_and_stays_exact() {
    let limits = WatchLimits {
        dirs: 40,
        paths: 1_000,
        ..WatchLimits::default()
    };
    let mut t = Tracked::new(Some(limits));
    assert!(known(t.state()));
    for i in 0..60 {
        let dir = t.ws(&format!("flood/d{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f.txt"), format!("{i}\n")).unwrap();
    }
    let snap = t.point();
    assert_eq!(snap.changes.added, 60);
    t.assert_exact("a flood of directories");
    assert_eq!(t.state(), WatchState::Unknown, "over the cap: no tracker");
    std::fs::write(t.ws("flood/d7/f.txt"), "changed\n").unwrap();
    t.point();
    t.assert_exact("still over the cap: a full walk again");

    // Too many changed paths in one tracker: unknown too, never unbounded memory.
    std::fs::remove_dir_all(t.ws("flood")).unwrap();
    t.point();
    assert!(known(t.state()));
    for i in 0..1_100 {
        std::fs::write(t.ws(&format!("file{i}.txt")), "x\n").unwrap();
    }
    assert_eq!(t.state(), WatchState::Unknown, "over the path cap");
    t.point();
    t.assert_exact("a flood of files");
}

#[test]
fn a_changed_gitignore_makes_the_tracker_walk_again_and_ignored_files_stay_out() {
    let mut t = Tracked::new(None);
    std::fs::write(t.ws("later.log"), "ignored, then not\n").unwrap();
    t.point();
    t.assert_exact("before the rule change");
    // The rule change lets in a file no event names now: only a walk finds it.
    std::fs::write(t.ws(".gitignore"), "*.tmp\n").unwrap();
    std::fs::write(t.ws("new.tmp"), "ignored from the start\n").unwrap();
    assert_eq!(t.state(), WatchState::Unknown);
    let snap = t.point();
    assert_eq!(snap.changes.added, 1, "later.log");
    t.assert_exact("after the rule change");
    // An ignored directory is not watched, and files in it stay out.
    std::fs::write(t.ws(".gitignore"), "*.tmp\nbuild/\n").unwrap();
    t.point();
    std::fs::create_dir_all(t.ws("build/deep")).unwrap();
    std::fs::write(t.ws("build/deep/out.o"), "object\n").unwrap();
    t.point();
    t.assert_exact("an ignored directory made");
    assert!(known(t.state()));
}

#[test]
fn a_file_over_the_size_limit_keeps_the_workspace_dirty_point_after_point() {
    let mut t = Tracked::new(None);
    let big = std::fs::File::create(t.ws("big.bin")).unwrap();
    big.set_len(grove_git::MAX_POINT_FILE_BYTES + 1).unwrap();
    drop(big);
    let first = t.point();
    assert!(first.dirty);
    t.assert_exact("a file over the limit");
    let again = t.point();
    assert!(
        again.dirty,
        "the file left out is re-checked, not forgotten"
    );
    std::fs::remove_file(t.ws("big.bin")).unwrap();
    let gone = t.point();
    assert!(!gone.dirty, "gone: the workspace is clean again");
    t.assert_exact("the file removed");
}

#[test]
fn a_fifo_planted_as_gitignore_in_a_new_directory_refuses_the_point_without_stalling() {
    let mut t = Tracked::new(None);
    std::fs::create_dir_all(t.ws("pkg")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        t.ws("pkg/.gitignore"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let p = paths(&t.co.store, &t.co.ws, &t.co.cache);
    let started = Instant::now();
    let refused =
        t.co.git2
            .tracked_snapshot(&p, t.id, Some(&t.last.id), IgnoredFiles::Excluded);
    assert!(refused.is_err(), "a point was taken over a FIFO rule file");
    assert!(started.elapsed() < Duration::from_secs(5));
    std::fs::remove_file(t.ws("pkg/.gitignore")).unwrap();
    std::fs::write(t.ws("pkg/mod.rs"), "mod x;\n").unwrap();
    t.point();
    t.assert_exact("the FIFO gone");
}
