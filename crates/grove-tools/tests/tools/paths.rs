//! Path safety: every escape is refused with a typed error, and nothing outside the
//! root is read or written.

use grove_core::error::ErrorKind;
use grove_core::tools::ToolOp;
use grove_tools::ToolError;

use crate::support::Scratch;

fn assert_refused(r: Result<impl std::fmt::Debug, ToolError>, what: &str) {
    match r {
        Err(ToolError::InvalidPath { .. }) | Err(ToolError::OutsideRoot { .. }) => {}
        other => panic!("{what}: expected a path refusal, got {other:?}"),
    }
}

/// Every tool that takes a path, tried on `path`: each must refuse it.
fn every_tool_refuses(s: &Scratch, path: &str) {
    let ws = s.ws();
    assert_refused(ws.read_file(path), "read_file");
    assert_refused(ws.view(path, None), "view");
    assert_refused(ws.write_file(path, "pwned"), "write_file");
    assert_refused(ws.create(path, "pwned"), "create");
    assert_refused(ws.str_replace(path, "top", "pwned"), "str_replace");
    assert_refused(ws.insert(path, 0, "pwned"), "insert");
    assert_refused(ws.list_dir(Some(path)), "list_dir");
    assert_refused(
        ws.search(&grove_tools::SearchQuery {
            pattern: "secret",
            path: Some(path),
            ..Default::default()
        }),
        "search",
    );
    assert_refused(ws.check_paths(&[path.to_string()]), "git paths");
    // Nothing outside changed.
    assert_eq!(
        std::fs::read_to_string(s.outside.join("secret.txt")).unwrap(),
        "top secret\n"
    );
    assert_eq!(std::fs::read_dir(&s.outside).unwrap().count(), 1);
}

#[test]
fn dot_dot_is_refused() {
    let s = Scratch::new();
    every_tool_refuses(&s, "../outside/secret.txt");
    every_tool_refuses(&s, "a/../../outside/secret.txt");
}

#[test]
fn absolute_paths_are_refused() {
    let s = Scratch::new();
    let abs = s.outside.join("secret.txt");
    every_tool_refuses(&s, abs.to_str().unwrap());
    every_tool_refuses(&s, "/etc/passwd");
}

#[test]
fn nul_bytes_are_refused() {
    let s = Scratch::new();
    every_tool_refuses(&s, "a\0b");
}

#[test]
fn overlong_names_and_paths_are_refused() {
    let s = Scratch::new();
    every_tool_refuses(&s, &"n".repeat(256));
    every_tool_refuses(&s, &"d/".repeat(2100));
}

#[test]
fn a_symlink_to_etc_is_refused() {
    let s = Scratch::new();
    s.symlink("/etc", "etc");
    every_tool_refuses(&s, "etc/passwd");
    every_tool_refuses(&s, "etc");
}

#[test]
fn a_symlink_inside_to_a_file_outside_is_refused() {
    let s = Scratch::new();
    s.symlink(s.outside.join("secret.txt"), "innocent.txt");
    every_tool_refuses(&s, "innocent.txt");
    // Relative, too.
    s.symlink("../outside/secret.txt", "relative.txt");
    every_tool_refuses(&s, "relative.txt");
    // And a directory symlink used as a parent for a new file.
    s.symlink("../outside", "out");
    every_tool_refuses(&s, "out/new.txt");
    assert!(!s.outside.join("new.txt").exists());
}

#[test]
fn symlink_chains_that_end_outside_are_refused() {
    let s = Scratch::new();
    s.symlink("../outside/secret.txt", "c");
    s.symlink("c", "b");
    s.symlink("sub/../b", "a0");
    std::fs::create_dir_all(s.root.join("sub")).unwrap();
    s.symlink("b", "a");
    every_tool_refuses(&s, "a");
    every_tool_refuses(&s, "a0");
}

#[test]
fn symlinks_that_stay_inside_are_followed() {
    let s = Scratch::new();
    s.write("real/target.txt", "inside\n");
    s.symlink("real/target.txt", "link1");
    s.symlink("link1", "link2");
    s.symlink("real", "dirlink");
    let ws = s.ws();
    assert_eq!(ws.read_file("link2").unwrap().0, "inside\n");
    assert_eq!(ws.read_file("dirlink/target.txt").unwrap().0, "inside\n");
    ws.str_replace("link2", "inside", "edited").unwrap();
    assert_eq!(s.read("real/target.txt"), "edited\n");
}

#[test]
fn a_symlink_loop_is_refused_with_a_typed_error() {
    let s = Scratch::new();
    s.symlink("loop2", "loop1");
    s.symlink("loop1", "loop2");
    assert!(matches!(
        s.ws().read_file("loop1"),
        Err(ToolError::InvalidPath { .. })
    ));
}

#[test]
fn a_hard_linked_file_is_refused() {
    let s = Scratch::new();
    // Same filesystem (both under one temp dir), so the link can be made.
    std::fs::hard_link(s.outside.join("secret.txt"), s.root.join("hard.txt")).unwrap();
    let ws = s.ws();
    assert!(matches!(
        ws.read_file("hard.txt"),
        Err(ToolError::InvalidPath { .. })
    ));
    assert!(matches!(
        ws.write_file("hard.txt", "pwned"),
        Err(ToolError::InvalidPath { .. })
    ));
    assert_eq!(
        std::fs::read_to_string(s.outside.join("secret.txt")).unwrap(),
        "top secret\n"
    );
}

#[test]
fn a_fifo_does_not_hang_a_read_or_write() {
    let s = Scratch::new();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        s.root.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    assert!(matches!(
        s.ws().read_file("fifo"),
        Err(ToolError::NotAFile { .. })
    ));
    assert!(matches!(
        s.ws().write_file("fifo", "x"),
        Err(ToolError::NotAFile { .. })
    ));
}

#[test]
fn path_refusals_are_bad_input_to_the_caller() {
    let s = Scratch::new();
    s.symlink("/etc", "etc");
    let op = ToolOp::ReadFile {
        path: "etc/passwd".into(),
    };
    let err = s.ws().run(&op).unwrap_err();
    assert!(matches!(err, ToolError::OutsideRoot { .. }));
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(!err.to_string().contains(s.root.to_str().unwrap()));
}

#[test]
fn git_paths_are_normalized_and_the_root_means_everything() {
    let s = Scratch::new();
    s.write("src/a.rs", "");
    let ws = s.ws();
    assert_eq!(
        ws.check_paths(&["./src//a.rs".into(), "gone.txt".into()])
            .unwrap(),
        vec!["src/a.rs".to_string(), "gone.txt".to_string()]
    );
    assert!(ws
        .check_paths(&["src".into(), ".".into()])
        .unwrap()
        .is_empty());
    assert!(matches!(
        ws.check_paths(&[".git/config".into()]),
        Err(ToolError::InvalidPath { .. })
    ));
}
