//! LoRA metrics: `vllm:lora_requests_info`, which the Inference Extension's endpoint picker reads
//! for adapter affinity, and requests per adapter. Labels name only adapters the shards serve,
//! so their number is bounded by the adapters loaded.

use std::collections::BTreeSet;
use std::time::{SystemTime, UNIX_EPOCH};

use metrics::{counter, describe_counter, describe_gauge, gauge};

pub(super) fn describe() {
    describe_gauge!(
        "vllm:lora_requests_info",
        "When the adapters in the labels were last seen (seconds since the Unix epoch): \
         max_lora, running_lora_adapters and waiting_lora_adapters (comma-separated names)"
    );
    describe_counter!(
        "tandem_lora_requests_total",
        "Requests submitted under each LoRA adapter"
    );
}

/// Stamps the series naming the adapters running and waiting now with the current time, as
/// vLLM does: a picker reads the series with the latest stamp.
pub(super) fn record_adapters(
    max_loras: usize,
    running: &BTreeSet<&str>,
    waiting: &BTreeSet<&str>,
) {
    let join = |names: &BTreeSet<&str>| names.iter().copied().collect::<Vec<_>>().join(",");
    let labels = [
        ("max_lora", max_loras.to_string()),
        ("running_lora_adapters", join(running)),
        ("waiting_lora_adapters", join(waiting)),
    ];
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64());
    gauge!("vllm:lora_requests_info", &labels).set(now);
}

pub(super) fn record_submitted(adapter: &str) {
    counter!("tandem_lora_requests_total", "adapter" => adapter.to_owned()).increment(1);
}
