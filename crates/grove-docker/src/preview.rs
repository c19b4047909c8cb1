//! Preview URLs of Docker runtimes: a port of a runtime's container reachable at
//! `http://127.0.0.1:<random port>` on the machine of the provider's process.
//!
//! The engine's own port publishing is fixed when a container is created, and a
//! runtime's ports are not known then; replacing the container to add a binding would
//! kill the very server being previewed. So the provider publishes the port itself: a
//! TCP relay listening on loopback (port 0) that forwards each connection to the
//! container's address on its network, as the engine's proxy would. This needs:
//!
//! - a container on a network (spec network `default`, the `bridge` network). A
//!   runtime created with network `none` has only loopback: nothing outside it can
//!   reach its ports, so exposing one is `CommandRejected` saying so, never a silent
//!   widening of its network;
//! - the provider's process able to reach that address (a local engine).
//!
//! Relays are runtime state held in the provider's memory, like sessions: one per
//! (container, port), reused by later calls while the container keeps its address;
//! `stop` and `destroy` of the runtime close its relays, and they close with the
//! provider.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;

use bollard::models::ContainerInspectResponse;
use bollard::query_parameters::InspectContainerOptions;
use futures::future::BoxFuture;
use grove_core::error::RuntimeError;
use grove_core::ports::{PreviewRequest, PreviewUrl, PreviewUrls};

use crate::{engine_error, status, DockerRuntimeProvider, LABEL_MANAGED};

/// One published port: the loopback listener's task and where it forwards.
struct Relay {
    url: String,
    target: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The relays of one provider, by (container name, port).
#[derive(Default)]
pub(crate) struct Relays {
    map: Mutex<HashMap<(String, u16), Relay>>,
}

impl Relays {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u16), Relay>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes every relay of the container `name` (its runtime stops or goes away).
    pub(crate) fn close_of(&self, name: &str) {
        self.lock().retain(|(n, _), _| n != name);
    }
}

/// Accepts on `listener` until aborted; each connection is copied both ways to
/// `target`. A target that refuses (nothing listens yet) just closes that connection.
async fn relay(listener: tokio::net::TcpListener, target: SocketAddr) {
    loop {
        let mut inbound = match listener.accept().await {
            Ok((inbound, _)) => inbound,
            Err(e) => {
                // Out of descriptors and the like: wait rather than spin.
                tracing::debug!(error = %e, "accepting a preview connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        tokio::spawn(async move {
            match tokio::net::TcpStream::connect(target).await {
                Ok(mut outbound) => {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
                Err(e) => tracing::debug!(%target, error = %e, "preview target refused"),
            }
        });
    }
}

impl DockerRuntimeProvider {
    /// The container named `name` if this provider manages it and it carries the
    /// provider's scope labels; `NotFound` otherwise (absent, foreign or another
    /// deployment's), so a caller cannot reach containers grove does not own.
    pub(crate) async fn inspect_managed(
        &self,
        name: &str,
    ) -> Result<ContainerInspectResponse, RuntimeError> {
        let not_found = || RuntimeError::NotFound(format!("runtime {name}"));
        let container = match self
            .docker
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
        {
            Ok(c) => c,
            Err(e) if status(&e) == Some(404) => return Err(not_found()),
            Err(e) => return Err(engine_error("inspecting the container", &e)),
        };
        let labels = container.config.as_ref().and_then(|c| c.labels.as_ref());
        let in_scope = labels.is_some_and(|labels| {
            labels.get(LABEL_MANAGED).map(String::as_str) == Some("true")
                && self
                    .scope
                    .iter()
                    .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
        });
        if !in_scope {
            return Err(not_found());
        }
        Ok(container)
    }
}

impl PreviewUrls for DockerRuntimeProvider {
    /// `backend_id` is the container's name, as [`crate::DockerRuntimeProvider`]'s
    /// `backend_id` gives it. A container this provider does not manage (or outside
    /// its scope) is `NotFound`; one on network `none`, or not running, is
    /// `CommandRejected`.
    fn expose(&self, req: PreviewRequest) -> BoxFuture<'_, Result<PreviewUrl, RuntimeError>> {
        Box::pin(async move {
            if req.port == 0 {
                return Err(RuntimeError::CommandRejected(
                    "port 0 cannot be previewed".into(),
                ));
            }
            let container = self.inspect_managed(&req.backend_id).await?;
            let network = container
                .host_config
                .as_ref()
                .and_then(|h| h.network_mode.clone())
                .unwrap_or_default();
            if network == "none" {
                return Err(RuntimeError::CommandRejected(format!(
                    "runtime {} has network none: nothing outside it can reach port {}; \
                     a preview needs a runtime created with network default",
                    req.backend_id, req.port
                )));
            }
            let running = container
                .state
                .as_ref()
                .and_then(|s| s.running)
                .unwrap_or(false);
            if !running {
                return Err(RuntimeError::CommandRejected(format!(
                    "runtime {} is not running",
                    req.backend_id
                )));
            }
            let ip = container
                .network_settings
                .as_ref()
                .and_then(|n| n.networks.as_ref())
                .and_then(|nets| {
                    nets.get(&network)
                        .or_else(|| nets.values().next())
                        .and_then(|n| n.ip_address.clone())
                })
                .filter(|ip| !ip.is_empty())
                .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
                .ok_or_else(|| {
                    RuntimeError::Unavailable(format!(
                        "runtime {} has no address on its network {network}",
                        req.backend_id
                    ))
                })?;
            let target = SocketAddr::new(ip, req.port);
            let key = (req.backend_id.clone(), req.port);
            if let Some(r) = self.previews.lock().get(&key) {
                if r.target == target && !r.task.is_finished() {
                    return Ok(PreviewUrl {
                        port: req.port,
                        url: r.url.clone(),
                    });
                }
            }
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
                .await
                .map_err(|e| RuntimeError::Unavailable(format!("binding a loopback port: {e}")))?;
            let local = listener
                .local_addr()
                .map_err(|e| RuntimeError::Unavailable(format!("reading a bound port: {e}")))?;
            let url = format!("http://127.0.0.1:{}", local.port());
            let task = tokio::spawn(relay(listener, target));
            let mut relays = self.previews.lock();
            // A concurrent expose of the same port may have won: keep theirs.
            if let Some(r) = relays.get(&key) {
                if r.target == target && !r.task.is_finished() {
                    task.abort();
                    return Ok(PreviewUrl {
                        port: req.port,
                        url: r.url.clone(),
                    });
                }
            }
            relays.insert(
                key,
                Relay {
                    url: url.clone(),
                    target,
                    task,
                },
            );
            tracing::info!(runtime = %req.backend_id, port = req.port, %url, "port previewed");
            Ok(PreviewUrl {
                port: req.port,
                url,
            })
        })
    }
}
