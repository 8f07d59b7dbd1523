//! Middleware and what it reads: API keys and the callers they name, the draining flag and the
//! refusal of inference requests while not serving, request body logging, request traces, the
//! launch id on `/health`.

pub mod api_keys;
pub mod auth;
pub mod caller;
pub mod draining;
mod key_file;
pub mod launch_identity;
pub mod request_log;
pub mod serving;
pub mod trace_context;

/// The request's id (`x-request-id`), in its extensions for the layers inside the request span.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);
