//! Request tracing with OpenTelemetry (docs/tracing.md), off unless `--otlp-endpoint` is set.
//!
//! One span tree per request, in the client's trace when it sent a W3C `traceparent`: the HTTP
//! request (`http.rs`), its `validation`, and per choice a `generation` with its `queue`,
//! `prefill` and `decode` (`generation.rs`). Each forward pass is a `step` span of its own
//! trace, linked to the `generation` of every sampled request it runs (`steps.rs`); its context
//! travels to the shards as `traceparent` gRPC metadata, and their `forward` spans are its
//! children. Spans leave through the SDK's batch processor over OTLP/HTTP (protobuf).
//!
//! Off, nothing is installed: `active()` is `None`, every entry point returns at once and no
//! span is made. This module imports none of the router's own.

mod args;
mod generation;
mod http;
mod propagation;
mod sampler;
mod steps;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

pub use args::{traces_url, OtlpArgs};
pub use generation::{traced_validation, GenerationTrace, RequestTrace};
pub use http::{HttpTrace, TracedBody};
pub use propagation::{current_traceparent, parse_traceparent, TRACEPARENT};
pub use sampler::LinkedSampler;
pub use steps::{StepRegistry, StepShape, StepTrace};

/// The instrumentation scope of every span the router makes.
const SCOPE: &str = "tandem-router";
/// The most requests one `step` span links (the SDK keeps 128 by default).
const MAX_LINKS_PER_STEP: u32 = 1024;

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot set up the OTLP exporter for {endpoint}: {source}")]
    Exporter {
        endpoint: String,
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// What every traced part of the router shares: the tracer and the registry of the requests
/// that steps link to.
#[derive(Debug)]
pub struct Tracing {
    tracer: SdkTracer,
    steps: StepRegistry,
}

impl Tracing {
    fn new(tracer: SdkTracer) -> Self {
        Self {
            tracer,
            steps: StepRegistry::default(),
        }
    }
}

/// A count or id as an integer attribute (OTLP's are signed), saturating.
fn count(value: impl TryInto<i64>) -> i64 {
    value.try_into().unwrap_or(i64::MAX)
}

static ACTIVE: OnceLock<Tracing> = OnceLock::new();

/// The process's tracing, once `init` started it; `None` (tracing off) everywhere else.
pub fn active() -> Option<&'static Tracing> {
    ACTIVE.get()
}

/// Keeps the exporter running; dropping it flushes the spans still queued and stops it.
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: SdkTracerProvider,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "could not flush the last spans");
        }
    }
}

/// Starts exporting spans when `args` names an endpoint; `None` (and nothing started) when not.
/// Call it once, before the async runtime starts: the exporter's HTTP client blocks, on the
/// batch processor's own thread.
pub fn init(args: &OtlpArgs) -> Result<Option<TelemetryGuard>, TelemetryError> {
    let Some(endpoint) = args.otlp_endpoint.as_deref() else {
        return Ok(None);
    };
    let url = traces_url(endpoint);
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url.clone())
        .build()
        .map_err(|source| TelemetryError::Exporter {
            endpoint: url.clone(),
            source,
        })?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(LinkedSampler::new(args.otlp_sample_ratio))
        .with_max_links_per_span(MAX_LINKS_PER_STEP)
        .with_resource(
            Resource::builder()
                .with_service_name(args.otlp_service_name.clone())
                .build(),
        )
        .build();
    if ACTIVE.set(Tracing::new(provider.tracer(SCOPE))).is_err() {
        tracing::warn!("tracing was already started in this process; keeping the first exporter");
    }
    tracing::info!(
        endpoint = %url,
        sample_ratio = args.otlp_sample_ratio,
        service_name = %args.otlp_service_name,
        "exporting request traces over OTLP/HTTP"
    );
    Ok(Some(TelemetryGuard { provider }))
}
