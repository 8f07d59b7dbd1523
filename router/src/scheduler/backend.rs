//! The engine as the HTTP layer sees it.

use super::error::{AdapterUpdateError, SchedulerError};
use super::load::LoadSnapshot;
use super::recovery::EnginePhase;
use super::request::{GenerationRequest, GenerationStream};
use crate::shard::LoraAdapterInfo;

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
    /// Every shard loads the PEFT adapter at `path` (a directory on the shards' machines) as
    /// `name`.
    async fn load_lora_adapter(
        &self,
        name: &str,
        path: &str,
    ) -> Result<LoraAdapterInfo, AdapterUpdateError> {
        let _ = path;
        Err(AdapterUpdateError::Shards(format!(
            "this engine cannot load '{name}'"
        )))
    }
    /// Every shard forgets the adapter `name`.
    async fn unload_lora_adapter(&self, name: &str) -> Result<(), AdapterUpdateError> {
        Err(AdapterUpdateError::Shards(format!(
            "this engine cannot unload '{name}'"
        )))
    }
    /// Requests waiting or running under the adapter `name`.
    async fn requests_under_adapter(&self, name: &str) -> usize {
        let _ = name;
        0
    }
}
