//! The cluster secret: sent to every rank as `authorization: Bearer <secret>`; shards on
//! other nodes refuse calls without it.

use std::path::Path;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;

use super::error::ShardError;

/// Adds the bearer header to every call when a secret is configured.
#[derive(Clone, Default)]
pub struct ClusterAuth {
    bearer: Option<MetadataValue<Ascii>>,
}

impl std::fmt::Debug for ClusterAuth {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = if self.bearer.is_some() { "set" } else { "none" };
        formatter
            .debug_struct("ClusterAuth")
            .field("secret", &shown)
            .finish()
    }
}

impl ClusterAuth {
    /// Reads the secret from `path` (surrounding whitespace removed); no path: no header.
    pub fn from_file(path: Option<&Path>) -> Result<Self, ShardError> {
        let Some(path) = path else {
            return Ok(Self::default());
        };
        let refuse = |message: String| ShardError::ClusterSecret {
            path: path.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|error| refuse(error.to_string()))?;
        let secret = text.trim();
        if secret.is_empty() {
            return Err(refuse("the file is empty".to_owned()));
        }
        let bearer = format!("Bearer {secret}")
            .parse()
            .map_err(|_| refuse("the secret must be printable ASCII".to_owned()))?;
        Ok(Self {
            bearer: Some(bearer),
        })
    }
}

impl Interceptor for ClusterAuth {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(bearer) = &self.bearer {
            request
                .metadata_mut()
                .insert("authorization", bearer.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_of(auth: &mut ClusterAuth) -> Option<String> {
        let request = auth.call(tonic::Request::new(())).unwrap();
        request
            .metadata()
            .get("authorization")
            .map(|value| value.to_str().unwrap().to_owned())
    }

    #[test]
    fn the_secret_file_becomes_a_bearer_header_and_never_shows_in_debug() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "  s3cret-value\n").unwrap();
        let mut auth = ClusterAuth::from_file(Some(&path)).unwrap();
        assert_eq!(header_of(&mut auth).as_deref(), Some("Bearer s3cret-value"));
        assert!(!format!("{auth:?}").contains("s3cret"));
        assert_eq!(header_of(&mut ClusterAuth::default()), None);
    }

    #[test]
    fn an_empty_or_missing_secret_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let error = ClusterAuth::from_file(Some(&empty)).unwrap_err();
        assert!(error.to_string().contains("the file is empty"), "{error}");
        let missing = dir.path().join("missing");
        assert!(ClusterAuth::from_file(Some(&missing)).is_err());
    }
}
