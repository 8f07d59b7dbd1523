//! The accepted API keys: given inline or read from files (again on SIGHUP), compared in
//! constant time, case-sensitively, and never logged. A key file line may give its key a
//! fair-scheduling weight (`key_file`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use axum::extract::Request;
use axum::http::header;
use subtle::ConstantTimeEq;

pub use super::key_file::ApiKeyError;
use super::key_file::{checked, read_key_file, Names, WeightedKey};
use crate::error::AuthError;
pub use crate::tenant::KeyId;
use crate::tenant::Tenant;

/// The header Anthropic clients send their key in.
const X_API_KEY: &str = "x-api-key";

/// The accepted keys: those given inline plus those read from files, which `reload` reads
/// again (on SIGHUP). Cloning shares the set.
#[derive(Clone)]
pub struct ApiKeys {
    inline: Arc<Vec<WeightedKey>>,
    files: Arc<Vec<PathBuf>>,
    current: Arc<RwLock<Arc<Vec<WeightedKey>>>>,
    /// Every key name read so far; reloading reuses them.
    names: Arc<Mutex<Names>>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ApiKeys")
            .field("keys", &self.count())
            .field("files", &self.files)
            .finish()
    }
}

impl ApiKeys {
    /// Keys from `inline` (weight 1) and from `files` (see `key_file`). `None` when neither
    /// names a key source.
    pub fn load(inline: &[String], files: &[PathBuf]) -> Result<Option<Self>, ApiKeyError> {
        if inline.is_empty() && files.is_empty() {
            return Ok(None);
        }
        let inline = inline
            .iter()
            .map(|key| {
                checked(key.trim(), "--api-key").map(|key| WeightedKey {
                    key,
                    weight: std::num::NonZeroU32::MIN,
                    name: None,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let keys = Self {
            inline: Arc::new(inline),
            files: Arc::new(files.to_vec()),
            current: Arc::default(),
            names: Arc::default(),
        };
        keys.reload()?;
        Ok(Some(keys))
    }

    /// Reads the key files again, their weights included; on any error the previous keys
    /// stay in force.
    pub fn reload(&self) -> Result<usize, ApiKeyError> {
        let mut keys = self.inline.as_ref().clone();
        let mut names = self
            .names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for path in self.files.iter() {
            keys.extend(read_key_file(path, &mut names)?);
        }
        drop(names);
        if keys.is_empty() {
            let paths = self
                .files
                .iter()
                .map(|path| path.display().to_string())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(ApiKeyError::Empty { paths });
        }
        let count = keys.len();
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(keys);
        Ok(count)
    }

    /// How many keys are accepted (never zero: loading or reloading to no key fails).
    pub fn count(&self) -> usize {
        self.snapshot().len()
    }

    fn snapshot(&self) -> Arc<Vec<WeightedKey>> {
        Arc::clone(
            &self
                .current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Whether `presented` equals one of the keys. Every key is compared, each in constant
    /// time, so the time taken reveals neither which key matched nor how much of one did
    /// (only whether the lengths differ).
    pub fn accepts(&self, presented: &[u8]) -> bool {
        self.tenant_of(presented).is_some()
    }

    /// The tenant `presented` names when it is accepted. Every key is compared in constant
    /// time, as in `accepts`; the weight is picked without branching on which key matched.
    fn tenant_of(&self, presented: &[u8]) -> Option<Tenant> {
        let keys = self.snapshot();
        let (matched, index) = keys.iter().zip(0u32..).fold(
            (subtle::Choice::from(0), 0u32),
            |(found, picked), (accepted, index)| {
                let equal = accepted.key.as_slice().ct_eq(presented);
                let picked =
                    subtle::ConditionallySelectable::conditional_select(&picked, &index, equal);
                (found | equal, picked)
            },
        );
        let accepted = keys.get(usize::try_from(index).ok()?)?;
        bool::from(matched).then(|| Tenant {
            key: KeyId::of(presented),
            weight: accepted.weight,
            name: accepted.name,
        })
    }

    /// Checks a request's `Authorization` header, or else its `x-api-key` header (the
    /// Anthropic clients' way of sending a key); the accepted key's id and weight.
    pub fn check(&self, request: &Request) -> Result<Tenant, AuthError> {
        let headers = request.headers();
        let key = match (headers.get(header::AUTHORIZATION), headers.get(X_API_KEY)) {
            (Some(value), _) => {
                // The scheme is case-insensitive (RFC 9110); the key is not.
                let (scheme, key) = value
                    .as_bytes()
                    .split_at_checked(7)
                    .ok_or(AuthError::Invalid)?;
                if !scheme.eq_ignore_ascii_case(b"bearer ") {
                    return Err(AuthError::Invalid);
                }
                key
            }
            (None, Some(value)) => value.as_bytes(),
            (None, None) => return Err(AuthError::Missing),
        };
        self.tenant_of(key).ok_or(AuthError::Invalid)
    }
}

/// Reads the key files again on every SIGHUP; a failed reload keeps the previous keys.
pub fn reload_api_keys_on_sighup(keys: ApiKeys) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(hangups) => hangups,
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGHUP; API keys will not be reloaded");
            return;
        }
    };
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match keys.reload() {
                Ok(count) => tracing::info!(keys = count, "API keys reloaded"),
                Err(error) => {
                    tracing::error!(%error, "API keys not reloaded; the previous ones stay")
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn keys(inline: &[&str]) -> ApiKeys {
        let inline: Vec<String> = inline.iter().map(|key| (*key).to_owned()).collect();
        ApiKeys::load(&inline, &[]).unwrap().unwrap()
    }

    #[test]
    fn only_exact_keys_are_accepted() {
        let keys = keys(&["sk-first", "sk-Second"]);
        assert!(keys.accepts(b"sk-first"));
        assert!(keys.accepts(b"sk-Second"));
        assert!(!keys.accepts(b"sk-second"), "keys are case-sensitive");
        assert!(!keys.accepts(b"sk-firs"));
        assert!(!keys.accepts(b"sk-first "));
        assert!(!keys.accepts(b""));
    }

    fn tenant(keys: &ApiKeys, authorization: &str) -> Result<Tenant, AuthError> {
        let request = Request::builder()
            .header(header::AUTHORIZATION, authorization)
            .body(axum::body::Body::empty())
            .unwrap();
        keys.check(&request)
    }

    fn key_id(keys: &ApiKeys, authorization: &str) -> Result<KeyId, AuthError> {
        tenant(keys, authorization).map(|tenant| tenant.key)
    }

    #[test]
    fn each_accepted_key_has_its_own_id_which_survives_reloads() {
        let keys = keys(&["sk-first", "sk-second"]);
        let first = key_id(&keys, "Bearer sk-first").unwrap();
        let second = key_id(&keys, "Bearer sk-second").unwrap();
        assert_ne!(first, second);
        keys.reload().unwrap();
        assert_eq!(key_id(&keys, "bearer sk-first").unwrap(), first);
        assert!(!format!("{first:?}").contains("sk-"));
        assert!(key_id(&keys, "Bearer sk-third").is_err());
    }

    #[test]
    fn no_key_source_means_no_authentication() {
        assert!(ApiKeys::load(&[], &[]).unwrap().is_none());
    }

    #[test]
    fn malformed_keys_are_refused_without_echoing_them() {
        let error = ApiKeys::load(&["two words".to_owned()], &[]).unwrap_err();
        assert!(!error.to_string().contains("two words"), "{error}");
        assert!(ApiKeys::load(&[" ".to_owned()], &[]).is_err());
    }

    #[test]
    fn key_files_hold_one_key_per_line_and_reload_keeps_old_keys_on_error() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "# comment\n\nsk-file-one\n  sk-file-two  ").unwrap();
        let keys = ApiKeys::load(&["sk-inline".to_owned()], &[file.path().to_path_buf()])
            .unwrap()
            .unwrap();
        assert_eq!(keys.count(), 3);
        assert!(keys.accepts(b"sk-file-two"));
        std::fs::write(file.path(), "sk-rotated\n").unwrap();
        assert_eq!(keys.reload().unwrap(), 2);
        assert!(keys.accepts(b"sk-rotated"));
        assert!(!keys.accepts(b"sk-file-one"), "a removed key stops working");
        assert!(keys.accepts(b"sk-inline"), "inline keys survive reloads");
        std::fs::write(file.path(), "bad key with spaces\n").unwrap();
        assert!(keys.reload().is_err());
        assert!(
            keys.accepts(b"sk-rotated"),
            "a failed reload keeps the old keys"
        );
    }

    #[test]
    fn an_empty_or_missing_key_file_is_an_error() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let error = ApiKeys::load(&[], &[file.path().to_path_buf()]).unwrap_err();
        assert!(matches!(error, ApiKeyError::Empty { .. }), "{error}");
        let missing = ApiKeys::load(&[], &[PathBuf::from("/nonexistent/keys")]).unwrap_err();
        assert!(matches!(missing, ApiKeyError::Read { .. }), "{missing}");
    }

    #[test]
    fn each_key_carries_its_file_weight_and_a_reload_reads_weights_again() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "sk-heavy weight=3\nsk-light").unwrap();
        let keys = ApiKeys::load(&["sk-inline".to_owned()], &[file.path().to_path_buf()])
            .unwrap()
            .unwrap();
        let weight = |keys: &ApiKeys, key: &str| {
            tenant(keys, &format!("Bearer {key}"))
                .map(|tenant| tenant.weight.get())
                .ok()
        };
        assert_eq!(weight(&keys, "sk-heavy"), Some(3));
        assert_eq!(weight(&keys, "sk-light"), Some(1));
        assert_eq!(weight(&keys, "sk-inline"), Some(1), "inline keys weigh 1");
        assert_eq!(weight(&keys, "sk-other"), None);
        std::fs::write(file.path(), "sk-heavy weight=5\nsk-light weight=2\n").unwrap();
        keys.reload().unwrap();
        assert_eq!(weight(&keys, "sk-heavy"), Some(5));
        assert_eq!(weight(&keys, "sk-light"), Some(2));
        std::fs::write(file.path(), "sk-heavy weight=0\n").unwrap();
        let error = keys.reload().unwrap_err();
        assert!(error.to_string().contains("line 1"), "{error}");
        assert!(!error.to_string().contains("sk-heavy"), "{error}");
        assert_eq!(
            weight(&keys, "sk-heavy"),
            Some(5),
            "a failed reload keeps the weights"
        );
    }

    #[test]
    fn a_malformed_weight_is_a_start_up_error_naming_the_file_and_line() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "# tenants\nsk-fine\nsk-secret weight=-1").unwrap();
        let error = ApiKeys::load(&[], &[file.path().to_path_buf()]).unwrap_err();
        assert!(matches!(error, ApiKeyError::Weight { .. }), "{error}");
        let message = error.to_string();
        let expected = format!("{} line 3", file.path().display());
        assert!(message.contains(&expected), "{message}");
        assert!(!message.contains("sk-secret"), "{message}");
    }
}
