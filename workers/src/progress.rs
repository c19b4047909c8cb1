//! Progress of a running clone or fetch, written to the command's ledger row at most
//! twice a second: the git adapter reports every snapshot into a watch channel, and one
//! task per transfer writes the newest one, then waits. Not an event (ADR 25).
//!
//! Crash behaviour: nothing to recover; a dead worker's last snapshot stays on the row
//! and the next attempt overwrites it.

use std::time::Duration;

use grove_core::transfer::{TransferProgress, TransferWatch};
use sqlx::PgPool;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uuid::Uuid;

/// The least time between two writes of one command's progress.
pub const MIN_INTERVAL: Duration = Duration::from_millis(500);

/// A watch whose snapshots reach `command_id`'s ledger row, and the task writing them.
/// The task ends (after writing the last snapshot) once every clone of the watch is
/// dropped.
pub fn recorder(pool: PgPool, command_id: Uuid) -> (TransferWatch, JoinHandle<()>) {
    let (tx, rx) = watch::channel(None::<TransferProgress>);
    let watch = TransferWatch::with_sink(move |p| {
        tx.send_replace(Some(p.clone()));
    });
    (watch, tokio::spawn(write_loop(pool, command_id, rx)))
}

async fn write_loop(
    pool: PgPool,
    command_id: Uuid,
    mut rx: watch::Receiver<Option<TransferProgress>>,
) {
    let mut written: Option<TransferProgress> = None;
    let mut next_write = Instant::now();
    loop {
        let mut open = rx.changed().await.is_ok();
        // Hold newer snapshots back until MIN_INTERVAL has passed since the last write,
        // but write the final one as soon as the transfer ends.
        while open && Instant::now() < next_write {
            tokio::select! {
                _ = tokio::time::sleep_until(next_write) => break,
                changed = rx.changed() => open = changed.is_ok(),
            }
        }
        let latest = rx.borrow_and_update().clone();
        if let Some(p) = latest.as_ref().filter(|_| latest != written) {
            if let Err(e) = grove_postgres::progress::record(&pool, command_id, p).await {
                tracing::debug!(command = %command_id, error = %e, "progress not recorded");
            }
            written = latest;
            next_write = Instant::now() + MIN_INTERVAL;
        }
        if !open {
            return;
        }
    }
}
