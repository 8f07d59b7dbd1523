//! Prometheus exposition: the recorder and every metric's description. `request` records
//! one request's lifecycle, `engine` the scheduler's steps, load and the server's identity.
//! docs/metrics.md lists every series.

mod engine;
mod request;

use std::time::Duration;

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

pub use engine::{
    record_info, record_load, record_step_done, record_step_planned, record_step_scheduling,
};
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
    engine::register_event_counters();
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
pub fn detached_handle() -> PrometheusHandle {
    PrometheusBuilder::new().build_recorder().handle()
}

fn describe() {
    describe_requests();
    describe_request_latency();
    describe_scheduler();
    describe_kv_cache();
    describe_gauge!(
        "tandem_info",
        "Always 1; the labels describe the served model and the limits"
    );
    describe_counter!(
        "tandem_health_deep_probes_total",
        "Deep health probes run on the shards (concurrent /health?deep=true callers share one)"
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

/// The scheduler emits these; their descriptions live here with the rest.
fn describe_scheduler() {
    describe_gauge!("tandem_queue_size", "Requests waiting to be scheduled");
    describe_gauge!(
        "tandem_queue_tokens",
        "Prompt tokens the waiting requests still need to compute"
    );
    describe_gauge!("tandem_running_requests", "Requests being generated");
    describe_counter!(
        "tandem_preemptions_total",
        "Requests preempted for lack of KV blocks"
    );
    describe_counter!(
        "tandem_cancelled_requests_total",
        "Requests the scheduler dropped because their client went away"
    );
    describe_counter!(
        "tandem_shard_recoveries_total",
        "Times the scheduler waited for restarted shards"
    );
    describe_counter!(
        "tandem_request_step_failures_total",
        "Requests the shards ended on their own while the rest of their step went on, by reason"
    );
    describe_histogram!("tandem_batch_size", "Requests per step");
    describe_histogram!("tandem_batch_tokens", "Tokens per step");
    describe_histogram!(
        "tandem_step_duration_seconds",
        Unit::Seconds,
        "Duration of one step across all shards, as the router sees it"
    );
    describe_step_parts();
}

/// The parts of one step, so overhead can be told apart from the forward pass.
fn describe_step_parts() {
    let seconds = [
        (
            "tandem_step_scheduling_duration_seconds",
            "Router time per step planning it and applying its results",
        ),
        (
            "tandem_step_shard_duration_seconds",
            "Rank 0's whole handling of one step, request decoded to response built",
        ),
        (
            "tandem_step_prepare_duration_seconds",
            "Rank 0's time applying one step to request state and building its input tensors",
        ),
        (
            "tandem_step_forward_duration_seconds",
            "Forward-pass time (model only) of one step as rank 0 reports it",
        ),
        (
            "tandem_step_sampling_duration_seconds",
            "Sampling time of one step as rank 0 reports it",
        ),
    ];
    for (name, help) in seconds {
        describe_histogram!(name, Unit::Seconds, help);
    }
}

fn describe_kv_cache() {
    describe_gauge!("tandem_kv_blocks_used", "KV cache blocks in use");
    describe_gauge!("tandem_kv_blocks_total", "KV cache blocks in the pool");
    describe_gauge!(
        "tandem_kv_cache_usage_ratio",
        "Fraction of KV cache blocks in use (0 to 1)"
    );
    describe_counter!(
        "tandem_prefix_cache_queries_tokens_total",
        "Prompt tokens looked up in the prefix cache"
    );
    describe_counter!(
        "tandem_prefix_cache_hits_tokens_total",
        "Prompt tokens found in the prefix cache"
    );
    describe_counter!(
        "tandem_prefix_cache_evictions_total",
        "Idle cached blocks evicted (least recently used first) to make room"
    );
    describe_gauge!(
        "tandem_prefix_cache_blocks",
        "KV blocks caching a prompt prefix, held or idle (idle ones are reclaimable)"
    );
}

#[allow(clippy::cast_precision_loss)]
fn as_f64(count: usize) -> f64 {
    count as f64
}
