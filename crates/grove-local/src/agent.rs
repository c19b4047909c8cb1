//! Execs through the in-sandbox agent (`grove-sandboxd`): one agent per sandbox view,
//! started inside bubblewrap once and reused by every exec with the same view.
//!
//! A sandbox view is the whole bwrap prefix (mounts with their writability, hidden
//! dirs, network) plus the identity of the mounted directories, so a read command of a
//! writable workspace still runs in a view where the workspace is read-only: it gets
//! the read-only view's agent, not the writable one's.
//!
//! The client itself (routing, stdin, timeouts, kills) is
//! `grove_sandboxd::host::client`; this module is its transport (a process's pipes)
//! and the pool. Each agent is served by two host threads: the owner, which spawns bwrap (so
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
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use futures::stream::BoxStream;
use grove_core::error::RuntimeError;
use grove_core::ports::ExecChunk;
use grove_sandboxd::host::client::{self, Client, Link, Router, HELLO_TIMEOUT};
use grove_sandboxd::protocol::{self, Event};
use tokio::sync::mpsc;

pub(crate) use grove_sandboxd::host::client::AgentExec;

/// Environment variable naming the agent binary; empty or `off` turns the agent off.
pub const AGENT_ENV: &str = "GROVE_SANDBOXD";

/// The agent binary's file name, looked for next to the running executable.
pub const AGENT_FILE: &str = "grove-sandboxd";

/// Where the agent binary is bind-mounted (read-only) inside the sandbox, in a
/// directory the sandbox covers with a tmpfs anyway.
const INSIDE_DIRS: &[&str] = &["/run", "/tmp"];
const INSIDE_NAME: &str = ".grove-sandboxd";

/// An agent nobody used for this long is stopped (on the next lookup).
const IDLE: Duration = Duration::from_secs(300);

/// At most this many agents live at once; the least recently used idle ones go first.
const MAX_AGENTS: usize = 32;

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
        self.lock().retain(|_, a| a.link().backend_id != backend_id);
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
        let forget = |agent: &Arc<AgentProc>| {
            let mut agents = self.lock();
            if agents.get(key).is_some_and(|a| Arc::ptr_eq(a, agent)) {
                agents.remove(key);
            }
        };
        let start = || self.get_or_start(key, bwrap, backend_id, cgroup);
        client::exec(exec, start, forget)
            .await
            .map_err(|e| e.unwrap_or_else(NotTaken))
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
            let stale = |a: &AgentProc| a.is_dead() || (a.idle() && a.link().last_used(now) > IDLE);
            agents.retain(|_, a| !stale(a));
            if let Some(a) = agents.get(key) {
                a.link().touch();
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
        let agent = start(cmd, seccomp_fd, backend_id.to_string(), cgroup.cloned())
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
                .max_by_key(|(_, a)| a.link().last_used(now))
                .map(|(k, _)| k.clone())
            {
                agents.remove(&oldest);
            }
        }
        agents.insert(key.clone(), agent.clone());
        tracing::debug!(backend_id, pid = agent.link().pid, "exec agent started");
        Ok(agent)
    }
}

/// The agent's stdin, shared by the callers (an exec request is written at once) and
/// the owner thread (stdin data and kills, queued so no async code blocks on them).
type Input = Arc<Mutex<Option<ChildStdin>>>;

/// The host's handle on one running agent. Dropping the last handle (the pool's, and
/// those held by execs in flight) stops it.
pub(crate) type AgentProc = Client<Piped>;

/// The transport of one agent: its stdin pipe, and what the pool knows of it.
pub(crate) struct Piped {
    input: Input,
    last_used: Mutex<Instant>,
    backend_id: String,
    pid: u32,
}

impl std::fmt::Debug for Piped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AgentProc(pid {} of {})", self.pid, self.backend_id)
    }
}

impl Link for Piped {
    /// Written here and now (a small frame into a pipe the agent always drains):
    /// whether it reached the pipe decides between a retry and an error.
    async fn write_now(&self, frame: &[u8]) -> bool {
        let mut input = lock(&self.input);
        match input.as_mut() {
            Some(pipe) => pipe.write_all(frame).and_then(|()| pipe.flush()).is_ok(),
            None => false,
        }
    }
}

impl Piped {
    fn touch(&self) {
        *lock(&self.last_used) = Instant::now();
    }

    fn last_used(&self, now: Instant) -> Duration {
        now.saturating_duration_since(*lock(&self.last_used))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Spawns `cmd` (bwrap around the agent, jailed) and waits for its hello.
async fn start(
    cmd: Command,
    seccomp_fd: std::os::fd::OwnedFd,
    backend_id: String,
    cgroup: Option<crate::jail::Cgroup>,
) -> Result<Arc<AgentProc>, String> {
    let (ready_tx, ready_rx) = oneshot::channel::<Result<u32, String>>();
    let (queue, rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let router = Router::default();
    let input: Input = Arc::new(Mutex::new(None));
    {
        let (router, input) = (router.clone(), input.clone());
        std::thread::Builder::new()
            .name("grove-sandboxd".into())
            .spawn(move || owner(cmd, seccomp_fd, rx, ready_tx, router, input, cgroup))
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
    let link = Piped {
        input,
        last_used: Mutex::new(Instant::now()),
        backend_id,
        pid,
    };
    Ok(Arc::new(Client::new(link, queue, router)))
}

/// The owner thread: spawns bwrap, starts the reader, writes queued frames until the
/// last handle is dropped, then kills the agent's process group and reaps it (and
/// lets go of its cgroup).
fn owner(
    mut cmd: Command,
    seccomp_fd: std::os::fd::OwnedFd,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
    ready: oneshot::Sender<Result<u32, String>>,
    router: Router,
    input: Input,
    // Held until the agent is reaped: the last handle removes the cgroup.
    _cgroup: Option<crate::jail::Cgroup>,
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
        let _ = std::thread::Builder::new()
            .name("grove-sandboxd-read".into())
            .spawn(move || reader(output, ready, router, first_err));
    }
    while let Some(bytes) = rx.blocking_recv() {
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
    router: Router,
    first_err: Arc<Mutex<String>>,
) {
    let mut output = BufReader::new(output);
    let started = match protocol::read_frame::<_, Event>(&mut output) {
        Ok(Some((first, _))) => client::hello(first),
        Ok(None) => Err(start_failure("it ended", &first_err)),
        Err(e) => Err(start_failure(&e.to_string(), &first_err)),
    };
    let ok = started.is_ok();
    let _ = ready.send(started);
    if ok {
        loop {
            match protocol::read_frame::<_, Event>(&mut output) {
                Ok(Some((ev, payload))) => router.deliver(ev, payload),
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "exec agent sent a bad frame; stopping it");
                    break;
                }
            }
        }
    }
    router.close(
        "the sandbox's exec agent ended while the command ran (the command may have \
         run in part; it was not retried)",
    );
}

/// Why the agent did not start, with bwrap's message (on stderr).
fn start_failure(why: &str, first_err: &Mutex<String>) -> String {
    // Give bwrap's message a moment to arrive.
    std::thread::sleep(Duration::from_millis(20));
    let msg = lock(first_err).clone();
    format!("the agent did not start ({why}): {}", msg.trim())
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
