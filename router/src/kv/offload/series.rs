//! The offload tiers' Prometheus series.

/// Describes the offload tiers' series; the failed-read counter starts at 0 so alerts have a
/// series before the first failure.
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        "tandem_kv_offload_slots",
        "Block slots of each KV offload tier (medium CPU: host memory, DISK: disk; 0: off)"
    );
    describe_gauge!(
        "tandem_kv_offload_used_slots",
        "Block slots of each KV offload tier holding an evicted block"
    );
    describe_counter!(
        "tandem_kv_offload_stored_blocks_total",
        "Blocks copied into each KV offload tier (CPU: evicted from the KV cache; DISK: moved from host memory)"
    );
    describe_counter!(
        "tandem_kv_offload_loaded_blocks_total",
        "Blocks read back from each KV offload tier instead of being recomputed (CPU: into the KV cache; DISK: \
         into host memory)"
    );
    describe_counter!(
        "tandem_kv_offload_failed_reads_total",
        "Disk tier entries found missing or torn (checksum) when read; their blocks are recomputed"
    );
    metrics::counter!("tandem_kv_offload_failed_reads_total").absolute(0);
}
