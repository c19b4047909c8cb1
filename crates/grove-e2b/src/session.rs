//! Interactive sessions in an E2B sandbox: a process started through envd's `Start`
//! with stdin enabled, fed by `SendInput` (and `CloseStdin` when the caller closes
//! it), its streamed output kept in the session's ring ([`SessionTable`]), killed with
//! `SendSignal` SIGKILL when the session is killed or its runtime stopped.
//!
//! Sessions are held in this provider's memory: they are not durable. Stopping or
//! destroying the runtime kills them before the sandbox is paused. A grove process
//! that dies without killing them leaves their processes to envd: they run until they
//! end by themselves or the sandbox is paused or killed.
//!
//! [`SessionTable`]: grove_core::session::SessionTable

use std::time::Duration;

use futures::future::BoxFuture;
use grove_core::error::RuntimeError;
use grove_core::ports::{
    ExecRequest, RuntimeSpec, SessionId, SessionInfo, SessionInput, SessionOutput, SessionRequest,
    Sessions,
};
use grove_core::session::Started;

use crate::{E2bRuntimeProvider, Stdin};

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
