//! `--otlp-endpoint`: gives every inference request its span (`crate::telemetry`), under the
//! client's W3C `traceparent` when it sent a valid one, and runs the handler in its context so
//! validation and generation spans nest under it. Without the flag this layer is not installed.

use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::context::FutureExt;

use super::RequestId;
use crate::telemetry::{HttpTrace, TracedBody};

/// Runs the request inside its span; the span ends once the response body is done.
pub async fn trace_request(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| request.uri().path(), MatchedPath::as_str)
        .to_owned();
    let request_id = request
        .extensions()
        .get::<RequestId>()
        .map(|id| id.0.clone());
    let Some(trace) = HttpTrace::start(
        request.method().as_str(),
        &route,
        request.headers(),
        request_id.as_deref(),
    ) else {
        return next.run(request).await;
    };
    let response = next
        .run(request)
        .with_context(trace.context().clone())
        .await;
    trace.respond(response.status().as_u16());
    response.map(|body| Body::new(TracedBody::new(body, trace)))
}
