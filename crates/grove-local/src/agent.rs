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
//! is in use) and writes queued frames (stdin data, kills), and a reader that delivers
//! the agent's frames straight into each exec's stream. The exec request itself is
//! written by the caller, a small frame into a pipe the agent always drains, so that
//! whether it was delivered is known at once. A timeout is a timer task that asks for
//! the kill; the reader puts `timed_out` into the result.
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
use std::process::{ChildStdin, Command, Stdio};
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
    /// A read-only view: the agent empties `/tmp` (and so `$HOME`) between execs.
    pub fresh_tmp: bool,
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
    jail: Arc<crate::jail::Jail>,
    agents: Mutex<HashMap<AgentKey, Arc<AgentProc>>>,
}

impl AgentPool {
    pub fn new(binary: PathBuf, jail: Arc<crate::jail::Jail>) -> Self {
        Self {
            binary,
            jail,
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
        cgroup: Option<&crate::jail::Cgroup>,
        exec: AgentExec,
    ) -> Result<BoxStream<'static, Result<ExecChunk, RuntimeError>>, NotTaken> {
        let exec = Arc::new(exec);
        let mut why = String::new();
        // A second try only when the first agent was found gone before it got the
        // request: nothing ran, so nothing runs twice.
        for _ in 0..2 {
            let agent = self.get_or_start(key, bwrap, backend_id, cgroup).await?;
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
        cgroup: Option<&crate::jail::Cgroup>,
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
        if key.fresh_tmp {
            argv.push("--fresh-tmp".into());
        }
        let (cmd, seccomp_fd) = self.jail.command(bwrap, &argv, cgroup).map_err(NotTaken)?;
        let agent = AgentProc::start(cmd, seccomp_fd, backend_id.to_string())
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

type Item = Result<ExecChunk, RuntimeError>;

/// Where the reader delivers one exec's frames: straight into the consumer's channel
/// (no task in between), with what the result needs to know.
struct Route {
    out: mpsc::UnboundedSender<Item>,
    /// Set by the timer before it asks for the kill.
    timed_out: Arc<AtomicBool>,
    /// Set once the result (or the agent's death) was delivered.
    finished: Arc<AtomicBool>,
    timer: Option<tokio::task::AbortHandle>,
}

impl Route {
    fn end(self, item: Item) {
        self.finished.store(true, Ordering::SeqCst);
        if let Some(t) = self.timer {
            t.abort();
        }
        // A consumer that went away only means nobody listens any more.
        let _ = self.out.send(item);
    }
}

#[derive(Default)]
struct Routes {
    by_id: HashMap<u64, Route>,
    dead: bool,
}

/// The agent's stdin, shared by the callers (an exec request is written at once) and
/// the owner thread (stdin data and kills, queued so no async code blocks on them).
type Input = Arc<Mutex<Option<ChildStdin>>>;

/// The host's handle on one running agent. Dropping the last handle (the pool's, and
/// those held by execs in flight) stops it.
pub(crate) struct AgentProc {
    input: Input,
    queue: std::sync::mpsc::Sender<Vec<u8>>,
    routes: Arc<Mutex<Routes>>,
    next_id: AtomicU64,
    last_used: Mutex<Instant>,
    backend_id: String,
    pid: u32,
}

impl std::fmt::Debug for AgentProc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AgentProc(pid {} of {})", self.pid, self.backend_id)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn frame(req: &Request, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(64 + payload.len());
    // Writing into a Vec fails only for frames over the protocol's limits, which the
    // callers' own limits (argv, env, stdin chunks) keep below.
    let _ = protocol::write_frame(&mut bytes, req, payload);
    bytes
}

impl AgentProc {
    /// Spawns `cmd` (bwrap around the agent, jailed) and waits for its hello.
    async fn start(
        cmd: Command,
        seccomp_fd: std::os::fd::OwnedFd,
        backend_id: String,
    ) -> Result<Arc<Self>, String> {
        let (ready_tx, ready_rx) = oneshot::channel::<Result<u32, String>>();
        let (queue, rx) = std::sync::mpsc::channel::<Vec<u8>>();
        let routes = Arc::new(Mutex::new(Routes::default()));
        let input: Input = Arc::new(Mutex::new(None));
        {
            let (routes, input) = (routes.clone(), input.clone());
            std::thread::Builder::new()
                .name("grove-sandboxd".into())
                .spawn(move || owner(cmd, seccomp_fd, rx, ready_tx, routes, input))
                .map_err(|e| format!("cannot start a thread for the agent: {e}"))?;
        }
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
            input,
            queue,
            routes,
            next_id: AtomicU64::new(1),
            last_used: Mutex::new(Instant::now()),
            backend_id,
            pid,
        }))
    }

    fn is_dead(&self) -> bool {
        lock(&self.routes).dead
    }

    fn idle(&self) -> bool {
        lock(&self.routes).by_id.is_empty()
    }

    fn touch(&self) {
        *lock(&self.last_used) = Instant::now();
    }

    fn last_used(&self, now: Instant) -> Duration {
        now.saturating_duration_since(*lock(&self.last_used))
    }

    /// Sends the exec; `Err` only when it certainly did not reach the agent.
    async fn submit(
        self: &Arc<Self>,
        exec: Arc<AgentExec>,
    ) -> Result<BoxStream<'static, Item>, String> {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (out, rx) = mpsc::unbounded_channel();
        let timed_out = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicBool::new(false));
        {
            let mut routes = lock(&self.routes);
            if routes.dead {
                return Err("the exec agent had ended".into());
            }
            routes.by_id.insert(
                id,
                Route {
                    out,
                    timed_out: timed_out.clone(),
                    finished: finished.clone(),
                    timer: None,
                },
            );
        }
        let req = Request::Exec {
            id,
            argv: exec.argv.clone(),
            cwd: exec.cwd.clone(),
            env: exec.env.clone(),
            stdin: exec.stdin.is_some(),
            max_output: exec.max_output as u64,
        };
        // Written here and now (a small frame into a pipe the agent always drains):
        // whether it reached the pipe decides between a retry and an error.
        let written = {
            let mut input = lock(&self.input);
            match input.as_mut() {
                Some(pipe) => pipe
                    .write_all(&frame(&req, b""))
                    .and_then(|()| pipe.flush())
                    .is_ok(),
                None => false,
            }
        };
        if !written {
            lock(&self.routes).by_id.remove(&id);
            return Err("the exec request could not be written to the agent".into());
        }
        if let Some(data) = &exec.stdin {
            for chunk in data.chunks(STDIN_CHUNK) {
                let _ = self.queue.send(frame(&Request::Stdin { id }, chunk));
            }
            let _ = self.queue.send(frame(&Request::CloseStdin { id }, b""));
        }
        if let Some(t) = exec.timeout {
            // The timer holds only the queue, so a finished exec leaves nothing behind
            // once the reader aborts it.
            let queue = self.queue.clone();
            let flag = timed_out.clone();
            let timer = tokio::spawn(async move {
                tokio::time::sleep(t).await;
                flag.store(true, Ordering::SeqCst);
                let _ = queue.send(frame(&Request::Kill { id }, b""));
            });
            match lock(&self.routes).by_id.get_mut(&id) {
                Some(route) => route.timer = Some(timer.abort_handle()),
                None => timer.abort(),
            }
        }
        Ok(ExecStream {
            rx,
            _guard: KillOnDrop {
                agent: self.clone(),
                id,
                finished,
            },
        }
        .boxed())
    }
}

/// Kills the exec when its stream is dropped before it ended; keeps the agent alive
/// while the exec runs.
struct KillOnDrop {
    agent: Arc<AgentProc>,
    id: u64,
    finished: Arc<AtomicBool>,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if !self.finished.load(Ordering::SeqCst) {
            let _ = self
                .agent
                .queue
                .send(frame(&Request::Kill { id: self.id }, b""));
        }
    }
}

struct ExecStream {
    rx: mpsc::UnboundedReceiver<Item>,
    _guard: KillOnDrop,
}

impl Stream for ExecStream {
    type Item = Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        self.rx.poll_recv(cx)
    }
}

/// The owner thread: spawns bwrap, starts the reader, writes queued frames until the
/// last handle is dropped, then kills the agent's process group and reaps it.
fn owner(
    mut cmd: Command,
    seccomp_fd: std::os::fd::OwnedFd,
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
    ready: oneshot::Sender<Result<u32, String>>,
    routes: Arc<Mutex<Routes>>,
    input: Input,
) {
    let spawned = cmd
        // No host variable may reach the sandbox; bwrap itself needs none.
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn();
    // bwrap has its own copy of the seccomp program's descriptor now.
    drop(seccomp_fd);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(format!("cannot start bwrap for the agent: {e}")));
            return;
        }
    };
    let pgid = child.id() as libc::pid_t;
    *lock(&input) = child.stdin.take();
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
    for bytes in rx {
        let mut input = lock(&input);
        let broken = match input.as_mut() {
            Some(pipe) => pipe.write_all(&bytes).and_then(|()| pipe.flush()).is_err(),
            None => true,
        };
        if broken {
            // The agent is gone; the reader reports it to the execs.
            *input = None;
        }
    }
    lock(&input).take();
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
    routes: Arc<Mutex<Routes>>,
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
            let msg = lock(&first_err).clone();
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
                tracing::warn!(error = %e, "exec agent sent a bad frame; stopping it");
                break;
            }
        };
        match ev {
            Event::Started { .. } | Event::Hello { .. } => {}
            Event::Output { id, stream } => {
                let stream = match stream {
                    protocol::Stream::Stdout => StreamKind::Stdout,
                    protocol::Stream::Stderr => StreamKind::Stderr,
                };
                if let Some(route) = lock(&routes).by_id.get(&id) {
                    let _ = route.out.send(Ok(ExecChunk::Output {
                        stream,
                        data: payload,
                    }));
                }
            }
            Event::Exit {
                id,
                code,
                truncated,
            } => {
                let route = lock(&routes).by_id.remove(&id);
                if let Some(route) = route {
                    let timed_out = route.timed_out.load(Ordering::SeqCst);
                    route.end(Ok(ExecChunk::Finished(ExecResult {
                        exit_code: code,
                        timed_out,
                        truncated,
                        ..ExecResult::default()
                    })));
                }
            }
        }
    }
    mark_dead(&routes);
}

fn mark_dead(routes: &Mutex<Routes>) {
    let mut routes = lock(routes);
    routes.dead = true;
    for (_, route) in routes.by_id.drain() {
        route.end(Err(RuntimeError::Unavailable(
            "the sandbox's exec agent ended while the command ran (the command may have \
             run in part; it was not retried)"
                .into(),
        )));
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
                let mut first = lock(first);
                if first.len() < 1024 {
                    first.push_str(&text);
                }
            }
        }
    }
}
