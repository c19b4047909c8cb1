//! A private Postgres cluster under `$GROVE_HOME/postgres`, used when no `DATABASE_URL`
//! is given: grove then starts on a fresh machine with nothing but Postgres' binaries.
//!
//! The cluster listens only on a Unix socket inside its own directory (no TCP port, so
//! no clash with another server) and trusts local connections of its own OS user.
//! Postgres refuses to run as root; when grove runs as root the cluster belongs to the
//! `postgres` system user (created by Debian's package) and its commands run through
//! `runuser`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Where the private cluster lives and how to reach it.
pub struct LocalDb {
    dir: PathBuf,
}

const DB_NAME: &str = "grove";
const DB_USER: &str = "grove";

impl LocalDb {
    pub fn new(home: &Path) -> Self {
        Self {
            dir: home.join("postgres"),
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }
    fn socket_dir(&self) -> PathBuf {
        self.dir.join("run")
    }

    /// The connection URL of the private cluster.
    pub fn url(&self) -> String {
        format!(
            "postgres://{DB_USER}@localhost/{DB_NAME}?host={}",
            self.socket_dir().display()
        )
    }

    /// Creates the cluster if needed and starts it if it is not running.
    pub fn ensure_running(&self) -> Result<String> {
        let bin = find_bindir().context(
            "no DATABASE_URL is set and Postgres' initdb/pg_ctl were not found; \
             install them (Debian/Ubuntu: apt-get install postgresql) or set DATABASE_URL",
        )?;
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let owner = run_as_user();
        if let Some(user) = &owner {
            chown(&self.dir, user)?;
            let reachable = Command::new("runuser")
                .args(["-u", user, "--", "test", "-w"])
                .arg(&self.dir)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !reachable {
                bail!(
                    "the {user} user cannot reach {}: choose a GROVE_HOME outside a private home directory (e.g. /var/lib/grove) or set DATABASE_URL",
                    self.dir.display()
                );
            }
        }
        if !self.data_dir().join("PG_VERSION").exists() {
            std::fs::create_dir_all(self.data_dir())?;
            std::fs::create_dir_all(self.socket_dir())?;
            if let Some(user) = &owner {
                chown(&self.dir, user)?;
            }
            self.pg(
                &owner,
                &bin.join("initdb"),
                &[
                    "-D",
                    &self.data_dir().to_string_lossy(),
                    "-U",
                    DB_USER,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-instructions",
                ],
            )
            .context("initdb failed")?;
            let conf = format!(
                "listen_addresses = ''\nunix_socket_directories = '{}'\nmax_connections = 500\nfsync = on\n",
                self.socket_dir().display()
            );
            std::fs::write(self.data_dir().join("postgresql.auto.conf"), conf)?;
            if let Some(user) = &owner {
                chown(&self.dir, user)?;
            }
        }
        std::fs::create_dir_all(self.socket_dir())?;
        if let Some(user) = &owner {
            chown(&self.socket_dir(), user)?;
        }
        let status = self.pg(
            &owner,
            &bin.join("pg_ctl"),
            &["-D", &self.data_dir().to_string_lossy(), "status"],
        );
        if status.is_err() {
            let log = self.dir.join("postgres.log");
            self.pg(
                &owner,
                &bin.join("pg_ctl"),
                &[
                    "-D",
                    &self.data_dir().to_string_lossy(),
                    "-l",
                    &log.to_string_lossy(),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ],
            )
            .with_context(|| format!("starting Postgres failed; see {}", log.display()))?;
        }
        self.ensure_database(&bin, &owner)?;
        Ok(self.url())
    }

    /// Stops the cluster if it runs.
    pub fn stop(&self) -> Result<()> {
        let bin = find_bindir().context("Postgres' pg_ctl not found")?;
        let owner = run_as_user();
        if self.data_dir().join("postmaster.pid").exists() {
            self.pg(
                &owner,
                &bin.join("pg_ctl"),
                &[
                    "-D",
                    &self.data_dir().to_string_lossy(),
                    "-m",
                    "fast",
                    "-w",
                    "stop",
                ],
            )?;
        }
        Ok(())
    }

    fn ensure_database(&self, bin: &Path, owner: &Option<String>) -> Result<()> {
        let psql = bin.join("psql");
        let sock = self.socket_dir().to_string_lossy().into_owned();
        let exists = self.pg_output(
            owner,
            &psql,
            &[
                "-h",
                &sock,
                "-U",
                DB_USER,
                "-d",
                "postgres",
                "-tAc",
                "SELECT 1 FROM pg_database WHERE datname = 'grove'",
            ],
        )?;
        if exists.trim() != "1" {
            self.pg(
                owner,
                &psql,
                &[
                    "-h",
                    &sock,
                    "-U",
                    DB_USER,
                    "-d",
                    "postgres",
                    "-c",
                    "CREATE DATABASE grove",
                ],
            )?;
        }
        Ok(())
    }

    fn pg(&self, owner: &Option<String>, program: &Path, args: &[&str]) -> Result<()> {
        let out = self.command(owner, program, args).output()?;
        if !out.status.success() {
            bail!(
                "{} failed: {}",
                program
                    .file_name()
                    .map(|s| s.to_string_lossy())
                    .unwrap_or_default(),
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            );
        }
        Ok(())
    }

    fn pg_output(&self, owner: &Option<String>, program: &Path, args: &[&str]) -> Result<String> {
        let out = self.command(owner, program, args).output()?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn command(&self, owner: &Option<String>, program: &Path, args: &[&str]) -> Command {
        let mut cmd = match owner {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.arg("-u").arg(user).arg("--").arg(program);
                c
            }
            None => Command::new(program),
        };
        cmd.args(args).current_dir(&self.dir);
        cmd
    }
}

/// Postgres' binaries: `GROVE_PG_BINDIR`, then Debian's versioned directories (newest
/// first), then PATH.
fn find_bindir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("GROVE_PG_BINDIR") {
        return Some(PathBuf::from(dir));
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("bin")).collect();
        versions.sort();
        versions.reverse();
        candidates.extend(versions);
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    candidates.into_iter().find(|d| {
        d.join("initdb").is_file() && d.join("pg_ctl").is_file() && d.join("psql").is_file()
    })
}

/// The OS user the cluster runs as when grove runs as root.
fn run_as_user() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    Some(std::env::var("GROVE_PG_USER").unwrap_or_else(|_| "postgres".to_string()))
}

fn chown(path: &Path, user: &str) -> Result<()> {
    let status = Command::new("chown")
        .arg("-R")
        .arg(format!("{user}:"))
        .arg(path)
        .status()
        .context("running chown")?;
    if !status.success() {
        bail!(
            "chown of {} to {user} failed (does the user exist?)",
            path.display()
        );
    }
    Ok(())
}
