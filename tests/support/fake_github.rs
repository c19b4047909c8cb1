//! A fake GitHub for tests, on 127.0.0.1 port 0: the REST endpoints grove uses, and git's
//! smart HTTP for the repositories it serves, so one host is both the API and the remote
//! (as a GitHub Enterprise Server is).
//!
//! Written from GitHub's published REST reference, API version 2022-11-28 ("Create a pull
//! request", "Get a pull request", "Create an issue comment", "Rate limits for the REST
//! API", "Troubleshooting the REST API"). It models:
//!
//! - `/api/v3/repos/{owner}/{repo}/pulls` (POST), `.../pulls/{number}` (GET),
//!   `.../issues/{number}/comments` (POST), with the documented status codes (201, 200,
//!   401, 404, 422, 403/429 for rate limits) and JSON shapes (the fields clients read;
//!   not every field GitHub sends).
//! - Authentication: `Authorization: Bearer <token>` or `token <token>`. A wrong token is
//!   401 "Bad credentials"; no token on a write is 401 "Requires authentication"; reads
//!   need none (the repositories are public).
//! - `X-GitHub-Api-Version`: any value but `2022-11-28` is a 400.
//! - Validation (422 "Validation Failed" with an `errors` array): a missing `title`,
//!   `head` or `base`; a `head` or `base` that is not a branch of the served bare
//!   repository; no commits between them; an open pull request for the same head and
//!   base ("A pull request already exists for OWNER:BRANCH."). Numbers are per
//!   repository, from 1, shared with issues.
//! - Rate limits on demand ([`FakeGitHub::fail_next`]): a primary limit (403,
//!   `x-ratelimit-remaining: 0`, `x-ratelimit-reset`) or a secondary one (403 with
//!   `retry-after`). Every other answer carries `x-ratelimit-*` with requests left.
//! - git over smart HTTP through the real `git http-backend`: clones and fetches are
//!   anonymous; a push needs HTTP basic auth whose password is the token (what git
//!   sends for `x-access-token:<token>`).
//!
//! It does not model: reviews, merging, closing, labels, forks and cross-repository
//! heads (`user:branch` of another owner), `maintainer_can_modify`, issues that are not
//! pull requests, pagination, conditional requests (ETag/304), redirects for renamed
//! repositories, GraphQL, permissions finer than "has the token", or the content of
//! `documentation_url` links.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

/// The API version this fake follows.
pub const API_VERSION: &str = "2022-11-28";
const DOCS: &str = "https://docs.github.com/rest";

/// A request the fake received on its REST API.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
    pub accept: Option<String>,
    pub api_version: Option<String>,
    pub user_agent: Option<String>,
    pub body: Value,
}

/// A failure to answer the next REST request with.
#[derive(Debug, Clone, Copy)]
pub enum Failure {
    /// 403, `x-ratelimit-remaining: 0`, reset in `reset_in` seconds.
    PrimaryRateLimit { reset_in: u64 },
    /// 403 with `retry-after`.
    SecondaryRateLimit { retry_after: u64 },
    /// 502, as GitHub answers when it is in trouble.
    BadGateway,
}

#[derive(Default)]
struct Inner {
    token: String,
    repos: HashMap<String, PathBuf>,
    numbers: HashMap<String, u64>,
    pulls: HashMap<(String, u64), Value>,
    comments: Vec<Value>,
    next_comment: u64,
    requests: Vec<Recorded>,
    fail_next: Vec<Failure>,
}

type Shared = Arc<Mutex<Inner>>;

/// The running fake; stops when dropped.
pub struct FakeGitHub {
    pub addr: SocketAddr,
    inner: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeGitHub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeGitHub {
    /// Starts the fake; `token` is the one token it accepts.
    pub async fn start(token: &str) -> Self {
        let inner: Shared = Arc::new(Mutex::new(Inner {
            token: token.to_string(),
            next_comment: 9000,
            ..Default::default()
        }));
        let app = Router::new()
            .route("/api/v3/repos/{owner}/{repo}/pulls", post(create_pull))
            .route("/api/v3/repos/{owner}/{repo}/pulls/{number}", get(get_pull))
            .route(
                "/api/v3/repos/{owner}/{repo}/issues/{number}/comments",
                post(create_comment),
            )
            .route("/{owner}/{repo}/info/refs", get(git_http))
            .route("/{owner}/{repo}/git-upload-pack", post(git_http))
            .route("/{owner}/{repo}/git-receive-pack", post(git_http))
            .fallback(|| async { not_found() })
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, inner, task }
    }

    /// Serves the bare repository at `bare` as `owner/name`.
    pub fn add_repo(&self, full_name: &str, bare: &FsPath) {
        self.inner
            .lock()
            .unwrap()
            .repos
            .insert(full_name.to_string(), bare.to_path_buf());
    }

    /// The REST API base (`GROVE_GITHUB_API_URL`).
    pub fn api_url(&self) -> String {
        format!("http://{}/api/v3", self.addr)
    }

    /// The web origin (repository and pull request pages, git remotes).
    pub fn web_origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The git remote URL of a served repository.
    pub fn repo_url(&self, full_name: &str) -> String {
        format!("http://{}/{full_name}.git", self.addr)
    }

    /// Answers the next REST request with `failure` (queued in order).
    pub fn fail_next(&self, failure: Failure) {
        self.inner.lock().unwrap().fail_next.push(failure);
    }

    /// Every REST request received, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// The pull requests made, as the JSON the API returns, by number.
    pub fn pulls(&self, full_name: &str) -> Vec<Value> {
        let inner = self.inner.lock().unwrap();
        let mut out: Vec<(u64, Value)> = inner
            .pulls
            .iter()
            .filter(|((r, _), _)| r == full_name)
            .map(|((_, n), v)| (*n, v.clone()))
            .collect();
        out.sort_by_key(|(n, _)| *n);
        out.into_iter().map(|(_, v)| v).collect()
    }

    /// The comments made, in order.
    pub fn comments(&self) -> Vec<Value> {
        self.inner.lock().unwrap().comments.clone()
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

fn rate_headers(resp: &mut Response, remaining: u64, reset_in: u64) {
    let reset = chrono::Utc::now().timestamp() as u64 + reset_in;
    let h = resp.headers_mut();
    h.insert("x-ratelimit-limit", HeaderValue::from_static("5000"));
    h.insert("x-ratelimit-remaining", remaining.into());
    h.insert("x-ratelimit-used", (5000 - remaining).into());
    h.insert("x-ratelimit-reset", reset.into());
    h.insert("x-ratelimit-resource", HeaderValue::from_static("core"));
}

fn answer(status: StatusCode, body: Value) -> Response {
    let mut resp = (status, axum::Json(body)).into_response();
    resp.headers_mut().insert(
        "x-github-api-version-selected",
        HeaderValue::from_static(API_VERSION),
    );
    rate_headers(&mut resp, 4999, 3600);
    resp
}

fn message(status: StatusCode, msg: &str) -> Response {
    answer(
        status,
        json!({"message": msg, "documentation_url": DOCS, "status": status.as_u16().to_string()}),
    )
}

fn not_found() -> Response {
    message(StatusCode::NOT_FOUND, "Not Found")
}

fn validation(errors: Value) -> Response {
    answer(
        StatusCode::UNPROCESSABLE_ENTITY,
        json!({"message": "Validation Failed", "errors": errors, "documentation_url": DOCS, "status": "422"}),
    )
}

/// What every REST request goes through: record it, check the version, the injected
/// failures and the credentials. `None` to go on, or the answer to give.
fn gate(
    inner: &Shared,
    method: &str,
    path: String,
    headers: &HeaderMap,
    body: Value,
    write: bool,
) -> Option<Response> {
    let mut g = inner.lock().unwrap();
    let authorization = header(headers, "authorization");
    g.requests.push(Recorded {
        method: method.to_string(),
        path,
        authorization: authorization.clone(),
        accept: header(headers, "accept"),
        api_version: header(headers, "x-github-api-version"),
        user_agent: header(headers, "user-agent"),
        body,
    });
    if let Some(v) = header(headers, "x-github-api-version") {
        if v != API_VERSION {
            return Some(message(
                StatusCode::BAD_REQUEST,
                &format!("API version {v} is not supported."),
            ));
        }
    }
    if !g.fail_next.is_empty() {
        let failure = g.fail_next.remove(0);
        return Some(match failure {
            Failure::PrimaryRateLimit { reset_in } => {
                let mut resp = message(
                    StatusCode::FORBIDDEN,
                    "API rate limit exceeded for user ID 1. If you reach out to GitHub Support for help, please include the request ID.",
                );
                rate_headers(&mut resp, 0, reset_in);
                resp
            }
            Failure::SecondaryRateLimit { retry_after } => {
                let mut resp = message(
                    StatusCode::FORBIDDEN,
                    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
                );
                resp.headers_mut().insert("retry-after", retry_after.into());
                resp
            }
            Failure::BadGateway => message(StatusCode::BAD_GATEWAY, "Server Error"),
        });
    }
    let token = authorization.as_deref().and_then(|a| {
        a.strip_prefix("Bearer ")
            .or_else(|| a.strip_prefix("token "))
            .map(str::to_string)
    });
    match token {
        Some(t) if t == g.token => None,
        Some(_) => Some(message(StatusCode::UNAUTHORIZED, "Bad credentials")),
        None if authorization.is_some() => {
            Some(message(StatusCode::UNAUTHORIZED, "Bad credentials"))
        }
        None if write => Some(message(StatusCode::UNAUTHORIZED, "Requires authentication")),
        None => None,
    }
}

/// The commit a branch of a bare repository points at, if it is a branch.
fn branch_sha(bare: &FsPath, branch: &str) -> Option<String> {
    if branch.is_empty() || branch.starts_with('-') {
        return None;
    }
    let out = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(bare)
        .args(["-c", "safe.directory=*", "rev-parse", "--verify", "--quiet"])
        .arg(format!("refs/heads/{branch}^{{commit}}"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn user() -> Value {
    json!({"login": "grove-test", "id": 1, "type": "User", "site_admin": false})
}

async fn create_pull(
    State(inner): State<Shared>,
    Path((owner, repo)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/repos/{owner}/{repo}/pulls");
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    if let Some(resp) = gate(
        &inner,
        "POST",
        path,
        &headers,
        parsed.clone().unwrap_or(Value::Null),
        true,
    ) {
        return resp;
    }
    let full = format!("{owner}/{repo}");
    let Some(bare) = inner.lock().unwrap().repos.get(&full).cloned() else {
        return not_found();
    };
    let Some(req) = parsed.filter(Value::is_object) else {
        return message(StatusCode::BAD_REQUEST, "Problems parsing JSON");
    };
    let field = |name: &str| req.get(name).and_then(Value::as_str).map(str::to_string);
    let mut missing = Vec::new();
    for name in ["title", "head", "base"] {
        if field(name).is_none_or(|v| v.is_empty()) {
            missing
                .push(json!({"resource": "PullRequest", "field": name, "code": "missing_field"}));
        }
    }
    if !missing.is_empty() {
        return validation(Value::Array(missing));
    }
    let (title, head, base) = (
        field("title").unwrap(),
        field("head").unwrap(),
        field("base").unwrap(),
    );
    // `owner:branch` names a head in this repository too.
    let head = head
        .strip_prefix(&format!("{owner}:"))
        .map(str::to_string)
        .unwrap_or(head);
    let mut invalid = Vec::new();
    let head_sha = branch_sha(&bare, &head);
    let base_sha = branch_sha(&bare, &base);
    if head_sha.is_none() {
        invalid.push(json!({"resource": "PullRequest", "field": "head", "code": "invalid"}));
    }
    if base_sha.is_none() {
        invalid.push(json!({"resource": "PullRequest", "field": "base", "code": "invalid"}));
    }
    if !invalid.is_empty() {
        return validation(Value::Array(invalid));
    }
    if head_sha == base_sha {
        return validation(json!([{"resource": "PullRequest", "code": "custom",
            "message": format!("No commits between {base} and {head}")}]));
    }
    let mut g = inner.lock().unwrap();
    let duplicate = g.pulls.iter().any(|((r, _), p)| {
        r == &full && p["state"] == "open" && p["head"]["ref"] == head && p["base"]["ref"] == base
    });
    if duplicate {
        return validation(json!([{"resource": "PullRequest", "code": "custom",
            "message": format!("A pull request already exists for {owner}:{head}.")}]));
    }
    let number = {
        let n = g.numbers.entry(full.clone()).or_insert(0);
        *n += 1;
        *n
    };
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let host = header(&headers, "host").unwrap_or_default();
    let api = format!("http://{host}/api/v3/repos/{full}");
    let web = format!("http://{host}/{full}");
    let repo_json = json!({"id": 1, "name": repo, "full_name": full, "private": false,
        "owner": {"login": owner, "type": "User"}, "html_url": web});
    let pull = json!({
        "url": format!("{api}/pulls/{number}"),
        "id": 1000 + number,
        "node_id": format!("PR_fake{number}"),
        "html_url": format!("{web}/pull/{number}"),
        "issue_url": format!("{api}/issues/{number}"),
        "number": number,
        "state": "open",
        "locked": false,
        "title": title,
        "user": user(),
        "body": req.get("body").cloned().unwrap_or(Value::Null),
        "created_at": now,
        "updated_at": now,
        "closed_at": null,
        "merged_at": null,
        "draft": req.get("draft").and_then(Value::as_bool).unwrap_or(false),
        "head": {"label": format!("{owner}:{head}"), "ref": head, "sha": head_sha, "user": user(), "repo": repo_json},
        "base": {"label": format!("{owner}:{base}"), "ref": base, "sha": base_sha, "user": user(), "repo": repo_json},
        "author_association": "OWNER",
        "merged": false,
        "mergeable": null,
        "comments": 0,
        "maintainer_can_modify": false,
    });
    g.pulls.insert((full, number), pull.clone());
    let mut resp = answer(StatusCode::CREATED, pull);
    if let Ok(v) = HeaderValue::from_str(&format!("{api}/pulls/{number}")) {
        resp.headers_mut().insert("location", v);
    }
    resp
}

async fn get_pull(
    State(inner): State<Shared>,
    Path((owner, repo, number)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let path = format!("/repos/{owner}/{repo}/pulls/{number}");
    if let Some(resp) = gate(&inner, "GET", path, &headers, Value::Null, false) {
        return resp;
    }
    let Ok(number) = number.parse::<u64>() else {
        return not_found();
    };
    let g = inner.lock().unwrap();
    match g.pulls.get(&(format!("{owner}/{repo}"), number)) {
        Some(p) => answer(StatusCode::OK, p.clone()),
        None => not_found(),
    }
}

async fn create_comment(
    State(inner): State<Shared>,
    Path((owner, repo, number)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/repos/{owner}/{repo}/issues/{number}/comments");
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    if let Some(resp) = gate(
        &inner,
        "POST",
        path,
        &headers,
        parsed.clone().unwrap_or(Value::Null),
        true,
    ) {
        return resp;
    }
    let full = format!("{owner}/{repo}");
    let Ok(number) = number.parse::<u64>() else {
        return not_found();
    };
    let mut g = inner.lock().unwrap();
    if !g.repos.contains_key(&full) || !g.pulls.contains_key(&(full.clone(), number)) {
        return not_found();
    }
    let Some(req) = parsed.filter(Value::is_object) else {
        return message(StatusCode::BAD_REQUEST, "Problems parsing JSON");
    };
    let Some(text) = req
        .get("body")
        .and_then(Value::as_str)
        .filter(|b| !b.is_empty())
    else {
        return validation(
            json!([{"resource": "IssueComment", "field": "body", "code": "missing_field"}]),
        );
    };
    g.next_comment += 1;
    let id = g.next_comment;
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let host = header(&headers, "host").unwrap_or_default();
    let api = format!("http://{host}/api/v3/repos/{full}");
    let comment = json!({
        "id": id,
        "node_id": format!("IC_fake{id}"),
        "url": format!("{api}/issues/comments/{id}"),
        "html_url": format!("http://{host}/{full}/pull/{number}#issuecomment-{id}"),
        "body": text,
        "user": user(),
        "created_at": now,
        "updated_at": now,
        "issue_url": format!("{api}/issues/{number}"),
        "author_association": "OWNER",
    });
    g.comments.push(comment.clone());
    answer(StatusCode::CREATED, comment)
}

/// git's smart HTTP through `git http-backend` (CGI). Pushes need basic auth with the
/// token as password.
async fn git_http(
    State(inner): State<Shared>,
    method: Method,
    uri: axum::http::Uri,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let mut parts = path.trim_start_matches('/').splitn(3, '/');
    let (owner, repo, rest) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    let full = format!("{owner}/{}", repo.strip_suffix(".git").unwrap_or(repo));
    let (bare, token) = {
        let g = inner.lock().unwrap();
        (g.repos.get(&full).cloned(), g.token.clone())
    };
    let Some(bare) = bare else {
        return (StatusCode::NOT_FOUND, "Repository not found.\n").into_response();
    };
    let query = query.unwrap_or_default();
    let push = rest == "git-receive-pack" || query.contains("service=git-receive-pack");
    if push {
        use base64::Engine;
        let ok = header(&headers, "authorization")
            .and_then(|a| a.strip_prefix("Basic ").map(str::to_string))
            .and_then(|b| {
                base64::engine::general_purpose::STANDARD
                    .decode(b.trim())
                    .ok()
            })
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|pair| pair.split_once(':').map(|(_, p)| p == token))
            .unwrap_or(false);
        if !ok {
            let mut resp =
                (StatusCode::UNAUTHORIZED, "Invalid username or token.\n").into_response();
            resp.headers_mut().insert(
                "www-authenticate",
                HeaderValue::from_static("Basic realm=\"GitHub\""),
            );
            return resp;
        }
    }
    let root = bare.parent().unwrap().to_path_buf();
    let name = bare.file_name().unwrap().to_string_lossy().into_owned();
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", &root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "safe.directory")
        .env("GIT_CONFIG_VALUE_0", "*")
        .env("HOME", &root)
        .env("PATH_INFO", format!("/{name}/{rest}"))
        .env("REQUEST_METHOD", method.as_str())
        .env("QUERY_STRING", &query)
        .env("REMOTE_ADDR", "127.0.0.1")
        .env("CONTENT_LENGTH", body.len().to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    if push {
        cmd.env("REMOTE_USER", "x-access-token");
    }
    if let Some(ct) = header(&headers, "content-type") {
        cmd.env("CONTENT_TYPE", ct);
    }
    if let Some(enc) = header(&headers, "content-encoding") {
        cmd.env("HTTP_CONTENT_ENCODING", enc);
    }
    if let Some(proto) = header(&headers, "git-protocol") {
        cmd.env("HTTP_GIT_PROTOCOL", proto);
    }
    let Ok(mut child) = cmd.spawn() else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "git http-backend failed\n",
        )
            .into_response();
    };
    let mut stdin = child.stdin.take().unwrap();
    let writer = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let _ = stdin.write_all(&body).await;
    });
    let Ok(out) = child.wait_with_output().await else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "git http-backend failed\n",
        )
            .into_response();
    };
    let _ = writer.await;
    cgi_response(&out.stdout)
}

/// A CGI answer (headers, a blank line, the body) as an HTTP response.
fn cgi_response(raw: &[u8]) -> Response {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4))
        .or_else(|| {
            raw.windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| (i, i + 2))
        });
    let Some((end, start)) = split else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "bad CGI answer\n").into_response();
    };
    let mut status = StatusCode::OK;
    let mut builder = Response::builder();
    for line in String::from_utf8_lossy(&raw[..end]).lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        if k.eq_ignore_ascii_case("status") {
            if let Some(code) = v.split_whitespace().next().and_then(|c| c.parse().ok()) {
                status = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
            }
        } else {
            builder = builder.header(k.trim(), v);
        }
    }
    builder
        .status(status)
        .body(Body::from(raw[start..].to_vec()))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
