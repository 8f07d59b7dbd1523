//! A tracer whose spans are kept in memory, for tests.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};

use super::{LinkedSampler, Tracing};

/// Every span ended so far.
#[derive(Debug, Clone, Default)]
pub struct Collected(Arc<Mutex<Vec<SpanData>>>);

impl Collected {
    pub fn spans(&self) -> Vec<SpanData> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The one ended span named `name`.
    pub fn named(&self, name: &str) -> SpanData {
        let mut found: Vec<SpanData> = self
            .spans()
            .into_iter()
            .filter(|span| span.name == name)
            .collect();
        assert_eq!(found.len(), 1, "spans named {name}: {found:?}");
        found.remove(0)
    }
}

impl SpanExporter for Collected {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(batch);
        std::future::ready(Ok(()))
    }
}

/// A tracing of its own (never the process's), sampling `ratio` of root spans, and its spans.
pub fn tracing(ratio: f64) -> (&'static Tracing, Collected) {
    let collected = Collected::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(collected.clone())
        .with_sampler(LinkedSampler::new(ratio))
        .build();
    let tracing = Box::leak(Box::new(Tracing::new(provider.tracer(super::SCOPE))));
    // The tracer keeps exporting only while its provider lives: as long as the test process.
    Box::leak(Box::new(provider));
    (tracing, collected)
}
