//! The git platform port (pull requests and their comments) and its value types. No IO.
//!
//! API is not stable. Implement [`GitPlatformProvider`] only inside this workspace: each
//! platform is its own adapter crate (`grove-github`), depending on this one, wired in by
//! `grove-workers` (jobs) and `grove-cli` (`grove serve`, `grove pr show`).
//!
//! The repository a request acts on is never named by the caller: it is derived from
//! the workspace's repo cache URL by [`PlatformRepo::from_web_url`], which accepts only
//! URLs on the platform's own web origin. Credentials are passed per call as a
//! [`GitToken`] and never held by a provider, stored, logged, or put into an event or
//! an error message.

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::error::{CommandError, ErrorKind};
use crate::ports::GitToken;
use crate::validate::{validate_ref, ValidationError};

/// Longest pull request title accepted (bytes).
pub const MAX_TITLE_BYTES: usize = 1024;
/// Longest pull request body or comment accepted: GitHub's own limit, in characters.
pub const MAX_BODY_CHARS: usize = 65_536;

/// Failures of a git platform. Messages never contain credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlatformError {
    /// The repository, pull request or issue does not exist, or the credentials may not
    /// see it (platforms answer 404 for private repositories). Handling: 404 / exit 3.
    #[error("not found on the platform: {0}")]
    NotFound(String),
    /// The platform refused the credentials (none, expired, or lacking the permission).
    /// Handling: do not retry with the same token; 403 / `auth_failed`.
    #[error("the platform refused the credentials: {0}")]
    Unauthorized(String),
    /// The platform refused the request's content, with its own messages (a pull request
    /// that already exists, a base branch that does not). Handling: 422 / `rejected`.
    #[error("{message}{}", if errors.is_empty() { String::new() } else { format!(": {}", errors.join("; ")) })]
    Validation {
        message: String,
        errors: Vec<String>,
    },
    /// A primary or secondary rate limit. Handling: wait `retry_after_secs` (when
    /// known) before the next request; 429 / `resource_limit`.
    #[error("rate limited by the platform{}: {message}", match retry_after_secs { Some(s) => format!(" (retry after {s} s)"), None => String::new() })]
    RateLimited {
        retry_after_secs: Option<u64>,
        message: String,
    },
    /// The platform could not be reached or answered with a server error. Handling:
    /// retry later; 503 / `unavailable`.
    #[error("the platform is unavailable: {0}")]
    Unavailable(String),
    /// The workspace's repository is not on this platform (its URL is not on the
    /// platform's web origin). Handling: do not retry; 422 / `rejected`.
    #[error("{0}")]
    NotOnPlatform(String),
    /// The request is malformed (a title with a newline, an empty comment). Handling:
    /// 400 / exit 2.
    #[error("{0}")]
    Invalid(String),
}

impl From<PlatformError> for CommandError {
    fn from(e: PlatformError) -> Self {
        let kind = match &e {
            PlatformError::NotFound(_) => ErrorKind::NotFound,
            PlatformError::Unauthorized(_) => ErrorKind::AuthFailed,
            PlatformError::Validation { .. } | PlatformError::NotOnPlatform(_) => {
                ErrorKind::Rejected
            }
            PlatformError::RateLimited { .. } => ErrorKind::ResourceLimit,
            PlatformError::Unavailable(_) => ErrorKind::Unavailable,
            PlatformError::Invalid(_) => ErrorKind::InvalidInput,
        };
        Self::new(kind, e.to_string())
    }
}

impl From<ValidationError> for PlatformError {
    fn from(e: ValidationError) -> Self {
        Self::Invalid(e.to_string())
    }
}

/// A repository on a platform: `owner/name`, each segment checked like a [`RepoName`]'s.
///
/// [`RepoName`]: crate::validate::RepoName
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PlatformRepo {
    pub owner: String,
    pub name: String,
}

fn valid_segment(seg: &str) -> bool {
    !seg.is_empty()
        && seg.len() <= 100
        && seg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !seg.starts_with('-')
        && !seg.starts_with('.')
        && !seg.contains("..")
}

impl PlatformRepo {
    /// The repository a workspace's repo URL names on a platform whose web pages live at
    /// `origin` (`https://github.com`, or a GitHub Enterprise host such as
    /// `https://ghe.example.com`). Only `<origin>/<owner>/<name>[.git][/]` is accepted:
    /// the same scheme, host and port (host compared case-insensitively), exactly two
    /// path segments, no query, fragment or credentials. Anything else (SSH and scp-like
    /// forms, `file://`, another host) is [`PlatformError::NotOnPlatform`].
    pub fn from_web_url(repo_url: &str, origin: &str) -> Result<Self, PlatformError> {
        let refuse = || {
            PlatformError::NotOnPlatform(format!(
                "the workspace's repository URL is not a repository on {}; pull requests are made only for repositories of the configured platform",
                origin.trim_end_matches('/')
            ))
        };
        let origin = origin.trim_end_matches('/');
        let (o_scheme, o_authority) = origin.split_once("://").ok_or_else(refuse)?;
        let (scheme, rest) = repo_url.split_once("://").ok_or_else(refuse)?;
        if !scheme.eq_ignore_ascii_case(o_scheme) {
            return Err(refuse());
        }
        let (authority, path) = rest.split_once('/').ok_or_else(refuse)?;
        if authority.contains('@') || !authority.eq_ignore_ascii_case(o_authority) {
            return Err(refuse());
        }
        if path.contains(['?', '#', '%', '\\']) || path.chars().any(|c| c.is_control()) {
            return Err(refuse());
        }
        let path = path.strip_suffix('/').unwrap_or(path);
        let path = path.strip_suffix(".git").unwrap_or(path);
        let (owner, name) = path.split_once('/').ok_or_else(refuse)?;
        if !valid_segment(owner) || !valid_segment(name) {
            return Err(refuse());
        }
        Ok(Self {
            owner: owner.to_string(),
            name: name.to_string(),
        })
    }

    /// `owner/name`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.owner, self.name)
    }
}

/// A pull request to open: from the workspace's branch (`head`) into `base`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewPullRequest {
    pub head: String,
    pub base: String,
    pub title: String,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub draft: bool,
}

/// Checks a pull request title: 1 to [`MAX_TITLE_BYTES`], one line, no control characters.
pub fn validate_title(title: &str) -> Result<(), ValidationError> {
    if title.trim().is_empty() || title.len() > MAX_TITLE_BYTES {
        return Err(ValidationError::Request(format!(
            "a pull request title must be 1 to {MAX_TITLE_BYTES} bytes and not blank"
        )));
    }
    if title.chars().any(char::is_control) {
        return Err(ValidationError::Request(
            "a pull request title must be one line without control characters".into(),
        ));
    }
    Ok(())
}

/// Checks a pull request body or a comment: at most [`MAX_BODY_CHARS`], no NUL.
pub fn validate_body(what: &str, body: &str) -> Result<(), ValidationError> {
    if body.chars().count() > MAX_BODY_CHARS || body.contains('\0') {
        return Err(ValidationError::Request(format!(
            "a {what} must be at most {MAX_BODY_CHARS} characters without NUL"
        )));
    }
    Ok(())
}

/// Checks a pull request number: GitHub numbers start at 1.
pub fn validate_number(number: u64) -> Result<(), ValidationError> {
    if number == 0 || number > i64::MAX as u64 {
        return Err(ValidationError::Request(
            "a pull request number must be a positive integer".into(),
        ));
    }
    Ok(())
}

impl NewPullRequest {
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate_ref(&self.head)?;
        validate_ref(&self.base)?;
        validate_title(&self.title)?;
        if let Some(body) = &self.body {
            validate_body("pull request body", body)?;
        }
        Ok(())
    }
}

/// The state of a pull request, as the platform reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PullRequestState {
    Open,
    Closed,
}

impl PullRequestState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Closed => "closed",
        }
    }
}

/// A pull request as the platform reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullRequest {
    /// `owner/name` of the repository.
    pub repo: String,
    pub number: u64,
    pub state: PullRequestState,
    pub title: String,
    /// The branch with the changes.
    pub head: String,
    /// The commit `head` pointed at, as the platform last saw it.
    pub head_sha: Option<String>,
    /// The branch the changes go into.
    pub base: String,
    /// The pull request's web page.
    pub url: String,
    pub draft: bool,
    pub merged: bool,
}

/// A comment made on a pull request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullRequestComment {
    pub repo: String,
    pub number: u64,
    pub comment_id: u64,
    /// The comment's web page.
    pub url: String,
}

/// A git hosting platform's pull requests (GitHub, GitHub Enterprise).
///
/// Implementations are stateless with respect to credentials: the token of each call
/// is used for that call's requests only. They must map the platform's answers onto
/// [`PlatformError`] (keeping the platform's own validation messages), and never put a
/// token into a URL, a log line or an error.
pub trait GitPlatformProvider: Send + Sync {
    /// The platform's name, recorded in events (`github`).
    fn kind(&self) -> &'static str;
    /// The repository a workspace's repo URL names on this platform (pure; no request).
    fn locate(&self, repo_url: &str) -> Result<PlatformRepo, PlatformError>;
    /// Opens a pull request.
    fn create_pull_request<'a>(
        &'a self,
        repo: &'a PlatformRepo,
        request: &'a NewPullRequest,
        token: &'a GitToken,
    ) -> BoxFuture<'a, Result<PullRequest, PlatformError>>;
    /// Reads a pull request; public repositories need no token.
    fn get_pull_request<'a>(
        &'a self,
        repo: &'a PlatformRepo,
        number: u64,
        token: Option<&'a GitToken>,
    ) -> BoxFuture<'a, Result<PullRequest, PlatformError>>;
    /// Comments on a pull request (its conversation, not a review comment on a line).
    fn comment_pull_request<'a>(
        &'a self,
        repo: &'a PlatformRepo,
        number: u64,
        body: &'a str,
        token: &'a GitToken,
    ) -> BoxFuture<'a, Result<PullRequestComment, PlatformError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repository_is_located_only_on_the_platforms_own_origin() {
        let gh = "https://github.com";
        for (url, want) in [
            ("https://github.com/octo/hello.git", "octo/hello"),
            ("https://GitHub.com/octo/hello", "octo/hello"),
            ("https://github.com/octo/hello/", "octo/hello"),
        ] {
            assert_eq!(
                PlatformRepo::from_web_url(url, gh).unwrap().full_name(),
                want
            );
        }
        for bad in [
            "git@github.com:octo/hello.git",
            "ssh://git@github.com/octo/hello.git",
            "http://github.com/octo/hello",
            "https://github.com.evil.example/octo/hello",
            "https://evil.example/github.com/octo/hello",
            "https://x@github.com/octo/hello",
            "https://github.com/octo/hello/pulls",
            "https://github.com/octo/../hello",
            "https://github.com/octo/hello?x=1",
            "https://github.com/octo/hel%6co",
            "file:///srv/octo/hello.git",
            "https://github.com/-octo/hello",
        ] {
            let err = PlatformRepo::from_web_url(bad, gh).expect_err(bad);
            assert!(matches!(err, PlatformError::NotOnPlatform(_)), "{bad}");
        }
        let ghe = "http://127.0.0.1:4567/";
        assert_eq!(
            PlatformRepo::from_web_url("http://127.0.0.1:4567/o/r.git", ghe)
                .unwrap()
                .full_name(),
            "o/r"
        );
        assert!(PlatformRepo::from_web_url("http://127.0.0.1:4568/o/r.git", ghe).is_err());
    }

    #[test]
    fn titles_bodies_and_numbers_are_checked() {
        let ok = NewPullRequest {
            head: "agent/edits-c1".into(),
            base: "main".into(),
            title: "Fix the thing".into(),
            body: Some("line one\nline two".into()),
            draft: false,
        };
        ok.validate().unwrap();
        for bad in [
            NewPullRequest {
                title: " ".into(),
                ..ok.clone()
            },
            NewPullRequest {
                title: "two\nlines".into(),
                ..ok.clone()
            },
            NewPullRequest {
                base: "a..b".into(),
                ..ok.clone()
            },
            NewPullRequest {
                body: Some("x".repeat(MAX_BODY_CHARS + 1)),
                ..ok.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        assert!(validate_number(0).is_err());
        validate_number(7).unwrap();
    }

    #[test]
    fn platform_errors_map_to_the_documented_kinds() {
        let kind = |e: PlatformError| CommandError::from(e).kind;
        assert_eq!(
            kind(PlatformError::NotFound("x".into())),
            ErrorKind::NotFound
        );
        assert_eq!(
            kind(PlatformError::Unauthorized("x".into())),
            ErrorKind::AuthFailed
        );
        let dup = PlatformError::Validation {
            message: "Validation Failed".into(),
            errors: vec!["A pull request already exists for o:b.".into()],
        };
        assert_eq!(
            CommandError::from(dup.clone()).message,
            "Validation Failed: A pull request already exists for o:b."
        );
        assert_eq!(kind(dup), ErrorKind::Rejected);
        assert_eq!(
            kind(PlatformError::RateLimited {
                retry_after_secs: Some(60),
                message: "x".into()
            }),
            ErrorKind::ResourceLimit
        );
        assert_eq!(
            kind(PlatformError::Unavailable("x".into())),
            ErrorKind::Unavailable
        );
    }
}
