//! What the HTTP layer hands the scheduler, and what flows back per token.

use std::time::Duration;

use tokio::sync::mpsc;

use super::error::SchedulerError;
use crate::images::PromptImage;
use crate::kv::AdapterKey;
use crate::shard::{
    GeneratedToken, Grammar, LogprobOptions, PromptLogprobs, SamplingParams, StoppingParams,
};
use crate::telemetry::RequestTrace;
use crate::tenant::Tenant;

/// A validated, tokenized request ready for scheduling.
#[derive(Debug, Clone, Default)]
pub struct GenerationRequest {
    pub input_ids: Vec<u32>,
    pub sampling: SamplingParams,
    pub stopping: StoppingParams,
    pub logprobs: LogprobOptions,
    /// `None` means unconstrained.
    pub grammar: Option<Grammar>,
    /// Most draft tokens per step for this request (`speculate`); `None` leaves the server's
    /// `--speculate`, which also bounds any value here.
    pub max_drafts: Option<usize>,
    /// The LoRA adapter the request runs under (`None`: the base model); its KV blocks are
    /// shared only with requests under the same adapter.
    pub adapter: Option<AdapterKey>,
    /// Lower runs earlier under `SchedulingPolicy::Priority`; 0 unless the request set it.
    pub priority: i32,
    /// How long the request's cached blocks stay ahead of LRU eviction after it releases
    /// them (a client's cache hint); `None`: plain LRU.
    pub cache_retention: Option<Duration>,
    /// The API key the request came with, whose share `SchedulingPolicy::Fair` keeps;
    /// `None` (no keys configured) is one tenant shared by every such request.
    pub tenant: Option<Tenant>,
    /// The prompt's images, each placed at its span of `input_ids`.
    pub images: Vec<PromptImage>,
    /// The request's trace, when it is traced: steps that run it link to it.
    pub trace: Option<RequestTrace>,
}

/// Events delivered to the HTTP layer for one request, in order.
/// After a `Token` with `finish` set, or an `Error`, nothing more arrives.
#[derive(Debug, Clone)]
pub enum GenerationEvent {
    /// The request left the queue and its first step was scheduled, its first
    /// `cached_tokens` prompt tokens taken from the prefix cache.
    Started {
        cached_tokens: usize,
    },
    /// Prompt log-probabilities of one prefill chunk; a recomputed request may repeat
    /// positions it delivered before.
    PromptLogprobs(PromptLogprobs),
    Token(GeneratedToken),
    Error(SchedulerError),
}

/// The receiving half of a request. Dropping it cancels the request: the scheduler
/// notices the closed channel at its next step, tells the shards to forget the request
/// and frees its KV blocks. This is how both client disconnects and stop strings end a
/// request early.
#[derive(Debug)]
pub struct GenerationStream {
    pub events: mpsc::UnboundedReceiver<GenerationEvent>,
}
