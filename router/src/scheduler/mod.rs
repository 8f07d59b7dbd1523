//! The step loop: continuous batching, chunked prefill, KV block allocation, preemption.
//!
//! `state` is pure bookkeeping (no I/O, unit-tested with a fake shard); `actor` owns it
//! and drives the shards one Step at a time.

mod actor;
#[cfg(test)]
mod actor_tests;
mod drafting;
#[cfg(test)]
mod fake_shard;
mod handle;
mod in_flight;
mod metrics;
#[cfg(test)]
mod pipeline_tests;
#[cfg(test)]
mod proptests;
mod recovery;
mod request;
mod sequence;
#[cfg(test)]
mod speculation_tests;
mod state;
#[cfg(test)]
mod tests;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::kv::events::KvEventLog;
use crate::shard::ShardGroup;

pub use crate::shard::{
    FinishReason, GeneratedToken, Grammar, LogprobOptions, PromptLogprobs, RequestFailure,
    RequestFailureKind, SamplingParams, StoppingParams, TokenLogprob,
};
pub use request::{GenerationEvent, GenerationRequest, GenerationStream};

pub use drafting::DraftMethod;
pub use recovery::{EnginePhase, RecoveryConfig};

/// Errors the scheduler reports to the HTTP layer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SchedulerError {
    #[error("the request needs {needed} KV cache blocks but the cache only has {available}")]
    ExceedsKvCapacity { needed: usize, available: usize },
    #[error("model shard failure: {0}")]
    ShardFailed(String),
    /// This request alone could not go on; the shards ran every other request of its step.
    #[error("{}", .0.message)]
    RequestFailed(RequestFailure),
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("the model shards are restarting; retry shortly")]
    Recovering,
    #[error(
        "the request waited {0}s in the queue without starting (--max-queue-time); retry later"
    )]
    QueueTimeout(u64),
    #[error("the deep health check got no answer within {0}s")]
    HealthTimeout(u64),
}

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
}

/// What the HTTP layer needs from the engine behind it. Tests swap in a fake.
#[async_trait::async_trait]
pub trait Backend: Send + Sync {
    /// Queues a request; events arrive on the returned stream.
    fn submit(&self, request: GenerationRequest) -> Result<GenerationStream, SchedulerError>;
    /// Queues requests sharing one prompt (`n` choices, `best_of` candidates), one stream
    /// each in order. The scheduler may run the first alone until its prompt is cached.
    fn submit_siblings(
        &self,
        requests: Vec<GenerationRequest>,
    ) -> Result<Vec<GenerationStream>, SchedulerError> {
        requests
            .into_iter()
            .map(|request| self.submit(request))
            .collect()
    }
    /// Current load.
    fn load(&self) -> LoadSnapshot;
    /// Asks every shard whether it is alive.
    async fn health(&self) -> Result<(), SchedulerError>;
    /// Runs a one-token forward on every shard, between two steps, within a timeout.
    async fn deep_health(&self) -> Result<(), SchedulerError> {
        self.health().await
    }
    /// Whether the engine takes requests or waits for restarted shards.
    fn phase(&self) -> EnginePhase {
        EnginePhase::Serving
    }
}

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
}

/// Starts the step loop on the current tokio runtime and returns its handle.
pub fn spawn(
    config: SchedulerConfig,
    recovery: RecoveryConfig,
    shards: Arc<dyn ShardGroup>,
    kv_events: Option<KvEventLog>,
) -> Arc<dyn Backend> {
    metrics::describe();
    metrics::record_cache_config(&config, None);
    let state = state::SchedulerState::new(config);
    if let Some(log) = kv_events {
        state.pool().record_events(log);
    }
    let (submissions, receiver) = mpsc::unbounded_channel();
    let (load_sender, load) = watch::channel(state.load());
    let (phase_sender, phase) = watch::channel(EnginePhase::Serving);
    let handle = handle::SchedulerHandle {
        config,
        pool: state.pool().clone(),
        shards: Arc::clone(&shards),
        submissions,
        deep_health_timeout: recovery.step_timeout,
        load,
        phase,
        next_id: AtomicU64::new(0),
    };
    let actor = actor::Actor {
        state,
        shards,
        submissions: receiver,
        load: load_sender,
        phase: phase_sender,
        recovery,
        steps_in_flight: config.steps_in_flight.max(1),
        in_flight: std::collections::VecDeque::new(),
        probes: Vec::new(),
        busy: false,
        shards_in_step: false,
    };
    tokio::spawn(actor.run());
    Arc::new(handle)
}
