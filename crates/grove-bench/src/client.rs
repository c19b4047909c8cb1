//! Submitting commands in-process through `grove_postgres::submit` (route, enqueue, wait
//! for the ledger row to finish), woken by `NOTIFY grove_command_done` on one shared
//! LISTEN connection with the 250 ms polling fallback, as `grove serve` does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Result};
use futures::future::BoxFuture;
use grove_core::commands::{Command, CommandResult};
use grove_postgres::queue;
use grove_postgres::submit::{self, SubmitError, WaitOptions, Wakeup};
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::Notify;
use uuid::Uuid;

type Waiters = Arc<Mutex<HashMap<Uuid, Arc<Notify>>>>;

/// A caller of grove sharing one listener among all its waiting commands.
pub struct Client {
    pub pool: PgPool,
    waiters: Waiters,
    listener: tokio::task::JoinHandle<()>,
}

impl Client {
    pub async fn new(pool: PgPool) -> Result<Self> {
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.listen(queue::DONE_CHANNEL).await?;
        let waiters: Waiters = Default::default();
        let w = waiters.clone();
        let listener = tokio::spawn(async move {
            while let Ok(n) = listener.recv().await {
                if let Ok(id) = Uuid::parse_str(n.payload()) {
                    if let Some(notify) = w.lock().unwrap().get(&id) {
                        notify.notify_one();
                    }
                }
            }
        });
        Ok(Self {
            pool,
            waiters,
            listener,
        })
    }

    /// Enqueues without waiting; returns the command id.
    pub async fn enqueue_to(&self, command: &Command, queue_name: &str) -> Result<Uuid> {
        let id = Uuid::now_v7();
        let mut tx = self.pool.begin().await?;
        queue::enqueue(&mut tx, id, command, queue_name, None).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Enqueues `command` and waits for its outcome, through `grove_postgres::submit`
    /// exactly as the CLI and the API do; only the wake-up is this client's own.
    pub async fn submit(&self, command: &Command) -> Result<CommandResult> {
        self.submit_with_token(command, None).await
    }

    /// [`Client::submit`] with a git token handed over as the CLI hands it.
    pub async fn submit_with_token(
        &self,
        command: &Command,
        token: Option<&str>,
    ) -> Result<CommandResult> {
        let id = Uuid::now_v7();
        let notify = Arc::new(Notify::new());
        self.waiters.lock().unwrap().insert(id, notify.clone());
        let opts = WaitOptions {
            claim_timeout: Duration::from_secs(300),
            ..WaitOptions::default()
        };
        let res = submit::submit(
            &self.pool,
            command,
            Some(id),
            token,
            &mut Waiter(notify),
            opts,
        )
        .await;
        self.waiters.lock().unwrap().remove(&id);
        match res {
            Ok(r) => Ok(r),
            Err(SubmitError::Command(e)) => Err(anyhow!("{}: {}", e.kind.as_str(), e.message)),
            Err(e) => Err(e.into()),
        }
    }
}

/// One command's wake-up: the shared listener notifies it when its outcome is announced
/// (a notification that comes before the wait is kept as a permit).
struct Waiter(Arc<Notify>);

impl Wakeup for Waiter {
    fn wait(&mut self, _command_id: Uuid, max: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let _ = tokio::time::timeout(max, self.0.notified()).await;
        })
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.listener.abort();
    }
}
