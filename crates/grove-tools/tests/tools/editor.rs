//! The text editor's semantics, each edge case.

use grove_tools::ToolError;

use crate::support::Scratch;

#[test]
fn view_numbers_lines_and_honours_a_range() {
    let s = Scratch::new();
    s.write("a.txt", "one\ntwo\nthree\nfour\n");
    let ws = s.ws();
    assert_eq!(
        ws.view("a.txt", None).unwrap(),
        "     1\tone\n     2\ttwo\n     3\tthree\n     4\tfour\n"
    );
    assert_eq!(
        ws.view("a.txt", Some((2, 3))).unwrap(),
        "     2\ttwo\n     3\tthree\n"
    );
    assert_eq!(
        ws.view("a.txt", Some((3, -1))).unwrap(),
        "     3\tthree\n     4\tfour\n"
    );
    assert!(matches!(
        ws.view("a.txt", Some((5, -1))),
        Err(ToolError::LineOutOfRange {
            line: 5,
            lines: 4,
            ..
        })
    ));
    assert!(matches!(
        ws.view("a.txt", Some((2, 9))),
        Err(ToolError::LineOutOfRange { line: 9, .. })
    ));
    assert!(matches!(
        ws.view("a.txt", Some((3, 2))),
        Err(ToolError::InvalidInput(_))
    ));
    assert!(matches!(
        ws.view("missing.txt", None),
        Err(ToolError::NotFound { .. })
    ));
}

#[test]
fn view_of_an_empty_file_is_empty() {
    let s = Scratch::new();
    s.write("empty", "");
    assert_eq!(s.ws().view("empty", None).unwrap(), "");
    assert_eq!(s.ws().view("empty", Some((1, -1))).unwrap(), "");
}

#[test]
fn view_of_a_directory_lists_two_levels_without_hidden_entries() {
    let s = Scratch::new();
    s.write("src/lib.rs", "");
    s.write("src/deep/er/x.rs", "");
    s.write(".hidden/file", "");
    s.write(".env", "");
    s.write("README.md", "");
    std::fs::create_dir_all(s.root.join(".git")).unwrap();
    let text = s.ws().view("", None).unwrap();
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines, vec!["README.md", "src/", "src/deep/", "src/lib.rs"]);
    assert!(matches!(
        s.ws().view(".", Some((1, 2))),
        Err(ToolError::InvalidInput(_))
    ));
}

#[test]
fn create_makes_parents_and_refuses_an_existing_file() {
    let s = Scratch::new();
    let ws = s.ws();
    let w = ws.create("new/dir/f.txt", "hello\n").unwrap();
    assert!(w.created);
    assert_eq!(w.size_bytes, 6);
    assert_eq!(
        w.sha256,
        "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
    );
    assert_eq!(s.read("new/dir/f.txt"), "hello\n");
    assert!(matches!(
        ws.create("new/dir/f.txt", "again"),
        Err(ToolError::AlreadyExists { .. })
    ));
    assert_eq!(s.read("new/dir/f.txt"), "hello\n");
    // A dangling symlink is something that exists, too.
    s.symlink("nowhere", "dangling");
    assert!(matches!(
        ws.create("dangling", "x"),
        Err(ToolError::AlreadyExists { .. })
    ));
    assert!(matches!(
        ws.create("new", "x"),
        Err(ToolError::AlreadyExists { .. })
    ));
}

#[test]
fn str_replace_needs_exactly_one_match_and_names_the_count() {
    let s = Scratch::new();
    s.write("f.rs", "fn a() {}\nfn b() {}\nfn a() {}\n");
    let ws = s.ws();
    match ws.str_replace("f.rs", "fn a()", "fn c()") {
        Err(e @ ToolError::MultipleMatches { count: 2, .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("2 times") && msg.contains("lines 1, 3"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    match ws.str_replace("f.rs", "fn z()", "x") {
        Err(e @ ToolError::NoMatch { .. }) => assert!(e.to_string().contains("not found")),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.read("f.rs"), "fn a() {}\nfn b() {}\nfn a() {}\n");
    let w = ws.str_replace("f.rs", "fn b()", "fn beta()").unwrap();
    assert!(!w.created);
    assert_eq!(s.read("f.rs"), "fn a() {}\nfn beta() {}\nfn a() {}\n");
    // Multi-line old_str, and replacing with nothing.
    ws.str_replace("f.rs", "}\nfn beta() {}\n", "}\n").unwrap();
    assert_eq!(s.read("f.rs"), "fn a() {}\nfn a() {}\n");
    assert!(matches!(
        ws.str_replace("f.rs", "", "x"),
        Err(ToolError::InvalidInput(_))
    ));
    assert!(matches!(
        ws.str_replace("nope", "a", "b"),
        Err(ToolError::NotFound { .. })
    ));
}

#[test]
fn str_replace_refuses_binary_files() {
    let s = Scratch::new();
    std::fs::write(s.root.join("bin"), [0xff, 0xfe, 0x00, b'a']).unwrap();
    assert!(matches!(
        s.ws().str_replace("bin", "a", "b"),
        Err(ToolError::InvalidInput(_))
    ));
}

#[test]
fn insert_goes_after_line_n_with_zero_at_the_top_and_past_the_end_refused() {
    let s = Scratch::new();
    s.write("f", "a\nb\n");
    let ws = s.ws();
    ws.insert("f", 0, "top").unwrap();
    assert_eq!(s.read("f"), "top\na\nb\n");
    ws.insert("f", 2, "mid\n").unwrap();
    assert_eq!(s.read("f"), "top\na\nmid\nb\n");
    ws.insert("f", 4, "end").unwrap();
    assert_eq!(s.read("f"), "top\na\nmid\nb\nend\n");
    assert!(matches!(
        ws.insert("f", 6, "x"),
        Err(ToolError::LineOutOfRange {
            line: 6,
            lines: 5,
            ..
        })
    ));
    assert_eq!(s.read("f"), "top\na\nmid\nb\nend\n");
}

#[test]
fn insert_after_a_last_line_without_newline_keeps_lines_apart() {
    let s = Scratch::new();
    s.write("f", "a\nb");
    s.ws().insert("f", 2, "c").unwrap();
    assert_eq!(s.read("f"), "a\nb\nc\n");
    s.write("empty", "");
    s.ws().insert("empty", 0, "first").unwrap();
    assert_eq!(s.read("empty"), "first\n");
    assert!(matches!(
        s.ws().insert("empty", 2, "x"),
        Err(ToolError::LineOutOfRange { .. })
    ));
}

#[test]
fn read_write_and_list_dir() {
    let s = Scratch::new();
    let ws = s.ws();
    let w = ws.write_file("a/b/c.txt", "x").unwrap();
    assert!(w.created);
    let w = ws.write_file("a/b/c.txt", "yy").unwrap();
    assert!(!w.created);
    assert_eq!(ws.read_file("a/b/c.txt").unwrap(), ("yy".to_string(), 2));
    s.write(".hidden", "h");
    std::fs::create_dir_all(s.root.join(".git")).unwrap();
    let names: Vec<(String, String)> = ws
        .list_dir(None)
        .unwrap()
        .into_iter()
        .map(|e| (e.path, e.kind))
        .collect();
    assert_eq!(
        names,
        vec![
            (".hidden".into(), "file".into()),
            ("a".into(), "dir".into())
        ]
    );
    let sub: Vec<String> = ws
        .list_dir(Some("a/b"))
        .unwrap()
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(sub, vec!["a/b/c.txt"]);
    assert!(matches!(ws.read_file("a"), Err(ToolError::NotAFile { .. })));
    assert!(matches!(
        ws.list_dir(Some("a/b/c.txt")),
        Err(ToolError::NotADirectory { .. })
    ));
    assert!(matches!(
        ws.write_file("a/b/c.txt/d", "x"),
        Err(ToolError::NotADirectory { .. })
    ));
}

#[test]
fn a_read_only_workspace_refuses_every_write_and_still_reads() {
    let s = Scratch::new();
    s.write("f", "a\n");
    let ws = s.read_only();
    assert!(matches!(
        ws.write_file("f", "b"),
        Err(ToolError::ReadOnly { .. })
    ));
    assert!(matches!(
        ws.create("g", "b"),
        Err(ToolError::ReadOnly { .. })
    ));
    assert!(matches!(
        ws.str_replace("f", "a", "b"),
        Err(ToolError::ReadOnly { .. })
    ));
    assert!(matches!(
        ws.insert("f", 0, "b"),
        Err(ToolError::ReadOnly { .. })
    ));
    let op = grove_core::tools::ToolOp::WriteFile {
        path: "f".into(),
        content: "b".into(),
    };
    let err = ws.run(&op).unwrap_err();
    assert_eq!(err.kind(), grove_core::error::ErrorKind::Rejected);
    assert_eq!(s.read("f"), "a\n");
    assert!(!s.root.join("g").exists());
    assert_eq!(ws.read_file("f").unwrap().0, "a\n");
}

#[test]
fn writes_into_dot_git_are_refused() {
    let s = Scratch::new();
    std::fs::create_dir_all(s.root.join(".git")).unwrap();
    assert!(matches!(
        s.ws().write_file(".git/config", "x"),
        Err(ToolError::InvalidPath { .. })
    ));
}

#[test]
fn created_files_and_directories_take_the_owner_of_the_workspace_root() {
    use std::os::unix::fs::MetadataExt;
    if rustix_is_root() {
        let s = Scratch::new();
        std::os::unix::fs::chown(&s.root, Some(65534), Some(65534)).unwrap();
        s.ws().write_file("made/by/tool.txt", "x").unwrap();
        for p in ["made", "made/by", "made/by/tool.txt"] {
            let meta = std::fs::metadata(s.root.join(p)).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (65534, 65534), "{p}");
        }
    } else {
        println!("skipped: changing owners needs root");
    }
}

fn rustix_is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // A file we create is owned by our effective uid.
    let f = tempfile::NamedTempFile::new().unwrap();
    f.as_file().metadata().unwrap().uid() == 0
}
