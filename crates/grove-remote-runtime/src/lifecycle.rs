//! The lifecycle of the one sandbox of a (user, project), written once for every
//! remote provider: find it (remembered, else by label), create it, converge after a
//! create race ([`crate::race`]), and recover from a failed call (start or resume a
//! stopped sandbox, create a gone one again) with one retry.
//!
//! A provider implements [`SandboxApi`] with its API calls only (list, create, start
//! or connect, inspect, delete); the order of those calls is decided here, so every
//! provider makes the same calls in the same order for the same situation.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;

use grove_core::error::RuntimeError;
use grove_core::ports::NetworkPolicy;

use crate::spec::{network_name, SandboxKey, LABEL_NETWORK};

/// The sandboxes a provider remembers, by key, as last seen; a lookup that misses
/// reads them again by label.
pub type KnownSandboxes<R> = tokio::sync::Mutex<HashMap<SandboxKey, R>>;

/// What reading a sandbox after a failed call found.
#[derive(Debug)]
pub enum Health<R> {
    /// It runs: the failure was the call's own.
    Running,
    /// It was stopped (or paused, or archived) and runs again, reached through `R`.
    Revived(R),
    /// It is gone (deleted, destroyed, killed): a new one is made.
    Gone,
}

/// One provider's sandbox API, as the lifecycle needs it.
pub trait SandboxApi: Send + Sync {
    /// A sandbox as a listing by label shows it.
    type Listed: Send;
    /// A sandbox ready for calls (what the provider remembers per key).
    type Ready: Clone + Send + Sync;
    /// The provider's error.
    type Error: Into<RuntimeError> + std::fmt::Display + Send;

    /// The provider's name, for the log.
    const NAME: &'static str;

    /// The sandboxes this provider remembers.
    fn known(&self) -> &KnownSandboxes<Self::Ready>;
    /// The labels (or metadata) that identify the sandbox of `key`.
    fn labels_of(&self, key: &SandboxKey) -> BTreeMap<String, String>;
    /// The id of a listed sandbox.
    fn listed_id(s: &Self::Listed) -> &str;
    /// The id of a ready sandbox.
    fn ready_id(s: &Self::Ready) -> &str;
    /// Whether an error says the sandbox does not exist.
    fn not_found(e: &Self::Error) -> bool;
    /// The one every racer keeps among a listing ([`crate::keep_oldest`]).
    fn oldest(listed: Vec<Self::Listed>) -> Option<Self::Listed>;
    /// A sandbox keeps the network it was created with.
    fn check_network(s: &Self::Listed, wanted: NetworkPolicy) -> Result<(), RuntimeError>;

    /// The sandboxes carrying `labels`.
    fn list(
        &self,
        labels: &BTreeMap<String, String>,
    ) -> impl Future<Output = Result<Vec<Self::Listed>, Self::Error>> + Send;
    /// Creates a sandbox with `labels` (the network label included) for `network`.
    fn create(
        &self,
        labels: BTreeMap<String, String>,
        network: NetworkPolicy,
    ) -> impl Future<Output = Result<Self::Ready, RuntimeError>> + Send;
    /// Makes a sandbox this worker created (and kept) ready for calls.
    fn settle(
        &self,
        created: Self::Ready,
    ) -> impl Future<Output = Result<Self::Ready, RuntimeError>> + Send;
    /// Makes a listed sandbox ready for calls (starts or connects it).
    fn adopt(
        &self,
        found: Self::Listed,
    ) -> impl Future<Output = Result<Self::Ready, RuntimeError>> + Send;
    /// Reads a sandbox after a failed call, reviving it when it is stopped.
    fn inspect(
        &self,
        s: &Self::Ready,
    ) -> impl Future<Output = Result<Health<Self::Ready>, RuntimeError>> + Send;
    /// Deletes (or kills) a sandbox.
    fn discard(&self, id: &str) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// The ready sandbox of `key`: the remembered one, else the one found by label
/// (started if stopped), else a new one.
pub async fn sandbox<A: SandboxApi>(
    api: &A,
    key: &SandboxKey,
    network: NetworkPolicy,
) -> Result<A::Ready, RuntimeError> {
    let mut known = api.known().lock().await;
    if let Some(s) = known.get(key) {
        return Ok(s.clone());
    }
    let found = A::oldest(api.list(&api.labels_of(key)).await.map_err(Into::into)?);
    let ready = match found {
        Some(s) => {
            A::check_network(&s, network)?;
            tracing::info!(provider = A::NAME, sandbox = %A::listed_id(&s), user = %key.user,
                project = %key.project, "sandbox recovered by label");
            api.adopt(s).await?
        }
        None => create(api, key, network).await?,
    };
    known.insert(key.clone(), ready.clone());
    Ok(ready)
}

async fn create<A: SandboxApi>(
    api: &A,
    key: &SandboxKey,
    network: NetworkPolicy,
) -> Result<A::Ready, RuntimeError> {
    let mut labels = api.labels_of(key);
    labels.insert(LABEL_NETWORK.into(), network_name(network).into());
    let created = api.create(labels, network).await?;
    tracing::info!(provider = A::NAME, sandbox = %A::ready_id(&created), user = %key.user,
        project = %key.project, "sandbox created");
    match converge(api, key, &created, network).await? {
        Some(keep) => api.adopt(keep).await,
        None => api.settle(created).await,
    }
}

/// After creating `ours`: another worker may have created a sandbox for the same key
/// at the same moment. Keeps the one every racer keeps (the oldest,
/// [`crate::survivor`]) and discards `ours` if it is not that one (`Some(kept)`); a
/// sandbox another racer created is never discarded here.
async fn converge<A: SandboxApi>(
    api: &A,
    key: &SandboxKey,
    ours: &A::Ready,
    network: NetworkPolicy,
) -> Result<Option<A::Listed>, RuntimeError> {
    let ours = A::ready_id(ours);
    let listed = api.list(&api.labels_of(key)).await.map_err(Into::into)?;
    let Some(keep) = A::oldest(listed) else {
        // Ours is not listed yet: nothing else to compare with.
        return Ok(None);
    };
    if A::listed_id(&keep) == ours {
        return Ok(None);
    }
    tracing::info!(provider = A::NAME, ours = %ours, kept = %A::listed_id(&keep), user = %key.user,
        project = %key.project, "another worker created this sandbox too: keeping the older one");
    match api.discard(ours).await {
        Ok(()) => {}
        Err(e) if A::not_found(&e) => {}
        Err(e) => {
            tracing::warn!(provider = A::NAME, sandbox = %ours, error = %e,
                "discarding the sandbox that lost a create race failed")
        }
    }
    A::check_network(&keep, network)?;
    Ok(Some(keep))
}

/// After a failed call on `s`: reads the sandbox, and revives or recreates it when
/// that explains the failure. `None`: the failure was the call's own.
async fn recover<A: SandboxApi>(
    api: &A,
    key: &SandboxKey,
    s: &A::Ready,
    network: NetworkPolicy,
) -> Result<Option<A::Ready>, RuntimeError> {
    match api.inspect(s).await? {
        Health::Running => Ok(None),
        Health::Revived(ready) => {
            api.known().lock().await.insert(key.clone(), ready.clone());
            Ok(Some(ready))
        }
        Health::Gone => {
            let id = A::ready_id(s);
            tracing::warn!(provider = A::NAME, sandbox = %id, "sandbox gone: creating it again");
            {
                let mut known = api.known().lock().await;
                if known.get(key).map(A::ready_id) == Some(id) {
                    known.remove(key);
                }
            }
            Ok(Some(sandbox(api, key, network).await?))
        }
    }
}

/// Runs `op` against the sandbox of `key`, with the recovery: on failure the
/// sandbox's state decides whether to retry once (on the revived or new sandbox).
pub async fn with_sandbox<A, T, E, F, Fut>(
    api: &A,
    key: &SandboxKey,
    network: NetworkPolicy,
    op: F,
) -> Result<(A::Ready, T), RuntimeError>
where
    A: SandboxApi,
    E: Into<RuntimeError>,
    F: Fn(A::Ready) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let s = sandbox(api, key, network).await?;
    match op(s.clone()).await {
        Ok(v) => Ok((s, v)),
        Err(first) => match recover(api, key, &s, network).await? {
            None => Err(first.into()),
            Some(s) => {
                let v = op(s.clone()).await.map_err(Into::into)?;
                Ok((s, v))
            }
        },
    }
}

/// Forgets `key`'s sandbox and discards every sandbox carrying its labels: the
/// explicit cleanup. Absent is success.
pub async fn discard_all<A: SandboxApi>(api: &A, key: &SandboxKey) -> Result<(), RuntimeError> {
    api.known().lock().await.remove(key);
    for s in api.list(&api.labels_of(key)).await.map_err(Into::into)? {
        match api.discard(A::listed_id(&s)).await {
            Ok(()) => {}
            Err(e) if A::not_found(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
