//! The shard group with traced steps (`--otlp-endpoint`): a step that runs a sampled request
//! gets a `step` span linked to those requests (`crate::telemetry`), and its calls carry the
//! span's `traceparent`, under which the shards trace their forward pass.

use std::sync::Arc;

use opentelemetry::context::FutureExt;

use super::{KvCacheSize, LoraAdapterInfo, ShardError, ShardGroup, Step, StepAnswer, WarmupPlan};
use crate::telemetry::{self, StepShape, Tracing};

/// `shards`, with traced steps when tracing is on; `shards` itself when it is off.
pub fn traced(shards: Arc<dyn ShardGroup>) -> Arc<dyn ShardGroup> {
    match telemetry::active() {
        Some(tracing) => Arc::new(TracedShards { shards, tracing }),
        None => shards,
    }
}

struct TracedShards {
    shards: Arc<dyn ShardGroup>,
    tracing: &'static Tracing,
}

fn shape(step: &Step) -> StepShape {
    StepShape {
        step_id: step.step_id,
        requests: step.scheduled.len(),
        new_requests: step.new_requests.len(),
        tokens: step
            .scheduled
            .iter()
            .map(|span| span.num_tokens + span.draft_token_ids.len() + span.num_model_drafts)
            .sum(),
    }
}

#[async_trait::async_trait]
impl ShardGroup for TracedShards {
    async fn step(&self, step: Step) -> Result<StepAnswer, ShardError> {
        let ids = step.scheduled.iter().map(|span| span.id);
        let Some(trace) = self.tracing.start_step(shape(&step), ids) else {
            return self.shards.step(step).await;
        };
        let answer = self
            .shards
            .step(step)
            .with_context(trace.context().clone())
            .await;
        if let Err(error) = &answer {
            trace.fail(error.to_string());
        }
        answer
    }

    async fn health(&self, deep: bool) -> Result<(), ShardError> {
        self.shards.health(deep).await
    }

    async fn reset(&self) -> Result<(), ShardError> {
        self.shards.reset().await
    }

    async fn warmup(&self, plan: WarmupPlan) -> Result<KvCacheSize, ShardError> {
        self.shards.warmup(plan).await
    }

    async fn load_lora_adapter(
        &self,
        name: &str,
        path: &str,
    ) -> Result<LoraAdapterInfo, ShardError> {
        self.shards.load_lora_adapter(name, path).await
    }

    async fn unload_lora_adapter(&self, name: &str) -> Result<(), ShardError> {
        self.shards.unload_lora_adapter(name).await
    }
}
