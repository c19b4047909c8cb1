//! Ignored files in history points (ADR 28), for a workspace that opted in: kept up to
//! the budget in path order and counted beyond it, tracked files never counted as
//! ignored, and hostile ignored entries (links out, FIFOs, huge files) never followed,
//! read whole or allowed to stall a point.

use std::time::Duration;

use grove_core::history::{HistoryPort, IgnoredFiles, Snapshot};
use uuid::Uuid;

use crate::history::{paths, Checkout};
use crate::support::git;

fn budget(bytes: u64) -> IgnoredFiles {
    IgnoredFiles::Included {
        budget_bytes: bytes,
    }
}

fn counts(s: &Snapshot) -> (u32, u32, u32) {
    (s.changes.added, s.changes.modified, s.changes.deleted)
}

#[test]
fn ignored_files_are_kept_within_the_budget_in_path_order_and_counted_beyond_it() {
    let c = Checkout::new("b");
    let p = paths(&c.store, &c.ws, &c.cache);
    let first = c.git2.first_snapshot(&p, Uuid::nil()).unwrap();
    std::fs::write(c.ws.join("a.log"), "0123456789").unwrap();
    std::fs::write(c.ws.join("b.log"), vec![b'b'; 100]).unwrap();
    std::fs::create_dir_all(c.ws.join("deep")).unwrap();
    std::fs::write(c.ws.join("deep/c.log"), "cccccccccc").unwrap();

    // 25 bytes: a.log (10) fits, b.log (100) does not, deep/c.log (10) still does.
    let second = c
        .git2
        .snapshot(&p, Uuid::nil(), Some(&first.id), budget(25))
        .unwrap();
    assert_eq!(counts(&second), (2, 0, 0));
    assert_eq!(second.ignored_omitted, 1);
    assert!(!second.dirty, "ignored files never make a workspace dirty");
    let at = |point: &str, path: &str| c.git2.history_file(&p, point, path).unwrap();
    assert_eq!(at(&second.id, "a.log").unwrap(), b"0123456789");
    assert_eq!(at(&second.id, "deep/c.log").unwrap(), b"cccccccccc");
    assert_eq!(at(&second.id, "b.log"), None);

    // Nothing changed: the same files, the same omission.
    let third = c
        .git2
        .snapshot(&p, Uuid::nil(), Some(&second.id), budget(25))
        .unwrap();
    assert_eq!((counts(&third), third.ignored_omitted), ((0, 0, 0), 1));

    // deep/c.log grows past the room left: it leaves the point.
    std::fs::write(c.ws.join("deep/c.log"), vec![b'c'; 1000]).unwrap();
    std::fs::write(c.ws.join("README.md"), "edited\n").unwrap();
    let fourth = c
        .git2
        .snapshot(&p, Uuid::nil(), Some(&third.id), budget(25))
        .unwrap();
    assert_eq!(
        counts(&fourth),
        (0, 1, 1),
        "README edited, deep/c.log left out"
    );
    assert_eq!(fourth.ignored_omitted, 2);
    assert!(fourth.dirty);
    assert_eq!(at(&fourth.id, "deep/c.log"), None);

    // A rewind to the point before any of them removes the one the point kept and
    // leaves those no point holds.
    c.git2
        .rewind(&p, Uuid::nil(), &fourth.id, &first.id, None)
        .unwrap();
    assert!(!c.ws.join("a.log").exists());
    assert!(c.ws.join("b.log").exists() && c.ws.join("deep/c.log").exists());
    // Excluded again (the default): the ignored files leave the point.
    let fifth = c
        .git2
        .snapshot(&p, Uuid::nil(), Some(&first.id), IgnoredFiles::Excluded)
        .unwrap();
    assert_eq!((counts(&fifth), fifth.ignored_omitted), ((0, 0, 0), 0));
}

#[test]
fn a_tracked_file_the_rules_match_is_kept_whatever_the_budget() {
    let c = Checkout::new("b");
    std::fs::write(c.ws.join("tracked.log"), "tracked\n").unwrap();
    git(&c.ws, &["add", "-f", "tracked.log"]);
    git(
        &c.ws,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "log",
        ],
    );
    std::fs::write(c.ws.join("loose.log"), "loose\n").unwrap();
    let p = paths(&c.store, &c.ws, &c.cache);
    let s = c.git2.snapshot(&p, Uuid::nil(), None, budget(0)).unwrap();
    assert_eq!(s.ignored_omitted, 1, "only loose.log is an ignored file");
    let kept = c.git2.history_file(&p, &s.id, "tracked.log").unwrap();
    assert_eq!(kept.as_deref(), Some(&b"tracked\n"[..]));
    assert!(!s.dirty);
}

#[test]
fn hostile_ignored_entries_are_never_followed_read_whole_or_waited_on() {
    let c = Checkout::new("b");
    let host = c.fx.path("host");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("secret"), "host secret\n").unwrap();
    let ws = &c.ws;
    std::os::unix::fs::symlink(host.join("secret"), ws.join("file-link.log")).unwrap();
    std::os::unix::fs::symlink(&host, ws.join("dir-link.log")).unwrap();
    let fifo = std::ffi::CString::new(ws.join("pipe.log").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    // 8 GiB that take no disk: over any budget, never read.
    let huge = std::fs::File::create(ws.join("huge.log")).unwrap();
    huge.set_len(8 << 30).unwrap();
    drop(huge);
    std::fs::write(ws.join("small.log"), "small\n").unwrap();

    let (tx, rx) = std::sync::mpsc::channel();
    let (s, w, ca) = (c.store.clone(), c.ws.clone(), c.cache.clone());
    std::thread::spawn(move || {
        let adapter = grove_git::Git2Adapter::new();
        let _ = tx.send(adapter.snapshot(&paths(&s, &w, &ca), Uuid::nil(), None, budget(1 << 20)));
    });
    let snap = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the point did not stall on the FIFO")
        .unwrap();
    assert_eq!(snap.ignored_omitted, 1, "huge.log");
    let p = paths(&c.store, &c.ws, &c.cache);
    let at = |path: &str| c.git2.history_file(&p, &snap.id, path).unwrap();
    // Links are kept as links: their targets' paths, never their content.
    assert_eq!(
        at("file-link.log").unwrap(),
        host.join("secret").as_os_str().as_encoded_bytes()
    );
    assert_eq!(
        at("dir-link.log").unwrap(),
        host.as_os_str().as_encoded_bytes()
    );
    assert_eq!(at("dir-link.log/secret"), None);
    assert_eq!(at("pipe.log"), None);
    assert_eq!(at("huge.log"), None);
    assert_eq!(at("small.log").unwrap(), b"small\n");
    let secret = git2::Oid::hash_object(git2::ObjectType::Blob, b"host secret\n").unwrap();
    let store = git2::Repository::open_bare(&c.store).unwrap();
    assert!(
        store.find_blob(secret).is_err(),
        "a host file was read into the store"
    );
}
