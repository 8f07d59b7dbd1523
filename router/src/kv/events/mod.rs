//! KV-cache events in vLLM's format: what the prefix cache stored, evicted or cleared, so
//! that routers outside this process (llm-d's precise prefix-cache scorer, Dynamo) can track
//! which prefixes this replica holds. docs/scaling.md states the contracts and versions.
//!
//! The prefix cache records events into a bounded queue (never blocking, the oldest event
//! dropped and counted when full); `publisher` drains it on a task of its own.

mod block_hash;
mod event_log;
mod publisher;
mod wire;

pub(crate) use block_hash::BlockDigest;
pub use block_hash::BlockHasher;
pub use event_log::{CacheGroup, KvEvent, KvEventLog, KvEventQueue, TierBlock, QUEUE_CAPACITY};
pub use publisher::{start, KvEventsConfig, PublisherError};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tier_tests;
