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

/// An accepted key's id, weight and name: under fair scheduling a key of weight 4 is served
/// four times the tokens of a key of weight 1 while both have requests waiting; the name (from
/// the key file) labels the key's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tenant {
    pub key: KeyId,
    pub weight: NonZeroU32,
    pub name: Option<KeyName>,
}

/// A key's name from the key file. Names are interned for the router's lifetime (see
/// `ApiKeys`), one allocation per distinct name ever configured, so tenants stay `Copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyName(&'static str);

impl KeyName {
    /// Interns `name` into `interned`, which owns every name the router has seen.
    pub fn intern(name: &str, interned: &mut std::collections::HashSet<&'static str>) -> Self {
        match interned.get(name) {
            Some(known) => Self(known),
            None => {
                let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
                interned.insert(leaked);
                Self(leaked)
            }
        }
    }

    pub fn as_str(self) -> &'static str {
        self.0
    }
}

impl Tenant {
    /// The tenant of `key` at weight 1 (keys given inline, keys without a weight).
    pub fn unweighted(key: KeyId) -> Self {
        Self {
            key,
            weight: NonZeroU32::MIN,
            name: None,
        }
    }
}
