//! W3C Trace Context in and out: a client's `traceparent` header becomes the parent of its
//! request's span, and a traced step's context goes to the shards as `traceparent` gRPC
//! metadata. A missing or malformed header is ignored, never refused: the request is traced (or
//! not) as if it had sent none, as TGI and vLLM do.

use axum::http::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::metadata::{Ascii, MetadataValue};

/// The header (and gRPC metadata key) of the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        // A header given twice is ambiguous; like a malformed one, it is ignored.
        let mut values = self.0.get_all(key).iter();
        match (values.next(), values.next()) {
            (Some(value), None) => value.to_str().ok(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|key| key.as_str()).collect()
    }
}

/// Whether `value` has the W3C shape: `version-traceid-parentid-flags` in lowercase hex of 2,
/// 32, 16 and 2 digits, a version other than `ff`, and nothing more in version `00`.
fn well_formed(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |part: &str, digits: usize| {
        part.len() == digits
            && part
                .bytes()
                .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
    };
    let shape = [2, 32, 16, 2];
    parts.len() >= shape.len()
        && parts
            .iter()
            .zip(shape)
            .all(|(part, digits)| hex(part, digits))
        && parts[0] != "ff"
        && (parts[0] != "00" || parts.len() == shape.len())
}

/// The client's span context from `traceparent` (and `tracestate`); `None` when the header is
/// missing, repeated or malformed.
pub fn parse_traceparent(headers: &HeaderMap) -> Option<SpanContext> {
    let extractor = Headers(headers);
    if !well_formed(extractor.get(TRACEPARENT)?) {
        return None;
    }
    let context = TraceContextPropagator::new().extract(&extractor);
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then_some(span_context)
}

#[derive(Default)]
struct Traceparent(Option<String>);

impl Injector for Traceparent {
    fn set(&mut self, key: &str, value: String) {
        if key == TRACEPARENT {
            self.0 = Some(value);
        }
    }
}

/// The `traceparent` of the current context's span when tracing is on and that span is
/// sampled (a traced step); `None` otherwise, at the cost of one check when tracing is off.
pub fn current_traceparent() -> Option<MetadataValue<Ascii>> {
    super::active()?;
    traceparent_of(&Context::current())
}

/// `context`'s span as a `traceparent` value, when it is valid and sampled.
pub(super) fn traceparent_of(context: &Context) -> Option<MetadataValue<Ascii>> {
    let span = context.span();
    if !span.span_context().is_sampled() {
        return None;
    }
    let mut traceparent = Traceparent::default();
    TraceContextPropagator::new().inject_context(context, &mut traceparent);
    traceparent.0?.parse().ok()
}
