//! How bytes meet HTTP: the accept loop, JSON bodies in, server-sent events out.

pub mod connections;
pub mod json;
pub mod sse;
