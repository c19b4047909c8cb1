//! E2B's APIs, typed: the REST control plane (`https://api.e2b.dev`, header
//! `X-API-Key`) and a sandbox's envd (process and filesystem).
//!
//! Follows E2B's published OpenAPI for the control plane (`POST /sandboxes`,
//! `GET /v2/sandboxes` with `metadata`, `state`, `limit`, `nextToken` and the
//! `x-next-token` answer header, `GET|DELETE /sandboxes/{id}`,
//! `POST /sandboxes/{id}/pause|connect|timeout`; errors `{code, message}`) and envd's
//! `process.Process` service (`spec/envd/process/process.proto`) in the JSON form of
//! the Connect protocol: `Start` is server-streaming (`application/connect+json`,
//! 5-byte envelopes), `SendInput`, `CloseStdin` and `SendSignal` are unary JSON
//! posts; bytes are base64 as proto3 JSON requires. Files go through envd's
//! `GET|POST /files?path=`. The envd access token travels only in `X-Access-Token`.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use grove_remote_runtime::enc;

use crate::error::E2bError;

/// A secret (API key or envd access token). Its `Debug` never shows the value.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// `POST /sandboxes` body (`NewSandbox`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds until the sandbox times out (killed, or paused with `auto_pause`).
    pub timeout: u64,
    pub auto_pause: bool,
    /// Ask for an envd access token.
    pub secure: bool,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: bool,
}

/// A sandbox as create, connect and get answer it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxInfo {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(default, rename = "templateID")]
    pub template_id: Option<String>,
    #[serde(default)]
    pub envd_access_token: Option<String>,
    #[serde(default)]
    pub state: Option<SandboxState>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub domain: Option<String>,
    /// When it started (RFC 3339; listings carry it), which decides a create race.
    #[serde(default)]
    pub started_at: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Running,
    Paused,
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: String,
}

/// One event of a started process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEvent {
    Start {
        pid: u32,
    },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    End {
        exit_code: i32,
        exited: bool,
        status: String,
    },
    KeepAlive,
}

/// A process to start (`ProcessConfig`).
#[derive(Debug, Clone, Serialize)]
pub struct ProcessConfig {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// The REST client of one E2B deployment.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    streaming: reqwest::Client,
    base: String,
    key: Secret,
    /// `{sandbox_id}` and `{domain}` are replaced: where a sandbox's envd answers.
    envd_template: String,
    default_domain: String,
    page_size: u32,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("base", &self.base).finish()
    }
}

/// How to reach one sandbox's envd.
#[derive(Clone, Debug)]
pub struct Envd {
    pub url: String,
    pub token: Option<Secret>,
}

impl Client {
    pub fn new(
        base: &str,
        key: Secret,
        envd_template: &str,
        default_domain: &str,
    ) -> Result<Self, E2bError> {
        let build = |timeout: Option<Duration>| {
            let mut b = reqwest::Client::builder().connect_timeout(Duration::from_secs(10));
            if let Some(t) = timeout {
                b = b.timeout(t);
            }
            b.build()
                .map_err(|e| E2bError::Transport(e.without_url().to_string()))
        };
        Ok(Self {
            http: build(Some(Duration::from_secs(120)))?,
            // A process stream lasts as long as its command.
            streaming: build(None)?,
            base: base.trim_end_matches('/').to_string(),
            key,
            envd_template: envd_template.to_string(),
            default_domain: default_domain.to_string(),
            page_size: 100,
        })
    }

    /// Sandboxes asked for per page when listing (the API allows up to 100).
    pub fn with_page_size(mut self, n: u32) -> Self {
        self.page_size = n.clamp(1, 100);
        self
    }

    fn api(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .header("X-API-Key", &self.key.0)
    }

    async fn check(
        resp: Result<reqwest::Response, reqwest::Error>,
    ) -> Result<reqwest::Response, E2bError> {
        let resp = resp.map_err(E2bError::from_reqwest)?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let text = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<ErrorBody>(&text)
            .map(|b| b.message)
            .unwrap_or_else(|_| text.chars().take(200).collect());
        Err(E2bError::Api {
            status: status.as_u16(),
            message,
        })
    }

    async fn json<T: serde::de::DeserializeOwned>(
        b: reqwest::RequestBuilder,
    ) -> Result<T, E2bError> {
        Self::check(b.send().await)
            .await?
            .json()
            .await
            .map_err(|e| E2bError::Protocol(e.without_url().to_string()))
    }

    pub async fn create(&self, body: &NewSandbox) -> Result<SandboxInfo, E2bError> {
        Self::json(self.api(reqwest::Method::POST, "/sandboxes").json(body)).await
    }

    pub async fn get(&self, id: &str) -> Result<SandboxInfo, E2bError> {
        Self::json(self.api(reqwest::Method::GET, &format!("/sandboxes/{}", enc(id)))).await
    }

    /// Running and paused sandboxes carrying all of `metadata`, following the pages.
    pub async fn list(
        &self,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxInfo>, E2bError> {
        let filter = metadata
            .iter()
            .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
            .collect::<Vec<_>>()
            .join("&");
        let mut all = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut q: Vec<(&str, String)> = vec![
                ("metadata", filter.clone()),
                ("state", "running".into()),
                ("state", "paused".into()),
                ("limit", self.page_size.to_string()),
            ];
            if let Some(t) = &token {
                q.push(("nextToken", t.clone()));
            }
            let resp = Self::check(
                self.api(reqwest::Method::GET, "/v2/sandboxes")
                    .query(&q)
                    .send()
                    .await,
            )
            .await?;
            let next = resp
                .headers()
                .get("x-next-token")
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_string);
            let page: Vec<SandboxInfo> = resp
                .json()
                .await
                .map_err(|e| E2bError::Protocol(e.without_url().to_string()))?;
            all.extend(page);
            match next {
                Some(t) => token = Some(t),
                None => return Ok(all),
            }
        }
    }

    pub async fn kill(&self, id: &str) -> Result<(), E2bError> {
        Self::check(
            self.api(reqwest::Method::DELETE, &format!("/sandboxes/{}", enc(id)))
                .send()
                .await,
        )
        .await
        .map(drop)
    }

    pub async fn pause(&self, id: &str) -> Result<(), E2bError> {
        Self::check(
            self.api(
                reqwest::Method::POST,
                &format!("/sandboxes/{}/pause", enc(id)),
            )
            .send()
            .await,
        )
        .await
        .map(drop)
    }

    /// Connects to a sandbox, resuming it when paused; `timeout` (seconds) restarts
    /// its clock.
    pub async fn connect(&self, id: &str, timeout: u64) -> Result<SandboxInfo, E2bError> {
        Self::json(
            self.api(
                reqwest::Method::POST,
                &format!("/sandboxes/{}/connect", enc(id)),
            )
            .json(&serde_json::json!({ "timeout": timeout })),
        )
        .await
    }

    /// Restarts a running sandbox's clock: it times out `timeout` seconds from now.
    pub async fn set_timeout(&self, id: &str, timeout: u64) -> Result<(), E2bError> {
        Self::check(
            self.api(
                reqwest::Method::POST,
                &format!("/sandboxes/{}/timeout", enc(id)),
            )
            .json(&serde_json::json!({ "timeout": timeout }))
            .send()
            .await,
        )
        .await
        .map(drop)
    }

    /// Where `info`'s envd answers.
    pub fn envd(&self, info: &SandboxInfo) -> Envd {
        let domain = info.domain.as_deref().unwrap_or(&self.default_domain);
        Envd {
            url: self
                .envd_template
                .replace("{sandbox_id}", &enc(&info.sandbox_id))
                .replace("{domain}", domain)
                .trim_end_matches('/')
                .to_string(),
            token: info.envd_access_token.clone().map(Secret::new),
        }
    }

    fn envd_req(
        &self,
        client: &reqwest::Client,
        envd: &Envd,
        method: reqwest::Method,
        path: &str,
    ) -> reqwest::RequestBuilder {
        let mut b = client.request(method, format!("{}{path}", envd.url));
        if let Some(t) = &envd.token {
            b = b.header("X-Access-Token", &t.0);
        }
        b
    }

    async fn unary(
        &self,
        envd: &Envd,
        method: &str,
        body: serde_json::Value,
    ) -> Result<(), E2bError> {
        Self::check(
            self.envd_req(
                &self.http,
                envd,
                reqwest::Method::POST,
                &format!("/process.Process/{method}"),
            )
            .header("Connect-Protocol-Version", "1")
            .json(&body)
            .send()
            .await,
        )
        .await
        .map(drop)
    }

    /// Starts a process; the stream yields its events until its end.
    pub async fn start(
        &self,
        envd: &Envd,
        process: &ProcessConfig,
        stdin: bool,
    ) -> Result<futures::stream::BoxStream<'static, Result<ProcessEvent, E2bError>>, E2bError> {
        let msg = serde_json::to_vec(&serde_json::json!({ "process": process, "stdin": stdin }))
            .expect("request serializes");
        let mut body = Vec::with_capacity(msg.len() + 5);
        body.push(0u8);
        body.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        body.extend_from_slice(&msg);
        let resp = Self::check(
            self.envd_req(
                &self.streaming,
                envd,
                reqwest::Method::POST,
                "/process.Process/Start",
            )
            .header(reqwest::header::CONTENT_TYPE, "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .body(body)
            .send()
            .await,
        )
        .await?;
        let bytes = resp.bytes_stream();
        let stream = futures::stream::unfold(
            (bytes, Vec::<u8>::new(), false),
            |(mut bytes, mut buf, done)| async move {
                if done {
                    return None;
                }
                loop {
                    if buf.len() >= 5 {
                        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                        if buf.len() >= 5 + len {
                            let flags = buf[0];
                            let payload: Vec<u8> = buf[5..5 + len].to_vec();
                            buf.drain(..5 + len);
                            if flags & 0x02 != 0 {
                                // End of stream: an error, or a clean end.
                                let end: serde_json::Value =
                                    serde_json::from_slice(&payload).unwrap_or_default();
                                return end.get("error").map(|e| {
                                    let field = |k: &str| {
                                        e.get(k).and_then(|c| c.as_str()).unwrap_or("").to_string()
                                    };
                                    let err = E2bError::Rpc {
                                        code: field("code"),
                                        message: field("message"),
                                    };
                                    (Err(err), (bytes, buf, true))
                                });
                            }
                            return Some((parse_event(&payload), (bytes, buf, false)));
                        }
                    }
                    match bytes.next().await {
                        Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                        Some(Err(e)) => {
                            return Some((Err(E2bError::from_reqwest(e)), (bytes, buf, true)));
                        }
                        None => {
                            return Some((
                                Err(E2bError::Protocol(
                                    "process stream ended without its end message".into(),
                                )),
                                (bytes, buf, true),
                            ))
                        }
                    }
                }
            },
        );
        Ok(stream.boxed())
    }

    pub async fn send_input(&self, envd: &Envd, pid: u32, data: &[u8]) -> Result<(), E2bError> {
        let b64 = base64::engine::general_purpose::STANDARD.encode(data);
        self.unary(
            envd,
            "SendInput",
            serde_json::json!({ "process": { "pid": pid }, "input": { "stdin": b64 } }),
        )
        .await
    }

    pub async fn close_stdin(&self, envd: &Envd, pid: u32) -> Result<(), E2bError> {
        self.unary(
            envd,
            "CloseStdin",
            serde_json::json!({ "process": { "pid": pid } }),
        )
        .await
    }

    pub async fn kill_process(&self, envd: &Envd, pid: u32) -> Result<(), E2bError> {
        self.unary(
            envd,
            "SendSignal",
            serde_json::json!({ "process": { "pid": pid }, "signal": "SIGNAL_SIGKILL" }),
        )
        .await
    }

    pub async fn read_file(&self, envd: &Envd, path: &str) -> Result<Vec<u8>, E2bError> {
        let resp = Self::check(
            self.envd_req(&self.http, envd, reqwest::Method::GET, "/files")
                .query(&[("path", path)])
                .send()
                .await,
        )
        .await?;
        resp.bytes()
            .await
            .map(|b| b.to_vec())
            .map_err(|e| E2bError::Protocol(e.without_url().to_string()))
    }

    pub async fn write_file(&self, envd: &Envd, path: &str, data: Vec<u8>) -> Result<(), E2bError> {
        let form = reqwest::multipart::Form::new().part(
            "file",
            reqwest::multipart::Part::bytes(data).file_name("file"),
        );
        Self::check(
            self.envd_req(&self.http, envd, reqwest::Method::POST, "/files")
                .query(&[("path", path)])
                .multipart(form)
                .send()
                .await,
        )
        .await
        .map(drop)
    }
}

fn parse_event(payload: &[u8]) -> Result<ProcessEvent, E2bError> {
    let v: serde_json::Value =
        serde_json::from_slice(payload).map_err(|e| E2bError::Protocol(e.to_string()))?;
    let ev = &v["event"];
    let b64 = |s: &serde_json::Value| -> Result<Vec<u8>, E2bError> {
        base64::engine::general_purpose::STANDARD
            .decode(s.as_str().unwrap_or(""))
            .map_err(|e| E2bError::Protocol(e.to_string()))
    };
    if let Some(s) = ev.get("start") {
        return Ok(ProcessEvent::Start {
            pid: s.get("pid").and_then(|p| p.as_u64()).unwrap_or(0) as u32,
        });
    }
    if let Some(d) = ev.get("data") {
        if let Some(o) = d.get("stdout") {
            return Ok(ProcessEvent::Stdout(b64(o)?));
        }
        if let Some(e) = d.get("stderr") {
            return Ok(ProcessEvent::Stderr(b64(e)?));
        }
        return Ok(ProcessEvent::KeepAlive);
    }
    if let Some(e) = ev.get("end") {
        return Ok(ProcessEvent::End {
            exit_code: e.get("exitCode").and_then(|c| c.as_i64()).unwrap_or(0) as i32,
            exited: e.get("exited").and_then(|c| c.as_bool()).unwrap_or(false),
            status: e
                .get("status")
                .and_then(|c| c.as_str())
                .unwrap_or("")
                .to_string(),
        });
    }
    Ok(ProcessEvent::KeepAlive)
}
