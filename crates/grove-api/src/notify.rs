//! One LISTEN connection per server, fanned out to the requests waiting on it.
//!
//! Requests wait on commands (`grove_command_done`), on relayed exec output
//! (`grove_exec_output`) and on the event log (`grove_events`). Rather than a connection
//! per request, one task LISTENs on all three and bumps a per-id `watch` counter (or the
//! log's counter). A `watch` remembers a bump that happened while nobody was waiting, so
//! a subscriber made before it enqueues cannot miss its command's notification. Every
//! waiter also polls: a notification lost while the listener reconnects only delays.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use grove_postgres::output::OUTPUT_CHANNEL;
use grove_postgres::queue::DONE_CHANNEL;
use grove_postgres::submit::Wakeup;
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::watch;
use uuid::Uuid;

/// The channel the event log's insert trigger notifies on.
pub const EVENTS_CHANNEL: &str = "grove_events";

type Waiters = Arc<Mutex<HashMap<Uuid, watch::Sender<u64>>>>;

/// The shared listener.
#[derive(Clone)]
pub struct Notifier {
    waiters: Waiters,
    events: watch::Sender<u64>,
}

impl Notifier {
    /// Connects, LISTENs, and spawns the fan-out task.
    pub async fn start(pool: &PgPool) -> Result<Self, sqlx::Error> {
        let mut listener = PgListener::connect_with(pool).await?;
        listener
            .listen_all([DONE_CHANNEL, OUTPUT_CHANNEL, EVENTS_CHANNEL])
            .await?;
        let notifier = Self {
            waiters: Default::default(),
            events: watch::Sender::new(0),
        };
        let fan_out = notifier.clone();
        tokio::spawn(async move {
            loop {
                match listener.recv().await {
                    Ok(n) if n.channel() == EVENTS_CHANNEL => fan_out.bump_events(),
                    Ok(n) => {
                        if let Ok(id) = Uuid::parse_str(n.payload()) {
                            fan_out.bump(id);
                        }
                    }
                    Err(e) => {
                        // The next recv reconnects; whatever was missed, waiters re-read.
                        tracing::warn!(error = %e, "API listener lost its connection");
                        fan_out.bump_all();
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });
        Ok(notifier)
    }

    /// Starts waiting on `id` (a command or an exec). Subscribe before enqueueing.
    pub fn subscribe(&self, id: Uuid) -> Subscription {
        let rx = {
            let mut map = self.waiters.lock().expect("waiters lock");
            map.entry(id)
                .or_insert_with(|| watch::Sender::new(0))
                .subscribe()
        };
        Subscription {
            id,
            rx,
            waiters: self.waiters.clone(),
        }
    }

    /// A receiver bumped whenever events were appended to the log.
    pub fn events(&self) -> watch::Receiver<u64> {
        self.events.subscribe()
    }

    fn bump(&self, id: Uuid) {
        if let Some(tx) = self.waiters.lock().expect("waiters lock").get(&id) {
            tx.send_modify(|n| *n += 1);
        }
    }

    fn bump_events(&self) {
        self.events.send_modify(|n| *n += 1);
    }

    fn bump_all(&self) {
        for tx in self.waiters.lock().expect("waiters lock").values() {
            tx.send_modify(|n| *n += 1);
        }
        self.bump_events();
    }
}

/// A request's wait on one id; unsubscribes when dropped.
pub struct Subscription {
    id: Uuid,
    rx: watch::Receiver<u64>,
    waiters: Waiters,
}

impl Subscription {
    /// Returns when the id was notified since the last call, or after `max`.
    pub async fn changed_or(&mut self, max: Duration) {
        let _ = tokio::time::timeout(max, self.rx.changed()).await;
    }
}

impl Wakeup for Subscription {
    fn wait(&mut self, _command_id: Uuid, max: Duration) -> BoxFuture<'_, ()> {
        Box::pin(self.changed_or(max))
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut map = self.waiters.lock().expect("waiters lock");
        // Our own receiver still counts while we drop.
        if map.get(&self.id).is_some_and(|tx| tx.receiver_count() <= 1) {
            map.remove(&self.id);
        }
    }
}
