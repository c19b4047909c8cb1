//! Execs through the in-sandbox agent (`grove-sandboxd`): one agent per sandbox view,
//! started inside bubblewrap once and reused by every exec with the same view.
//!
//! A sandbox view is the whole bwrap prefix (mounts with their writability, hidden
//! dirs, network) plus the identity of the mounted directories, so a read command of a
//! writable workspace still runs in a view where the workspace is read-only: it gets
//! the read-only view's agent, not the writable one's.
//!
//! Each agent is served by two host threads: the owner, which spawns bwrap (so
//! `--die-with-parent` follows that thread, which lives exactly as long as the agent
//! is in use) and writes the frames queued for it, and a reader that routes the
//! agent's frames to the exec they belong to. Async code never blocks on the pipes.
//!
//! Nothing is lost or run twice: an exec is retried on a fresh agent only when its
//! request could not be written at all (the agent was already gone); once written,
//! the agent's death ends the exec with [`RuntimeError::Unavailable`], because the
//! command may have run in part. Every process of the agent's pid namespace dies with
//! it (bwrap's init goes when the agent goes).

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use futures::stream::{BoxStream, Stream, StreamExt};
use grove_core::error::RuntimeError;
use grove_core::ports::{ExecChunk, ExecResult, StreamKind};
use grove_sandboxd::protocol::{self, Event, Request};
use tokio::sync::mpsc;

/// Environment variable naming the agent binary; empty or `off` turns the agent off.
pub const AGENT_ENV: &str = "GROVE_SANDBOXD";

/// The agent binary's file name, looked for next to the running executable.
pub const AGENT_FILE: &str = "grove-sandboxd";

/// Where the agent binary is bind-mounted (read-only) inside the sandbox, in a
/// directory the sandbox covers with a tmpfs anyway.
const INSIDE_DIRS: &[&str] = &["/run", "/tmp"];
const INSIDE_NAME: &str = ".grove-sandboxd";

/// How long a starting agent may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// An agent nobody used for this long is stopped (on the next lookup).
const IDLE: Duration = Duration::from_secs(300);

/// At most this many agents live at once; the least recently used idle ones go first.
const MAX_AGENTS: usize = 32;

/// Stdin is sent in frames of this size.
const STDIN_CHUNK: usize = 64 * 1024;

/// Where the agent binary is: `$GROVE_SANDBOXD`, else `grove-sandboxd` next to the
/// running executable or one directory up (cargo puts test binaries in `deps/`).
/// `Err` says why there is none, for the log.
pub(crate) fn find_agent() -> Result<PathBuf, String> {
    if let Some(v) = std::env::var_os(AGENT_ENV) {
        if v.is_empty() || v == "off" {
            return Err(format!("{AGENT_ENV} turns the exec agent off"));
        }
        let p = PathBuf::from(v);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{AGENT_ENV}={} is not a file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("no current executable: {e}"))?;
    let mut dir = exe.parent();
    for _ in 0..2 {
        let Some(d) = dir else { break };
        let candidate = d.join(AGENT_FILE);
        if candidate.is_file() {
            return Ok(candidate);
        }
        dir = d.parent();
    }
    Err(format!(
        "no {AGENT_FILE} next to {} (set {AGENT_ENV} to its path)",
        exe.display()
    ))
}

/// Where the agent appears inside the sandbox.
pub(crate) fn inside_path() -> PathBuf {
    let dir = INSIDE_DIRS
        .iter()
        .find(|d| std::path::Path::new(d).is_dir())
        .unwrap_or(&"/tmp");
    PathBuf::from(dir).join(INSIDE_NAME)
}

/// What identifies an agent's sandbox view.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct AgentKey {
    /// bwrap's argv up to the per-command part.
    pub prefix: Vec<OsString>,
    /// (device, inode) of each mount source: a directory deleted and made anew at the
    /// same path is another view (the old agent still holds the old one).
    pub mount_ids: Vec<(u64, u64)>,
}

/// One exec as the agent runs it.
pub(crate) struct AgentExec {
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: Vec<(String, String)>,
    pub stdin: Option<Vec<u8>>,
    pub timeout: Option<Duration>,
    pub max_output: usize,
}

/// Why the agent path could not take an exec (the caller then starts a sandbox of its
/// own for it, today's path).
#[derive(Debug)]
pub(crate) struct NotTaken(pub String);

/// The agents of one provider (shared by its clones).
#[derive(Debug)]
pub(crate) struct AgentPool {
    binary: PathBuf,
    agents: Mutex<HashMap<AgentKey, Arc<AgentProc>>>,
}

impl AgentPool {
    pub fn new(binary: PathBuf) -> Self {
        Self {
            binary,
            agents: Mutex::new(HashMap::new()),
        }
    }

    pub fn binary(&self) -> &std::path::Path {
        &self.binary
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<AgentKey, Arc<AgentProc>>> {
        self.agents.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops the agents of a runtime (hibernate, destroy). Execs in flight keep their
    /// agent alive until they end.
    pub fn remove_backend(&self, backend_id: &str) {
        self.lock().retain(|_, a| a.backend_id != backend_id);
    }

    /// How many agents are up (tests).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Runs `exec` through the agent for `key`, starting one when needed.
    pub async fn exec(
        &self,
        key: &AgentKey,
        bwrap: &OsString,
        backend_id: &str,
        exec: AgentExec,
    ) -> Result<BoxStream<'static, Result<ExecChunk, RuntimeError>>, NotTaken> {
        let exec = Arc::new(exec);
        let mut why = String::new();
        // A second try only when the first agent was found gone before it got the
        // request: nothing ran, so nothing runs twice.
        for _ in 0..2 {
            let agent = self.get_or_start(key, bwrap, backend_id).await?;
            match agent.submit(exec.clone()).await {
                Ok(stream) => return Ok(stream),
                Err(e) => {
                    why = e;
                    let mut agents = self.lock();
                    if agents.get(key).is_some_and(|a| Arc::ptr_eq(a, &agent)) {
                        agents.remove(key);
                    }
                }
            }
        }
        Err(NotTaken(why))
    }

    async fn get_or_start(
        &self,
        key: &AgentKey,
        bwrap: &OsString,
        backend_id: &str,
    ) -> Result<Arc<AgentProc>, NotTaken> {
        {
            let mut agents = self.lock();
            let now = Instant::now();
            let stale = |a: &AgentProc| a.is_dead() || (a.idle() && a.last_used(now) > IDLE);
            agents.retain(|_, a| !stale(a));
            if let Some(a) = agents.get(key) {
                a.touch();
                return Ok(a.clone());
            }
        }
        let mut argv = key.prefix.clone();
        let inside = inside_path();
        argv.push("--ro-bind".into());
        argv.push(self.binary.clone().into());
        argv.push(inside.clone().into());
        crate::sandbox::push_env(
            &mut argv,
            crate::sandbox::BASE_ENV.iter().map(|(k, v)| (*k, *v)),
        );
        argv.extend(["--chdir", "/", "--"].map(OsString::from));
        argv.push(inside.into());
        argv.push("--sweep-namespace".into());
        let agent = AgentProc::start(bwrap.clone(), argv, backend_id.to_string())
            .await
            .map_err(NotTaken)?;
        let mut agents = self.lock();
        if let Some(other) = agents.get(key).filter(|a| !a.is_dead()) {
            // Another exec started one meanwhile; ours goes when dropped.
            return Ok(other.clone());
        }
        if agents.len() >= MAX_AGENTS {
            let now = Instant::now();
            if let Some(oldest) = agents
                .iter()
                .filter(|(_, a)| a.idle())
                .max_by_key(|(_, a)| a.last_used(now))
                .map(|(k, _)| k.clone())
            {
                agents.remove(&oldest);
            }
        }
        agents.insert(key.clone(), agent.clone());
        tracing::debug!(backend_id, pid = agent.pid, "exec agent started");
        Ok(agent)
    }
}

/// What the reader hands an exec.
enum Incoming {
    Output(StreamKind, Vec<u8>),
    Exit {
        code: i32,
        truncated: bool,
    },
    /// The agent ended before this exec did.
    Died,
}

#[derive(Default)]
struct Routes {
    by_id: HashMap<u64, mpsc::UnboundedSender<Incoming>>,
    dead: bool,
}

/// A frame for the owner thread to write; `ack` learns whether it was written.
struct Outgoing {
    bytes: Vec<u8>,
    ack: Option<oneshot::Sender<bool>>,
}

/// The host's handle on one running agent. Dropping the last handle stops it.
#[derive(Debug)]
pub(crate) struct AgentProc {
    tx: std::sync::mpsc::Sender<Outgoing>,
    routes: Arc<Mutex<RoutesCell>>,
    next_id: AtomicU64,
    last_used: Mutex<Instant>,
    in_flight: Arc<AtomicU64>,
    backend_id: String,
    pid: u32,
}

/// [`Routes`] behind a Debug impl.
#[derive(Default)]
struct RoutesCell(Routes);

impl std::fmt::Debug for RoutesCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Routes({} execs, dead: {})",
            self.0.by_id.len(),
            self.0.dead
        )
    }
}

fn lock_routes(r: &Mutex<RoutesCell>) -> std::sync::MutexGuard<'_, RoutesCell> {
    r.lock().unwrap_or_else(|e| e.into_inner())
}

impl AgentProc {
    /// Spawns `program args` (bwrap around the agent) and waits for its hello.
    async fn start(
        program: OsString,
        args: Vec<OsString>,
        backend_id: String,
    ) -> Result<Arc<Self>, String> {
        let (ready_tx, ready_rx) = oneshot::channel::<Result<u32, String>>();
        let (tx, rx) = std::sync::mpsc::channel::<Outgoing>();
        let routes = Arc::new(Mutex::new(RoutesCell::default()));
        let reader_routes = routes.clone();
        std::thread::Builder::new()
            .name("grove-sandboxd".into())
            .spawn(move || owner(program, args, rx, ready_tx, reader_routes))
            .map_err(|e| format!("cannot start a thread for the agent: {e}"))?;
        let pid = match tokio::time::timeout(HELLO_TIMEOUT, ready_rx).await {
            Ok(Ok(Ok(pid))) => pid,
            Ok(Ok(Err(why))) => return Err(why),
            Ok(Err(_)) => return Err("the agent's threads ended before it said hello".into()),
            Err(_) => {
                return Err(format!(
                    "the agent did not say hello within {HELLO_TIMEOUT:?}"
                ))
            }
        };
        Ok(Arc::new(AgentProc {
            tx,
            routes,
            next_id: AtomicU64::new(1),
            last_used: Mutex::new(Instant::now()),
            in_flight: Arc::new(AtomicU64::new(0)),
            backend_id,
            pid,
        }))
    }

    fn is_dead(&self) -> bool {
        lock_routes(&self.routes).0.dead
    }

    fn idle(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) == 0
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn last_used(&self, now: Instant) -> Duration {
        now.saturating_duration_since(*self.last_used.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn queue(&self, req: &Request, payload: &[u8], ack: Option<oneshot::Sender<bool>>) -> bool {
        let mut bytes = Vec::with_capacity(64 + payload.len());
        if protocol::write_frame(&mut bytes, req, payload).is_err() {
            return false;
        }
        self.tx.send(Outgoing { bytes, ack }).is_ok()
    }

    /// Sends the exec; `Err` only when it certainly did not reach the agent.
    async fn submit(
        self: &Arc<Self>,
        exec: Arc<AgentExec>,
    ) -> Result<BoxStream<'static, Result<ExecChunk, RuntimeError>>, String> {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (itx, irx) = mpsc::unbounded_channel();
        {
            let mut routes = lock_routes(&self.routes);
            if routes.0.dead {
                return Err("the exec agent had ended".into());
            }
            routes.0.by_id.insert(id, itx);
        }
        let unroute = || {
            lock_routes(&self.routes).0.by_id.remove(&id);
        };
        let (ack_tx, ack_rx) = oneshot::channel();
        let req = Request::Exec {
            id,
            argv: exec.argv.clone(),
            cwd: exec.cwd.clone(),
            env: exec.env.clone(),
            stdin: exec.stdin.is_some(),
            max_output: exec.max_output as u64,
        };
        if !self.queue(&req, b"", Some(ack_tx)) {
            unroute();
            return Err("the exec agent's writer had ended".into());
        }
        if let Some(data) = &exec.stdin {
            for chunk in data.chunks(STDIN_CHUNK) {
                self.queue(&Request::Stdin { id }, chunk, None);
            }
            self.queue(&Request::CloseStdin { id }, b"", None);
        }
        if ack_rx.await != Ok(true) {
            unroute();
            return Err("the exec request could not be written to the agent".into());
        }

        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let finished = Arc::new(AtomicBool::new(false));
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let guard = KillOnDrop {
            agent: self.clone(),
            id,
            finished: finished.clone(),
        };
        let agent = self.clone();
        let timeout = exec.timeout;
        tokio::spawn(async move {
            agent.drive(id, irx, out_tx, timeout, &finished).await;
            lock_routes(&agent.routes).0.by_id.remove(&id);
            agent.in_flight.fetch_sub(1, Ordering::SeqCst);
            agent.touch();
        });
        Ok(ExecStream {
            rx: out_rx,
            _guard: guard,
        }
        .boxed())
    }

    /// Forwards one exec's frames to its consumer and enforces its timeout; runs even
    /// when nobody polls the stream.
    async fn drive(
        &self,
        id: u64,
        mut irx: mpsc::UnboundedReceiver<Incoming>,
        out: mpsc::UnboundedSender<Result<ExecChunk, RuntimeError>>,
        timeout: Option<Duration>,
        finished: &AtomicBool,
    ) {
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut timed_out = false;
        loop {
            let msg = match deadline {
                Some(at) if !timed_out => {
                    tokio::select! {
                        m = irx.recv() => m,
                        _ = tokio::time::sleep_until(at) => {
                            timed_out = true;
                            self.queue(&Request::Kill { id }, b"", None);
                            continue;
                        }
                    }
                }
                _ => irx.recv().await,
            };
            match msg {
                Some(Incoming::Output(stream, data)) => {
                    // A consumer that went away only means nobody listens any more.
                    let _ = out.send(Ok(ExecChunk::Output { stream, data }));
                }
                Some(Incoming::Exit { code, truncated }) => {
                    finished.store(true, Ordering::SeqCst);
                    let _ = out.send(Ok(ExecChunk::Finished(ExecResult {
                        exit_code: code,
                        timed_out,
                        truncated,
                        ..ExecResult::default()
                    })));
                    return;
                }
                Some(Incoming::Died) | None => {
                    finished.store(true, Ordering::SeqCst);
                    let _ = out.send(Err(RuntimeError::Unavailable(
                        "the sandbox's exec agent ended while the command ran (the command \
                         may have run in part; it was not retried)"
                            .into(),
                    )));
                    return;
                }
            }
        }
    }
}

/// Kills the exec when its stream is dropped before it ended.
struct KillOnDrop {
    agent: Arc<AgentProc>,
    id: u64,
    finished: Arc<AtomicBool>,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if !self.finished.load(Ordering::SeqCst) {
            self.agent.queue(&Request::Kill { id: self.id }, b"", None);
        }
    }
}

struct ExecStream {
    rx: mpsc::UnboundedReceiver<Result<ExecChunk, RuntimeError>>,
    _guard: KillOnDrop,
}

impl Stream for ExecStream {
    type Item = Result<ExecChunk, RuntimeError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// The owner thread: spawns bwrap, starts the reader, writes queued frames until the
/// last handle is dropped, then kills the agent's process group and reaps it.
fn owner(
    program: OsString,
    args: Vec<OsString>,
    rx: std::sync::mpsc::Receiver<Outgoing>,
    ready: oneshot::Sender<Result<u32, String>>,
    routes: Arc<Mutex<RoutesCell>>,
) {
    let spawned = Command::new(&program)
        .args(&args)
        // No host variable may reach the sandbox; bwrap itself needs none.
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(format!("cannot start bwrap for the agent: {e}")));
            return;
        }
    };
    let pgid = child.id() as libc::pid_t;
    let mut input = child.stdin.take().expect("stdin is piped");
    let output = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let first_err = Arc::new(Mutex::new(String::new()));
    {
        let first_err = first_err.clone();
        let _ = std::thread::Builder::new()
            .name("grove-sandboxd-err".into())
            .spawn(move || log_stderr(stderr, &first_err));
    }
    {
        let routes = routes.clone();
        let _ = std::thread::Builder::new()
            .name("grove-sandboxd-read".into())
            .spawn(move || reader(output, ready, routes, first_err));
    }
    let mut broken = false;
    for msg in rx {
        if !broken {
            broken = input
                .write_all(&msg.bytes)
                .and_then(|()| input.flush())
                .is_err();
        }
        if let Some(ack) = msg.ack {
            let _ = ack.send(!broken);
        }
    }
    drop(input);
    // SAFETY: killpg has no memory-safety preconditions. The group is bwrap's own;
    // the child is not reaped yet, so the pgid cannot have been reused.
    unsafe {
        libc::killpg(pgid, libc::SIGKILL);
    }
    let _ = child.wait();
}

/// Routes the agent's frames; at its end marks the agent dead and ends every exec
/// still waiting.
fn reader(
    output: std::process::ChildStdout,
    ready: oneshot::Sender<Result<u32, String>>,
    routes: Arc<Mutex<RoutesCell>>,
    first_err: Arc<Mutex<String>>,
) {
    let mut output = BufReader::new(output);
    let hello = protocol::read_frame::<_, Event>(&mut output);
    match hello {
        Ok(Some((Event::Hello { version, pid }, _))) if version == protocol::VERSION => {
            let _ = ready.send(Ok(pid));
        }
        Ok(Some((Event::Hello { version, .. }, _))) => {
            let _ = ready.send(Err(format!(
                "the agent speaks protocol {version}, this grove {}",
                protocol::VERSION
            )));
            return mark_dead(&routes);
        }
        other => {
            // Give bwrap's message (on stderr) a moment to arrive.
            std::thread::sleep(Duration::from_millis(20));
            let msg = first_err.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let _ = ready.send(Err(format!(
                "the agent did not start ({}): {}",
                match other {
                    Ok(None) => "it ended".to_string(),
                    Ok(Some((ev, _))) => format!("unexpected {ev:?}"),
                    Err(e) => e.to_string(),
                },
                msg.trim()
            )));
            return mark_dead(&routes);
        }
    }
    loop {
        let (ev, payload) = match protocol::read_frame::<_, Event>(&mut output) {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(error = %e, "exec agent sent a bad frame; dropping it");
                break;
            }
        };
        let (id, msg) = match ev {
            Event::Started { .. } | Event::Hello { .. } => continue,
            Event::Output { id, stream } => (
                id,
                Incoming::Output(
                    match stream {
                        protocol::Stream::Stdout => StreamKind::Stdout,
                        protocol::Stream::Stderr => StreamKind::Stderr,
                    },
                    payload,
                ),
            ),
            Event::Exit {
                id,
                code,
                truncated,
            } => (id, Incoming::Exit { code, truncated }),
        };
        let routes = lock_routes(&routes);
        if let Some(tx) = routes.0.by_id.get(&id) {
            let _ = tx.send(msg);
        }
    }
    mark_dead(&routes);
}

fn mark_dead(routes: &Mutex<RoutesCell>) {
    let mut routes = lock_routes(routes);
    routes.0.dead = true;
    for (_, tx) in routes.0.by_id.drain() {
        let _ = tx.send(Incoming::Died);
    }
}

/// The agent's (and bwrap's) own stderr: logged, the first bytes kept for a start
/// failure's message.
fn log_stderr(mut stderr: std::process::ChildStderr, first: &Mutex<String>) {
    let mut buf = [0u8; 4096];
    loop {
        match stderr.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                tracing::warn!(stderr = %text.trim(), "exec agent");
                let mut first = first.lock().unwrap_or_else(|e| e.into_inner());
                if first.len() < 1024 {
                    first.push_str(&text);
                }
            }
        }
    }
}
