//! How bytes meet HTTP: the accept loop, JSON bodies in, server-sent events out, and the one
//! streaming driver every API surface renders its events through.

pub mod connections;
pub mod json;
pub mod sse;
pub mod streaming;
