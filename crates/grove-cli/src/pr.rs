//! `grove pr create|show|comment`: a workspace's pull requests on the git platform.
//! Create and comment are jobs (`create_pull_request`, `comment_pull_request`) whose
//! token comes from the variable named by `--token-env`, like a push's; `show` asks the
//! platform directly (no job).

use std::io::Read;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};
use grove_core::commands::{Command, CommandResult, CommentPullRequest, CreatePullRequest};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::platform::{GitPlatformProvider, PullRequest};
use grove_core::ports::GitToken;
use grove_postgres::rows;
use uuid::Uuid;

use crate::{client, connect, invalid, parse_id, read_token};

#[derive(Subcommand)]
pub enum PrCmd {
    /// Open a pull request from the workspace's branch (push it first).
    Create {
        /// The workspace id (a UUID).
        id: String,
        /// The pull request's title.
        #[arg(long, allow_hyphen_values = true)]
        title: String,
        /// The description (or --body-stdin).
        #[arg(long, allow_hyphen_values = true, conflicts_with = "body_stdin")]
        body: Option<String>,
        /// Read the description from stdin.
        #[arg(long = "body-stdin")]
        body_stdin: bool,
        /// The branch to merge into (default: the workspace's base ref).
        #[arg(long, allow_hyphen_values = true)]
        base: Option<String>,
        /// Open it as a draft.
        #[arg(long)]
        draft: bool,
        #[command(flatten)]
        common: PrCommon,
    },
    /// Show a pull request of the workspace's repository.
    Show {
        /// The workspace id (a UUID).
        id: String,
        /// The pull request's number.
        number: u64,
        /// A platform token for a private repository.
        #[arg(long = "token-env")]
        token_env: Option<String>,
        /// Print it as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Comment on a pull request of the workspace's repository.
    Comment {
        /// The workspace id (a UUID).
        id: String,
        /// The pull request's number.
        number: u64,
        /// The comment (or --stdin).
        #[arg(long, allow_hyphen_values = true, conflicts_with = "stdin")]
        body: Option<String>,
        /// Read the comment from stdin.
        #[arg(long)]
        stdin: bool,
        #[command(flatten)]
        common: PrCommon,
    },
}

#[derive(Args)]
pub struct PrCommon {
    /// The environment variable holding the platform token (required).
    #[arg(long = "token-env")]
    token_env: String,
    /// Idempotency key (a UUID): the same id submitted twice runs once.
    #[arg(long = "command-id")]
    command_id: Option<Uuid>,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
}

fn text(arg: Option<String>, stdin: bool, what: &str) -> Result<Option<String>> {
    match (arg, stdin) {
        (Some(t), false) => Ok(Some(t)),
        (None, true) => {
            let mut buf = String::new();
            std::io::stdin()
                .read_to_string(&mut buf)
                .map_err(|e| invalid(format!("reading the {what} from stdin: {e}")))?;
            Ok(Some(buf))
        }
        _ => Ok(None),
    }
}

fn print_pr(pr: &PullRequest, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(pr)?);
    } else {
        println!(
            "#{} {}{} {} -> {} {}",
            pr.number,
            pr.state.as_str(),
            if pr.merged { " (merged)" } else { "" },
            pr.head,
            pr.base,
            pr.url
        );
    }
    Ok(())
}

pub async fn pr(cmd: PrCmd) -> Result<ExitCode> {
    match cmd {
        PrCmd::Create {
            id,
            title,
            body,
            body_stdin,
            base,
            draft,
            common,
        } => {
            let command = Command::CreatePullRequest(CreatePullRequest {
                workspace_id: parse_id(&id)?,
                base,
                title,
                body: text(body, body_stdin, "description")?,
                draft,
            });
            command.validate()?;
            let token = read_token(&Some(common.token_env))?;
            let pool = connect(4).await?;
            match client::submit(&pool, &command, common.command_id, token.as_deref()).await? {
                CommandResult::PullRequest(pr) => print_pr(&pr, common.json)?,
                _ => anyhow::bail!("unexpected result for create_pull_request"),
            }
        }
        PrCmd::Comment {
            id,
            number,
            body,
            stdin,
            common,
        } => {
            let body = text(body, stdin, "comment")?
                .ok_or_else(|| invalid("give the comment with --body TEXT or --stdin"))?;
            let command = Command::CommentPullRequest(CommentPullRequest {
                workspace_id: parse_id(&id)?,
                number,
                body,
            });
            command.validate()?;
            let token = read_token(&Some(common.token_env))?;
            let pool = connect(4).await?;
            match client::submit(&pool, &command, common.command_id, token.as_deref()).await? {
                CommandResult::PullRequestComment(c) => {
                    if common.json {
                        println!("{}", serde_json::to_string(&c)?);
                    } else {
                        println!("comment {} on #{}: {}", c.comment_id, c.number, c.url);
                    }
                }
                _ => anyhow::bail!("unexpected result for comment_pull_request"),
            }
        }
        PrCmd::Show {
            id,
            number,
            token_env,
            json,
        } => {
            grove_core::platform::validate_number(number)?;
            let workspace_id = parse_id(&id)?;
            let token = read_token(&token_env)?.map(GitToken::new);
            let platform =
                grove_github::GitHubProvider::from_env().map_err(|e| invalid(e.to_string()))?;
            let pool = connect(2).await?;
            let mut conn = pool.acquire().await?;
            let not_found = |what: String| CommandError::new(ErrorKind::NotFound, what);
            let ws = rows::workspace(&mut conn, workspace_id)
                .await?
                .ok_or_else(|| not_found(format!("workspace {workspace_id} not found")))?;
            let cache = rows::repo_cache(&mut conn, ws.repo_cache_id)
                .await?
                .ok_or_else(|| {
                    not_found(format!(
                        "the repo cache of workspace {workspace_id} is gone"
                    ))
                })?;
            drop(conn);
            let repo = platform
                .locate(&cache.repo_url)
                .map_err(CommandError::from)?;
            let pr = platform
                .get_pull_request(&repo, number, token.as_ref())
                .await
                .map_err(CommandError::from)?;
            print_pr(&pr, json)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
