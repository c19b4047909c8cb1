//! GitHub's answers to `PlatformError`: status codes, rate-limit headers, the error body.
//!
//! From GitHub's REST reference (2022-11-28): 401 is bad or missing credentials; 403 is
//! either a permission refusal or a rate limit; 404 (and 410 for a deleted issue) is an
//! absent or invisible resource; 422 is a validation failure whose `errors` array says
//! what; a primary rate limit is a 403 or 429 with `x-ratelimit-remaining: 0` (wait
//! until `x-ratelimit-reset`, epoch seconds), a secondary one a 403 or 429 whose message
//! names it, possibly with `retry-after` (seconds); 5xx is the platform's trouble.

use grove_core::platform::PlatformError;
use reqwest::header::HeaderMap;
use reqwest::StatusCode;

use crate::wire::ErrorBody;

/// Longest platform message kept (characters).
const MAX_MESSAGE: usize = 300;

/// One line of at most [`MAX_MESSAGE`] characters, with `secret` (if any) blanked.
pub fn clean(text: &str, secret: Option<&str>) -> String {
    let mut line: String = text
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_MESSAGE)
        .collect();
    if let Some(s) = secret.filter(|s| !s.is_empty()) {
        line = line.replace(s, "***");
    }
    line
}

/// A transport failure in one line, without the URL.
pub fn transport(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "request failed"
    };
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(e);
    let mut detail = String::new();
    while let Some(s) = source {
        detail = s.to_string();
        source = s.source();
    }
    if detail.is_empty() {
        kind.to_string()
    } else {
        clean(&format!("{kind}: {detail}"), None)
    }
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// How long GitHub asks us to wait, if it says: `retry-after`, else the time until
/// `x-ratelimit-reset` when the remaining count is 0.
pub fn retry_after(headers: &HeaderMap) -> Option<u64> {
    if let Some(secs) = header_u64(headers, "retry-after") {
        return Some(secs);
    }
    if header_u64(headers, "x-ratelimit-remaining") == Some(0) {
        let reset = header_u64(headers, "x-ratelimit-reset")?;
        let now = chrono::Utc::now().timestamp().max(0) as u64;
        return Some(reset.saturating_sub(now));
    }
    None
}

/// Maps a non-2xx answer. `what` names the request for the message; `secret` is
/// blanked from whatever the platform said.
pub fn from_response(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    what: &str,
    secret: Option<&str>,
) -> PlatformError {
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let message = clean(
        parsed
            .message
            .as_deref()
            .unwrap_or(status.canonical_reason().unwrap_or("error")),
        secret,
    );
    let limited = crate::is_rate_limit_status(status)
        && (header_u64(headers, "x-ratelimit-remaining") == Some(0)
            || headers.contains_key("retry-after")
            || status == StatusCode::TOO_MANY_REQUESTS
            || message.to_ascii_lowercase().contains("rate limit"));
    if limited {
        return PlatformError::RateLimited {
            retry_after_secs: retry_after(headers),
            message: format!("{what}: {message}"),
        };
    }
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            PlatformError::Unauthorized(format!("{what}: {status}: {message}"))
        }
        StatusCode::NOT_FOUND | StatusCode::GONE => {
            PlatformError::NotFound(format!("{what}: {message}"))
        }
        StatusCode::UNPROCESSABLE_ENTITY | StatusCode::CONFLICT => PlatformError::Validation {
            message,
            errors: parsed
                .errors
                .iter()
                .map(|e| clean(&e.render(), secret))
                .filter(|e| !e.is_empty())
                .take(10)
                .collect(),
        },
        s if s.is_redirection() => PlatformError::NotFound(format!(
            "{what}: the platform answered {s} (the repository was moved or renamed)"
        )),
        s if s.is_server_error() => PlatformError::Unavailable(format!("{what}: {s}: {message}")),
        s => PlatformError::Invalid(format!("{what}: the platform answered {s}: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn a_403_with_no_remaining_requests_is_a_rate_limit_with_its_reset() {
        let mut h = HeaderMap::new();
        h.insert("x-ratelimit-remaining", HeaderValue::from_static("0"));
        let reset = chrono::Utc::now().timestamp() + 120;
        h.insert(
            "x-ratelimit-reset",
            HeaderValue::from_str(&reset.to_string()).unwrap(),
        );
        let body = br#"{"message":"API rate limit exceeded for user ID 1."}"#;
        match from_response(StatusCode::FORBIDDEN, &h, body, "x", None) {
            PlatformError::RateLimited {
                retry_after_secs: Some(s),
                ..
            } => assert!((100..=120).contains(&s), "{s}"),
            other => panic!("{other:?}"),
        }
        // A plain 403 is a refusal of the credentials, not a limit.
        let body = br#"{"message":"Resource not accessible by integration"}"#;
        assert!(matches!(
            from_response(StatusCode::FORBIDDEN, &HeaderMap::new(), body, "x", None),
            PlatformError::Unauthorized(_)
        ));
    }

    #[test]
    fn a_422_keeps_the_platforms_messages_and_blanks_a_secret() {
        let body = br#"{"message":"Validation Failed","errors":[{"resource":"PullRequest","code":"custom","message":"A pull request already exists for o:b."},{"resource":"PullRequest","field":"base","code":"invalid"},"tok-123 leaked"]}"#;
        let e = from_response(
            StatusCode::UNPROCESSABLE_ENTITY,
            &HeaderMap::new(),
            body,
            "x",
            Some("tok-123"),
        );
        assert_eq!(
            e,
            PlatformError::Validation {
                message: "Validation Failed".into(),
                errors: vec![
                    "A pull request already exists for o:b.".into(),
                    "PullRequest.base invalid".into(),
                    "*** leaked".into()
                ]
            }
        );
    }
}
