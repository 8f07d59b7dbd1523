//! The HTTP request's span: the root of the request's tree, or a child of the client's
//! `traceparent`. It lasts until the response body is done, so a streamed answer's span covers
//! the whole stream.

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use axum::http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};

use super::propagation::parse_traceparent;
use super::Tracing;

/// An HTTP request's span, ended when dropped.
#[derive(Debug)]
pub struct HttpTrace {
    context: Context,
}

impl HttpTrace {
    /// Starts the span of a `method` request to `route` when tracing is on, under the client's
    /// `traceparent` when `headers` carry a valid one; `request_id` is the router's id for it.
    pub fn start(
        method: &str,
        route: &str,
        headers: &HeaderMap,
        request_id: Option<&str>,
    ) -> Option<Self> {
        Some(Self::start_in(
            super::active()?,
            method,
            route,
            headers,
            request_id,
        ))
    }

    /// Starts the span with `tracing`.
    pub fn start_in(
        tracing: &Tracing,
        method: &str,
        route: &str,
        headers: &HeaderMap,
        request_id: Option<&str>,
    ) -> Self {
        let parent = match parse_traceparent(headers) {
            Some(client) => Context::new().with_remote_span_context(client),
            None => Context::new(),
        };
        let mut attributes = vec![
            KeyValue::new("http.request.method", method.to_owned()),
            KeyValue::new("http.route", route.to_owned()),
        ];
        if let Some(id) = request_id {
            attributes.push(KeyValue::new("tandem.request_id", id.to_owned()));
        }
        let span = tracing
            .tracer
            .span_builder(format!("{method} {route}"))
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&tracing.tracer, &parent);
        Self {
            context: parent.with_span(span),
        }
    }

    /// The context the request's handler runs in.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// Records the response's status; a 5xx marks the span failed.
    pub fn respond(&self, status: u16) {
        let span = self.context.span();
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 500 {
            span.set_status(Status::error(format!("HTTP {status}")));
        }
    }
}

impl Drop for HttpTrace {
    fn drop(&mut self) {
        self.context.span().end();
    }
}

/// A response body that keeps its request's span open until the body is done (or dropped).
#[derive(Debug)]
pub struct TracedBody<B> {
    inner: B,
    _trace: HttpTrace,
}

impl<B> TracedBody<B> {
    pub fn new(inner: B, trace: HttpTrace) -> Self {
        Self {
            inner,
            _trace: trace,
        }
    }
}

impl<B: Body + Unpin> Body for TracedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(context)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
