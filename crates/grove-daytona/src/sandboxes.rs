//! Daytona's calls for the shared sandbox lifecycle
//! ([`grove_remote_runtime::lifecycle`]): list by label, create, start (and wait for
//! `started`), read the state after a failed call, delete. A ready sandbox is its id.

use std::collections::BTreeMap;
use std::time::Instant;

use grove_core::error::RuntimeError;
use grove_core::ports::NetworkPolicy;
use grove_remote_runtime::lifecycle::{Health, KnownSandboxes, SandboxApi};
use grove_remote_runtime::SandboxKey;

use crate::api::{self, Sandbox, SandboxState};
use crate::{DaytonaError, Inner};

impl SandboxApi for Inner {
    type Listed = Sandbox;
    type Ready = String;
    type Error = DaytonaError;

    const NAME: &'static str = "daytona";

    fn known(&self) -> &KnownSandboxes<String> {
        &self.sandboxes
    }

    fn labels_of(&self, key: &SandboxKey) -> BTreeMap<String, String> {
        key.labels(&self.scope)
    }

    fn listed_id(s: &Sandbox) -> &str {
        &s.id
    }

    fn ready_id(s: &String) -> &str {
        s
    }

    fn not_found(e: &DaytonaError) -> bool {
        matches!(e, DaytonaError::Api { status: 404, .. })
    }

    fn oldest(listed: Vec<Sandbox>) -> Option<Sandbox> {
        crate::oldest(listed)
    }

    fn check_network(s: &Sandbox, wanted: NetworkPolicy) -> Result<(), RuntimeError> {
        crate::check_network(s, wanted)
    }

    async fn list(&self, labels: &BTreeMap<String, String>) -> Result<Vec<Sandbox>, DaytonaError> {
        self.client.list_sandboxes(labels).await
    }

    async fn create(
        &self,
        labels: BTreeMap<String, String>,
        network: NetworkPolicy,
    ) -> Result<String, RuntimeError> {
        let c = &self.config;
        let allow = match network {
            NetworkPolicy::Limited => Some(c.network_allow_list.clone().ok_or_else(|| {
                RuntimeError::CommandRejected(
                    "network limited needs GROVE_DAYTONA_NETWORK_ALLOW_LIST on this deployment"
                        .into(),
                )
            })?),
            _ => None,
        };
        let body = api::CreateSandbox {
            snapshot: c.snapshot.clone(),
            user: None,
            env: BTreeMap::new(),
            labels,
            target: c.target.clone(),
            cpu: c.cpu,
            memory: c.memory_gib,
            disk: c.disk_gib,
            auto_stop_interval: c.auto_stop_minutes,
            auto_archive_interval: c.auto_archive_minutes,
            network_block_all: network == NetworkPolicy::None,
            network_allow_list: allow,
        };
        Ok(self.client.create_sandbox(&body).await?.id)
    }

    async fn settle(&self, created: String) -> Result<String, RuntimeError> {
        self.ensure_started(&created).await?;
        Ok(created)
    }

    async fn adopt(&self, found: Sandbox) -> Result<String, RuntimeError> {
        self.ensure_started(&found.id).await?;
        Ok(found.id)
    }

    async fn inspect(&self, id: &String) -> Result<Health<String>, RuntimeError> {
        match self.client.get_sandbox(id).await {
            Ok(s) if s.state == SandboxState::Started => Ok(Health::Running),
            Ok(s) if s.state != SandboxState::Destroyed && s.state != SandboxState::Destroying => {
                tracing::info!(sandbox = %id, state = ?s.state, "daytona sandbox not started: starting it");
                self.ensure_started(id).await?;
                Ok(Health::Revived(id.clone()))
            }
            Ok(_) | Err(DaytonaError::Api { status: 404, .. }) => Ok(Health::Gone),
            Err(e) => Err(e.into()),
        }
    }

    async fn discard(&self, id: &str) -> Result<(), DaytonaError> {
        self.client.delete_sandbox(id).await
    }
}

impl Inner {
    /// Waits for `id` to be started, starting it when it is stopped or archived.
    pub(crate) async fn ensure_started(&self, id: &str) -> Result<(), RuntimeError> {
        let deadline = Instant::now() + self.config.start_timeout;
        let mut asked = false;
        loop {
            let s = self.client.get_sandbox(id).await?;
            match s.state {
                SandboxState::Started => return Ok(()),
                SandboxState::Stopped | SandboxState::Archived if !asked => {
                    match self.client.start_sandbox(id).await {
                        // A start racing another start answers with a conflict or a
                        // validation error; the state read below decides.
                        Ok(()) => {}
                        Err(e) if matches!(e.status(), Some(400 | 409)) => {}
                        Err(e) => return Err(e.into()),
                    }
                    asked = true;
                }
                SandboxState::Error | SandboxState::BuildFailed => {
                    return Err(DaytonaError::Broken {
                        id: id.to_string(),
                        state: format!("{:?}", s.state).to_lowercase(),
                        reason: s.error_reason.unwrap_or_default(),
                    }
                    .into())
                }
                SandboxState::Destroyed => {
                    return Err(RuntimeError::NotFound(format!(
                        "sandbox {id} was destroyed"
                    )))
                }
                _ => {}
            }
            if Instant::now() >= deadline {
                return Err(RuntimeError::Timeout(format!(
                    "sandbox {id} not started after {:?} (state {:?})",
                    self.config.start_timeout, s.state
                )));
            }
            tokio::time::sleep(self.config.poll_interval).await;
        }
    }
}
