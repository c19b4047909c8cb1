//! Validation of untrusted input: repo names, URLs, refs, scope ids, commands, env.
//!
//! Every value a caller sends passes through one of these constructors before it
//! reaches git, a path or a runtime. A constructor either returns a value that is
//! safe to use as-is or a [`ValidationError`] whose message never repeats a secret
//! (URLs are named by their scheme and host only).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest id (user, project, conversation, task) grove accepts.
pub const MAX_SCOPE_ID_LEN: usize = 128;
/// Longest ref or branch name grove accepts.
pub const MAX_REF_LEN: usize = 255;
/// Largest total size of a command's arguments.
pub const MAX_COMMAND_BYTES: usize = 128 * 1024;

/// Why an input was refused. Each variant maps to exit code 2 and HTTP 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValidationError {
    #[error("invalid repo name {0:?}: expected OWNER/NAME of letters, digits, '.', '_' or '-'")]
    RepoName(String),
    #[error("invalid repo URL: {0}")]
    RepoUrl(String),
    #[error("invalid ref {shown:?}: {reason}")]
    Ref { shown: String, reason: &'static str },
    #[error("invalid {field} {shown:?}: {reason}")]
    ScopeId {
        field: &'static str,
        shown: String,
        reason: &'static str,
    },
    #[error("invalid mode {0:?}: expected analysis, edit or task")]
    Mode(String),
    #[error("invalid command kind {0:?}: expected read, write, install or test")]
    ExecKind(String),
    #[error("invalid command: {0}")]
    Command(&'static str),
    #[error("invalid environment variable: {0}")]
    Env(String),
    #[error("invalid request: {0}")]
    Request(String),
}

/// Renders untrusted text for an error message: control characters escaped, length capped.
fn shown(raw: &str) -> String {
    let mut out: String = raw.chars().take(80).collect();
    if raw.chars().count() > 80 {
        out.push('…');
    }
    out
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

fn valid_segment(seg: &str) -> bool {
    !seg.is_empty()
        && seg.len() <= 100
        && seg.chars().all(is_name_char)
        && !seg.starts_with('-')
        && !seg.starts_with('.')
        && !seg.contains("..")
}

/// A repository's display name, `OWNER/NAME`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RepoName(String);

impl RepoName {
    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        let err = || ValidationError::RepoName(shown(raw));
        let (owner, name) = raw.split_once('/').ok_or_else(err)?;
        if !valid_segment(owner) || !valid_segment(name) {
            return Err(err());
        }
        Ok(Self(raw.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for RepoName {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}
impl From<RepoName> for String {
    fn from(value: RepoName) -> Self {
        value.0
    }
}
impl fmt::Display for RepoName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A repository URL, validated, with the identity that names its repo cache.
///
/// Accepted forms: `https://host/path`, `http://host/path`, `ssh://[user@]host[:port]/path`,
/// scp-like `user@host:path`, and `file:///absolute/path`. Credentials in the URL are
/// refused (tokens travel separately), as are transport helpers such as `ext::` and
/// anything that git could read as an option.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepoUrl {
    url: String,
    identity: String,
    host: String,
}

impl RepoUrl {
    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        let bad = |why: &str| ValidationError::RepoUrl(why.to_string());
        if raw.is_empty() || raw.len() > 2048 {
            return Err(bad("empty or longer than 2048 bytes"));
        }
        if raw.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(bad("contains whitespace or control characters"));
        }
        if raw.starts_with('-') {
            return Err(bad("starts with '-'"));
        }
        if raw.contains("::") {
            return Err(bad("transport helpers (such as ext::) are not allowed"));
        }
        if let Some(rest) = raw.strip_prefix("file://") {
            if !rest.starts_with('/') {
                return Err(bad("file:// URLs must name an absolute path"));
            }
            if rest.split('/').any(|seg| seg == "..") {
                return Err(bad("file:// path contains '..'"));
            }
            let path = rest.trim_end_matches('/');
            let path = if path.is_empty() { "/" } else { path };
            return Ok(Self {
                url: raw.to_string(),
                identity: format!("file:{path}"),
                host: "file".into(),
            });
        }
        let (scheme, rest) = match raw.split_once("://") {
            Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
            None => {
                // scp-like: user@host:path (no scheme). A colon is required and the
                // host part must not contain '/'.
                let (authority, path) = raw.split_once(':').ok_or_else(|| {
                    bad("unrecognised form: expected https://, ssh://, file:// or user@host:path")
                })?;
                if authority.is_empty() || authority.contains('/') || path.starts_with("//") {
                    return Err(bad("unrecognised scp-like form"));
                }
                let host = authority.rsplit('@').next().unwrap_or(authority);
                if authority
                    .rsplit_once('@')
                    .is_some_and(|(user, _)| user.contains(':'))
                {
                    return Err(bad(
                        "credentials in the URL are not allowed; pass a token with --token-env",
                    ));
                }
                return Self::network(host, path, raw);
            }
        };
        if !matches!(scheme.as_str(), "https" | "http" | "ssh" | "git") {
            return Err(bad(
                "unsupported scheme (expected https, http, ssh, git or file)",
            ));
        }
        let (authority, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("no repository path"))?;
        if authority.contains('@') && scheme != "ssh" {
            return Err(bad(
                "credentials in the URL are not allowed; pass a token with --token-env",
            ));
        }
        if authority.contains(':') && authority.contains('@') && {
            let userinfo = authority.rsplit_once('@').map(|x| x.0).unwrap_or("");
            userinfo.contains(':')
        } {
            return Err(bad(
                "credentials in the URL are not allowed; pass a token with --token-env",
            ));
        }
        let hostport = authority.rsplit('@').next().unwrap_or(authority);
        let host = hostport.split(':').next().unwrap_or(hostport);
        Self::network(host, path, raw)
    }

    fn network(host: &str, path: &str, raw: &str) -> Result<Self, ValidationError> {
        let bad = |why: &str| ValidationError::RepoUrl(why.to_string());
        if host.is_empty()
            || host.starts_with('-')
            || !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':'))
        {
            return Err(bad("invalid host"));
        }
        let path = path.trim_matches('/');
        let path = path.strip_suffix(".git").unwrap_or(path);
        let segments: Vec<&str> = path.split('/').collect();
        if segments.is_empty() || segments.iter().any(|s| !valid_segment(s)) {
            return Err(bad("invalid repository path"));
        }
        let host = host.to_ascii_lowercase();
        let identity = format!("{}/{}", host, path.to_ascii_lowercase());
        Ok(Self {
            url: raw.to_string(),
            identity,
            host,
        })
    }

    /// The URL as given (never contains credentials).
    pub fn as_str(&self) -> &str {
        &self.url
    }
    /// The normalized identity: one per repository whatever the URL form.
    pub fn identity(&self) -> &str {
        &self.identity
    }
    /// The provider host (`file` for local repositories).
    pub fn host(&self) -> &str {
        &self.host
    }
    pub fn is_local(&self) -> bool {
        self.host == "file"
    }
}

/// Checks a ref or branch name by the rules of `git check-ref-format`, plus a length cap
/// and a ban on a leading `-` (which git would read as an option).
pub fn validate_ref(raw: &str) -> Result<(), ValidationError> {
    let err = |reason| ValidationError::Ref {
        shown: shown(raw),
        reason,
    };
    if raw.is_empty() {
        return Err(err("empty"));
    }
    if raw.len() > MAX_REF_LEN {
        return Err(err("longer than 255 bytes"));
    }
    if raw.starts_with('-') {
        return Err(err("starts with '-'"));
    }
    if raw
        .chars()
        .any(|c| c.is_control() || c == ' ' || c == '\u{7f}')
    {
        return Err(err("contains whitespace or control characters"));
    }
    if raw.contains("..") {
        return Err(err("contains '..'"));
    }
    if raw.contains("@{") || raw == "@" {
        return Err(err("contains '@{' or is '@'"));
    }
    if raw
        .chars()
        .any(|c| matches!(c, '~' | '^' | ':' | '?' | '*' | '[' | '\\'))
    {
        return Err(err("contains one of ~ ^ : ? * [ \\"));
    }
    if raw.starts_with('/') || raw.ends_with('/') || raw.contains("//") {
        return Err(err("empty path component"));
    }
    if raw.ends_with('.') || raw.ends_with(".lock") {
        return Err(err("ends with '.' or '.lock'"));
    }
    if raw
        .split('/')
        .any(|c| c.starts_with('.') || c.ends_with(".lock"))
    {
        return Err(err("a component starts with '.' or ends with '.lock'"));
    }
    Ok(())
}

/// Checks a user or project id: 1–128 printable characters from a conservative set.
pub fn validate_owner_id(field: &'static str, raw: &str) -> Result<(), ValidationError> {
    let err = |reason| ValidationError::ScopeId {
        field,
        shown: shown(raw),
        reason,
    };
    if raw.is_empty() || raw.len() > MAX_SCOPE_ID_LEN {
        return Err(err("must be 1 to 128 bytes"));
    }
    if raw.starts_with('-') || raw.starts_with('.') {
        return Err(err("must not start with '-' or '.'"));
    }
    if !raw
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@' | '+'))
    {
        return Err(err("allowed characters are letters, digits and . _ - @ +"));
    }
    if raw.contains("..") {
        return Err(err("must not contain '..'"));
    }
    Ok(())
}

/// Checks a conversation or task id, which becomes part of a branch name.
pub fn validate_branch_scope_id(field: &'static str, raw: &str) -> Result<(), ValidationError> {
    let err = |reason| ValidationError::ScopeId {
        field,
        shown: shown(raw),
        reason,
    };
    if raw.is_empty() || raw.len() > MAX_SCOPE_ID_LEN {
        return Err(err("must be 1 to 128 bytes"));
    }
    if !valid_segment(raw) || raw.ends_with(".lock") || raw.ends_with('.') {
        return Err(err(
            "allowed characters are letters, digits and . _ -, not leading '-' or '.', no '..'",
        ));
    }
    Ok(())
}

/// Checks a command's argv: non-empty, no NUL bytes, bounded size.
pub fn validate_command(argv: &[String]) -> Result<(), ValidationError> {
    if argv.is_empty() || argv[0].is_empty() {
        return Err(ValidationError::Command("empty command"));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(ValidationError::Command("an argument contains a NUL byte"));
    }
    if argv.iter().map(|a| a.len() + 1).sum::<usize>() > MAX_COMMAND_BYTES {
        return Err(ValidationError::Command("arguments exceed 128 KiB"));
    }
    Ok(())
}

/// Checks one environment variable given for a command.
pub fn validate_env(key: &str, value: &str) -> Result<(), ValidationError> {
    let key_ok = !key.is_empty()
        && key.len() <= 256
        && key
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !key_ok {
        return Err(ValidationError::Env(format!(
            "key {:?} must match [A-Za-z_][A-Za-z0-9_]*",
            shown(key)
        )));
    }
    if value.contains('\0') || value.len() > 32 * 1024 {
        return Err(ValidationError::Env(format!(
            "value of {key} contains NUL or exceeds 32 KiB"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_names_with_traversal_or_extra_segments_are_refused() {
        for bad in [
            "../x", "a/b/c", "-x/y", "x/-y", "a", "/a", "a/", "a/..", ".a/b", "a b/c", "a/b\n",
        ] {
            assert!(RepoName::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(RepoName::parse("octo-org/hello_world.rs").is_ok());
    }

    #[test]
    fn the_url_forms_of_one_repository_share_an_identity() {
        let forms = [
            "https://github.com/Octo/Hello.git",
            "https://GitHub.com/octo/hello",
            "ssh://git@github.com/octo/hello.git",
            "git@github.com:octo/hello.git",
            "https://github.com/octo/hello/",
        ];
        let ids: Vec<String> = forms
            .iter()
            .map(|u| RepoUrl::parse(u).unwrap().identity().to_string())
            .collect();
        assert!(ids.iter().all(|i| i == "github.com/octo/hello"), "{ids:?}");
    }

    #[test]
    fn urls_with_credentials_or_helpers_are_refused_without_echoing_them() {
        for bad in [
            "https://user:s3cret@github.com/o/r",
            "https://s3cret@github.com/o/r",
            "ext::sh -c touch% /tmp/pwned",
            "--upload-pack=touch /tmp/x",
            "ftp://host/o/r",
            "file://relative/path",
            "file:///a/../b",
            "https://host/o/r\nx",
        ] {
            let err = RepoUrl::parse(bad).expect_err(bad);
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
        assert!(RepoUrl::parse("file:///tmp/some/repo").unwrap().is_local());
    }

    #[test]
    fn refs_follow_check_ref_format() {
        for bad in [
            "", "a..b", "-x", "a\nb", "a b", "a~1", "a^", "a:b", "x.lock", "/a", "a/", "a//b", "@",
            "a@{1}", "a/.b",
        ] {
            assert!(validate_ref(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["main", "release/1.2", "agent/edits-c1", "0123abcd"] {
            validate_ref(good).unwrap();
        }
    }

    #[test]
    fn scope_ids_that_would_break_a_branch_name_are_refused() {
        for bad in ["", "../x", "a/b", "-a", "a..b", "a b", "x.lock"] {
            assert!(
                validate_branch_scope_id("conversation", bad).is_err(),
                "{bad:?}"
            );
        }
        validate_branch_scope_id("conversation", "conv-42_a.b").unwrap();
        validate_owner_id("user", "alice@example.com").unwrap();
        assert!(validate_owner_id("user", "al/ice").is_err());
    }

    #[test]
    fn commands_and_env_are_checked() {
        assert!(validate_command(&[]).is_err());
        assert!(validate_command(&["a\0b".into()]).is_err());
        validate_command(&["true".into()]).unwrap();
        assert!(validate_env("1A", "x").is_err());
        assert!(validate_env("A-B", "x").is_err());
        validate_env("RUST_LOG", "debug").unwrap();
    }
}
