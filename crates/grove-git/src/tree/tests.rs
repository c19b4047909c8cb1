//! Attacks on the descriptor walks: planted symlinks, a link in the root's place, a
//! directory swapped for a link while the walk runs, and a tree too deep to hold.

use super::*;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A workspace-like tree and, beside it, a host directory the walk must never touch.
fn fixture() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let host = tmp.path().join("host");
    std::fs::create_dir_all(ws.join("src/deep")).unwrap();
    std::fs::write(ws.join("src/deep/a.txt"), b"12345").unwrap();
    std::fs::write(ws.join("top.txt"), b"xy").unwrap();
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("secret"), b"host secret").unwrap();
    symlink(&host, ws.join("to-host-dir")).unwrap();
    symlink(host.join("secret"), ws.join("src/to-host-file")).unwrap();
    (tmp, ws, host)
}

fn owner(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}

#[test]
fn chown_tree_reowns_links_themselves_and_never_their_targets() {
    if !is_root() {
        eprintln!("skipping: changing ownership needs root");
        return;
    }
    let (_tmp, ws, host) = fixture();
    chown_tree(&ws, 4242, 4343).unwrap();
    for p in [
        "",
        "src",
        "src/deep",
        "src/deep/a.txt",
        "top.txt",
        "to-host-dir",
        "src/to-host-file",
    ] {
        assert_eq!(owner(&ws.join(p)), (4242, 4343), "{p}");
    }
    assert_eq!(owner(&host), (0, 0));
    assert_eq!(owner(&host.join("secret")), (0, 0));
}

#[test]
fn hand_over_leaves_a_tree_whose_top_is_already_owned() {
    if !is_root() {
        eprintln!("skipping: changing ownership needs root");
        return;
    }
    let (_tmp, ws, _host) = fixture();
    std::os::unix::fs::lchown(&ws, Some(4242), Some(4242)).unwrap();
    hand_over(&ws, 4242, 4242).unwrap();
    assert_eq!(
        owner(&ws.join("top.txt")),
        (0, 0),
        "an owned top means handed over"
    );
    hand_over(&ws, 5000, 5000).unwrap();
    assert_eq!(owner(&ws.join("top.txt")), (5000, 5000));
    assert_eq!(owner(&ws), (5000, 5000));
}

#[test]
fn remove_tree_removes_links_and_keeps_what_they_point_at() {
    let (_tmp, ws, host) = fixture();
    remove_tree(&ws).unwrap();
    assert!(!ws.exists() && std::fs::symlink_metadata(&ws).is_err());
    assert_eq!(std::fs::read(host.join("secret")).unwrap(), b"host secret");
    remove_tree(&ws).unwrap(); // a missing root is fine
    remove_tree(&ws.join("gone/deeper")).unwrap(); // and so is a missing parent
}

#[test]
fn a_link_in_the_roots_place_is_refused_or_removed_itself() {
    let (tmp, _ws, host) = fixture();
    let link = tmp.path().join("swapped");
    symlink(&host, &link).unwrap();
    assert!(chown_tree(&link, 4242, 4242).is_err());
    assert!(tree_size(&link).is_err());
    remove_tree(&link).unwrap();
    assert!(std::fs::symlink_metadata(&link).is_err());
    assert_eq!(std::fs::read(host.join("secret")).unwrap(), b"host secret");
}

#[test]
fn tree_size_counts_files_and_links_not_link_targets() {
    let (_tmp, ws, host) = fixture();
    let links = std::fs::read_link(ws.join("to-host-dir"))
        .unwrap()
        .as_os_str()
        .len()
        + std::fs::read_link(ws.join("src/to-host-file"))
            .unwrap()
            .as_os_str()
            .len();
    assert_eq!(tree_size(&ws).unwrap(), (5 + 2 + links) as u64);
    assert!(std::fs::metadata(host.join("secret")).unwrap().len() > 0);
}

#[test]
fn a_directory_swapped_for_a_link_mid_walk_never_leads_outside() {
    if !is_root() {
        eprintln!("skipping: changing ownership needs root");
        return;
    }
    let (_tmp, ws, host) = fixture();
    for i in 0..200 {
        std::fs::write(ws.join(format!("src/deep/f{i}")), b"x").unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, ws, host) = (stop.clone(), ws.clone(), host.clone());
        std::thread::spawn(move || {
            let (real, aside, link) = (
                ws.join("src/deep"),
                ws.join("src/aside"),
                ws.join("src/lnk"),
            );
            symlink(&host, &link).unwrap();
            while !stop.load(Ordering::Relaxed) {
                // deep <-> link, back and forth, as a process in the sandbox could.
                let _ = std::fs::rename(&real, &aside);
                let _ = std::fs::rename(&link, &real);
                let _ = std::fs::rename(&real, &link);
                let _ = std::fs::rename(&aside, &real);
            }
        })
    };
    for round in 0..30u32 {
        let _ = chown_tree(&ws, 7000 + round, 7000 + round);
        let _ = tree_size(&ws);
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert_eq!(owner(&host), (0, 0));
    assert_eq!(owner(&host.join("secret")), (0, 0));
    remove_tree(&ws).unwrap();
    assert_eq!(std::fs::read(host.join("secret")).unwrap(), b"host secret");
}

#[test]
fn a_tree_deeper_than_the_limit_is_an_error_not_a_crash() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ws");
    std::fs::create_dir(&root).unwrap();
    let mut dir = rustix::fs::open(&root, DIR_FLAGS, Mode::empty()).unwrap();
    for _ in 0..MAX_DEPTH + 5 {
        rustix::fs::mkdirat(&dir, c"d", Mode::from_raw_mode(0o700)).unwrap();
        dir = rustix::fs::openat(&dir, c"d", DIR_FLAGS, Mode::empty()).unwrap();
    }
    drop(dir);
    let err = tree_size(&root).unwrap_err();
    assert!(err.to_string().contains("deeper than"), "{err}");
}
