//! Who a request is served for: the API key it was accepted with (never the key itself) and
//! the share of the engine that key is weighted to under `--scheduling-policy fair`.

use std::num::NonZeroU32;

use sha2::{Digest, Sha256};

/// Names an accepted key without holding it: the key's SHA-256. The same key has the same id
/// across reloads, so what a key owns stays its own while the key stays accepted.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId([u8; 32]);

impl KeyId {
    /// The id of `key`.
    pub fn of(key: &[u8]) -> Self {
        Self(Sha256::digest(key).into())
    }
}

impl std::fmt::Debug for KeyId {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("KeyId(..)")
    }
}

/// An accepted key's id and weight: under fair scheduling a key of weight 4 is served four
/// times the tokens of a key of weight 1 while both have requests waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tenant {
    pub key: KeyId,
    pub weight: NonZeroU32,
}

impl Tenant {
    /// The tenant of `key` at weight 1 (keys given inline, keys without a weight).
    pub fn unweighted(key: KeyId) -> Self {
        Self {
            key,
            weight: NonZeroU32::MIN,
        }
    }
}
