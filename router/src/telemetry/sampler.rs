//! Which spans are sampled: a span with a parent follows it (a client's `traceparent`
//! included); a root span is sampled at `--otlp-sample-ratio`, except a root span with links
//! (a `step`), which is sampled exactly when one of the spans it links to is, so every sampled
//! request keeps its steps and the shards' spans under them.

use opentelemetry::trace::{Link, SpanKind, TraceContextExt, TraceId};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{Sampler, SamplingDecision, SamplingResult, ShouldSample};

/// Parent-based ratio sampling, with root spans that carry links decided by their links.
#[derive(Debug, Clone)]
pub struct LinkedSampler {
    parent_based: Sampler,
}

impl LinkedSampler {
    /// Samples `ratio` (0 to 1) of the root spans without links.
    pub fn new(ratio: f64) -> Self {
        Self {
            parent_based: Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio))),
        }
    }
}

impl ShouldSample for LinkedSampler {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        span_kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        let has_parent = parent_context.is_some_and(|parent| parent.has_active_span());
        if has_parent || links.is_empty() {
            return self.parent_based.should_sample(
                parent_context,
                trace_id,
                name,
                span_kind,
                attributes,
                links,
            );
        }
        let linked = links.iter().any(|link| link.span_context.is_sampled());
        SamplingResult {
            decision: if linked {
                SamplingDecision::RecordAndSample
            } else {
                SamplingDecision::Drop
            },
            attributes: Vec::new(),
            trace_state: Default::default(),
        }
    }
}
