//! Steps: one Step carries many requests, so a traced forward pass is a `step` span of its own
//! (a root, in a trace of its own) with one link to the `generation` span of each sampled
//! request it runs. Its context travels to the shards as `traceparent`; their spans are its
//! children. A step that runs no sampled request makes no span and sends no `traceparent`.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use opentelemetry::trace::{Link, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};

use super::{count, Tracing};

/// The sampled requests the scheduler holds, by scheduler request id: what steps link to.
#[derive(Debug, Default)]
pub struct StepRegistry {
    requests: Mutex<HashMap<u64, SpanContext>>,
}

impl StepRegistry {
    fn with<T>(&self, work: impl FnOnce(&mut HashMap<u64, SpanContext>) -> T) -> T {
        // The map stays consistent whatever panicked while holding it.
        let mut requests = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        work(&mut requests)
    }

    pub(super) fn insert(&self, id: u64, span: SpanContext) {
        self.with(|requests| requests.insert(id, span));
    }

    pub(super) fn remove(&self, id: u64) {
        self.with(|requests| requests.remove(&id));
    }

    /// One link per registered request among `ids`, each naming the request's id.
    fn links(&self, ids: impl Iterator<Item = u64>) -> Vec<Link> {
        self.with(|requests| {
            ids.filter_map(|id| {
                let span = requests.get(&id)?.clone();
                Some(Link::new(
                    span,
                    vec![KeyValue::new("tandem.request.id", count(id))],
                    0,
                ))
            })
            .collect()
        })
    }

    /// How many requests are registered.
    pub fn len(&self) -> usize {
        self.with(|requests| requests.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a step carries, for its span's attributes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepShape {
    pub step_id: u64,
    /// Requests the step runs.
    pub requests: usize,
    /// Requests the shards meet for the first time.
    pub new_requests: usize,
    /// Tokens the step computes (prompt chunks, decode tokens and drafts' spans).
    pub tokens: usize,
}

/// A traced step's span, ended when dropped.
#[derive(Debug)]
pub struct StepTrace {
    context: Context,
}

impl Tracing {
    /// The registry of the requests steps link to.
    pub fn steps(&self) -> &StepRegistry {
        &self.steps
    }

    /// Starts the `step` span of a step running the requests `ids`, when one of them is
    /// sampled; `None` otherwise.
    pub fn start_step(
        &self,
        shape: StepShape,
        ids: impl Iterator<Item = u64>,
    ) -> Option<StepTrace> {
        let links = self.steps.links(ids);
        if links.is_empty() {
            return None;
        }
        let span = self
            .tracer
            .span_builder("step")
            .with_kind(SpanKind::Client)
            .with_links(links)
            .with_attributes([
                KeyValue::new("tandem.step.id", count(shape.step_id)),
                KeyValue::new("tandem.step.requests", count(shape.requests)),
                KeyValue::new("tandem.step.new_requests", count(shape.new_requests)),
                KeyValue::new("tandem.step.tokens", count(shape.tokens)),
            ])
            .start_with_context(&self.tracer, &Context::new());
        Some(StepTrace {
            context: Context::new().with_span(span),
        })
    }
}

impl StepTrace {
    /// The context the shards' calls run in: it carries the step's `traceparent`.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// Marks the step failed.
    pub fn fail(&self, message: String) {
        self.context.span().set_status(Status::error(message));
    }
}

impl Drop for StepTrace {
    fn drop(&mut self) {
        self.context.span().end();
    }
}
