//! Submitting commands in-process: route, `queue::enqueue`, then wait for the ledger row
//! to finish, woken by `NOTIFY grove_command_done` (one shared LISTEN connection) with a
//! 250 ms polling fallback, as `grove-cli`'s client does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Result};
use grove_core::commands::{Command, CommandResult};
use grove_postgres::{queue, rows};
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

    /// The queue a command belongs on (mirrors grove-cli's `route`).
    async fn route(&self, command: &Command) -> Result<String> {
        let mut conn = self.pool.acquire().await?;
        if let Some(id) = command.workspace_id() {
            let ws = rows::workspace(&mut conn, id)
                .await?
                .ok_or_else(|| anyhow!("workspace {id} not found"))?;
            return Ok(queue::placement_queue(&ws.node));
        }
        if let Command::AcquireWorkspace(c) = command {
            if let Some(ws) = rows::workspace_by_key(&mut conn, &c.key("")).await? {
                return Ok(queue::placement_queue(&ws.node));
            }
        }
        Ok(queue::shared_queue())
    }

    /// Enqueues without waiting; returns the command id.
    pub async fn enqueue_to(&self, command: &Command, queue_name: &str) -> Result<Uuid> {
        let id = Uuid::now_v7();
        let mut tx = self.pool.begin().await?;
        queue::enqueue(&mut tx, id, command, queue_name, None).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Enqueues `command` and waits for its outcome.
    pub async fn submit(&self, command: &Command) -> Result<CommandResult> {
        let id = Uuid::now_v7();
        let queue_name = self.route(command).await?;
        let notify = Arc::new(Notify::new());
        self.waiters.lock().unwrap().insert(id, notify.clone());
        let res = async {
            let mut tx = self.pool.begin().await?;
            queue::enqueue(&mut tx, id, command, &queue_name, None).await?;
            tx.commit().await?;
            self.wait(id, &notify).await
        }
        .await;
        self.waiters.lock().unwrap().remove(&id);
        res
    }

    async fn wait(&self, id: Uuid, notify: &Notify) -> Result<CommandResult> {
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        loop {
            let status = {
                let mut conn = self.pool.acquire().await?;
                queue::status(&mut conn, id).await?
            }
            .ok_or_else(|| anyhow!("command {id} vanished from the ledger"))?;
            if status.is_finished() {
                if let Some(err) = status.error.filter(|_| status.status == "failed") {
                    return Err(anyhow!("{}: {}", err.kind.as_str(), err.message));
                }
                return Ok(status.result.unwrap_or(CommandResult::Done));
            }
            if std::time::Instant::now() > deadline {
                return Err(anyhow!("command {id} did not finish within 300 s"));
            }
            let _ = tokio::time::timeout(Duration::from_millis(250), notify.notified()).await;
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.listener.abort();
    }
}
