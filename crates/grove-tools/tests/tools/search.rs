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
