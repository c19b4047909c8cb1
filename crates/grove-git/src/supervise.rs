//! Running one git CLI transfer as a supervised child: its own process group, a total
//! time budget, a stall budget (no output on stderr for that long), a cancel flag, and
//! the whole group killed when any of them ends it or the supervisor is dropped.
//!
//! Crash behaviour: the child is in its own process group, so a worker that dies with
//! SIGKILL leaves a git that runs to its end (or its own timeouts) into a partial
//! directory, which the next attempt removes before it clones.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use grove_core::transfer::TransferWatch;

/// How long a transfer may take in total, and without a byte on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) total: Duration,
    pub(crate) stall: Duration,
}

/// Why a supervised child was stopped before it ended by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopped {
    Cancelled,
    TimedOut(Duration),
    Stalled(Duration),
}

/// A child that ended by itself: its status, stdout (up to a cap) and the last part of
/// its stderr.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr_tail: String,
}

/// The most stdout kept (ls-remote of one ref is tiny; this only bounds a hostile one).
const STDOUT_CAP: u64 = 1 << 20;
/// The stderr kept for an error message.
const STDERR_TAIL: usize = 8 << 10;
/// How often deadlines and the cancel flag are looked at while git is silent.
const TICK: Duration = Duration::from_millis(100);

/// A spawned child whose process group is killed (SIGKILL) unless it was reaped.
struct Group {
    child: Child,
    reaped: bool,
}

impl Group {
    fn spawn(mut cmd: Command) -> std::io::Result<Self> {
        cmd.process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Ok(Self {
            child: cmd.spawn()?,
            reaped: false,
        })
    }

    /// Whether the leader exited, without reaping it (so its pid, which is the group
    /// id, cannot be reused while we may still signal the group).
    fn exited(&self) -> bool {
        let pid = self.child.id() as libc::id_t;
        // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        // SAFETY: waits on our own child with a valid out-pointer; WNOWAIT leaves it
        // waitable.
        let rc = unsafe { libc::waitid(libc::P_PID, pid, &mut info, flags) };
        // SAFETY: si_pid is set by waitid when a child changed state (0 otherwise).
        rc == 0 && unsafe { info.si_pid() } != 0
    }

    fn kill_group(&self) {
        if !self.reaped {
            // SAFETY: the leader is not reaped, so its pid still names our group.
            unsafe { libc::killpg(self.child.id() as libc::pid_t, libc::SIGKILL) };
        }
    }

    /// Kills what is left of the group, then reaps the leader.
    fn finish(&mut self) -> std::io::Result<ExitStatus> {
        self.kill_group();
        let status = self.child.wait()?;
        self.reaped = true;
        Ok(status)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill_group();
            let _ = self.child.wait();
        }
    }
}

/// Runs `cmd` to its end or until a limit or `watch` stops it. Each line of stderr
/// (split at `\r` and `\n`) goes to `on_line` as it arrives.
pub(crate) fn run(
    cmd: Command,
    limits: Limits,
    watch: &TransferWatch,
    mut on_line: impl FnMut(&str),
) -> std::io::Result<Result<Finished, Stopped>> {
    let mut group = Group::spawn(cmd)?;
    let stdout = group.child.stdout.take().expect("piped stdout");
    let stderr = group.child.stderr.take().expect("piped stderr");
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.take(STDOUT_CAP).read_to_end(&mut buf);
        buf
    });
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let err_reader = std::thread::spawn(move || pump(stderr, &tx));

    let started = Instant::now();
    let mut last_output = started;
    let mut lines = LineSplitter::default();
    let mut tail = String::new();
    let mut stderr_open = true;
    let stopped = loop {
        if watch.is_cancelled() {
            break Some(Stopped::Cancelled);
        }
        if started.elapsed() >= limits.total {
            break Some(Stopped::TimedOut(limits.total));
        }
        if last_output.elapsed() >= limits.stall {
            break Some(Stopped::Stalled(limits.stall));
        }
        if !stderr_open {
            if group.exited() {
                break None;
            }
            std::thread::sleep(TICK);
            continue;
        }
        match rx.recv_timeout(TICK) {
            Ok(chunk) => {
                last_output = Instant::now();
                keep_tail(&mut tail, &chunk);
                lines.push(&chunk, &mut on_line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                lines.flush(&mut on_line);
                stderr_open = false;
            }
        }
    };
    let status = group.finish()?;
    if let Some(why) = stopped {
        // The readers end when the killed group's pipes close; a process that left the
        // group could hold them open, so they are not waited for.
        return Ok(Err(why));
    }
    let stdout = out_reader.join().unwrap_or_default();
    let _ = err_reader.join();
    Ok(Ok(Finished {
        status,
        stdout,
        stderr_tail: tail,
    }))
}

fn pump(mut from: impl Read, to: &mpsc::Sender<Vec<u8>>) {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.send(buf[..n].to_vec()).is_err() {
                    return;
                }
            }
        }
    }
}

fn keep_tail(tail: &mut String, chunk: &[u8]) {
    tail.push_str(&String::from_utf8_lossy(chunk));
    if tail.len() > STDERR_TAIL {
        let mut cut = tail.len() - STDERR_TAIL;
        while !tail.is_char_boundary(cut) {
            cut += 1;
        }
        tail.drain(..cut);
    }
}

/// Splits a byte stream into lines at `\r` or `\n`, holding a partial last line
/// (bounded, so a child that never ends a line cannot grow it without limit).
#[derive(Default)]
struct LineSplitter {
    partial: Vec<u8>,
}

impl LineSplitter {
    const MAX_LINE: usize = 4096;

    fn push(&mut self, chunk: &[u8], on_line: &mut impl FnMut(&str)) {
        for &b in chunk {
            if b == b'\r' || b == b'\n' {
                self.flush(on_line);
            } else if self.partial.len() < Self::MAX_LINE {
                self.partial.push(b);
            }
        }
    }

    fn flush(&mut self, on_line: &mut impl FnMut(&str)) {
        if !self.partial.is_empty() {
            on_line(&String::from_utf8_lossy(&self.partial));
            self.partial.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", script]);
        cmd
    }

    const LONG: Limits = Limits {
        total: Duration::from_secs(30),
        stall: Duration::from_secs(30),
    };

    #[test]
    fn lines_split_at_carriage_returns_and_stdout_is_collected() {
        let mut seen = Vec::new();
        let done = run(
            sh("printf 'a: 1%%\\ra: 2%%\\nb\\n' >&2; printf out"),
            LONG,
            &TransferWatch::none(),
            |l| seen.push(l.to_string()),
        )
        .unwrap()
        .unwrap();
        assert!(done.status.success());
        assert_eq!(seen, ["a: 1%", "a: 2%", "b"]);
        assert_eq!(done.stdout, b"out");
    }

    #[test]
    fn a_silent_child_is_stopped_as_stalled_with_its_whole_group() {
        let tmp = tempfile::tempdir().unwrap();
        let pidfile = tmp.path().join("grandchild");
        let script = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
        let limits = Limits {
            total: Duration::from_secs(30),
            stall: Duration::from_millis(500),
        };
        let started = Instant::now();
        let r = run(sh(&script), limits, &TransferWatch::none(), |_| {}).unwrap();
        assert_eq!(r.unwrap_err(), Stopped::Stalled(limits.stall));
        assert!(started.elapsed() < Duration::from_secs(10));
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        // Killed but not yet reaped by its new parent (a zombie) counts as gone.
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        });
        assert!(!alive, "the grandchild {pid} outlived its group");
    }

    #[test]
    fn a_chatty_child_past_its_total_budget_is_timed_out() {
        let limits = Limits {
            total: Duration::from_millis(700),
            stall: Duration::from_secs(30),
        };
        let r = run(
            sh("while true; do echo tick >&2; sleep 0.1; done"),
            limits,
            &TransferWatch::none(),
            |_| {},
        )
        .unwrap();
        assert_eq!(r.unwrap_err(), Stopped::TimedOut(limits.total));
    }

    #[test]
    fn cancelling_the_watch_stops_the_child() {
        let watch = TransferWatch::none();
        let w = watch.clone();
        let canceller = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            w.cancel();
        });
        let r = run(sh("sleep 60"), LONG, &watch, |_| {}).unwrap();
        canceller.join().unwrap();
        assert_eq!(r.unwrap_err(), Stopped::Cancelled);
    }
}
