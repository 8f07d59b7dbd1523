//! One Step as the scheduler plans it: the requests the shards meet for the first time, the
//! token span each scheduled request runs, and the requests they must forget first.

use std::sync::Arc;

use super::sampling::{Grammar, LogprobOptions, SamplingParams, StoppingParams};
use crate::images::PromptImage;
use crate::kv::KvTransfer;

/// One forward pass over every scheduled request. Steps run in `step_id` order on every rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Step {
    pub step_id: u64,
    /// Requests the shards have not seen; each also appears in `scheduled`.
    pub new_requests: Vec<NewRequest>,
    pub scheduled: Vec<ScheduledSpan>,
    /// Requests to forget before running (stopped by the router, cancelled, preempted).
    pub finished: Vec<u64>,
    /// Copies between the KV cache and the offload tiers, run in order before the rest.
    pub kv_transfers: Vec<KvTransfer>,
}

/// A request as the shards first meet it: its tokens so far and how it samples and stops.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRequest {
    pub id: u64,
    /// The prompt, followed by the tokens generated before a preemption (if any).
    pub token_ids: Vec<u32>,
    /// How many of the trailing `token_ids` were generated rather than prompted.
    pub num_output_tokens: usize,
    pub sampling: SamplingParams,
    pub stopping: StoppingParams,
    pub logprobs: LogprobOptions,
    /// `None` means unconstrained.
    pub grammar: Option<Grammar>,
    /// The LoRA adapter the request runs under, by the name the shards know it by; `None`: the
    /// base model.
    pub lora_adapter: Option<Arc<str>>,
    /// The prompt's images at their spans of `token_ids`.
    pub images: Vec<PromptImage>,
}

/// The tokens one request runs in a step, starting at its computed-token count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSpan {
    pub id: u64,
    pub num_tokens: usize,
    /// Blocks appended to the request's block table before the step runs.
    pub new_block_ids: Vec<u32>,
    /// Tokens already in the KV cache when the step starts.
    pub num_computed_tokens: usize,
    /// Tokens proposed to follow the request's last token, run in the same forward pass.
    pub draft_token_ids: Vec<u32>,
    /// Tokens the shards' draft model proposes to follow the request's last token and runs as
    /// `draft_token_ids`; 0 whenever `draft_token_ids` is set.
    pub num_model_drafts: usize,
    /// A model with recurrent state: the checkpoint a new request's state starts from.
    pub restore_state_checkpoint: Option<u32>,
    /// A model with recurrent state: the checkpoint the request's state is saved into after
    /// the step.
    pub save_state_checkpoint: Option<u32>,
}
