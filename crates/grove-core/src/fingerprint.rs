//! Keyed fingerprints of git tokens: `auth_scope_hash` is an HMAC-SHA-256 under a
//! 32-byte secret of the deployment, so a stored or printed fingerprint cannot be
//! checked against a guessed token offline. The secret never leaves this type: it has
//! no accessor, and `Debug` prints nothing of it.

use std::fmt;

use hmac::{KeyInit, Mac};

type HmacSha256 = hmac::Hmac<sha2_hmac::Sha256>;

/// Length of the deployment's fingerprint secret, in bytes.
pub const KEY_LEN: usize = 32;

/// Hex digits kept of the HMAC (64 bits: enough to tell scopes apart, nothing to
/// reverse).
pub const FINGERPRINT_HEX: usize = 16;

/// Domain separation: this key signs nothing else.
const CONTEXT: &[u8] = b"grove auth scope v1\0";

/// Computes token fingerprints under the deployment's secret.
#[derive(Clone)]
pub struct Fingerprinter {
    key: [u8; KEY_LEN],
}

impl Fingerprinter {
    pub fn new(key: [u8; KEY_LEN]) -> Self {
        Self { key }
    }

    /// A fingerprinter from stored key bytes; `None` unless exactly [`KEY_LEN`] bytes.
    pub fn from_slice(key: &[u8]) -> Option<Self> {
        key.try_into().ok().map(Self::new)
    }

    /// The fingerprint of `token`: the first [`FINGERPRINT_HEX`] hex digits of
    /// `HMAC-SHA-256(secret, context || token)`.
    pub fn auth_scope(&self, token: &str) -> String {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.key)
            .expect("HMAC accepts keys of any length");
        mac.update(CONTEXT);
        mac.update(token.as_bytes());
        let tag = mac.finalize().into_bytes();
        hex::encode(tag)[..FINGERPRINT_HEX].to_string()
    }
}

impl fmt::Debug for Fingerprinter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fingerprinter(<secret>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::short_hash;

    #[test]
    fn same_token_same_key_same_fingerprint() {
        let a = Fingerprinter::new([7; KEY_LEN]);
        let b = Fingerprinter::from_slice(&[7; KEY_LEN]).unwrap();
        assert_eq!(a.auth_scope("ghp_token"), b.auth_scope("ghp_token"));
        assert_eq!(a.auth_scope("ghp_token").len(), FINGERPRINT_HEX);
        assert_ne!(a.auth_scope("ghp_token"), a.auth_scope("ghp_other"));
    }

    #[test]
    fn a_guessed_token_cannot_be_checked_without_the_key() {
        let fp = Fingerprinter::new([9; KEY_LEN]);
        let stored = fp.auth_scope("guessable");
        // The old, unkeyed form an attacker could compute offline.
        assert_ne!(stored, short_hash("guessable", FINGERPRINT_HEX));
        // Another deployment's key gives another value.
        assert_ne!(
            stored,
            Fingerprinter::new([10; KEY_LEN]).auth_scope("guessable")
        );
    }

    #[test]
    fn the_key_is_neither_shown_nor_accepted_at_a_wrong_length() {
        let fp = Fingerprinter::new([0xab; KEY_LEN]);
        let shown = format!("{fp:?}");
        assert!(!shown.contains("ab") && !shown.contains("171"), "{shown}");
        assert!(Fingerprinter::from_slice(&[1; 16]).is_none());
    }
}
