//! What the prefix cache records: each event, the bounded queue it waits in for the publisher,
//! and the log that hashes blocks and queues their events.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::block_hash::{external, BlockDigest, BlockHasher};
use crate::kv::offload::Medium;
use crate::kv::AdapterKey;

/// Events kept for the publisher at most; beyond, the oldest are dropped.
pub const QUEUE_CAPACITY: usize = 100_000;

/// Which cache a block's event concerns, for a model with recurrent state (a hybrid): its
/// attention layers' KV blocks, or the state checkpoint taken after the block. Other models'
/// events name no group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheGroup {
    Attention,
    State,
}

impl CacheGroup {
    /// The group's index and kind as vLLM's events for hybrid models name them.
    pub fn index(self) -> u64 {
        match self {
            Self::Attention => 0,
            Self::State => 1,
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Self::Attention => "full_attention",
            Self::State => "mamba",
        }
    }
}

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
        /// The LoRA adapter that computed the blocks (`None`: the base model).
        lora: Option<AdapterKey>,
        group: Option<CacheGroup>,
    },
    BlockRemoved {
        block_hashes: Vec<u64>,
        group: Option<CacheGroup>,
    },
    AllBlocksCleared,
    /// A block copied into an offload tier (it may still be in the KV cache as well).
    TierStored {
        medium: Medium,
        block: TierBlock,
    },
    /// A block gone from an offload tier (dropped, moved to another tier, or loaded back).
    TierRemoved {
        medium: Medium,
        digest: BlockDigest,
    },
}

/// A block as an offload tier's events describe it: its digest and what it was computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierBlock {
    pub digest: BlockDigest,
    /// The previous block's digest (`None`: the first block of a sequence).
    pub parent: Option<BlockDigest>,
    pub tokens: Vec<u32>,
    pub lora: Option<AdapterKey>,
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

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<KvEvent>> {
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
                lora,
                group,
                ..
            }),
            KvEvent::BlockStored {
                block_hashes: new_hashes,
                parent_block_hash: Some(parent),
                token_ids: new_tokens,
                block_size: new_block_size,
                lora: new_lora,
                group: new_group,
            },
        ) if block_hashes.last() == Some(&parent)
            && *block_size == new_block_size
            && *lora == new_lora
            && *group == new_group =>
        {
            block_hashes.extend(new_hashes);
            token_ids.extend(new_tokens);
            None
        }
        (
            Some(KvEvent::BlockRemoved {
                block_hashes,
                group,
            }),
            KvEvent::BlockRemoved {
                block_hashes: new_hashes,
                group: new_group,
            },
        ) if *group == new_group => {
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
    /// Set for a model with recurrent state: block events name their cache group.
    groups: bool,
}

impl KvEventLog {
    pub fn new(hasher: BlockHasher, queue: Arc<KvEventQueue>) -> Self {
        Self {
            hasher,
            queue,
            groups: false,
        }
    }

    /// The same log, its block events naming their cache group (a model with recurrent state).
    pub(crate) fn with_cache_groups(self) -> Self {
        Self {
            groups: true,
            ..self
        }
    }

    fn attention(&self) -> Option<CacheGroup> {
        self.groups.then_some(CacheGroup::Attention)
    }

    /// Records that the block holding `tokens` after `parent`, computed under `lora`, is
    /// cached; returns its digest.
    pub(crate) fn stored(
        &self,
        parent: Option<&BlockDigest>,
        tokens: &[u32],
        lora: Option<&AdapterKey>,
    ) -> BlockDigest {
        let digest = self
            .hasher
            .block(parent, tokens, lora.map(|adapter| &*adapter.name));
        self.queue.push(KvEvent::BlockStored {
            block_hashes: vec![external(&digest)],
            parent_block_hash: parent.map(external),
            token_ids: tokens.to_vec(),
            block_size: tokens.len(),
            lora: lora.cloned(),
            group: self.attention(),
        });
        digest
    }

    /// Records that `block` is now held in the offload tier `medium`.
    pub(crate) fn tier_stored(&self, medium: Medium, block: &TierBlock) {
        self.queue.push(KvEvent::TierStored {
            medium,
            block: block.clone(),
        });
    }

    /// Records that the block `digest` left the offload tier `medium`.
    pub(crate) fn tier_removed(&self, medium: Medium, digest: &BlockDigest) {
        self.queue.push(KvEvent::TierRemoved {
            medium,
            digest: *digest,
        });
    }

    pub(crate) fn removed(&self, digest: &BlockDigest) {
        self.queue.push(KvEvent::BlockRemoved {
            block_hashes: vec![external(digest)],
            group: self.attention(),
        });
    }

    /// Records that a state checkpoint now holds the state after the block `digest` (holding
    /// `tokens` after `parent`): a consumer may resume there.
    pub(crate) fn state_stored(
        &self,
        parent: Option<&BlockDigest>,
        digest: &BlockDigest,
        tokens: &[u32],
        lora: Option<&AdapterKey>,
    ) {
        self.queue.push(KvEvent::BlockStored {
            block_hashes: vec![external(digest)],
            parent_block_hash: parent.map(external),
            token_ids: tokens.to_vec(),
            block_size: tokens.len(),
            lora: lora.cloned(),
            group: Some(CacheGroup::State),
        });
    }

    /// Records that no state checkpoint holds the state after the block `digest` any more.
    pub(crate) fn state_removed(&self, digest: &BlockDigest) {
        self.queue.push(KvEvent::BlockRemoved {
            block_hashes: vec![external(digest)],
            group: Some(CacheGroup::State),
        });
    }

    pub(crate) fn cleared(&self) {
        self.queue.push(KvEvent::AllBlocksCleared);
    }
}
