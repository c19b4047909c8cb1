//! Command ids derived from idempotency keys: one key in one scope names one command.
//!
//! The derivation is also written in SQL (`grove.command_id_for_key` in
//! `migrations/*_http_api.sql`); the two must agree, and an e2e test checks that they do.

use uuid::Uuid;

use crate::validate::ValidationError;

/// Longest idempotency key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 255;

/// The scope of keys given to the SQL function `grove.enqueue_ensure_repo_cache` (services
/// sharing the database, trusted like any other writer of it).
pub const SQL_SCOPE: &str = "sql";

/// The scope of a user's keys: keys of different users never name the same command, so
/// nobody can read another user's outcome by guessing their key.
pub fn user_scope(user_id: &str) -> String {
    format!("user:{user_id}")
}

/// Checks an idempotency key: 1 to 255 bytes, no control characters.
pub fn validate_key(key: &str) -> Result<(), ValidationError> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES || key.chars().any(char::is_control) {
        return Err(ValidationError::Request(format!(
            "invalid idempotency key: expected 1 to {MAX_KEY_BYTES} bytes without control characters"
        )));
    }
    Ok(())
}

/// The command id of `key` in `scope`: a name-based UUID (version 8, RFC 9562) made of
/// the first 16 bytes of `SHA-256("grove.idempotency" 0 scope 0 key)`. SHA-256 rather
/// than version 5's SHA-1 because Postgres has `sha256()` built in, so SQL callers derive
/// the same id without an extension.
pub fn command_id_for_key(scope: &str, key: &str) -> Uuid {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"grove.idempotency");
    h.update([0]);
    h.update(scope.as_bytes());
    h.update([0]);
    h.update(key.as_bytes());
    let digest = h.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    bytes[6] = (bytes[6] & 0x0f) | 0x80;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    Uuid::from_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_names_one_command_per_scope() {
        let a = command_id_for_key(&user_scope("alice"), "parse-42");
        assert_eq!(a, command_id_for_key(&user_scope("alice"), "parse-42"));
        assert_ne!(a, command_id_for_key(&user_scope("bob"), "parse-42"));
        assert_ne!(a, command_id_for_key(&user_scope("alice"), "parse-43"));
        assert_eq!(a.get_version_num(), 8);
        assert_eq!(a.get_variant(), uuid::Variant::RFC4122);
    }

    #[test]
    fn keys_with_control_characters_or_too_long_are_refused() {
        assert!(validate_key("ok-key_1").is_ok());
        assert!(validate_key("").is_err());
        assert!(validate_key("a\nb").is_err());
        assert!(validate_key(&"k".repeat(256)).is_err());
    }
}
