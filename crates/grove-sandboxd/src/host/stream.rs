//! The consumer's end of one exec, as every host runtime returns it: chunks as they
//! arrive, then the result; the command is killed when the stream is dropped before
//! it ended ([`KillOnDrop`]). And the output cap an exec's readers share ([`Budget`]).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::stream::Stream;
use grove_core::error::RuntimeError;
use grove_core::ports::ExecChunk;
use tokio::sync::mpsc;

/// One item of an exec's stream.
pub type Item = Result<ExecChunk, RuntimeError>;

/// How to kill one exec's command (its process group, its agent exec, ...).
pub trait Kill: Send + Sync {
    /// Kills the command unless it already ended; never blocks.
    fn kill(&self);
}

impl<K: Kill + ?Sized> Kill for Arc<K> {
    fn kill(&self) {
        (**self).kill()
    }
}

/// Kills the command when dropped (before it ended: [`Kill::kill`] does nothing
/// after the end).
pub struct KillOnDrop<K: Kill>(pub K);

impl<K: Kill> Drop for KillOnDrop<K> {
    fn drop(&mut self) {
        self.0.kill();
    }
}

/// The consumer's end: what the exec's producers send, in order.
pub struct ExecStream<K: Kill + Unpin> {
    rx: mpsc::UnboundedReceiver<Item>,
    _guard: KillOnDrop<K>,
}

impl<K: Kill + Unpin> ExecStream<K> {
    /// The stream of `rx`, killing through `kill` when dropped early.
    pub fn new(rx: mpsc::UnboundedReceiver<Item>, kill: K) -> Self {
        Self {
            rx,
            _guard: KillOnDrop(kill),
        }
    }
}

impl<K: Kill + Unpin> Stream for ExecStream<K> {
    type Item = Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        self.rx.poll_recv(cx)
    }
}

/// The output cap, shared by stdout and stderr (the cap is on both combined).
#[derive(Debug)]
pub struct Budget {
    remaining: AtomicUsize,
    truncated: AtomicBool,
}

impl Budget {
    /// A budget of `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Self {
            remaining: AtomicUsize::new(cap),
            truncated: AtomicBool::new(false),
        }
    }

    /// Reserves up to `n` bytes; returns how many may be kept.
    pub fn take(&self, n: usize) -> usize {
        let mut granted = 0;
        let _ = self
            .remaining
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |rem| {
                granted = rem.min(n);
                Some(rem - granted)
            });
        if granted < n {
            self.truncated.store(true, Ordering::SeqCst);
        }
        granted
    }

    /// Whether output past the cap was dropped.
    pub fn truncated(&self) -> bool {
        self.truncated.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_shared_and_marks_truncation() {
        let b = Budget::new(10);
        assert_eq!(b.take(6), 6);
        assert!(!b.truncated());
        assert_eq!(b.take(6), 4);
        assert_eq!(b.take(1), 0);
        assert!(b.truncated());
    }

    struct Count(AtomicUsize);

    impl Kill for Count {
        fn kill(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn dropping_the_stream_kills_once() {
        let kills = Arc::new(Count(AtomicUsize::new(0)));
        let (_tx, rx) = mpsc::unbounded_channel();
        drop(ExecStream::new(rx, kills.clone()));
        assert_eq!(kills.0.load(Ordering::SeqCst), 1);
    }
}
