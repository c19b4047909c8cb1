//! Interactive sessions as data: their request and answer types, the output ring that
//! keeps the newest bytes, and [`SessionTable`], the bookkeeping every provider that
//! offers [`crate::ports::Sessions`] shares.
//!
//! The table is runtime-agnostic (futures only, no timer, no spawning): an adapter
//! turns a process into an [`ExecChunk`] stream plus a stdin channel, hands both to
//! [`SessionTable::insert`], spawns the pump future it gets back, and passes its own
//! timer to [`SessionTable::poll`].

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use futures::channel::{mpsc, oneshot};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};

use crate::error::RuntimeError;
use crate::ports::ExecChunk;

/// Output kept per session when the request names no cap.
pub const DEFAULT_SESSION_BUFFER_BYTES: usize = 1024 * 1024;
/// The largest output ring a session may ask for.
pub const MAX_SESSION_BUFFER_BYTES: usize = 16 * 1024 * 1024;
/// The most one write may carry.
pub const MAX_SESSION_WRITE_BYTES: usize = 1024 * 1024;
/// Running sessions one provider holds at most; more is `ResourceLimit`.
pub const MAX_LIVE_SESSIONS: usize = 64;
/// Ended sessions remembered (for their last output and exit) before the oldest is
/// forgotten.
pub const MAX_ENDED_SESSIONS: usize = 64;
/// Exit code reported for a killed session, as a shell reports SIGKILL.
pub const KILLED_EXIT_CODE: i32 = 128 + 9;

/// A session's id: a UUID chosen by the provider. Lookups treat any string as a key,
/// so a hostile id can only be unknown.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionId(String);

impl SessionId {
    /// A fresh random id.
    pub fn generate() -> Self {
        Self(uuid::Uuid::new_v4().to_string())
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for SessionId {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What to start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionRequest {
    /// The program and its arguments (`["sh"]`, `["python3", "-i"]`).
    pub argv: Vec<String>,
    /// Relative to the workspace root; must stay inside it.
    pub cwd: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    /// Whether the session may write (a read-only runtime refuses it otherwise).
    pub mutating: bool,
    /// Size of the output ring; `None`: [`DEFAULT_SESSION_BUFFER_BYTES`].
    pub max_buffer_bytes: Option<usize>,
}

impl SessionRequest {
    /// The ring size after checking the request's bound.
    pub fn buffer_bytes(&self) -> Result<usize, RuntimeError> {
        match self.max_buffer_bytes {
            None => Ok(DEFAULT_SESSION_BUFFER_BYTES),
            Some(n) if (1..=MAX_SESSION_BUFFER_BYTES).contains(&n) => Ok(n),
            Some(n) => Err(RuntimeError::CommandRejected(format!(
                "max_buffer_bytes {n} must be between 1 and {MAX_SESSION_BUFFER_BYTES}"
            ))),
        }
    }
}

/// Bytes for a session's stdin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionInput {
    pub data: Vec<u8>,
    /// Close stdin after `data` (the process sees end of file).
    pub close: bool,
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionExit {
    /// The exit code as a shell reports it (128 + signal); [`KILLED_EXIT_CODE`] when
    /// killed; -1 when the runtime failed.
    pub exit_code: i32,
    /// Ended by [`crate::ports::Sessions::kill`].
    pub killed: bool,
    /// The runtime's failure, when it failed rather than the process ending.
    pub error: Option<String>,
}

/// The answer to a poll.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionOutput {
    /// Output since the previous poll (stdout and stderr interleaved as read), at most
    /// the ring's size.
    #[serde(with = "lossy_text")]
    pub data: Vec<u8>,
    /// Position of `data[0]` in everything the session printed.
    pub offset: u64,
    /// Bytes printed since the previous poll that the ring no longer held.
    pub dropped_bytes: u64,
    /// Set once the process ended.
    pub exit: Option<SessionExit>,
}

/// A session as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub id: SessionId,
    /// The runtime it runs in ([`crate::ports::RuntimeProvider::backend_id`]).
    pub backend_id: String,
    pub argv: Vec<String>,
    pub max_buffer_bytes: usize,
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// Everything it printed so far, kept or not.
    pub output_bytes: u64,
    /// Set once it ended.
    pub exit: Option<SessionExit>,
}

mod lossy_text {
    //! Session output serialized as UTF-8 text (lossy), like exec results.
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&String::from_utf8_lossy(data))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        Ok(String::deserialize(d)?.into_bytes())
    }
}

/// A byte ring of fixed capacity that keeps the newest bytes, with absolute positions.
#[derive(Debug, Clone)]
pub struct OutputRing {
    buf: VecDeque<u8>,
    cap: usize,
    /// Bytes ever pushed; the ring holds `total - buf.len() .. total`.
    total: u64,
}

impl OutputRing {
    pub fn new(cap: usize) -> Self {
        Self {
            buf: VecDeque::new(),
            cap: cap.max(1),
            total: 0,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        let data = &data[data.len().saturating_sub(self.cap)..];
        let overflow = (self.buf.len() + data.len()).saturating_sub(self.cap);
        self.buf.drain(..overflow);
        self.buf.extend(data);
    }

    /// Bytes ever pushed.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// What was pushed from position `from` on: (offset of the first byte returned,
    /// the bytes, how many bytes after `from` were already overwritten).
    pub fn read_from(&self, from: u64) -> (u64, Vec<u8>, u64) {
        let start = self.total - self.buf.len() as u64;
        let from = from.min(self.total);
        let first = from.max(start);
        let skip = (first - start) as usize;
        let bytes: Vec<u8> = self.buf.iter().skip(skip).copied().collect();
        (first, bytes, first - from)
    }
}

struct State {
    ring: OutputRing,
    /// Position up to which polls have read.
    read_pos: u64,
    exit: Option<SessionExit>,
    stdin: Option<mpsc::UnboundedSender<Vec<u8>>>,
    kill: Option<oneshot::Sender<()>>,
    waiters: Vec<Waker>,
    /// Order of ending, for forgetting the oldest ended sessions first.
    ended_seq: Option<u64>,
}

struct Entry {
    id: SessionId,
    backend_id: String,
    argv: Vec<String>,
    cap: usize,
    started_at: chrono::DateTime<chrono::Utc>,
    state: Mutex<State>,
}

impl Entry {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn info(&self) -> SessionInfo {
        let s = self.lock();
        SessionInfo {
            id: self.id.clone(),
            backend_id: self.backend_id.clone(),
            argv: self.argv.clone(),
            max_buffer_bytes: self.cap,
            started_at: self.started_at,
            output_bytes: s.ring.total(),
            exit: s.exit.clone(),
        }
    }

    fn wake(s: &mut State) {
        for w in s.waiters.drain(..) {
            w.wake();
        }
    }
}

/// The sessions of one provider.
#[derive(Default)]
pub struct SessionTable {
    sessions: Mutex<BTreeMap<SessionId, Arc<Entry>>>,
    ended: std::sync::atomic::AtomicU64,
}

/// What an adapter hands over for a started process.
pub struct Started {
    /// The process's output then its result, as `Runtime::exec_stream` yields them
    /// (uncapped: the ring is the cap). Dropping it must kill the process tree.
    pub output: BoxStream<'static, Result<ExecChunk, RuntimeError>>,
    /// Its stdin: each item is written in order; dropping the sender closes stdin.
    pub stdin: mpsc::UnboundedSender<Vec<u8>>,
}

impl SessionTable {
    fn map(&self) -> MutexGuard<'_, BTreeMap<SessionId, Arc<Entry>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entry(&self, id: &SessionId) -> Result<Arc<Entry>, RuntimeError> {
        self.map()
            .get(id)
            .cloned()
            .ok_or_else(|| RuntimeError::NotFound(format!("session {id}")))
    }

    /// Refuses a start when [`MAX_LIVE_SESSIONS`] are running; call before starting
    /// the process (insert checks again).
    pub fn check_room(&self) -> Result<(), RuntimeError> {
        let live = self
            .map()
            .values()
            .filter(|e| e.lock().exit.is_none())
            .count();
        if live >= MAX_LIVE_SESSIONS {
            return Err(RuntimeError::ResourceLimit(format!(
                "{live} interactive sessions are running here (at most {MAX_LIVE_SESSIONS}); \
                 kill one first"
            )));
        }
        Ok(())
    }

    /// Registers a started process. Returns its info and the pump future, which the
    /// caller must spawn: it moves output into the ring until the process ends or the
    /// session is killed (then it drops the output stream, which kills the process).
    pub fn insert(
        self: &Arc<Self>,
        backend_id: String,
        argv: Vec<String>,
        cap: usize,
        started: Started,
    ) -> Result<(SessionInfo, BoxFuture<'static, ()>), RuntimeError> {
        self.check_room()?;
        let (kill_tx, kill_rx) = oneshot::channel();
        let entry = Arc::new(Entry {
            id: SessionId::generate(),
            backend_id,
            argv,
            cap,
            started_at: chrono::Utc::now(),
            state: Mutex::new(State {
                ring: OutputRing::new(cap),
                read_pos: 0,
                exit: None,
                stdin: Some(started.stdin),
                kill: Some(kill_tx),
                waiters: Vec::new(),
                ended_seq: None,
            }),
        });
        self.map().insert(entry.id.clone(), entry.clone());
        let info = entry.info();
        let table = self.clone();
        let pump = pump(table, entry, started.output, kill_rx).boxed();
        Ok((info, pump))
    }

    /// Queues bytes for the session's stdin.
    pub fn write(&self, id: &SessionId, input: SessionInput) -> Result<(), RuntimeError> {
        if input.data.len() > MAX_SESSION_WRITE_BYTES {
            return Err(RuntimeError::CommandRejected(format!(
                "a write carries at most {MAX_SESSION_WRITE_BYTES} bytes"
            )));
        }
        let entry = self.entry(id)?;
        let mut s = entry.lock();
        if s.exit.is_some() {
            return Err(RuntimeError::CommandRejected(format!(
                "session {id} has ended"
            )));
        }
        let Some(stdin) = s.stdin.as_ref() else {
            return Err(RuntimeError::CommandRejected(format!(
                "the stdin of session {id} is closed"
            )));
        };
        if !input.data.is_empty() && stdin.unbounded_send(input.data).is_err() {
            return Err(RuntimeError::CommandRejected(format!(
                "the stdin of session {id} is closed"
            )));
        }
        if input.close {
            s.stdin = None;
        }
        Ok(())
    }

    /// Output since the last poll; when there is none and the session runs, waits for
    /// some or for `timer`, whichever comes first.
    pub async fn poll<T>(&self, id: &SessionId, timer: T) -> Result<SessionOutput, RuntimeError>
    where
        T: std::future::Future<Output = ()> + Send,
    {
        let entry = self.entry(id)?;
        let changed = futures::future::poll_fn(|cx| {
            let mut s = entry.lock();
            if s.exit.is_some() || s.ring.total() > s.read_pos {
                Poll::Ready(())
            } else {
                s.waiters.push(cx.waker().clone());
                Poll::Pending
            }
        });
        futures::pin_mut!(timer);
        futures::future::select(changed, timer).await;
        let mut s = entry.lock();
        let (offset, data, dropped_bytes) = s.ring.read_from(s.read_pos);
        s.read_pos = s.ring.total();
        Ok(SessionOutput {
            data,
            offset,
            dropped_bytes,
            exit: s.exit.clone(),
        })
    }

    /// Ends the session: the pump drops the process's stream, which kills it.
    pub fn kill(&self, id: &SessionId) -> Result<(), RuntimeError> {
        let entry = self.entry(id)?;
        let mut s = entry.lock();
        if let Some(kill) = s.kill.take() {
            let _ = kill.send(());
        }
        s.stdin = None;
        Ok(())
    }

    pub fn info(&self, id: &SessionId) -> Result<SessionInfo, RuntimeError> {
        Ok(self.entry(id)?.info())
    }

    pub fn list(&self) -> Vec<SessionInfo> {
        let entries: Vec<Arc<Entry>> = self.map().values().cloned().collect();
        entries.iter().map(|e| e.info()).collect()
    }

    /// Kills every session (the provider is going away, or its runtime is).
    pub fn kill_all_of(&self, backend_id: Option<&str>) {
        let entries: Vec<Arc<Entry>> = self.map().values().cloned().collect();
        for e in entries {
            if backend_id.is_none_or(|b| b == e.backend_id) {
                let _ = self.kill(&e.id);
            }
        }
    }

    /// Forgets the oldest ended sessions beyond [`MAX_ENDED_SESSIONS`].
    fn forget_old(&self) {
        let mut map = self.map();
        let mut ended: Vec<(u64, SessionId)> = map
            .values()
            .filter_map(|e| e.lock().ended_seq.map(|n| (n, e.id.clone())))
            .collect();
        if ended.len() <= MAX_ENDED_SESSIONS {
            return;
        }
        ended.sort();
        let excess = ended.len() - MAX_ENDED_SESSIONS;
        for (_, id) in ended.into_iter().take(excess) {
            map.remove(&id);
        }
    }
}

/// Moves the process's output into the ring until it ends or is killed.
async fn pump(
    table: Arc<SessionTable>,
    entry: Arc<Entry>,
    mut output: BoxStream<'static, Result<ExecChunk, RuntimeError>>,
    kill: oneshot::Receiver<()>,
) {
    let mut kill = kill.fuse();
    let exit = loop {
        let next = output.next().fuse();
        futures::pin_mut!(next);
        // A kill is checked first: killing also closes stdin, which can end the
        // process by itself before this task runs again, and a session that was killed
        // must say so rather than report the exit its closed stdin caused.
        futures::select_biased! {
            // A dropped sender (the entry went away) counts as a kill too.
            _ = kill => {
                break SessionExit { exit_code: KILLED_EXIT_CODE, killed: true, error: None };
            }
            item = next => match item {
                Some(Ok(ExecChunk::Output { data, .. })) => {
                    let mut s = entry.lock();
                    s.ring.push(&data);
                    Entry::wake(&mut s);
                }
                Some(Ok(ExecChunk::Finished(result))) => {
                    break SessionExit { exit_code: result.exit_code, killed: false, error: None };
                }
                Some(Err(e)) => {
                    break SessionExit { exit_code: -1, killed: false, error: Some(e.to_string()) };
                }
                None => {
                    break SessionExit {
                        exit_code: -1,
                        killed: false,
                        error: Some("the session's output ended without a result".into()),
                    };
                }
            },
        }
    };
    // Dropping the stream kills whatever is left of the process tree.
    drop(output);
    {
        let mut s = entry.lock();
        s.exit = Some(exit);
        s.stdin = None;
        s.kill = None;
        s.ended_seq = Some(
            table
                .ended
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst),
        );
        Entry::wake(&mut s);
    }
    table.forget_old();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_bytes_and_counts_what_it_lost() {
        let mut r = OutputRing::new(5);
        r.push(b"abc");
        assert_eq!(r.read_from(0), (0, b"abc".to_vec(), 0));
        r.push(b"defg");
        assert_eq!(r.total(), 7);
        assert_eq!(r.read_from(0), (2, b"cdefg".to_vec(), 2));
        assert_eq!(r.read_from(3), (3, b"defg".to_vec(), 0));
        r.push(b"0123456789");
        assert_eq!(r.read_from(7), (12, b"56789".to_vec(), 5));
        assert_eq!(r.read_from(17), (17, Vec::new(), 0));
    }

    #[test]
    fn buffer_sizes_outside_the_bounds_are_refused() {
        let mut req = SessionRequest::default();
        assert_eq!(req.buffer_bytes().unwrap(), DEFAULT_SESSION_BUFFER_BYTES);
        req.max_buffer_bytes = Some(0);
        assert!(req.buffer_bytes().is_err());
        req.max_buffer_bytes = Some(MAX_SESSION_BUFFER_BYTES + 1);
        assert!(req.buffer_bytes().is_err());
    }

    #[test]
    fn a_kill_wins_over_an_exit_that_is_ready_at_the_same_time() {
        use crate::ports::ExecResult;
        // Killing closes stdin, which can end the process (a shell) by itself before
        // the pump runs: both the kill and the exit are then ready.
        for _ in 0..32 {
            let table = Arc::new(SessionTable::default());
            let (stdin, _rx) = mpsc::unbounded();
            let done = vec![Ok(ExecChunk::Finished(ExecResult::default()))];
            let (info, pump) = table
                .insert(
                    "b".into(),
                    vec!["sh".into()],
                    8,
                    Started {
                        output: futures::stream::iter(done).boxed(),
                        stdin,
                    },
                )
                .unwrap();
            table.kill(&info.id).unwrap();
            futures::executor::block_on(pump);
            let exit = table.info(&info.id).unwrap().exit.unwrap();
            assert!(exit.killed, "a killed session reports the kill: {exit:?}");
            assert_eq!(exit.exit_code, KILLED_EXIT_CODE);
        }
    }

    #[test]
    fn a_table_pumps_output_reports_exit_and_refuses_writes_after() {
        use crate::ports::{ExecResult, StreamKind};
        let table = Arc::new(SessionTable::default());
        let (stdin, mut stdin_rx) = mpsc::unbounded();
        let items = vec![
            Ok(ExecChunk::Output {
                stream: StreamKind::Stdout,
                data: b"hello ".to_vec(),
            }),
            Ok(ExecChunk::Output {
                stream: StreamKind::Stderr,
                data: b"world".to_vec(),
            }),
            Ok(ExecChunk::Finished(ExecResult {
                exit_code: 3,
                ..ExecResult::default()
            })),
        ];
        let (info, pump) = table
            .insert(
                "b".into(),
                vec!["x".into()],
                8,
                Started {
                    output: futures::stream::iter(items).boxed(),
                    stdin,
                },
            )
            .unwrap();
        table
            .write(
                &info.id,
                SessionInput {
                    data: b"in".to_vec(),
                    close: false,
                },
            )
            .unwrap();
        assert_eq!(
            futures::executor::block_on(stdin_rx.next()),
            Some(b"in".to_vec())
        );
        futures::executor::block_on(pump);
        let out =
            futures::executor::block_on(table.poll(&info.id, futures::future::pending())).unwrap();
        assert_eq!(out.data, b"lo world");
        assert_eq!((out.offset, out.dropped_bytes), (3, 3));
        assert_eq!(out.exit.unwrap().exit_code, 3);
        assert!(matches!(
            table.write(&info.id, SessionInput::default()),
            Err(RuntimeError::CommandRejected(_))
        ));
        assert!(matches!(
            table
                .poll(
                    &SessionId::from("nope".to_string()),
                    futures::future::ready(())
                )
                .now_or_never(),
            Some(Err(RuntimeError::NotFound(_)))
        ));
    }
}
