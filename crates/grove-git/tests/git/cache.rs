//! Tests of `ensure_cache`: clone once, fetch, mirror layout, token hygiene, failures.

use grove_core::transfer::TransferWatch;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use grove_core::error::GitError;
use grove_core::ports::{GitPort, GitToken};
use grove_git::{dir_size_bytes, Git2Adapter, Transport, TransportConfig};

use crate::support::{git, list_files, partial_siblings, Fixture};

pub(crate) const TOKEN: &str = "ghs_S3cr3tT0kenValue_grove_test_0123456789";

/// The contract of `ensure_cache`, run once per transport (the git CLI, libgit2).
macro_rules! cache_suite {
    () => {
        #[test]
        fn ensuring_a_cache_twice_clones_only_once() {
            let fx = Fixture::new();
            let dir = fx.path("caches/repo.git");
            let adapter = adapter();

            let first = adapter
                .ensure_cache(&fx.url, &dir, None, false, &TransferWatch::none())
                .unwrap();
            assert!(first.cloned);
            assert!(first.size_bytes > 0);
            let files_after_clone = list_files(&dir);

            let second = adapter
                .ensure_cache(&fx.url, &dir, None, false, &TransferWatch::none())
                .unwrap();
            assert!(!second.cloned);
            assert!(!second.fetched);
            assert_eq!(second.size_bytes, first.size_bytes);
            assert_eq!(list_files(&dir), files_after_clone);
            assert!(partial_siblings(&dir).is_empty());
        }

        #[test]
        fn the_cache_is_a_bare_mirror_of_branches_and_tags_with_the_exact_origin_url() {
            let fx = Fixture::new();
            let dir = fx.cache();
            assert_eq!(git(&dir, &["rev-parse", "--is-bare-repository"]), "true");
            assert_eq!(git(&dir, &["config", "remote.origin.url"]), fx.url);
            assert_eq!(
                git(&dir, &["config", "--get-all", "remote.origin.fetch"]),
                "+refs/heads/*:refs/heads/*\n+refs/tags/*:refs/tags/*"
            );
            assert_eq!(git(&dir, &["rev-parse", "refs/heads/main"]), fx.main);
            assert_eq!(git(&dir, &["rev-parse", "refs/heads/feature"]), fx.feature);
            assert_eq!(git(&dir, &["rev-parse", "refs/tags/v1^{commit}"]), fx.first);
            // Workspaces borrow these objects, so the git CLI must not collect them on its own.
            assert_eq!(git(&dir, &["config", "gc.auto"]), "0");
            // HEAD follows the upstream's default branch.
            assert_eq!(git(&dir, &["symbolic-ref", "HEAD"]), "refs/heads/main");
        }

        #[test]
        fn a_fetch_brings_in_a_commit_pushed_to_the_upstream_after_the_clone() {
            let fx = Fixture::new();
            let dir = fx.cache();
            let adapter = adapter();
            let new_commit = fx.commit_on_main("later.txt", "later\n");
            git(&fx.upstream, &["branch", "-D", "feature"]);
            git(&fx.upstream, &["tag", "v2"]);

            let unfetched = adapter
                .ensure_cache(&fx.url, &dir, None, false, &TransferWatch::none())
                .unwrap();
            assert!(!unfetched.fetched);
            assert_eq!(git(&dir, &["rev-parse", "refs/heads/main"]), fx.main);

            let report = adapter
                .ensure_cache(&fx.url, &dir, None, true, &TransferWatch::none())
                .unwrap();
            assert!(!report.cloned);
            assert!(report.fetched);
            assert_eq!(git(&dir, &["rev-parse", "refs/heads/main"]), new_commit);
            assert_eq!(git(&dir, &["rev-parse", "refs/tags/v2"]), new_commit);
            // A mirror drops branches the upstream deleted.
            assert_eq!(git(&dir, &["branch", "--list", "feature"]), "");
        }

        #[test]
        fn a_fetch_with_a_changed_url_records_the_new_url() {
            let fx = Fixture::new();
            let dir = fx.cache();
            let moved = fx.path("moved");
            std::fs::rename(&fx.upstream, &moved).unwrap();
            let moved_url = format!("file://{}", moved.display());
            let adapter = adapter();
            let unfetched = adapter
                .ensure_cache(&moved_url, &dir, None, false, &TransferWatch::none())
                .unwrap();
            assert!(!unfetched.cloned);
            assert_eq!(git(&dir, &["config", "remote.origin.url"]), moved_url);
            let report = adapter
                .ensure_cache(&moved_url, &dir, None, true, &TransferWatch::none())
                .unwrap();
            assert!(report.fetched);
            assert_eq!(git(&dir, &["config", "remote.origin.url"]), moved_url);
        }

        #[test]
        fn a_token_passed_to_ensure_cache_appears_nowhere_under_the_cache_dir() {
            let fx = Fixture::new();
            let dir = fx.path("caches/repo.git");
            let adapter = adapter();
            let token = GitToken::new(TOKEN.to_string());
            adapter
                .ensure_cache(&fx.url, &dir, Some(&token), false, &TransferWatch::none())
                .unwrap();
            fx.commit_on_main("more.txt", "more\n");
            adapter
                .ensure_cache(&fx.url, &dir, Some(&token), true, &TransferWatch::none())
                .unwrap();

            for rel in list_files(&dir) {
                let bytes = std::fs::read(dir.join(&rel)).unwrap();
                assert!(
                    !contains(&bytes, TOKEN.as_bytes()),
                    "token found in {}",
                    rel.display()
                );
            }
            let config = git(&dir, &["config", "--list", "--local"]);
            assert!(!config.contains(TOKEN));
            assert_eq!(git(&dir, &["config", "remote.origin.url"]), fx.url);
            assert!(!format!("{token:?}").contains(TOKEN));
        }

        #[test]
        fn a_clone_from_a_url_that_does_not_exist_is_unavailable_and_leaves_no_cache_dir() {
            let fx = Fixture::new();
            let dir = fx.path("caches/missing.git");
            let url = format!("file://{}", fx.path("no-such-repo").display());
            let err = adapter()
                .ensure_cache(&url, &dir, None, false, &TransferWatch::none())
                .unwrap_err();
            assert!(matches!(err, GitError::Unavailable(_)), "{err:?}");
            assert!(err.is_transient());
            assert!(!err.to_string().contains('\n'));
            assert!(!dir.exists());
            assert!(partial_siblings(&dir).is_empty());
        }

        #[test]
        fn a_refused_connection_is_unavailable() {
            let port = {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap().port()
            };
            let fx = Fixture::new();
            let dir = fx.path("caches/refused.git");
            let url = format!("http://127.0.0.1:{port}/acme/repo.git");
            let err = adapter()
                .ensure_cache(&url, &dir, None, false, &TransferWatch::none())
                .unwrap_err();
            assert!(matches!(err, GitError::Unavailable(_)), "{err:?}");
            assert!(!dir.exists());
        }

        #[test]
        fn a_remote_that_rejects_the_token_gives_auth_failed_after_a_few_attempts() {
            let server = RejectingServer::start();
            let fx = Fixture::new();
            let dir = fx.path("caches/private.git");
            let token = GitToken::new(TOKEN.to_string());
            let err = adapter()
                .ensure_cache(
                    &server.url,
                    &dir,
                    Some(&token),
                    false,
                    &TransferWatch::none(),
                )
                .unwrap_err();
            assert_eq!(err, GitError::AuthFailed);
            assert!(!err.to_string().contains(TOKEN));
            assert!(!dir.exists());
            assert!(partial_siblings(&dir).is_empty());

            let auths = server.authorizations();
            let expected = format!("Basic {}", base64(&format!("x-access-token:{TOKEN}")));
            assert!(
                auths.iter().any(|a| a == &expected),
                "the token was offered as x-access-token basic auth: {auths:?}"
            );
            // The callback stops answering instead of looping forever.
            assert!(auths.len() <= 5, "{} attempts", auths.len());
        }

        #[test]
        fn a_remote_asking_for_credentials_without_a_token_gives_auth_failed() {
            let server = RejectingServer::start();
            let fx = Fixture::new();
            let dir = fx.path("caches/private.git");
            let err = adapter()
                .ensure_cache(&server.url, &dir, None, false, &TransferWatch::none())
                .unwrap_err();
            assert_eq!(err, GitError::AuthFailed);
            assert!(server.authorizations().is_empty());
        }

        #[test]
        fn a_leftover_non_repo_directory_at_the_cache_path_is_replaced() {
            let fx = Fixture::new();
            let dir = fx.path("caches/repo.git");
            std::fs::create_dir_all(dir.join("junk")).unwrap();
            std::fs::write(dir.join("junk/file"), "half a clone").unwrap();
            let report = adapter()
                .ensure_cache(&fx.url, &dir, None, false, &TransferWatch::none())
                .unwrap();
            assert!(report.cloned);
            assert!(!dir.join("junk").exists());
            assert_eq!(git(&dir, &["rev-parse", "refs/heads/main"]), fx.main);
        }

        #[test]
        fn stale_partial_clones_are_removed_before_cloning() {
            let fx = Fixture::new();
            let dir = fx.path("caches/repo.git");
            let stale = fx.path("caches/.repo.git.partial-deadbeef");
            std::fs::create_dir_all(stale.join("objects")).unwrap();
            let other = fx.path("caches/.other.git.partial-deadbeef");
            std::fs::create_dir_all(&other).unwrap();
            adapter()
                .ensure_cache(&fx.url, &dir, None, false, &TransferWatch::none())
                .unwrap();
            assert!(!stale.exists());
            assert!(other.exists(), "partials of other caches are left alone");
        }

        #[test]
        fn the_reported_size_is_the_apparent_size_of_the_cache_dir() {
            let fx = Fixture::new();
            let dir = fx.path("caches/repo.git");
            let report = adapter()
                .ensure_cache(&fx.url, &dir, None, false, &TransferWatch::none())
                .unwrap();
            let sum: u64 = list_files(&dir)
                .iter()
                .map(|rel| std::fs::symlink_metadata(dir.join(rel)).unwrap().len())
                .sum();
            assert_eq!(report.size_bytes, sum as i64);
            assert_eq!(dir_size_bytes(&dir).unwrap(), sum as i64);
        }
    };
}

/// The suite over the git CLI transport.
mod cli {
    use super::*;

    fn adapter() -> Git2Adapter {
        Git2Adapter::with_transport(transports().0)
    }

    cache_suite!();
}

/// The suite over libgit2, the fallback when no git binary is installed.
mod libgit2 {
    use super::*;

    fn adapter() -> Git2Adapter {
        Git2Adapter::with_transport(transports().1)
    }

    cache_suite!();
}

/// The CLI and libgit2 transport settings (the tests install git, so the CLI is there).
pub(crate) fn transports() -> (TransportConfig, TransportConfig) {
    let git = grove_git::transport::detect_cli().expect("the git tests need git 2.29 or newer");
    let base = TransportConfig::auto();
    (
        base.clone().with_transport(Transport::Cli(git)),
        base.with_transport(Transport::Libgit2),
    )
}

#[test]
fn dir_size_bytes_counts_symlinks_without_following_them() {
    let root = tempfile::tempdir().unwrap();
    let big = root.path().join("big");
    std::fs::write(&big, vec![0u8; 10_000]).unwrap();
    let tree = root.path().join("tree");
    std::fs::create_dir_all(tree.join("a/b")).unwrap();
    std::fs::write(tree.join("a/b/f"), "12345").unwrap();
    std::os::unix::fs::symlink(&big, tree.join("link")).unwrap();
    let link_len = std::fs::symlink_metadata(tree.join("link")).unwrap().len() as i64;
    assert_eq!(dir_size_bytes(&tree).unwrap(), 5 + link_len);
    assert!(dir_size_bytes(&root.path().join("absent")).is_err());
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

pub(crate) fn base64(input: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = input.as_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// An HTTP server that answers every request with `401` and a Basic challenge, and
/// records the `Authorization` headers it was sent. Its thread lives until the test
/// process exits.
pub(crate) struct RejectingServer {
    pub(crate) url: String,
    seen: Arc<Mutex<Vec<String>>>,
}

impl RejectingServer {
    pub(crate) fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !contains(&buf, b"\r\n\r\n") {
                    match stream.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&buf).to_string();
                for line in text.lines() {
                    if let Some((name, value)) = line.split_once(':') {
                        if name.eq_ignore_ascii_case("authorization") {
                            record.lock().unwrap().push(value.trim().to_string());
                        }
                    }
                }
                let _ = stream.write_all(
                    b"HTTP/1.1 401 Unauthorized\r\n\
                      WWW-Authenticate: Basic realm=\"grove\"\r\n\
                      Content-Length: 0\r\n\
                      Connection: close\r\n\r\n",
                );
            }
        });
        Self {
            url: format!("http://127.0.0.1:{port}/acme/private.git"),
            seen,
        }
    }

    pub(crate) fn authorizations(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}
