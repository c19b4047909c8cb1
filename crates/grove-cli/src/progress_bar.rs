//! The terminal progress bar of a command that may clone or fetch (`grove repo ensure`,
//! `grove workspace acquire`): the command's ledger progress (written by the worker,
//! ADR 25) polled a few times a second and drawn on stderr, only on a terminal and
//! never with `--json`.

use std::io::IsTerminal;
use std::time::Duration;

use grove_core::transfer::{TransferPhase, TransferProgress};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use uuid::Uuid;

const POLL: Duration = Duration::from_millis(250);
const MIB: f64 = 1024.0 * 1024.0;

/// A bar following one command until [`Bar::finish`].
pub(crate) struct Bar {
    bar: ProgressBar,
    task: JoinHandle<()>,
}

/// Starts following `command_id` when both stdout and stderr are a terminal and the
/// answer is not asked for as JSON; `None` otherwise (nothing extra for a script).
pub(crate) fn start(pool: &PgPool, command_id: Uuid, json: bool) -> Option<Bar> {
    if json || !std::io::stdout().is_terminal() || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{spinner} {prefix:>11} [{bar:30}] {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix("waiting");
    bar.enable_steady_tick(Duration::from_millis(120));
    let (pool, shown) = (pool.clone(), bar.clone());
    let task = tokio::spawn(async move {
        loop {
            if let Ok(mut conn) = pool.acquire().await {
                if let Ok(Some(found)) = grove_postgres::progress::read(&mut conn, command_id).await
                {
                    if let Some(p) = found.progress {
                        draw(&shown, &p);
                    }
                }
            }
            tokio::time::sleep(POLL).await;
        }
    });
    Some(Bar { bar, task })
}

impl Bar {
    /// Stops following and clears the bar.
    pub(crate) async fn finish(self) {
        self.task.abort();
        let _ = self.task.await;
        self.bar.finish_and_clear();
    }
}

/// One snapshot on the bar: the phase, objects of the phase, bytes and rate.
fn draw(bar: &ProgressBar, p: &TransferProgress) {
    bar.set_prefix(p.phase.as_str());
    bar.set_length(p.objects_total.max(1));
    bar.set_position(p.objects_done.min(p.objects_total));
    let mut msg = if p.objects_total > 0 {
        format!("{}/{} objects", p.objects_done, p.objects_total)
    } else {
        format!("{} objects", p.objects_done)
    };
    if p.bytes_received > 0 {
        msg.push_str(&format!(", {:.1} MiB", p.bytes_received as f64 / MIB));
    }
    if p.bytes_per_sec > 0 && p.phase == TransferPhase::Receiving {
        msg.push_str(&format!(" | {:.1} MiB/s", p.bytes_per_sec as f64 / MIB));
    }
    bar.set_message(msg);
}
