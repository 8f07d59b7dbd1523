//! The step loop: continuous batching, chunked prefill, KV block allocation, preemption.
//!
//! `state` is pure bookkeeping (no I/O, unit-tested with a fake shard); `actor` owns it
//! and drives the shards one Step at a time.

mod actor;
#[cfg(test)]
mod actor_tests;
mod backend;
#[cfg(test)]
mod checkpoint_tests;
mod checkpoints;
mod config;
mod drafting;
mod error;
mod fair_share;
#[cfg(test)]
mod fair_tests;
#[cfg(test)]
mod fake_shard;
mod handle;
#[cfg(test)]
mod image_tests;
mod in_flight;
mod load;
mod lora_metrics;
#[cfg(test)]
mod lora_tests;
mod metrics;
#[cfg(test)]
mod model_draft_tests;
mod pacer;
#[cfg(test)]
mod pacing_tests;
#[cfg(test)]
mod pipeline_tests;
mod policy;
#[cfg(test)]
mod priority_tests;
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

pub use backend::Backend;
pub use checkpoints::CheckpointPlan;
pub use config::SchedulerConfig;
pub use drafting::DraftMethod;
pub use error::{AdapterUpdateError, SchedulerError};
pub use load::LoadSnapshot;
pub use policy::SchedulingPolicy;
pub use recovery::{EnginePhase, RecoveryConfig};

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
        pacer: pacer::StepPacer::default(),
    };
    tokio::spawn(actor.run());
    Arc::new(handle)
}
