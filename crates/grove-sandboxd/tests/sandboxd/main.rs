//! The agent binary driven over its pipes, outside any sandbox: what each request
//! does, in the frames the runtimes rely on.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use grove_sandboxd::protocol::{read_frame, write_frame, Event, Request, Stream};

struct Agent {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

/// What one exec produced.
#[derive(Debug, Default)]
struct Seen {
    started: bool,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    code: Option<i32>,
    truncated: bool,
}

impl Agent {
    fn start() -> Agent {
        let mut child = Command::new(env!("CARGO_BIN_EXE_grove-sandboxd"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the agent");
        let input = child.stdin.take().unwrap();
        let mut output = BufReader::new(child.stdout.take().unwrap());
        let (hello, _): (Event, Vec<u8>) = read_frame(&mut output).unwrap().unwrap();
        assert!(
            matches!(hello, Event::Hello { version: 1, .. }),
            "{hello:?}"
        );
        Agent {
            child,
            input,
            output,
        }
    }

    fn send(&mut self, req: &Request, payload: &[u8]) {
        write_frame(&mut self.input, req, payload).unwrap();
        self.input.flush().unwrap();
    }

    fn exec(&mut self, id: u64, argv: &[&str], env: &[(&str, &str)], stdin: bool, max: u64) {
        self.send(
            &Request::Exec {
                id,
                argv: argv.iter().map(|s| s.to_string()).collect(),
                cwd: "/".into(),
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                stdin,
                max_output: max,
            },
            b"",
        );
    }

    /// Reads frames until every id in `ids` exited.
    fn until_exit(&mut self, ids: &[u64]) -> HashMap<u64, Seen> {
        let mut seen: HashMap<u64, Seen> = HashMap::new();
        while ids
            .iter()
            .any(|id| seen.get(id).is_none_or(|s| s.code.is_none()))
        {
            let (ev, payload): (Event, Vec<u8>) = read_frame(&mut self.output)
                .unwrap()
                .expect("the agent ended early");
            match ev {
                Event::Started { id } => seen.entry(id).or_default().started = true,
                Event::Output { id, stream } => {
                    let s = seen.entry(id).or_default();
                    assert!(s.code.is_none(), "output after exit");
                    match stream {
                        Stream::Stdout => s.stdout.extend(payload),
                        Stream::Stderr => s.stderr.extend(payload),
                    }
                }
                Event::Exit {
                    id,
                    code,
                    truncated,
                } => {
                    let s = seen.entry(id).or_default();
                    s.code = Some(code);
                    s.truncated = truncated;
                }
                Event::Hello { .. } => panic!("a second hello"),
            }
        }
        seen
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const PATH: (&str, &str) = ("PATH", "/usr/bin:/bin");

#[test]
fn output_and_exit_codes_come_back_per_exec_with_only_the_given_env() {
    let mut a = Agent::start();
    a.exec(
        1,
        &["sh", "-c", "echo out; echo err >&2; exit 3"],
        &[PATH],
        false,
        1 << 20,
    );
    a.exec(
        2,
        &["sh", "-c", "echo \"[$ONLY][$HOME]\""],
        &[PATH, ("ONLY", "x")],
        false,
        1 << 20,
    );
    a.exec(3, &["sh", "-c", "kill -TERM $$"], &[PATH], false, 1 << 20);
    let seen = a.until_exit(&[1, 2, 3]);
    assert_eq!(seen[&1].code, Some(3));
    assert!(seen[&1].started);
    assert_eq!(seen[&1].stdout, b"out\n");
    assert_eq!(seen[&1].stderr, b"err\n");
    assert_eq!(
        seen[&2].stdout, b"[x][]\n",
        "only the request's env is visible"
    );
    assert_eq!(
        seen[&3].code,
        Some(128 + 15),
        "death by signal is 128 + signal"
    );
}

#[test]
fn a_missing_program_exits_127_without_starting() {
    let mut a = Agent::start();
    a.exec(
        9,
        &["definitely-not-a-program-here"],
        &[PATH],
        false,
        1 << 20,
    );
    let seen = a.until_exit(&[9]);
    assert_eq!(seen[&9].code, Some(127));
    assert!(!seen[&9].started);
    assert!(String::from_utf8_lossy(&seen[&9].stderr).contains("command not found"));
}

#[test]
fn stdin_frames_reach_the_command_and_close_ends_it() {
    let mut a = Agent::start();
    a.exec(4, &["cat"], &[PATH], true, 1 << 20);
    a.send(&Request::Stdin { id: 4 }, b"hello ");
    a.send(&Request::Stdin { id: 4 }, b"world");
    a.send(&Request::CloseStdin { id: 4 }, b"");
    let seen = a.until_exit(&[4]);
    assert_eq!(seen[&4].stdout, b"hello world");
    assert_eq!(seen[&4].code, Some(0));
}

#[test]
fn output_past_the_cap_is_dropped_and_the_command_still_finishes() {
    let mut a = Agent::start();
    a.exec(
        5,
        &[
            "sh",
            "-c",
            "head -c 300000 /dev/zero; head -c 300000 /dev/zero >&2",
        ],
        &[PATH],
        false,
        1000,
    );
    let seen = a.until_exit(&[5]);
    assert_eq!(seen[&5].code, Some(0));
    assert!(seen[&5].truncated);
    assert_eq!(seen[&5].stdout.len() + seen[&5].stderr.len(), 1000);
}

#[test]
fn kill_ends_the_whole_process_group() {
    let mut a = Agent::start();
    let token = format!("3600.{}{}", std::process::id(), 17);
    a.exec(
        6,
        &[
            "sh",
            "-c",
            &format!("sleep {token} & echo up; sleep {token}"),
        ],
        &[PATH],
        false,
        1 << 20,
    );
    // Wait for the first output, then kill.
    loop {
        let (ev, _): (Event, Vec<u8>) = read_frame(&mut a.output).unwrap().unwrap();
        if matches!(ev, Event::Output { id: 6, .. }) {
            break;
        }
    }
    a.send(&Request::Kill { id: 6 }, b"");
    let seen = a.until_exit(&[6]);
    assert_eq!(seen[&6].code, Some(128 + 9));
    let left: Vec<_> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains(&token))
        .collect();
    assert!(left.is_empty(), "processes of the killed exec survive");
}

#[test]
fn the_agent_ends_when_its_input_closes() {
    let mut a = Agent::start();
    let Agent { input, .. } = &mut a;
    // Closing our end of its stdin: the agent must exit on its own.
    let closed = std::mem::replace(input, {
        // A fresh pipe end that nobody reads, to keep the struct whole.
        let (_r, w) = std::io::pipe().unwrap();
        ChildStdin::from(std::os::fd::OwnedFd::from(w))
    });
    drop(closed);
    let status = a.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}
