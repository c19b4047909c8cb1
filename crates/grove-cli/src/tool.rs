//! `grove tool ID <op>`: the agent tool surface from the command line. Each operation is
//! one `tool` job on the workspace's node; the result is printed as one JSON object.
//! `grove tool ID list` reads the workspace row and prints the tools it offers.

use std::io::Read;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};
use grove_core::commands::{Command, CommandResult};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::tools::{DiffAgainst, ToolOp, ToolRequest};
use grove_postgres::rows;
use uuid::Uuid;

use crate::{client, connect, invalid, parse_id, read_token};

#[derive(Args)]
pub struct ToolArgs {
    /// The workspace id (a UUID).
    id: String,
    #[command(subcommand)]
    op: ToolCmd,
    /// Idempotency key (a UUID): the same id submitted twice runs once.
    #[arg(long = "command-id", global = true)]
    command_id: Option<Uuid>,
    /// Accepted for symmetry with other commands: tool output is always JSON.
    #[arg(long, global = true)]
    json: bool,
}

/// Where a write tool's content comes from.
#[derive(Args)]
pub struct Content {
    /// The content, as an argument.
    #[arg(long, allow_hyphen_values = true, conflicts_with = "stdin")]
    content: Option<String>,
    /// Read the content from stdin (UTF-8).
    #[arg(long)]
    stdin: bool,
}

impl Content {
    fn read(self) -> Result<String> {
        match (self.content, self.stdin) {
            (Some(c), false) => Ok(c),
            (None, true) => {
                let mut buf = String::new();
                std::io::stdin()
                    .read_to_string(&mut buf)
                    .map_err(|e| invalid(format!("reading stdin: {e}")))?;
                Ok(buf)
            }
            _ => Err(invalid("give the content with --content TEXT or --stdin")),
        }
    }
}

#[derive(Subcommand)]
pub enum ToolCmd {
    /// The tools this workspace offers (no write tools on a read-only workspace).
    List,
    /// A file with numbered lines (--range START:END, END -1 = to the end), or a
    /// directory listing two levels deep.
    View {
        /// A path relative to the workspace root (default: the root).
        #[arg(allow_hyphen_values = true, default_value = "")]
        path: String,
        /// Lines START:END, 1-based and inclusive; END -1 reads to the end.
        #[arg(long, allow_hyphen_values = true, value_name = "START:END")]
        range: Option<String>,
    },
    /// Create a file; fails if it exists.
    Create {
        /// A path relative to the workspace root.
        #[arg(allow_hyphen_values = true)]
        path: String,
        #[command(flatten)]
        content: Content,
    },
    /// Replace the single occurrence of --old with --new.
    StrReplace {
        /// A path relative to the workspace root.
        #[arg(allow_hyphen_values = true)]
        path: String,
        /// The text to replace; it must occur exactly once.
        #[arg(long, allow_hyphen_values = true)]
        old: String,
        /// The replacement (default: empty, i.e. delete --old).
        #[arg(long, allow_hyphen_values = true, default_value = "")]
        new: String,
    },
    /// Insert text after line --line (0: at the top).
    Insert {
        /// A path relative to the workspace root.
        #[arg(allow_hyphen_values = true)]
        path: String,
        /// The line number (1-based) to insert after; 0 inserts at the top.
        #[arg(long)]
        line: u64,
        /// The text to insert.
        #[arg(long, allow_hyphen_values = true)]
        text: String,
    },
    /// Read a file whole.
    Read {
        /// A path relative to the workspace root.
        #[arg(allow_hyphen_values = true)]
        path: String,
    },
    /// Write a file whole (creating parents).
    Write {
        /// A path relative to the workspace root.
        #[arg(allow_hyphen_values = true)]
        path: String,
        #[command(flatten)]
        content: Content,
    },
    /// List one directory level.
    Ls {
        /// A directory relative to the workspace root (default: the root).
        #[arg(allow_hyphen_values = true)]
        path: Option<String>,
    },
    /// Search the working tree line by line.
    Search {
        /// The text (or, with --regex, regular expression) to find.
        #[arg(allow_hyphen_values = true)]
        pattern: String,
        /// gitignore-style glob a file must match (repeatable; `!` excludes).
        #[arg(long, allow_hyphen_values = true)]
        glob: Vec<String>,
        /// Match regardless of letter case.
        #[arg(long = "ignore-case", short = 'i')]
        ignore_case: bool,
        /// The pattern is a regular expression (default: a literal string).
        #[arg(long)]
        regex: bool,
        /// Stop after this many matching lines.
        #[arg(long = "max-results")]
        max_results: Option<usize>,
        /// Search under this path only.
        #[arg(long, allow_hyphen_values = true)]
        path: Option<String>,
    },
    /// git status.
    Status,
    /// git diff of the working tree against HEAD (default), --base or --ref REF.
    Diff {
        /// Diff against the workspace's base ref.
        #[arg(long, conflicts_with = "git_ref")]
        base: bool,
        /// Diff against this ref (branch, tag or commit).
        #[arg(long = "ref", allow_hyphen_values = true)]
        git_ref: Option<String>,
        /// Only these paths (relative to the workspace root; default: all).
        #[arg(allow_hyphen_values = true)]
        paths: Vec<String>,
    },
    /// git log of the last N commits.
    Log {
        /// How many commits (default: the tool's limit).
        #[arg(short = 'n', long = "max-count")]
        max_count: Option<usize>,
    },
    /// Commit the given paths (every change when none).
    Commit {
        /// The commit message.
        #[arg(short = 'm', long, allow_hyphen_values = true)]
        message: String,
        /// The author's name (with --author-email; default: grove's configured author).
        #[arg(
            long = "author-name",
            allow_hyphen_values = true,
            requires = "author_email"
        )]
        author_name: Option<String>,
        /// The author's email (with --author-name).
        #[arg(
            long = "author-email",
            allow_hyphen_values = true,
            requires = "author_name"
        )]
        author_email: Option<String>,
        /// Paths to commit, relative to the workspace root (default: every change).
        #[arg(allow_hyphen_values = true)]
        paths: Vec<String>,
    },
    /// Push a branch (default: the current one) to origin.
    Push {
        /// The local branch to push (default: the current one).
        #[arg(long, allow_hyphen_values = true)]
        branch: Option<String>,
        /// Overwrite the remote branch, but only if it is still where it was (or at --expect).
        #[arg(long = "force-with-lease")]
        force_with_lease: bool,
        /// The commit the remote branch must be at for --force-with-lease.
        #[arg(long, requires = "force_with_lease")]
        expect: Option<String>,
        /// Record the pushed branch as the local branch's upstream.
        #[arg(long = "set-upstream", short = 'u')]
        set_upstream: bool,
        /// Name of an environment variable holding a git token for this push.
        #[arg(long = "token-env")]
        token_env: Option<String>,
    },
}

fn parse_range(raw: &str) -> Result<(u64, i64)> {
    let bad = || {
        invalid(format!(
            "invalid --range {raw:?}: expected START:END (END -1 = to the end)"
        ))
    };
    let (a, b) = raw.split_once(':').ok_or_else(bad)?;
    Ok((a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?))
}

pub async fn tool(args: ToolArgs) -> Result<ExitCode> {
    let workspace_id = parse_id(&args.id)?;
    let mut token = None;
    let op = match args.op {
        ToolCmd::List => return list(workspace_id).await,
        ToolCmd::View { path, range } => ToolOp::View {
            path,
            range: range.as_deref().map(parse_range).transpose()?,
        },
        ToolCmd::Create { path, content } => ToolOp::Create {
            path,
            content: content.read()?,
        },
        ToolCmd::StrReplace { path, old, new } => ToolOp::StrReplace {
            path,
            old_str: old,
            new_str: new,
        },
        ToolCmd::Insert { path, line, text } => ToolOp::Insert {
            path,
            insert_line: line,
            text,
        },
        ToolCmd::Read { path } => ToolOp::ReadFile { path },
        ToolCmd::Write { path, content } => ToolOp::WriteFile {
            path,
            content: content.read()?,
        },
        ToolCmd::Ls { path } => ToolOp::ListDir { path },
        ToolCmd::Search {
            pattern,
            glob,
            ignore_case,
            regex,
            max_results,
            path,
        } => ToolOp::Search {
            pattern,
            regex,
            case_sensitive: !ignore_case,
            glob,
            path,
            max_results,
        },
        ToolCmd::Status => ToolOp::GitStatus,
        ToolCmd::Diff {
            base,
            git_ref,
            paths,
        } => ToolOp::GitDiff {
            against: match (base, git_ref) {
                (true, _) => DiffAgainst::Base,
                (false, Some(r)) => DiffAgainst::Ref(r),
                (false, None) => DiffAgainst::Head,
            },
            paths,
        },
        ToolCmd::Log { max_count } => ToolOp::GitLog { max_count },
        ToolCmd::Commit {
            message,
            author_name,
            author_email,
            paths,
        } => ToolOp::GitCommit {
            message,
            paths,
            author_name,
            author_email,
        },
        ToolCmd::Push {
            branch,
            force_with_lease,
            expect,
            set_upstream,
            token_env,
        } => {
            token = read_token(&token_env)?;
            ToolOp::GitPush {
                branch,
                force_with_lease,
                expect,
                set_upstream,
            }
        }
    };
    let output = run_op(workspace_id, op, args.command_id, token).await?;
    println!("{}", serde_json::to_string(&output)?);
    Ok(ExitCode::SUCCESS)
}

/// Runs one tool operation as a `tool` job (over `GROVE_URL` when set) and returns its
/// output.
pub(crate) async fn run_op(
    workspace_id: Uuid,
    op: ToolOp,
    command_id: Option<Uuid>,
    token: Option<String>,
) -> Result<grove_core::tools::ToolOutput> {
    let command = Command::Tool(ToolRequest { workspace_id, op });
    command.validate()?;
    let output = match crate::remote::Server::from_env()? {
        Some(server) => {
            if command_id.is_some() {
                return Err(invalid(
                    "--command-id is not available for tools over GROVE_URL (the tool route takes no idempotency key)",
                ));
            }
            let Command::Tool(req) = &command else {
                unreachable!("built above")
            };
            server.tool(workspace_id, &req.op, token.as_deref()).await?
        }
        None => {
            let pool = connect(4).await?;
            let result = client::submit(&pool, &command, command_id, token.as_deref()).await?;
            let CommandResult::Tool(output) = result else {
                anyhow::bail!("unexpected result for a tool command");
            };
            output
        }
    };
    Ok(output)
}

/// Prints the tools the workspace offers, one JSON object per line.
async fn list(workspace_id: Uuid) -> Result<ExitCode> {
    let pool = connect(2).await?;
    let mut conn = pool.acquire().await?;
    let ws = rows::workspace(&mut conn, workspace_id)
        .await?
        .ok_or_else(|| {
            CommandError::new(
                ErrorKind::NotFound,
                format!("workspace {workspace_id} not found"),
            )
        })?;
    for spec in grove_core::tool_catalog::tools_for(&ws.capabilities, &ws.node) {
        println!("{}", serde_json::to_string(&spec)?);
    }
    Ok(ExitCode::SUCCESS)
}
