//! The router's view of the model shards: one gRPC client per rank, over its Unix socket or,
//! for a rank on another node, over TCP with the cluster secret.

mod address;
mod cluster_secret;
mod connect;
mod convert;
mod error;
mod fleet;
mod sampling;
mod step;
mod step_answer;
mod traced;

pub use address::{ShardAddress, ShardAddressError};
pub use cluster_secret::ClusterAuth;
pub use convert::{KvCacheSize, LoraAdapterInfo, ModelInfo, WarmupPlan};
pub use error::ShardError;
pub use fleet::ShardFleet;
pub use sampling::{Grammar, LogprobOptions, SamplingParams, StoppingParams};
pub use step::{NewRequest, ScheduledSpan, Step};
pub use step_answer::{
    Compilation, FailedRequest, FinishReason, GeneratedToken, Generation, PromptLogprobs,
    PromptLogprobsChunk, RequestFailure, RequestFailureKind, ShardTimings, StepAnswer,
    TokenLogprob,
};
pub use traced::traced;

/// The RPCs the step loop sends to the whole shard group; `ShardFleet` fans each out to
/// every rank, tests put a fake here.
#[async_trait::async_trait]
pub trait ShardGroup: Send + Sync + 'static {
    /// One forward pass on every rank; rank 0's outputs.
    async fn step(&self, step: Step) -> Result<StepAnswer, ShardError>;
    /// Whether every rank answers; `deep` runs a one-token forward on each.
    async fn health(&self, deep: bool) -> Result<(), ShardError>;
    /// Every rank drops all request state.
    async fn reset(&self) -> Result<(), ShardError>;
    /// Every rank (re)allocates its KV cache; the smallest rank's answer.
    async fn warmup(&self, plan: WarmupPlan) -> Result<KvCacheSize, ShardError>;
    /// Every rank loads the PEFT adapter at `path` as `name`; on any rank's refusal the ranks
    /// that loaded it unload it again, so all ranks keep the same set.
    async fn load_lora_adapter(
        &self,
        name: &str,
        path: &str,
    ) -> Result<LoraAdapterInfo, ShardError> {
        let _ = (name, path);
        Err(ShardError::Unsupported("loading LoRA adapters"))
    }
    /// Every rank forgets the adapter `name`.
    async fn unload_lora_adapter(&self, name: &str) -> Result<(), ShardError> {
        let _ = name;
        Err(ShardError::Unsupported("unloading LoRA adapters"))
    }
}

#[async_trait::async_trait]
impl ShardGroup for ShardFleet {
    async fn step(&self, step: Step) -> Result<StepAnswer, ShardError> {
        ShardFleet::step(self, step).await
    }

    async fn health(&self, deep: bool) -> Result<(), ShardError> {
        ShardFleet::health(self, deep).await
    }

    async fn reset(&self) -> Result<(), ShardError> {
        ShardFleet::reset(self).await
    }

    async fn warmup(&self, plan: WarmupPlan) -> Result<KvCacheSize, ShardError> {
        ShardFleet::warmup(self, plan).await
    }

    async fn load_lora_adapter(
        &self,
        name: &str,
        path: &str,
    ) -> Result<LoraAdapterInfo, ShardError> {
        ShardFleet::load_lora_adapter(self, name, path).await
    }

    async fn unload_lora_adapter(&self, name: &str) -> Result<(), ShardError> {
        ShardFleet::unload_lora_adapter(self, name).await
    }
}
