//! Execs through the exec agent (`grove-sandboxd`, ADR 18) inside a container: one
//! long-lived attached engine exec per container runs the agent, and every command is
//! then one request frame on its stdin and a few event frames back, instead of an
//! engine exec of its own. The client itself (routing, stdin, timeouts, kills) is
//! `grove_sandboxd::host::client`; this module is its transport and the pool.
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
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use bollard::container::LogOutput;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::Docker;
use futures::stream::{BoxStream, Stream, StreamExt};
use grove_core::error::RuntimeError;
use grove_core::ports::ExecChunk;
use grove_sandboxd::host::client::{self, Client, Link, Router, HELLO_TIMEOUT};
use grove_sandboxd::protocol::{self, Event};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

pub(crate) use grove_sandboxd::host::client::AgentExec;

/// Environment variable naming a statically linked `grove-sandboxd` for containers;
/// unset, empty or `off`: no agent (every command is an engine exec).
pub const AGENT_ENV: &str = "GROVE_DOCKER_SANDBOXD";

/// Where the agent binary appears (read-only) inside every container.
pub const INSIDE_PATH: &str = "/run/.grove-sandboxd";

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

/// The container an agent runs in, as the pool needs it (the runtime's shared state
/// implements it).
pub(crate) trait Host: Sync {
    fn docker(&self) -> &Docker;
    fn container_id(&self) -> &str;
    fn container_name(&self) -> &str;
    /// Creates the engine exec that runs the agent at [`INSIDE_PATH`], attached (the
    /// container started first when it is not running).
    fn agent_exec(&self) -> impl Future<Output = Result<String, RuntimeError>> + Send;
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

/// One running agent.
type Agent = Client<Attached>;

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
            .retain(|id, a| id != container && a.link().name.trim_start_matches('/') != container);
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
        host: &impl Host,
        exec: AgentExec,
    ) -> Result<BoxStream<'static, Result<ExecChunk, RuntimeError>>, Start> {
        let forget = |agent: &Arc<Agent>| {
            let mut agents = lock(&self.by_container);
            if agents
                .get(host.container_id())
                .is_some_and(|a| Arc::ptr_eq(a, agent))
            {
                agents.remove(host.container_id());
            }
        };
        client::exec(exec, || self.get_or_start(host), forget)
            .await
            .map_err(|e| e.unwrap_or_else(Start::Failed))
    }

    async fn get_or_start(&self, host: &impl Host) -> Result<Arc<Agent>, Start> {
        {
            let mut agents = lock(&self.by_container);
            agents.retain(|_, a| !a.is_dead());
            if let Some(a) = agents.get(host.container_id()) {
                return Ok(a.clone());
            }
        }
        let agent = start(host).await?;
        let mut agents = lock(&self.by_container);
        if let Some(other) = agents.get(host.container_id()).filter(|a| !a.is_dead()) {
            // Another exec started one meanwhile; ours ends when dropped.
            return Ok(other.clone());
        }
        agents.insert(host.container_id().to_string(), agent.clone());
        tracing::debug!(container = %host.container_name(), "exec agent started");
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

type Input = Arc<tokio::sync::Mutex<Pin<Box<dyn AsyncWrite + Send>>>>;
type Output = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

/// The transport of one agent: the attached exec's stdin, and its reader task (which
/// ends with the last handle on the agent).
pub(crate) struct Attached {
    input: Input,
    name: String,
    reader: tokio::task::AbortHandle,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Agent(in {})", self.name)
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Link for Attached {
    async fn write_now(&self, frame: &[u8]) -> bool {
        write_frame(&self.input, frame).await
    }
}

/// Starts the agent as one attached engine exec, waits for its hello, and starts
/// its reader and writer tasks.
async fn start(host: &impl Host) -> Result<Arc<Agent>, Start> {
    let exec_id = host.agent_exec().await.map_err(Start::Engine)?;
    let started = host
        .docker()
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
    wait_hello(&mut output, &mut buf).await?;
    let name = host.container_name().to_string();
    let router = Router::default();
    let reader = tokio::spawn(read_events(output, buf, router.clone(), name.clone()));
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
    let link = Attached {
        input,
        name,
        reader: reader.abort_handle(),
    };
    Ok(Arc::new(Client::new(link, queue, router)))
}

/// Reads the agent's output up to its first frame, which must be a hello in our
/// version; what follows it stays in `buf`.
async fn wait_hello(output: &mut Output, buf: &mut Vec<u8>) -> Result<(), Start> {
    let mut stderr = String::new();
    let hello = tokio::time::timeout(HELLO_TIMEOUT, async {
        loop {
            match protocol::take_frame::<Event>(buf) {
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
        Ok(Ok(first)) => client::hello(first).map(drop).map_err(Start::Failed),
        Ok(Err(why)) => Err(Start::Failed(format!(
            "the agent did not start ({why}): {}",
            crate::one_line(&stderr)
        ))),
        Err(_) => Err(Start::Failed(format!(
            "the agent did not say hello within {HELLO_TIMEOUT:?}"
        ))),
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
async fn read_events(mut output: Output, mut buf: Vec<u8>, router: Router, name: String) {
    'read: loop {
        loop {
            match protocol::take_frame::<Event>(&mut buf) {
                Ok(Some((ev, payload))) => router.deliver(ev, payload),
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(container = %name, error = %e, "exec agent sent a bad frame");
                    break 'read;
                }
            }
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
    router.close(
        "the container's exec agent ended while the command ran (the command may \
         have run in part; it was not retried)",
    );
}
