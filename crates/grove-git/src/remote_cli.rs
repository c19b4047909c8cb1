//! Fetching into a repo cache with the git CLI (ADR 25): the same guarantees as
//! [`crate::trusted::git_command`], plus exactly one network protocol (the URL's own),
//! no redirects, and the token handed over by a credential helper that reads it from
//! the child's environment. The token is never in argv, a config file, the URL, a log
//! line or an error; the helper answers only for the URL's protocol and host.

use std::path::Path;
use std::process::Command;

use grove_core::error::GitError;
use grove_core::ports::GitToken;
use grove_core::transfer::TransferWatch;

use crate::cache::{HEADS_REFSPEC, TAGS_REFSPEC};
use crate::errors::{map_io, scrub};
use crate::progress::ProgressParser;
use crate::supervise::{self, Finished, Stopped};
use crate::transport::TransportConfig;

/// The credential helper: a shell function (git runs `!`-helpers through `sh`) that
/// answers `get` for grove's protocol and host only, from the child's environment.
const HELPER: &str = "!f() { test \"$1\" = get || exit 0; p=; h=; \
while IFS= read -r l; do case \"$l\" in protocol=*) p=\"${l#protocol=}\";; \
host=*) h=\"${l#host=}\";; esac; done; \
test \"$p\" = \"$GROVE_GIT_PROTOCOL\" && test \"$h\" = \"$GROVE_GIT_HOST\" || exit 0; \
printf 'username=x-access-token\\npassword=%s\\n' \"$GROVE_GIT_TOKEN\"; }; f";

/// One remote: where it is and what the CLI may use to reach it.
pub(crate) struct RemoteCli<'a> {
    git: &'a Path,
    config: &'a TransportConfig,
    url: &'a str,
    scheme: &'static str,
    host: String,
    token: Option<&'a GitToken>,
}

impl<'a> RemoteCli<'a> {
    /// Checks `url` and `token` before any process runs: a URL with credentials, a
    /// transport helper (`ext::`, `fd::`) or an unsupported scheme is refused.
    pub(crate) fn new(
        git: &'a Path,
        config: &'a TransportConfig,
        url: &'a str,
        token: Option<&'a GitToken>,
    ) -> Result<Self, GitError> {
        let (scheme, host) = parse_remote(url)?;
        if token.is_some_and(|t| t.expose().chars().any(|c| c.is_control())) {
            return Err(GitError::InvalidInput(
                "the git token contains control characters".into(),
            ));
        }
        Ok(Self {
            git,
            config,
            url,
            scheme,
            host,
            token,
        })
    }

    /// A git command on the bare repository `git_dir` with the trusted environment.
    fn command(&self, git_dir: &Path) -> Result<Command, GitError> {
        crate::trusted::check_cli_config(git_dir)?;
        let mut cmd = Command::new(self.git);
        cmd.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", "/nonexistent")
            .env("LC_ALL", "C")
            .env("GIT_DIR", git_dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_NO_REPLACE_OBJECTS", "1")
            .env("GIT_PROTOCOL_FROM_USER", "0")
            .env("GIT_ALLOW_PROTOCOL", self.scheme)
            .current_dir(git_dir);
        if let Some(parent) = git_dir.parent() {
            cmd.env("GIT_CEILING_DIRECTORIES", parent);
        }
        let allow = format!("protocol.{}.allow=always", self.scheme);
        for kv in [
            "safe.directory=*",
            "core.hooksPath=/dev/null",
            "core.fsmonitor=false",
            "core.sshCommand=false",
            "core.gitProxy=",
            "core.askPass=",
            "credential.helper=",
            "credential.useHttpPath=false",
            "protocol.allow=never",
            allow.as_str(),
            "http.proxy=",
            "http.followRedirects=false",
            "gc.auto=0",
            "maintenance.auto=false",
            "fetch.recurseSubmodules=false",
            "fetch.writeCommitGraph=false",
            // Always keep what arrives as a pack (as libgit2 does) rather than loose
            // objects: index-pack reports progress, unpack-objects does not.
            "fetch.unpackLimit=1",
        ] {
            cmd.args(["-c", kv]);
        }
        if let Some(token) = self.token {
            cmd.args(["-c", &format!("credential.helper={HELPER}")])
                .env("GROVE_GIT_TOKEN", token.expose())
                .env("GROVE_GIT_PROTOCOL", self.scheme)
                .env("GROVE_GIT_HOST", &self.host);
        }
        Ok(cmd)
    }

    /// Fetches the remote's branches and tags into `git_dir` (pruning deleted ones),
    /// reporting progress to `watch`.
    pub(crate) fn fetch(&self, git_dir: &Path, watch: &TransferWatch) -> Result<(), GitError> {
        let mut cmd = self.command(git_dir)?;
        cmd.args(["fetch", "--progress", "--prune", "--no-tags"])
            .args([
                "--no-write-fetch-head",
                "--no-auto-gc",
                "--no-auto-maintenance",
            ])
            .args(["--no-show-forced-updates", "--no-recurse-submodules", "--"])
            .args([self.url, HEADS_REFSPEC, TAGS_REFSPEC]);
        let mut parser = ProgressParser::default();
        let done = self.run(cmd, watch, |line| {
            if parser.feed(line) {
                watch.report(parser.current());
            }
        })?;
        self.check(&done, "git fetch")?;
        watch.report(parser.finish());
        Ok(())
    }

    /// The branch the remote's HEAD points at (`refs/heads/...`), if it says.
    pub(crate) fn default_branch(
        &self,
        git_dir: &Path,
        watch: &TransferWatch,
    ) -> Result<Option<String>, GitError> {
        let mut cmd = self.command(git_dir)?;
        cmd.args(["ls-remote", "--symref", "--", self.url, "HEAD"]);
        let done = self.run(cmd, watch, |_| {})?;
        self.check(&done, "git ls-remote")?;
        let text = String::from_utf8_lossy(&done.stdout);
        Ok(text.lines().find_map(|l| {
            let target = l.strip_prefix("ref: ")?.strip_suffix("\tHEAD")?;
            target
                .starts_with("refs/heads/")
                .then(|| target.to_string())
        }))
    }

    fn run(
        &self,
        cmd: Command,
        watch: &TransferWatch,
        on_line: impl FnMut(&str),
    ) -> Result<Finished, GitError> {
        match supervise::run(cmd, self.config.limits(), watch, on_line) {
            Err(e) => Err(map_io("cannot run git", &e)),
            Ok(Err(Stopped::Cancelled)) => Err(GitError::Cancelled),
            Ok(Err(Stopped::TimedOut(d))) => Err(GitError::ResourceLimit(format!(
                "the transfer took longer than {} s (GROVE_GIT_TRANSFER_TIMEOUT_SECS)",
                d.as_secs()
            ))),
            Ok(Err(Stopped::Stalled(d))) => Err(GitError::Unavailable(format!(
                "the transfer made no progress for {} s (GROVE_GIT_STALL_TIMEOUT_SECS)",
                d.as_secs()
            ))),
            Ok(Ok(done)) => Ok(done),
        }
    }

    fn check(&self, done: &Finished, what: &str) -> Result<(), GitError> {
        if done.status.success() {
            return Ok(());
        }
        let err = classify(&done.stderr_tail, self.token, what);
        tracing::warn!(url = %crate::cache::redact_url(self.url), error = %err, "git transfer failed");
        Err(err)
    }
}

/// The scheme (one git may use) and `host[:port]` of a remote URL, or why it is refused.
fn parse_remote(url: &str) -> Result<(&'static str, String), GitError> {
    let bad = |why: &str| GitError::InvalidInput(format!("repository URL refused: {why}"));
    if url.starts_with('-') || url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(bad("it starts with '-' or holds whitespace"));
    }
    if url.contains("::") {
        return Err(bad(
            "transport helpers (such as ext:: or fd::) are not allowed",
        ));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad("expected https://, http://, git:// or file://"));
    };
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "https" => "https",
        "http" => "http",
        "git" => "git",
        "file" => "file",
        "ssh" => {
            return Err(GitError::Unavailable(
                "ssh URLs are not supported for repo caches (no ssh identity is configured)".into(),
            ))
        }
        _ => return Err(bad("unsupported scheme")),
    };
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    if authority.contains('@') {
        return Err(bad(
            "credentials in the URL are not allowed; pass a token separately",
        ));
    }
    Ok((scheme, authority.to_string()))
}

/// The typed error of a failed git transfer, from its stderr: one line, no token.
fn classify(stderr: &str, token: Option<&GitToken>, what: &str) -> GitError {
    let line = stderr
        .split(['\n', '\r'])
        .map(str::trim)
        .rfind(|l| l.starts_with("fatal:") || l.starts_with("error:"))
        .or_else(|| {
            stderr
                .split(['\n', '\r'])
                .map(str::trim)
                .rfind(|l| !l.is_empty())
        })
        .unwrap_or("");
    let clean: String = line.chars().filter(|c| !c.is_control()).take(300).collect();
    let msg = scrub(&format!("{what}: {clean}"), token);
    let lower = stderr.to_ascii_lowercase();
    let auth = [
        "authentication failed",
        "could not read username",
        "could not read password",
        "terminal prompts disabled",
        "returned error: 401",
        "returned error: 403",
    ];
    if auth.iter().any(|a| lower.contains(a)) {
        return GitError::AuthFailed;
    }
    if lower.contains("no space left on device") || lower.contains("disk quota exceeded") {
        return GitError::ResourceLimit(msg);
    }
    GitError::Unavailable(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_with_credentials_helpers_or_odd_schemes_are_refused() {
        for url in [
            "https://x:secret@example.com/a.git",
            "https://user@example.com/a.git",
            "ext::sh -c touch% /tmp/pwned",
            "fd::3",
            "http::https://example.com/a",
            "-uhttps://example.com/a",
            "ftp://example.com/a",
            "example.com:a/b",
            "/tmp/repo",
        ] {
            assert!(
                matches!(parse_remote(url), Err(GitError::InvalidInput(_))),
                "{url}"
            );
        }
        assert_eq!(
            parse_remote("http://127.0.0.1:8080/a/b.git").unwrap(),
            ("http", "127.0.0.1:8080".to_string())
        );
        assert_eq!(parse_remote("file:///srv/a.git").unwrap().0, "file");
    }

    /// `git credential fill` through the helper, as git would ask it for `host`.
    fn fill(host: &str) -> Option<String> {
        let git = crate::transport::detect_cli()?;
        let mut child = Command::new(git)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GROVE_GIT_TOKEN", "Q7-secret")
            .env("GROVE_GIT_PROTOCOL", "https")
            .env("GROVE_GIT_HOST", "example.com:8443")
            .args([
                "-c",
                "credential.helper=",
                "-c",
                &format!("credential.helper={HELPER}"),
            ])
            .args(["credential", "fill"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write;
        let request = format!("protocol=https\nhost={host}\n\n");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(request.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        Some(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    #[test]
    fn the_credential_helper_answers_only_for_the_recorded_protocol_and_host() {
        let Some(ours) = fill("example.com:8443") else {
            eprintln!("skipping: no git 2.29 or newer installed");
            return;
        };
        assert!(
            ours.contains("username=x-access-token\npassword=Q7-secret\n"),
            "{ours:?}"
        );
        for other in ["example.com", "evil.example:8443", "example.com:8443.evil"] {
            let answer = fill(other).unwrap();
            assert!(!answer.contains("Q7-secret"), "{other}: {answer:?}");
        }
    }

    #[test]
    fn failures_are_typed_one_line_and_free_of_the_token() {
        let token = GitToken::new("s3cr3t-token".into());
        let auth = "remote: nope\nfatal: Authentication failed for 'http://h/a.git/'\n";
        assert_eq!(
            classify(auth, Some(&token), "git fetch"),
            GitError::AuthFailed
        );
        let echoed = "remote: s3cr3t-token\nfatal: unable to access 'http://h/': The requested URL returned error: 500\n";
        let err = classify(echoed, Some(&token), "git fetch");
        assert!(matches!(&err, GitError::Unavailable(m) if m.contains("error: 500")));
        let full =
            "error: unable to write file: No space left on device\nfatal: index-pack failed\n";
        assert!(matches!(
            classify(full, None, "git fetch"),
            GitError::ResourceLimit(_)
        ));
        let leak = "fatal: s3cr3t-token\u{1b}[31m\n";
        let text = classify(leak, Some(&token), "git fetch").to_string();
        assert!(
            !text.contains("s3cr3t") && !text.contains('\u{1b}'),
            "{text}"
        );
    }
}
