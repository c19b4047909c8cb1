//! The agent tools on a workspace placed inside a remote provider (ADR 15): the text
//! editor, the file tools and `search` run as short `sh` scripts through the
//! provider's exec, every path resolved in the sandbox beneath the workspace root; the
//! text transforms (`grove_tools::text`) and the search matcher are the host's own.

use std::path::PathBuf;
use std::time::Duration;

use grove_core::error::{CommandError, ErrorKind};
use grove_core::layout::short_hash;
use grove_core::model::WorkspaceRow;
use grove_core::ports::{
    ExecRequest, ExecResult, Mount, NetworkPolicy, ResourceHints, Runtime, RuntimeSpec,
};
use grove_core::tools::{DirEntry, SearchHit, ToolOp, ToolOutput, WrittenFile};
use grove_tools::{text, RelPath, ToolError};

use super::not_yet;
use super::tools::tool_events;
use crate::context::{correlation_of, Handled, JobContext};
use grove_core::commands::CommandResult;

/// Reads one file of a remote workspace inside its sandbox: the path (already checked
/// lexically) is resolved there with every symlink (`realpath -e`), must stay beneath
/// the workspace's resolved root and be a regular file, and only the resolved path is
/// read. Exit codes: 3 outside, 4 not a regular file, 5 absent, 9 a directory.
const READ_SCRIPT: &str = r#"root=$(pwd -P) || exit 6
p=$(realpath -e -- "$1" 2>/dev/null) || exit 5
case "$p" in "$root"/*) ;; *) exit 3 ;; esac
[ -d "$p" ] && exit 9
[ -f "$p" ] || exit 4
exec cat -- "$p""#;

/// Writes stdin whole to one file of a remote workspace inside its sandbox: the path is
/// resolved with every existing symlink (`realpath -m`), must stay beneath the root and
/// outside `.git`, must be a regular file if it exists (and must not exist when `$2` is
/// `new`); missing parents are made beneath the resolved path. Prints 1 when the file
/// was created, 0 when replaced. Exit codes: 3 outside, 4 not a regular file, 7 inside
/// `.git`, 8 the write failed, 10 exists.
const WRITE_SCRIPT: &str = r#"root=$(pwd -P) || exit 6
p=$(realpath -m -- "$1" 2>/dev/null) || exit 3
case "$p" in "$root"/*) ;; *) exit 3 ;; esac
case "$p" in "$root"/.git|"$root"/.git/*) exit 7 ;; esac
created=1
if [ -e "$p" ] || [ -L "$p" ]; then [ "$2" = new ] && exit 10; [ -f "$p" ] || exit 4; created=0; fi
mkdir -p -- "$(dirname -- "$p")" || exit 8
cat > "$p" || exit 8
printf %s "$created""#;

/// Lists a directory of a remote workspace `$2` levels deep: resolved with every
/// symlink (`realpath -e`), the root itself or beneath it, a directory; `find` enters
/// subdirectories without following symlinks, leaves `.git` out (every hidden entry
/// unless `$3` is 1) and prints `type<TAB>size<TAB>path-below-it<NUL>` per entry.
/// Exit codes: 3 outside, 5 absent, 11 not a directory.
const LIST_SCRIPT: &str = r#"root=$(pwd -P) || exit 6
p=$(realpath -e -- "$1" 2>/dev/null) || exit 5
case "$p" in "$root"|"$root"/*) ;; *) exit 3 ;; esac
[ -d "$p" ] || exit 11
cd -- "$p" || exit 8
if [ "$3" = 1 ]; then hide=.git; else hide='.*'; fi
exec find . -mindepth 1 -maxdepth "$2" -name "$hide" -prune -o -printf '%y\t%s\t%P\0'"#;

/// Searches a remote workspace from `$1` (resolved with every symlink, the root or
/// beneath it) with `grep -r` (symlinks beneath not followed, binary files and every
/// `.git` left out), the remaining arguments being grep's pattern options; prints
/// `./path<NUL>line:text` per hit. Exit codes: 3 outside, 5 absent, 0 or 1 from grep.
const SEARCH_SCRIPT: &str = r#"root=$(pwd -P) || exit 6
p=$(realpath -e -- "$1" 2>/dev/null) || exit 5
case "$p" in "$root"|"$root"/*) ;; *) exit 3 ;; esac
shift
exec grep -r -n -I -Z -s --exclude-dir=.git "$@" -- ".${p#"$root"}""#;

/// The path a tool operation names (the root for a `list_dir` without one).
fn op_path(op: &ToolOp) -> &str {
    match op {
        ToolOp::View { path, .. }
        | ToolOp::Create { path, .. }
        | ToolOp::StrReplace { path, .. }
        | ToolOp::Insert { path, .. }
        | ToolOp::ReadFile { path }
        | ToolOp::WriteFile { path, .. } => path,
        ToolOp::ListDir { path } | ToolOp::Search { path, .. } => path.as_deref().unwrap_or(""),
        _ => "",
    }
}

impl JobContext {
    /// The agent tools on a workspace placed in a remote provider: the ones
    /// `tool_catalog::works_remotely` names run in the sandbox under the workspace's
    /// command lock (shared for a read, exclusive for a write, so no write-class exec
    /// can swap a resolved path meanwhile, and an edit's read and write see one file);
    /// every other tool is refused before any lock.
    pub(super) async fn remote_tool(
        &self,
        ws: WorkspaceRow,
        op: &ToolOp,
    ) -> Result<Handled, CommandError> {
        if !grove_core::tool_catalog::works_remotely(op.name()) {
            return Err(not_yet(&ws, &format!("tool {}", op.name())));
        }
        let rel = RelPath::parse(op_path(op))?;
        let write = op.is_write();
        if write && rel.touches_git_dir() {
            return Err(CommandError::new(
                ErrorKind::Rejected,
                format!(
                    "{} is inside .git; change the repository with the git tools",
                    rel.as_str()
                ),
            ));
        }
        let provider = self.remote_provider(&ws.node)?;
        let network = provider
            .workspaces()
            .map(|w| w.network())
            .unwrap_or_default();
        let (ws, lock) = self.lock_workspace(ws.id, !write).await?;
        let spec = tool_spec(&ws, write, network);
        let ran = async {
            let runtime = provider.create(spec).await?;
            Sandbox {
                runtime: &*runtime,
                op,
                rel: &rel,
            }
            .run()
            .await
        }
        .await;
        let output = match ran {
            Ok(output) => output,
            Err(e) => {
                lock.release().await.ok();
                return Err(e);
            }
        };
        let events = tool_events(ws.id, op, &output);
        Ok(Handled {
            result: Ok(CommandResult::Tool(output)),
            events,
            locks: vec![lock],
            correlation: correlation_of(&ws),
        })
    }
}

/// The spec of the runtime a remote tool runs in: the user's and project's sandbox,
/// the workspace mounted (writable for a write tool), the sandbox's own network.
fn tool_spec(ws: &WorkspaceRow, write: bool, network: NetworkPolicy) -> RuntimeSpec {
    let dir = PathBuf::from(&ws.local_path);
    RuntimeSpec {
        image: None,
        workdir: dir.clone(),
        mounts: vec![Mount {
            source: dir.clone(),
            target: dir,
            writable: write,
        }],
        env: Default::default(),
        resources: ResourceHints::default(),
        network,
        labels: [
            ("grove.workspace".to_string(), ws.id.to_string()),
            ("grove.user".to_string(), ws.user_id.clone()),
            ("grove.project".to_string(), ws.project_id.clone()),
        ]
        .into(),
    }
}

/// One tool operation against one path, in the sandbox's runtime.
struct Sandbox<'a> {
    runtime: &'a dyn Runtime,
    op: &'a ToolOp,
    rel: &'a RelPath,
}

/// What a read found at a path.
enum Found {
    File(Vec<u8>),
    Directory,
}

impl Sandbox<'_> {
    async fn run(&self) -> Result<ToolOutput, CommandError> {
        let shown = self.rel.as_str();
        Ok(match self.op {
            ToolOp::ReadFile { .. } => {
                let bytes = self.read_file().await?;
                ToolOutput::File {
                    path: shown.to_string(),
                    size_bytes: bytes.len() as u64,
                    content: String::from_utf8_lossy(&bytes).into_owned(),
                }
            }
            ToolOp::WriteFile { content, .. } => {
                ToolOutput::Written(self.write(content, false).await?)
            }
            ToolOp::Create { content, .. } => ToolOutput::Written(self.write(content, true).await?),
            ToolOp::StrReplace {
                old_str, new_str, ..
            } => {
                if old_str.is_empty() {
                    return Err(ToolError::InvalidInput("old_str must not be empty".into()).into());
                }
                let old = text::utf8(shown, self.read_file().await?)?;
                let new = text::replace_once(shown, &old, old_str, new_str)?;
                ToolOutput::Written(self.write(&new, false).await?)
            }
            ToolOp::Insert {
                insert_line,
                text: inserted,
                ..
            } => {
                let old = text::utf8(shown, self.read_file().await?)?;
                let new = text::insert_after(shown, &old, *insert_line, inserted)?;
                ToolOutput::Written(self.write(&new, false).await?)
            }
            ToolOp::View { range, .. } => self.view(*range).await?,
            ToolOp::ListDir { .. } => ToolOutput::Dir {
                entries: self.list(1, true).await?,
            },
            ToolOp::Search { .. } => self.search().await?,
            other => return Err(internal_refusal(other)),
        })
    }

    /// `view`: a file's numbered lines (in `range`), or a directory's tree.
    async fn view(&self, range: Option<(u64, i64)>) -> Result<ToolOutput, CommandError> {
        let shown = self.rel.as_str();
        Ok(match self.read().await? {
            Found::File(bytes) => ToolOutput::Text {
                text: text::numbered(shown, &String::from_utf8_lossy(&bytes), range)?,
            },
            Found::Directory => {
                if range.is_some() {
                    return Err(ToolError::InvalidInput(
                        "a view range applies to files, not directories".into(),
                    )
                    .into());
                }
                let entries = self.list(grove_tools::VIEW_DEPTH, false).await?;
                ToolOutput::Text {
                    text: text::directory_view(shown, grove_tools::VIEW_DEPTH, &entries),
                }
            }
        })
    }

    /// `search`: grep in the sandbox preselects lines, the host's matcher decides.
    async fn search(&self) -> Result<ToolOutput, CommandError> {
        let ToolOp::Search {
            pattern,
            regex,
            case_sensitive,
            glob,
            max_results,
            ..
        } = self.op
        else {
            return Err(internal_refusal(self.op));
        };
        if !glob.is_empty() {
            return Err(CommandError::new(
                ErrorKind::Rejected,
                "search --glob is not available in a remote provider's sandbox yet".to_string(),
            ));
        }
        // The host's matcher decides; grep in the sandbox only preselects lines.
        let matcher = grove_tools::matcher(pattern, *regex, *case_sensitive)?;
        let at = if self.rel.is_root() {
            "."
        } else {
            self.rel.as_str()
        };
        let mut args = vec![at, if *regex { "-E" } else { "-F" }];
        if !case_sensitive {
            args.push("-i");
        }
        args.extend(["-e", pattern.as_str()]);
        let r = self.sh(SEARCH_SCRIPT, &args, None).await?;
        if r.exit_code > 1 {
            return Err(self.refusal(&r));
        }
        let max = max_results
            .unwrap_or(grove_core::tools::DEFAULT_SEARCH_HITS)
            .max(1);
        let mut hits = parse_hits(&r.stdout, |line| matcher.is_match(line));
        let truncated = r.truncated || hits.len() > max;
        hits.truncate(max);
        Ok(ToolOutput::Search { hits, truncated })
    }

    /// Runs `script` with `args` in the sandbox.
    async fn sh(
        &self,
        script: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<ExecResult, CommandError> {
        let mut argv: Vec<String> = ["sh", "-c", script, "sh"].map(String::from).to_vec();
        argv.extend(args.iter().map(|a| a.to_string()));
        Ok(self
            .runtime
            .exec(ExecRequest {
                argv,
                stdin: stdin.map(|c| c.as_bytes().to_vec()),
                timeout: Some(Duration::from_secs(60)),
                max_output_bytes: Some(grove_tools::MAX_READ_BYTES as usize + 1),
                mutating: stdin.is_some(),
                ..ExecRequest::default()
            })
            .await?)
    }

    /// A regular file's bytes (at most `MAX_READ_BYTES`), or that the path is a
    /// directory.
    async fn read(&self) -> Result<Found, CommandError> {
        if self.rel.is_root() {
            return Ok(Found::Directory);
        }
        let r = self.sh(READ_SCRIPT, &[self.rel.as_str()], None).await?;
        let limit = grove_tools::MAX_READ_BYTES as usize;
        match r.exit_code {
            0 if r.truncated || r.stdout.len() > limit => Err(CommandError::new(
                ErrorKind::Rejected,
                format!("{} is larger than {limit} bytes", self.rel.as_str()),
            )),
            0 => Ok(Found::File(r.stdout)),
            9 => Ok(Found::Directory),
            _ => Err(self.refusal(&r)),
        }
    }

    /// A regular file's bytes; a directory is refused.
    async fn read_file(&self) -> Result<Vec<u8>, CommandError> {
        match self.read().await? {
            Found::File(bytes) => Ok(bytes),
            Found::Directory => Err(self.refusal(&ExecResult {
                exit_code: 4,
                ..ExecResult::default()
            })),
        }
    }

    /// Writes `content` whole (`new`: the file must not exist yet).
    async fn write(&self, content: &str, new: bool) -> Result<WrittenFile, CommandError> {
        let mode = if new { "new" } else { "replace" };
        let r = self
            .sh(WRITE_SCRIPT, &[self.rel.as_str(), mode], Some(content))
            .await?;
        if r.exit_code != 0 {
            return Err(self.refusal(&r));
        }
        Ok(WrittenFile {
            path: self.rel.as_str().to_string(),
            size_bytes: content.len() as u64,
            // The whole digest: SHA-256 has 64 hex digits.
            sha256: short_hash(content, 64),
            created: r.stdout.as_slice() == b"1",
        })
    }

    /// The entries `depth` levels beneath the directory, sorted by path, at most
    /// `MAX_LISTING`; hidden ones only when `hidden` (`.git` never).
    async fn list(&self, depth: usize, hidden: bool) -> Result<Vec<DirEntry>, CommandError> {
        let at = if self.rel.is_root() {
            "."
        } else {
            self.rel.as_str()
        };
        let depth = depth.to_string();
        let hidden = if hidden { "1" } else { "0" };
        let r = self.sh(LIST_SCRIPT, &[at, &depth, hidden], None).await?;
        if r.exit_code != 0 {
            return Err(self.refusal(&r));
        }
        Ok(parse_listing(self.rel, &r.stdout))
    }

    /// The typed refusal for a script's exit code.
    fn refusal(&self, r: &ExecResult) -> CommandError {
        let shown = self.rel.as_str();
        let rejected = |msg: String| CommandError::new(ErrorKind::Rejected, msg);
        match r.exit_code {
            3 => rejected(format!("{shown} resolves outside the workspace")),
            4 | 9 => rejected(format!("{shown} is not a regular file")),
            5 => CommandError::new(ErrorKind::NotFound, format!("{shown} not found")),
            7 => rejected(format!(
                "{shown} resolves inside .git; change the repository with the git tools"
            )),
            10 => ToolError::AlreadyExists { path: shown.into() }.into(),
            11 => ToolError::NotADirectory { path: shown.into() }.into(),
            code => CommandError::new(
                ErrorKind::Unavailable,
                format!(
                    "{} {shown} in the sandbox failed (exit {code}): {}",
                    self.op.name(),
                    String::from_utf8_lossy(&r.stderr).trim()
                ),
            ),
        }
    }
}

fn internal_refusal(op: &ToolOp) -> CommandError {
    CommandError::new(
        ErrorKind::Internal,
        format!("{} has no remote implementation", op.name()),
    )
}

/// `find`'s `type<TAB>size<TAB>path<NUL>` records as entries named from the workspace
/// root: a record whose path would not be a clean relative path is dropped, an
/// unterminated last record (output cut at its cap) too.
fn parse_listing(dir: &RelPath, out: &[u8]) -> Vec<DirEntry> {
    let mut records: Vec<&[u8]> = out.split(|b| *b == 0).collect();
    records.pop();
    let mut entries: Vec<DirEntry> = records
        .into_iter()
        .filter_map(|rec| {
            let rec = String::from_utf8_lossy(rec);
            let mut parts = rec.splitn(3, '\t');
            let (kind, size, below) = (parts.next()?, parts.next()?, parts.next()?);
            let clean = RelPath::parse(below).ok()?;
            if clean.is_root() || clean.as_str() != below {
                return None;
            }
            let joined = if dir.is_root() {
                below.to_string()
            } else {
                format!("{}/{below}", dir.as_str())
            };
            let path = RelPath::parse(&joined).ok()?;
            if path.is_root() || (path.touches_git_dir() && !dir.touches_git_dir()) {
                return None;
            }
            let kind = match kind {
                "f" => "file",
                "d" => "dir",
                "l" => "symlink",
                _ => "other",
            };
            Some(DirEntry {
                path: path.as_str().to_string(),
                kind: kind.to_string(),
                size: if kind == "file" {
                    size.parse().unwrap_or(0)
                } else {
                    0
                },
            })
        })
        .collect();
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    entries.truncate(grove_tools::MAX_LISTING);
    entries
}

/// grep's `./path<NUL>line:text` hits, kept only when the path is a clean relative
/// path and the host's matcher matches the line; sorted by path then line.
fn parse_hits(out: &[u8], is_match: impl Fn(&[u8]) -> bool) -> Vec<SearchHit> {
    let mut hits: Vec<SearchHit> = out
        .split(|b| *b == b'\n')
        .filter_map(|rec| {
            let nul = rec.iter().position(|b| *b == 0)?;
            let (path, rest) = (&rec[..nul], &rec[nul + 1..]);
            let path = std::str::from_utf8(path).ok()?;
            let below = path.strip_prefix("./")?;
            let rel = RelPath::parse(below).ok()?;
            if rel.is_root() || rel.as_str() != below || rel.touches_git_dir() {
                return None;
            }
            let colon = rest.iter().position(|b| *b == b':')?;
            let line: u64 = std::str::from_utf8(&rest[..colon]).ok()?.parse().ok()?;
            let text = &rest[colon + 1..];
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            if !is_match(text) {
                return None;
            }
            Some(SearchHit {
                path: rel.as_str().to_string(),
                line,
                text: String::from_utf8_lossy(text)
                    .chars()
                    .take(grove_tools::MAX_HIT_CHARS)
                    .collect(),
            })
        })
        .collect();
    hits.sort_by(|a, b| (&a.path, a.line).cmp(&(&b.path, b.line)));
    hits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_keep_clean_paths_and_what_the_hosts_matcher_matches() {
        let out =
            b"./b\x002:beta\r\n./a\x0010:alpha beta\n./../x\x001:beta\n./c\x001:gamma\n./d\x00cut";
        let hits = parse_hits(out, |l| l.windows(4).any(|w| w == b"beta"));
        let shown: Vec<(&str, u64, &str)> = hits
            .iter()
            .map(|h| (h.path.as_str(), h.line, h.text.as_str()))
            .collect();
        assert_eq!(shown, [("a", 10, "alpha beta"), ("b", 2, "beta")]);
    }

    #[test]
    fn a_listing_names_entries_from_the_root_and_drops_what_could_escape() {
        let dir = RelPath::parse("src").unwrap();
        let out = b"f\t3\tb.rs\0d\t4096\ta\0l\t9\ta/link\0f\t1\t../x\0f\t1\t/etc\0f\t2\tcut";
        let entries = parse_listing(&dir, out);
        assert_eq!(
            parse_listing(&RelPath::parse("").unwrap(), b"f\t1\tx\0").len(),
            1
        );
        let shown: Vec<(&str, &str, u64)> = entries
            .iter()
            .map(|e| (e.path.as_str(), e.kind.as_str(), e.size))
            .collect();
        assert_eq!(
            shown,
            [
                ("src/a", "dir", 0),
                ("src/a/link", "symlink", 0),
                ("src/b.rs", "file", 3)
            ]
        );
    }
}
