//! grove-github: the GitHub adapter of the git platform port (`GitPlatformProvider`):
//! pull requests and their comments over GitHub's REST API (version 2022-11-28), for
//! github.com and GitHub Enterprise Server.
//!
//! # Layout
//! - [`config`]: the API base URL and the web origin repositories must live on.
//! - [`wire`]: the JSON shapes GitHub sends and receives.
//! - [`errors`]: GitHub's status codes and headers to `PlatformError`.
//! - [`GitHubProvider`] (this file): the requests.
//!
//! Architecture invariant: the provider holds no credentials. The token of a call is
//! put into that call's `Authorization` header only (marked sensitive), never into a
//! URL, a log line or an error message; owner and repository come from
//! `PlatformRepo::from_web_url` (validated segments), never from free text.

pub mod config;
pub mod errors;
pub mod wire;

use std::time::Duration;

use futures::future::BoxFuture;
use grove_core::platform::{
    GitPlatformProvider, NewPullRequest, PlatformError, PlatformRepo, PullRequest,
    PullRequestComment,
};
use grove_core::ports::GitToken;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, USER_AGENT};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;

pub use config::{ConfigError, GitHubConfig};

/// The REST API version every request asks for (`X-GitHub-Api-Version`).
pub const API_VERSION: &str = "2022-11-28";
/// The media type every request accepts.
pub const MEDIA_TYPE: &str = "application/vnd.github+json";

/// The GitHub provider: one HTTP client, the API base and the web origin.
pub struct GitHubProvider {
    http: reqwest::Client,
    config: GitHubConfig,
}

impl GitHubProvider {
    /// A provider for `config`, with a 10 s connect and 30 s request timeout.
    pub fn new(config: GitHubConfig) -> Result<Self, ConfigError> {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static(MEDIA_TYPE));
        headers.insert(
            "x-github-api-version",
            HeaderValue::from_static(API_VERSION),
        );
        // GitHub refuses requests without a User-Agent.
        headers.insert(
            USER_AGENT,
            HeaderValue::from_static(concat!("grove/", env!("CARGO_PKG_VERSION"))),
        );
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            // A redirect would carry the Authorization header elsewhere; GitHub answers
            // moved repositories with 301 and we report it instead of following.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ConfigError(format!("building the HTTP client: {e}")))?;
        Ok(Self { http, config })
    }

    /// The provider configured by the environment ([`GitHubConfig::from_env`]).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::new(GitHubConfig::from_env()?)
    }

    pub fn config(&self) -> &GitHubConfig {
        &self.config
    }

    /// Sends one request and decodes a 2xx body as `T`; anything else through
    /// [`errors::from_response`].
    async fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
        token: Option<&GitToken>,
        what: &str,
    ) -> Result<T, PlatformError> {
        let url = format!("{}{path}", self.config.api_base());
        let mut req = self.http.request(method, &url);
        if let Some(token) = token {
            let mut value =
                HeaderValue::from_str(&format!("Bearer {}", token.expose())).map_err(|_| {
                    PlatformError::Invalid(
                        "the token is not a valid HTTP header value (visible ASCII only)".into(),
                    )
                })?;
            value.set_sensitive(true);
            req = req.header(AUTHORIZATION, value);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.map_err(|e| {
            PlatformError::Unavailable(format!("{what}: {}", errors::transport(&e)))
        })?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.map_err(|e| {
            PlatformError::Unavailable(format!(
                "{what}: reading the answer: {}",
                errors::transport(&e)
            ))
        })?;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|e| {
                PlatformError::Unavailable(format!(
                    "{what}: the platform's answer ({status}) is not the documented JSON: {e}"
                ))
            });
        }
        Err(errors::from_response(
            status,
            &headers,
            &bytes,
            what,
            token.map(GitToken::expose),
        ))
    }
}

fn pr_path(repo: &PlatformRepo) -> String {
    format!("/repos/{}/{}/pulls", repo.owner, repo.name)
}

impl GitPlatformProvider for GitHubProvider {
    fn kind(&self) -> &'static str {
        "github"
    }

    fn locate(&self, repo_url: &str) -> Result<PlatformRepo, PlatformError> {
        PlatformRepo::from_web_url(repo_url, self.config.web_origin())
    }

    fn create_pull_request<'a>(
        &'a self,
        repo: &'a PlatformRepo,
        request: &'a NewPullRequest,
        token: &'a GitToken,
    ) -> BoxFuture<'a, Result<PullRequest, PlatformError>> {
        Box::pin(async move {
            request.validate()?;
            let body = serde_json::to_value(wire::CreatePull {
                title: &request.title,
                head: &request.head,
                base: &request.base,
                body: request.body.as_deref(),
                draft: request.draft,
            })
            .map_err(|e| PlatformError::Invalid(e.to_string()))?;
            let pull: wire::Pull = self
                .send(
                    Method::POST,
                    &pr_path(repo),
                    Some(body),
                    Some(token),
                    &format!("creating a pull request on {}", repo.full_name()),
                )
                .await?;
            Ok(pull.into_domain(repo))
        })
    }

    fn get_pull_request<'a>(
        &'a self,
        repo: &'a PlatformRepo,
        number: u64,
        token: Option<&'a GitToken>,
    ) -> BoxFuture<'a, Result<PullRequest, PlatformError>> {
        Box::pin(async move {
            grove_core::platform::validate_number(number)?;
            let pull: wire::Pull = self
                .send(
                    Method::GET,
                    &format!("{}/{number}", pr_path(repo)),
                    None,
                    token,
                    &format!("reading pull request #{number} of {}", repo.full_name()),
                )
                .await?;
            Ok(pull.into_domain(repo))
        })
    }

    fn comment_pull_request<'a>(
        &'a self,
        repo: &'a PlatformRepo,
        number: u64,
        body: &'a str,
        token: &'a GitToken,
    ) -> BoxFuture<'a, Result<PullRequestComment, PlatformError>> {
        Box::pin(async move {
            grove_core::platform::validate_number(number)?;
            grove_core::platform::validate_body("comment", body)?;
            if body.trim().is_empty() {
                return Err(PlatformError::Invalid("a comment must not be empty".into()));
            }
            // A pull request's conversation is its issue's: comments go to the issue.
            let comment: wire::IssueComment = self
                .send(
                    Method::POST,
                    &format!(
                        "/repos/{}/{}/issues/{number}/comments",
                        repo.owner, repo.name
                    ),
                    Some(serde_json::json!({ "body": body })),
                    Some(token),
                    &format!("commenting on #{number} of {}", repo.full_name()),
                )
                .await?;
            Ok(PullRequestComment {
                repo: repo.full_name(),
                number,
                comment_id: comment.id,
                url: comment.html_url,
            })
        })
    }
}

/// Whether a status is one GitHub documents for rate limits (403 or 429).
pub fn is_rate_limit_status(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS
    )
}
