//! E2B's calls for the shared sandbox lifecycle ([`grove_remote_runtime::lifecycle`]):
//! list by metadata, create, connect (which resumes a paused sandbox), read the state
//! after a failed envd call, kill. A ready sandbox is the info `connect` answered.

use std::collections::BTreeMap;

use grove_core::error::RuntimeError;
use grove_core::ports::NetworkPolicy;
use grove_remote_runtime::lifecycle::{Health, KnownSandboxes, SandboxApi};
use grove_remote_runtime::SandboxKey;

use crate::api::{self, SandboxInfo, SandboxState};
use crate::{E2bError, Inner};

impl SandboxApi for Inner {
    type Listed = SandboxInfo;
    type Ready = SandboxInfo;
    type Error = E2bError;

    const NAME: &'static str = "e2b";

    fn known(&self) -> &KnownSandboxes<SandboxInfo> {
        &self.known
    }

    fn labels_of(&self, key: &SandboxKey) -> BTreeMap<String, String> {
        key.labels(&self.scope)
    }

    fn listed_id(s: &SandboxInfo) -> &str {
        &s.sandbox_id
    }

    fn ready_id(s: &SandboxInfo) -> &str {
        &s.sandbox_id
    }

    fn not_found(e: &E2bError) -> bool {
        matches!(e, E2bError::Api { status: 404, .. })
    }

    fn oldest(listed: Vec<SandboxInfo>) -> Option<SandboxInfo> {
        crate::oldest(listed)
    }

    fn check_network(s: &SandboxInfo, wanted: NetworkPolicy) -> Result<(), RuntimeError> {
        crate::check_network(s, wanted)
    }

    async fn list(&self, labels: &BTreeMap<String, String>) -> Result<Vec<SandboxInfo>, E2bError> {
        self.client.list(labels).await
    }

    async fn create(
        &self,
        metadata: BTreeMap<String, String>,
        network: NetworkPolicy,
    ) -> Result<SandboxInfo, RuntimeError> {
        if network == NetworkPolicy::Limited {
            return Err(RuntimeError::CommandRejected(
                "network limited is not offered by the E2B runtime (none or default)".into(),
            ));
        }
        let c = &self.config;
        let body = api::NewSandbox {
            template_id: c.template.clone(),
            timeout: c.timeout_secs,
            auto_pause: c.auto_pause,
            secure: true,
            metadata,
            env_vars: BTreeMap::new(),
            allow_internet_access: network == NetworkPolicy::Default,
        };
        Ok(self.client.create(&body).await?)
    }

    /// A sandbox just created is connected already.
    async fn settle(&self, created: SandboxInfo) -> Result<SandboxInfo, RuntimeError> {
        Ok(created)
    }

    async fn adopt(&self, found: SandboxInfo) -> Result<SandboxInfo, RuntimeError> {
        Ok(self
            .client
            .connect(&found.sandbox_id, self.config.timeout_secs)
            .await?)
    }

    async fn inspect(&self, info: &SandboxInfo) -> Result<Health<SandboxInfo>, RuntimeError> {
        let id = &info.sandbox_id;
        match self.client.get(id).await {
            Ok(s) if s.state == Some(SandboxState::Paused) => {
                tracing::info!(sandbox = %id, "e2b sandbox paused: resuming it");
                let info = self.client.connect(id, self.config.timeout_secs).await?;
                Ok(Health::Revived(info))
            }
            Ok(_) => Ok(Health::Running),
            Err(E2bError::Api { status: 404, .. }) => Ok(Health::Gone),
            Err(e) => Err(e.into()),
        }
    }

    async fn discard(&self, id: &str) -> Result<(), E2bError> {
        self.client.kill(id).await
    }
}
