//! The JSON shapes of GitHub's REST API (version 2022-11-28) that grove sends and reads:
//! "Create a pull request", "Get a pull request", "Create an issue comment", and the
//! error body (`message`, `errors`, `documentation_url`). Fields grove does not use are
//! not declared; serde ignores them.

use grove_core::platform::{PlatformRepo, PullRequest, PullRequestState};
use serde::{Deserialize, Serialize};

/// The body of `POST /repos/{owner}/{repo}/pulls`.
#[derive(Debug, Serialize)]
pub struct CreatePull<'a> {
    pub title: &'a str,
    pub head: &'a str,
    pub base: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<&'a str>,
    pub draft: bool,
}

/// A branch end of a pull request (`head` or `base`).
#[derive(Debug, Deserialize)]
pub struct Branch {
    #[serde(rename = "ref")]
    pub git_ref: String,
    #[serde(default)]
    pub sha: Option<String>,
}

/// A pull request (the fields grove reads).
#[derive(Debug, Deserialize)]
pub struct Pull {
    pub number: u64,
    pub state: String,
    pub title: String,
    pub html_url: String,
    pub head: Branch,
    pub base: Branch,
    #[serde(default)]
    pub draft: Option<bool>,
    /// Present on a single pull request; lists leave it out (then `merged_at` says).
    #[serde(default)]
    pub merged: Option<bool>,
    #[serde(default)]
    pub merged_at: Option<String>,
}

impl Pull {
    pub fn into_domain(self, repo: &PlatformRepo) -> PullRequest {
        PullRequest {
            repo: repo.full_name(),
            number: self.number,
            state: if self.state == "open" {
                PullRequestState::Open
            } else {
                PullRequestState::Closed
            },
            title: self.title,
            head: self.head.git_ref,
            head_sha: self.head.sha,
            base: self.base.git_ref,
            url: self.html_url,
            draft: self.draft.unwrap_or(false),
            merged: self.merged.unwrap_or(self.merged_at.is_some()),
        }
    }
}

/// An issue comment (the fields grove reads).
#[derive(Debug, Deserialize)]
pub struct IssueComment {
    pub id: u64,
    pub html_url: String,
}

/// One entry of a 422's `errors`: either a structured one (`resource`, `field`,
/// `code`) or a `custom` one with a `message`; some endpoints send plain strings.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ErrorDetail {
    Structured {
        #[serde(default)]
        resource: Option<String>,
        #[serde(default)]
        field: Option<String>,
        #[serde(default)]
        code: Option<String>,
        #[serde(default)]
        message: Option<String>,
    },
    Text(String),
}

impl ErrorDetail {
    /// The detail in one line: its message, else `resource.field code`.
    pub fn render(&self) -> String {
        match self {
            Self::Text(t) => t.clone(),
            Self::Structured {
                message: Some(m), ..
            } => m.clone(),
            Self::Structured {
                resource,
                field,
                code,
                ..
            } => {
                let mut out = String::new();
                if let Some(r) = resource {
                    out.push_str(r);
                }
                if let Some(f) = field {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(f);
                }
                if let Some(c) = code {
                    if !out.is_empty() {
                        out.push(' ');
                    }
                    out.push_str(c);
                }
                out
            }
        }
    }
}

/// GitHub's error body.
#[derive(Debug, Default, Deserialize)]
pub struct ErrorBody {
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub errors: Vec<ErrorDetail>,
}
