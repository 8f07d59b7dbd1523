//! How busy the scheduler is: queue, batch and KV cache occupancy.

use crate::shard::Compilation;

/// A snapshot of the scheduler's load, for `/health`, `/info` and admission.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadSnapshot {
    pub queued_requests: usize,
    /// Tokens the waiting requests still need to compute.
    pub queued_tokens: usize,
    pub running_requests: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    /// Blocks caching a prompt prefix, held or idle (idle ones are reclaimable).
    pub kv_blocks_cached: usize,
    /// A model with recurrent state: state checkpoints the prefix cache names, of all the
    /// shards keep.
    pub state_checkpoints_cached: usize,
    pub state_checkpoints_total: usize,
    /// What the shards had compiled at their latest step; `None` before the first one.
    pub compilation: Option<Compilation>,
    /// API keys with waiting or running requests (requests without a key count as one).
    pub tenants: usize,
}
