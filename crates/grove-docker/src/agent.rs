//! Execs through the exec agent (`grove-sandboxd`, ADR 18) inside a container: one
//! long-lived attached engine exec per container runs the agent, and every command is
//! then one request frame on its stdin and a few event frames back, instead of an
//! engine exec of its own.
//!
//! The agent binary must run in the container's image, so it is a statically linked
//! build, bind-mounted read-only at [`INSIDE_PATH`] when the container is created. The
//! agent is started on the first exec and lives as long as its engine exec: stopping,
//! restarting or removing the container ends it, and so does the worker's death (the
//! attached connection closes, the agent reads the end of its stdin and kills its
//! commands). The caller writes its exec request itself (whether it was written decides
//! between a retry and an error); a writer task sends queued stdin data and kills; a
//! reader task routes the agent's frames into each exec's stream.
//!
//! Nothing runs twice: an exec is retried on a fresh agent only when its request could
//! not be written at all; once written, the agent's end fails the exec with
//! [`RuntimeError::Unavailable`] and the next exec starts a new agent.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{StartExecOptions, StartExecResults};
use futures::stream::{BoxStream, Stream, StreamExt};
use grove_core::error::RuntimeError;
use grove_core::ports::{ExecChunk, ExecResult, StreamKind};
use grove_sandboxd::protocol::{self, Event, Request};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::exec::Inner;

/// Environment variable naming a statically linked `grove-sandboxd` for containers;
/// unset, empty or `off`: no agent (every command is an engine exec).
pub const AGENT_ENV: &str = "GROVE_DOCKER_SANDBOXD";

/// Where the agent binary appears (read-only) inside every container.
pub const INSIDE_PATH: &str = "/run/.grove-sandboxd";

/// How long a starting agent may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Stdin is sent in frames of this size.
const STDIN_CHUNK: usize = 64 * 1024;

/// The agent binary named by [`AGENT_ENV`], checked: `Ok(None)` when the variable
/// turns the agent off, `Err` (for the log) when it names something unusable.
pub fn from_env() -> Result<Option<PathBuf>, String> {
    match std::env::var_os(AGENT_ENV) {
        None => Ok(None),
        Some(v) if v.is_empty() || v == "off" => Ok(None),
        Some(v) => check_binary(Path::new(&v)).map(Some),
    }
}

/// A binary the containers can run: a statically linked ELF file (the images need
/// not have the host's C library).
pub fn check_binary(path: &Path) -> Result<PathBuf, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    match crate::image::is_static_elf(&bytes) {
        Some(true) => std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display())),
        Some(false) => Err(format!(
            "{} is linked dynamically; containers need a static build (cargo rustc -p \
             grove-sandboxd --release --bin grove-sandboxd -- -C target-feature=+crt-static)",
            path.display()
        )),
        None => Err(format!("{} is not an ELF executable", path.display())),
    }
}

/// The agents of one provider (shared by its clones), one per container.
#[derive(Debug)]
pub(crate) struct Pool {
    binary: PathBuf,
    by_container: Mutex<HashMap<String, Arc<Agent>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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

impl Pool {
    pub fn new(binary: PathBuf) -> Self {
        Self {
            binary,
            by_container: Mutex::new(HashMap::new()),
        }
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// Forgets the agent of a container (by id or name) being stopped or removed; the
    /// agent itself ends with the container.
    pub fn forget(&self, container: &str) {
        lock(&self.by_container)
            .retain(|id, a| id != container && a.name.trim_start_matches('/') != container);
    }

    /// How many agents are known (tests).
    pub fn len(&self) -> usize {
        lock(&self.by_container).len()
    }

    /// Runs `exec` through the container's agent, starting one when needed. An
    /// engine error starting the agent is returned as it is (the container is gone,
    /// say); the caller falls back to an engine exec only for [`Start::Failed`].
    pub async fn exec(
        &self,
        inner: &Inner,
        exec: AgentExec,
    ) -> Result<BoxStream<'static, Result<ExecChunk, RuntimeError>>, Start> {
        let exec = Arc::new(exec);
        let mut why = String::new();
        // A second try only when the first agent was found gone before it got the
        // request: nothing ran, so nothing runs twice.
        for _ in 0..2 {
            let agent = self.get_or_start(inner).await?;
            match agent.submit(exec.clone()).await {
                Ok(stream) => return Ok(stream),
                Err(e) => {
                    why = e;
                    let mut agents = lock(&self.by_container);
                    if agents
                        .get(&inner.container_id)
                        .is_some_and(|a| Arc::ptr_eq(a, &agent))
                    {
                        agents.remove(&inner.container_id);
                    }
                }
            }
        }
        Err(Start::Failed(why))
    }

    async fn get_or_start(&self, inner: &Inner) -> Result<Arc<Agent>, Start> {
        {
            let mut agents = lock(&self.by_container);
            agents.retain(|_, a| !a.is_dead());
            if let Some(a) = agents.get(&inner.container_id) {
                return Ok(a.clone());
            }
        }
        let agent = Agent::start(inner).await?;
        let mut agents = lock(&self.by_container);
        if let Some(other) = agents.get(&inner.container_id).filter(|a| !a.is_dead()) {
            // Another exec started one meanwhile; ours ends when dropped.
            return Ok(other.clone());
        }
        agents.insert(inner.container_id.clone(), agent.clone());
        tracing::debug!(container = %inner.name, "exec agent started");
        Ok(agent)
    }
}

/// Why the agent path did not take an exec.
#[derive(Debug)]
pub(crate) enum Start {
    /// The engine refused (container gone, ...): the caller's error, as an engine
    /// exec would have had it.
    Engine(RuntimeError),
    /// The agent could not be started or reached: the caller runs the command as an
    /// engine exec (nothing of it ran).
    Failed(String),
}

type Item = Result<ExecChunk, RuntimeError>;

struct Route {
    out: mpsc::UnboundedSender<Item>,
    timed_out: Arc<AtomicBool>,
    finished: Arc<AtomicBool>,
    timer: Option<tokio::task::AbortHandle>,
}

impl Route {
    fn end(self, item: Item) {
        self.finished.store(true, Ordering::SeqCst);
        if let Some(t) = self.timer {
            t.abort();
        }
        let _ = self.out.send(item);
    }
}

#[derive(Default)]
struct Routes {
    by_id: HashMap<u64, Route>,
    dead: bool,
}

type Input = Arc<tokio::sync::Mutex<Pin<Box<dyn AsyncWrite + Send>>>>;

/// One running agent. Dropping the last handle (the pool's and those of execs in
/// flight) closes its stdin, which ends it and its commands.
pub(crate) struct Agent {
    input: Input,
    /// Frames for the writer task (stdin data, kills): sendable without awaiting and
    /// outside a runtime (a stream dropped anywhere still kills its command).
    queue: mpsc::UnboundedSender<Vec<u8>>,
    routes: Arc<Mutex<Routes>>,
    next_id: AtomicU64,
    name: String,
    reader: tokio::task::AbortHandle,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Agent(in {})", self.name)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn frame(req: &Request, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(64 + payload.len());
    // Fails only for frames over the protocol's limits, which the callers' own
    // limits (argv, env, stdin chunks) keep below.
    let _ = protocol::write_frame(&mut bytes, req, payload);
    bytes
}

impl Agent {
    /// Starts the agent as one attached engine exec and waits for its hello.
    async fn start(inner: &Inner) -> Result<Arc<Self>, Start> {
        let exec_id = inner
            .create_exec(vec![INSIDE_PATH.into()], Vec::new(), Some("/".into()), true)
            .await
            .map_err(Start::Engine)?;
        let started = inner
            .docker
            .start_exec(&exec_id, Some(StartExecOptions::default()))
            .await;
        let (mut output, input) = match started {
            Ok(StartExecResults::Attached { output, input }) => (output, input),
            Ok(StartExecResults::Detached) => {
                return Err(Start::Failed(
                    "the engine started the agent detached".into(),
                ))
            }
            Err(e) => return Err(Start::Failed(format!("starting the agent: {e}"))),
        };
        let mut buf = Vec::new();
        let mut stderr = String::new();
        let hello = tokio::time::timeout(HELLO_TIMEOUT, async {
            loop {
                match protocol::take_frame::<Event>(&mut buf) {
                    Ok(Some((ev, _))) => return Ok(ev),
                    Ok(None) => {}
                    Err(e) => return Err(e.to_string()),
                }
                match output.next().await {
                    Some(Ok(LogOutput::StdOut { message } | LogOutput::Console { message })) => {
                        buf.extend_from_slice(&message)
                    }
                    Some(Ok(LogOutput::StdErr { message })) => {
                        stderr.push_str(&String::from_utf8_lossy(&message))
                    }
                    Some(Ok(LogOutput::StdIn { .. })) => {}
                    Some(Err(e)) => return Err(e.to_string()),
                    None => return Err("it ended".into()),
                }
            }
        })
        .await;
        match hello {
            Ok(Ok(Event::Hello { version, .. })) if version == protocol::VERSION => {}
            Ok(Ok(Event::Hello { version, .. })) => {
                return Err(Start::Failed(format!(
                    "the agent speaks protocol {version}, this grove {}",
                    protocol::VERSION
                )))
            }
            Ok(Ok(other)) => return Err(Start::Failed(format!("the agent began with {other:?}"))),
            Ok(Err(why)) => {
                return Err(Start::Failed(format!(
                    "the agent did not start ({why}): {}",
                    crate::one_line(&stderr)
                )))
            }
            Err(_) => {
                return Err(Start::Failed(format!(
                    "the agent did not say hello within {HELLO_TIMEOUT:?}"
                )))
            }
        }
        let routes = Arc::new(Mutex::new(Routes::default()));
        let reader = tokio::spawn(read_events(output, buf, routes.clone(), inner.name.clone()));
        let input: Input = Arc::new(tokio::sync::Mutex::new(input));
        let (queue, mut queued) = mpsc::unbounded_channel::<Vec<u8>>();
        {
            // Ends when the agent's last handle goes (the channel closes).
            let input = input.clone();
            tokio::spawn(async move {
                while let Some(bytes) = queued.recv().await {
                    if !write_frame(&input, &bytes).await {
                        return;
                    }
                }
            });
        }
        Ok(Arc::new(Agent {
            input,
            queue,
            routes,
            next_id: AtomicU64::new(1),
            name: inner.name.clone(),
            reader: reader.abort_handle(),
        }))
    }

    fn is_dead(&self) -> bool {
        lock(&self.routes).dead
    }

    /// Writes a frame now ([`write_frame`]).
    async fn send(&self, bytes: &[u8]) -> bool {
        write_frame(&self.input, bytes).await
    }

    /// Sends the exec; `Err` only when it certainly did not reach the agent (a frame
    /// cut short is refused by the agent as a whole, so it runs nothing).
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
        if !self.send(&frame(&req, b"")).await {
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
            // The timer holds only the queue; the reader aborts it when the exec ends.
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
    agent: Arc<Agent>,
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

/// Writes one frame whole; `false` when it was not (the stream to the agent is broken,
/// and the agent refuses a frame cut short). A failed flush after a whole write counts
/// as written: the agent may have it, and the reader reports the agent's end.
async fn write_frame(input: &Input, bytes: &[u8]) -> bool {
    let mut input = input.lock().await;
    if input.write_all(bytes).await.is_err() {
        return false;
    }
    let _ = input.flush().await;
    true
}

/// Routes the agent's frames until its output ends, then fails every exec still
/// waiting.
async fn read_events(
    mut output: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
    mut buf: Vec<u8>,
    routes: Arc<Mutex<Routes>>,
    name: String,
) {
    'read: loop {
        loop {
            let (ev, payload) = match protocol::take_frame::<Event>(&mut buf) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(container = %name, error = %e, "exec agent sent a bad frame");
                    break 'read;
                }
            };
            route(&routes, ev, payload);
        }
        match output.next().await {
            Some(Ok(LogOutput::StdOut { message } | LogOutput::Console { message })) => {
                buf.extend_from_slice(&message)
            }
            Some(Ok(LogOutput::StdErr { message })) => {
                tracing::warn!(container = %name, stderr = %String::from_utf8_lossy(&message).trim(),
                    "exec agent");
            }
            Some(Ok(LogOutput::StdIn { .. })) => {}
            Some(Err(e)) => {
                tracing::debug!(container = %name, error = %e, "exec agent stream failed");
                break;
            }
            None => break,
        }
    }
    let mut routes = lock(&routes);
    routes.dead = true;
    for (_, route) in routes.by_id.drain() {
        route.end(Err(RuntimeError::Unavailable(
            "the container's exec agent ended while the command ran (the command may \
             have run in part; it was not retried)"
                .into(),
        )));
    }
}

fn route(routes: &Mutex<Routes>, ev: Event, payload: Vec<u8>) {
    match ev {
        Event::Started { .. } | Event::Hello { .. } => {}
        Event::Output { id, stream } => {
            let stream = match stream {
                protocol::Stream::Stdout => StreamKind::Stdout,
                protocol::Stream::Stderr => StreamKind::Stderr,
            };
            if let Some(route) = lock(routes).by_id.get(&id) {
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
            let route = lock(routes).by_id.remove(&id);
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
