//! Bearer tokens: who the caller is, and whether they are an operator.
//!
//! Tokens are configured as `TOKEN=USER` or `TOKEN=USER:operator` entries, separated by
//! commas or newlines (`#` starts a comment line), in `GROVE_API_TOKENS` and/or in the
//! file named by `GROVE_API_TOKENS_FILE`. Only SHA-256 digests of the tokens are kept,
//! and a presented token is compared with every configured one in constant time. No
//! token, configured or presented, is ever logged or put in an error message.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::AppState;

/// Shortest token accepted in the configuration.
pub const MIN_TOKEN_LEN: usize = 16;

/// The caller of a request, from its bearer token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user_id: String,
    /// Operators see and act on every user's workspaces.
    pub operator: bool,
}

impl Caller {
    /// Whether this caller may see a resource owned by `owner`.
    pub fn can_see(&self, owner: &str) -> bool {
        self.operator || self.user_id == owner
    }
}

/// A token configuration that cannot be used. Messages name the entry, never its token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenConfigError {
    #[error("{source_name}, entry {entry}: {reason}")]
    Entry {
        source_name: String,
        entry: usize,
        reason: String,
    },
    #[error("reading {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{0} configures no token")]
    Empty(String),
}

/// The configured tokens (their digests) and who each one is.
#[derive(Default)]
pub struct Tokens {
    entries: Vec<([u8; 32], Caller)>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} configured)", self.entries.len())
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    /// Parses `TOKEN=USER[:operator]` entries; `source_name` is used in error messages.
    pub fn parse(source_name: &str, text: &str) -> Result<Self, TokenConfigError> {
        let mut tokens = Self::default();
        let entries = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .flat_map(|l| l.split(','))
            .map(str::trim)
            .filter(|e| !e.is_empty());
        for (i, entry) in entries.enumerate() {
            let bad = |reason: &str| TokenConfigError::Entry {
                source_name: source_name.to_string(),
                entry: i + 1,
                reason: reason.to_string(),
            };
            let (token, who) = entry
                .rsplit_once('=')
                .ok_or_else(|| bad("expected TOKEN=USER or TOKEN=USER:operator"))?;
            if token.len() < MIN_TOKEN_LEN {
                return Err(bad("the token is shorter than 16 characters"));
            }
            if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(bad("the token contains whitespace or control characters"));
            }
            let (user, operator) = match who.split_once(':') {
                None => (who, false),
                Some((user, "operator")) => (user, true),
                Some(_) => return Err(bad("the role after ':' must be `operator`")),
            };
            grove_core::validate::validate_owner_id("user", user)
                .map_err(|e| bad(&e.to_string()))?;
            tokens.add(token, user, operator);
        }
        if tokens.entries.is_empty() {
            return Err(TokenConfigError::Empty(source_name.to_string()));
        }
        Ok(tokens)
    }

    /// The tokens of `GROVE_API_TOKENS` and `GROVE_API_TOKENS_FILE`; `None` when neither
    /// is set.
    pub fn from_env() -> Result<Option<Self>, TokenConfigError> {
        let mut all = Self::default();
        let mut any = false;
        if let Some(text) = std::env::var("GROVE_API_TOKENS")
            .ok()
            .filter(|v| !v.is_empty())
        {
            all.entries
                .extend(Self::parse("GROVE_API_TOKENS", &text)?.entries);
            any = true;
        }
        if let Some(path) = std::env::var("GROVE_API_TOKENS_FILE")
            .ok()
            .filter(|v| !v.is_empty())
        {
            let text = std::fs::read_to_string(&path).map_err(|error| TokenConfigError::Read {
                path: path.clone(),
                error,
            })?;
            all.entries.extend(Self::parse(&path, &text)?.entries);
            any = true;
        }
        Ok(any.then_some(all))
    }

    /// A fresh random token for `user` (an operator), for a development server on
    /// loopback. Returns the tokens and the token to print.
    pub fn dev(user: &str) -> (Self, String) {
        let token = format!(
            "grove-dev-{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let mut tokens = Self::default();
        tokens.add(&token, user, true);
        (tokens, token)
    }

    fn add(&mut self, token: &str, user: &str, operator: bool) {
        self.entries.push((
            digest(token),
            Caller {
                user_id: user.to_string(),
                operator,
            },
        ));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The caller a presented token belongs to. Every configured digest is compared, in
    /// constant time, whether or not an earlier one matched.
    pub fn authenticate(&self, presented: &str) -> Option<Caller> {
        let presented = digest(presented);
        let mut found = None;
        for (known, caller) in &self.entries {
            if bool::from(known.ct_eq(&presented)) && found.is_none() {
                found = Some(caller.clone());
            }
        }
        found
    }
}

impl FromRequestParts<std::sync::Arc<AppState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &std::sync::Arc<AppState>,
    ) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or(ApiError::Unauthorized)?;
        let (scheme, token) = header.split_once(' ').ok_or(ApiError::Unauthorized)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(ApiError::Unauthorized);
        }
        state
            .tokens
            .authenticate(token.trim())
            .ok_or(ApiError::Unauthorized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_map_tokens_to_users_and_operators() {
        let t = Tokens::parse(
            "test",
            "# comment\naaaaaaaaaaaaaaaa=alice, bbbbbbbbbbbbbbbb=ops:operator\n",
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        let alice = t.authenticate("aaaaaaaaaaaaaaaa").unwrap();
        assert_eq!(alice.user_id, "alice");
        assert!(!alice.operator);
        assert!(t.authenticate("bbbbbbbbbbbbbbbb").unwrap().operator);
        assert!(t.authenticate("cccccccccccccccc").is_none());
        assert!(t.authenticate("").is_none());
    }

    #[test]
    fn bad_entries_are_refused_without_echoing_the_token() {
        for bad in [
            "short=alice",
            "aaaaaaaaaaaaaaaa",
            "aaaaaaaaaaaaaaaa=alice:admin",
            "aaaaaaaaaaaaaaaa=../x",
            "",
        ] {
            let err = Tokens::parse("test", bad).unwrap_err().to_string();
            assert!(!err.contains("aaaaaaaaaaaaaaaa"), "{err}");
        }
    }

    #[test]
    fn operators_see_everything_and_users_their_own() {
        let alice = Caller {
            user_id: "alice".into(),
            operator: false,
        };
        assert!(alice.can_see("alice"));
        assert!(!alice.can_see("bob"));
        let ops = Caller {
            user_id: "ops".into(),
            operator: true,
        };
        assert!(ops.can_see("bob"));
    }
}
