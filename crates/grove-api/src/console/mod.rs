//! The operator console: server-rendered HTML pages under `/ui` (ADR 29).
//!
//! Signed in with the API's bearer tokens: the login form puts the token in a session
//! cookie (`HttpOnly`, `SameSite=Strict`, `Secure` behind TLS) and every page
//! authenticates it as the API authenticates a header, with the same tenancy (a user
//! sees their own workspaces, an operator everyone's; Fleet and Events are operators'
//! pages). Its few actions (sign out, run `replay --verify`, and the operators' rewind
//! and fork of a workspace at a history point, each confirmed on a second page) are
//! POSTs that carry a CSRF token derived from the session's token and are refused from
//! another origin.
//!
//! Templates ([`templates`]) are minijinja with HTML auto-escaping; every stored string
//! (argv, output, paths, error messages) is attacker-written and reaches the page only
//! escaped. The one script ([`assets`]) is a static file: no inline script or handler,
//! and a Content-Security-Policy that allows none. Like the rest of the API, the console
//! writes no events or projections itself: a step's diff, a rewind and a fork are tool
//! commands through the queue, and `replay --verify` writes only its own run record.

mod assets;
mod history;
mod pages;
mod session;
mod templates;
mod timeline;

use std::sync::Arc;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::AppState;

pub use session::{csrf_token, COOKIE};

/// The console's Content-Security-Policy: own scripts and styles only, no framing.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The `/ui` routes (HTML; not part of the OpenAPI document).
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/ui", get(pages::home))
        .route("/ui/", get(pages::home))
        .route("/ui/login", get(session::login_form).post(session::login))
        .route("/ui/logout", post(session::logout))
        .route("/ui/fleet", get(pages::fleet))
        .route("/ui/workspaces", get(pages::workspaces))
        .route("/ui/workspaces/{id}", get(pages::workspace))
        .route(
            "/ui/workspaces/{id}/timeline",
            get(pages::timeline_fragment),
        )
        .route("/ui/workspaces/{id}/follow", get(pages::follow))
        .route(
            "/ui/workspaces/{id}/points/{n}/diff",
            get(history::point_diff),
        )
        .route(
            "/ui/workspaces/{id}/points/{n}/rewind",
            post(history::rewind_ask),
        )
        .route(
            "/ui/workspaces/{id}/points/{n}/rewind/confirm",
            post(history::rewind_confirm),
        )
        .route(
            "/ui/workspaces/{id}/points/{n}/fork",
            post(history::fork_ask),
        )
        .route(
            "/ui/workspaces/{id}/points/{n}/fork/confirm",
            post(history::fork_confirm),
        )
        .route("/ui/events", get(pages::events))
        .route("/ui/events/verify", post(pages::verify))
        .route("/ui/assets/{name}", get(assets::serve))
        .layer(axum::middleware::map_response(security_headers))
}

async fn security_headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// A console request that failed: an HTML page with its status.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsoleError {
    /// Absent, or another user's (the same answer, as in the API). Handling: 404.
    #[error("not found")]
    NotFound,
    /// An operators' page or action asked for by a user. Handling: 403.
    #[error("this page is for operators")]
    Forbidden,
    /// A POST without a valid CSRF token or from another origin. Handling: 403.
    #[error("the form was not sent by this console (CSRF check failed); reload and retry")]
    Csrf,
    /// A query parameter that cannot be read. Handling: 400, with the message.
    #[error("{0}")]
    BadRequest(String),
    /// A command the console submitted failed with a kind (`conflict`: another command
    /// is running; `not_found`: no such point). Handling: the kind's status, with the
    /// command's one-line message.
    #[error("{kind}: {message}")]
    Command {
        status: StatusCode,
        kind: &'static str,
        message: String,
    },
    /// Postgres failed; logged, answered with a generic page. Handling: 500.
    #[error("internal error")]
    Store(#[from] grove_postgres::StoreError),
    /// A template failed to render (a bug); logged. Handling: 500.
    #[error("internal error")]
    Template(#[from] minijinja::Error),
}

impl ConsoleError {
    fn status(&self) -> StatusCode {
        match self {
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::Forbidden | Self::Csrf => StatusCode::FORBIDDEN,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Command { status, .. } => *status,
            Self::Store(_) | Self::Template(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<sqlx::Error> for ConsoleError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

impl From<crate::error::ApiError> for ConsoleError {
    fn from(e: crate::error::ApiError) -> Self {
        use crate::error::ApiError;
        match e {
            ApiError::Command(c) => Self::Command {
                status: crate::error::status_of(c.kind),
                kind: c.kind.as_str(),
                message: c.message,
            },
            ApiError::Store(s) => Self::Store(s),
            ApiError::Request(_, m) => Self::BadRequest(m),
            ApiError::Unauthorized => Self::Forbidden,
        }
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        match &self {
            Self::Store(e) => tracing::error!(error = %e, "console read failed"),
            Self::Template(e) => tracing::error!(error = %e, "console template failed"),
            _ => {}
        }
        let status = self.status();
        let body = templates::render(
            "error.html",
            minijinja::context! { status => status.as_u16(), message => self.to_string() },
        )
        .unwrap_or_else(|_| "error".into());
        (status, Html(body)).into_response()
    }
}
