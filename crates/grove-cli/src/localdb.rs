//! A private Postgres cluster under `$GROVE_HOME/postgres`, used when no `DATABASE_URL`
//! is given: grove then starts on a fresh machine with nothing but Postgres' binaries.
//!
//! Private means (ADR 22): it listens only on a Unix socket in a 0700 directory of the
//! cluster's OS user (no TCP port); `pg_hba.conf` lets that OS user in as the cluster's
//! superuser by `peer` and everyone else only by `scram-sha-256` password; grove
//! connects as the role `grove`, which owns the `grove` database but is not a
//! superuser (it may create databases, which the test suite does). Its password is
//! generated once into `$GROVE_HOME/postgres.password` (0600). Postgres refuses to run
//! as root; when grove runs as root the cluster belongs to the `postgres` system user
//! and its commands run through `runuser`; `$GROVE_HOME` is then 0710 with that user's
//! group, so it can reach its own directory and nothing else.

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// Where the private cluster lives and how to reach it.
pub struct LocalDb {
    home: PathBuf,
    dir: PathBuf,
}

const DB_NAME: &str = "grove";
const DB_USER: &str = "grove";
/// Written into the data directory of a cluster made with peer/password auth and a
/// non-superuser `grove` role (absent from clusters made before).
const LAYOUT_MARKER: &str = "grove-cluster-layout";

impl LocalDb {
    pub fn new(home: &Path) -> Self {
        Self {
            home: home.to_path_buf(),
            dir: home.join("postgres"),
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }
    fn socket_dir(&self) -> PathBuf {
        self.dir.join("run")
    }
    fn password_file(&self) -> PathBuf {
        self.home.join("postgres.password")
    }

    /// The connection URL of the private cluster (with grove's password).
    fn url(&self, password: &str) -> String {
        format!(
            "postgres://{DB_USER}:{password}@localhost/{DB_NAME}?host={}",
            self.socket_dir().display()
        )
    }

    /// Creates the cluster if needed, makes an older one private, starts it if it is
    /// not running, and returns grove's URL.
    pub fn ensure_running(&self) -> Result<String> {
        self.ensure_running_reporting().map(|(url, _)| url)
    }

    /// As [`Self::ensure_running`], also telling whether this call started the cluster.
    pub fn ensure_running_reporting(&self) -> Result<(String, bool)> {
        let bin = find_bindir().context(
            "no DATABASE_URL is set and Postgres' initdb/pg_ctl were not found; \
             install them (Debian/Ubuntu: apt-get install postgresql) or set DATABASE_URL",
        )?;
        let owner = run_as_user();
        self.prepare_dirs(&owner)?;
        let password = self.password()?;
        let fresh = !self.data_dir().join("PG_VERSION").exists();
        if fresh {
            self.init(&bin, &owner)?;
        }
        let admin = Admin::of(self, &owner)?;
        if !fresh && admin.legacy {
            self.secure_legacy(&bin, &owner, &password)?;
        }
        self.write_config(&owner, &admin)?;
        let started = self.start_or_reload(&bin, &owner)?;
        self.ensure_role_and_database(&bin, &admin, &password)?;
        Ok((self.url(&password), started))
    }

    /// Where the cluster keeps its data (for messages).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `$GROVE_HOME` 0700 (0710 with the cluster user's group when that user is not
    /// us); the cluster's directory and socket directory 0700, owned by its user.
    fn prepare_dirs(&self, owner: &Option<String>) -> Result<()> {
        // With a cluster user of its own, the home keeps the group search bit it has
        // (set below), so a running cluster is never cut off from its directory.
        grove_workers::home::secure_dir_keeping(&self.home, true, owner.is_some())
            .with_context(|| format!("making {} private", self.home.display()))?;
        grove_workers::home::secure_dir(&self.dir, false)?;
        std::fs::create_dir_all(self.socket_dir())?;
        std::fs::set_permissions(self.socket_dir(), std::fs::Permissions::from_mode(0o700))?;
        let Some(user) = owner else { return Ok(()) };
        let gid = Command::new("id").arg("-g").arg(user).output()?;
        let gid = String::from_utf8_lossy(&gid.stdout).trim().to_string();
        if gid.is_empty() {
            bail!("the cluster's OS user {user} does not exist (set GROVE_PG_USER)");
        }
        run_checked(Command::new("chown").arg(format!(":{gid}")).arg(&self.home))
            .with_context(|| format!("chgrp of {} to {user}'s group", self.home.display()))?;
        std::fs::set_permissions(&self.home, std::fs::Permissions::from_mode(0o710))?;
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
        Ok(())
    }

    /// grove's password: read from its 0600 file, or generated (32 random bytes, hex)
    /// into it.
    fn password(&self) -> Result<String> {
        let path = self.password_file();
        if let Ok(text) = std::fs::read_to_string(&path) {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            let pw = text.trim().to_string();
            if pw.len() >= 32 && pw.chars().all(|c| c.is_ascii_hexdigit()) {
                return Ok(pw);
            }
            bail!(
                "{} is malformed: remove it to make a new password",
                path.display()
            );
        }
        let mut bytes = [0u8; 32];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
        let pw = hex::encode(bytes);
        // Written whole under a private name, then linked into place: a concurrent
        // grove process sees either no file or a complete one.
        let tmp = path.with_extension(format!("password.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        writeln!(f, "{pw}")?;
        f.sync_all()?;
        let linked = std::fs::hard_link(&tmp, &path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(pw),
            // Another grove process made it first: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => self.password(),
            Err(e) => Err(e).with_context(|| format!("creating {}", path.display())),
        }
    }

    /// `initdb`: the bootstrap superuser is the cluster's OS user (reached by `peer`).
    fn init(&self, bin: &Path, owner: &Option<String>) -> Result<()> {
        std::fs::create_dir_all(self.data_dir())?;
        if let Some(user) = owner {
            chown(&self.dir, user)?;
        }
        let data = self.data_dir().to_string_lossy().into_owned();
        self.pg(
            owner,
            &bin.join("initdb"),
            &[
                "-D",
                &data,
                "--auth-local=peer",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--no-instructions",
            ],
        )
        .context("initdb failed")?;
        self.write_owned(owner, &self.data_dir().join(LAYOUT_MARKER), "2\n")
    }

    /// Authentication and listening, rewritten at every start (an older cluster that
    /// trusted local connections is closed this way).
    fn write_config(&self, owner: &Option<String>, admin: &Admin) -> Result<()> {
        let hba = match &admin.peer_user {
            Some(user) => format!(
                "# Written by grove: the cluster's OS user by peer, everyone else by password.\nlocal all {user} peer\nlocal all all scram-sha-256\n"
            ),
            None => "# Written by grove: password only.\nlocal all all scram-sha-256\n".into(),
        };
        self.write_owned(owner, &self.data_dir().join("pg_hba.conf"), &hba)?;
        let conf = format!(
            "listen_addresses = ''\nunix_socket_directories = '{}'\nunix_socket_permissions = 0700\npassword_encryption = 'scram-sha-256'\nmax_connections = 500\nfsync = on\n",
            self.socket_dir().display()
        );
        self.write_owned(owner, &self.data_dir().join("postgresql.auto.conf"), &conf)
    }

    fn write_owned(&self, owner: &Option<String>, path: &Path, text: &str) -> Result<()> {
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        if let Some(user) = owner {
            run_checked(Command::new("chown").arg(format!("{user}:")).arg(path))?;
        }
        Ok(())
    }

    /// Starts the cluster (`true`), or has a running one reload its configuration
    /// (`false`).
    fn start_or_reload(&self, bin: &Path, owner: &Option<String>) -> Result<bool> {
        let pg_ctl = bin.join("pg_ctl");
        let data = self.data_dir().to_string_lossy().into_owned();
        if self.pg(owner, &pg_ctl, &["-D", &data, "status"]).is_ok() {
            // Running: let it read the configuration just written.
            return self
                .pg(owner, &pg_ctl, &["-D", &data, "reload"])
                .map(|()| false);
        }
        let log = self.dir.join("postgres.log");
        self.pg(
            owner,
            &pg_ctl,
            &[
                "-D",
                &data,
                "-l",
                &log.to_string_lossy(),
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
        .with_context(|| format!("starting Postgres failed; see {}", log.display()))
        .map(|()| true)
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

    /// The role `grove` (login, password, may create databases, not a superuser) and
    /// the database `grove` it owns. Run as the cluster's superuser; the password goes
    /// to `psql` on its standard input, never in an argument.
    fn ensure_role_and_database(&self, bin: &Path, admin: &Admin, password: &str) -> Result<()> {
        let attrs = if admin.legacy {
            // The bootstrap superuser of an older cluster cannot lose the attribute.
            "LOGIN"
        } else {
            "LOGIN NOSUPERUSER CREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
        };
        let sql = format!(
            "SELECT 'CREATE ROLE {DB_USER}' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{DB_USER}') \\gexec\n\
             ALTER ROLE {DB_USER} WITH {attrs} PASSWORD '{password}';\n\
             SELECT 'CREATE DATABASE {DB_NAME} OWNER {DB_USER}' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{DB_NAME}') \\gexec\n\
             ALTER DATABASE {DB_NAME} OWNER TO {DB_USER};\n"
        );
        admin
            .psql(self, bin, "postgres", &sql, password)
            .context("creating grove's role and database")
    }

    /// An older cluster trusted every local connection and made `grove` its superuser:
    /// while that still works, give `grove` its password; `write_config` then closes
    /// the trust. `grove` stays a superuser there (Postgres keeps the attribute on the
    /// bootstrap role); a new cluster is needed to drop it, which is said once per start.
    fn secure_legacy(&self, bin: &Path, owner: &Option<String>, password: &str) -> Result<()> {
        let hba = std::fs::read_to_string(self.data_dir().join("pg_hba.conf")).unwrap_or_default();
        if hba
            .lines()
            .any(|l| !l.trim_start().starts_with('#') && l.contains("trust"))
        {
            self.start_or_reload(bin, owner)?;
            let sql = format!("ALTER ROLE {DB_USER} WITH PASSWORD '{password}';\n");
            Admin::legacy_trust(owner)
                .psql(self, bin, "postgres", &sql, password)
                .context("setting grove's password on the older cluster")?;
        }
        eprintln!(
            "grove: warning: the private cluster in {} predates non-superuser roles: grove still connects as a superuser there; dump it, move the directory aside and run `grove db start` to make a new one",
            self.dir.display()
        );
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

/// How grove reaches the cluster's superuser.
struct Admin {
    /// The OS user running `psql` (`None`: ourselves).
    owner: Option<String>,
    /// The superuser role `psql` logs in as.
    role: String,
    /// The role reached by `peer` (new clusters: the cluster's OS user).
    peer_user: Option<String>,
    /// A cluster made before the marker: its superuser is `grove`, reached by password.
    legacy: bool,
    /// The older cluster's `trust` line still applies: no password needed.
    trust: bool,
}

impl Admin {
    fn of(db: &LocalDb, owner: &Option<String>) -> Result<Self> {
        let legacy = !db.data_dir().join(LAYOUT_MARKER).exists();
        if legacy {
            return Ok(Self {
                owner: owner.clone(),
                role: DB_USER.into(),
                peer_user: None,
                legacy,
                trust: false,
            });
        }
        let os_user = match owner {
            Some(user) => user.clone(),
            None => current_user()?,
        };
        Ok(Self {
            owner: owner.clone(),
            role: os_user.clone(),
            peer_user: Some(os_user),
            legacy,
            trust: false,
        })
    }

    fn legacy_trust(owner: &Option<String>) -> Self {
        Self {
            owner: owner.clone(),
            role: DB_USER.into(),
            peer_user: None,
            legacy: true,
            trust: true,
        }
    }

    /// Runs `sql` (on standard input) as the superuser in `database`.
    fn psql(&self, db: &LocalDb, bin: &Path, database: &str, sql: &str, pw: &str) -> Result<()> {
        let sock = db.socket_dir().to_string_lossy().into_owned();
        let args = [
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            &sock,
            "-U",
            &self.role,
            "-d",
            database,
            "-f",
            "-",
        ];
        let mut cmd = db.command(&self.owner, &bin.join("psql"), &args);
        if self.legacy && !self.trust {
            // The older cluster's superuser is grove itself, reached by password; the
            // environment of a child is readable only by its own user and root.
            cmd.env("PGPASSWORD", pw);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("running psql")?;
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(sql.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "psql failed: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            );
        }
        Ok(())
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

/// The name of the OS user we run as (the bootstrap superuser `initdb` made).
fn current_user() -> Result<String> {
    let out = Command::new("id")
        .arg("-un")
        .output()
        .context("running id -un")?;
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || name.is_empty() {
        bail!("cannot tell this process's user name (id -un)");
    }
    Ok(name)
}

fn run_checked(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().context("running chown")?;
    if !status.success() {
        bail!("{cmd:?} failed");
    }
    Ok(())
}

fn chown(path: &Path, user: &str) -> Result<()> {
    run_checked(
        Command::new("chown")
            .arg("-R")
            .arg(format!("{user}:"))
            .arg(path),
    )
    .with_context(|| {
        format!(
            "chown of {} to {user} (does the user exist?)",
            path.display()
        )
    })
}
