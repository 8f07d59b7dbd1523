//! The caller of a request, as the API key middleware (`auth`) accepted it.

use std::convert::Infallible;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use crate::tenant::{KeyId, Tenant};

/// Who sent a request: the API key it was accepted with, as its id and weight; `None` when no
/// keys are configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller(pub Option<Tenant>);

impl Caller {
    /// The id of the caller's key.
    pub fn key(self) -> Option<KeyId> {
        self.0.map(|tenant| tenant.key)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(parts.extensions.get::<Tenant>().copied()))
    }
}
