//! KV-cache events in vLLM's format: what the prefix cache stored, evicted or cleared, so
//! that routers outside this process (llm-d's precise prefix-cache scorer, Dynamo) can track
//! which prefixes this replica holds. docs/scaling.md states the contracts and versions.
//!
//! The prefix cache records events into a bounded queue (never blocking, the oldest event
//! dropped and counted when full); `publisher` drains it on a task of its own.

mod block_hash;
mod publisher;
mod wire;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

pub use block_hash::BlockHasher;
pub(crate) use block_hash::{external, BlockDigest};
pub use publisher::{start, KvEventsConfig, PublisherError};

/// Events kept for the publisher at most; beyond, the oldest are dropped.
pub const QUEUE_CAPACITY: usize = 100_000;

/// One change to the set of cached blocks; hashes as consumers see them (see `block_hash`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Blocks cached in chain order, each the child of the previous one, the first the child
    /// of `parent_block_hash` (`None`: the first block of a sequence).
    BlockStored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: usize,
    },
    BlockRemoved {
        block_hashes: Vec<u64>,
    },
    AllBlocksCleared,
}

/// Events recorded and not yet published.
#[derive(Debug)]
pub struct KvEventQueue {
    pending: Mutex<VecDeque<KvEvent>>,
    capacity: usize,
    ready: Notify,
}

impl KvEventQueue {
    pub fn new(capacity: usize) -> Arc<Self> {
        metrics::describe_counter!(
            "tandem_kv_events_dropped_total",
            "KV-cache events dropped because the publisher fell behind"
        );
        metrics::counter!("tandem_kv_events_dropped_total").absolute(0);
        Arc::new(Self {
            pending: Mutex::new(VecDeque::new()),
            capacity: capacity.max(1),
            ready: Notify::new(),
        })
    }

    /// Records `event`, merging it into the previous one when it continues it (a stored
    /// block whose parent is the previous stored block, or another removal).
    pub(crate) fn push(&self, event: KvEvent) {
        {
            let mut pending = self.lock();
            if let Some(event) = merge_into_last(&mut pending, event) {
                if pending.len() >= self.capacity {
                    pending.pop_front();
                    metrics::counter!("tandem_kv_events_dropped_total").increment(1);
                }
                pending.push_back(event);
            }
        }
        self.ready.notify_one();
    }

    /// Every pending event, waiting until there is at least one.
    pub async fn next_batch(&self) -> Vec<KvEvent> {
        loop {
            let batch: Vec<KvEvent> = self.lock().drain(..).collect();
            if !batch.is_empty() {
                return batch;
            }
            self.ready.notified().await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<KvEvent>> {
        // Each critical section leaves the queue valid, so a poisoned lock is still usable.
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Extends the last pending event with `event` when it continues it; otherwise hands it back.
fn merge_into_last(pending: &mut VecDeque<KvEvent>, event: KvEvent) -> Option<KvEvent> {
    match (pending.back_mut(), event) {
        (
            Some(KvEvent::BlockStored {
                block_hashes,
                token_ids,
                block_size,
                ..
            }),
            KvEvent::BlockStored {
                block_hashes: new_hashes,
                parent_block_hash: Some(parent),
                token_ids: new_tokens,
                block_size: new_block_size,
            },
        ) if block_hashes.last() == Some(&parent) && *block_size == new_block_size => {
            block_hashes.extend(new_hashes);
            token_ids.extend(new_tokens);
            None
        }
        (
            Some(KvEvent::BlockRemoved { block_hashes }),
            KvEvent::BlockRemoved {
                block_hashes: new_hashes,
            },
        ) => {
            block_hashes.extend(new_hashes);
            None
        }
        (_, event) => Some(event),
    }
}

/// What the prefix cache needs to record events: the hash chain and the queue.
#[derive(Debug, Clone)]
pub struct KvEventLog {
    hasher: BlockHasher,
    queue: Arc<KvEventQueue>,
}

impl KvEventLog {
    pub fn new(hasher: BlockHasher, queue: Arc<KvEventQueue>) -> Self {
        Self { hasher, queue }
    }

    /// Records that the block holding `tokens` after `parent` is cached; returns its digest.
    pub(crate) fn stored(&self, parent: Option<&BlockDigest>, tokens: &[u32]) -> BlockDigest {
        let digest = self.hasher.block(parent, tokens);
        self.queue.push(KvEvent::BlockStored {
            block_hashes: vec![external(&digest)],
            parent_block_hash: parent.map(external),
            token_ids: tokens.to_vec(),
            block_size: tokens.len(),
        });
        digest
    }

    pub(crate) fn removed(&self, digest: &BlockDigest) {
        self.queue.push(KvEvent::BlockRemoved {
            block_hashes: vec![external(digest)],
        });
    }

    pub(crate) fn cleared(&self) {
        self.queue.push(KvEvent::AllBlocksCleared);
    }
}

#[cfg(test)]
mod tests;
