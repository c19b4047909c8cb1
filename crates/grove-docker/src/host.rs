//! What the worker can see of the engine's host: processes in `/proc` and the
//! container's cgroup counters. Used only when the engine is local and the worker may
//! look (see the crate docs); every function degrades to "cannot tell".

use std::path::{Path, PathBuf};

/// Counters of the limits a command can hit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    /// Processes killed by the OOM killer in the container's memory cgroup.
    pub oom_kills: u64,
    /// Forks refused by the pids limit.
    pub pids_max: u64,
}

impl Counters {
    /// Parses `key value` lines, as in `memory.oom_control`, `memory.events` (take
    /// `oom_kill`) and `pids.events` (take `max`).
    pub fn parse_into(&mut self, file: &str, text: &str) {
        let memory = file.contains("memory.");
        for line in text.lines() {
            let mut it = line.split_whitespace();
            let (Some(k), Some(v)) = (it.next(), it.next()) else {
                continue;
            };
            let Ok(v) = v.parse::<u64>() else { continue };
            match (memory, k) {
                (true, "oom_kill") => self.oom_kills = v,
                (false, "max") => self.pids_max = v,
                _ => {}
            }
        }
    }
}

/// Host paths of a container's counter files.
#[derive(Debug, Clone)]
pub(crate) struct Cgroups {
    memory: Option<PathBuf>,
    pids: Option<PathBuf>,
}

impl Cgroups {
    /// Finds the counter files of the container whose init has host pid `pid`; `None`
    /// unless the pid is visible and in a cgroup naming `container_id`.
    pub fn of_pid(pid: u32, container_id: &str) -> Option<Self> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        if !text.contains(container_id) {
            return None;
        }
        let root = Path::new("/sys/fs/cgroup");
        let mut memory = None;
        let mut pids = None;
        let mut unified = None;
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let rel = path.trim_start_matches('/');
            if controllers.is_empty() {
                unified = Some(root.join(rel));
                continue;
            }
            let dir = root.join(controllers).join(rel);
            if controllers.split(',').any(|c| c == "memory") {
                memory = Some(dir.join("memory.oom_control"));
            }
            if controllers.split(',').any(|c| c == "pids") {
                pids = Some(dir.join("pids.events"));
            }
        }
        if memory.is_none() && pids.is_none() {
            // cgroup v2: one directory for every controller.
            let dir = unified?;
            memory = Some(dir.join("memory.events"));
            pids = Some(dir.join("pids.events"));
        }
        let memory = memory.filter(|p| p.is_file());
        let pids = pids.filter(|p| p.is_file());
        if memory.is_none() && pids.is_none() {
            return None;
        }
        Some(Self { memory, pids })
    }

    /// The current counters; `None` if a file cannot be read any more.
    pub fn read(&self) -> Option<Counters> {
        let mut c = Counters::default();
        for p in [&self.memory, &self.pids].into_iter().flatten() {
            let text = std::fs::read_to_string(p).ok()?;
            c.parse_into(&p.to_string_lossy(), &text);
        }
        Some(c)
    }
}

/// What a kill attempt achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kill {
    /// Nothing of the command is left (or nothing was there).
    Done,
    /// Some process could not be signalled (no permission) or kept coming back.
    Failed,
}

/// Kills, with SIGKILL, every process in `container_id`'s cgroup whose process group
/// or session is `leader` (the exec's first process; Docker makes it a session
/// leader), including the leader; repeats until none is left.
pub(crate) fn kill_tree(container_id: &str, leader: u32) -> Kill {
    if leader <= 1 {
        return Kill::Failed;
    }
    for round in 0..50 {
        let members = members(container_id, leader);
        if members.is_empty() {
            return Kill::Done;
        }
        let mut denied = false;
        if members.iter().any(|m| m.pgid == leader) {
            // One signal to the whole group: atomic with respect to its forks.
            // SAFETY: killpg has no memory-safety preconditions.
            let rc = unsafe { libc::killpg(leader as libc::pid_t, libc::SIGKILL) };
            if rc != 0 && errno() == libc::EPERM {
                denied = true;
            }
        }
        for m in &members {
            // SAFETY: as above; ESRCH for an already dead process is expected.
            let rc = unsafe { libc::kill(m.pid as libc::pid_t, libc::SIGKILL) };
            if rc != 0 && errno() == libc::EPERM {
                denied = true;
            }
        }
        if denied {
            return Kill::Failed;
        }
        if round > 0 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    if members(container_id, leader).is_empty() {
        Kill::Done
    } else {
        Kill::Failed
    }
}

/// Whether this process can see `pid` as a member of `container_id`.
pub(crate) fn is_in_container(pid: u32, container_id: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|t| t.contains(container_id))
        .unwrap_or(false)
}

#[derive(Debug)]
struct Member {
    pid: u32,
    pgid: u32,
}

/// Live (not zombie) processes of the container in `leader`'s group or session.
fn members(container_id: &str, leader: u32) -> Vec<Member> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((state, pgid, sid)) = parse_stat(&stat) else {
            continue;
        };
        if state == 'Z' || (pgid != leader && sid != leader && pid != leader) {
            continue;
        }
        if is_in_container(pid, container_id) {
            found.push(Member { pid, pgid });
        }
    }
    found
}

/// (state, pgrp, session) from `/proc/<pid>/stat`; the command name may hold spaces
/// and parentheses, so fields are counted from the last `)`.
fn parse_stat(stat: &str) -> Option<(char, u32, u32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut it = rest.split_whitespace();
    let state = it.next()?.chars().next()?;
    let _ppid = it.next()?;
    let pgid = it.next()?.parse().ok()?;
    let sid = it.next()?.parse().ok()?;
    Some((state, pgid, sid))
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let s = "42 (we ird) (x)) S 1 40 39 0 -1 4194560";
        assert_eq!(parse_stat(s), Some(('S', 40, 39)));
    }

    #[test]
    fn counters_take_oom_kill_from_memory_files_and_max_from_pids_files() {
        let mut c = Counters::default();
        c.parse_into(
            "/x/memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        );
        c.parse_into(
            "/x/memory.events",
            "low 0\nhigh 0\nmax 9\noom 4\noom_kill 4\n",
        );
        c.parse_into("/x/pids.events", "max 7\n");
        assert_eq!(
            c,
            Counters {
                oom_kills: 4,
                pids_max: 7
            }
        );
    }
}
