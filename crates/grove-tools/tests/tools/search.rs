//! Search over the working tree: uncommitted edits, globs, case, literal or regex,
//! the hit limit, `.git` and binary files skipped.

use grove_tools::{SearchQuery, ToolError};

use crate::support::Scratch;

fn q(pattern: &str) -> SearchQuery<'_> {
    SearchQuery {
        pattern,
        case_sensitive: true,
        ..Default::default()
    }
}

fn paths(hits: &[grove_core::tools::SearchHit]) -> Vec<(String, u64)> {
    hits.iter().map(|h| (h.path.clone(), h.line)).collect()
}

#[test]
fn search_sees_edits_made_through_the_tools() {
    let s = Scratch::new();
    s.write("src/a.rs", "fn alpha() {}\n");
    let ws = s.ws();
    assert!(ws.search(&q("beta")).unwrap().0.is_empty());
    ws.str_replace("src/a.rs", "alpha", "beta").unwrap();
    let (hits, truncated) = ws.search(&q("beta")).unwrap();
    assert!(!truncated);
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].path, "src/a.rs");
    assert_eq!(hits[0].line, 1);
    assert_eq!(hits[0].text, "fn beta() {}");
}

#[test]
fn globs_case_and_regex_filter_hits() {
    let s = Scratch::new();
    s.write("src/a.rs", "Needle\nneedle\n");
    s.write("docs/b.md", "needle\n");
    s.write("src/deep/c.rs", "a needle here\n");
    let ws = s.ws();
    let globs = vec!["*.rs".to_string()];
    let (hits, _) = ws
        .search(&SearchQuery {
            globs: &globs,
            ..q("needle")
        })
        .unwrap();
    assert_eq!(
        paths(&hits),
        vec![("src/a.rs".into(), 2), ("src/deep/c.rs".into(), 1)]
    );
    let (hits, _) = ws
        .search(&SearchQuery {
            globs: &globs,
            case_sensitive: false,
            ..q("needle")
        })
        .unwrap();
    assert_eq!(hits.len(), 3);
    let exclude = vec!["!src/**".to_string()];
    let (hits, _) = ws
        .search(&SearchQuery {
            globs: &exclude,
            ..q("needle")
        })
        .unwrap();
    assert_eq!(paths(&hits), vec![("docs/b.md".into(), 1)]);
    // A regex, and the same text as a literal (where `.` is only a dot).
    let (hits, _) = ws
        .search(&SearchQuery {
            regex: true,
            ..q("^N.edle$")
        })
        .unwrap();
    assert_eq!(paths(&hits), vec![("src/a.rs".into(), 1)]);
    assert!(ws.search(&q("N.edle")).unwrap().0.is_empty());
    // Under a path.
    let (hits, _) = ws
        .search(&SearchQuery {
            path: Some("src/deep"),
            ..q("needle")
        })
        .unwrap();
    assert_eq!(paths(&hits), vec![("src/deep/c.rs".into(), 1)]);
    // Under a single file.
    let (hits, _) = ws
        .search(&SearchQuery {
            path: Some("docs/b.md"),
            ..q("needle")
        })
        .unwrap();
    assert_eq!(paths(&hits), vec![("docs/b.md".into(), 1)]);
    assert!(matches!(
        ws.search(&SearchQuery {
            path: Some("nope"),
            ..q("needle")
        }),
        Err(ToolError::NotFound { .. })
    ));
    assert!(matches!(
        ws.search(&SearchQuery {
            regex: true,
            ..q("(")
        }),
        Err(ToolError::InvalidInput(_))
    ));
}

#[test]
fn the_hit_limit_truncates_and_says_so() {
    let s = Scratch::new();
    s.write("f", &"x\n".repeat(50));
    let (hits, truncated) = s
        .ws()
        .search(&SearchQuery {
            max_results: Some(10),
            ..q("x")
        })
        .unwrap();
    assert_eq!(hits.len(), 10);
    assert!(truncated);
    let (hits, truncated) = s
        .ws()
        .search(&SearchQuery {
            max_results: Some(50),
            ..q("x")
        })
        .unwrap();
    assert_eq!(hits.len(), 50);
    assert!(!truncated);
}

#[test]
fn git_metadata_ignored_files_and_binaries_are_skipped() {
    let s = Scratch::new();
    s.write(".git/config", "needle\n");
    s.write(".gitignore", "target/\n");
    s.write("target/out.txt", "needle\n");
    s.write(".github/ci.yml", "needle\n");
    std::fs::write(s.root.join("blob.bin"), b"needle\0\x01").unwrap();
    let (hits, _) = s.ws().search(&q("needle")).unwrap();
    assert_eq!(paths(&hits), vec![(".github/ci.yml".into(), 1)]);
}

#[test]
fn search_does_not_follow_symlinks_out() {
    let s = Scratch::new();
    s.symlink(s.outside.join("secret.txt"), "leak.txt");
    s.symlink(&s.outside, "leakdir");
    let (hits, _) = s.ws().search(&q("secret")).unwrap();
    assert!(hits.is_empty(), "{hits:?}");
}

/// A `.gitignore`, `.ignore` or `.git/info/exclude` that is a symlink to a host file is
/// not read: the host file's lines never become rules (an oracle on a host file's
/// contents: "is my file hidden now?").
#[test]
fn rule_files_that_are_symlinks_out_are_not_read() {
    let s = Scratch::new();
    std::fs::write(s.outside.join("host-rules"), "probe.txt\n").unwrap();
    s.write("probe.txt", "needle\n");
    s.write("sub/probe.txt", "needle\n");
    s.write("deep/probe.txt", "needle\n");
    s.symlink(s.outside.join("host-rules"), ".gitignore");
    s.symlink(s.outside.join("host-rules"), "sub/.ignore");
    std::fs::create_dir_all(s.root.join(".git/info")).unwrap();
    s.symlink(s.outside.join("host-rules"), ".git/info/exclude");
    let (hits, _) = s.ws().search(&q("needle")).unwrap();
    assert_eq!(
        paths(&hits),
        vec![
            ("deep/probe.txt".into(), 1),
            ("probe.txt".into(), 1),
            ("sub/probe.txt".into(), 1)
        ]
    );
}

/// A FIFO (or any non-regular file) named like a rule file does not hang the search:
/// it is not a rule file, and the search answers at once.
#[test]
fn a_fifo_named_as_a_rule_file_does_not_hang_search() {
    let s = Scratch::new();
    s.write("sub/a.txt", "needle\n");
    std::fs::create_dir_all(s.root.join(".git/info")).unwrap();
    for fifo in [
        ".gitignore",
        "sub/.gitignore",
        "sub/.ignore",
        ".git/info/exclude",
    ] {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            s.root.join(fifo),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
    }
    let ws = s.ws();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(ws.search(&q("needle")).map(|(h, _)| paths(&h)));
    });
    let answer = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("search hung on a FIFO rule file");
    assert_eq!(answer.unwrap(), vec![("sub/a.txt".into(), 1)]);
}

/// Rules in nested `.gitignore` files apply beneath their directory, a `!` rule
/// re-includes, and searching under a subdirectory still applies the rules above it.
#[test]
fn nested_rules_apply_beneath_their_directory_and_above_a_start_path() {
    let s = Scratch::new();
    s.write(".gitignore", "*.log\nbuild/\n");
    s.write("a/.gitignore", "!keep.log\nlocal.txt\n");
    s.write("a/keep.log", "needle\n");
    s.write("a/drop.log", "needle\n");
    s.write("a/local.txt", "needle\n");
    s.write("local.txt", "needle\n");
    s.write("a/build/x.txt", "needle\n");
    s.write("a/src/y.txt", "needle\n");
    let ws = s.ws();
    let (hits, _) = ws.search(&q("needle")).unwrap();
    assert_eq!(
        paths(&hits),
        vec![
            ("a/keep.log".into(), 1),
            ("a/src/y.txt".into(), 1),
            ("local.txt".into(), 1)
        ]
    );
    let (hits, _) = ws
        .search(&SearchQuery {
            path: Some("a"),
            ..q("needle")
        })
        .unwrap();
    assert_eq!(
        paths(&hits),
        vec![("a/keep.log".into(), 1), ("a/src/y.txt".into(), 1)]
    );
}

/// A regex anchored at the line's start or end matches per line, not per file.
#[test]
fn anchors_match_at_every_line() {
    let s = Scratch::new();
    s.write("a.txt", "x\nneedle\r\nneedle tail\n");
    let ws = s.ws();
    for (pattern, want) in [
        ("^needle$", vec![2]),
        (r"\Aneedle", vec![2, 3]),
        ("tail$", vec![3]),
    ] {
        let (hits, _) = ws
            .search(&SearchQuery {
                regex: true,
                ..q(pattern)
            })
            .unwrap();
        let lines: Vec<u64> = hits.iter().map(|h| h.line).collect();
        assert_eq!(lines, want, "{pattern}");
    }
}

/// A tree nested far deeper than any source tree neither crashes the search nor makes
/// it walk without end: directories past the depth cap are left out, the rest found.
#[test]
fn a_very_deep_tree_is_searched_to_the_depth_cap_only() {
    let s = Scratch::new();
    s.write("top.txt", "needle\n");
    let mut dir = std::fs::File::open(&s.root).unwrap();
    for _ in 0..(grove_tools::MAX_SEARCH_DEPTH + 50) {
        use std::os::fd::AsFd;
        rustix::fs::mkdirat(dir.as_fd(), "d", rustix::fs::Mode::from_raw_mode(0o755)).unwrap();
        let next = rustix::fs::openat(
            dir.as_fd(),
            "d",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        dir = std::fs::File::from(next);
    }
    use std::io::Write;
    let deepest = rustix::fs::openat(
        &dir,
        "deep.txt",
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CREATE,
        rustix::fs::Mode::from_raw_mode(0o644),
    )
    .unwrap();
    std::fs::File::from(deepest).write_all(b"needle\n").unwrap();
    let (hits, _) = s.ws().search(&q("needle")).unwrap();
    assert_eq!(paths(&hits), vec![("top.txt".into(), 1)]);
}
