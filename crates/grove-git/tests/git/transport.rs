//! The git CLI transport of repo caches as an attack surface (ADR 25): where the token
//! goes (never argv, config, files or errors), which transports and redirects git may
//! follow, what a hostile cache config can change, and how a transfer is bounded
//! (stall, total budget, cancel, a connection cut mid-pack, missing objects).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use grove_core::error::GitError;
use grove_core::ports::{GitPort, GitToken};
use grove_core::transfer::{TransferPhase, TransferProgress, TransferWatch};
use grove_git::{Git2Adapter, TransportConfig};
use grove_gitserver::{GitServer, Options};

use crate::cache::{transports, TOKEN};
use crate::support::{git, git_as_author, list_files, partial_siblings, Fixture};

/// A bare repository `acme/big.git` under a server root, with about `mib` MiB of
/// incompressible blobs, so a throttled clone takes a while.
struct BigRepo {
    root: tempfile::TempDir,
    commit: String,
}

impl BigRepo {
    fn new(mib: usize) -> Self {
        let root = tempfile::tempdir().unwrap();
        let work = root.path().join("work");
        std::fs::create_dir(&work).unwrap();
        git(&work, &["-c", "init.defaultBranch=main", "init", "-q"]);
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for i in 0..mib * 4 {
            let bytes: Vec<u8> = (0..256 * 1024)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            std::fs::write(work.join(format!("blob-{i}.bin")), bytes).unwrap();
        }
        git(&work, &["add", "-A"]);
        git_as_author(&work, &["commit", "-q", "-m", "big"]);
        let commit = git(&work, &["rev-parse", "HEAD"]);
        let bare = root.path().join("srv/acme/big.git");
        std::fs::create_dir_all(bare.parent().unwrap()).unwrap();
        git(
            root.path(),
            &[
                "clone",
                "-q",
                "--bare",
                work.to_str().unwrap(),
                bare.to_str().unwrap(),
            ],
        );
        Self { root, commit }
    }

    fn serve(&self, options: Options) -> (GitServer, String) {
        let server = GitServer::start(&self.root.path().join("srv"), options).unwrap();
        let url = format!("{}/acme/big.git", server.base);
        (server, url)
    }

    fn cache_dir(&self, name: &str) -> PathBuf {
        self.root.path().join("caches").join(name)
    }
}

fn cli() -> Git2Adapter {
    Git2Adapter::with_transport(transports().0)
}

fn cli_with(f: impl FnOnce(&mut TransportConfig)) -> Git2Adapter {
    let mut config = transports().0;
    f(&mut config);
    Git2Adapter::with_transport(config)
}

/// Every process's command line, by pid.
fn all_cmdlines() -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let raw = std::fs::read(e.path().join("cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&raw).replace('\0', " ")))
        })
        .collect()
}

/// Processes whose command line mentions `needle`.
fn processes_naming(needle: &str) -> Vec<u32> {
    all_cmdlines()
        .into_iter()
        .filter(|(pid, c)| *pid != std::process::id() && c.contains(needle))
        .map(|(pid, _)| pid)
        .collect()
}

#[test]
fn a_cli_clone_with_a_token_never_puts_it_in_argv_config_files_or_errors() {
    let repo = BigRepo::new(2);
    let (server, url) = repo.serve(Options {
        token: Some(TOKEN.into()),
        throttle_bytes_per_sec: Some(1 << 20),
        ..Options::default()
    });
    let dir = repo.cache_dir("big.git");
    let done = Arc::new(AtomicBool::new(false));
    let (sightings, leaks) = (Arc::new(Mutex::new(0)), Arc::new(Mutex::new(Vec::new())));
    let watcher = {
        let (done, sightings, leaks, base) = (
            done.clone(),
            sightings.clone(),
            leaks.clone(),
            server.base.clone(),
        );
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                for (pid, cmdline) in all_cmdlines() {
                    if cmdline.contains(TOKEN) {
                        leaks.lock().unwrap().push(format!("{pid}: {cmdline}"));
                    }
                    if cmdline.contains(&base) && pid != std::process::id() {
                        *sightings.lock().unwrap() += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let token = GitToken::new(TOKEN.to_string());
    let report = cli().ensure_cache(&url, &dir, Some(&token), false, &TransferWatch::none());
    done.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    assert!(report.unwrap().cloned);
    assert!(
        leaks.lock().unwrap().is_empty(),
        "token in argv: {:?}",
        leaks.lock().unwrap()
    );
    assert!(
        *sightings.lock().unwrap() > 0,
        "the git child was never seen running"
    );
    assert!(server.seen.authorized.load(Ordering::SeqCst) > 0);
    assert_eq!(git(&dir, &["rev-parse", "refs/heads/main"]), repo.commit);
    for rel in list_files(&dir) {
        let bytes = std::fs::read(dir.join(&rel)).unwrap();
        assert!(
            !bytes.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()),
            "token in {}",
            rel.display()
        );
    }
    let config = std::fs::read_to_string(dir.join("config")).unwrap();
    assert!(
        !config.contains(TOKEN) && !config.contains("credential"),
        "{config}"
    );

    let wrong = GitToken::new(format!("{TOKEN}-wrong"));
    let err = cli()
        .ensure_cache(
            &url,
            &repo.cache_dir("other.git"),
            Some(&wrong),
            false,
            &TransferWatch::none(),
        )
        .unwrap_err();
    assert_eq!(err, GitError::AuthFailed);
    assert!(!err.to_string().contains(TOKEN));
}

#[test]
fn a_url_with_embedded_credentials_is_refused_before_any_request() {
    let repo = BigRepo::new(1);
    let (server, url) = repo.serve(Options::default());
    let with_creds = url.replace("http://", &format!("http://x-access-token:{TOKEN}@"));
    let dir = repo.cache_dir("creds.git");
    let err = cli()
        .ensure_cache(&with_creds, &dir, None, false, &TransferWatch::none())
        .unwrap_err();
    assert!(matches!(err, GitError::InvalidInput(_)), "{err:?}");
    assert!(!err.to_string().contains(TOKEN));
    assert_eq!(server.seen.requests(), 0);
    assert!(!dir.exists() && partial_siblings(&dir).is_empty());
}

#[test]
fn ext_and_fd_transports_are_refused_and_run_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("pwned");
    for url in [
        format!("ext::sh -c touch% {}", marker.display()),
        "fd::0".to_string(),
        format!("ext::sh%20-c%20touch%20{}", marker.display()),
    ] {
        let dir = tmp.path().join("caches/x.git");
        let err = cli()
            .ensure_cache(&url, &dir, None, false, &TransferWatch::none())
            .unwrap_err();
        assert!(matches!(err, GitError::InvalidInput(_)), "{url}: {err:?}");
        assert!(!dir.exists() && partial_siblings(&dir).is_empty());
    }
    assert!(!marker.exists(), "a transport helper ran");
}

#[test]
fn a_remote_that_redirects_elsewhere_is_not_followed() {
    let repo = BigRepo::new(1);
    let (target, _) = repo.serve(Options::default());
    let (_front, url) = repo.serve(Options {
        redirect_to: Some(target.base.clone()),
        ..Options::default()
    });
    let dir = repo.cache_dir("redirected.git");
    let err = cli()
        .ensure_cache(&url, &dir, None, false, &TransferWatch::none())
        .unwrap_err();
    assert!(matches!(err, GitError::Unavailable(_)), "{err:?}");
    assert_eq!(target.seen.requests(), 0, "git followed the redirect");
    assert!(!dir.exists() && partial_siblings(&dir).is_empty());
}

#[test]
fn a_hostile_cache_config_cannot_change_where_the_fetch_goes() {
    let fx = Fixture::new();
    let dir = fx.cache();
    let decoy = BigRepo::new(1);
    let (decoy_server, decoy_url) = decoy.serve(Options::default());
    let later = fx.commit_on_main("later.txt", "later\n");
    // remote.origin.* is grove's to rewrite: the fetch names the URL it was given.
    git(&dir, &["config", "remote.origin.url", &decoy_url]);
    git(&dir, &["config", "remote.origin.pushurl", &decoy_url]);
    let report = cli()
        .ensure_cache(&fx.url, &dir, None, true, &TransferWatch::none())
        .unwrap();
    assert!(report.fetched);
    assert_eq!(git(&dir, &["rev-parse", "refs/heads/main"]), later);
    assert_eq!(git(&dir, &["config", "remote.origin.url"]), fx.url);
    // Keys that would redirect or run something make the CLI refuse the cache.
    for (key, value) in [
        (format!("url.{decoy_url}.insteadOf"), fx.url.clone()),
        ("http.proxy".to_string(), decoy_server.base.clone()),
        (
            "core.sshCommand".to_string(),
            "touch /tmp/grove-pwned".to_string(),
        ),
        ("include.path".to_string(), "/etc/hostname".to_string()),
    ] {
        git(&dir, &["config", &key, &value]);
        let err = cli()
            .ensure_cache(&fx.url, &dir, None, true, &TransferWatch::none())
            .unwrap_err();
        assert!(matches!(err, GitError::Untrusted(_)), "{key}: {err:?}");
        git(&dir, &["config", "--unset-all", &key]);
    }
    assert_eq!(decoy_server.seen.requests(), 0);
}

#[test]
fn a_connection_cut_mid_pack_is_unavailable_and_leaves_no_cache() {
    let repo = BigRepo::new(1);
    let (_server, url) = repo.serve(Options {
        cut_after_bytes: Some(64 << 10),
        ..Options::default()
    });
    let dir = repo.cache_dir("cut.git");
    let err = cli()
        .ensure_cache(&url, &dir, None, false, &TransferWatch::none())
        .unwrap_err();
    assert!(matches!(err, GitError::Unavailable(_)), "{err:?}");
    assert!(err.is_transient());
    assert!(!err.to_string().contains('\n'));
    assert!(!dir.exists() && partial_siblings(&dir).is_empty());
}

#[test]
fn a_repository_missing_objects_fails_and_leaves_no_cache() {
    let fx = Fixture::new();
    // Remove one loose blob from the upstream: its history can no longer be packed.
    let blob = git(&fx.upstream, &["rev-parse", "HEAD:README.md"]);
    let path = fx
        .upstream
        .join(".git/objects")
        .join(&blob[..2])
        .join(&blob[2..]);
    std::fs::remove_file(&path).unwrap();
    let dir = fx.path("caches/broken.git");
    let err = cli()
        .ensure_cache(&fx.url, &dir, None, false, &TransferWatch::none())
        .unwrap_err();
    assert!(matches!(err, GitError::Unavailable(_)), "{err:?}");
    assert!(!dir.exists() && partial_siblings(&dir).is_empty());
}

#[test]
fn a_silent_remote_is_stopped_after_the_stall_timeout_with_its_git() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/acme/silent.git", listener.local_addr().unwrap());
    let held = std::thread::spawn(move || {
        // Accept and hold connections, answering nothing.
        let conns: Vec<_> = listener.incoming().take(1).flatten().collect();
        std::thread::sleep(Duration::from_secs(20));
        drop(conns);
    });
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("caches/silent.git");
    let started = Instant::now();
    let err = cli_with(|c| c.stall_timeout = Duration::from_secs(1))
        .ensure_cache(&url, &dir, None, false, &TransferWatch::none())
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(&err, GitError::Unavailable(m) if m.contains("no progress")),
        "{err:?}"
    );
    assert!(
        processes_naming(&url).is_empty(),
        "git outlived its stall timeout"
    );
    assert!(!dir.exists() && partial_siblings(&dir).is_empty());
    drop(held);
}

#[test]
fn a_transfer_past_its_total_budget_is_a_resource_limit() {
    let repo = BigRepo::new(2);
    let (_server, url) = repo.serve(Options {
        throttle_bytes_per_sec: Some(256 << 10),
        ..Options::default()
    });
    let dir = repo.cache_dir("slow.git");
    let err = cli_with(|c| c.transfer_timeout = Duration::from_secs(2))
        .ensure_cache(&url, &dir, None, false, &TransferWatch::none())
        .unwrap_err();
    assert!(matches!(err, GitError::ResourceLimit(_)), "{err:?}");
    assert!(!err.is_transient());
    assert!(processes_naming(&url).is_empty(), "git outlived its budget");
    assert!(!dir.exists() && partial_siblings(&dir).is_empty());
}

/// Clones a throttled repository with `adapter`, cancelling after `cancel_after` (if
/// given); returns the result and every progress snapshot seen.
fn watched_clone(
    adapter: &Git2Adapter,
    repo: &BigRepo,
    url: &str,
    dir: &Path,
    cancel_after: Option<Duration>,
) -> (Result<(), GitError>, Vec<TransferProgress>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let watch = TransferWatch::with_sink(move |p| s.lock().unwrap().push(p.clone()));
    let canceller = cancel_after.map(|after| {
        let w = watch.clone();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            w.cancel();
        })
    });
    let r = adapter
        .ensure_cache(url, dir, None, false, &watch)
        .map(|_| ());
    if let Some(c) = canceller {
        c.join().unwrap();
    }
    let _ = repo;
    let seen = seen.lock().unwrap().clone();
    (r, seen)
}

#[test]
fn progress_is_reported_while_a_throttled_clone_runs_on_both_transports() {
    let repo = BigRepo::new(2);
    let (_server, url) = repo.serve(Options {
        throttle_bytes_per_sec: Some(2 << 20),
        ..Options::default()
    });
    let (cli_config, libgit2_config) = transports();
    for (name, config) in [("cli", cli_config), ("libgit2", libgit2_config)] {
        let adapter = Git2Adapter::with_transport(config);
        let dir = repo.cache_dir(&format!("progress-{name}.git"));
        let (r, seen) = watched_clone(&adapter, &repo, &url, &dir, None);
        r.unwrap();
        let receiving: Vec<_> = seen
            .iter()
            .filter(|p| p.phase == TransferPhase::Receiving && p.objects_total > 0)
            .collect();
        assert!(receiving.len() >= 2, "{name}: {seen:?}");
        assert!(receiving.iter().any(|p| p.bytes_received > 0), "{name}");
        let last = seen.last().unwrap();
        assert_eq!(last.phase, TransferPhase::Done, "{name}");
        assert!(
            last.objects_received > 0 && last.bytes_received > (1 << 20),
            "{name}: {last:?}"
        );
    }
}

#[test]
fn cancelling_a_clone_stops_it_on_both_transports_and_leaves_no_cache() {
    let repo = BigRepo::new(2);
    let (_server, url) = repo.serve(Options {
        throttle_bytes_per_sec: Some(256 << 10),
        ..Options::default()
    });
    let (cli_config, libgit2_config) = transports();
    for (name, config) in [("cli", cli_config), ("libgit2", libgit2_config)] {
        let adapter = Git2Adapter::with_transport(config);
        let dir = repo.cache_dir(&format!("cancel-{name}.git"));
        let started = Instant::now();
        let (r, _) = watched_clone(
            &adapter,
            &repo,
            &url,
            &dir,
            Some(Duration::from_millis(700)),
        );
        assert_eq!(r.unwrap_err(), GitError::Cancelled, "{name}");
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "{name}: {:?}",
            started.elapsed()
        );
        assert!(
            processes_naming(&url).is_empty(),
            "{name}: git outlived the cancel"
        );
        assert!(!dir.exists() && partial_siblings(&dir).is_empty(), "{name}");
    }
}
