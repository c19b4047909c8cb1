//! The agent's side: read requests, fork/exec each command in its own session, stream
//! its output back capped, report how it ended, kill what it leaves behind.
//!
//! Plain threads, no async runtime: the main thread reads requests and forks each
//! command itself; per exec one thread polls the command's two pipes and a pidfd of
//! its leader together, and one more feeds its stdin when it has any. The main thread
//! never blocks on a command, so a command that never reads its stdin or a burst of
//! output never stalls another exec's requests.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::protocol::{read_frame, write_frame, Event, Request, Stream, VERSION};

/// After a command's leader ended, how long its pipes are still read: a descriptor
/// kept open by a process that escaped the kill must not hang the exec.
const DRAIN_DEADLINE: Duration = Duration::from_millis(500);

/// How often the pipe reader looks whether the leader ended meanwhile.
const POLL_TICK_MS: libc::c_int = 100;

const READ_BUF: usize = 64 * 1024;

/// How the agent runs; parsed from its argv.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Kill every other process of the pid namespace whenever no exec is running (the
    /// agent is pid 2 of a namespace made for it, under bubblewrap's init). Commands
    /// that left their process group (`setsid`) then still do not outlive their exec
    /// for long, as under a sandbox made per exec. Refused unless the agent really
    /// is pid 2: outside a namespace of its own it would kill the host's processes.
    pub sweep_namespace: bool,
    /// Empty `/tmp`, `/var/tmp` and `/run` (so `$HOME`, which is `/tmp`) whenever no
    /// exec is running, right after the sweep: each exec of a read-only view finds
    /// them as a fresh sandbox would, and nothing one command plants there reaches
    /// the next. Only with `--sweep-namespace` (no process may keep writing there).
    pub fresh_tmp: bool,
}

/// What `--fresh-tmp` empties; the agent's own binary (a mount point) stays.
const SCRATCH_DIRS: &[&str] = &["/tmp", "/var/tmp", "/run"];

impl Options {
    /// `--sweep-namespace` and `--fresh-tmp` are the flags.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let mut o = Options::default();
        for a in args {
            match a.as_str() {
                "--sweep-namespace" => o.sweep_namespace = true,
                "--fresh-tmp" => o.fresh_tmp = true,
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(o)
    }
}

/// The binary's entry: the protocol on stdin/stdout, options from argv. Returns the
/// process exit code.
pub fn run_stdio() -> i32 {
    let mut opts = match Options::from_args(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("grove-sandboxd: {e}");
            return 2;
        }
    };
    if opts.sweep_namespace && std::process::id() != 2 {
        eprintln!(
            "grove-sandboxd: --sweep-namespace ignored: pid {} is not 2, so this is not a \
             pid namespace of the agent's own",
            std::process::id()
        );
        opts.sweep_namespace = false;
    }
    // Without the sweep a process of an earlier exec could still write there.
    opts.fresh_tmp &= opts.sweep_namespace;
    // Not dumpable: a command of the same user must not open the agent's pipes to the
    // host through /proc/<pid>/fd (forging or corrupting other execs' frames). The
    // flag is reset at each command's execve, so commands are unaffected.
    // SAFETY: prctl with these arguments touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        eprintln!(
            "grove-sandboxd: cannot make the agent undumpable: {}",
            std::io::Error::last_os_error()
        );
        return 2;
    }
    // SAFETY: fds 0 and 1 are open for the life of the process and owned by nothing
    // else here (std's Stdin/Stdout handles are never used by the agent).
    let (input, output) = unsafe { (File::from_raw_fd(0), File::from_raw_fd(1)) };
    serve(input, output, opts);
    0
}

/// Serves requests from `input` until it ends, then kills whatever still runs.
pub fn serve<R: Read, W: Write + Send + 'static>(input: R, output: W, opts: Options) {
    let agent = Arc::new(Agent {
        out: Mutex::new(Box::new(BufWriter::new(output))),
        execs: Mutex::new(Execs::default()),
        opts,
    });
    agent.send(
        &Event::Hello {
            version: VERSION,
            pid: std::process::id(),
        },
        b"",
    );
    let mut input = BufReader::new(input);
    loop {
        let (req, payload) = match read_frame::<_, Request>(&mut input) {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(e) => {
                eprintln!("grove-sandboxd: bad request stream: {e}");
                break;
            }
        };
        agent.handle(req, payload);
    }
    // The host is gone: nobody would read a result.
    let mut execs = agent.lock();
    for entry in execs.by_id.values_mut() {
        entry.kill();
    }
    if agent.opts.sweep_namespace {
        sweep_namespace();
    }
}

struct Agent {
    out: Mutex<Box<dyn Write + Send>>,
    execs: Mutex<Execs>,
    opts: Options,
}

#[derive(Default)]
struct Execs {
    by_id: HashMap<u64, Entry>,
    /// Execs whose process may be running (counted from before the spawn).
    active: usize,
}

struct Entry {
    /// The process group (= pid, the command is a session leader); `None` before the
    /// spawn and once the leader was reaped and its group killed.
    pgid: Option<libc::pid_t>,
    /// A kill asked for before the spawn is applied right after it.
    killed: bool,
    stdin: Option<mpsc::Sender<Vec<u8>>>,
}

impl Entry {
    fn kill(&mut self) {
        self.killed = true;
        if let Some(pgid) = self.pgid {
            // SAFETY: killpg has no memory-safety preconditions; ESRCH is fine.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

struct ExecSpec {
    id: u64,
    argv: Vec<String>,
    cwd: String,
    env: Vec<(String, String)>,
    stdin: Option<mpsc::Receiver<Vec<u8>>>,
    max_output: u64,
}

impl Agent {
    fn lock(&self) -> std::sync::MutexGuard<'_, Execs> {
        self.execs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends one frame. A host that stopped reading is noticed by the main loop (its
    /// requests end too), so a failed write is only dropped here.
    fn send(&self, event: &Event, payload: &[u8]) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let _ = write_frame(&mut *out, event, payload).and_then(|()| out.flush());
    }

    fn handle(self: &Arc<Self>, req: Request, payload: Vec<u8>) {
        match req {
            Request::Exec {
                id,
                argv,
                cwd,
                env,
                stdin,
                max_output,
            } => {
                let (tx, rx) = if stdin {
                    let (tx, rx) = mpsc::channel();
                    (Some(tx), Some(rx))
                } else {
                    (None, None)
                };
                self.lock().by_id.insert(
                    id,
                    Entry {
                        pgid: None,
                        killed: false,
                        stdin: tx,
                    },
                );
                let spec = ExecSpec {
                    id,
                    argv,
                    cwd,
                    env,
                    stdin: rx,
                    max_output,
                };
                self.run(spec);
            }
            Request::Stdin { id } => {
                if let Some(tx) = self.lock().by_id.get(&id).and_then(|e| e.stdin.as_ref()) {
                    let _ = tx.send(payload);
                }
            }
            Request::CloseStdin { id } => {
                if let Some(e) = self.lock().by_id.get_mut(&id) {
                    e.stdin = None;
                }
            }
            Request::Kill { id } => {
                if let Some(e) = self.lock().by_id.get_mut(&id) {
                    e.kill();
                }
            }
        }
    }

    fn fail(&self, id: u64, code: i32, msg: &str) {
        self.send(
            &Event::Output {
                id,
                stream: Stream::Stderr,
            },
            format!("{msg}\n").as_bytes(),
        );
        self.send(
            &Event::Exit {
                id,
                code,
                truncated: false,
            },
            b"",
        );
    }

    /// Starts one exec (on the main thread: a fork/exec is quick, and a `kill` read
    /// after the request then always finds the process), then hands it to a thread
    /// of its own.
    fn run(self: &Arc<Self>, spec: ExecSpec) {
        let id = spec.id;
        let Some(program) = spec.argv.first() else {
            self.lock().by_id.remove(&id);
            self.fail(id, 126, "grove-sandboxd: empty argv");
            return;
        };
        let mut cmd = Command::new(program);
        cmd.args(&spec.argv[1..])
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&spec.cwd)
            .stdin(if spec.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
        // A session (and so a process group) of its own: one killpg reaches every
        // process the command forks, and it has no controlling terminal.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }

        // Spawned under the lock: the namespace sweep never runs between the count
        // going up and the process existing.
        let mut child = {
            let mut execs = self.lock();
            execs.active += 1;
            match cmd.spawn() {
                Ok(child) => {
                    if let Some(e) = execs.by_id.get_mut(&id) {
                        e.pgid = Some(child.id() as libc::pid_t);
                    }
                    child
                }
                Err(e) => {
                    execs.active -= 1;
                    execs.by_id.remove(&id);
                    drop(execs);
                    let (code, what) = match e.kind() {
                        std::io::ErrorKind::NotFound => (127, "command not found".to_string()),
                        _ => (126, e.to_string()),
                    };
                    self.fail(id, code, &format!("grove: {program}: {what}"));
                    return;
                }
            }
        };
        self.send(&Event::Started { id }, b"");

        if let (Some(mut pipe), Some(rx)) = (child.stdin.take(), spec.stdin) {
            // Its own thread: a command that never reads stdin must not stall output.
            let _ = std::thread::Builder::new()
                .name(format!("stdin-{id}"))
                .spawn(move || {
                    for data in rx {
                        if pipe.write_all(&data).is_err() {
                            return;
                        }
                    }
                });
        }
        let agent = self.clone();
        let max = spec.max_output;
        let watched = std::thread::Builder::new()
            .name(format!("exec-{id}"))
            .spawn(move || agent.watch(id, child, max));
        if let Err(e) = watched {
            // Nobody could report its end: better killed than running unwatched. The
            // host sees no exit and ends the exec at its timeout or the agent's end.
            if let Some(entry) = self.lock().by_id.get_mut(&id) {
                entry.kill();
            }
            eprintln!("grove-sandboxd: cannot start a thread for exec {id}: {e}");
        }
    }

    /// Reads the exec's pipes and waits for its leader in one `poll(2)` loop (the
    /// leader through a pidfd), then kills its group, reports the exit, and sweeps.
    fn watch(&self, id: u64, mut child: Child, max: u64) {
        let mut out = child.stdout.take().expect("stdout is piped");
        let mut err = child.stderr.take().expect("stderr is piped");
        let pidfd = PidFd::open(child.id());
        let mut remaining = max;
        let mut truncated = false;
        let mut open = [true, true];
        let mut buf = vec![0u8; READ_BUF];
        let mut status: Option<std::io::Result<ExitStatus>> = None;
        let mut ended_at: Option<Instant> = None;
        loop {
            if status.is_none() && pidfd.is_none() {
                // Without a pidfd (old kernels) the leader is looked at every tick.
                if let Ok(Some(_)) | Err(_) = child.try_wait() {
                    status = Some(wait(&mut child));
                }
            }
            if status.is_some() {
                if !open[0] && !open[1] {
                    break;
                }
                let at = *ended_at.get_or_insert_with(|| {
                    self.retire(id);
                    Instant::now()
                });
                if at.elapsed() >= DRAIN_DEADLINE {
                    break;
                }
            }
            let leader = match (&status, &pidfd) {
                (None, Some(fd)) => Some(fd.raw()),
                _ => None,
            };
            let mut fds = [
                pollfd(open[0].then(|| out.as_raw_fd())),
                pollfd(open[1].then(|| err.as_raw_fd())),
                pollfd(leader),
            ];
            let tick = if leader.is_some() { -1 } else { POLL_TICK_MS };
            // SAFETY: `fds` is a valid array of three pollfd for the duration of the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 3, tick) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                break;
            }
            if fds[2].revents != 0 {
                status = Some(wait(&mut child));
            }
            for (i, fd) in fds.iter().take(2).enumerate() {
                if !open[i] || fd.revents == 0 {
                    continue;
                }
                let read = if i == 0 {
                    out.read(&mut buf)
                } else {
                    err.read(&mut buf)
                };
                let n = match read {
                    Ok(0) => {
                        open[i] = false;
                        continue;
                    }
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        open[i] = false;
                        continue;
                    }
                };
                let keep = (n as u64).min(remaining) as usize;
                remaining -= keep as u64;
                if keep < n {
                    truncated = true;
                }
                if keep > 0 {
                    let stream = if i == 0 {
                        Stream::Stdout
                    } else {
                        Stream::Stderr
                    };
                    self.send(&Event::Output { id, stream }, &buf[..keep]);
                }
            }
        }
        let status = status.unwrap_or_else(|| wait(&mut child));
        if ended_at.is_none() {
            self.retire(id);
        }
        let code = match status {
            Ok(s) => exit_code(s),
            Err(_) => 126,
        };
        self.send(
            &Event::Exit {
                id,
                code,
                truncated,
            },
            b"",
        );
        let mut execs = self.lock();
        execs.by_id.remove(&id);
        execs.active -= 1;
        if execs.active == 0 && self.opts.sweep_namespace {
            sweep_namespace();
            if self.opts.fresh_tmp {
                empty_scratch_dirs();
            }
        }
    }

    /// After the leader was reaped: kill what is left of its group (stragglers) and
    /// retire the pgid (it may be reused from now on), all under the lock.
    fn retire(&self, id: u64) {
        let mut execs = self.lock();
        if let Some(e) = execs.by_id.get_mut(&id) {
            e.kill();
            e.pgid = None;
            e.stdin = None;
        }
    }
}

/// A pollfd for `fd`, or a slot poll ignores.
fn pollfd(fd: Option<libc::c_int>) -> libc::pollfd {
    libc::pollfd {
        fd: fd.unwrap_or(-1),
        events: libc::POLLIN,
        revents: 0,
    }
}

/// A pidfd (Linux 5.3+): readable once the process exited, so the output loop can
/// wait for the leader and its pipes at once.
struct PidFd(std::os::fd::OwnedFd);

impl PidFd {
    fn open(pid: u32) -> Option<PidFd> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return None;
        }
        // SAFETY: the descriptor was just returned to us and is owned by nobody else.
        Some(PidFd(unsafe {
            std::os::fd::OwnedFd::from_raw_fd(fd as libc::c_int)
        }))
    }

    fn raw(&self) -> libc::c_int {
        self.0.as_raw_fd()
    }
}

fn wait(child: &mut Child) -> std::io::Result<ExitStatus> {
    loop {
        match child.wait() {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// The exit status as a shell reports it: the code, or 128 + the killing signal.
fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Empties the scratch dirs (`--fresh-tmp`); entries that cannot go (a mount point)
/// stay. `remove_dir_all` never follows a symlink out of the tree.
fn empty_scratch_dirs() {
    for dir in SCRATCH_DIRS {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            let _ = if is_dir {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
}

/// Kills every process of the namespace but init (pid 1) and the agent itself. Only
/// called with no exec running, under the exec lock.
fn sweep_namespace() {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid > 1 && pid != me {
            // SAFETY: kill has no memory-safety preconditions; ESRCH is fine.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
    }
}
