//! The errors the scheduler reports to the HTTP layer.

use crate::shard::RequestFailure;

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

/// Why loading or unloading a LoRA adapter at run time failed; nothing changed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AdapterUpdateError {
    #[error("LoRA adapter '{0}' is already loaded")]
    AlreadyLoaded(String),
    #[error("LoRA adapter '{0}' is not loaded")]
    NotLoaded(String),
    #[error("LoRA adapter '{name}' has {requests} requests waiting or running; unload it once they finish")]
    InUse { name: String, requests: usize },
    #[error("LoRA adapter '{name}' cannot be loaded: {message}")]
    Refused { name: String, message: String },
    #[error("the shards failed to change their LoRA adapters: {0}")]
    Shards(String),
}
