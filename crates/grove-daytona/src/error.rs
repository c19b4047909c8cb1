//! Failures of the Daytona adapter and their translation into the port's
//! [`RuntimeError`]. Messages carry the API's own message and status, never the API key
//! or a request URL.

use grove_core::error::RuntimeError;

/// What went wrong talking to Daytona.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DaytonaError {
    /// The API answered with an error status.
    #[error("daytona answered {status}: {message}")]
    Api { status: u16, message: String },
    /// The request did not complete (connection refused, reset, TLS).
    #[error("daytona unreachable: {0}")]
    Transport(String),
    /// The request or a wait for a state ran out of time.
    #[error("daytona timed out: {0}")]
    Timeout(String),
    /// The API answered something this adapter cannot read.
    #[error("unexpected answer from daytona: {0}")]
    Protocol(String),
    /// A sandbox is in a state it cannot leave by itself (`error`, `build_failed`).
    #[error("sandbox {id} is in state {state}: {reason}")]
    Broken {
        id: String,
        state: String,
        reason: String,
    },
    /// The adapter's configuration is incomplete or invalid.
    #[error("daytona configuration: {0}")]
    Config(String),
}

impl DaytonaError {
    pub(crate) fn from_reqwest(e: reqwest::Error) -> Self {
        // `without_url`: a URL carries ids and, for some callers, query values; keep
        // error messages to the failure itself.
        let timeout = e.is_timeout();
        let msg = e.without_url().to_string();
        if timeout {
            Self::Timeout(msg)
        } else {
            Self::Transport(msg)
        }
    }

    /// The HTTP status, for API errors.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// An answer of the validation family (400/422): Daytona sometimes sends one for an
    /// operation that did take effect, so callers verify by reading state.
    pub fn is_validation(&self) -> bool {
        matches!(self.status(), Some(400 | 422))
    }
}

impl From<DaytonaError> for RuntimeError {
    fn from(e: DaytonaError) -> Self {
        let text = e.to_string();
        match &e {
            DaytonaError::Api { status, message } => {
                // Daytona answers an exhausted quota with 403 and a message naming it.
                grove_remote_runtime::status_error(*status, text, message, true)
            }
            DaytonaError::Transport(_)
            | DaytonaError::Protocol(_)
            | DaytonaError::Broken { .. } => RuntimeError::Unavailable(text),
            DaytonaError::Timeout(_) => RuntimeError::Timeout(text),
            DaytonaError::Config(_) => RuntimeError::Unavailable(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16, message: &str) -> RuntimeError {
        DaytonaError::Api {
            status,
            message: message.into(),
        }
        .into()
    }

    #[test]
    fn statuses_map_to_the_typed_runtime_errors() {
        assert!(matches!(
            api(401, "Unauthorized"),
            RuntimeError::Unauthorized(_)
        ));
        assert!(matches!(
            api(403, "Forbidden"),
            RuntimeError::Unauthorized(_)
        ));
        assert!(matches!(
            api(403, "Total CPU quota exceeded"),
            RuntimeError::ResourceLimit(_)
        ));
        assert!(matches!(
            api(404, "Sandbox not found"),
            RuntimeError::NotFound(_)
        ));
        assert!(matches!(api(408, "timeout"), RuntimeError::Timeout(_)));
        assert!(matches!(api(409, "busy"), RuntimeError::Conflict(_)));
        assert!(matches!(
            api(429, "slow down"),
            RuntimeError::ResourceLimit(_)
        ));
        assert!(matches!(api(400, "bad"), RuntimeError::CommandRejected(_)));
        assert!(matches!(
            api(502, "bad gateway"),
            RuntimeError::Unavailable(_)
        ));
        assert!(matches!(
            RuntimeError::from(DaytonaError::Timeout("x".into())),
            RuntimeError::Timeout(_)
        ));
    }
}
