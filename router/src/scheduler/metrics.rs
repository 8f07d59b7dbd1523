//! The scheduler's own series, recorded where they are measured: step sizes and timings, the
//! load gauges, and the event counters its bookkeeping (and the KV cache it owns) bumps.
//! docs/metrics.md lists every series.

use std::time::Duration;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
};

use super::config::SchedulerConfig;
use super::drafting::DraftMethod;
use super::in_flight::StepTimings;
use super::load::LoadSnapshot;
use crate::shard::ShardTimings;

/// Describes every series the scheduler emits and registers its event counters at 0, so
/// rates and alerts have a series before the first event.
pub(super) fn describe() {
    super::lora_metrics::describe();
    describe_load();
    describe_steps();
    describe_step_parts();
    describe_kv_cache();
    crate::kv::describe_offload_metrics();
    for name in [
        "tandem_prefix_cache_queries_tokens_total",
        "tandem_prefix_cache_hits_tokens_total",
        "tandem_prefix_cache_evictions_total",
        "tandem_prefix_cache_uncheckpointed_tokens_total",
        "tandem_preemptions_total",
        "tandem_cancelled_requests_total",
        "tandem_shard_recoveries_total",
    ] {
        counter!(name).absolute(0);
    }
    describe_speculation();
}

/// Records one drafted span's answer: `proposed` drafts by `method`, `kept` of them kept by the
/// shards.
pub(super) fn record_drafts(method: DraftMethod, proposed: usize, kept: usize) {
    counter!("tandem_speculative_draft_tokens_total", "method" => method.label())
        .increment(proposed as u64);
    counter!("tandem_speculative_accepted_tokens_total", "method" => method.label())
        .increment(kept as u64);
    histogram!("tandem_speculative_accepted_length").record(as_f64(kept));
}

fn describe_speculation() {
    for name in [
        "tandem_speculative_draft_tokens_total",
        "tandem_speculative_accepted_tokens_total",
    ] {
        for method in DraftMethod::ALL {
            counter!(name, "method" => method.label()).absolute(0);
        }
    }
    describe_counter!(
        "tandem_speculative_draft_tokens_total",
        "Draft tokens proposed for speculative decoding, by method"
    );
    describe_counter!(
        "tandem_speculative_accepted_tokens_total",
        "Draft tokens the shards kept (each one a token generated without a step of its own), by method"
    );
    describe_histogram!(
        "tandem_speculative_accepted_length",
        "Drafts kept per drafted decode step"
    );
}

/// Records a step that succeeded, before its answer reaches any request: its size, its round
/// trip and the timings rank 0 reported. A step still in flight is in none of these series, so
/// they count the same steps whenever they are scraped.
pub(super) fn record_step_done(step: &StepTimings, timings: &ShardTimings) {
    histogram!("tandem_batch_size").record(as_f64(step.requests));
    histogram!("tandem_batch_tokens").record(as_f64(step.tokens));
    histogram!("tandem_step_duration_seconds").record(step.round_trip);
    for (name, millis) in [
        ("tandem_step_prepare_duration_seconds", timings.prepare_ms),
        ("tandem_step_forward_duration_seconds", timings.forward_ms),
        ("tandem_step_sampling_duration_seconds", timings.sampling_ms),
        ("tandem_step_shard_duration_seconds", timings.total_ms),
    ] {
        histogram!(name).record(f64::from(millis) / 1000.0);
    }
}

/// Records how long rank 0's model sat idle before a step that was sent while the loop had work.
pub(super) fn record_forward_gap(millis: f32) {
    if millis > 0.0 {
        histogram!("tandem_step_forward_gap_seconds").record(f64::from(millis) / 1000.0);
    }
}

/// Records the router's own work for one step: planning it and applying its results.
pub(super) fn record_step_scheduling(elapsed: Duration) {
    histogram!("tandem_step_scheduling_duration_seconds").record(elapsed);
}

/// Publishes the scheduler's load as gauges.
pub(super) fn record_load(load: &LoadSnapshot) {
    gauge!("tandem_queue_size").set(as_f64(load.queued_requests));
    gauge!("tandem_queue_tokens").set(as_f64(load.queued_tokens));
    gauge!("tandem_running_requests").set(as_f64(load.running_requests));
    // A count only: keys are secrets, so no key or hash of one is ever a label.
    gauge!("tandem_scheduling_tenants").set(as_f64(load.tenants));
    gauge!("tandem_kv_blocks_used").set(as_f64(load.kv_blocks_used));
    gauge!("tandem_kv_blocks_total").set(as_f64(load.kv_blocks_total));
    gauge!("tandem_prefix_cache_blocks").set(as_f64(load.kv_blocks_cached));
    gauge!("tandem_state_checkpoints_cached").set(as_f64(load.state_checkpoints_cached));
    gauge!("tandem_state_checkpoints_total").set(as_f64(load.state_checkpoints_total));
    let usage = if load.kv_blocks_total == 0 {
        0.0
    } else {
        as_f64(load.kv_blocks_used) / as_f64(load.kv_blocks_total)
    };
    gauge!("tandem_kv_cache_usage_ratio").set(usage);
    if let Some(compilation) = load.compilation {
        gauge!("tandem_compiled_decode_rows").set(f64::from(compilation.decode_rows));
        gauge!("tandem_compiling").set(if compilation.compiling { 1.0 } else { 0.0 });
    }
    record_model_server_load(load, usage);
}

/// The same load under the names the Gateway API Inference Extension's endpoint picker
/// scrapes by default (vLLM's; see docs/metrics.md).
fn record_model_server_load(load: &LoadSnapshot, usage: f64) {
    gauge!("vllm:num_requests_waiting").set(as_f64(load.queued_requests));
    gauge!("vllm:num_requests_running").set(as_f64(load.running_requests));
    gauge!("vllm:kv_cache_usage_perc").set(usage);
    gauge!("vllm:gpu_cache_usage_perc").set(usage);
}

/// Publishes the KV cache's shape as `vllm:cache_config_info` (always 1, facts in labels);
/// a previous shape's series drops to 0 so exactly one series reads 1.
pub(super) fn record_cache_config(config: &SchedulerConfig, previous_num_blocks: Option<usize>) {
    if let Some(previous) = previous_num_blocks.filter(|&blocks| blocks != config.num_blocks) {
        gauge!(
            "vllm:cache_config_info",
            &cache_config_labels(config, previous)
        )
        .set(0.0);
    }
    gauge!(
        "vllm:cache_config_info",
        &cache_config_labels(config, config.num_blocks)
    )
    .set(1.0);
}

fn cache_config_labels(config: &SchedulerConfig, num_blocks: usize) -> [(&'static str, String); 3] {
    [
        ("block_size", config.block_size.to_string()),
        ("num_gpu_blocks", num_blocks.to_string()),
        ("enable_prefix_caching", config.prefix_caching.to_string()),
    ]
}

#[allow(clippy::cast_precision_loss)]
fn as_f64(count: usize) -> f64 {
    count as f64
}

fn describe_load() {
    describe_model_server_protocol();
    describe_gauge!("tandem_queue_size", "Requests waiting to be scheduled");
    describe_gauge!(
        "tandem_queue_tokens",
        "Prompt tokens the waiting requests still need to compute"
    );
    describe_gauge!("tandem_running_requests", "Requests being generated");
    describe_gauge!(
        "tandem_scheduling_tenants",
        "API keys with waiting or running requests (requests without a key count as one)"
    );
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
}

/// The Inference Extension's model-server protocol, under vLLM's names.
fn describe_model_server_protocol() {
    for (name, help) in [
        (
            "vllm:num_requests_waiting",
            "Requests waiting to be scheduled (same as tandem_queue_size)",
        ),
        (
            "vllm:num_requests_running",
            "Requests being generated (same as tandem_running_requests)",
        ),
        (
            "vllm:kv_cache_usage_perc",
            "Fraction of KV cache blocks in use, 0 to 1 (same as tandem_kv_cache_usage_ratio)",
        ),
        (
            "vllm:gpu_cache_usage_perc",
            "Older name of vllm:kv_cache_usage_perc, still read by older endpoint pickers",
        ),
        (
            "vllm:cache_config_info",
            "Always 1; labels block_size and num_gpu_blocks describe the KV cache",
        ),
    ] {
        describe_gauge!(name, help);
    }
}

fn describe_steps() {
    describe_histogram!("tandem_batch_size", "Requests per step");
    describe_histogram!("tandem_batch_tokens", "Tokens per step");
    describe_histogram!(
        "tandem_step_duration_seconds",
        Unit::Seconds,
        "From sending one step to every shard to its answer; with two steps in flight this \
         includes the time it waits behind the step before it"
    );
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
        (
            "tandem_step_forward_gap_seconds",
            "Rank 0's model idle between two forward passes while requests run: the previous \
             step's sampling and everything before the next forward starts",
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
        "tandem_compiled_decode_rows",
        "Decode steps of up to this many rows run a compiled graph (--torch-compile; 0: none), as of the latest step"
    );
    describe_gauge!(
        "tandem_compiling",
        "1 while the shards compile decode graphs in the background, as of the latest step"
    );
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
    describe_counter!(
        "tandem_prefix_cache_uncheckpointed_tokens_total",
        "Prompt tokens in cached blocks recomputed because no state checkpoint covered them (models with \
         recurrent state)"
    );
    describe_gauge!(
        "tandem_state_checkpoints_cached",
        "State checkpoints the prefix cache holds (models with recurrent state)"
    );
    describe_gauge!(
        "tandem_state_checkpoints_total",
        "State checkpoints the shards keep (models with recurrent state; 0 otherwise)"
    );
}

#[cfg(test)]
mod tests {
    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;
    use crate::shard::Compilation;

    #[test]
    fn model_server_protocol_gauges_use_the_endpoint_pickers_default_names() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let mut config = SchedulerConfig {
            block_size: 16,
            num_blocks: 100,
            max_batch_tokens: 256,
            max_batch_requests: 8,
            prefix_caching: true,
            steps_in_flight: 1,
            max_drafts: 0,
            draft_method: DraftMethod::Ngram,
            max_drafting_batch: usize::MAX,
            max_loras: 0,
            policy: crate::scheduler::SchedulingPolicy::Fcfs,
            offload: crate::kv::OffloadSlots::default(),
            state_checkpoints: None,
        };
        metrics::with_local_recorder(&recorder, || {
            describe();
            record_cache_config(&config, None);
            config.num_blocks = 80;
            record_cache_config(&config, Some(100));
            record_load(&LoadSnapshot {
                queued_requests: 2,
                queued_tokens: 40,
                running_requests: 3,
                kv_blocks_used: 20,
                kv_blocks_total: 80,
                kv_blocks_cached: 7,
                compilation: None,
                ..LoadSnapshot::default()
            });
        });
        let text = handle.render();
        for expected in [
            "# TYPE vllm:num_requests_waiting gauge",
            "vllm:num_requests_waiting 2",
            "vllm:num_requests_running 3",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            "vllm:kv_cache_usage_perc 0.25",
            "vllm:gpu_cache_usage_perc 0.25",
            "# TYPE vllm:cache_config_info gauge",
            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"80\",enable_prefix_caching=\"true\"} 1",
            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100\",enable_prefix_caching=\"true\"} 0",
        ] {
            assert!(text.contains(expected), "missing {expected} in\n{text}");
        }
    }

    #[test]
    fn load_gauges_include_queue_tokens_and_kv_usage_ratio() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            describe();
            record_load(&LoadSnapshot {
                queued_requests: 2,
                queued_tokens: 40,
                running_requests: 3,
                kv_blocks_used: 25,
                kv_blocks_total: 100,
                kv_blocks_cached: 7,
                state_checkpoints_cached: 5,
                state_checkpoints_total: 16,
                compilation: Some(Compilation {
                    decode_rows: 8,
                    compiling: true,
                }),
                tenants: 2,
            });
            record_step_done(
                &StepTimings {
                    planning: Duration::from_micros(100),
                    round_trip: Duration::from_millis(20),
                    back_to_back: true,
                    requests: 3,
                    tokens: 48,
                },
                &ShardTimings {
                    forward_ms: 15.0,
                    sampling_ms: 2.0,
                    prepare_ms: 1.5,
                    total_ms: 19.0,
                    ..ShardTimings::default()
                },
            );
            record_step_scheduling(Duration::from_micros(250));
        });
        let text = handle.render();
        for expected in [
            "tandem_queue_size 2",
            "tandem_queue_tokens 40",
            "tandem_scheduling_tenants 2",
            "tandem_kv_cache_usage_ratio 0.25",
            "tandem_prefix_cache_blocks 7",
            "tandem_state_checkpoints_cached 5",
            "tandem_state_checkpoints_total 16",
            "tandem_prefix_cache_uncheckpointed_tokens_total 0",
            "tandem_compiled_decode_rows 8",
            "tandem_compiling 1",
            "tandem_prefix_cache_hits_tokens_total 0",
            "tandem_batch_tokens_sum 48",
            "tandem_step_forward_duration_seconds_sum 0.015",
            "tandem_step_sampling_duration_seconds_count 1",
            "tandem_step_prepare_duration_seconds_sum 0.0015",
            "tandem_step_shard_duration_seconds_sum 0.019",
            "tandem_step_scheduling_duration_seconds_sum 0.00025",
        ] {
            assert!(text.contains(expected), "missing {expected} in\n{text}");
        }
    }
}
