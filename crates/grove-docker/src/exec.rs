//! One command as a Docker exec: create, attach, feed stdin, stream capped output,
//! enforce the timeout, kill the process tree on timeout, on drop and (stragglers) at
//! the end, and classify resource-limit deaths.
//!
//! As in the local runtime there is one implementation, streaming; `exec` collects the
//! stream. A driver task owns the exec so the timeout holds even when the consumer
//! stops polling; the stream and the driver both hold a [`KillOnDrop`].

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{StartExecOptions, StartExecResults};
use futures::stream::{BoxStream, Stream, StreamExt};
use grove_core::error::RuntimeError;
use grove_core::ports::{ExecChunk, ExecResult, StreamKind};
use grove_sandboxd::host::stream::{self, Budget, ExecStream, Item, Kill as _, KillOnDrop};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::host::{self, Counters, Kill};
use crate::inner::Inner;
use crate::{engine_error, one_line, status};

/// How many inspects may say "not running, no exit code, no pid" before that is
/// taken as the end (about two seconds at the 20 ms poll).
const MAX_UNSTARTED_ANSWERS: u32 = 100;
/// After the command ended, how long output may stay silent (counted from the end or
/// the last output, whichever is later) before we stop reading (a descriptor held by a
/// process we could not kill must not hang the caller)...
const DRAIN_IDLE: Duration = Duration::from_millis(500);
/// ...and how long we read at most.
const DRAIN_MAX: Duration = Duration::from_secs(5);
/// After a kill, how long we wait for the engine to report the exec's end.
const KILL_GRACE: Duration = Duration::from_secs(5);

/// One prepared command.
pub(crate) struct Plan {
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: String,
    pub stdin: Stdin,
    pub timeout: Option<Duration>,
    pub max_output: usize,
}

/// What the command reads on stdin.
pub(crate) enum Stdin {
    /// Nothing attached: end of file at once.
    Null,
    /// These bytes, then end of file.
    Bytes(Vec<u8>),
    /// Each item in order as it arrives; end of file when the sender is dropped (an
    /// interactive session).
    Channel(futures::channel::mpsc::UnboundedReceiver<Vec<u8>>),
}

/// Starts the command; must be called inside a tokio runtime.
pub(crate) async fn start(
    inner: Arc<Inner>,
    plan: Plan,
) -> Result<BoxStream<'static, Item>, RuntimeError> {
    // A read-only runtime's command starts on emptied scratch directories.
    if !inner.workdir_writable {
        let mut env = inner.env.clone();
        for kv in &plan.env {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            env.push((k.to_string(), v.to_string()));
        }
        crate::fresh::reset(&inner, &env).await?;
    }
    let deadline = plan.timeout.map(|t| Instant::now() + t);
    // Counters before: from the host (cheap), else from inside (one extra exec).
    let before = if inner.sees_host() {
        inner.host_counters().map(Before::Host)
    } else {
        inner.counters_inside().await.map(Before::Inside)
    };
    if let Some(stream) = by_agent(&inner, &plan).await? {
        return Ok(with_limits(inner, before, stream));
    }
    by_engine(inner, plan, before, deadline).await
}

/// Runs the command through the container's agent; `None` when there is none, or it
/// could not take the command (an engine exec runs it then).
async fn by_agent(
    inner: &Inner,
    plan: &Plan,
) -> Result<Option<BoxStream<'static, Item>>, RuntimeError> {
    let Some(pool) = inner.agents.clone() else {
        return Ok(None);
    };
    if matches!(plan.stdin, Stdin::Channel(_)) {
        return Ok(None);
    }
    let mut env = inner.env.clone();
    for kv in &plan.env {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        env.retain(|(key, _)| key != k);
        env.push((k.to_string(), v.to_string()));
    }
    let exec = crate::agent::AgentExec {
        argv: plan.argv.clone(),
        cwd: plan.working_dir.clone(),
        env,
        stdin: match &plan.stdin {
            Stdin::Bytes(b) => Some(b.clone()),
            _ => None,
        },
        timeout: plan.timeout,
        max_output: plan.max_output,
    };
    match pool.exec(inner, exec).await {
        Ok(stream) => Ok(Some(stream)),
        Err(crate::agent::Start::Engine(e)) => Err(e),
        Err(crate::agent::Start::Failed(why)) => {
            tracing::warn!(container = %inner.name, reason = %why,
                "exec agent unavailable; running the command as an engine exec");
            Ok(None)
        }
    }
}

/// Runs the command as an engine exec of its own, driven by a task.
async fn by_engine(
    inner: Arc<Inner>,
    plan: Plan,
    before: Option<Before>,
    deadline: Option<Instant>,
) -> Result<BoxStream<'static, Item>, RuntimeError> {
    let shown = plan.argv[0].clone();
    let shown_name = shown.clone();
    let exec_id = inner
        .create_exec(
            plan.argv,
            plan.env,
            Some(plan.working_dir),
            !matches!(plan.stdin, Stdin::Null),
        )
        .await?;
    let started = inner
        .docker
        .start_exec(&exec_id, Some(StartExecOptions::default()))
        .await;
    let (output, input) = match started {
        Ok(StartExecResults::Attached { output, input }) => (output, input),
        Ok(StartExecResults::Detached) => {
            return Err(RuntimeError::Unavailable(
                "the engine started the exec detached".into(),
            ))
        }
        Err(e) => {
            let msg = one_line(&e.to_string());
            if is_exec_failure(&msg) {
                return Ok(exec_failure_stream(&shown, &msg, plan.max_output));
            }
            return Err(engine_error("starting the exec", &e));
        }
    };

    let writer = feed_stdin(plan.stdin, input);

    let tracker = Arc::new(Tracker {
        inner: inner.clone(),
        state: Mutex::new(TrackState::default()),
    });
    let (tx, rx) = mpsc::unbounded_channel();
    let driver_guard = KillOnDrop(tracker.clone());
    let stream_kill = tracker.clone();
    let budget = Budget::new(plan.max_output);
    tokio::spawn(async move {
        let _guard = driver_guard;
        let outcome = drive(&inner, &exec_id, output, &tracker, &tx, &budget, deadline).await;
        let shown = shown_name;
        tracker.finish();
        if let Some(w) = writer {
            w.abort();
        }
        let item = match outcome {
            Err(e) => Err(e),
            Ok((exit_code, timed_out, held)) => {
                let mut result = ExecResult {
                    exit_code,
                    stdout: Vec::new(),
                    stderr: Vec::new(),
                    timed_out,
                    truncated: budget.truncated(),
                };
                if let Some(held) = held {
                    pass_on_held(&mut result, &held, &shown, &tx, &budget);
                }
                finished(&inner, before, result).await
            }
        };
        let _ = tx.send(item);
    });

    Ok(ExecStream::new(rx, stream_kill).boxed())
}

/// The result, unless the command hit a limit: that is a `ResourceLimit` error
/// (and the container, if the limit took it down, is started again).
async fn finished(inner: &Inner, before: Option<Before>, result: ExecResult) -> Item {
    match limit_hit(inner, before, Some(result.exit_code)).await {
        Some(e) => {
            if let Err(why) = inner.ensure_running().await {
                tracing::warn!(container = %inner.name, error = %why,
                    "container not running after a resource limit was hit");
            }
            Err(e)
        }
        None => Ok(ExecChunk::Finished(result)),
    }
}

/// Feeds the exec's stdin from a task of its own (a command that never reads its
/// stdin must not stall the rest).
fn feed_stdin(
    stdin: Stdin,
    mut input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
) -> Option<tokio::task::JoinHandle<()>> {
    match stdin {
        Stdin::Null => None,
        Stdin::Bytes(bytes) => Some(tokio::spawn(async move {
            // A command that exits without reading its stdin makes this fail; harmless.
            let _ = input.write_all(&bytes).await;
            let _ = input.shutdown().await;
        })),
        Stdin::Channel(mut rx) => Some(tokio::spawn(async move {
            while let Some(bytes) = rx.next().await {
                if input.write_all(&bytes).await.is_err() || input.flush().await.is_err() {
                    return;
                }
            }
            let _ = input.shutdown().await;
        })),
    }
}

/// The engine's own message, held back from the stream (`drive`): when the engine
/// could not start the program, reported as a shell does, on stderr; else the
/// program's output, passed on.
fn pass_on_held(
    result: &mut ExecResult,
    held: &[u8],
    shown: &str,
    tx: &mpsc::UnboundedSender<Item>,
    budget: &Budget,
) {
    let msg = String::from_utf8_lossy(held).into_owned();
    if result.exit_code == 126 || result.exit_code == 127 {
        // The engine could not start the program (its message came on stdout).
        let not_found = msg.contains("not found") || msg.contains("no such file");
        result.exit_code = if not_found { 127 } else { 126 };
        let what = if not_found {
            "command not found".to_string()
        } else {
            one_line(&msg)
        };
        let line = format!("grove: {shown}: {what}\n").into_bytes();
        send_capped(tx, budget, StreamKind::Stderr, &line);
    } else {
        // The program itself printed it: pass it on.
        send_capped(tx, budget, StreamKind::Stdout, held);
    }
    result.truncated = budget.truncated();
}

#[derive(Clone, Copy)]
enum Before {
    Host(Counters),
    Inside(Counters),
}

/// An agent's exec stream with the limit check at its end: a result (or the agent's
/// death) during which a limit was hit becomes [`RuntimeError::ResourceLimit`].
fn with_limits(
    inner: Arc<Inner>,
    before: Option<Before>,
    stream: BoxStream<'static, Item>,
) -> BoxStream<'static, Item> {
    futures::stream::unfold(Some((stream, inner, before)), |state| async move {
        let (mut stream, inner, before) = state?;
        let item = stream.next().await?;
        let code = match &item {
            Ok(ExecChunk::Finished(r)) => Some(r.exit_code),
            Err(RuntimeError::Unavailable(_)) => None,
            _ => return Some((item, Some((stream, inner, before)))),
        };
        let item = match limit_hit(&inner, before, code).await {
            Some(e) => {
                if let Err(why) = inner.ensure_running().await {
                    tracing::warn!(container = %inner.name, error = %why,
                        "container not running after a resource limit was hit");
                }
                Err(e)
            }
            None => item,
        };
        Some((item, None))
    })
    .boxed()
}

/// A [`RuntimeError::ResourceLimit`] if the command's run saw the OOM killer or a
/// refused fork. `code`: the command's exit code, when it has one.
async fn limit_hit(
    inner: &Inner,
    before: Option<Before>,
    code: Option<i32>,
) -> Option<RuntimeError> {
    let code = code.map_or_else(|| "none".to_string(), |c| c.to_string());
    let (before, after) = match before? {
        Before::Host(b) => (b, inner.host_counters()?),
        // A command that hit the pids limit may still exit 0 (its shell shrugs off
        // the failed forks), so the counters are read after every command.
        Before::Inside(b) => (b, inner.counters_inside().await?),
    };
    if after.oom_kills > before.oom_kills {
        return Some(RuntimeError::ResourceLimit(format!(
            "out of memory: the OOM killer ended the command (memory limit {} MiB, exit code {})",
            inner.memory_mb, code
        )));
    }
    if after.pids_max > before.pids_max {
        return Some(RuntimeError::ResourceLimit(format!(
            "process limit reached: the command could not fork beyond the limit of {} \
             processes (exit code {})",
            inner.pids, code
        )));
    }
    None
}

/// What the driver knows about one exec while it runs: output read, the engine's
/// answers, the timeout's kill. Each event updates it; [`Drive::done`] says when to stop.
struct Drive<'a> {
    inner: &'a Inner,
    tracker: &'a Tracker,
    first: bool,
    held: Option<bytes::Bytes>,
    eof: bool,
    exit: Option<i64>,
    timed_out: bool,
    killed_at: Option<Instant>,
    exited_at: Option<Instant>,
    last_data: Instant,
    pid_known: bool,
    /// The engine can answer an inspect made just after the start with `Running: false`
    /// and no exit code, before the process exists: that is "not yet", not an end.
    unstarted_answers: u32,
    poll_delay: Duration,
    next_poll: Instant,
}

/// Whether reading may stop `now`, the command having ended at `exited_at` with its
/// output still open: after [`DRAIN_MAX`], or after [`DRAIN_IDLE`] of silence counted
/// from the end at the earliest (output written just before the end may still be on its
/// way through the engine).
fn drained(exited_at: Instant, last_data: Instant, now: Instant) -> bool {
    now.duration_since(exited_at) > DRAIN_MAX
        || now.duration_since(last_data.max(exited_at)) > DRAIN_IDLE
}

/// Whether the driver goes on reading.
enum Flow {
    Continue,
    Stop,
}

impl<'a> Drive<'a> {
    fn new(inner: &'a Inner, tracker: &'a Tracker) -> Self {
        Self {
            inner,
            tracker,
            first: true,
            held: None,
            eof: false,
            exit: None,
            timed_out: false,
            killed_at: None,
            exited_at: None,
            last_data: Instant::now(),
            pid_known: false,
            unstarted_answers: 0,
            poll_delay: Duration::from_millis(2),
            next_poll: Instant::now(),
        }
    }

    /// Whether reading is over: output and exit both known, output held open too long
    /// after the end, or the engine silent too long after a kill.
    fn done(&mut self) -> bool {
        if self.eof && self.exit.is_some() {
            return true;
        }
        if let Some(at) = self.exited_at {
            if drained(at, self.last_data, Instant::now()) {
                tracing::warn!(container = %self.inner.name,
                    "command output still open after the command ended; stopped reading");
                return true;
            }
        }
        if let Some(at) = self.killed_at {
            if self.exit.is_none() && at.elapsed() > KILL_GRACE {
                tracing::warn!(container = %self.inner.name, "the engine did not report the killed exec's end");
                self.exit = Some(137);
                return true;
            }
        }
        false
    }

    /// When to look at the clocks of [`Self::done`] again while draining.
    fn drain_tick(&self, far: Instant) -> Instant {
        if self.exited_at.is_some() || self.killed_at.is_some() {
            Instant::now() + Duration::from_millis(50)
        } else {
            far
        }
    }

    /// One item of the output stream (`None`: its end).
    fn on_output(
        &mut self,
        item: Option<Result<LogOutput, bollard::errors::Error>>,
        tx: &mpsc::UnboundedSender<Item>,
        budget: &Budget,
    ) {
        let log = match item {
            Some(Ok(log)) => log,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "exec output stream failed");
                self.eof = true;
                return;
            }
            None => {
                self.eof = true;
                self.poll_delay = Duration::from_millis(1);
                self.next_poll = Instant::now();
                return;
            }
        };
        let (stream, data) = match log {
            LogOutput::StdErr { message } => (StreamKind::Stderr, message),
            LogOutput::StdOut { message } | LogOutput::Console { message } => {
                (StreamKind::Stdout, message)
            }
            LogOutput::StdIn { .. } => return,
        };
        self.last_data = Instant::now();
        if std::mem::take(&mut self.first)
            && stream == StreamKind::Stdout
            && is_exec_failure(&String::from_utf8_lossy(&data[..data.len().min(512)]))
        {
            self.held = Some(data);
            return;
        }
        send_capped(tx, budget, stream, &data);
    }

    /// Asks the engine about the exec: its pid once known, its end, the next poll.
    async fn poll(&mut self, exec_id: &str) -> Result<Flow, RuntimeError> {
        let r = match self.inner.docker.inspect_exec(exec_id).await {
            Ok(r) => r,
            // Killed at its timeout, by a container restart where the host could
            // not kill it: the engine may then forget the exec (404) or refuse
            // while the container restarts (409). Either way the command is over.
            Err(e) if self.timed_out => {
                tracing::debug!(container = %self.inner.name, error = %e,
                    "the timed-out exec is gone from the engine; it ended with the kill");
                self.exit = Some(137);
                return Ok(Flow::Stop);
            }
            Err(e) if status(&e) == Some(404) => {
                return Err(RuntimeError::NotFound(format!(
                    "the exec in container {} vanished",
                    self.inner.name
                )));
            }
            Err(e) => return Err(engine_error("inspecting the exec", &e)),
        };
        if !self.pid_known {
            if let Some(pid) = r.pid.filter(|p| *p > 0) {
                self.pid_known = true;
                self.tracker.set_pid(pid as u32);
            }
        }
        let not_yet = r.running == Some(false)
            && r.exit_code.is_none()
            && !self.pid_known
            && self.unstarted_answers < MAX_UNSTARTED_ANSWERS;
        if not_yet {
            self.unstarted_answers += 1;
            self.poll_delay = Duration::from_millis(20);
        } else if r.running == Some(false) {
            self.on_exit(r.exit_code.unwrap_or(-1));
            return Ok(Flow::Continue);
        } else {
            let cap = if self.eof || !self.pid_known {
                Duration::from_millis(20)
            } else {
                Duration::from_millis(250)
            };
            self.poll_delay = (self.poll_delay * 2).min(cap);
        }
        self.next_poll = Instant::now() + self.poll_delay;
        Ok(Flow::Continue)
    }

    /// The engine reported the end: background processes that hold the output open go
    /// with the command.
    fn on_exit(&mut self, code: i64) {
        if !self.pid_known {
            self.pid_known = true;
            self.tracker.set_pid(0);
        }
        self.exit = Some(code);
        if !self.eof {
            self.exited_at = Some(Instant::now());
            self.tracker.kill_stragglers();
        }
    }

    /// The timeout passed: kill the tree and poll at once for the end.
    async fn on_deadline(&mut self) {
        self.timed_out = true;
        self.killed_at = Some(Instant::now());
        self.tracker.kill_async().await;
        self.poll_delay = Duration::from_millis(2);
        self.next_poll = Instant::now();
    }
}

/// Reads the exec's output and polls the engine until both say it is over, killing it
/// at `deadline`. Returns the exit code, whether it timed out, and a held first chunk
/// that looked like the engine's own "exec failed" message.
async fn drive(
    inner: &Inner,
    exec_id: &str,
    output: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
    tracker: &Tracker,
    tx: &mpsc::UnboundedSender<Item>,
    budget: &Budget,
    deadline: Option<Instant>,
) -> Result<(i32, bool, Option<bytes::Bytes>), RuntimeError> {
    let mut output = output.fuse();
    let mut d = Drive::new(inner, tracker);
    let far = Instant::now() + Duration::from_secs(86400 * 365);
    while !d.done() {
        let drain_tick = d.drain_tick(far);
        tokio::select! {
            item = output.next(), if !d.eof => d.on_output(item, tx, budget),
            _ = tokio::time::sleep_until(d.next_poll), if d.exit.is_none() => {
                if let Flow::Stop = d.poll(exec_id).await? {
                    break;
                }
            },
            _ = tokio::time::sleep_until(deadline.unwrap_or(far)),
                if deadline.is_some() && !d.timed_out && d.exit.is_none() => d.on_deadline().await,
            _ = tokio::time::sleep_until(drain_tick) => {},
        }
    }
    let code = d.exit.unwrap_or(-1);
    Ok((i32::try_from(code).unwrap_or(-1), d.timed_out, d.held))
}

/// Forwards what fits in the budget (dropping the rest; a dropped receiver only
/// means nobody listens any more).
fn send_capped(tx: &mpsc::UnboundedSender<Item>, budget: &Budget, stream: StreamKind, data: &[u8]) {
    let keep = budget.take(data.len());
    if keep > 0 {
        let _ = tx.send(Ok(ExecChunk::Output {
            stream,
            data: data[..keep].to_vec(),
        }));
    }
}

/// Whether an engine message says the program could not be started.
fn is_exec_failure(msg: &str) -> bool {
    let msg = msg.trim_start();
    msg.starts_with("OCI runtime exec failed") || msg.starts_with("exec failed:")
}

/// The result of a program the engine could not start: a failed command, as a shell
/// reports it (127 not found, 126 otherwise).
fn exec_failure_stream(shown: &str, msg: &str, max_output: usize) -> BoxStream<'static, Item> {
    let not_found = msg.contains("not found") || msg.contains("no such file");
    let code = if not_found { 127 } else { 126 };
    let what = if not_found { "command not found" } else { msg };
    let mut text = format!("grove: {shown}: {what}\n").into_bytes();
    let truncated = text.len() > max_output;
    text.truncate(max_output);
    let mut items = Vec::new();
    if !text.is_empty() {
        items.push(Ok(ExecChunk::Output {
            stream: StreamKind::Stderr,
            data: text,
        }));
    }
    items.push(Ok(ExecChunk::Finished(ExecResult {
        exit_code: code,
        truncated,
        ..ExecResult::default()
    })));
    futures::stream::iter(items).boxed()
}

#[derive(Default)]
struct TrackState {
    /// Host pid of the exec's first process; `Some(0)` when it ended unseen.
    pid: Option<u32>,
    /// A kill was asked for before the pid was known.
    cancelled: bool,
    /// The command is over; its pid may be reused, so it is never signalled again.
    finished: bool,
}

/// Who to kill for one exec.
struct Tracker {
    inner: Arc<Inner>,
    state: Mutex<TrackState>,
}

impl Tracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, TrackState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_pid(&self, pid: u32) {
        let cancelled = {
            let mut s = self.lock();
            s.pid = Some(pid);
            s.cancelled
        };
        if cancelled {
            self.kill();
        }
    }

    /// Kills the command's processes now if the host allows; `false` if the caller
    /// must fall back to restarting the container.
    fn kill_on_host(&self, pid: u32) -> bool {
        self.inner.sees_host()
            && pid != 0
            && host::kill_tree(&self.inner.container_id, pid) == Kill::Done
    }

    /// The pid to kill now; `None` when the command is over, or when its pid is not
    /// known yet (the driver then kills as soon as it learns it).
    fn claim(&self) -> Option<u32> {
        let mut s = self.lock();
        if s.finished {
            return None;
        }
        if s.pid.is_none() {
            s.cancelled = true;
        }
        s.pid
    }

    /// The timeout's kill: like [`stream::Kill::kill`], but waits for the restart fallback.
    async fn kill_async(&self) {
        let Some(pid) = self.claim() else { return };
        if pid == 0 || self.kill_on_host(pid) {
            return;
        }
        self.inner.restart().await;
    }

    /// After the first process ended: its group's survivors go too. Only on the host
    /// (restarting the container for a background process would be out of proportion).
    fn kill_stragglers(&self) {
        let pid = self.lock().pid.unwrap_or(0);
        if pid != 0 && self.inner.sees_host() {
            let _ = host::kill_tree(&self.inner.container_id, pid);
        }
    }

    /// The command is over: kill stragglers, then never signal its pid again.
    fn finish(&self) {
        let already = self.lock().finished;
        if !already {
            self.kill_stragglers();
        }
        self.lock().finished = true;
    }
}

impl stream::Kill for Tracker {
    /// Synchronous kill (drop paths): on the host, else a restart spawned on the
    /// current tokio runtime.
    fn kill(&self) {
        let Some(pid) = self.claim() else { return };
        if pid == 0 || self.kill_on_host(pid) {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let inner = self.inner.clone();
            handle.spawn(async move { inner.restart().await });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_messages_about_unstartable_programs_are_recognised() {
        assert!(is_exec_failure(
            "OCI runtime exec failed: exec failed: unable to start container process: \
             exec: \"nosuch\": executable file not found in $PATH: unknown"
        ));
        assert!(!is_exec_failure("hello"));
    }

    #[test]
    fn the_drain_after_the_end_counts_silence_from_the_end_at_the_earliest() {
        let end = Instant::now();
        let ms = Duration::from_millis;
        // Silent for a second before the end: its last words may still be on their way.
        assert!(!drained(end, end - ms(1000), end + ms(10)));
        assert!(!drained(end, end - ms(1000), end + ms(400)));
        assert!(drained(end, end - ms(1000), end + ms(600)));
        // Output after the end restarts the silence...
        assert!(!drained(end, end + ms(300), end + ms(700)));
        // ...but no longer than the cap.
        assert!(drained(end, end + ms(4900), end + ms(5100)));
    }
}
