//! API errors: one JSON body, `{"error": {"kind", "message"}}`, with a status per kind.
//!
//! Statuses follow the CLI's exit codes: bad input 400 (422 for a request the runtime
//! or the workspace refuses), not found 404, conflict or locked 409, anything else 500;
//! and, where the kind says more, 403 (the git remote refused the credentials), 429
//! (a resource limit), 503 (no worker, or the runtime is unavailable). Messages are the
//! command errors' one line, which never carry secrets; database failures are logged
//! and answered with a generic message.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::validate::ValidationError;
use grove_postgres::submit::SubmitError;
use grove_postgres::StoreError;
use serde::Serialize;
use utoipa::ToSchema;

/// The body of every error response.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorResponse {
    pub error: ErrorBody,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong, one of a fixed set of kinds.
    #[schema(value_type = crate::contract::ErrorKindName)]
    pub kind: String,
    /// One line naming the problem.
    pub message: String,
    /// The workspace-relative paths the failure is about: every conflicting path of a
    /// merge-back conflict (409), or the uncommitted paths that refused it (422).
    /// Absent for other errors.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
}

/// A failed request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// No bearer token, or one that is not configured. Handling: 401.
    #[error("missing or invalid bearer token")]
    Unauthorized,
    /// The request or its command failed with a kind. Handling: the kind's status.
    #[error("{}", .0.message)]
    Command(CommandError),
    /// The request could not be read (body, query). Handling: this status, `invalid_input`.
    #[error("{1}")]
    Request(StatusCode, String),
    /// Postgres failed; the details go to the log only. Handling: 500.
    #[error("internal error")]
    Store(StoreError),
}

impl ApiError {
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::Command(CommandError::new(ErrorKind::NotFound, message))
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::Command(CommandError::new(ErrorKind::InvalidInput, message))
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Command(e) => status_of(e.kind),
            Self::Request(status, _) => *status,
            Self::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn body(&self) -> ErrorBody {
        let (kind, message) = match self {
            Self::Unauthorized => ("unauthorized", self.to_string()),
            Self::Command(e) => (e.kind.as_str(), e.message.clone()),
            Self::Request(_, m) => ("invalid_input", m.clone()),
            Self::Store(_) => (
                "internal",
                "internal error (see the server log)".to_string(),
            ),
        };
        ErrorBody {
            kind: kind.to_string(),
            message: message.lines().next().unwrap_or("").to_string(),
            paths: match self {
                Self::Command(e) => e.paths.clone(),
                _ => Vec::new(),
            },
        }
    }
}

/// The HTTP status of a command error kind.
pub fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Rejected => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::AuthFailed => StatusCode::FORBIDDEN,
        ErrorKind::ResourceLimit => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Self::Store(e) = &self {
            tracing::error!(error = %e, "request failed on the database");
        }
        let status = self.status();
        let body = axum::Json(ErrorResponse { error: self.body() });
        if status == StatusCode::UNAUTHORIZED {
            return (status, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response();
        }
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body is left unread, so the server closes the connection
            // after this answer: say so, or a client reuses it and its next request is cut.
            return (status, [(header::CONNECTION, "close")], body).into_response();
        }
        (status, body).into_response()
    }
}

impl From<CommandError> for ApiError {
    fn from(e: CommandError) -> Self {
        Self::Command(e)
    }
}

impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        Self::Command(e.into())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Locked(m) | StoreError::Conflict(m) => {
                Self::Command(CommandError::new(ErrorKind::Conflict, m))
            }
            other => Self::Store(other),
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        StoreError::from(e).into()
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Command(c) => Self::Command(c),
            SubmitError::Store(s) => s.into(),
            other => Self::Store(StoreError::Corrupt(other.to_string())),
        }
    }
}
