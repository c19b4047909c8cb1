//! Interactive sessions in an E2B sandbox: a process started through envd's `Start`
//! with stdin enabled, fed by `SendInput` (and `CloseStdin` when the caller closes
//! it), its streamed output kept in the session's ring ([`SessionTable`]), killed with
//! `SendSignal` SIGKILL when the session is killed or its runtime stopped. While a
//! session runs, the sandbox's timeout is renewed (`POST /sandboxes/{id}/timeout`,
//! every third of it), so a long session is not paused under itself.
//!
//! Sessions are held in this provider's memory: they are not durable. Stopping or
//! destroying the runtime kills them before the sandbox is paused. A grove process
//! that dies without killing them leaves their processes to envd: they run until they
//! end by themselves or the sandbox is paused or killed.
//!
//! [`SessionTable`]: grove_core::session::SessionTable

use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use grove_core::error::RuntimeError;
use grove_core::ports::{
    ExecRequest, RuntimeSpec, SessionId, SessionInfo, SessionInput, SessionOutput, SessionRequest,
    Sessions,
};
use grove_core::session::Started;

use crate::{Client, E2bRuntimeProvider, Stdin};

/// Aborts a task when dropped (the keep-alive ends with the session's output).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Renews the sandbox's timeout every third of it, for as long as a session runs.
async fn keep_alive(client: Client, sandbox: String, timeout_secs: u64) {
    let every = Duration::from_secs(timeout_secs.max(3) / 3);
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = client.set_timeout(&sandbox, timeout_secs).await {
            tracing::debug!(%sandbox, error = %e, "renewing an e2b sandbox's timeout failed");
        }
    }
}

impl Sessions for E2bRuntimeProvider {
    /// A process in the runtime's sandbox, in its workspace (or `cwd` inside it),
    /// without timeout; its output is uncapped on the way and kept by the ring.
    fn start(
        &self,
        spec: RuntimeSpec,
        req: SessionRequest,
    ) -> BoxFuture<'_, Result<SessionInfo, RuntimeError>> {
        Box::pin(async move {
            let cap = req.buffer_bytes()?;
            self.inner.sessions.check_room()?;
            let runtime = self.runtime(spec).await?;
            let backend_id = runtime.key.backend_id("e2b");
            let argv = req.argv.clone();
            let (stdin, rx) = futures::channel::mpsc::unbounded();
            let output = runtime
                .spawn(
                    ExecRequest {
                        argv: req.argv,
                        cwd: req.cwd,
                        env: req.env,
                        timeout: None,
                        stdin: None,
                        max_output_bytes: Some(usize::MAX),
                        mutating: req.mutating,
                    },
                    Stdin::Channel(rx),
                )
                .await?;
            // The sandbox's clock runs regardless of activity: without renewal a
            // session older than the timeout would be paused (or killed) under it.
            let sandbox = self.sandbox(&runtime.key, runtime.network).await?;
            let keepalive = tokio::spawn(keep_alive(
                self.inner.client.clone(),
                sandbox.sandbox_id,
                self.inner.config.timeout_secs,
            ));
            let guard = AbortOnDrop(keepalive.abort_handle());
            let output = output
                .map(move |item| {
                    let _ = &guard;
                    item
                })
                .boxed();
            let (info, pump) =
                self.inner
                    .sessions
                    .insert(backend_id, argv, cap, Started { output, stdin })?;
            tokio::spawn(pump);
            Ok(info)
        })
    }

    fn write<'a>(
        &'a self,
        id: &'a SessionId,
        input: SessionInput,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move { self.inner.sessions.write(id, input) })
    }

    fn poll<'a>(
        &'a self,
        id: &'a SessionId,
        wait: Duration,
    ) -> BoxFuture<'a, Result<SessionOutput, RuntimeError>> {
        Box::pin(self.inner.sessions.poll(id, tokio::time::sleep(wait)))
    }

    fn kill<'a>(&'a self, id: &'a SessionId) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move { self.inner.sessions.kill(id) })
    }

    fn info(&self, id: &SessionId) -> Result<SessionInfo, RuntimeError> {
        self.inner.sessions.info(id)
    }

    fn list(&self) -> Vec<SessionInfo> {
        self.inner.sessions.list()
    }
}
