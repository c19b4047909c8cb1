//! The client of one running agent, whatever carries its frames: execs multiplexed
//! by id, each exec's frames routed straight into its stream, stdin and kills queued,
//! timeouts as timers that ask for the kill.
//!
//! A runtime supplies the transport: a [`Link`] that writes a frame now (the exec
//! request, whose delivery decides between a retry and an error), a writer that
//! drains the [`Queue`] (stdin data and kills, sendable without awaiting and outside
//! a runtime, so a stream dropped anywhere still kills its command), and a reader
//! that hands every frame to the [`Router`] and [`Router::close`]s it at the end.
//!
//! Nothing runs twice: [`exec`] retries on a fresh agent only when the request could
//! not be written at all; once written, the agent's end fails the exec with
//! [`RuntimeError::Unavailable`] (the command may have run in part).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use grove_core::error::RuntimeError;
use grove_core::ports::{ExecChunk, ExecResult, StreamKind};
use tokio::sync::mpsc;

use super::stream::{ExecStream, Item, Kill};
use crate::protocol::{self, Event, Request};

/// How long a starting agent may take to say hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Stdin is sent in frames of this size.
pub const STDIN_CHUNK: usize = 64 * 1024;

/// One exec as the agent runs it.
#[derive(Debug, Clone)]
pub struct AgentExec {
    pub argv: Vec<String>,
    /// A path as the sandbox sees it.
    pub cwd: String,
    /// The command's complete environment.
    pub env: Vec<(String, String)>,
    pub stdin: Option<Vec<u8>>,
    pub timeout: Option<Duration>,
    pub max_output: usize,
}

/// Frames for the transport's writer (stdin data, kills), in order.
pub type Queue = mpsc::UnboundedSender<Vec<u8>>;

/// The transport's side of a client: writes one frame now.
pub trait Link: Send + Sync + 'static {
    /// Writes `frame` whole; `false` when it certainly did not reach the agent (a
    /// frame cut short is refused by the agent as a whole, so it runs nothing).
    fn write_now(&self, frame: &[u8]) -> impl Future<Output = bool> + Send;
}

/// A request as bytes on the wire.
pub fn frame(req: &Request, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(64 + payload.len());
    // Writing into a Vec fails only for frames over the protocol's limits, which the
    // callers' own limits (argv, env, stdin chunks) keep below.
    let _ = protocol::write_frame(&mut bytes, req, payload);
    bytes
}

/// Checks the agent's first frame: its pid when it is a hello in our version.
pub fn hello(first: Event) -> Result<u32, String> {
    match first {
        Event::Hello { version, pid } if version == protocol::VERSION => Ok(pid),
        Event::Hello { version, .. } => Err(format!(
            "the agent speaks protocol {version}, this grove {}",
            protocol::VERSION
        )),
        other => Err(format!("the agent began with {other:?}")),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where the reader delivers one exec's frames: straight into the consumer's channel
/// (no task in between), with what the result needs to know.
struct Route {
    out: mpsc::UnboundedSender<Item>,
    /// Set by the timer before it asks for the kill.
    timed_out: Arc<AtomicBool>,
    /// Set once the result (or the agent's end) was delivered.
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

/// The execs of one agent in flight, for its reader.
#[derive(Clone, Default)]
pub struct Router(Arc<Mutex<Routes>>);

impl Router {
    /// Delivers one frame of the agent.
    pub fn deliver(&self, ev: Event, payload: Vec<u8>) {
        match ev {
            Event::Started { .. } | Event::Hello { .. } => {}
            Event::Output { id, stream } => {
                let stream = match stream {
                    protocol::Stream::Stdout => StreamKind::Stdout,
                    protocol::Stream::Stderr => StreamKind::Stderr,
                };
                if let Some(route) = lock(&self.0).by_id.get(&id) {
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
                let route = lock(&self.0).by_id.remove(&id);
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

    /// The agent ended: marks it dead and fails every exec still waiting with
    /// `Unavailable(why)`.
    pub fn close(&self, why: &str) {
        let mut routes = lock(&self.0);
        routes.dead = true;
        for (_, route) in routes.by_id.drain() {
            route.end(Err(RuntimeError::Unavailable(why.to_string())));
        }
    }

    /// Whether the agent ended.
    pub fn is_dead(&self) -> bool {
        lock(&self.0).dead
    }

    /// Whether no exec is in flight.
    pub fn idle(&self) -> bool {
        lock(&self.0).by_id.is_empty()
    }
}

/// The host's handle on one running agent. Dropping the last handle (the runtime's
/// and those of execs in flight) drops the link and closes the queue, which the
/// transport takes as the agent's end.
pub struct Client<L> {
    link: L,
    queue: Queue,
    router: Router,
    next_id: AtomicU64,
}

impl<L: std::fmt::Debug> std::fmt::Debug for Client<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Client({:?})", self.link)
    }
}

impl<L: Link> Client<L> {
    /// A client writing through `link` and `queue`, its reader delivering to `router`.
    pub fn new(link: L, queue: Queue, router: Router) -> Self {
        Self {
            link,
            queue,
            router,
            next_id: AtomicU64::new(1),
        }
    }

    pub fn link(&self) -> &L {
        &self.link
    }

    pub fn is_dead(&self) -> bool {
        self.router.is_dead()
    }

    pub fn idle(&self) -> bool {
        self.router.idle()
    }

    /// Sends the exec; `Err` only when it certainly did not reach the agent.
    pub async fn submit(
        self: &Arc<Self>,
        exec: &AgentExec,
    ) -> Result<BoxStream<'static, Item>, String> {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (out, rx) = mpsc::unbounded_channel();
        let timed_out = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicBool::new(false));
        {
            let mut routes = lock(&self.router.0);
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
        if !self.link.write_now(&frame(&req, b"")).await {
            lock(&self.router.0).by_id.remove(&id);
            return Err("the exec request could not be written to the agent".into());
        }
        if let Some(data) = &exec.stdin {
            for chunk in data.chunks(STDIN_CHUNK) {
                let _ = self.queue.send(frame(&Request::Stdin { id }, chunk));
            }
            let _ = self.queue.send(frame(&Request::CloseStdin { id }, b""));
        }
        if let Some(t) = exec.timeout {
            self.arm_timer(id, t, timed_out);
        }
        let kill = ExecKill {
            client: self.clone(),
            id,
            finished,
        };
        Ok(ExecStream::new(rx, kill).boxed())
    }

    /// The timeout of exec `id`: a timer holding only the queue (so a finished exec
    /// leaves nothing behind once the router aborts it).
    fn arm_timer(&self, id: u64, t: Duration, timed_out: Arc<AtomicBool>) {
        let queue = self.queue.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(t).await;
            timed_out.store(true, Ordering::SeqCst);
            let _ = queue.send(frame(&Request::Kill { id }, b""));
        });
        match lock(&self.router.0).by_id.get_mut(&id) {
            Some(route) => route.timer = Some(timer.abort_handle()),
            None => timer.abort(),
        }
    }
}

/// Kills one exec (unless it ended); keeps its agent alive while the exec runs.
struct ExecKill<L> {
    client: Arc<Client<L>>,
    id: u64,
    finished: Arc<AtomicBool>,
}

impl<L: Link> Kill for ExecKill<L> {
    fn kill(&self) {
        if !self.finished.load(Ordering::SeqCst) {
            let _ = self
                .client
                .queue
                .send(frame(&Request::Kill { id: self.id }, b""));
        }
    }
}

/// Runs `exec` on the agent `agent` gives (starting one when needed). A second try
/// only when the first agent was found gone before it got the request (nothing ran,
/// so nothing runs twice); `forget` drops that agent from the caller's pool first.
/// `Err(Ok(e))`: the agent could not be had (`agent`'s error); `Err(Err(why))`: it
/// could not be reached.
pub async fn exec<L, E, A, Fut>(
    exec: AgentExec,
    mut agent: A,
    forget: impl Fn(&Arc<Client<L>>),
) -> Result<BoxStream<'static, Item>, Result<E, String>>
where
    L: Link,
    A: FnMut() -> Fut,
    Fut: Future<Output = Result<Arc<Client<L>>, E>>,
{
    let mut why = String::new();
    for _ in 0..2 {
        let client = agent().await.map_err(Ok)?;
        match client.submit(&exec).await {
            Ok(stream) => return Ok(stream),
            Err(e) => {
                why = e;
                forget(&client);
            }
        }
    }
    Err(Err(why))
}
