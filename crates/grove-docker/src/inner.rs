//! What every exec of one runtime shares ([`Inner`]): the engine, the container, the
//! workspace's place in it, its limits and counters, its exec agents; and the engine
//! calls around an exec (create one, start or restart the container, run a helper
//! command to completion).
//!
//! Imported by `exec` (the commands), `fresh` (scratch directories) and the crate
//! root; it imports only `agent` and `host`, neither of which imports it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::{InspectContainerOptions, RestartContainerOptionsBuilder};
use bollard::Docker;
use futures::stream::StreamExt;
use grove_core::error::RuntimeError;

use crate::host::{Cgroups, Counters};
use crate::{engine_error, status};

/// Shell script printing the container's limit counters from inside (cgroup v1 and
/// v2 layouts), each file after a `== path` line.
const COUNTERS_SCRIPT: &str = "for f in /sys/fs/cgroup/memory/memory.oom_control \
     /sys/fs/cgroup/pids/pids.events /sys/fs/cgroup/memory.events /sys/fs/cgroup/pids.events; \
     do [ -r \"$f\" ] && { echo \"== $f\"; cat \"$f\"; }; done; true";

/// What every exec of one runtime shares.
pub(crate) struct Inner {
    pub docker: Docker,
    pub container_id: String,
    pub name: String,
    pub runtime_id: String,
    pub host_workdir: PathBuf,
    pub inside_workdir: PathBuf,
    pub workdir_writable: bool,
    pub memory_mb: u64,
    pub pids: u64,
    /// Whether the provider may use the host's /proc and cgroup files.
    pub host_access: bool,
    /// The container's counter files on the host, when visible.
    pub cgroups: Mutex<Option<Cgroups>>,
    /// The exec agents, when the container has the agent binary mounted.
    pub agents: Option<Arc<crate::agent::Pool>>,
    /// The container's environment (what an engine exec starts from; an agent's
    /// command gets exactly this plus the request's env).
    pub env: Vec<(String, String)>,
}

impl Inner {
    pub(crate) fn host_counters(&self) -> Option<Counters> {
        self.cgroups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(Cgroups::read)
    }

    pub(crate) fn sees_host(&self) -> bool {
        self.host_access
            && self
                .cgroups
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some()
    }

    /// Reads the counters by running a command inside the container (through the
    /// agent when there is one).
    pub(crate) async fn counters_inside(&self) -> Option<Counters> {
        let argv = vec!["sh".to_string(), "-c".into(), COUNTERS_SCRIPT.into()];
        let (code, out) = match self.capture_by_agent(argv.clone()).await {
            Some(r) => r,
            None => self.capture(argv).await.ok()?,
        };
        if code != 0 {
            return None;
        }
        let text = String::from_utf8_lossy(&out);
        let mut c = Counters::default();
        let mut file = String::new();
        let mut body = String::new();
        for line in text.lines().chain(std::iter::once("== end")) {
            if let Some(f) = line.strip_prefix("== ") {
                if !file.is_empty() {
                    c.parse_into(&file, &body);
                }
                file = f.to_string();
                body.clear();
            } else {
                body.push_str(line);
                body.push('\n');
            }
        }
        Some(c)
    }

    /// [`Self::capture`] through the agent; `None` when there is none or it failed.
    pub(crate) async fn capture_by_agent(&self, argv: Vec<String>) -> Option<(i64, Vec<u8>)> {
        let pool = self.agents.as_ref()?;
        let exec = crate::agent::AgentExec {
            argv,
            cwd: "/".into(),
            env: self.env.clone(),
            stdin: None,
            timeout: Some(Duration::from_secs(10)),
            max_output: 1024 * 1024,
        };
        let stream = pool.exec(self, exec).await.ok()?;
        let r = grove_core::ports::collect_exec(stream).await.ok()?;
        Some((i64::from(r.exit_code), r.stdout))
    }

    /// Runs a short helper command to completion: (exit code, stdout).
    pub(crate) async fn capture(&self, argv: Vec<String>) -> Result<(i64, Vec<u8>), RuntimeError> {
        let exec_id = self.create_exec(argv, Vec::new(), None, false).await?;
        let mut out = Vec::new();
        if let StartExecResults::Attached { mut output, .. } = self
            .docker
            .start_exec(&exec_id, Some(StartExecOptions::default()))
            .await
            .map_err(|e| engine_error("starting a helper command", &e))?
        {
            while let Some(Ok(item)) = output.next().await {
                if let LogOutput::StdOut { message } | LogOutput::Console { message } = item {
                    out.extend_from_slice(&message);
                }
            }
        }
        for _ in 0..200 {
            let r = self
                .docker
                .inspect_exec(&exec_id)
                .await
                .map_err(|e| engine_error("inspecting a helper command", &e))?;
            if r.running != Some(true) {
                return Ok((r.exit_code.unwrap_or(-1), out));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Err(RuntimeError::Timeout("a helper command did not end".into()))
    }

    /// Creates an exec, starting the container first if it is not running.
    pub(crate) async fn create_exec(
        &self,
        argv: Vec<String>,
        env: Vec<String>,
        working_dir: Option<String>,
        stdin: bool,
    ) -> Result<String, RuntimeError> {
        let config = CreateExecOptions {
            cmd: Some(argv),
            env: Some(env),
            working_dir,
            attach_stdin: Some(stdin),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            privileged: Some(false),
            ..Default::default()
        };
        let mut started = false;
        loop {
            match self
                .docker
                .create_exec(&self.container_id, config.clone())
                .await
            {
                Ok(r) => return Ok(r.id),
                Err(e) if status(&e) == Some(409) && !started => {
                    // Stopped (hibernated) or paused: resume and try once more.
                    tracing::info!(container = %self.name, "container not running; starting it");
                    self.ensure_running().await?;
                    started = true;
                }
                Err(e) if status(&e) == Some(404) => {
                    return Err(RuntimeError::NotFound(format!(
                        "container {} no longer exists; create the runtime again",
                        self.name
                    )))
                }
                Err(e) => return Err(engine_error("creating the exec", &e)),
            }
        }
    }

    /// Starts the container if it is not running (after a stop, or when the OOM
    /// killer took its init).
    pub async fn ensure_running(&self) -> Result<(), RuntimeError> {
        let state = self
            .docker
            .inspect_container(&self.container_id, None::<InspectContainerOptions>)
            .await
            .map_err(|e| engine_error("inspecting the container", &e))?
            .state;
        if state.as_ref().and_then(|s| s.paused) == Some(true) {
            self.docker
                .unpause_container(&self.container_id)
                .await
                .map_err(|e| engine_error("unpausing the container", &e))?;
        }
        if state.and_then(|s| s.running) != Some(true) {
            match self.docker.start_container(&self.container_id, None).await {
                Ok(()) => {}
                Err(e) if status(&e) == Some(304) => {}
                Err(e) => return Err(engine_error("starting the container", &e)),
            }
            // The cgroup path is stable across restarts; counters keep counting.
        }
        Ok(())
    }

    /// Kills everything in the container by restarting it: the last resort when the
    /// worker cannot kill the command's processes itself.
    pub(crate) async fn restart(&self) {
        tracing::warn!(
            container = %self.name,
            "cannot kill the command's processes from here; restarting the container \
             (other commands running in it die too)"
        );
        let options = RestartContainerOptionsBuilder::default().t(0).build();
        if let Err(e) = self
            .docker
            .restart_container(&self.container_id, Some(options))
            .await
        {
            tracing::error!(container = %self.name, error = %e, "restarting the container failed");
        }
    }
}

impl crate::agent::Host for Inner {
    fn docker(&self) -> &Docker {
        &self.docker
    }

    fn container_id(&self) -> &str {
        &self.container_id
    }

    fn container_name(&self) -> &str {
        &self.name
    }

    async fn agent_exec(&self) -> Result<String, RuntimeError> {
        let argv = vec![crate::agent::INSIDE_PATH.into()];
        self.create_exec(argv, Vec::new(), Some("/".into()), true)
            .await
    }
}
