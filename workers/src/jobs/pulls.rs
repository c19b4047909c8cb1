//! Jobs `create_pull_request` and `comment_pull_request`: the git platform side of the
//! edit flow, after a push (ADR 14).
//!
//! The repository is the workspace's (located from its repo cache URL by the platform
//! port, never named by the caller); the head of a new pull request is the workspace's
//! branch. The token comes from `grove.command_secrets` like a push's (ADR 05) and is
//! handed to the port for this call only; events record numbers and URLs, never it.

use grove_core::commands::{CommandResult, CommentPullRequest, CreatePullRequest};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::events::Event;
use grove_core::model::WorkspaceRow;
use grove_core::platform::{GitPlatformProvider, NewPullRequest, PlatformRepo};
use grove_core::ports::GitToken;
use grove_postgres::rows;

use crate::context::{correlation_of, store_error, Handled, JobContext};

/// The refusal of a platform request without a token.
fn no_token(what: &str) -> CommandError {
    CommandError::new(
        ErrorKind::AuthFailed,
        format!(
            "{what} needs a platform token: pass --token-env VAR or the X-Grove-Git-Token header"
        ),
    )
}

impl JobContext {
    fn platform(&self) -> Result<&dyn GitPlatformProvider, CommandError> {
        self.platform.as_deref().ok_or_else(|| {
            CommandError::new(
                ErrorKind::Unavailable,
                "no git platform is configured on this worker (see GROVE_GITHUB_API_URL)",
            )
        })
    }

    /// The workspace, refused when read-only, and its repository on the platform.
    async fn platform_workspace(
        &self,
        workspace_id: uuid::Uuid,
        what: &str,
    ) -> Result<(WorkspaceRow, PlatformRepo), CommandError> {
        let platform = self.platform()?;
        let ws = self.workspace(workspace_id).await?;
        if !ws.capabilities.writable {
            return Err(CommandError::new(
                ErrorKind::Rejected,
                format!(
                    "workspace {} is read-only ({} mode): {what} is refused",
                    ws.id,
                    ws.mode.as_str()
                ),
            ));
        }
        let cache = {
            let mut conn = self.conn().await?;
            rows::repo_cache(&mut conn, ws.repo_cache_id)
                .await
                .map_err(store_error)?
        }
        .ok_or_else(|| {
            CommandError::new(
                ErrorKind::NotFound,
                format!("the repo cache of workspace {} is gone", ws.id),
            )
        })?;
        let repo = platform.locate(&cache.repo_url)?;
        Ok((ws, repo))
    }

    pub async fn create_pull_request(
        &self,
        c: &CreatePullRequest,
        token: Option<&GitToken>,
    ) -> Result<Handled, CommandError> {
        let token = token.ok_or_else(|| no_token("opening a pull request"))?;
        let (ws, repo) = self
            .platform_workspace(c.workspace_id, "opening a pull request")
            .await?;
        let head = ws.branch_name.clone().ok_or_else(|| {
            CommandError::new(
                ErrorKind::Rejected,
                format!(
                    "workspace {} has no branch to open a pull request from",
                    ws.id
                ),
            )
        })?;
        let request = NewPullRequest {
            head,
            base: c.base.clone().unwrap_or_else(|| ws.base_ref.clone()),
            title: c.title.clone(),
            body: c.body.clone(),
            draft: c.draft,
        };
        request.validate()?;
        // Shared: other reads and pull requests go on; a destroy waits for this one.
        let (ws, lock) = self.lock_workspace_any(ws.id, true).await?;
        let platform = self.platform()?;
        let pr = match platform.create_pull_request(&repo, &request, token).await {
            Ok(pr) => pr,
            Err(e) => {
                lock.release().await.ok();
                return Err(e.into());
            }
        };
        let events = vec![Event::WorkspacePullRequestOpened {
            workspace_id: ws.id,
            platform: platform.kind().to_string(),
            repo: repo.full_name(),
            number: pr.number,
            url: pr.url.clone(),
            head: pr.head.clone(),
            base: pr.base.clone(),
            title: pr.title.clone(),
            draft: pr.draft,
        }];
        Ok(Handled {
            result: Ok(CommandResult::PullRequest(pr)),
            events,
            locks: vec![lock],
            correlation: correlation_of(&ws),
        })
    }

    pub async fn comment_pull_request(
        &self,
        c: &CommentPullRequest,
        token: Option<&GitToken>,
    ) -> Result<Handled, CommandError> {
        let token = token.ok_or_else(|| no_token("commenting on a pull request"))?;
        let (ws, repo) = self
            .platform_workspace(c.workspace_id, "commenting on a pull request")
            .await?;
        let (ws, lock) = self.lock_workspace_any(ws.id, true).await?;
        let platform = self.platform()?;
        let comment = match platform
            .comment_pull_request(&repo, c.number, &c.body, token)
            .await
        {
            Ok(comment) => comment,
            Err(e) => {
                lock.release().await.ok();
                return Err(e.into());
            }
        };
        let events = vec![Event::WorkspacePullRequestCommented {
            workspace_id: ws.id,
            platform: platform.kind().to_string(),
            repo: repo.full_name(),
            number: comment.number,
            comment_id: comment.comment_id,
            url: comment.url.clone(),
        }];
        Ok(Handled {
            result: Ok(CommandResult::PullRequestComment(comment)),
            events,
            locks: vec![lock],
            correlation: correlation_of(&ws),
        })
    }
}
