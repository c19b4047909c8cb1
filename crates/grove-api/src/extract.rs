//! Request extractors whose failures answer in the API's error shape.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::error::ApiError;

/// The header that carries a git token for one request (private repositories).
pub const GIT_TOKEN_HEADER: &str = "x-grove-git-token";

/// A JSON body (required).
pub struct JsonBody<T>(pub T);

/// A JSON body that may be left out: empty, or `null`, means `T::default()` (the
/// document declares these bodies nullable).
pub struct OptionalJsonBody<T>(pub T);

async fn read_json<S: Send + Sync, T: DeserializeOwned>(
    req: Request,
    state: &S,
) -> Result<Option<T>, ApiError> {
    let json_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_json_type);
    let bytes = Bytes::from_request(req, state)
        .await
        .map_err(|e| ApiError::Request(e.status(), e.body_text()))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    if !json_type {
        return Err(ApiError::Request(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the body must be sent as Content-Type: application/json".into(),
        ));
    }
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        let status = if e.is_data() {
            StatusCode::UNPROCESSABLE_ENTITY
        } else {
            StatusCode::BAD_REQUEST
        };
        ApiError::Request(status, format!("invalid JSON body: {e}"))
    })
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        read_json(req, state).await?.map(Self).ok_or_else(|| {
            ApiError::Request(StatusCode::BAD_REQUEST, "a JSON body is required".into())
        })
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalJsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let body: Option<Option<T>> = read_json(req, state).await?;
        Ok(Self(body.flatten().unwrap_or_default()))
    }
}

/// A JSON body that may be left out (empty means `T::default()`), but is never `null`:
/// the document declares an object (a tool's arguments).
pub struct OptionalObjectBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalObjectBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let body: Option<T> = read_json(req, state).await?;
        Ok(Self(body.unwrap_or_default()))
    }
}

/// `application/json`, or a `+json` type, with or without parameters.
fn is_json_type(value: &str) -> bool {
    let essence = value.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
        || (essence.len() > 5
            && essence.to_ascii_lowercase().starts_with("application/")
            && essence.to_ascii_lowercase().ends_with("+json"))
}

/// Query parameters (no NUL bytes).
pub struct QueryParams<T>(pub T);

impl<S, T> FromRequestParts<S> for QueryParams<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        // A NUL byte can reach no column or path: refused here, before anything reads it.
        let raw = parts.uri.query().unwrap_or("");
        if raw.to_ascii_lowercase().contains("%00") {
            return Err(ApiError::invalid(
                "invalid query: a parameter contains a NUL byte",
            ));
        }
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| Self(q))
            .map_err(|e| ApiError::Request(StatusCode::BAD_REQUEST, e.body_text()))
    }
}

/// Parses an id from the path; a malformed one is bad input, like the CLI's.
pub fn parse_id(raw: &str, what: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| {
        ApiError::invalid(format!(
            "invalid {what} id {:?}: expected a UUID",
            raw.chars().take(40).collect::<String>()
        ))
    })
}

/// The git token of a request, from [`GIT_TOKEN_HEADER`]. Error messages never include it.
pub fn git_token(headers: &axum::http::HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(GIT_TOKEN_HEADER) else {
        return Ok(None);
    };
    let token = value
        .to_str()
        .ok()
        .filter(|t| {
            !t.is_empty()
                && t.len() <= 4096
                && !t.chars().any(|c| c.is_whitespace() || c.is_control())
        })
        .ok_or_else(|| {
            ApiError::invalid(
                "invalid X-Grove-Git-Token: expected 1 to 4096 visible ASCII characters",
            )
        })?;
    Ok(Some(token.to_string()))
}

/// The largest request body the API reads (axum's default limit, stated once).
pub const MAX_BODY_BYTES: usize = 2 << 20;

/// An over-limit body up to this size is read and thrown away before the 413 is sent:
/// closing a socket with unread data resets it, and the client, still writing, would
/// see a broken pipe instead of the answer. Larger ones are cut off at once.
const DRAINED_BODY_BYTES: u64 = 16 << 20;

/// Reads a request's body to its end (or for at most five seconds), discarding it.
async fn drain(req: Request) {
    use futures::StreamExt;
    let mut body = req.into_body().into_data_stream();
    let read_all = async { while let Some(Ok(_)) = body.next().await {} };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), read_all).await;
}

/// Refuses a request whose declared `Content-Length` is over [`MAX_BODY_BYTES`] before
/// any route looks at it, on every route alike: 413 in the error envelope, and the
/// connection closed (its body is left unread). A body sent without a length is cut at
/// the same limit by the JSON extractors.
pub async fn refuse_oversized_bodies(
    req: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > MAX_BODY_BYTES as u64) {
        use axum::response::IntoResponse;
        if n <= DRAINED_BODY_BYTES {
            drain(req).await;
        }
        return ApiError::Request(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is over the limit of {MAX_BODY_BYTES} bytes"),
        )
        .into_response();
    }
    next.run(req).await
}
