//! The mixed client load the fault scenarios run under: clients that each, cycle after
//! cycle, ensure the repo cache, acquire an edit workspace, run writing and reading
//! execs, release and destroy it, every command through the real CLI with a command id
//! of the client's own. Each writing exec appends its own id to a file in the workspace,
//! so that a command run twice (or recorded as run and never run) shows in the files.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use grove_e2e::TestEnv;
use uuid::Uuid;

use crate::{submit_until_decided, Figures};

/// How a load runs.
pub struct LoadOptions {
    pub clients: usize,
    /// Clients with an odd number run their execs in Docker containers.
    pub docker: bool,
    /// How long one command may take to be decided (kills and restarts included).
    pub patience: Duration,
}

/// The load's shared state: every command id submitted, and what the files showed.
#[derive(Default)]
pub struct Load {
    pub stop: AtomicBool,
    pub ids: Mutex<Vec<Uuid>>,
    pub commands: AtomicU64,
    runs_doubled: AtomicU64,
    runs_missing: AtomicU64,
    undecided: AtomicU64,
    notes: Mutex<Vec<String>>,
}

/// The environment of every client CLI: waiting out a fleet with no live worker is
/// part of the scenario, so the claim timeout is long.
const CLIENT_ENV: &[(&str, &str)] = &[("GROVE_CLAIM_TIMEOUT", "300")];

impl Load {
    pub fn ids(&self) -> Vec<Uuid> {
        self.ids.lock().unwrap().clone()
    }

    fn note(&self, what: String) {
        self.notes.lock().unwrap().push(what);
    }

    /// Adds the load's own findings (effects run twice or never, commands never
    /// decided) to `figures`.
    pub fn account(&self, figures: &mut Figures) {
        figures.trials += self.commands.load(Ordering::SeqCst);
        let doubled = self.runs_doubled.load(Ordering::SeqCst);
        let missing = self.runs_missing.load(Ordering::SeqCst);
        let undecided = self.undecided.load(Ordering::SeqCst);
        figures.duplicated += doubled;
        figures.lost += missing + undecided;
        for n in self.notes.lock().unwrap().iter() {
            figures.note(n.clone());
        }
    }

    async fn submit(
        &self,
        env: &TestEnv,
        args: &[&str],
        opts: &LoadOptions,
    ) -> (Uuid, Option<crate::Decided>) {
        let id = Uuid::now_v7();
        self.ids.lock().unwrap().push(id);
        self.commands.fetch_add(1, Ordering::SeqCst);
        let decided = submit_until_decided(env, args, id, CLIENT_ENV, opts.patience).await;
        if decided.is_none() {
            self.undecided.fetch_add(1, Ordering::SeqCst);
            self.note(format!(
                "undecided after {:?}: {args:?} {id}",
                opts.patience
            ));
        }
        (id, decided)
    }

    /// One client: cycles until `stop` is set.
    pub async fn client(&self, env: &TestEnv, url: &str, n: usize, opts: &LoadOptions) {
        let runtime = if opts.docker && n % 2 == 1 {
            "docker"
        } else {
            "local"
        };
        let mut cycle = 0;
        while !self.stop.load(Ordering::SeqCst) {
            cycle += 1;
            self.submit(
                env,
                &["repo", "ensure", "--repo", "o/fixture", "--url", url],
                opts,
            )
            .await;
            let conversation = format!("c{n}-{cycle}");
            let args = grove_e2e::acquire_args(url, "edit", &["--conversation", &conversation]);
            let (_, acquired) = self.submit(env, &args, opts).await;
            let Some(ws) = acquired.filter(|d| d.succeeded()) else {
                continue;
            };
            let id = ws.field("id").and_then(|v| v.as_str()).unwrap().to_string();
            let path = ws
                .field("local_path")
                .and_then(|v| v.as_str())
                .unwrap()
                .to_string();
            let mut writes = Vec::new();
            for _ in 0..3 {
                let marker = Uuid::new_v4().to_string();
                let env_arg = format!("FAULT_ID={marker}");
                let (_, decided) = self
                    .submit(
                        env,
                        &[
                            "exec",
                            &id,
                            "--runtime",
                            runtime,
                            "--env",
                            &env_arg,
                            "--",
                            "sh",
                            "-c",
                            "echo \"$FAULT_ID\" >> .fault-runs",
                        ],
                        opts,
                    )
                    .await;
                let ran_ok = decided.as_ref().is_some_and(|d| {
                    d.succeeded() && d.field("exit_code").and_then(|c| c.as_i64()) == Some(0)
                });
                writes.push((marker, ran_ok));
            }
            self.submit(
                env,
                &[
                    "exec",
                    &id,
                    "--runtime",
                    runtime,
                    "--kind",
                    "read",
                    "--",
                    "cat",
                    ".fault-runs",
                ],
                opts,
            )
            .await;
            let mut release = vec!["workspace", "release", id.as_str()];
            if cycle % 2 == 0 {
                release.push("--destroy-runtime");
            }
            self.submit(env, &release, opts).await;
            // The files say how often each write really ran.
            let runs = std::fs::read_to_string(std::path::Path::new(&path).join(".fault-runs"))
                .unwrap_or_default();
            let mut counts: HashMap<&str, u64> = HashMap::new();
            for line in runs.lines() {
                *counts.entry(line).or_default() += 1;
            }
            for (marker, ran_ok) in &writes {
                let n = counts.get(marker.as_str()).copied().unwrap_or(0);
                if n > 1 {
                    self.runs_doubled.fetch_add(n - 1, Ordering::SeqCst);
                    self.note(format!("exec {marker} ran {n} times in {path}"));
                }
                if *ran_ok && n == 0 {
                    self.runs_missing.fetch_add(1, Ordering::SeqCst);
                    self.note(format!("exec {marker} succeeded but never ran in {path}"));
                }
            }
            self.submit(env, &["workspace", "destroy", &id], opts).await;
        }
    }
}
