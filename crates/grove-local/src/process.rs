//! Running one command: spawn, feed stdin, stream capped output, enforce the timeout,
//! and kill the whole process group on timeout, on drop and at the end.
//!
//! There is one implementation, streaming; `exec` collects the stream. A driver task
//! owns the child so the timeout holds even when the consumer stops polling; the
//! stream and the driver both hold a [`KillOnDrop`] so dropping either before the
//! command ends kills it.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use grove_core::error::RuntimeError;
use grove_core::ports::{ExecChunk, ExecResult, StreamKind};
use grove_sandboxd::host::stream::{Budget, ExecStream, Item, Kill, KillOnDrop};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// After the command ended (or was killed), how long we keep reading its pipes. A
/// leaked descriptor held by some process we could not kill must not hang the caller.
const DRAIN_DEADLINE: Duration = Duration::from_millis(500);

/// How much of stderr is remembered for telling bwrap's own failures apart.
const STDERR_PREFIX: usize = 1024;

const READ_BUF: usize = 64 * 1024;

/// Everything needed to start one process.
pub(crate) struct Launch {
    pub program: OsString,
    pub args: Vec<OsString>,
    /// The complete environment of the spawned process (it starts from empty).
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub stdin: Stdin,
    pub timeout: Option<Duration>,
    pub max_output: usize,
    /// Whether `program` is bwrap (its setup failures become `Unavailable`).
    pub sandboxed: bool,
    /// For bwrap: who runs it, under which seccomp filter, in which cgroup.
    pub jail: Option<JailRun>,
    /// The user's program name, for "command not found" messages.
    pub shown_name: String,
}

/// The jail of one sandboxed launch.
#[derive(Clone)]
pub(crate) struct JailRun {
    pub jail: Arc<crate::jail::Jail>,
    pub cgroup: Option<crate::jail::Cgroup>,
}

/// What the process reads on stdin.
pub(crate) enum Stdin {
    /// `/dev/null`: end of file at once.
    Null,
    /// These bytes, then end of file.
    Bytes(Vec<u8>),
    /// Each item in order as it arrives; end of file when the sender is dropped (an
    /// interactive session).
    Channel(futures::channel::mpsc::UnboundedReceiver<Vec<u8>>),
}

/// The command of `launch` (jailed when it is sandboxed), not yet spawned, and the
/// seccomp program's descriptor to close once it is.
fn command(
    launch: &Launch,
) -> Result<(tokio::process::Command, Option<std::os::fd::OwnedFd>), RuntimeError> {
    let (std_cmd, seccomp_fd) = match &launch.jail {
        Some(j) => {
            let (cmd, fd) = j
                .jail
                .command(&launch.program, &launch.args, j.cgroup.as_ref())
                .map_err(RuntimeError::Unavailable)?;
            (cmd, Some(fd))
        }
        None => {
            let mut cmd = std::process::Command::new(&launch.program);
            cmd.args(&launch.args);
            (cmd, None)
        }
    };
    let mut cmd = tokio::process::Command::from(std_cmd);
    cmd
        // No host variable may reach the command; bwrap itself needs none.
        .env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&launch.cwd)
        .stdin(if matches!(launch.stdin, Stdin::Null) {
            Stdio::null()
        } else {
            Stdio::piped()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so one killpg reaches every process the command forks
        // (with bwrap: bwrap itself, whose death tears down the pid namespace).
        .process_group(0)
        .kill_on_drop(true);
    Ok((cmd, seccomp_fd))
}

/// Starts the process; must be called inside a tokio runtime.
pub(crate) fn start(launch: Launch) -> Result<BoxStream<'static, Item>, RuntimeError> {
    let (mut cmd, seccomp_fd) = command(&launch)?;
    let spawned = cmd.spawn();
    // bwrap has its own copy of the seccomp program's descriptor now.
    drop(seccomp_fd);
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) if launch.sandboxed => {
            return Err(RuntimeError::Unavailable(format!(
                "cannot start bwrap: {e}"
            )));
        }
        Err(e) => return Ok(spawn_failure(&launch, &e)),
    };
    let Some(pid) = child.id() else {
        return Err(RuntimeError::Unavailable(
            "the process exited before it could be tracked".into(),
        ));
    };
    let group = Arc::new(Group {
        pgid: pid as libc::pid_t,
        exited: Mutex::new(false),
        _cgroup: launch.jail.as_ref().and_then(|j| j.cgroup.clone()),
    });

    let (tx, rx) = mpsc::unbounded_channel();
    let budget = Arc::new(Budget::new(launch.max_output));
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let out_reader = tokio::spawn(pump(stdout, StreamKind::Stdout, tx.clone(), budget.clone()));
    let err_reader = tokio::spawn(pump(stderr, StreamKind::Stderr, tx.clone(), budget.clone()));
    let writer = feed_stdin(child.stdin.take(), launch.stdin);

    let driver_guard = KillOnDrop(group.clone());
    let stream_kill = group.clone();
    let (timeout, sandboxed) = (launch.timeout, launch.sandboxed);
    tokio::spawn(async move {
        let _guard = driver_guard;
        let (status, timed_out) = wait(&mut child, &group, timeout).await;
        // Stragglers left in the group (a backgrounded grandchild without bwrap) go
        // too: a command's processes do not outlive it, as inside a pid namespace.
        group.finish();
        if let Some(w) = writer {
            w.abort();
        }
        let out = drain(out_reader).await;
        let err = drain(err_reader).await;

        let status = match status {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(Err(RuntimeError::Unavailable(format!(
                    "waiting for the command failed: {e}"
                ))));
                return;
            }
        };
        let mut result = ExecResult {
            exit_code: exit_code(status),
            stdout: Vec::new(),
            stderr: Vec::new(),
            timed_out,
            truncated: budget.truncated(),
        };
        if sandboxed && !timed_out && result.exit_code == 1 && out.total == 0 {
            match classify_bwrap_failure(&err.prefix) {
                BwrapFailure::None => {}
                BwrapFailure::Exec(code) => result.exit_code = code,
                BwrapFailure::Setup(msg) => {
                    let _ = tx.send(Err(RuntimeError::Unavailable(msg)));
                    return;
                }
            }
        }
        let _ = tx.send(Ok(ExecChunk::Finished(result)));
    });

    Ok(ExecStream::new(rx, stream_kill).boxed())
}

/// Feeds the command's stdin from a task of its own: a command that never reads its
/// stdin must not stall the rest.
fn feed_stdin(
    pipe: Option<tokio::process::ChildStdin>,
    stdin: Stdin,
) -> Option<tokio::task::JoinHandle<()>> {
    match (pipe, stdin) {
        (Some(mut pipe), Stdin::Bytes(bytes)) => Some(tokio::spawn(async move {
            // EPIPE when the command exits without reading is expected and harmless.
            let _ = pipe.write_all(&bytes).await;
            let _ = pipe.shutdown().await;
        })),
        (Some(mut pipe), Stdin::Channel(mut rx)) => Some(tokio::spawn(async move {
            while let Some(bytes) = rx.next().await {
                if pipe.write_all(&bytes).await.is_err() || pipe.flush().await.is_err() {
                    return;
                }
            }
            let _ = pipe.shutdown().await;
        })),
        _ => None,
    }
}

/// Waits for the child, killing its group when the timeout passes first.
async fn wait(
    child: &mut tokio::process::Child,
    group: &Group,
    timeout: Option<Duration>,
) -> (std::io::Result<ExitStatus>, bool) {
    let Some(timeout) = timeout else {
        return (child.wait().await, false);
    };
    tokio::select! {
        status = child.wait() => (status, false),
        _ = tokio::time::sleep(timeout) => {
            group.kill();
            (child.wait().await, true)
        }
    }
}

/// The exit status as a shell reports it: the code, or 128 + the killing signal.
fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// What a reader saw of one pipe.
#[derive(Default)]
struct PipeSummary {
    /// Bytes read, kept or not.
    total: u64,
    /// The first bytes read, kept or not.
    prefix: Vec<u8>,
}

/// Reads a pipe to its end, forwarding what fits in the budget and dropping the rest:
/// reading on past the cap keeps the command from blocking on a full pipe.
async fn pump<R: AsyncRead + Unpin>(
    mut pipe: R,
    stream: StreamKind,
    tx: mpsc::UnboundedSender<Item>,
    budget: Arc<Budget>,
) -> PipeSummary {
    let mut summary = PipeSummary::default();
    let mut buf = vec![0u8; READ_BUF];
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        summary.total += n as u64;
        if summary.prefix.len() < STDERR_PREFIX {
            let room = STDERR_PREFIX - summary.prefix.len();
            summary.prefix.extend_from_slice(&buf[..n.min(room)]);
        }
        let keep = budget.take(n);
        if keep > 0 {
            // A dropped receiver only means nobody listens any more; keep draining.
            let _ = tx.send(Ok(ExecChunk::Output {
                stream,
                data: buf[..keep].to_vec(),
            }));
        }
    }
    summary
}

/// Waits for a reader, giving up after [`DRAIN_DEADLINE`].
async fn drain(reader: JoinHandle<PipeSummary>) -> PipeSummary {
    let abort = reader.abort_handle();
    match tokio::time::timeout(DRAIN_DEADLINE, reader).await {
        Ok(Ok(summary)) => summary,
        Ok(Err(_)) => PipeSummary::default(),
        Err(_) => {
            abort.abort();
            tracing::warn!("command output still open after the command ended; stopped reading");
            PipeSummary::default()
        }
    }
}

enum BwrapFailure {
    /// Not bwrap's doing: a normal exit 1 of the command.
    None,
    /// bwrap could not exec the program: report it as a shell would (127 not found,
    /// 126 otherwise), a failed command rather than a broken runtime.
    Exec(i32),
    /// bwrap failed to set the sandbox up.
    Setup(String),
}

/// Best effort: bwrap reports its own errors as `bwrap: ...` on stderr with exit 1,
/// before the command ran (so nothing reached stdout). A command that itself exits 1
/// with such a stderr would be misread; that is the accepted cost.
fn classify_bwrap_failure(stderr_prefix: &[u8]) -> BwrapFailure {
    if !stderr_prefix.starts_with(b"bwrap:") {
        return BwrapFailure::None;
    }
    let text = String::from_utf8_lossy(stderr_prefix);
    let line = text.lines().next().unwrap_or("").trim().to_string();
    if line.starts_with("bwrap: execvp ") {
        let not_found = line.ends_with("No such file or directory");
        return BwrapFailure::Exec(if not_found { 127 } else { 126 });
    }
    BwrapFailure::Setup(format!("sandbox setup failed: {line}"))
}

/// A direct spawn that failed: reported like a shell would, as a failed command.
fn spawn_failure(launch: &Launch, e: &std::io::Error) -> BoxStream<'static, Item> {
    let (code, what) = match e.kind() {
        std::io::ErrorKind::NotFound => (127, "command not found".to_string()),
        _ => (126, e.to_string()),
    };
    let mut msg = format!("grove: {}: {what}\n", launch.shown_name).into_bytes();
    let truncated = msg.len() > launch.max_output;
    msg.truncate(launch.max_output);
    let mut items = Vec::new();
    if !msg.is_empty() {
        items.push(Ok(ExecChunk::Output {
            stream: StreamKind::Stderr,
            data: msg,
        }));
    }
    items.push(Ok(ExecChunk::Finished(ExecResult {
        exit_code: code,
        truncated,
        ..ExecResult::default()
    })));
    futures::stream::iter(items).boxed()
}

/// The process group of one command.
struct Group {
    pgid: libc::pid_t,
    /// Set once the leader was reaped and the group killed; after that the pgid may
    /// be reused by an unrelated process, so it is never signalled again.
    exited: Mutex<bool>,
    /// The command's cgroup, held while the command's stream or driver lives, so its
    /// directories are not removed under it.
    _cgroup: Option<crate::jail::Cgroup>,
}

impl Kill for Group {
    fn kill(&self) {
        let exited = self.exited.lock().unwrap_or_else(|e| e.into_inner());
        if !*exited {
            self.signal();
        }
    }
}

impl Group {
    /// Kills what is left of the group and retires the pgid.
    fn finish(&self) {
        let mut exited = self.exited.lock().unwrap_or_else(|e| e.into_inner());
        if !*exited {
            // Right after reaping, the pgid is still pinned by any surviving member,
            // so this reaches only our stragglers (or nobody, ESRCH).
            self.signal();
            *exited = true;
        }
    }

    fn signal(&self) {
        // SAFETY: killpg has no memory-safety preconditions; an error (ESRCH when the
        // group is already gone) is the expected outcome of a late kill.
        unsafe {
            libc::killpg(self.pgid, libc::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bwrap_messages_are_told_apart_from_exec_failures_and_command_output() {
        assert!(matches!(
            classify_bwrap_failure(b"bwrap: execvp nope: No such file or directory\n"),
            BwrapFailure::Exec(127)
        ));
        assert!(matches!(
            classify_bwrap_failure(b"bwrap: Can't find source path /x: No such file\n"),
            BwrapFailure::Setup(_)
        ));
        assert!(matches!(
            classify_bwrap_failure(b"error: nope\n"),
            BwrapFailure::None
        ));
    }
}
