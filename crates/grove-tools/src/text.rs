//! The editor's pure text transforms (`str_replace`, `insert`, `view`), shared by the
//! host tools and the workers' remote path so both give the same text and errors.

use grove_core::tools::DirEntry;

use crate::error::ToolError;

/// `bytes` as UTF-8 text, or the editor's refusal of a file that is not text.
pub fn utf8(path: &str, bytes: Vec<u8>) -> Result<String, ToolError> {
    String::from_utf8(bytes).map_err(|_| {
        ToolError::InvalidInput(format!(
            "{} is not UTF-8 text; the editor changes text files only",
            crate::error::shown(path)
        ))
    })
}

/// `text` with its single occurrence of `old_str` replaced by `new_str`; no occurrence
/// or several (with their line numbers) are refused, as is an empty `old_str`.
pub fn replace_once(
    path: &str,
    text: &str,
    old_str: &str,
    new_str: &str,
) -> Result<String, ToolError> {
    if old_str.is_empty() {
        return Err(ToolError::InvalidInput("old_str must not be empty".into()));
    }
    let starts: Vec<usize> = text.match_indices(old_str).map(|(i, _)| i).collect();
    match starts.len() {
        0 => Err(ToolError::NoMatch { path: path.into() }),
        1 => {
            let at = starts[0];
            let mut out = String::with_capacity(text.len() - old_str.len() + new_str.len());
            out.push_str(&text[..at]);
            out.push_str(new_str);
            out.push_str(&text[at + old_str.len()..]);
            Ok(out)
        }
        count => Err(ToolError::MultipleMatches {
            path: path.into(),
            count,
            lines: starts
                .iter()
                .map(|&i| text[..i].matches('\n').count() as u64 + 1)
                .collect(),
        }),
    }
}

/// `old` with `text` inserted as whole lines after line `insert_line` (0: at the top).
pub fn insert_after(
    path: &str,
    old: &str,
    insert_line: u64,
    text: &str,
) -> Result<String, ToolError> {
    let lines: Vec<&str> = old.split_inclusive('\n').collect();
    let count = lines.len() as u64;
    if insert_line > count {
        return Err(ToolError::LineOutOfRange {
            path: path.into(),
            line: insert_line,
            lines: count,
        });
    }
    let mut out = String::with_capacity(old.len() + text.len() + 2);
    for l in &lines[..insert_line as usize] {
        out.push_str(l);
    }
    // Inserting after a last line that has no newline gives it one first.
    if insert_line > 0 && !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(text);
    // The text becomes whole lines.
    if !text.ends_with('\n') {
        out.push('\n');
    }
    for l in &lines[insert_line as usize..] {
        out.push_str(l);
    }
    Ok(out)
}

/// A file's content with numbered lines; `range` is 1-based and inclusive, its end -1
/// meaning to the end.
pub fn numbered(path: &str, content: &str, range: Option<(u64, i64)>) -> Result<String, ToolError> {
    let lines: Vec<&str> = content.lines().collect();
    let total = lines.len() as u64;
    let (start, end) = match range {
        None => (1, total),
        Some((start, end)) => {
            if start == 0 || start > total.max(1) {
                return Err(ToolError::LineOutOfRange {
                    path: path.into(),
                    line: start,
                    lines: total,
                });
            }
            if end < 0 {
                (start, total)
            } else {
                let end = end as u64;
                if end < start {
                    return Err(ToolError::InvalidInput(format!(
                        "view range end {end} is before its start {start}"
                    )));
                }
                if end > total {
                    return Err(ToolError::LineOutOfRange {
                        path: path.into(),
                        line: end,
                        lines: total,
                    });
                }
                (start, end)
            }
        }
    };
    let mut text = String::new();
    for n in start..=end {
        if n == 0 || n > total {
            continue;
        }
        text.push_str(&format!("{n:>6}\t{}\n", lines[(n - 1) as usize]));
    }
    Ok(text)
}

/// The text of a directory `view` of `dir` (relative, `""` for the root) from its
/// entries `depth` levels deep, hidden ones already left out.
pub fn directory_view(dir: &str, depth: usize, entries: &[DirEntry]) -> String {
    let shown = if dir.is_empty() { "." } else { dir };
    let mut text = format!(
        "Files and directories up to {depth} levels deep in {shown}, hidden items excluded:\n"
    );
    for e in entries {
        text.push_str(&e.path);
        if e.kind == "dir" {
            text.push('/');
        }
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_once_counts_matches_and_names_their_lines() {
        assert_eq!(replace_once("f", "a\nb\n", "b", "c").unwrap(), "a\nc\n");
        assert_eq!(
            replace_once("f", "a\n", "z", "c"),
            Err(ToolError::NoMatch { path: "f".into() })
        );
        assert_eq!(
            replace_once("f", "x\ny\nx\n", "x", "c"),
            Err(ToolError::MultipleMatches {
                path: "f".into(),
                count: 2,
                lines: vec![1, 3]
            })
        );
        assert!(replace_once("f", "a", "", "c").is_err());
    }

    #[test]
    fn insert_after_makes_whole_lines_and_checks_the_line() {
        assert_eq!(insert_after("f", "a\nb", 0, "z").unwrap(), "z\na\nb");
        assert_eq!(insert_after("f", "a\nb", 2, "z").unwrap(), "a\nb\nz\n");
        assert_eq!(
            insert_after("f", "a\n", 2, "z"),
            Err(ToolError::LineOutOfRange {
                path: "f".into(),
                line: 2,
                lines: 1
            })
        );
    }

    #[test]
    fn numbered_shows_a_range_and_refuses_one_beyond_the_file() {
        assert_eq!(
            numbered("f", "a\nb\nc\n", Some((2, -1))).unwrap(),
            "     2\tb\n     3\tc\n"
        );
        assert_eq!(
            numbered("f", "a\nb\n", Some((1, 1))).unwrap(),
            "     1\ta\n"
        );
        assert!(numbered("f", "a\n", Some((1, 5))).is_err());
        assert!(numbered("f", "a\nb\n", Some((2, 1))).is_err());
    }
}
