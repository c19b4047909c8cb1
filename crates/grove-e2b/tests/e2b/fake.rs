//! A fake E2B on loopback (axum, port 0), written from E2B's published API: the REST
//! control plane (OpenAPI `spec/openapi.yml`: `POST /sandboxes`, `GET /v2/sandboxes`,
//! `GET|DELETE /sandboxes/{id}`, `POST /sandboxes/{id}/pause|connect|timeout`) and
//! envd's `process.Process` service (`spec/envd/process/process.proto`) in the JSON
//! form of the Connect protocol plus envd's `GET|POST /files`. A sandbox's envd is
//! served under `/envd/{sandboxID}` (the adapter's envd URL template points there).
//!
//! Faithful in: `X-API-Key` on the REST routes and the sandbox's `X-Access-Token` on
//! envd (401 otherwise), error bodies `{code, message}`, 201 for create, 204 for
//! delete and pause, 409 for pausing a paused sandbox, 404 for unknown sandboxes, 429
//! past the concurrent-sandbox limit, pagination (`limit`, `nextToken`, answer header
//! `x-next-token`), `startedAt` (RFC 3339), metadata filtering (`metadata=k%3Dv&...`), `connect` answering
//! 200 for a running sandbox and 201 for a resumed one, Connect envelopes (5-byte
//! header, end-of-stream flag 0x02), base64 bytes, end events with `exited: false`
//! and `status: "signal: killed"` for signalled processes.
//!
//! **Commands run for real on this machine**: `Start` spawns `cmd args` with a cleared
//! environment (`PATH`, `HOME` and the request's `envs`), in its own process group
//! (signals go to the group); a sandbox's home is a temporary directory, but paths are
//! host paths and nothing is isolated. Pausing stops every process group (SIGSTOP)
//! and resuming continues it (SIGCONT), as E2B keeps memory across a pause; killing
//! kills them. Envd calls to a paused or killed sandbox answer 502. Not modelled:
//! templates (any id is accepted), real network policy, the sandbox timeout clock
//! (tests call [`FakeE2b::expire`]; renewals through `POST /sandboxes/{id}/timeout`
//! are only recorded, [`FakeE2b::timeouts`]), snapshots, PTYs,
//! `Connect`/`List`/`StreamInput`, what envd does to a process whose `Start` stream
//! the client dropped (here it keeps running), file watching, the `username` of file
//! calls, envd versions.

// Handlers return ready responses as errors; boxing them would only add noise here.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Multipart, Path, Query, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub struct FakeE2b {
    pub url: String,
    pub key: String,
    state: Arc<St>,
    _root: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

struct St {
    key: String,
    root: PathBuf,
    limit: usize,
    seq: AtomicU64,
    creates: AtomicU64,
    sandboxes: Mutex<BTreeMap<String, Sb>>,
    /// How long a create takes before the sandbox exists (a slow control plane).
    create_delay: Mutex<std::time::Duration>,
    /// Every accepted `POST /sandboxes/{id}/timeout`: (sandbox, seconds).
    timeouts: Mutex<Vec<(String, u64)>>,
}

struct Sb {
    seq: u64,
    id: String,
    paused: bool,
    token: String,
    body: Value,
    metadata: BTreeMap<String, String>,
    started_at: String,
    home: PathBuf,
    procs: HashMap<u32, Proc>,
}

/// A process's stdin, shared by the input calls until closed.
type StdinSlot = Arc<tokio::sync::Mutex<Option<tokio::process::ChildStdin>>>;

struct Proc {
    stdin: StdinSlot,
    done: Arc<std::sync::atomic::AtomicBool>,
}

fn signal_group(pid: u32, sig: i32) {
    // SAFETY: signalling a process group this fake created.
    unsafe {
        libc::kill(-(pid as i32), sig);
    }
}

impl Sb {
    fn signal_all(&self, sig: i32) {
        for (pid, p) in &self.procs {
            if !p.done.load(Ordering::SeqCst) {
                signal_group(*pid, sig);
            }
        }
    }

    fn json(&self) -> Value {
        json!({
            "sandboxID": self.id,
            "templateID": self.body.get("templateID").cloned().unwrap_or(json!("base")),
            "clientID": "fake-client",
            "envdVersion": "0.2.0",
            "envdAccessToken": self.token,
            "state": if self.paused { "paused" } else { "running" },
            "metadata": self.metadata,
            "startedAt": self.started_at,
            "cpuCount": 2,
            "memoryMB": 512,
        })
    }

    fn listed(&self) -> Value {
        let mut v = self.json();
        v.as_object_mut().unwrap().remove("envdAccessToken");
        v
    }
}

impl Drop for FakeE2b {
    fn drop(&mut self) {
        for sb in self.state.sandboxes.lock().unwrap().values() {
            sb.signal_all(libc::SIGCONT);
            sb.signal_all(libc::SIGKILL);
        }
        self.task.abort();
    }
}

fn err(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({ "code": status.as_u16(), "message": message.into() })),
    )
        .into_response()
}

type S = State<Arc<St>>;

impl FakeE2b {
    pub async fn start() -> Self {
        Self::start_with_limit(20).await
    }

    /// A fake whose team may run at most `limit` sandboxes at once.
    pub async fn start_with_limit(limit: usize) -> Self {
        let root = tempfile::Builder::new()
            .prefix("fake-e2b-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        let key = format!("e2b_test_{}", std::process::id());
        let state = Arc::new(St {
            key: key.clone(),
            root: root.path().to_path_buf(),
            limit,
            seq: AtomicU64::new(0),
            creates: AtomicU64::new(0),
            sandboxes: Mutex::new(BTreeMap::new()),
            create_delay: Mutex::new(std::time::Duration::ZERO),
            timeouts: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/sandboxes", post(create))
            .route("/v2/sandboxes", get(list))
            .route("/sandboxes/{id}", get(get_one).delete(kill))
            .route("/sandboxes/{id}/pause", post(pause))
            .route("/sandboxes/{id}/connect", post(connect))
            .route("/sandboxes/{id}/timeout", post(set_timeout))
            .route("/envd/{id}/process.Process/Start", post(start_process))
            .route("/envd/{id}/process.Process/SendInput", post(send_input))
            .route("/envd/{id}/process.Process/CloseStdin", post(close_stdin))
            .route("/envd/{id}/process.Process/SendSignal", post(send_signal))
            .route("/envd/{id}/files", get(read_file).post(write_file))
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
    pub fn set_create_delay(&self, d: std::time::Duration) {
        *self.state.create_delay.lock().unwrap() = d;
    }

    /// Every timeout renewal so far: (sandbox, seconds).
    pub fn timeouts(&self) -> Vec<(String, u64)> {
        self.state.timeouts.lock().unwrap().clone()
    }

    /// The envd URL template that reaches this fake.
    pub fn envd_template(&self) -> String {
        format!("{}/envd/{{sandbox_id}}", self.url)
    }

    /// `(id, state, metadata)` of every sandbox.
    pub fn sandboxes(&self) -> Vec<(String, &'static str, BTreeMap<String, String>)> {
        self.state
            .sandboxes
            .lock()
            .unwrap()
            .values()
            .map(|s| {
                (
                    s.id.clone(),
                    if s.paused { "paused" } else { "running" },
                    s.metadata.clone(),
                )
            })
            .collect()
    }

    pub fn create_body(&self, id: &str) -> Value {
        self.state.sandboxes.lock().unwrap()[id].body.clone()
    }

    pub fn creates(&self) -> u64 {
        self.state.creates.load(Ordering::SeqCst)
    }

    pub fn home(&self, id: &str) -> PathBuf {
        self.state.sandboxes.lock().unwrap()[id].home.clone()
    }

    /// The sandbox's timeout elapses: paused with `autoPause`, killed without.
    pub fn expire(&self, id: &str) {
        let mut sbs = self.state.sandboxes.lock().unwrap();
        let auto = sbs[id]
            .body
            .get("autoPause")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if auto {
            let sb = sbs.get_mut(id).unwrap();
            sb.signal_all(libc::SIGSTOP);
            sb.paused = true;
        } else if let Some(sb) = sbs.remove(id) {
            sb.signal_all(libc::SIGKILL);
            let _ = std::fs::remove_dir_all(&sb.home);
        }
    }

    /// Pauses a sandbox as E2B's auto-pause would.
    pub fn pause_behind_the_back(&self, id: &str) {
        let mut sbs = self.state.sandboxes.lock().unwrap();
        let sb = sbs.get_mut(id).unwrap();
        sb.signal_all(libc::SIGSTOP);
        sb.paused = true;
    }

    /// Kills a sandbox as someone else would.
    pub fn kill_behind_the_back(&self, id: &str) {
        if let Some(sb) = self.state.sandboxes.lock().unwrap().remove(id) {
            sb.signal_all(libc::SIGCONT);
            sb.signal_all(libc::SIGKILL);
            let _ = std::fs::remove_dir_all(&sb.home);
        }
    }
}

async fn auth(State(st): S, req: Request, next: Next) -> Response {
    match check_auth(&st, &req) {
        Ok(()) => next.run(req).await,
        Err(r) => r,
    }
}

fn check_auth(st: &St, req: &Request) -> Result<(), Response> {
    let path = req.uri().path();
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    if let Some(rest) = path.strip_prefix("/envd/") {
        let id = rest.split('/').next().unwrap_or("");
        let sbs = st.sandboxes.lock().unwrap();
        let token = match sbs.get(id) {
            None => {
                return Err(err(
                    StatusCode::BAD_GATEWAY,
                    format!("sandbox {id} not found"),
                ))
            }
            Some(sb) if sb.paused => {
                return Err(err(
                    StatusCode::BAD_GATEWAY,
                    format!("sandbox {id} is paused"),
                ))
            }
            Some(sb) => sb.token.as_str(),
        };
        if header("x-access-token") != Some(token) {
            return Err(err(StatusCode::UNAUTHORIZED, "invalid access token"));
        }
    } else if header("x-api-key") != Some(st.key.as_str()) {
        return Err(err(
            StatusCode::UNAUTHORIZED,
            "Invalid API key, it must start with 'e2b_' prefix and be valid",
        ));
    }
    Ok(())
}

async fn create(State(st): S, Json(body): Json<Value>) -> Response {
    let delay = *st.create_delay.lock().unwrap();
    tokio::time::sleep(delay).await;
    let Some(template) = body.get("templateID").and_then(Value::as_str) else {
        return err(StatusCode::BAD_REQUEST, "templateID is required");
    };
    let _ = template;
    let metadata: BTreeMap<String, String> = match body.get("metadata") {
        None => BTreeMap::new(),
        Some(m) => match serde_json::from_value(m.clone()) {
            Ok(m) => m,
            Err(_) => {
                return err(
                    StatusCode::BAD_REQUEST,
                    "metadata must map strings to strings",
                )
            }
        },
    };
    let mut sbs = st.sandboxes.lock().unwrap();
    if sbs.values().filter(|s| !s.paused).count() >= st.limit {
        return err(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "You have reached the maximum number of concurrent E2B sandboxes ({})",
                st.limit
            ),
        );
    }
    let seq = st.seq.fetch_add(1, Ordering::SeqCst);
    let id = format!("i{:x}fake{seq:04}", std::process::id());
    let home = st.root.join(&id).join("home").join("user");
    std::fs::create_dir_all(&home).unwrap();
    let sb = Sb {
        seq,
        id: id.clone(),
        paused: false,
        token: format!("envd-token-{seq}-{}", std::process::id()),
        body,
        metadata,
        started_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        home,
        procs: HashMap::new(),
    };
    let v = sb.json();
    sbs.insert(id, sb);
    st.creates.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, Json(v)).into_response()
}

fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (pct_decode(k), pct_decode(v))
        })
        .collect()
}

async fn list(State(st): S, RawQuery(q): RawQuery) -> Response {
    let q = pairs(q.as_deref().unwrap_or(""));
    let mut want = BTreeMap::new();
    let mut states = Vec::new();
    let mut limit = 100usize;
    let mut start = 0usize;
    for (k, v) in &q {
        match k.as_str() {
            "metadata" => want.extend(pairs(v)),
            "state" => states.push(v.clone()),
            "limit" => match v.parse() {
                Ok(n) if (1..=100).contains(&n) => limit = n,
                _ => return err(StatusCode::BAD_REQUEST, "limit must be between 1 and 100"),
            },
            "nextToken" => match v.parse() {
                Ok(n) => start = n,
                Err(_) => return err(StatusCode::BAD_REQUEST, "invalid nextToken"),
            },
            _ => {}
        }
    }
    let sbs = st.sandboxes.lock().unwrap();
    let mut found: Vec<&Sb> = sbs
        .values()
        .filter(|s| want.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .filter(|s| {
            states.is_empty()
                || states
                    .iter()
                    .any(|x| x == if s.paused { "paused" } else { "running" })
        })
        .collect();
    found.sort_by_key(|s| s.seq);
    let page: Vec<Value> = found
        .iter()
        .skip(start)
        .take(limit)
        .map(|s| s.listed())
        .collect();
    let mut resp = Json(page).into_response();
    if start + limit < found.len() {
        resp.headers_mut()
            .insert("x-next-token", (start + limit).to_string().parse().unwrap());
    }
    resp
}

async fn get_one(State(st): S, Path(id): Path<String>) -> Response {
    match st.sandboxes.lock().unwrap().get(&id) {
        Some(sb) => Json(sb.json()).into_response(),
        None => err(
            StatusCode::NOT_FOUND,
            format!("sandbox \"{id}\" doesn't exist or you don't have access to it"),
        ),
    }
}

async fn kill(State(st): S, Path(id): Path<String>) -> Response {
    match st.sandboxes.lock().unwrap().remove(&id) {
        Some(sb) => {
            sb.signal_all(libc::SIGCONT);
            sb.signal_all(libc::SIGKILL);
            let _ = std::fs::remove_dir_all(&sb.home);
            StatusCode::NO_CONTENT.into_response()
        }
        None => err(
            StatusCode::NOT_FOUND,
            format!("sandbox \"{id}\" doesn't exist"),
        ),
    }
}

async fn pause(State(st): S, Path(id): Path<String>) -> Response {
    let mut sbs = st.sandboxes.lock().unwrap();
    match sbs.get_mut(&id) {
        Some(sb) if sb.paused => err(
            StatusCode::CONFLICT,
            format!("sandbox \"{id}\" is already paused"),
        ),
        Some(sb) => {
            sb.signal_all(libc::SIGSTOP);
            sb.paused = true;
            StatusCode::NO_CONTENT.into_response()
        }
        None => err(
            StatusCode::NOT_FOUND,
            format!("sandbox \"{id}\" doesn't exist"),
        ),
    }
}

async fn connect(State(st): S, Path(id): Path<String>, Json(body): Json<Value>) -> Response {
    if body.get("timeout").and_then(Value::as_u64).is_none() {
        return err(StatusCode::BAD_REQUEST, "timeout is required");
    }
    let mut sbs = st.sandboxes.lock().unwrap();
    let running = sbs.values().filter(|s| !s.paused).count();
    match sbs.get_mut(&id) {
        Some(sb) if sb.paused => {
            if running >= st.limit {
                return err(
                    StatusCode::TOO_MANY_REQUESTS,
                    "maximum number of concurrent E2B sandboxes reached",
                );
            }
            sb.signal_all(libc::SIGCONT);
            sb.paused = false;
            (StatusCode::CREATED, Json(sb.json())).into_response()
        }
        Some(sb) => Json(sb.json()).into_response(),
        None => err(
            StatusCode::NOT_FOUND,
            format!("sandbox \"{id}\" doesn't exist"),
        ),
    }
}

async fn set_timeout(State(st): S, Path(id): Path<String>, Json(body): Json<Value>) -> Response {
    let Some(timeout) = body.get("timeout").and_then(Value::as_u64) else {
        return err(StatusCode::BAD_REQUEST, "timeout is required");
    };
    match st.sandboxes.lock().unwrap().get(&id) {
        Some(_) => {
            st.timeouts.lock().unwrap().push((id.clone(), timeout));
            StatusCode::NO_CONTENT.into_response()
        }
        None => err(
            StatusCode::NOT_FOUND,
            format!("sandbox \"{id}\" doesn't exist"),
        ),
    }
}

fn envelope(flags: u8, msg: &Value) -> Bytes {
    let body = serde_json::to_vec(msg).unwrap();
    let mut out = Vec::with_capacity(body.len() + 5);
    out.push(flags);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Bytes::from(out)
}

fn connect_error(code: &str, message: &str) -> Response {
    let mut r = Body::from(envelope(
        2,
        &json!({ "error": { "code": code, "message": message } }),
    ))
    .into_response();
    r.headers_mut()
        .insert("content-type", "application/connect+json".parse().unwrap());
    r
}

async fn start_process(State(st): S, Path(id): Path<String>, body: Bytes) -> Response {
    if body.len() < 5 || body[0] != 0 {
        return err(
            StatusCode::BAD_REQUEST,
            "expected one uncompressed Connect envelope",
        );
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let Ok(req) = serde_json::from_slice::<Value>(&body[5..5 + len.min(body.len() - 5)]) else {
        return connect_error("invalid_argument", "malformed StartRequest");
    };
    let p = &req["process"];
    let Some(cmd) = p.get("cmd").and_then(Value::as_str) else {
        return connect_error("invalid_argument", "process.cmd is required");
    };
    let args: Vec<String> =
        serde_json::from_value(p.get("args").cloned().unwrap_or(json!([]))).unwrap_or_default();
    let envs: BTreeMap<String, String> =
        serde_json::from_value(p.get("envs").cloned().unwrap_or(json!({}))).unwrap_or_default();
    let want_stdin = req.get("stdin").and_then(Value::as_bool).unwrap_or(false);
    let home = st.sandboxes.lock().unwrap()[&id].home.clone();
    let cwd = p
        .get("cwd")
        .and_then(Value::as_str)
        .map(PathBuf::from)
        .unwrap_or(home.clone());
    let mut c = tokio::process::Command::new(cmd);
    c.args(&args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", &home)
        .envs(&envs)
        .current_dir(&cwd)
        .stdin(if want_stdin {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0);
    let mut child = match c.spawn() {
        Ok(c) => c,
        Err(e) => return connect_error("internal", &format!("error starting process: {e}")),
    };
    let pid = child.id().unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stdin = Arc::new(tokio::sync::Mutex::new(child.stdin.take()));
    {
        let mut sbs = st.sandboxes.lock().unwrap();
        if let Some(sb) = sbs.get_mut(&id) {
            sb.procs.insert(
                pid,
                Proc {
                    stdin,
                    done: done.clone(),
                },
            );
        }
    }
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Bytes, std::convert::Infallible>>();
    let _ = tx.unbounded_send(Ok(envelope(
        0,
        &json!({ "event": { "start": { "pid": pid } } }),
    )));
    let mut readers = Vec::new();
    for (name, pipe) in [
        (
            "stdout",
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
        (
            "stderr",
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
    ] {
        let mut pipe = pipe.unwrap();
        let tx = tx.clone();
        readers.push(tokio::spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match pipe.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let b64 = base64::engine::general_purpose::STANDARD.encode(&buf[..n]);
                        let _ = tx.unbounded_send(Ok(envelope(
                            0,
                            &json!({ "event": { "data": { name: b64 } } }),
                        )));
                    }
                }
            }
        }));
    }
    tokio::spawn(async move {
        use std::os::unix::process::ExitStatusExt;
        let status = child.wait().await.unwrap();
        for r in readers {
            let _ = r.await;
        }
        done.store(true, Ordering::SeqCst);
        let end = match status.code() {
            Some(code) => {
                json!({ "exitCode": code, "exited": true, "status": format!("exit status {code}") })
            }
            None => {
                let name = match status.signal() {
                    Some(9) => "killed".to_string(),
                    Some(15) => "terminated".to_string(),
                    Some(2) => "interrupt".to_string(),
                    Some(s) => format!("signal {s}"),
                    None => "unknown".to_string(),
                };
                json!({ "exitCode": -1, "exited": false, "status": format!("signal: {name}") })
            }
        };
        let _ = tx.unbounded_send(Ok(envelope(0, &json!({ "event": { "end": end } }))));
        let _ = tx.unbounded_send(Ok(envelope(2, &json!({}))));
    });
    let mut r = Body::from_stream(rx).into_response();
    r.headers_mut()
        .insert("content-type", "application/connect+json".parse().unwrap());
    r
}

fn proc_of(st: &St, id: &str, body: &Value) -> Result<(u32, StdinSlot), Response> {
    let pid = body["process"]["pid"]
        .as_u64()
        .ok_or_else(|| err(StatusCode::BAD_REQUEST, "process.pid is required"))?
        as u32;
    let sbs = st.sandboxes.lock().unwrap();
    match sbs.get(id).and_then(|s| s.procs.get(&pid)) {
        Some(p) if !p.done.load(Ordering::SeqCst) => Ok((pid, p.stdin.clone())),
        _ => Err(err(
            StatusCode::NOT_FOUND,
            format!("process with pid {pid} not found"),
        )),
    }
}

async fn send_input(State(st): S, Path(id): Path<String>, Json(body): Json<Value>) -> Response {
    let (_, stdin) = match proc_of(&st, &id, &body) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let Ok(data) = base64::engine::general_purpose::STANDARD
        .decode(body["input"]["stdin"].as_str().unwrap_or(""))
    else {
        return err(StatusCode::BAD_REQUEST, "input.stdin must be base64");
    };
    let mut guard = stdin.lock().await;
    match guard.as_mut() {
        Some(w) => match w.write_all(&data).await {
            Ok(()) => Json(json!({})).into_response(),
            Err(e) => err(StatusCode::BAD_REQUEST, format!("writing stdin: {e}")),
        },
        None => err(
            StatusCode::BAD_REQUEST,
            "stdin is closed or was not requested",
        ),
    }
}

async fn close_stdin(State(st): S, Path(id): Path<String>, Json(body): Json<Value>) -> Response {
    let (_, stdin) = match proc_of(&st, &id, &body) {
        Ok(p) => p,
        Err(r) => return r,
    };
    stdin.lock().await.take();
    Json(json!({})).into_response()
}

async fn send_signal(State(st): S, Path(id): Path<String>, Json(body): Json<Value>) -> Response {
    let (pid, _) = match proc_of(&st, &id, &body) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let sig = match body["signal"].as_str() {
        Some("SIGNAL_SIGKILL") | Some("9") => libc::SIGKILL,
        Some("SIGNAL_SIGTERM") | Some("15") => libc::SIGTERM,
        _ => {
            return err(
                StatusCode::BAD_REQUEST,
                "signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM",
            )
        }
    };
    signal_group(pid, sig);
    Json(json!({})).into_response()
}

#[derive(Deserialize)]
struct PathQuery {
    path: String,
}

async fn read_file(Query(q): Query<PathQuery>) -> Response {
    match std::fs::read(&q.path) {
        Ok(d) => d.into_response(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => err(
            StatusCode::NOT_FOUND,
            format!("path '{}' does not exist", q.path),
        ),
        Err(e) => err(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

async fn write_file(Query(q): Query<PathQuery>, mut form: Multipart) -> Response {
    while let Ok(Some(field)) = form.next_field().await {
        if field.name() == Some("file") {
            let Ok(data) = field.bytes().await else {
                return err(StatusCode::BAD_REQUEST, "unreadable upload");
            };
            let path = PathBuf::from(&q.path);
            if let Some(parent) = path.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            return match std::fs::write(&path, &data) {
                Ok(()) => Json(json!([{ "name": path.file_name().map(|n| n.to_string_lossy().into_owned()), "type": "file", "path": q.path }])).into_response(),
                Err(e) => err(StatusCode::BAD_REQUEST, e.to_string()),
            };
        }
    }
    err(StatusCode::BAD_REQUEST, "file is required")
}
