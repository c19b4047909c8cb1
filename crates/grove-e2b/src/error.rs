//! Failures of the E2B adapter and their translation into the port's
//! [`RuntimeError`]. Messages carry E2B's own message and status, never the API key,
//! an envd access token or a request URL.

use grove_core::error::RuntimeError;

/// What went wrong talking to E2B or a sandbox's envd.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum E2bError {
    /// The REST API or envd answered with an error status.
    #[error("e2b answered {status}: {message}")]
    Api { status: u16, message: String },
    /// A Connect stream ended with an error (`code` is the Connect code).
    #[error("envd {code}: {message}")]
    Rpc { code: String, message: String },
    #[error("e2b unreachable: {0}")]
    Transport(String),
    #[error("e2b timed out: {0}")]
    Timeout(String),
    #[error("unexpected answer from e2b: {0}")]
    Protocol(String),
    #[error("e2b configuration: {0}")]
    Config(String),
}

impl E2bError {
    pub(crate) fn from_reqwest(e: reqwest::Error) -> Self {
        let timeout = e.is_timeout();
        let msg = e.without_url().to_string();
        if timeout {
            Self::Timeout(msg)
        } else {
            Self::Transport(msg)
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl From<E2bError> for RuntimeError {
    fn from(e: E2bError) -> Self {
        let text = e.to_string();
        match &e {
            // E2B answers 429 when the team's concurrent sandbox limit is reached.
            E2bError::Api { status, message } => {
                grove_remote_runtime::status_error(*status, text, message, false)
            }
            E2bError::Rpc { code, .. } => match code.as_str() {
                "not_found" => RuntimeError::NotFound(text),
                "unauthenticated" | "permission_denied" => RuntimeError::Unauthorized(text),
                "deadline_exceeded" => RuntimeError::Timeout(text),
                "already_exists" | "aborted" => RuntimeError::Conflict(text),
                "resource_exhausted" => RuntimeError::ResourceLimit(text),
                "invalid_argument" | "failed_precondition" => RuntimeError::CommandRejected(text),
                _ => RuntimeError::Unavailable(text),
            },
            E2bError::Timeout(_) => RuntimeError::Timeout(text),
            E2bError::Transport(_) | E2bError::Protocol(_) | E2bError::Config(_) => {
                RuntimeError::Unavailable(text)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_connect_codes_map_to_the_typed_runtime_errors() {
        let api = |status, m: &str| {
            RuntimeError::from(E2bError::Api {
                status,
                message: m.into(),
            })
        };
        assert!(matches!(
            api(401, "Invalid API key"),
            RuntimeError::Unauthorized(_)
        ));
        assert!(matches!(api(404, "not found"), RuntimeError::NotFound(_)));
        assert!(matches!(
            api(409, "already paused"),
            RuntimeError::Conflict(_)
        ));
        assert!(matches!(api(429, "limit"), RuntimeError::ResourceLimit(_)));
        assert!(matches!(api(400, "bad"), RuntimeError::CommandRejected(_)));
        assert!(matches!(api(502, "gateway"), RuntimeError::Unavailable(_)));
        let rpc = |code: &str| {
            RuntimeError::from(E2bError::Rpc {
                code: code.into(),
                message: "m".into(),
            })
        };
        assert!(matches!(rpc("not_found"), RuntimeError::NotFound(_)));
        assert!(matches!(
            rpc("resource_exhausted"),
            RuntimeError::ResourceLimit(_)
        ));
        assert!(matches!(
            rpc("unauthenticated"),
            RuntimeError::Unauthorized(_)
        ));
    }
}
