//! `grove history ID <op>`: a workspace's history (ADR 28) from the command line: its
//! points, diffs between them, a file at a point, checkpoints, rewind, undo and fork.
//! Each is one `tool` job (the history tools); the result is printed as one JSON object.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};
use grove_core::tools::ToolOp;
use uuid::Uuid;

use crate::{parse_id, read_token};

#[derive(Args)]
pub struct HistoryArgs {
    /// The workspace id.
    id: String,
    #[command(subcommand)]
    op: HistoryCmd,
    /// Idempotency: the command id of this call (write operations).
    #[arg(long = "command-id", global = true)]
    command_id: Option<Uuid>,
    /// Accepted for symmetry with the other commands: the output is always JSON.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
pub enum HistoryCmd {
    /// The timeline: one point per change, oldest first.
    List {
        /// Points to skip.
        #[arg(long)]
        offset: Option<u64>,
        /// Points to list (default 50, at most 500).
        #[arg(long)]
        limit: Option<usize>,
    },
    /// The diff from point FROM to point TO (default: the workspace now).
    Diff {
        /// A point number (0 is the creation) or snapshot id.
        from: String,
        /// The point to diff to (default: the workspace as it is now).
        to: Option<String>,
    },
    /// A file's content at a point.
    Show {
        /// A point number or snapshot id.
        point: String,
        /// The file, relative to the workspace root.
        #[arg(allow_hyphen_values = true)]
        path: String,
    },
    /// Record the workspace as it is now as a named point.
    Checkpoint {
        /// The point's name (1-200 bytes).
        name: String,
    },
    /// Put the files, HEAD and branch back to a point (refused while a command runs).
    Rewind {
        /// A point number or snapshot id.
        point: String,
    },
    /// Rewind to the point before the latest change.
    Undo,
    /// A new workspace at a point, under a new conversation (edit) or task (task) id.
    Fork {
        /// A point number or snapshot id.
        point: String,
        /// The new workspace's conversation or task id.
        #[arg(long)]
        scope: String,
        /// Name of an environment variable holding a git token (to fetch the cache).
        #[arg(long = "token-env")]
        token_env: Option<String>,
    },
}

pub async fn history(args: HistoryArgs) -> Result<ExitCode> {
    let workspace_id = parse_id(&args.id)?;
    let mut token = None;
    let op = match args.op {
        HistoryCmd::List { offset, limit } => ToolOp::History { offset, limit },
        HistoryCmd::Diff { from, to } => ToolOp::HistoryDiff {
            since: from,
            until: to,
        },
        HistoryCmd::Show { point, path } => ToolOp::HistoryFile { point, path },
        HistoryCmd::Checkpoint { name } => ToolOp::Checkpoint { name },
        HistoryCmd::Rewind { point } => ToolOp::Rewind { point },
        HistoryCmd::Undo => ToolOp::Undo,
        HistoryCmd::Fork {
            point,
            scope,
            token_env,
        } => {
            token = read_token(&token_env)?;
            ToolOp::Fork { point, scope }
        }
    };
    let output = crate::tool::run_op(workspace_id, op, args.command_id, token).await?;
    println!("{}", serde_json::to_string(&output)?);
    Ok(ExitCode::SUCCESS)
}
