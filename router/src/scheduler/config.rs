//! The sizes and switches the scheduler works within.

use super::checkpoints::CheckpointPlan;
use super::drafting::DraftMethod;
use super::policy::SchedulingPolicy;
use crate::kv::OffloadSlots;

/// Sizes the scheduler works within.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Blocks in the KV cache (from the shards' Warmup).
    pub num_blocks: usize,
    /// Tokens one step may process (prompt chunks plus decode tokens).
    pub max_batch_tokens: usize,
    /// Requests one step may carry.
    pub max_batch_requests: usize,
    /// Whether full KV blocks are shared between requests with the same token prefix.
    pub prefix_caching: bool,
    /// Steps sent before the oldest has answered: 1 plans each step after the previous one
    /// answered; 2 plans and sends the next while the shards run the current one.
    pub steps_in_flight: usize,
    /// Speculative decoding: draft tokens proposed per decode step at most (0: off).
    pub max_drafts: usize,
    /// Where drafts come from when `max_drafts > 0`.
    pub draft_method: DraftMethod,
    /// No step drafts while more requests than this run: a large batch keeps the shards busy
    /// without drafts, and each draft adds a row to every layer's work.
    pub max_drafting_batch: usize,
    /// A model with recurrent state and prefix caching: the state checkpoints that let a
    /// request resume after a cached prefix (`None`: no checkpoints).
    pub state_checkpoints: Option<CheckpointPlan>,
    /// Most distinct LoRA adapters the running requests may select at once (the shards'
    /// `max_loras`); a request under another adapter waits until one is no longer selected.
    pub max_loras: usize,
    /// The order of admission, service and preemption.
    pub policy: SchedulingPolicy,
    /// The KV offload tiers' slots, as the shards allocated them (zeros: off).
    pub offload: OffloadSlots,
}
