//! Daytona's REST API, typed: the sandbox resources of the control plane and the
//! toolbox (process sessions, files, git) reached through the API's toolbox proxy.
//!
//! Follows the Daytona API as published in `apps/api` (NestJS, `/sandbox`,
//! `/sandbox/paginated`, `/toolbox/{sandboxId}/toolbox/...`) and the daemon's toolbox
//! swagger 2.0 (`apps/daemon/pkg/toolbox/docs/swagger.yaml`), with session command logs
//! in their JSON form (`{stdout, stderr}`). Every request carries the API key as
//! `Authorization: Bearer`; the key never enters a URL, a log line or an error.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use grove_remote_runtime::enc;

use crate::error::DaytonaError;

/// The API key of one deployment. Its `Debug` never shows the value.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

/// A sandbox's lifecycle state (`SandboxState` in the API).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    Creating,
    Restoring,
    Destroyed,
    Destroying,
    Started,
    Stopped,
    Starting,
    Stopping,
    Error,
    BuildFailed,
    PendingBuild,
    BuildingSnapshot,
    PullingSnapshot,
    Archived,
    Archiving,
    #[default]
    #[serde(other)]
    Unknown,
}

impl SandboxState {
    /// A transition is under way; waiting will bring a settled state.
    pub fn is_transitional(self) -> bool {
        matches!(
            self,
            Self::Creating
                | Self::Restoring
                | Self::Starting
                | Self::Stopping
                | Self::PendingBuild
                | Self::BuildingSnapshot
                | Self::PullingSnapshot
                | Self::Archiving
                | Self::Destroying
        )
    }
}

/// A sandbox as the API returns it (the fields grove reads).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    pub id: String,
    #[serde(default)]
    pub state: SandboxState,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub error_reason: Option<String>,
    /// When it was created (RFC 3339), which decides a create race.
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default)]
    pub auto_stop_interval: Option<u32>,
    #[serde(default)]
    pub auto_archive_interval: Option<u32>,
    #[serde(default)]
    pub network_block_all: Option<bool>,
    #[serde(default)]
    pub network_allow_list: Option<String>,
}

/// `POST /sandbox` body (`CreateSandbox`).
#[derive(Debug, Clone, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct CreateSandbox {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    pub env: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u32>,
    /// GiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<u32>,
    /// GiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<u32>,
    /// Minutes of inactivity before the sandbox stops (0: never).
    pub auto_stop_interval: u32,
    /// Minutes stopped before the sandbox is archived.
    pub auto_archive_interval: u32,
    pub network_block_all: bool,
    /// Comma-separated CIDRs the sandbox may reach.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_allow_list: Option<String>,
}

/// `GET /sandbox/paginated` answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxPage {
    pub items: Vec<Sandbox>,
    #[serde(default)]
    pub total_pages: u32,
}

/// A session command (`Command` in the toolbox).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionCommand {
    pub id: String,
    #[serde(default)]
    pub exit_code: Option<i32>,
}

/// `SessionCommandLogsResponse`.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct CommandLogs {
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
}

#[derive(Debug, Deserialize)]
struct SessionExecuteResponse {
    #[serde(rename = "cmdId")]
    cmd_id: Option<String>,
}

/// `GET /sandbox/{id}/ports/{port}/preview-url` answer. The token is a credential
/// for private sandboxes and is not kept.
#[derive(Debug, Deserialize)]
struct PortPreviewUrl {
    url: String,
}

#[derive(Debug, Deserialize)]
struct HomeDir {
    dir: String,
}

#[derive(Debug, Deserialize)]
struct BranchList {
    branches: Vec<String>,
}

/// `POST /git/clone` body; the password is the git token and goes only here.
#[derive(Serialize)]
pub struct GitClone<'a> {
    pub url: &'a str,
    pub path: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branch: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<&'a str>,
}

/// The error body of the API and of the toolbox (`statusCode`, `message`).
#[derive(Debug, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: serde_json::Value,
}

/// A client for one Daytona deployment.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    key: ApiKey,
    organization: Option<String>,
    page_size: u32,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("base", &self.base).finish()
    }
}

impl Client {
    /// `base` is the API root (`https://app.daytona.io/api`).
    pub fn new(
        base: &str,
        key: ApiKey,
        organization: Option<String>,
    ) -> Result<Self, DaytonaError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| DaytonaError::Transport(e.without_url().to_string()))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            key,
            organization,
            page_size: 100,
        })
    }

    /// Sandboxes asked for per page when listing (the API allows up to 200).
    pub fn with_page_size(mut self, n: u32) -> Self {
        self.page_size = n.clamp(1, 200);
        self
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut b = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key.0);
        if let Some(org) = &self.organization {
            b = b.header("X-Daytona-Organization-ID", org);
        }
        b
    }

    fn toolbox(
        &self,
        method: reqwest::Method,
        sandbox: &str,
        path: &str,
    ) -> reqwest::RequestBuilder {
        self.request(method, &format!("/toolbox/{}/toolbox{path}", enc(sandbox)))
    }

    async fn send(&self, b: reqwest::RequestBuilder) -> Result<reqwest::Response, DaytonaError> {
        let resp = b.send().await.map_err(DaytonaError::from_reqwest)?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let text = resp.text().await.unwrap_or_default();
        let message = match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => match body.message {
                serde_json::Value::String(s) => s,
                serde_json::Value::Array(items) => items
                    .iter()
                    .map(|v| {
                        v.as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| v.to_string())
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
                serde_json::Value::Null => String::new(),
                other => other.to_string(),
            },
            Err(_) => text.chars().take(200).collect(),
        };
        Err(DaytonaError::Api {
            status: status.as_u16(),
            message,
        })
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        b: reqwest::RequestBuilder,
    ) -> Result<T, DaytonaError> {
        self.send(b)
            .await?
            .json()
            .await
            .map_err(|e| DaytonaError::Protocol(e.without_url().to_string()))
    }

    pub async fn create_sandbox(&self, body: &CreateSandbox) -> Result<Sandbox, DaytonaError> {
        self.json(self.request(reqwest::Method::POST, "/sandbox").json(body))
            .await
    }

    pub async fn get_sandbox(&self, id: &str) -> Result<Sandbox, DaytonaError> {
        self.json(self.request(reqwest::Method::GET, &format!("/sandbox/{}", enc(id))))
            .await
    }

    /// Every sandbox carrying all of `labels`, following the pages.
    pub async fn list_sandboxes(
        &self,
        labels: &BTreeMap<String, String>,
    ) -> Result<Vec<Sandbox>, DaytonaError> {
        let labels = serde_json::to_string(labels).expect("labels serialize");
        let mut all = Vec::new();
        let mut page = 1u32;
        loop {
            let got: SandboxPage = self
                .json(
                    self.request(reqwest::Method::GET, "/sandbox/paginated")
                        .query(&[
                            ("page", page.to_string()),
                            ("limit", self.page_size.to_string()),
                            ("labels", labels.clone()),
                        ]),
                )
                .await?;
            let n = got.items.len();
            all.extend(got.items);
            if n == 0 || page >= got.total_pages {
                return Ok(all);
            }
            page += 1;
        }
    }

    pub async fn start_sandbox(&self, id: &str) -> Result<(), DaytonaError> {
        self.send(self.request(
            reqwest::Method::POST,
            &format!("/sandbox/{}/start", enc(id)),
        ))
        .await
        .map(drop)
    }

    pub async fn stop_sandbox(&self, id: &str) -> Result<(), DaytonaError> {
        self.send(self.request(reqwest::Method::POST, &format!("/sandbox/{}/stop", enc(id))))
            .await
            .map(drop)
    }

    pub async fn delete_sandbox(&self, id: &str) -> Result<(), DaytonaError> {
        self.send(self.request(reqwest::Method::DELETE, &format!("/sandbox/{}", enc(id))))
            .await
            .map(drop)
    }

    /// The URL a port of the sandbox is reachable at (Daytona's preview proxy).
    pub async fn preview_url(&self, id: &str, port: u16) -> Result<String, DaytonaError> {
        let p: PortPreviewUrl = self
            .json(self.request(
                reqwest::Method::GET,
                &format!("/sandbox/{}/ports/{port}/preview-url", enc(id)),
            ))
            .await?;
        Ok(p.url)
    }

    pub async fn home_dir(&self, sandbox: &str) -> Result<String, DaytonaError> {
        let h: HomeDir = self
            .json(self.toolbox(reqwest::Method::GET, sandbox, "/user-home-dir"))
            .await?;
        Ok(h.dir)
    }

    pub async fn create_session(&self, sandbox: &str, session: &str) -> Result<(), DaytonaError> {
        self.send(
            self.toolbox(reqwest::Method::POST, sandbox, "/process/session")
                .json(&serde_json::json!({ "sessionId": session })),
        )
        .await
        .map(drop)
    }

    pub async fn delete_session(&self, sandbox: &str, session: &str) -> Result<(), DaytonaError> {
        self.send(self.toolbox(
            reqwest::Method::DELETE,
            sandbox,
            &format!("/process/session/{}", enc(session)),
        ))
        .await
        .map(drop)
    }

    /// Starts `command` in the session without waiting; returns the command id.
    pub async fn session_exec_async(
        &self,
        sandbox: &str,
        session: &str,
        command: &str,
    ) -> Result<String, DaytonaError> {
        let r: SessionExecuteResponse = self
            .json(
                self.toolbox(
                    reqwest::Method::POST,
                    sandbox,
                    &format!("/process/session/{}/exec", enc(session)),
                )
                .json(&serde_json::json!({ "command": command, "runAsync": true })),
            )
            .await?;
        r.cmd_id
            .ok_or_else(|| DaytonaError::Protocol("session exec answered without a cmdId".into()))
    }

    pub async fn session_command(
        &self,
        sandbox: &str,
        session: &str,
        cmd: &str,
    ) -> Result<SessionCommand, DaytonaError> {
        self.json(self.toolbox(
            reqwest::Method::GET,
            sandbox,
            &format!("/process/session/{}/command/{}", enc(session), enc(cmd)),
        ))
        .await
    }

    pub async fn session_command_logs(
        &self,
        sandbox: &str,
        session: &str,
        cmd: &str,
    ) -> Result<CommandLogs, DaytonaError> {
        self.json(
            self.toolbox(
                reqwest::Method::GET,
                sandbox,
                &format!(
                    "/process/session/{}/command/{}/logs",
                    enc(session),
                    enc(cmd)
                ),
            )
            .header(reqwest::header::ACCEPT, "application/json"),
        )
        .await
    }

    pub async fn upload_file(
        &self,
        sandbox: &str,
        path: &str,
        data: Vec<u8>,
    ) -> Result<(), DaytonaError> {
        let part = reqwest::multipart::Part::bytes(data).file_name("file");
        let form = reqwest::multipart::Form::new().part("file", part);
        self.send(
            self.toolbox(reqwest::Method::POST, sandbox, "/files/upload")
                .query(&[("path", path)])
                .multipart(form),
        )
        .await
        .map(drop)
    }

    pub async fn download_file(&self, sandbox: &str, path: &str) -> Result<Vec<u8>, DaytonaError> {
        let resp = self
            .send(
                self.toolbox(reqwest::Method::GET, sandbox, "/files/download")
                    .query(&[("path", path)]),
            )
            .await?;
        resp.bytes()
            .await
            .map(|b| b.to_vec())
            .map_err(|e| DaytonaError::Protocol(e.without_url().to_string()))
    }

    pub async fn git_clone(&self, sandbox: &str, req: &GitClone<'_>) -> Result<(), DaytonaError> {
        self.send(
            self.toolbox(reqwest::Method::POST, sandbox, "/git/clone")
                .json(req),
        )
        .await
        .map(drop)
    }

    pub async fn git_create_branch(
        &self,
        sandbox: &str,
        path: &str,
        name: &str,
    ) -> Result<(), DaytonaError> {
        self.send(
            self.toolbox(reqwest::Method::POST, sandbox, "/git/branches")
                .json(&serde_json::json!({ "path": path, "name": name })),
        )
        .await
        .map(drop)
    }

    pub async fn git_branches(
        &self,
        sandbox: &str,
        path: &str,
    ) -> Result<Vec<String>, DaytonaError> {
        let b: BranchList = self
            .json(
                self.toolbox(reqwest::Method::GET, sandbox, "/git/branches")
                    .query(&[("path", path)]),
            )
            .await?;
        Ok(b.branches)
    }

    pub async fn git_checkout(
        &self,
        sandbox: &str,
        path: &str,
        branch: &str,
    ) -> Result<(), DaytonaError> {
        self.send(
            self.toolbox(reqwest::Method::POST, sandbox, "/git/checkout")
                .json(&serde_json::json!({ "path": path, "branch": branch })),
        )
        .await
        .map(drop)
    }
}
