//! The CLI as a client of a grove server: with `GROVE_URL` set, `grove exec` and
//! `grove tool` are one HTTP request each to that server (bearer token from
//! `GROVE_TOKEN`), instead of a database connection, a listener and a queued job of
//! their own. The machine running the CLI then needs no database credentials, and the
//! server answers reads in-process where it can.
//!
//! Errors keep their kind (the API's `error.kind`), so exit codes are the same as over
//! the database. The token is sent only to `GROVE_URL` and never printed.

use anyhow::Result;
use grove_core::commands::Exec;
use grove_core::error::{CommandError, ErrorKind};
use grove_core::model::ExecOutcome;
use grove_core::tool_catalog;
use grove_core::tools::{ToolOp, ToolOutput};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::wire::{Answer, Failure, Request, Wire};

/// The header carrying a git token for one request (as the API names it).
const GIT_TOKEN_HEADER: &str = "X-Grove-Git-Token";

/// A grove server the CLI talks to.
pub struct Server {
    http: Wire,
    base: String,
    token: String,
}

impl Server {
    /// The server of `GROVE_URL` with the token of `GROVE_TOKEN`; `None` when
    /// `GROVE_URL` is unset or empty (the CLI then uses the database).
    pub fn from_env() -> Result<Option<Self>> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let Some(url) = get("GROVE_URL").filter(|u| !u.trim().is_empty()) else {
            return Ok(None);
        };
        let base = url.trim().trim_end_matches('/').to_string();
        let parsed = reqwest::Url::parse(&base)
            .map_err(|_| invalid("GROVE_URL is not a URL (expected http://HOST:PORT)"))?;
        if !matches!(parsed.scheme(), "http" | "https")
            || !parsed.username().is_empty()
            || parsed.password().is_some()
            || parsed.query().is_some()
        {
            return Err(invalid(
                "GROVE_URL must be an http(s) URL without credentials or query (the token goes in GROVE_TOKEN)",
            ));
        }
        let token = get("GROVE_TOKEN")
            .filter(|t| !t.is_empty())
            .ok_or_else(|| invalid("GROVE_URL is set but GROVE_TOKEN is not"))?;
        let http = Wire::new(parsed.scheme()).map_err(unavailable)?;
        Ok(Some(Self { http, base, token }))
    }

    /// Runs `exec` on the server; `key` makes the request idempotent.
    pub async fn exec(&self, exec: &Exec, key: Option<Uuid>) -> Result<ExecOutcome> {
        let stdin = match &exec.stdin {
            None => None,
            Some(bytes) => Some(String::from_utf8(bytes.clone()).map_err(|_| {
                invalid("stdin must be UTF-8 text when the CLI talks to a server (GROVE_URL)")
            })?),
        };
        let body = json!({
            "argv": exec.argv,
            "env": exec.env,
            "cwd": exec.cwd,
            "stdin": stdin,
            "timeout_ms": exec.timeout_ms,
            "max_output_bytes": exec.max_output_bytes,
            "kind": exec.kind,
            "network": exec.network,
            "runtime": exec.runtime,
            "idempotency_key": key.map(|k| k.to_string()),
        });
        let path = format!("/v1/workspaces/{}/exec", exec.workspace_id);
        self.call(Method::POST, &path, Some(body), None).await
    }

    /// Runs one tool operation on the server.
    pub async fn tool(
        &self,
        workspace_id: Uuid,
        op: &ToolOp,
        git_token: Option<&str>,
    ) -> Result<ToolOutput> {
        let (name, args) = tool_catalog::call_of(op);
        let path = format!("/v1/workspaces/{workspace_id}/tools/{name}");
        self.call(Method::POST, &path, Some(Value::Object(args)), git_token)
            .await
    }

    /// Checks that the caller may see `workspace_id` (its record, or the API's error).
    pub async fn workspace(&self, workspace_id: Uuid) -> Result<Value> {
        let path = format!("/v1/workspaces/{workspace_id}");
        self.call(Method::GET, &path, None, None).await
    }

    /// Posts one MCP message (a JSON-RPC line) to the workspace's MCP route, and
    /// returns the messages of its answer: none for an accepted notification, the
    /// response for a request (from a JSON or an event-stream body).
    pub async fn mcp_message(
        &self,
        workspace_id: Uuid,
        runtime: &str,
        line: String,
        git_token: Option<&str>,
    ) -> Result<Vec<Value>> {
        let mut url =
            reqwest::Url::parse(&format!("{}/v1/workspaces/{workspace_id}/mcp", self.base))
                .map_err(|_| invalid("GROVE_URL is not a URL (expected http://HOST:PORT)"))?;
        url.query_pairs_mut().append_pair("runtime", runtime);
        let answer = self
            .send(Request {
                method: Method::POST,
                url: url.into(),
                token: &self.token,
                content_type: Some("application/json"),
                accept: Some("application/json, text/event-stream"),
                git_token: git_token.map(|t| (GIT_TOKEN_HEADER, t)),
                body: Some(line.into_bytes()),
            })
            .await?;
        let Answer {
            status,
            content_type,
            body: bytes,
        } = answer;
        let sse = content_type.is_some_and(|v| v.starts_with("text/event-stream"));
        if status == StatusCode::ACCEPTED {
            return Ok(vec![]);
        }
        let messages = if sse {
            String::from_utf8_lossy(&bytes)
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str(d.trim()).ok())
                .collect()
        } else {
            serde_json::from_slice::<Value>(&bytes)
                .into_iter()
                .collect()
        };
        match messages {
            m if status.is_success() || !Vec::is_empty(&m) && is_jsonrpc(&m) => Ok(m),
            _ => Err(error_of(status, &bytes).into()),
        }
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        git_token: Option<&str>,
    ) -> Result<T> {
        let answer = self
            .send(Request {
                method,
                url: format!("{}{path}", self.base),
                token: &self.token,
                content_type: body.as_ref().map(|_| "application/json"),
                accept: None,
                git_token: git_token.map(|t| (GIT_TOKEN_HEADER, t)),
                body: body.map(|b| b.to_string().into_bytes()),
            })
            .await?;
        let Answer {
            status,
            body: bytes,
            ..
        } = answer;
        if !status.is_success() {
            return Err(error_of(status, &bytes).into());
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            CommandError::new(ErrorKind::Internal, format!("unexpected answer: {e}")).into()
        })
    }
}

impl Server {
    /// One exchange; a server that does not answer is `unavailable` (the URL, which
    /// the caller set, is left out of the message).
    async fn send(&self, req: Request<'_>) -> Result<Answer> {
        self.http.send(req).await.map_err(|f| match f {
            Failure::Send(why) => unavailable(format!(
                "the grove server at GROVE_URL did not answer: {why}"
            )),
            Failure::Read(why) => unavailable(format!("reading the answer: {why}")),
        })
    }
}

fn is_jsonrpc(messages: &[Value]) -> bool {
    messages.iter().all(|m| m.get("jsonrpc").is_some())
}

/// The typed error of an API error answer (`{"error": {"kind", "message", "paths"}}`);
/// an answer without one is classified by its status.
fn error_of(status: StatusCode, body: &[u8]) -> CommandError {
    let envelope: Option<Value> = serde_json::from_slice(body).ok();
    let error = envelope.as_ref().and_then(|v| v.get("error"));
    let kind = error
        .and_then(|e| e.get("kind"))
        .and_then(|k| serde_json::from_value::<ErrorKind>(k.clone()).ok())
        .unwrap_or(match status {
            StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => ErrorKind::InvalidInput,
            StatusCode::NOT_FOUND => ErrorKind::NotFound,
            StatusCode::CONFLICT => ErrorKind::Conflict,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ErrorKind::AuthFailed,
            StatusCode::UNPROCESSABLE_ENTITY => ErrorKind::Rejected,
            StatusCode::TOO_MANY_REQUESTS => ErrorKind::ResourceLimit,
            StatusCode::SERVICE_UNAVAILABLE => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        });
    let message = error
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| format!("the server answered {status}"));
    let mut err = CommandError::new(kind, message);
    if let Some(paths) = error.and_then(|e| e.get("paths")).and_then(Value::as_array) {
        err.paths = paths
            .iter()
            .filter_map(|p| p.as_str().map(str::to_owned))
            .collect();
    }
    err
}

fn invalid(msg: &str) -> anyhow::Error {
    CommandError::new(ErrorKind::InvalidInput, msg).into()
}

fn unavailable(msg: String) -> anyhow::Error {
    CommandError::new(ErrorKind::Unavailable, msg).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    fn kind_of(r: Result<Option<Server>>) -> ErrorKind {
        let err = r.err().expect("refused");
        err.downcast_ref::<CommandError>().expect("typed").kind
    }

    #[test]
    fn without_grove_url_the_cli_uses_the_database() {
        assert!(Server::from_vars(vars(&[])).unwrap().is_none());
        assert!(Server::from_vars(vars(&[("GROVE_URL", " ")]))
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_url_with_credentials_a_query_or_another_scheme_or_no_token_is_refused() {
        for url in [
            "http://user:pw@127.0.0.1:1",
            "http://127.0.0.1:1/?token=x",
            "file:///etc/passwd",
            "not a url",
        ] {
            let got = Server::from_vars(vars(&[("GROVE_URL", url), ("GROVE_TOKEN", "t")]));
            assert_eq!(kind_of(got), ErrorKind::InvalidInput, "{url}");
        }
        let got = Server::from_vars(vars(&[("GROVE_URL", "http://127.0.0.1:1")]));
        assert_eq!(kind_of(got), ErrorKind::InvalidInput);
    }

    #[test]
    fn error_answers_keep_their_kind_and_paths_and_bare_statuses_are_classified() {
        let body = br#"{"error":{"kind":"conflict","message":"m","paths":["a","b"]}}"#;
        let e = error_of(StatusCode::CONFLICT, body);
        assert_eq!((e.kind, e.message.as_str()), (ErrorKind::Conflict, "m"));
        assert_eq!(e.paths, ["a", "b"]);
        assert_eq!(
            error_of(StatusCode::NOT_FOUND, b"").kind,
            ErrorKind::NotFound
        );
        assert_eq!(
            error_of(StatusCode::BAD_GATEWAY, b"<html>").kind,
            ErrorKind::Internal
        );
    }
}
