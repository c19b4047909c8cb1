//! Fixtures: a fresh database (created on the admin URL, dropped afterwards) and a
//! generated git repository written by `git fast-import`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

/// Replaces the database name in a Postgres URL (as tests/support does).
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

/// A database of the bench's own, dropped by [`BenchDb::drop_db`].
pub struct BenchDb {
    admin_url: String,
    pub name: String,
    pub url: String,
}

impl BenchDb {
    pub async fn create(admin_url: &str) -> Result<Self> {
        let name = format!("grove_bench_{}", uuid::Uuid::new_v4().simple());
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(admin_url)
            .await
            .context("connecting to DATABASE_URL (the admin database)")?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&admin)
            .await
            .context("creating the bench database")?;
        admin.close().await;
        Ok(Self {
            admin_url: admin_url.to_string(),
            url: with_database(admin_url, &name),
            name,
        })
    }

    pub async fn pool(&self, max: u32) -> Result<PgPool> {
        Ok(PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(std::time::Duration::from_secs(60))
            .connect(&self.url)
            .await?)
    }

    pub async fn drop_db(&self) -> Result<()> {
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(&self.admin_url)
            .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )))
        .execute(&admin)
        .await?;
        admin.close().await;
        Ok(())
    }
}

/// A small deterministic generator (xorshift), so every run builds the same repository.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn blob(rng: &mut Rng, path: &str, rev: usize) -> Vec<u8> {
    let lines = 3 + (rng.next() % 12) as usize;
    let mut out = format!("// {path} revision {rev}\n").into_bytes();
    for i in 0..lines {
        let _ = writeln!(out, "line {i}: {:016x} {:016x}", rng.next(), rng.next());
    }
    out
}

/// The path of the generated repository's file number `i`.
pub fn path_of(i: usize) -> String {
    format!("src/d{:03}/m{:02}/file{i:05}.rs", i / 100, (i / 10) % 10)
}

/// Writes a bare repository with `files` files on `main` and `commits` commits (the
/// first adds every file; each later one rewrites three of them) by piping a stream
/// into `git fast-import`. Returns its path.
pub fn generate_repo(dir: &Path, files: usize, commits: usize) -> Result<PathBuf> {
    let repo = dir.join("upstream.git");
    let ok = Command::new("git")
        .args(["init", "-q", "--bare", "-b", "main"])
        .arg(&repo)
        .status()?
        .success();
    if !ok {
        bail!("git init failed");
    }
    let mut child = Command::new("git")
        .args(["fast-import", "--quiet", "--done"])
        .current_dir(&repo)
        .stdin(Stdio::piped())
        .spawn()
        .context("spawning git fast-import")?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, child.stdin.take().unwrap());
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let commits = commits.max(1);
    for c in 0..commits {
        let when = 1_700_000_000 + c as u64 * 60;
        write!(
            w,
            "commit refs/heads/main\nmark :{}\ncommitter bench <bench@grove.invalid> {when} +0000\n",
            c + 1
        )?;
        let msg = format!("commit {c}\n");
        write!(w, "data {}\n{msg}", msg.len())?;
        if c > 0 {
            writeln!(w, "from :{c}")?;
        }
        let touched: Vec<usize> = if c == 0 {
            (0..files).collect()
        } else {
            (0..3)
                .map(|_| (rng.next() as usize) % files.max(1))
                .collect()
        };
        for i in touched {
            let path = path_of(i);
            let data = blob(&mut rng, &path, c);
            write!(w, "M 100644 inline {path}\ndata {}\n", data.len())?;
            w.write_all(&data)?;
            w.write_all(b"\n")?;
        }
        w.write_all(b"\n")?;
    }
    w.write_all(b"done\n")?;
    w.flush()?;
    drop(w);
    if !child.wait()?.success() {
        bail!("git fast-import failed");
    }
    Ok(repo)
}

/// Runs a git command, failing on a non-zero exit.
pub fn git(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("git")
        .args(["-c", "safe.directory=*"])
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    if !out.status.success() {
        bail!(
            "git {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
