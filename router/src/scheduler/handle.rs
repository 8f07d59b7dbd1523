//! The scheduler as the HTTP layer sees it: a `Backend` that queues requests for the actor.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::backend::Backend;
use super::config::SchedulerConfig;
use super::error::{AdapterUpdateError, SchedulerError};
use super::load::LoadSnapshot;
use super::recovery::EnginePhase;
use super::request::{GenerationRequest, GenerationStream};
use super::sequence::Sequence;
use crate::kv::BlockPool;
use crate::shard::{LoraAdapterInfo, ShardError, ShardGroup};

/// What the handle asks of the step loop.
pub(crate) enum Command {
    /// Queue a request.
    Submit(Box<Sequence>),
    /// Run a deep health probe between two steps and answer here; skipped or cancelled
    /// once the asker stops waiting.
    DeepHealth(oneshot::Sender<Result<(), SchedulerError>>),
    /// Answer how many requests wait or run under the named LoRA adapter.
    CountUnderAdapter(String, oneshot::Sender<usize>),
}

pub(crate) struct SchedulerHandle {
    pub config: SchedulerConfig,
    pub pool: BlockPool,
    pub shards: Arc<dyn ShardGroup>,
    pub submissions: mpsc::UnboundedSender<Command>,
    /// How long a deep health probe may wait for its turn and run.
    pub deep_health_timeout: Duration,
    pub load: watch::Receiver<LoadSnapshot>,
    pub phase: watch::Receiver<EnginePhase>,
    pub next_id: AtomicU64,
}

/// Rejects a request that could not fit in the whole KV cache even alone.
pub(crate) fn check_capacity(
    config: &SchedulerConfig,
    request: &GenerationRequest,
) -> Result<(), SchedulerError> {
    let max_tokens = request.input_ids.len() + request.stopping.max_new_tokens as usize;
    let needed = max_tokens.div_ceil(config.block_size);
    if needed > config.num_blocks {
        return Err(SchedulerError::ExceedsKvCapacity {
            needed,
            available: config.num_blocks,
        });
    }
    Ok(())
}

impl SchedulerHandle {
    /// Checks the request and queues it behind `leader` (see the scheduler's sibling gate).
    fn enqueue(
        &self,
        request: GenerationRequest,
        leader: Option<u64>,
    ) -> Result<(u64, GenerationStream), SchedulerError> {
        if self.phase() == EnginePhase::Recovering {
            return Err(SchedulerError::Recovering);
        }
        // The pool is re-sized when restarted shards report a different cache size.
        let config = SchedulerConfig {
            num_blocks: self.pool.total(),
            ..self.config
        };
        check_capacity(&config, &request)?;
        let (sender, events) = mpsc::unbounded_channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Some(trace) = &request.trace {
            trace.bind(id);
        }
        if let Some(adapter) = &request.adapter {
            super::lora_metrics::record_submitted(&adapter.name);
        }
        let table = self.pool.new_table_under(request.adapter.clone());
        let mut sequence = Sequence::new(id, request, table, sender);
        sequence.leader = leader;
        self.submissions
            .send(Command::Submit(Box::new(sequence)))
            .map_err(|_| SchedulerError::ShuttingDown)?;
        Ok((id, GenerationStream { events }))
    }
}

#[async_trait::async_trait]
impl Backend for SchedulerHandle {
    fn submit(&self, request: GenerationRequest) -> Result<GenerationStream, SchedulerError> {
        self.enqueue(request, None).map(|(_, stream)| stream)
    }

    fn submit_siblings(
        &self,
        requests: Vec<GenerationRequest>,
    ) -> Result<Vec<GenerationStream>, SchedulerError> {
        let mut leader = None;
        let mut streams = Vec::with_capacity(requests.len());
        // On an error the streams already queued are dropped, which cancels them.
        for request in requests {
            let (id, stream) = self.enqueue(request, leader)?;
            leader.get_or_insert(id);
            streams.push(stream);
        }
        Ok(streams)
    }

    fn load(&self) -> LoadSnapshot {
        *self.load.borrow()
    }

    async fn health(&self) -> Result<(), SchedulerError> {
        self.shards
            .health(false)
            .await
            .map_err(|error| SchedulerError::ShardFailed(error.to_string()))
    }

    /// Goes through the step loop, so with tensor parallelism the probe's forward never
    /// runs beside a Step; gives up (and so cancels the probe) after the step timeout.
    async fn deep_health(&self) -> Result<(), SchedulerError> {
        if self.phase() == EnginePhase::Recovering {
            return Err(SchedulerError::Recovering);
        }
        let (reply, answer) = oneshot::channel();
        self.submissions
            .send(Command::DeepHealth(reply))
            .map_err(|_| SchedulerError::ShuttingDown)?;
        match tokio::time::timeout(self.deep_health_timeout, answer).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(SchedulerError::ShuttingDown),
            Err(_) => Err(SchedulerError::HealthTimeout(
                self.deep_health_timeout.as_secs(),
            )),
        }
    }

    fn phase(&self) -> EnginePhase {
        *self.phase.borrow()
    }

    async fn load_lora_adapter(
        &self,
        name: &str,
        path: &str,
    ) -> Result<LoraAdapterInfo, AdapterUpdateError> {
        self.shards
            .load_lora_adapter(name, path)
            .await
            .map_err(|error| adapter_update_error(name, error))
    }

    async fn unload_lora_adapter(&self, name: &str) -> Result<(), AdapterUpdateError> {
        self.shards
            .unload_lora_adapter(name)
            .await
            .map_err(|error| adapter_update_error(name, error))
    }

    async fn requests_under_adapter(&self, name: &str) -> usize {
        let (reply, answer) = oneshot::channel();
        let asked = self
            .submissions
            .send(Command::CountUnderAdapter(name.to_owned(), reply));
        // A scheduler that is gone runs nothing.
        if asked.is_err() {
            return 0;
        }
        answer.await.unwrap_or(0)
    }
}

/// A shard's refusal as the client's error (the adapter, its name), anything else as the shards'.
fn adapter_update_error(name: &str, error: ShardError) -> AdapterUpdateError {
    match error {
        ShardError::Rpc {
            code: tonic::Code::AlreadyExists,
            ..
        } => AdapterUpdateError::AlreadyLoaded(name.to_owned()),
        ShardError::Rpc {
            code: tonic::Code::NotFound,
            ..
        } => AdapterUpdateError::NotLoaded(name.to_owned()),
        ShardError::Rpc {
            code: tonic::Code::InvalidArgument,
            message,
            ..
        } => AdapterUpdateError::Refused {
            name: name.to_owned(),
            message,
        },
        other => AdapterUpdateError::Shards(other.to_string()),
    }
}
