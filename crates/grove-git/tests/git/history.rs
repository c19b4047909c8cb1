//! Workspace history through the port (ADR 28): points, counts, diffs and rewinds, the
//! agent's index left alone, and the cost of a point after a one-file change.

use std::path::{Path, PathBuf};
use std::time::Instant;

use grove_core::error::GitError;
use grove_core::history::{HistoryPaths, HistoryPort, IgnoredFiles};
use grove_core::ports::GitPort;
use grove_git::Git2Adapter;
use uuid::Uuid;

use crate::support::{git, Fixture};

pub(crate) fn paths<'a>(store: &'a Path, ws: &'a Path, cache: &'a Path) -> HistoryPaths<'a> {
    HistoryPaths {
        store_dir: store,
        workspace_dir: ws,
        cache_dir: cache,
    }
}

/// A checkout of the fixture's `main` on `branch` at `<root>/ws`, its cache, and where
/// its history store goes (not made yet).
pub(crate) struct Checkout {
    pub(crate) fx: Fixture,
    pub(crate) cache: PathBuf,
    pub(crate) ws: PathBuf,
    pub(crate) store: PathBuf,
    pub(crate) git2: Git2Adapter,
}

impl Checkout {
    pub(crate) fn new(branch: &str) -> Self {
        let fx = Fixture::new();
        let cache = fx.cache();
        let ws = fx.path("ws");
        let git2 = Git2Adapter::new();
        git2.create_checkout(&fx.request(&cache, &ws, "main", Some(branch)))
            .unwrap();
        let store = fx.path("history/u/ws");
        Self {
            fx,
            cache,
            ws,
            store,
            git2,
        }
    }
}

#[test]
fn points_count_changes_rewind_restores_and_the_agents_index_is_untouched() {
    let Checkout {
        fx,
        cache,
        ws,
        store,
        git2,
    } = Checkout::new("agent/edits-c1");
    let p = paths(&store, &ws, &cache);
    let id = Uuid::nil();
    let first = git2.snapshot(&p, id, None, IgnoredFiles::Excluded).unwrap();
    assert_eq!(first.changes.added, 3, "README, .gitignore, src/lib.rs");
    assert_eq!(first.branch.as_deref(), Some("refs/heads/agent/edits-c1"));
    let index_before = std::fs::read(ws.join(".git/index")).unwrap();

    std::fs::write(ws.join("README.md"), "changed\n").unwrap();
    std::fs::write(ws.join("new.txt"), "new\n").unwrap();
    std::fs::write(ws.join("debug.log"), "ignored\n").unwrap();
    std::fs::remove_file(ws.join("src/lib.rs")).unwrap();
    let second = git2
        .snapshot(&p, id, Some(&first.id), IgnoredFiles::Excluded)
        .unwrap();
    assert_eq!(
        (
            second.changes.added,
            second.changes.modified,
            second.changes.deleted
        ),
        (1, 1, 1),
        "the ignored file is not in the point"
    );
    assert_eq!(std::fs::read(ws.join(".git/index")).unwrap(), index_before);
    let diff = git2
        .history_diff(&p, &first.id, &second.id, 1 << 20)
        .unwrap();
    assert_eq!(diff.files.len(), 3);
    assert!(diff.patch.contains("+changed"), "{}", diff.patch);

    let report = git2.rewind(&p, id, &second.id, &first.id, None).unwrap();
    assert_eq!((report.files_written, report.files_removed), (2, 1));
    assert_eq!(
        std::fs::read_to_string(ws.join("README.md")).unwrap(),
        "hello again\n"
    );
    assert!(ws.join("src/lib.rs").is_file());
    assert!(!ws.join("new.txt").exists());
    assert!(
        ws.join("debug.log").exists(),
        "ignored files are left as they are"
    );
    assert_eq!(
        git(&ws, &["status", "--porcelain"]),
        "",
        "clean at HEAD again"
    );
    let store_mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&store).unwrap().permissions());
    assert_eq!(store_mode & 0o777, 0o700);
    // A file of the point replaced by a link to a host file, and a hard link to one:
    // the rewind replaces both and writes nothing through them.
    let host = fx.path("host.txt");
    std::fs::write(&host, "host\n").unwrap();
    std::fs::remove_file(ws.join("README.md")).unwrap();
    std::os::unix::fs::symlink(&host, ws.join("README.md")).unwrap();
    std::fs::remove_file(ws.join("src/lib.rs")).unwrap();
    std::fs::hard_link(&host, ws.join("src/lib.rs")).unwrap();
    let planted = git2
        .snapshot(&p, id, Some(&first.id), IgnoredFiles::Excluded)
        .unwrap();
    git2.rewind(&p, id, &planted.id, &first.id, None).unwrap();
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "host\n");
    assert!(std::fs::symlink_metadata(ws.join("README.md"))
        .unwrap()
        .is_file());
    assert_eq!(
        std::fs::read_to_string(ws.join("src/lib.rs")).unwrap(),
        "pub fn f() {}\n"
    );
    // A point of another store is unknown here.
    let other = fx.path("history/u/other");
    assert!(git2
        .history_diff(&paths(&other, &ws, &cache), &first.id, &first.id, 10)
        .is_err());
}

#[test]
fn a_point_after_a_one_file_change_in_five_thousand_hashes_only_that_file() {
    let Checkout {
        fx: _fx,
        cache,
        ws,
        store,
        git2,
    } = Checkout::new("b");
    for d in 0..50 {
        let dir = ws.join(format!("d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..100 {
            std::fs::write(dir.join(format!("f{f}.txt")), format!("{d} {f}\n")).unwrap();
        }
    }
    let p = paths(&store, &ws, &cache);
    let t = Instant::now();
    let first = git2
        .snapshot(&p, Uuid::nil(), None, IgnoredFiles::Excluded)
        .unwrap();
    let cold = t.elapsed();
    assert_eq!(first.changes.added, 5003);
    let mut times = Vec::new();
    let mut last = first.id.clone();
    for i in 0..5 {
        std::fs::write(ws.join("d7/f7.txt"), format!("change {i}\n")).unwrap();
        let t = Instant::now();
        let s = git2
            .snapshot(&p, Uuid::nil(), Some(&last), IgnoredFiles::Excluded)
            .unwrap();
        times.push(t.elapsed());
        assert_eq!(s.changes.modified, 1);
        last = s.id;
    }
    times.sort();
    eprintln!(
        "history point on 5,003 files: first {cold:?}, after a one-file change p50 {:?}",
        times[2]
    );

    // A rewind of a change to 100 files.
    for f in 0..100 {
        std::fs::write(ws.join(format!("d3/f{f}.txt")), "changed\n").unwrap();
    }
    let changed = git2
        .snapshot(&p, Uuid::nil(), Some(&last), IgnoredFiles::Excluded)
        .unwrap();
    assert_eq!(changed.changes.modified, 100);
    let t = Instant::now();
    let report = git2
        .rewind(&p, Uuid::nil(), &changed.id, &last, None)
        .unwrap();
    let took = t.elapsed();
    assert_eq!(report.files_written, 100);
    assert_eq!(
        std::fs::read_to_string(ws.join("d3/f5.txt")).unwrap(),
        "3 5\n"
    );
    eprintln!("history rewind of 100 files in 5,003: {took:?}");
}

#[test]
fn a_fifo_or_socket_planted_in_the_workspace_does_not_stall_a_point() {
    let Checkout {
        fx: _fx,
        cache,
        ws,
        store,
        git2: _,
    } = Checkout::new("b");
    let fifo = std::ffi::CString::new(ws.join("pipe").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let _sock = std::os::unix::net::UnixListener::bind(ws.join("sock")).unwrap();
    std::fs::write(ws.join("plain.txt"), "x\n").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (s, w, c) = (store.clone(), ws.clone(), cache.clone());
    std::thread::spawn(move || {
        let r = Git2Adapter::new().snapshot(
            &paths(&s, &w, &c),
            Uuid::nil(),
            None,
            IgnoredFiles::Excluded,
        );
        let _ = tx.send(r);
    });
    let snap = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the point did not stall on the FIFO")
        .unwrap();
    assert_eq!(
        snap.changes.added, 4,
        "three tracked files and plain.txt, no FIFO or socket"
    );
}

#[test]
fn the_first_point_of_a_checkout_starts_from_its_index_and_records_its_tree() {
    let Checkout {
        fx,
        cache,
        ws,
        store,
        git2,
    } = Checkout::new("b");
    let p = paths(&store, &ws, &cache);
    let first = git2.first_snapshot(&p, Uuid::nil()).unwrap();
    assert_eq!(first.changes.added, 3);
    assert!(!first.dirty);
    assert_eq!(first.head, fx.main);
    std::fs::write(ws.join("README.md"), "edited\n").unwrap();
    let next = git2
        .snapshot(&p, Uuid::nil(), Some(&first.id), IgnoredFiles::Excluded)
        .unwrap();
    assert_eq!((next.changes.modified, next.changes.added), (1, 0));
    assert!(next.dirty);
}

#[test]
fn a_rewind_records_the_point_a_walk_of_the_tree_would_and_head_goes_back() {
    let Checkout {
        fx,
        cache,
        ws,
        store,
        git2,
    } = Checkout::new("b");
    let p = paths(&store, &ws, &cache);
    let id = Uuid::nil();
    let first = git2.first_snapshot(&p, id).unwrap();
    std::fs::write(ws.join("README.md"), "changed\n").unwrap();
    std::fs::create_dir_all(ws.join("new/deep")).unwrap();
    std::fs::write(ws.join("new/deep/file.txt"), "new\n").unwrap();
    git(&ws, &["add", "-A"]);
    git(
        &ws,
        &[
            "-c",
            "user.name=a",
            "-c",
            "user.email=a@b.invalid",
            "commit",
            "-q",
            "-m",
            "agent",
        ],
    );
    std::fs::remove_file(ws.join("src/lib.rs")).unwrap();
    let second = git2
        .snapshot(&p, id, Some(&first.id), IgnoredFiles::Excluded)
        .unwrap();
    assert_ne!(
        second.head, first.head,
        "the agent's commit is the point's HEAD"
    );

    let report = git2.rewind(&p, id, &second.id, &first.id, None).unwrap();
    let point = &report.point;
    assert_eq!((report.files_written, report.files_removed), (2, 1));
    assert_eq!(
        (
            point.changes.added,
            point.changes.modified,
            point.changes.deleted
        ),
        (1, 1, 1),
        "counted against the point the rewind started from"
    );
    assert_eq!(point.head, fx.main);
    assert_eq!(point.branch.as_deref(), Some("refs/heads/b"));
    assert!(!point.dirty);
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), fx.main);
    assert!(!ws.join("new").exists(), "emptied directories go too");
    // A point taken by a walk now finds nothing changed: the rewind's point is the
    // state on disk, and the private index it left describes it.
    let walked = git2
        .snapshot(&p, id, Some(&point.id), IgnoredFiles::Excluded)
        .unwrap();
    assert_eq!(walked.changes, Default::default());
    assert!(git2
        .history_diff(&p, &first.id, &point.id, 1 << 20)
        .unwrap()
        .files
        .is_empty());
    // A file written by the rewind and changed afterwards is seen by the next point.
    std::fs::write(ws.join("README.md"), "after\n").unwrap();
    let next = git2
        .snapshot(&p, id, Some(&walked.id), IgnoredFiles::Excluded)
        .unwrap();
    assert_eq!(next.changes.modified, 1);
}

#[test]
fn a_forks_store_links_the_sources_objects_and_keeps_its_points_after_the_source_goes() {
    use std::os::unix::fs::MetadataExt;
    let Checkout {
        fx,
        cache,
        ws,
        store,
        git2,
    } = Checkout::new("b");
    let p = paths(&store, &ws, &cache);
    let id = Uuid::nil();
    let first = git2.first_snapshot(&p, id).unwrap();
    std::fs::write(ws.join("README.md"), "source change\n").unwrap();
    let second = git2
        .snapshot(&p, id, Some(&first.id), IgnoredFiles::Excluded)
        .unwrap();

    let fork_ws = fx.path("fork");
    git2.create_checkout(&fx.request(&cache, &fork_ws, "main", Some("f")))
        .unwrap();
    let fork_store = fx.path("history/u/fork");
    let fp = paths(&fork_store, &fork_ws, &cache);
    let fork_first = git2.first_snapshot(&fp, id).unwrap();
    git2.copy_history(&store, &fork_store).unwrap();
    let a = &second.id;
    let object = |root: &Path| root.join("objects").join(&a[..2]).join(&a[2..]);
    assert_eq!(
        std::fs::metadata(object(&store)).unwrap().ino(),
        std::fs::metadata(object(&fork_store)).unwrap().ino(),
        "an object is linked, not copied"
    );
    let mode = std::fs::metadata(&fork_store).unwrap().mode();
    assert_eq!(mode & 0o777, 0o700);

    let report = git2
        .rewind(&fp, id, &fork_first.id, &second.id, Some("refs/heads/f"))
        .unwrap();
    assert!(report.point.dirty);
    assert_eq!(
        std::fs::read_to_string(fork_ws.join("README.md")).unwrap(),
        "source change\n"
    );
    assert_eq!(git(&fork_ws, &["symbolic-ref", "HEAD"]), "refs/heads/f");
    git2.discard_history(&store).unwrap();
    let diff = git2
        .history_diff(&fp, &first.id, &second.id, 1 << 20)
        .unwrap();
    assert_eq!(diff.files.len(), 1, "the source's points outlive its store");
}

#[test]
fn packing_a_store_keeps_every_point_and_leaves_no_loose_object() {
    let Checkout {
        fx: _fx,
        cache,
        ws,
        store,
        git2,
    } = Checkout::new("b");
    let p = paths(&store, &ws, &cache);
    let id = Uuid::nil();
    let mut points = vec![git2.first_snapshot(&p, id).unwrap()];
    for i in 0..20 {
        std::fs::write(ws.join("README.md"), format!("hello\nedit {i}\n")).unwrap();
        let last = points.last().unwrap().id.clone();
        points.push(
            git2.snapshot(&p, id, Some(&last), IgnoredFiles::Excluded)
                .unwrap(),
        );
    }
    let loose = |s: &Path| {
        std::fs::read_dir(s.join("objects"))
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.file_name().len() == 2)
            .map(|e| std::fs::read_dir(e.path()).unwrap().count())
            .sum::<usize>()
    };
    let before = loose(&store);
    assert!(before >= 40, "a blob, a tree and a commit per point");
    assert_eq!(git2.pack_history(&p).unwrap(), before);
    assert_eq!(loose(&store), 0);
    let fan_out = std::fs::read_dir(store.join("objects"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().len() == 2)
        .count();
    assert_eq!(fan_out, 0, "emptied fan-out directories are removed");
    assert_eq!(git2.history_loose_objects(&store), 0);
    let ref_files = std::fs::read_dir(store.join("refs/points"))
        .unwrap()
        .count();
    assert_eq!(ref_files, 0, "the point refs are in packed-refs");
    // A store made from a packed one, then given its points again, reads them all.
    let other = store.with_file_name("other");
    git2.copy_history(&store, &other).unwrap();
    git2.copy_history(&store, &other).unwrap();
    let op = paths(&other, &ws, &cache);
    let last = &points.last().unwrap().id;
    let diff = git2
        .history_diff(&op, &points[0].id, last, 1 << 20)
        .unwrap();
    assert_eq!(diff.files.len(), 1);
    for (i, pair) in points.windows(2).enumerate().skip(1) {
        let diff = git2
            .history_diff(&p, &pair[0].id, &pair[1].id, 1 << 20)
            .unwrap();
        assert!(diff.patch.contains(&format!("+edit {i}")), "{}", diff.patch);
    }
    // The store takes points after packing, and a rewind reads from the pack.
    std::fs::write(ws.join("README.md"), "after\n").unwrap();
    let last = points.last().unwrap().id.clone();
    let after = git2
        .snapshot(&p, id, Some(&last), IgnoredFiles::Excluded)
        .unwrap();
    git2.rewind(&p, id, &after.id, &points[3].id, None).unwrap();
    assert_eq!(
        std::fs::read_to_string(ws.join("README.md")).unwrap(),
        "hello\nedit 2\n"
    );
    // Packing again makes one pack of everything, not a second pack beside the first
    // (versions in separate packs cannot be deltas of each other).
    let packs = |s: &Path| {
        std::fs::read_dir(s.join("objects/pack"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("pack".as_ref()))
            .count()
    };
    assert!(git2.pack_history(&p).unwrap() > 0);
    assert_eq!(packs(&store), 1);
    assert_eq!(loose(&store), 0);
    let diff = git2
        .history_diff(&p, &points[0].id, &after.id, 1 << 20)
        .unwrap();
    assert_eq!(diff.files.len(), 1);
}

/// Bytes of every file under `dir`.
fn size_of_dir(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() {
            size_of_dir(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}

/// `len` bytes no compressor shrinks (xorshift from `seed`).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn pruning_points_deletes_the_objects_only_they_held_and_packs_the_store() {
    if std::process::Command::new("git")
        .arg("--version")
        .output()
        .map_or(true, |o| !o.status.success())
    {
        eprintln!("skipped: no git binary, so pruned stores are not repacked");
        return;
    }
    let Checkout {
        fx: _fx,
        cache,
        ws,
        store,
        git2,
    } = Checkout::new("b");
    let p = paths(&store, &ws, &cache);
    let first = git2.first_snapshot(&p, Uuid::nil()).unwrap();
    let mut ids = vec![first.id.clone()];
    for i in 0..4u64 {
        std::fs::write(ws.join(format!("big{i}.bin")), noise(i + 1, 256 << 10)).unwrap();
        let s = git2
            .snapshot(
                &p,
                Uuid::nil(),
                ids.last().map(String::as_str),
                IgnoredFiles::Excluded,
            )
            .unwrap();
        ids.push(s.id);
    }
    for i in 0..4 {
        std::fs::remove_file(ws.join(format!("big{i}.bin"))).unwrap();
    }
    std::fs::write(ws.join("README.md"), "last\n").unwrap();
    let last = git2
        .snapshot(
            &p,
            Uuid::nil(),
            ids.last().map(String::as_str),
            IgnoredFiles::Excluded,
        )
        .unwrap();
    ids.push(last.id.clone());
    let before = size_of_dir(&store.join("objects"));

    let keep = [first.id.clone(), last.id.clone()];
    assert_eq!(git2.prune_history(&p, &keep).unwrap(), 4);
    let after = size_of_dir(&store.join("objects"));
    assert!(
        after * 4 < before,
        "the store did not shrink: {before} bytes before, {after} after"
    );
    // The kept points still read and compare; a dropped point's content is gone.
    let readme = git2.history_file(&p, &last.id, "README.md").unwrap();
    assert_eq!(readme.as_deref(), Some(&b"last\n"[..]));
    let diff = git2.history_diff(&p, &first.id, &last.id, 1 << 20).unwrap();
    assert_eq!(diff.files.len(), 1);
    assert!(
        git2.history_file(&p, &ids[1], "big0.bin").is_err(),
        "dropped"
    );
    let bare = git2::Repository::open_bare(&store).unwrap();
    let big0 = git2::Oid::hash_object(git2::ObjectType::Blob, &noise(1, 256 << 10)).unwrap();
    assert!(
        bare.find_blob(big0).is_err(),
        "a dropped point's blob stayed"
    );
    // The cache's objects were borrowed for the repack, not copied in.
    let cached = git2::Oid::hash_object(git2::ObjectType::Blob, b"pub fn f() {}\n").unwrap();
    assert!(
        bare.find_blob(cached).is_err(),
        "the cache's blob was packed into the store"
    );
    assert!(git2::Repository::open_bare(&cache)
        .unwrap()
        .find_blob(cached)
        .is_ok());
}

/// A sparse file far larger than memory, made in a moment by an exec (`truncate -s`),
/// must not take the process that takes the point down: a point reads no file past
/// [`grove_git::MAX_POINT_FILE_BYTES`]; one larger is left out of the point (as a
/// deleted file would be) and the rest of the point is taken.
#[test]
fn a_huge_sparse_file_in_the_workspace_is_left_out_of_a_point_unread() {
    let Checkout {
        fx: _fx,
        cache,
        ws,
        store,
        git2,
    } = Checkout::new("b");
    let p = paths(&store, &ws, &cache);
    let first = git2
        .snapshot(&p, Uuid::nil(), None, IgnoredFiles::Excluded)
        .unwrap();
    // 1 TiB: no allocation of that size succeeds, so reading it whole would abort.
    let big = std::fs::File::create(ws.join("big.bin")).unwrap();
    big.set_len(1 << 40).unwrap();
    drop(big);
    let only_big = git2
        .snapshot(&p, Uuid::nil(), Some(&first.id), IgnoredFiles::Excluded)
        .unwrap();
    assert_eq!(only_big.changes.added, 0, "big.bin is not in the point");
    assert!(
        only_big.dirty,
        "a file the point left out is still a change"
    );
    // A tracked file replaced by one just over the limit is left out too.
    let over = std::fs::File::create(ws.join("README.md")).unwrap();
    over.set_len(grove_git::MAX_POINT_FILE_BYTES + 1).unwrap();
    drop(over);
    std::fs::write(ws.join("small.txt"), "kept\n").unwrap();
    let second = git2
        .snapshot(&p, Uuid::nil(), Some(&only_big.id), IgnoredFiles::Excluded)
        .unwrap();
    assert_eq!(
        (second.changes.added, second.changes.deleted),
        (1, 1),
        "small.txt in; README.md out; big.bin never read"
    );
    let small = git2.history_file(&p, &second.id, "small.txt").unwrap();
    assert_eq!(small.as_deref(), Some(&b"kept\n"[..]));
    assert_eq!(
        git2.history_file(&p, &second.id, "README.md").unwrap(),
        None
    );
    // The host is unchanged: the workspace's files are as the exec left them.
    assert_eq!(
        std::fs::metadata(ws.join("big.bin")).unwrap().len(),
        1 << 40
    );
}

/// libgit2 reads a workspace's `.gitignore` and `.gitattributes` files by path during
/// the walk: one that is a FIFO (or a link to one) would block the point's open() for
/// as long as no writer comes, holding the workspace's lock. Such a point is refused at
/// once with an error naming the file, the workspace left as it is; with the FIFOs
/// gone the next point is taken.
#[test]
fn a_fifo_planted_as_gitignore_or_gitattributes_refuses_the_point_without_stalling() {
    let Checkout {
        fx: _fx,
        cache,
        ws,
        store,
        git2: _,
    } = Checkout::new("b");
    let mkfifo = |path: &Path| {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    };
    std::fs::create_dir_all(ws.join("sub/deeper")).unwrap();
    std::fs::write(ws.join("sub/deeper/x.txt"), "x\n").unwrap();
    let take = || {
        let (tx, rx) = std::sync::mpsc::channel();
        let (s, w, c) = (store.clone(), ws.clone(), cache.clone());
        std::thread::spawn(move || {
            let p = paths(&s, &w, &c);
            let r = Git2Adapter::new().snapshot(&p, Uuid::nil(), None, IgnoredFiles::Excluded);
            let _ = tx.send(r);
        });
        rx.recv_timeout(std::time::Duration::from_secs(20))
            .expect("the point stalled on a rule file")
    };
    // The last is a link to a FIFO, followed as libgit2 follows it.
    let planted = [
        "sub/.gitignore",
        "sub/.gitattributes",
        "sub/deeper/.gitignore",
    ];
    mkfifo(&ws.join("sub/deeper/fifo"));
    for rel in planted {
        if rel.starts_with("sub/deeper") {
            std::os::unix::fs::symlink("fifo", ws.join(rel)).unwrap();
        } else {
            mkfifo(&ws.join(rel));
        }
        let err = take().expect_err(rel).to_string();
        // A link is refused as a link, before anything follows it.
        let why = if rel.starts_with("sub/deeper") {
            "symbolic link"
        } else {
            "not a regular file"
        };
        assert!(err.contains(rel) && err.contains(why), "{err}");
        assert!(
            std::fs::symlink_metadata(ws.join(rel)).is_ok(),
            "left as it is"
        );
        std::fs::remove_file(ws.join(rel)).unwrap();
    }
    let snap = take().unwrap();
    let x = Git2Adapter::new()
        .history_file(&paths(&store, &ws, &cache), &snap.id, "sub/deeper/x.txt")
        .unwrap();
    assert_eq!(x.as_deref(), Some(&b"x\n"[..]));
}

/// A `.gitignore` (at the root or nested) or a `.gitattributes` that is a symbolic link
/// to a host file is never followed (git itself no longer follows one in the tree):
/// while it is there a point, the status tool and the dirty check refuse the walk, so
/// the host file's lines never decide which workspace files are left out (a one-bit
/// oracle on the host file), and nothing of it reaches the store; with the link gone the
/// file a host line named is in the next point like any other. Host and workspace stay
/// as they were.
#[test]
fn a_rule_file_linked_to_a_host_file_is_never_followed() {
    let Checkout {
        fx,
        cache,
        ws,
        store,
        git2,
    } = Checkout::new("b");
    let host = fx.path("host-rules");
    let host_text = b"guessed-secret-line\n";
    std::fs::write(&host, host_text).unwrap();
    std::fs::write(ws.join("guessed-secret-line"), "the agent's file\n").unwrap();
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    std::fs::write(ws.join("sub/kept.txt"), "kept\n").unwrap();
    let p = paths(&store, &ws, &cache);
    // The fixture's own `.gitignore` (`*.log`) is put back after the attacks.
    let tracked = std::fs::read(ws.join(".gitignore")).unwrap();
    for rel in [".gitignore", "sub/.gitignore", "sub/.gitattributes"] {
        let _ = std::fs::remove_file(ws.join(rel));
        std::os::unix::fs::symlink(&host, ws.join(rel)).unwrap();
        let refused = |what: &str, r: Result<(), GitError>| {
            let err = r.expect_err(what);
            assert!(
                matches!(err, GitError::Untrusted(_)) && err.to_string().contains(rel),
                "{what} with {rel}: {err}"
            );
        };
        refused(
            "a point",
            git2.snapshot(&p, Uuid::nil(), None, IgnoredFiles::Excluded)
                .map(drop),
        );
        refused("the status tool", git2.status(&ws).map(drop));
        refused("the dirty check", git2.is_dirty(&ws).map(drop));
        assert!(
            std::fs::symlink_metadata(ws.join(rel))
                .unwrap()
                .file_type()
                .is_symlink(),
            "the link was touched"
        );
        std::fs::remove_file(ws.join(rel)).unwrap();
    }
    assert_eq!(
        std::fs::read(&host).unwrap(),
        host_text,
        "the host file changed"
    );
    std::fs::write(ws.join(".gitignore"), tracked).unwrap();
    let snap = git2
        .snapshot(&p, Uuid::nil(), None, IgnoredFiles::Excluded)
        .unwrap();
    assert_eq!(
        git2.history_file(&p, &snap.id, "guessed-secret-line")
            .unwrap()
            .as_deref(),
        Some(&b"the agent's file\n"[..]),
        "the file a host line named is left out of the point"
    );
    let untracked: Vec<String> = git2
        .status(&ws)
        .unwrap()
        .entries
        .iter()
        .map(|e| e.path.clone())
        .collect();
    assert!(
        untracked.iter().any(|p| p == "guessed-secret-line"),
        "{untracked:?}"
    );
    let blob = git2::Oid::hash_object(git2::ObjectType::Blob, host_text).unwrap();
    let stored = git2::Repository::open_bare(&store)
        .unwrap()
        .odb()
        .unwrap()
        .exists(blob);
    assert!(!stored, "the host file's content is in the store");
}

/// The workspace's own `.git/info/exclude`, `.git/info/attributes` and `.git/config`
/// planted as FIFOs: libgit2 opens the first two as rules and the last while opening
/// the repository. The status tool and a point refuse the workspace at once, with an
/// error that says why, and wait on none of them.
#[test]
fn fifos_planted_in_the_workspaces_git_dir_stall_no_walk() {
    for planted in [".git/info/exclude", ".git/info/attributes", ".git/config"] {
        let Checkout {
            fx: _fx,
            cache,
            ws,
            store,
            git2: _,
        } = Checkout::new("b");
        std::fs::create_dir_all(ws.join(".git/info")).unwrap();
        let _ = std::fs::remove_file(ws.join(planted));
        let c = std::ffi::CString::new(ws.join(planted).as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let (s, w, c) = (store.clone(), ws.clone(), cache.clone());
        std::thread::spawn(move || {
            let git2 = Git2Adapter::new();
            let status = git2.status(&w).map(|_| ());
            let _ = tx.send(("status", status));
            let point = git2
                .snapshot(
                    &paths(&s, &w, &c),
                    Uuid::nil(),
                    None,
                    IgnoredFiles::Excluded,
                )
                .map(|_| ());
            let _ = tx.send(("point", point));
        });
        for _ in 0..2 {
            let (what, answer) = rx
                .recv_timeout(std::time::Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("a walk stalled on {planted}"));
            let err = answer.expect_err(what).to_string();
            assert!(
                err.contains("not a regular file"),
                "{planted}: {what}: {err}"
            );
        }
    }
}
