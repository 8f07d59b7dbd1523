//! Prometheus exposition: the recorder, and the description of the series recorded outside
//! the scheduler (which describes its own). `request` records one request's lifecycle.
//! docs/metrics.md lists every series.

mod request;

use std::time::Duration;

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

pub use request::RequestMetrics;

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
const COUNT_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
    16384.0, 32768.0,
];
/// Histograms of counts (tokens, requests) rather than seconds.
const COUNT_HISTOGRAMS: &[&str] = &[
    "tandem_request_input_tokens",
    "tandem_request_images",
    "tandem_request_generated_tokens",
    "tandem_batch_size",
    "tandem_batch_tokens",
];
/// How often idle histogram buckets are compacted.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// A recorder with real Prometheus histograms (not summaries) for every histogram we emit.
fn builder() -> Result<PrometheusBuilder, BuildError> {
    let mut builder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), LATENCY_BUCKETS)?;
    for name in COUNT_HISTOGRAMS {
        builder =
            builder.set_buckets_for_metric(Matcher::Full((*name).to_owned()), COUNT_BUCKETS)?;
    }
    Ok(builder)
}

/// Installs the process-wide recorder, describes every metric and starts its upkeep task.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let handle = builder()?.install_recorder()?;
    describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(UPKEEP_INTERVAL);
        loop {
            ticks.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// A handle to a recorder that is not installed: renders nothing, for tests.
#[cfg(test)]
pub fn detached_handle() -> PrometheusHandle {
    PrometheusBuilder::new().build_recorder().handle()
}

fn describe() {
    describe_requests();
    describe_keys();
    describe_request_latency();
    describe_gauge!(
        "tandem_info",
        "Always 1; the labels describe the served model and the limits"
    );
    describe_counter!(
        "tandem_health_deep_probes_total",
        "Deep health probes run on the shards (concurrent /health?deep=true callers share one)"
    );
}

fn describe_keys() {
    describe_counter!(
        "tandem_key_requests_total",
        "Generation requests received, by API key name (`name=` in the key file; `unnamed` otherwise)"
    );
    describe_counter!(
        "tandem_key_prompt_tokens_total",
        "Prompt tokens of admitted requests, by API key name"
    );
    describe_counter!(
        "tandem_key_generated_tokens_total",
        "Tokens generated and delivered, by API key name"
    );
    describe_histogram!(
        "tandem_key_queue_duration_seconds",
        "Time from arrival to the scheduler's first admission, by API key name"
    );
}

fn describe_requests() {
    describe_counter!(
        "tandem_requests_total",
        "Generation requests received, by route"
    );
    describe_counter!(
        "tandem_request_success_total",
        "Generation requests that completed, by route and finish reason"
    );
    describe_counter!(
        "tandem_request_failure_total",
        "Generation requests that failed, by route and reason"
    );
    describe_counter!(
        "tandem_prompt_tokens_total",
        "Prompt tokens of admitted requests"
    );
    describe_counter!(
        "tandem_generated_tokens_total",
        "Tokens generated and delivered"
    );
    describe_histogram!(
        "tandem_request_input_tokens",
        "Prompt tokens per admitted request"
    );
    describe_histogram!(
        "tandem_request_images",
        "Images per admitted request (0 for text-only prompts)"
    );
    describe_histogram!(
        "tandem_request_generated_tokens",
        "Tokens generated per completed request"
    );
}

fn describe_request_latency() {
    let seconds = [
        (
            "tandem_request_duration_seconds",
            "End-to-end latency of completed requests, from arrival",
        ),
        (
            "tandem_time_to_first_token_seconds",
            "Time from arrival to the first generated token",
        ),
        (
            "tandem_inter_token_latency_seconds",
            "Time between consecutive tokens of one request, one sample per token",
        ),
        (
            "tandem_time_per_output_token_seconds",
            "Per completed request: (last token - first token) / (tokens - 1)",
        ),
        (
            "tandem_request_queue_duration_seconds",
            "Time from submission to the scheduler's first admission",
        ),
        (
            "tandem_request_prefill_duration_seconds",
            "Time from admission to the first token",
        ),
        (
            "tandem_request_decode_duration_seconds",
            "Time from the first token to the last one",
        ),
    ];
    for (name, help) in seconds {
        describe_histogram!(name, Unit::Seconds, help);
    }
}

#[allow(clippy::cast_precision_loss)]
fn as_f64(count: usize) -> f64 {
    count as f64
}
