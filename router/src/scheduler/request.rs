//! What the HTTP layer hands the scheduler, and what flows back per token.

use tokio::sync::mpsc;

/// Sampling parameters, already validated (see `validation`).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means disabled.
    pub top_k: u32,
    /// 1.0 means disabled.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

/// Token-level stop conditions the shard enforces. Stop *strings* stay in the router.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoppingParams {
    pub max_new_tokens: u32,
    pub ignore_eos: bool,
    pub stop_token_ids: Vec<u32>,
}

/// A validated, tokenized request ready for scheduling.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    pub input_ids: Vec<u32>,
    pub sampling: SamplingParams,
    pub stopping: StoppingParams,
}

/// Why the shard stopped a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Length,
    Eos,
    StopToken,
}

/// One generated token; `finish` is set on the last one.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedToken {
    pub id: u32,
    pub logprob: f32,
    pub finish: Option<FinishReason>,
}

/// Events delivered to the HTTP layer for one request, in order.
/// After a `Token` with `finish` set, or an `Error`, nothing more arrives.
#[derive(Debug, Clone)]
pub enum GenerationEvent {
    /// The request left the queue and its first step was scheduled.
    Started,
    Token(GeneratedToken),
    Error(super::SchedulerError),
}

/// The receiving half of a request. Dropping it cancels the request: the scheduler
/// notices the closed channel at its next step, tells the shards to forget the request
/// and frees its KV blocks. This is how both client disconnects and stop strings end a
/// request early.
#[derive(Debug)]
pub struct GenerationStream {
    pub events: mpsc::UnboundedReceiver<GenerationEvent>,
}
