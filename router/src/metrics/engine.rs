//! The engine's series: one call per step plan, step result and load change, and the
//! `tandem_info` identity gauge set once at start-up.

use std::time::Duration;

use metrics::{counter, gauge, histogram};

use super::as_f64;
use crate::http::ServerInfo;
use crate::pb;
use crate::scheduler::LoadSnapshot;

/// Counters registered at 0 so rates and alerts have a series before the first event.
pub(super) fn register_event_counters() {
    for name in [
        "tandem_prefix_cache_queries_tokens_total",
        "tandem_prefix_cache_hits_tokens_total",
        "tandem_prefix_cache_evictions_total",
        "tandem_preemptions_total",
        "tandem_cancelled_requests_total",
        "tandem_shard_recoveries_total",
    ] {
        counter!(name).absolute(0);
    }
}

/// Records the size of a step about to run.
pub fn record_step_planned(requests: usize, tokens: u32) {
    histogram!("tandem_batch_size").record(as_f64(requests));
    histogram!("tandem_batch_tokens").record(f64::from(tokens));
}

/// Records a step that succeeded: its round trip and the timings rank 0 reported.
pub fn record_step_done(elapsed: Duration, response: &pb::StepResponse) {
    histogram!("tandem_step_duration_seconds").record(elapsed);
    for (name, millis) in [
        ("tandem_step_prepare_duration_seconds", response.prepare_ms),
        ("tandem_step_forward_duration_seconds", response.forward_ms),
        (
            "tandem_step_sampling_duration_seconds",
            response.sampling_ms,
        ),
        (
            "tandem_step_shard_duration_seconds",
            response.shard_total_ms,
        ),
    ] {
        histogram!(name).record(f64::from(millis) / 1000.0);
    }
}

/// Records the router's own work for one step: planning it and applying its results.
pub fn record_step_scheduling(elapsed: Duration) {
    histogram!("tandem_step_scheduling_duration_seconds").record(elapsed);
}

/// Publishes the scheduler's load as gauges.
pub fn record_load(load: &LoadSnapshot) {
    gauge!("tandem_queue_size").set(as_f64(load.queued_requests));
    gauge!("tandem_queue_tokens").set(as_f64(load.queued_tokens));
    gauge!("tandem_running_requests").set(as_f64(load.running_requests));
    gauge!("tandem_kv_blocks_used").set(as_f64(load.kv_blocks_used));
    gauge!("tandem_kv_blocks_total").set(as_f64(load.kv_blocks_total));
    gauge!("tandem_prefix_cache_blocks").set(as_f64(load.kv_blocks_cached));
    let usage = if load.kv_blocks_total == 0 {
        0.0
    } else {
        as_f64(load.kv_blocks_used) / as_f64(load.kv_blocks_total)
    };
    gauge!("tandem_kv_cache_usage_ratio").set(usage);
}

/// Sets `tandem_info` to 1 with the served model and the limits as labels.
pub fn record_info(info: &ServerInfo) {
    let labels = [
        ("model_id", info.model_id.clone()),
        ("architecture", info.model_architecture.clone()),
        ("dtype", info.model_dtype.clone()),
        ("device", info.model_device_type.clone()),
        ("num_shards", info.num_shard.to_string()),
        ("block_size", info.block_size.to_string()),
        ("kv_cache_blocks", info.kv_cache_blocks.to_string()),
        (
            "max_concurrent_requests",
            info.max_concurrent_requests.to_string(),
        ),
        ("max_input_tokens", info.max_input_tokens.to_string()),
        ("max_total_tokens", info.max_total_tokens.to_string()),
        (
            "max_batch_prefill_tokens",
            info.max_batch_prefill_tokens.to_string(),
        ),
        ("max_batch_size", info.max_batch_size.to_string()),
        ("version", info.version.to_owned()),
    ];
    gauge!("tandem_info", &labels).set(1.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_gauges_include_queue_tokens_and_kv_usage_ratio() {
        let recorder = super::super::builder()
            .expect("buckets are valid")
            .build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            register_event_counters();
            record_load(&LoadSnapshot {
                queued_requests: 2,
                queued_tokens: 40,
                running_requests: 3,
                kv_blocks_used: 25,
                kv_blocks_total: 100,
                kv_blocks_cached: 7,
            });
            record_step_planned(3, 48);
            record_step_done(
                Duration::from_millis(20),
                &pb::StepResponse {
                    forward_ms: 15.0,
                    sampling_ms: 2.0,
                    prepare_ms: 1.5,
                    shard_total_ms: 19.0,
                    ..pb::StepResponse::default()
                },
            );
            record_step_scheduling(Duration::from_micros(250));
        });
        let text = handle.render();
        for expected in [
            "tandem_queue_size 2",
            "tandem_queue_tokens 40",
            "tandem_kv_cache_usage_ratio 0.25",
            "tandem_prefix_cache_blocks 7",
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
