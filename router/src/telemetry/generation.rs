//! A request's own spans below its HTTP span: `validation`, then per choice a `generation`
//! whose children are the stages it went through: `queue` (submitted until the scheduler
//! admitted it), `prefill` (admitted until its first token) and `decode` (first token until the
//! last). The stages are recorded with their exact times as the tokens arrive.

use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, Span};

use super::steps::StepRegistry;
use super::{count, Tracing};

/// The current context (the HTTP request's span), when tracing is on and it is sampled.
fn sampled_parent() -> Option<(&'static Tracing, Context)> {
    let tracing = super::active()?;
    let parent = Context::current();
    parent
        .span()
        .span_context()
        .is_sampled()
        .then_some((tracing, parent))
}

/// Runs `validation` inside a `validation` span when the request is traced; marks the span
/// failed with the error's message.
pub async fn traced_validation<T, E: Display>(
    validation: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let Some((tracing, parent)) = sampled_parent() else {
        return validation.await;
    };
    let mut span = tracing
        .tracer
        .span_builder("validation")
        .with_kind(SpanKind::Internal)
        .start_with_context(&tracing.tracer, &parent);
    let outcome = validation.await;
    if let Err(error) = &outcome {
        span.set_status(Status::error(error.to_string()));
    }
    span.end();
    outcome
}

/// A traced request as the scheduler carries it: registered under its scheduler id once it has
/// one, so steps running it link to its `generation` span; forgotten when the last copy drops.
#[derive(Clone)]
pub struct RequestTrace(Arc<Binding>);

struct Binding {
    span: SpanContext,
    registry: &'static StepRegistry,
    id: Mutex<Option<u64>>,
}

impl RequestTrace {
    /// Registers the request under the scheduler's `id` (again under a new id, if it changes).
    pub fn bind(&self, id: u64) {
        let mut bound = self.0.id.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(previous) = bound.replace(id).filter(|previous| *previous != id) {
            self.0.registry.remove(previous);
        }
        self.0.registry.insert(id, self.0.span.clone());
    }

    /// The id of the `generation` span steps link to.
    pub fn span_id(&self) -> opentelemetry::trace::SpanId {
        self.0.span.span_id()
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        let id = *self.id.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = id {
            self.registry.remove(id);
        }
    }
}

impl std::fmt::Debug for RequestTrace {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "RequestTrace({})", self.0.span.trace_id())
    }
}

/// One generation's spans; empty (and free) when the request is not traced. Dropped before
/// `succeed` or `fail`, it records the generation as cancelled.
#[derive(Debug, Default)]
pub struct GenerationTrace(Option<Box<Spans>>);

#[derive(Debug)]
struct Spans {
    tracer: &'static SdkTracer,
    /// The `generation` span, parent of the stages.
    generation: Context,
    request: RequestTrace,
    submitted: SystemTime,
    first_token: Option<SystemTime>,
    decode: Option<Span>,
    tokens: usize,
    finish: Option<&'static str>,
}

/// When `instant` was, on the wall clock.
fn wall_time(instant: Instant) -> SystemTime {
    SystemTime::now()
        .checked_sub(instant.elapsed())
        .unwrap_or_else(SystemTime::now)
}

impl GenerationTrace {
    /// Starts the `generation` span of choice `choice` (of a prompt of `input_tokens`) under the
    /// current context's span, when tracing is on and that span is sampled.
    pub fn start(choice: usize, input_tokens: usize) -> Self {
        match sampled_parent() {
            Some((tracing, parent)) => Self::start_in(tracing, &parent, choice, input_tokens),
            None => Self(None),
        }
    }

    /// Starts the `generation` span under `parent`'s span with `tracing`, when that span is
    /// sampled.
    pub fn start_in(
        tracing: &'static Tracing,
        parent: &Context,
        choice: usize,
        input_tokens: usize,
    ) -> Self {
        if !parent.span().span_context().is_sampled() {
            return Self(None);
        }
        let span = tracing
            .tracer
            .span_builder("generation")
            .with_kind(SpanKind::Internal)
            .with_attributes([
                KeyValue::new("tandem.choice", count(choice)),
                KeyValue::new("gen_ai.usage.input_tokens", count(input_tokens)),
            ])
            .start_with_context(&tracing.tracer, parent);
        let request = RequestTrace(Arc::new(Binding {
            span: span.span_context().clone(),
            registry: tracing.steps(),
            id: Mutex::new(None),
        }));
        Self(Some(Box::new(Spans {
            tracer: &tracing.tracer,
            generation: parent.with_span(span),
            request,
            submitted: SystemTime::now(),
            first_token: None,
            decode: None,
            tokens: 0,
            finish: None,
        })))
    }

    /// What the scheduler carries for steps to link to; `None` when not traced.
    pub fn request_trace(&self) -> Option<RequestTrace> {
        self.0.as_ref().map(|spans| spans.request.clone())
    }

    /// Records one delivered token; `admitted` is when the scheduler first admitted the request,
    /// `finish` is set on the last token.
    pub fn token(&mut self, admitted: Option<Instant>, finish: Option<&'static str>) {
        let Some(spans) = self.0.as_deref_mut() else {
            return;
        };
        spans.tokens += 1;
        spans.finish = finish.or(spans.finish);
        if spans.first_token.is_none() {
            let now = SystemTime::now();
            let admitted = admitted.map_or(now, wall_time);
            spans
                .stage("queue", spans.submitted)
                .end_with_timestamp(admitted);
            spans.stage("prefill", admitted).end_with_timestamp(now);
            spans.first_token = Some(now);
            if finish.is_none() {
                spans.decode = Some(spans.stage("decode", now));
            }
        } else if finish.is_some() {
            spans.end_decode(None);
        }
    }

    /// Records the generation as complete.
    pub fn succeed(&mut self) {
        if let Some(mut spans) = self.0.take() {
            spans.end_decode(None);
            spans.end(None);
        }
    }

    /// Records the generation as failed for `reason`.
    pub fn fail(&mut self, reason: &str) {
        if let Some(mut spans) = self.0.take() {
            if spans.first_token.is_none() {
                let mut queue = spans.stage("queue", spans.submitted);
                queue.set_status(Status::error(reason.to_owned()));
                queue.end();
            }
            spans.end_decode(Some(reason));
            spans.end(Some(reason));
        }
    }
}

impl Drop for GenerationTrace {
    fn drop(&mut self) {
        self.fail("cancelled");
    }
}

impl Spans {
    /// A child of the `generation` span named `name`, started at `start`.
    fn stage(&self, name: &'static str, start: SystemTime) -> Span {
        self.tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .start_with_context(self.tracer, &self.generation)
    }

    fn end_decode(&mut self, error: Option<&str>) {
        if let Some(mut decode) = self.decode.take() {
            decode.set_attribute(KeyValue::new(
                "tandem.decode.tokens",
                count(self.tokens.saturating_sub(1)),
            ));
            if let Some(error) = error {
                decode.set_status(Status::error(error.to_owned()));
            }
            decode.end();
        }
    }

    fn end(&mut self, error: Option<&str>) {
        let span = self.generation.span();
        span.set_attribute(KeyValue::new(
            "gen_ai.usage.output_tokens",
            count(self.tokens),
        ));
        if let Some(finish) = self.finish {
            span.set_attribute(KeyValue::new("tandem.finish_reason", finish));
        }
        if let Some(error) = error {
            span.set_status(Status::error(error.to_owned()));
        }
        span.end();
    }
}
