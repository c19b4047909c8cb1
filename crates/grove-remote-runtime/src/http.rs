//! HTTP statuses of a provider's API to the port's [`RuntimeError`], and the
//! encoding of ids into URL path segments.

use grove_core::error::RuntimeError;

/// The typed error for an API answer of `status`. `text` is the whole message the
/// error carries (never a key or a URL); `message` is the provider's own, read for a
/// quota hint when `quota_403` says the provider answers an exhausted quota with 403.
pub fn status_error(status: u16, text: String, message: &str, quota_403: bool) -> RuntimeError {
    match status {
        401 => RuntimeError::Unauthorized(text),
        403 if quota_403 && message.to_ascii_lowercase().contains("quota") => {
            RuntimeError::ResourceLimit(text)
        }
        403 => RuntimeError::Unauthorized(text),
        404 | 410 => RuntimeError::NotFound(text),
        408 | 504 => RuntimeError::Timeout(text),
        409 => RuntimeError::Conflict(text),
        429 | 507 => RuntimeError::ResourceLimit(text),
        400 | 422 => RuntimeError::CommandRejected(text),
        _ => RuntimeError::Unavailable(text),
    }
}

/// Percent-encodes one path segment or query value (ids come from the API or from
/// grove, but a segment must never be able to add a path level).
pub fn enc(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_403_is_a_resource_limit_only_where_the_provider_says_so() {
        let e = |s, q| status_error(s, "t".into(), "Total CPU quota exceeded", q);
        assert!(matches!(e(403, true), RuntimeError::ResourceLimit(_)));
        assert!(matches!(e(403, false), RuntimeError::Unauthorized(_)));
        assert!(matches!(e(404, false), RuntimeError::NotFound(_)));
        assert!(matches!(e(502, false), RuntimeError::Unavailable(_)));
    }

    #[test]
    fn a_segment_cannot_add_a_path_level() {
        assert_eq!(enc("a/../b c"), "a%2F..%2Fb%20c");
    }
}
