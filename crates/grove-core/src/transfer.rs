//! Progress of a clone or fetch as data, and the handle through which a caller watches
//! and stops one: what the git adapter reports while it transfers, what the worker
//! stores on the running command, and what the CLI and the HTTP API show.
//!
//! Progress is not an event: it is overwritten while the command runs and says nothing
//! a replay needs, so the log stays exact (ADR 25).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// The phase of a transfer, in the order git goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransferPhase {
    /// Connected (or connecting); nothing counted yet.
    #[default]
    Connecting,
    /// The remote enumerates or counts the objects to send.
    Counting,
    /// The remote compresses them.
    Compressing,
    /// Objects arrive (`objects_done` of `objects_total`, `bytes` so far).
    Receiving,
    /// The received pack is indexed (deltas resolved).
    Resolving,
    /// The received history is checked for completeness.
    Checking,
    /// Refs updated; the transfer is over.
    Done,
}

impl TransferPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connecting => "connecting",
            Self::Counting => "counting",
            Self::Compressing => "compressing",
            Self::Receiving => "receiving",
            Self::Resolving => "resolving",
            Self::Checking => "checking",
            Self::Done => "done",
        }
    }
}

/// One snapshot of a transfer's progress. Counters of a phase git has not reported yet
/// stay zero; `percent` is of the current phase.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferProgress {
    pub phase: TransferPhase,
    /// Objects of the current phase done and in total (0 when unknown).
    pub objects_done: u64,
    pub objects_total: u64,
    /// Objects received (kept through the later phases).
    pub objects_received: u64,
    /// Deltas resolved of the total (indexing).
    pub deltas_done: u64,
    pub deltas_total: u64,
    /// Bytes of pack data received so far.
    pub bytes_received: u64,
    /// The receive rate git last reported, in bytes per second.
    pub bytes_per_sec: u64,
    /// Percent of the current phase, when git gives one.
    pub percent: Option<u8>,
}

/// Where progress snapshots go.
type Sink = Arc<dyn Fn(&TransferProgress) + Send + Sync>;

/// What a caller hands to a clone or fetch: a sink for progress snapshots (called from
/// the transferring thread, as often as git reports; the caller rate-limits what it
/// stores) and a flag that stops the transfer when set.
#[derive(Clone, Default)]
pub struct TransferWatch {
    cancel: Arc<AtomicBool>,
    sink: Option<Sink>,
}

impl std::fmt::Debug for TransferWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferWatch")
            .field("cancelled", &self.is_cancelled())
            .field("sink", &self.sink.is_some())
            .finish()
    }
}

impl TransferWatch {
    /// Watches nothing and is never cancelled unless [`cancel`](Self::cancel) is called.
    pub fn none() -> Self {
        Self::default()
    }

    /// Reports every snapshot to `sink`.
    pub fn with_sink(sink: impl Fn(&TransferProgress) + Send + Sync + 'static) -> Self {
        Self {
            cancel: Arc::default(),
            sink: Some(Arc::new(sink)),
        }
    }

    pub fn report(&self, progress: &TransferProgress) {
        if let Some(sink) = &self.sink {
            sink(progress);
        }
    }

    /// Asks the transfer to stop; it ends with `GitError::Cancelled`.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    /// A guard that cancels this watch when dropped: held by async code around a
    /// blocking transfer, so dropping the job's future stops git too.
    pub fn cancel_on_drop(&self) -> CancelOnDrop {
        CancelOnDrop {
            cancel: self.cancel.clone(),
            armed: true,
        }
    }
}

/// Cancels its watch when dropped, unless [`disarm`](Self::disarm)ed first.
#[derive(Debug)]
pub struct CancelOnDrop {
    cancel: Arc<AtomicBool>,
    armed: bool,
}

impl CancelOnDrop {
    /// The transfer finished: dropping the guard no longer cancels anything.
    pub fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.cancel.store(true, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn a_dropped_guard_cancels_the_watch_and_a_disarmed_one_does_not() {
        let watch = TransferWatch::none();
        watch.cancel_on_drop().disarm();
        assert!(!watch.is_cancelled());
        drop(watch.cancel_on_drop());
        assert!(watch.is_cancelled());
    }

    #[test]
    fn reports_reach_the_sink_and_serialize_with_snake_case_phases() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let watch = TransferWatch::with_sink(move |p| s.lock().unwrap().push(p.clone()));
        let p = TransferProgress {
            phase: TransferPhase::Receiving,
            objects_done: 5,
            objects_total: 10,
            percent: Some(50),
            ..Default::default()
        };
        watch.report(&p);
        assert_eq!(seen.lock().unwrap().as_slice(), std::slice::from_ref(&p));
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["phase"], "receiving");
        assert_eq!(json["percent"], 50);
    }
}
