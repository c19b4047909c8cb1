//! A fake Daytona on loopback (axum, port 0), written from Daytona's published API:
//! the control plane as in `apps/api` (`POST /sandbox`, `GET /sandbox/paginated`,
//! `GET|DELETE /sandbox/{id}`, `POST /sandbox/{id}/start|stop`,
//! `GET /sandbox/{id}/ports/{port}/preview-url`) and the daemon's
//! toolbox swagger 2.0 reached through the API's proxy `/toolbox/{id}/toolbox/...`
//! (process sessions, `/files/upload|download`, `/git/clone|branches|checkout`,
//! `/user-home-dir`), session logs in their JSON form (SDK >= 0.167).
//!
//! Faithful in: `Authorization: Bearer` checked on every route (401 otherwise), error
//! bodies `{statusCode, message, error}`, 404 for unknown sandboxes, 403 with a quota
//! message when the CPU quota is exceeded, `createdAt` (RFC 3339), pagination (`page`, `limit`, `labels` as
//! JSON; `{items, total, page, totalPages}`), and asynchronous state changes: a
//! sandbox is `creating` / `starting` / `stopping` for [`TRANSITION`] before it is
//! `started` / `stopped`. Toolbox calls to a sandbox that is not started answer 400
//! "Sandbox is not started". A switch ([`FakeDaytona::set_validation_quirk`]) makes
//! git clone/branch/checkout answer 400 with an empty validation message although they
//! took effect, as Daytona sometimes does.
//!
//! **Commands run for real on this machine**: a session command is `sh -c <command>`
//! spawned with a cleared environment (`PATH`, `HOME` only), its own process group,
//! stdout and stderr written to files as the daemon does; deleting the session or
//! stopping the sandbox kills the group. A sandbox's home is a temporary directory,
//! but paths are host paths: the fake does not isolate sandboxes from the host or
//! from each other. Git operations run the host's `git`. Not modelled: regions,
//! snapshots and images (any name is accepted), volumes, archiving and
//! auto-stop timers (tests stop a sandbox behind grove's back instead), resource
//! accounting beyond the CPU quota, websockets, the plain-text logs of old SDKs,
//! input to a running session command and sandbox snapshots (`POST
//! /sandbox/{id}/snapshot`), which the adapter does not use (ADR 15), and a slow
//! create only as a fixed delay ([`FakeDaytona::set_create_delay`]).

// Handlers return ready responses as errors; boxing them would only add noise here.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Multipart, Path, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

/// How long a sandbox stays in a transitional state.
pub const TRANSITION: Duration = Duration::from_millis(300);

pub struct FakeDaytona {
    pub url: String,
    pub key: String,
    state: Arc<FakeState>,
    _root: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeDaytona {
    fn drop(&mut self) {
        let mut sbs = self.state.sandboxes.lock().unwrap();
        for sb in sbs.values_mut() {
            sb.kill_all();
        }
        self.task.abort();
    }
}

struct FakeState {
    key: String,
    root: PathBuf,
    quirk: AtomicBool,
    cpu_quota: u32,
    seq: AtomicU64,
    sandboxes: Mutex<BTreeMap<String, FakeSandbox>>,
    creates: AtomicU64,
    /// Every clone request's password, to show where a token went.
    clone_passwords: Mutex<Vec<String>>,
    /// How long a create takes before the sandbox exists (a slow control plane).
    create_delay: Mutex<Duration>,
}

struct FakeSandbox {
    id: String,
    seq: u64,
    state: &'static str,
    pending: Option<(Instant, &'static str)>,
    labels: BTreeMap<String, String>,
    body: Value,
    created_at: String,
    home: PathBuf,
    sessions: HashMap<String, HashMap<String, FakeCommand>>,
}

struct FakeCommand {
    dir: PathBuf,
    pgid: i32,
    exit: Arc<Mutex<Option<i32>>>,
}

impl FakeSandbox {
    fn settle(&mut self) {
        if let Some((at, next)) = self.pending {
            if Instant::now() >= at {
                self.state = next;
                self.pending = None;
            }
        }
    }

    fn kill_all(&mut self) {
        for (_, cmds) in self.sessions.drain() {
            for c in cmds.values() {
                c.kill();
            }
        }
    }

    fn json(&self) -> Value {
        let mut v = json!({
            "id": self.id,
            "organizationId": "fake-org",
            "user": "daytona",
            "state": self.state,
            "desiredState": match self.pending { Some((_, s)) => s, None => self.state },
            "labels": self.labels,
            "createdAt": self.created_at,
            "cpu": self.body.get("cpu").cloned().unwrap_or(json!(1)),
            "memory": self.body.get("memory").cloned().unwrap_or(json!(1)),
            "disk": self.body.get("disk").cloned().unwrap_or(json!(3)),
            "autoStopInterval": self.body.get("autoStopInterval").cloned().unwrap_or(json!(15)),
            "autoArchiveInterval": self.body.get("autoArchiveInterval").cloned().unwrap_or(json!(10080)),
            "networkBlockAll": self.body.get("networkBlockAll").cloned().unwrap_or(json!(false)),
            "snapshot": self.body.get("snapshot").cloned().unwrap_or(json!("daytonaio/sandbox:0.5.0-slim")),
        });
        if let Some(a) = self.body.get("networkAllowList") {
            v["networkAllowList"] = a.clone();
        }
        v
    }
}

impl FakeCommand {
    fn kill(&self) {
        if self.exit.lock().unwrap().is_none() {
            // SAFETY: signalling a process group this fake created.
            unsafe {
                libc::kill(-self.pgid, libc::SIGKILL);
            }
        }
    }
}

fn err(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({
            "statusCode": status.as_u16(),
            "message": message.into(),
            "error": status.canonical_reason().unwrap_or(""),
        })),
    )
        .into_response()
}

type S = State<Arc<FakeState>>;

impl FakeDaytona {
    pub async fn start() -> Self {
        Self::start_with_quota(64).await
    }

    pub async fn start_with_quota(cpu_quota: u32) -> Self {
        let root = tempfile::Builder::new()
            .prefix("fake-daytona-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        let key = format!("dtn_test_{}", uuid_like());
        let state = Arc::new(FakeState {
            key: key.clone(),
            root: root.path().to_path_buf(),
            quirk: AtomicBool::new(false),
            cpu_quota,
            seq: AtomicU64::new(0),
            sandboxes: Mutex::new(BTreeMap::new()),
            creates: AtomicU64::new(0),
            clone_passwords: Mutex::new(Vec::new()),
            create_delay: Mutex::new(Duration::ZERO),
        });
        let tb = "/toolbox/{id}/toolbox";
        let app = Router::new()
            .route("/sandbox", post(create).get(list))
            .route("/sandbox/paginated", get(list_paginated))
            .route("/sandbox/{id}", get(get_sandbox).delete(delete_sandbox))
            .route("/sandbox/{id}/start", post(start_sandbox))
            .route("/sandbox/{id}/stop", post(stop_sandbox))
            .route("/sandbox/{id}/ports/{port}/preview-url", get(preview_url))
            .route(&format!("{tb}/user-home-dir"), get(home_dir))
            .route(&format!("{tb}/process/session"), post(create_session))
            .route(
                &format!("{tb}/process/session/{{sid}}"),
                axum::routing::delete(delete_session),
            )
            .route(
                &format!("{tb}/process/session/{{sid}}/exec"),
                post(session_exec),
            )
            .route(
                &format!("{tb}/process/session/{{sid}}/command/{{cid}}"),
                get(command),
            )
            .route(
                &format!("{tb}/process/session/{{sid}}/command/{{cid}}/logs"),
                get(logs),
            )
            .route(&format!("{tb}/files/upload"), post(upload))
            .route(&format!("{tb}/files/download"), get(download))
            .route(&format!("{tb}/git/clone"), post(git_clone))
            .route(
                &format!("{tb}/git/branches"),
                post(git_branch).get(git_branches),
            )
            .route(&format!("{tb}/git/checkout"), post(git_checkout))
            .layer(axum::extract::DefaultBodyLimit::max(64 * 1024 * 1024))
            .layer(axum::middleware::from_fn_with_state(state.clone(), auth))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            url,
            key,
            state,
            _root: root,
            task,
        }
    }

    /// Every create waits this long before the sandbox exists, so concurrent creates
    /// overlap.
    pub fn set_create_delay(&self, d: Duration) {
        *self.state.create_delay.lock().unwrap() = d;
    }

    /// Git clone/branch/checkout succeed but answer 400 with an empty validation message.
    pub fn set_validation_quirk(&self, on: bool) {
        self.state.quirk.store(on, Ordering::SeqCst);
    }

    /// `(id, state, labels)` of every sandbox, settled.
    pub fn sandboxes(&self) -> Vec<(String, String, BTreeMap<String, String>)> {
        let mut sbs = self.state.sandboxes.lock().unwrap();
        sbs.values_mut()
            .map(|s| {
                s.settle();
                (s.id.clone(), s.state.to_string(), s.labels.clone())
            })
            .collect()
    }

    /// The create body a sandbox was made with.
    pub fn create_body(&self, id: &str) -> Value {
        self.state.sandboxes.lock().unwrap()[id].body.clone()
    }

    pub fn creates(&self) -> u64 {
        self.state.creates.load(Ordering::SeqCst)
    }

    pub fn clone_passwords(&self) -> Vec<String> {
        self.state.clone_passwords.lock().unwrap().clone()
    }

    /// Stops a sandbox as Daytona's auto-stop would: processes die, the disk stays.
    pub fn stop_behind_the_back(&self, id: &str) {
        let mut sbs = self.state.sandboxes.lock().unwrap();
        let sb = sbs.get_mut(id).expect("sandbox");
        sb.kill_all();
        sb.state = "stopped";
        sb.pending = None;
    }

    /// Deletes a sandbox as someone else (or the auto-delete timer) would.
    pub fn delete_behind_the_back(&self, id: &str) {
        let mut sbs = self.state.sandboxes.lock().unwrap();
        if let Some(mut sb) = sbs.remove(id) {
            sb.kill_all();
        }
    }
}

fn uuid_like() -> String {
    format!(
        "{:x}{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

async fn auth(State(st): S, req: Request, next: Next) -> Response {
    let ok = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|k| k == st.key);
    if !ok {
        return err(StatusCode::UNAUTHORIZED, "Unauthorized");
    }
    next.run(req).await
}

async fn create(State(st): S, Json(body): Json<Value>) -> Response {
    let delay = *st.create_delay.lock().unwrap();
    tokio::time::sleep(delay).await;
    let cpu = body.get("cpu").and_then(Value::as_u64).unwrap_or(1);
    let used: u64 = {
        let sbs = st.sandboxes.lock().unwrap();
        sbs.values()
            .filter(|s| s.state != "stopped")
            .map(|s| s.body.get("cpu").and_then(Value::as_u64).unwrap_or(1))
            .sum()
    };
    if used + cpu > st.cpu_quota as u64 {
        return err(
            StatusCode::FORBIDDEN,
            format!(
                "Total CPU quota exceeded. Maximum allowed: {}",
                st.cpu_quota
            ),
        );
    }
    let labels: BTreeMap<String, String> = match body.get("labels") {
        Some(l) => match serde_json::from_value(l.clone()) {
            Ok(l) => l,
            Err(_) => {
                return err(
                    StatusCode::BAD_REQUEST,
                    "labels must be an object of strings",
                )
            }
        },
        None => BTreeMap::new(),
    };
    let seq = st.seq.fetch_add(1, Ordering::SeqCst);
    let id = format!("{:08x}-fake-{seq:04}", std::process::id());
    let home = st.root.join(&id).join("home");
    std::fs::create_dir_all(&home).unwrap();
    let sb = FakeSandbox {
        id: id.clone(),
        seq,
        state: "creating",
        pending: Some((Instant::now() + TRANSITION, "started")),
        labels,
        body,
        created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        home,
        sessions: HashMap::new(),
    };
    let v = sb.json();
    st.sandboxes.lock().unwrap().insert(id, sb);
    st.creates.fetch_add(1, Ordering::SeqCst);
    Json(v).into_response()
}

#[derive(Deserialize)]
struct ListQuery {
    labels: Option<String>,
    page: Option<usize>,
    limit: Option<usize>,
}

fn matching(st: &FakeState, labels: Option<&str>) -> Result<Vec<Value>, Response> {
    let want: BTreeMap<String, String> = match labels {
        Some(l) => serde_json::from_str(l)
            .map_err(|_| err(StatusCode::BAD_REQUEST, "labels must be a JSON object"))?,
        None => BTreeMap::new(),
    };
    let mut sbs = st.sandboxes.lock().unwrap();
    let mut found: Vec<&mut FakeSandbox> = sbs
        .values_mut()
        .filter(|s| want.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .collect();
    found.sort_by_key(|s| s.seq);
    Ok(found
        .into_iter()
        .map(|s| {
            s.settle();
            s.json()
        })
        .collect())
}

async fn list(State(st): S, Query(q): Query<ListQuery>) -> Response {
    match matching(&st, q.labels.as_deref()) {
        Ok(v) => Json(v).into_response(),
        Err(r) => r,
    }
}

async fn list_paginated(State(st): S, Query(q): Query<ListQuery>) -> Response {
    let page = q.page.unwrap_or(1);
    let limit = q.limit.unwrap_or(10);
    if page == 0 || limit == 0 || limit > 200 {
        return err(
            StatusCode::BAD_REQUEST,
            "page must be >= 1 and limit in 1..=200",
        );
    }
    let all = match matching(&st, q.labels.as_deref()) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let total = all.len();
    let items: Vec<Value> = all
        .into_iter()
        .skip((page - 1) * limit)
        .take(limit)
        .collect();
    Json(json!({
        "items": items,
        "total": total,
        "page": page,
        "totalPages": total.div_ceil(limit),
    }))
    .into_response()
}

fn with_sandbox<T>(
    st: &FakeState,
    id: &str,
    f: impl FnOnce(&mut FakeSandbox) -> T,
) -> Result<T, Response> {
    let mut sbs = st.sandboxes.lock().unwrap();
    match sbs.get_mut(id) {
        Some(sb) => {
            sb.settle();
            Ok(f(sb))
        }
        None => Err(err(
            StatusCode::NOT_FOUND,
            format!("Sandbox with ID or name {id} not found"),
        )),
    }
}

async fn get_sandbox(State(st): S, Path(id): Path<String>) -> Response {
    match with_sandbox(&st, &id, |sb| sb.json()) {
        Ok(v) => Json(v).into_response(),
        Err(r) => r,
    }
}

async fn delete_sandbox(State(st): S, Path(id): Path<String>) -> Response {
    let mut sbs = st.sandboxes.lock().unwrap();
    match sbs.remove(&id) {
        Some(mut sb) => {
            sb.kill_all();
            StatusCode::OK.into_response()
        }
        None => err(
            StatusCode::NOT_FOUND,
            format!("Sandbox with ID or name {id} not found"),
        ),
    }
}

async fn start_sandbox(State(st): S, Path(id): Path<String>) -> Response {
    let r = with_sandbox(&st, &id, |sb| match sb.state {
        "started" => Ok(sb.json()),
        "stopped" | "archived" => {
            sb.state = "starting";
            sb.pending = Some((Instant::now() + TRANSITION, "started"));
            Ok(sb.json())
        }
        other => Err(err(
            StatusCode::BAD_REQUEST,
            format!("Sandbox is not in a valid state to be started (state: {other})"),
        )),
    });
    match r {
        Ok(Ok(v)) => Json(v).into_response(),
        Ok(Err(r)) | Err(r) => r,
    }
}

async fn stop_sandbox(State(st): S, Path(id): Path<String>) -> Response {
    let r = with_sandbox(&st, &id, |sb| match sb.state {
        "started" => {
            sb.kill_all();
            sb.state = "stopping";
            sb.pending = Some((Instant::now() + TRANSITION, "stopped"));
            Ok(sb.json())
        }
        "stopped" => Ok(sb.json()),
        other => Err(err(
            StatusCode::BAD_REQUEST,
            format!("Sandbox is not in a valid state to be stopped (state: {other})"),
        )),
    });
    match r {
        Ok(Ok(v)) => Json(v).into_response(),
        Ok(Err(r)) | Err(r) => r,
    }
}

async fn preview_url(State(st): S, Path((id, port)): Path<(String, String)>) -> Response {
    let port: u16 = match port.parse() {
        Ok(p) if (3000..=9999).contains(&p) => p,
        _ => return err(StatusCode::BAD_REQUEST, "Invalid port: must be 3000-9999"),
    };
    match with_sandbox(&st, &id, |_| ()) {
        Ok(()) => Json(json!({
            "sandboxId": id,
            "url": format!("https://{port}-{id}.proxy.daytona.example"),
            "token": "preview-token-secret",
        }))
        .into_response(),
        Err(r) => r,
    }
}

/// The started sandbox's home, or the toolbox proxy's refusal.
fn started_home(st: &FakeState, id: &str) -> Result<PathBuf, Response> {
    with_sandbox(st, id, |sb| {
        if sb.state == "started" {
            Ok(sb.home.clone())
        } else {
            Err(err(StatusCode::BAD_REQUEST, "Sandbox is not started"))
        }
    })?
}

async fn home_dir(State(st): S, Path(id): Path<String>) -> Response {
    match started_home(&st, &id) {
        Ok(home) => Json(json!({ "dir": home })).into_response(),
        Err(r) => r,
    }
}

async fn create_session(State(st): S, Path(id): Path<String>, Json(body): Json<Value>) -> Response {
    if let Err(r) = started_home(&st, &id) {
        return r;
    }
    let Some(sid) = body
        .get("sessionId")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return err(StatusCode::BAD_REQUEST, "sessionId is required");
    };
    let r = with_sandbox(&st, &id, |sb| {
        if sb.sessions.contains_key(&sid) {
            return err(StatusCode::CONFLICT, "session already exists");
        }
        sb.sessions.insert(sid, HashMap::new());
        StatusCode::CREATED.into_response()
    });
    r.unwrap_or_else(|r| r)
}

async fn delete_session(State(st): S, Path((id, sid)): Path<(String, String)>) -> Response {
    if let Err(r) = started_home(&st, &id) {
        return r;
    }
    let r = with_sandbox(&st, &id, |sb| match sb.sessions.remove(&sid) {
        Some(cmds) => {
            for c in cmds.values() {
                c.kill();
            }
            StatusCode::NO_CONTENT.into_response()
        }
        None => err(StatusCode::NOT_FOUND, "session not found"),
    });
    r.unwrap_or_else(|r| r)
}

async fn session_exec(
    State(st): S,
    Path((id, sid)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Response {
    let home = match started_home(&st, &id) {
        Ok(h) => h,
        Err(r) => return r,
    };
    let command = body
        .get("command")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if command.trim().is_empty() {
        return err(StatusCode::BAD_REQUEST, "command cannot be empty");
    }
    let is_async = body
        .get("runAsync")
        .and_then(Value::as_bool)
        .unwrap_or(false)
        || body.get("async").and_then(Value::as_bool).unwrap_or(false);
    if !is_async {
        return err(
            StatusCode::BAD_REQUEST,
            "this fake implements runAsync session commands only",
        );
    }
    let exists = with_sandbox(&st, &id, |sb| sb.sessions.contains_key(&sid)).unwrap_or(false);
    if !exists {
        return err(StatusCode::NOT_FOUND, "session not found");
    }
    let cid = format!("cmd-{}", st.seq.fetch_add(1, Ordering::SeqCst));
    let dir = st.root.join(&id).join("sessions").join(&sid).join(&cid);
    std::fs::create_dir_all(&dir).unwrap();
    let out = std::fs::File::create(dir.join("output.log")).unwrap();
    let errf = std::fs::File::create(dir.join("stderr.log")).unwrap();
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(&command)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", &home)
        .current_dir(&home)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(errf)
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return err(StatusCode::BAD_REQUEST, format!("failed to start: {e}")),
    };
    let pgid = child.id().unwrap() as i32;
    let exit = Arc::new(Mutex::new(None));
    let exit2 = exit.clone();
    tokio::spawn(async move {
        use std::os::unix::process::ExitStatusExt;
        let status = child.wait().await.unwrap();
        let code = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        *exit2.lock().unwrap() = Some(code);
    });
    let _ = with_sandbox(&st, &id, |sb| {
        if let Some(s) = sb.sessions.get_mut(&sid) {
            s.insert(cid.clone(), FakeCommand { dir, pgid, exit });
        }
    });
    (StatusCode::ACCEPTED, Json(json!({ "cmdId": cid }))).into_response()
}

fn find_command(
    st: &FakeState,
    id: &str,
    sid: &str,
    cid: &str,
) -> Result<(PathBuf, Option<i32>), Response> {
    started_home(st, id)?;
    with_sandbox(st, id, |sb| {
        let Some(s) = sb.sessions.get(sid) else {
            return Err(err(StatusCode::NOT_FOUND, "session not found"));
        };
        let Some(c) = s.get(cid) else {
            return Err(err(StatusCode::NOT_FOUND, "command not found"));
        };
        Ok((c.dir.clone(), *c.exit.lock().unwrap()))
    })?
}

async fn command(State(st): S, Path((id, sid, cid)): Path<(String, String, String)>) -> Response {
    match find_command(&st, &id, &sid, &cid) {
        Ok((_, exit)) => {
            let mut v = json!({ "id": cid, "command": "" });
            if let Some(code) = exit {
                v["exitCode"] = json!(code);
            }
            Json(v).into_response()
        }
        Err(r) => r,
    }
}

async fn logs(State(st): S, Path((id, sid, cid)): Path<(String, String, String)>) -> Response {
    match find_command(&st, &id, &sid, &cid) {
        Ok((dir, _)) => {
            let read = |n: &str| {
                String::from_utf8_lossy(&std::fs::read(dir.join(n)).unwrap_or_default())
                    .into_owned()
            };
            Json(json!({ "stdout": read("output.log"), "stderr": read("stderr.log") }))
                .into_response()
        }
        Err(r) => r,
    }
}

#[derive(Deserialize)]
struct PathQuery {
    path: String,
}

async fn upload(
    State(st): S,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    mut form: Multipart,
) -> Response {
    if let Err(r) = started_home(&st, &id) {
        return r;
    }
    while let Ok(Some(field)) = form.next_field().await {
        if field.name() == Some("file") {
            let data = match field.bytes().await {
                Ok(d) => d,
                Err(e) => return err(StatusCode::BAD_REQUEST, e.to_string()),
            };
            let path = PathBuf::from(&q.path);
            if let Some(parent) = path.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            return match std::fs::write(&path, &data) {
                Ok(()) => StatusCode::OK.into_response(),
                Err(e) => err(StatusCode::BAD_REQUEST, e.to_string()),
            };
        }
    }
    err(StatusCode::BAD_REQUEST, "file is required")
}

async fn download(State(st): S, Path(id): Path<String>, Query(q): Query<PathQuery>) -> Response {
    if let Err(r) = started_home(&st, &id) {
        return r;
    }
    match std::fs::read(&q.path) {
        Ok(d) => d.into_response(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            err(StatusCode::NOT_FOUND, "file not found")
        }
        Err(e) => err(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

fn git(args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("git")
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// A git operation's answer: its own error, or success, or (quirk on) a validation
/// error for a success.
fn git_answer(st: &FakeState, r: Result<String, String>) -> Response {
    match r {
        Err(e) => err(StatusCode::BAD_REQUEST, e),
        Ok(_) if st.quirk.load(Ordering::SeqCst) => err(StatusCode::BAD_REQUEST, ": "),
        Ok(_) => StatusCode::OK.into_response(),
    }
}

async fn git_clone(State(st): S, Path(id): Path<String>, Json(body): Json<Value>) -> Response {
    if let Err(r) = started_home(&st, &id) {
        return r;
    }
    let (Some(url), Some(path)) = (
        body.get("url").and_then(Value::as_str),
        body.get("path").and_then(Value::as_str),
    ) else {
        return err(StatusCode::BAD_REQUEST, "url and path are required");
    };
    if let Some(p) = body.get("password").and_then(Value::as_str) {
        st.clone_passwords.lock().unwrap().push(p.to_string());
    }
    let mut args = vec!["clone", "--quiet"];
    if let Some(b) = body.get("branch").and_then(Value::as_str) {
        args.extend(["--branch", b]);
    }
    args.extend(["--", url, path]);
    git_answer(&st, git(&args))
}

async fn git_branch(State(st): S, Path(id): Path<String>, Json(body): Json<Value>) -> Response {
    if let Err(r) = started_home(&st, &id) {
        return r;
    }
    let (Some(path), Some(name)) = (
        body.get("path").and_then(Value::as_str),
        body.get("name").and_then(Value::as_str),
    ) else {
        return err(StatusCode::BAD_REQUEST, "path and name are required");
    };
    git_answer(&st, git(&["-C", path, "branch", "--", name]))
}

async fn git_branches(
    State(st): S,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Response {
    if let Err(r) = started_home(&st, &id) {
        return r;
    }
    match git(&["-C", &q.path, "branch", "--format=%(refname:short)"]) {
        Ok(out) => Json(json!({ "branches": out.lines().collect::<Vec<_>>() })).into_response(),
        Err(e) => err(StatusCode::BAD_REQUEST, e),
    }
}

async fn git_checkout(State(st): S, Path(id): Path<String>, Json(body): Json<Value>) -> Response {
    if let Err(r) = started_home(&st, &id) {
        return r;
    }
    let (Some(path), Some(branch)) = (
        body.get("path").and_then(Value::as_str),
        body.get("branch").and_then(Value::as_str),
    ) else {
        return err(StatusCode::BAD_REQUEST, "path and branch are required");
    };
    git_answer(&st, git(&["-C", path, "checkout", "--quiet", branch, "--"]))
}
