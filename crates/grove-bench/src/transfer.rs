//! Repo cache transfers next to the git CLI doing the same in the same run (ADR 25):
//! `cache_first_file` / `cache_first_http` (a clone over `file://` and over smart HTTP
//! on loopback through `grove-gitserver`, token auth, vs `git clone --mirror`),
//! `cache_fetch_file` / `cache_fetch_http` (the upstream moved by `--fetch-commits`
//! commits, vs `git fetch` of the same refspecs), and `worker_rss_after_clone` (this
//! process, which runs the worker, before and after those clones and after an idle
//! wait). The repository is `--repo PATH` (a bare repository, copied) or the generated
//! fixture.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use grove_gitserver::{GitServer, Options};
use serde_json::json;

use crate::ctx::{ms, run_cmd, Ctx};
use crate::fixture::git;
use crate::stats::{latency, round};
use crate::Out;

pub(crate) const TOKEN: &str = "grove-bench-transfer-token";
const REFSPECS: [&str; 2] = ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"];
/// The floor's credential helper (the token from its environment, as grove's).
const HELPER: &str =
    "credential.helper=!f() { test \"$1\" = get && printf 'username=x-access-token\\npassword=%s\\n' \"$GROVE_BENCH_TOKEN\"; }; f";

/// The cases this module runs.
pub const CASES: [&str; 5] = [
    "cache_first_file",
    "cache_first_http",
    "cache_fetch_file",
    "cache_fetch_http",
    "worker_rss_after_clone",
];

/// The repository under `srv/acme/moving.git` (a copy, so it can move) and a server
/// of `srv` with the token.
pub(crate) struct Remote {
    srv: PathBuf,
    server: GitServer,
}

impl Remote {
    /// Serves a copy of the repository from `ctx.dir/<dir>` (one directory per user).
    pub(crate) fn start(ctx: &Ctx, dir: &str) -> Result<Self> {
        let srv = ctx.dir.join(dir);
        let bare = srv.join("acme/moving.git");
        std::fs::create_dir_all(bare.parent().unwrap())?;
        let source = ctx
            .args
            .repo
            .clone()
            .unwrap_or_else(|| ctx.upstream.clone());
        git_sync(
            &["clone", "-q", "--bare", "--no-hardlinks"],
            &[&source, &bare],
        )?;
        let server = GitServer::start(
            &srv,
            Options {
                token: Some(TOKEN.into()),
                ..Options::default()
            },
        )
        .map_err(anyhow::Error::msg)?;
        Ok(Self { srv, server })
    }

    /// A new alias of the repository (a fresh cache identity) and its two URLs.
    pub(crate) fn alias(&self, name: &str) -> Result<(String, String)> {
        std::os::unix::fs::symlink("moving.git", self.srv.join(format!("acme/{name}.git")))?;
        Ok((
            format!("file://{}/acme/{name}.git", self.srv.display()),
            format!("{}/acme/{name}.git", self.server.base),
        ))
    }

    /// The repository's default branch (`main` for the fixture; `--repo`'s own).
    pub(crate) fn head_branch(&self) -> Result<String> {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(self.srv.join("acme/moving.git"))
            .args(["symbolic-ref", "--short", "HEAD"])
            .output()?;
        anyhow::ensure!(out.status.success(), "the repository has no HEAD branch");
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Moves the default branch of the repository by `n` commits.
    fn advance(&self, work: &Path, n: usize) -> Result<()> {
        if !work.exists() {
            git_sync(&["clone", "-q"], &[&self.srv.join("acme/moving.git"), work])?;
        }
        let file = work.join("grove-bench-moved.txt");
        for i in 0..n {
            std::fs::write(&file, format!("{i} {:?}\n", Instant::now()))?;
            git(work, &["add", "grove-bench-moved.txt"])?;
            git(
                work,
                &[
                    "-c",
                    "user.name=b",
                    "-c",
                    "user.email=b@b.invalid",
                    "commit",
                    "-q",
                    "-m",
                    "move",
                ],
            )?;
        }
        git(work, &["push", "-q", "origin", "HEAD"])
    }
}

/// `git ARGS PATHS` in the current directory (`fixture::git` runs in a given one).
fn git_sync(args: &[&str], paths: &[&Path]) -> Result<()> {
    let out = std::process::Command::new("git")
        .args(args)
        .args(paths)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `git clone --mirror` (or `fetch`) as the floor, the token through a helper.
pub(crate) async fn floor_git(args: &[&str]) -> Result<()> {
    let mut full = vec!["-c", "credential.helper=", "-c", HELPER];
    full.extend_from_slice(args);
    std::env::set_var("GROVE_BENCH_TOKEN", TOKEN);
    run_cmd("git", &full, None).await
}

pub(crate) fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// Runs every selected transfer case.
pub async fn transfer_cases(
    ctx: &mut Ctx,
    out: &mut Out,
    wants: &dyn Fn(&str) -> bool,
) -> Result<()> {
    if !CASES.iter().any(|c| wants(c)) {
        return Ok(());
    }
    let remote = Remote::start(ctx, "srv").context("serving the repository")?;
    let rss_before = rss_kib();
    let n = ctx.args.cache_n.max(1);
    let (mut grove_file, mut git_file, mut grove_http, mut git_http) =
        (vec![], vec![], vec![], vec![]);
    for i in 0..n {
        let (file_url, http_url) = remote.alias(&format!("first-{i}"))?;
        let t = Instant::now();
        ctx.ensure_with(&format!("bench/ff{i}"), &file_url, false, None)
            .await?;
        grove_file.push(ms(t));
        let dest = ctx.dir.join(format!("floor-ff-{i}.git"));
        let t = Instant::now();
        floor_git(&[
            "clone",
            "--mirror",
            "--no-local",
            "-q",
            &file_url,
            dest.to_str().unwrap(),
        ])
        .await?;
        git_file.push(ms(t));
        std::fs::remove_dir_all(&dest)?;
        let t = Instant::now();
        ctx.ensure_with(&format!("bench/fh{i}"), &http_url, false, Some(TOKEN))
            .await?;
        grove_http.push(ms(t));
        let dest = ctx.dir.join(format!("floor-fh-{i}.git"));
        let t = Instant::now();
        floor_git(&["clone", "--mirror", "-q", &http_url, dest.to_str().unwrap()]).await?;
        git_http.push(ms(t));
        std::fs::remove_dir_all(&dest)?;
    }
    let rss_after = rss_kib();
    for (name, grove, floor, is) in [
        (
            "cache_first_file",
            &grove_file,
            &git_file,
            "git clone --mirror --no-local (file://)",
        ),
        (
            "cache_first_http",
            &grove_http,
            &git_http,
            "git clone --mirror (smart HTTP, loopback)",
        ),
    ] {
        let mut row = latency(name, grove, floor);
        row.insert("floor_is".into(), json!(is));
        out.emit(row);
    }
    fetch_cases(ctx, out, &remote).await?;
    let idle = Duration::from_secs(ctx.args.rss_idle_secs);
    tokio::time::sleep(idle).await;
    let mut row = serde_json::Map::new();
    row.insert("name".into(), json!("worker_rss_after_clone"));
    row.insert("rss_before_mib".into(), round(rss_before as f64 / 1024.0));
    row.insert(
        "rss_after_clones_mib".into(),
        round(rss_after as f64 / 1024.0),
    );
    row.insert(
        "rss_after_idle_mib".into(),
        round(rss_kib() as f64 / 1024.0),
    );
    row.insert("idle_secs".into(), json!(idle.as_secs()));
    row.insert("clones".into(), json!(2 * n));
    out.emit(row);
    Ok(())
}

/// The upstream moved by `fetch_commits` commits, then a fetch by grove and by git.
async fn fetch_cases(ctx: &mut Ctx, out: &mut Out, remote: &Remote) -> Result<()> {
    let (file_url, http_url) = remote.alias("fetched")?;
    ctx.ensure_with("bench/fetch-file", &file_url, false, None)
        .await?;
    ctx.ensure_with("bench/fetch-http", &http_url, false, Some(TOKEN))
        .await?;
    let (floor_file, floor_http) = (
        ctx.dir.join("floor-fetch-file.git"),
        ctx.dir.join("floor-fetch-http.git"),
    );
    floor_git(&[
        "clone",
        "--mirror",
        "--no-local",
        "-q",
        &file_url,
        floor_file.to_str().unwrap(),
    ])
    .await?;
    floor_git(&[
        "clone",
        "--mirror",
        "-q",
        &http_url,
        floor_http.to_str().unwrap(),
    ])
    .await?;
    let work = ctx.dir.join("mover");
    let (mut g_file, mut f_file, mut g_http, mut f_http) = (vec![], vec![], vec![], vec![]);
    for _ in 0..ctx.args.cache_n.max(1) {
        remote.advance(&work, ctx.args.fetch_commits)?;
        let t = Instant::now();
        ctx.ensure_with("bench/fetch-file", &file_url, true, None)
            .await?;
        g_file.push(ms(t));
        f_file.push(floor_fetch(&floor_file, &file_url).await?);
        let t = Instant::now();
        ctx.ensure_with("bench/fetch-http", &http_url, true, Some(TOKEN))
            .await?;
        g_http.push(ms(t));
        f_http.push(floor_fetch(&floor_http, &http_url).await?);
    }
    for (name, grove, floor) in [
        ("cache_fetch_file", &g_file, &f_file),
        ("cache_fetch_http", &g_http, &f_http),
    ] {
        let mut row = latency(name, grove, floor);
        row.insert(
            "floor_is".into(),
            json!(format!(
                "git fetch --prune of {} new commits",
                ctx.args.fetch_commits
            )),
        );
        out.emit(row);
    }
    Ok(())
}

/// The floor of a cache fetch: `git fetch --prune` of grove's refspecs into the git
/// CLI's own mirror; its time in milliseconds.
async fn floor_fetch(mirror: &Path, url: &str) -> Result<f64> {
    let t = Instant::now();
    let dir = mirror.to_str().unwrap();
    floor_git(&[
        "-C",
        dir,
        "fetch",
        "-q",
        "--prune",
        url,
        REFSPECS[0],
        REFSPECS[1],
    ])
    .await?;
    Ok(ms(t))
}
