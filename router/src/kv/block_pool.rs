//! The shared handle to the block manager, and RAII block tables: dropping a table
//! releases its blocks (cached ones stay cached until evicted).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::block_manager::{BlockManager, CheckpointCounts};
use super::events::KvEventLog;
use super::offload::{KvTransfer, OffloadSlots, PrefixFetch};
use super::AdapterKey;

/// The KV blocks `0..total`. Cloning shares the same blocks.
#[derive(Debug, Clone)]
pub struct BlockPool {
    inner: Arc<Mutex<BlockManager>>,
}

impl BlockPool {
    /// A pool without prefix caching.
    pub fn new(total: usize) -> Self {
        Self::with_prefix_cache(total, None)
    }

    /// A pool that caches full blocks of `block_size` tokens by prefix when `block_size` is set.
    pub fn with_prefix_cache(total: usize, block_size: Option<usize>) -> Self {
        Self::with_state_checkpoints(total, block_size, None)
    }

    /// A pool for a model with recurrent state when `state_checkpoints` is set: a cached
    /// prefix is resumed only after a block where one of those checkpoints holds the state.
    pub fn with_state_checkpoints(
        total: usize,
        block_size: Option<usize>,
        state_checkpoints: Option<usize>,
    ) -> Self {
        Self {
            inner: Arc::new(Mutex::new(BlockManager::new(
                total,
                block_size,
                state_checkpoints,
            ))),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BlockManager> {
        // Every critical section leaves the manager consistent, so a poisoned lock is still valid.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn total(&self) -> usize {
        self.lock().total()
    }

    /// Blocks an allocation could obtain now, counting evictable cached blocks.
    pub fn free(&self) -> usize {
        self.lock().available()
    }

    /// Blocks held by running or preempted-in-flight sequences (cached idle blocks excluded).
    pub fn used(&self) -> usize {
        self.lock().used()
    }

    /// Blocks currently caching a prefix (held or idle).
    pub fn cached(&self) -> usize {
        self.lock().cached()
    }

    /// Tokens of `tokens` a new table under `adapter` would reuse from the cache now (a peek:
    /// nothing is held).
    pub fn cached_prefix_tokens(&self, adapter: Option<&AdapterKey>, tokens: &[u32]) -> usize {
        self.lock().cached_prefix_tokens(adapter, tokens)
    }

    /// Up to `max_tokens` tokens that an earlier sequence under `adapter` computed after
    /// `tokens`, as the prefix cache holds them (a peek: nothing is held or marked used).
    pub fn cached_continuation(
        &self,
        adapter: Option<&AdapterKey>,
        tokens: &[u32],
        max_tokens: usize,
    ) -> Vec<u32> {
        self.lock().cached_continuation(adapter, tokens, max_tokens)
    }

    /// State checkpoints now named by the cache, free (neither named nor reserved), and in all
    /// (zeros without recurrent state).
    pub fn state_checkpoints(&self) -> CheckpointCounts {
        self.lock().checkpoint_counts()
    }

    /// Makes the pool `total` fresh blocks with an empty prefix cache (after the shards
    /// re-allocated their cache), and `state_checkpoints` fresh checkpoints for a model with
    /// recurrent state. Refused (`false`) while any block is held.
    pub fn resize(&self, total: usize, state_checkpoints: Option<usize>) -> bool {
        self.lock().reset(total, state_checkpoints)
    }

    /// Records every block the prefix cache stores or removes, and every reset, into `log`.
    pub fn record_events(&self, log: KvEventLog) {
        self.lock().record_events(log);
    }

    /// Keeps evicted blocks in offload tiers of `slots` (kept across `resize`, emptied by it);
    /// false when the pool cannot (no prefix caching, or a model with recurrent state).
    pub fn enable_offload(&self, slots: OffloadSlots) -> bool {
        self.lock().enable_offload(slots)
    }

    /// The offload tiers' slots in all and in use, when offload is on.
    pub fn offload_slots(&self) -> Option<(OffloadSlots, OffloadSlots)> {
        self.lock().offload_slots()
    }

    /// The copies between the KV cache and the offload tiers that step `step_id` must run
    /// before anything else; every later step is planned as if they ran.
    pub fn take_kv_transfers(&self, step_id: u64) -> Vec<KvTransfer> {
        self.lock().take_kv_transfers(step_id)
    }

    /// Step `step_id` answered: the disk reads it carried arrived, except those at the
    /// positions `failed` of its transfers.
    pub fn kv_transfers_answered(&self, step_id: u64, failed: &[usize]) {
        self.lock().kv_transfers_answered(step_id, failed);
    }

    /// Forgets every cached prefix.
    #[cfg(test)]
    pub fn clear_prefix_cache(&self) {
        self.lock().clear_cache();
    }

    /// An empty table that draws from this pool, for a sequence of the base model.
    pub fn new_table(&self) -> BlockTable {
        self.new_table_under(None)
    }

    /// An empty table for a sequence computed under `adapter`: it adopts and publishes only
    /// that adapter's cached prefixes.
    pub fn new_table_under(&self, adapter: Option<AdapterKey>) -> BlockTable {
        BlockTable {
            adapter,
            blocks: Vec::new(),
            published: 0,
            publishing_stopped: false,
            reserved_checkpoints: Vec::new(),
            answer_checkpoint: None,
            retention: None,
            pool: self.clone(),
        }
    }
}

/// The cached prefix a new table starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdoptedPrefix {
    /// Tokens its blocks hold (already computed).
    pub tokens: usize,
    /// The checkpoint holding the recurrent state after those tokens (a model with recurrent
    /// state, and a hit).
    pub state_checkpoint: Option<u32>,
    /// Tokens of whole blocks the cache held beyond `tokens` that no checkpoint covered: they
    /// are computed again.
    pub uncheckpointed_tokens: usize,
    /// Whether the offload tiers are fetching blocks that continue the prefix from disk; a
    /// request that waits for them computes fewer tokens.
    pub fetch: PrefixFetch,
}

/// A checkpoint a step will save a sequence's state into, after `position` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ReservedCheckpoint {
    position: usize,
    checkpoint: u32,
    /// The sequence's latest answer checkpoint: it replaces the one before.
    replaces_previous: bool,
}

/// The blocks of one sequence, in order. Invariant: the table holds one reference to
/// each of its blocks until it is dropped or cleared, and its first `published` blocks are
/// cached as the sequence's own prefix.
#[derive(Debug)]
pub struct BlockTable {
    blocks: Vec<u32>,
    published: usize,
    /// Set once a block's run was already cached elsewhere: later blocks cannot hang under it.
    publishing_stopped: bool,
    /// Checkpoints that steps sent or planned save into, in position order; named in the
    /// cache once their step answered, freed if the table is cleared first.
    reserved_checkpoints: Vec<ReservedCheckpoint>,
    /// The latest named answer checkpoint: (position, checkpoint).
    answer_checkpoint: Option<(usize, u32)>,
    /// The adapter the sequence runs under (`None`: the base model).
    adapter: Option<AdapterKey>,
    /// How long a cache hint keeps the published blocks ahead of LRU eviction once the
    /// sequence releases them (`None`: no hint, plain LRU).
    retention: Option<Duration>,
    pool: BlockPool,
}

impl BlockTable {
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    pub fn adapter(&self) -> Option<&AdapterKey> {
        self.adapter.as_ref()
    }

    /// Asks that the blocks this table publishes stay ahead of LRU eviction for `retention`
    /// after the table releases them (a client's cache hint); `None` leaves them plain LRU.
    pub fn retain_for(&mut self, retention: Option<Duration>) {
        self.retention = retention;
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Appends `count` blocks, all or none; returns the new ids, or `None` when the pool
    /// cannot provide `count` blocks even by evicting cached ones.
    pub fn grow(&mut self, count: usize) -> Option<&[u32]> {
        let start = self.blocks.len();
        let new_blocks = self.pool.lock().allocate(count)?;
        self.blocks.extend(new_blocks);
        Some(&self.blocks[start..])
    }

    /// Starts an empty table with the cached blocks of `tokens`' longest cached prefix that
    /// can be resumed (for a model with recurrent state: up to the deepest checkpoint).
    pub fn adopt_cached_prefix(&mut self, tokens: &[u32]) -> AdoptedPrefix {
        debug_assert!(
            self.blocks.is_empty(),
            "only an empty table adopts a prefix"
        );
        let mut manager = self.pool.lock();
        let Some(block_size) = manager.cache_block_size() else {
            return AdoptedPrefix::default();
        };
        let prefix = manager.acquire_prefix(self.adapter.as_ref(), tokens);
        self.blocks = prefix.blocks;
        self.published = self.blocks.len();
        AdoptedPrefix {
            tokens: self.blocks.len() * block_size,
            state_checkpoint: prefix.checkpoint,
            uncheckpointed_tokens: (prefix.matched_blocks - self.blocks.len()) * block_size,
            fetch: prefix.fetch,
        }
    }

    /// Reserves a checkpoint for the state after `position` tokens, which a step about to be
    /// sent saves; `replaces_previous` marks an answer checkpoint, which replaces the table's
    /// previous one once named. `None` without checkpoints.
    pub fn reserve_checkpoint(&mut self, position: usize, replaces_previous: bool) -> Option<u32> {
        let checkpoint = self.pool.lock().reserve_checkpoint()?;
        self.reserved_checkpoints.push(ReservedCheckpoint {
            position,
            checkpoint,
            replaces_previous,
        });
        Some(checkpoint)
    }

    /// Caches every block whose tokens are all computed (`tokens[..num_computed]`), so later
    /// requests with the same prefix reuse it.
    pub fn publish(&mut self, tokens: &[u32], num_computed: usize) {
        let mut manager = self.pool.lock();
        let Some(block_size) = manager.cache_block_size() else {
            return;
        };
        let full_blocks = (num_computed / block_size).min(self.blocks.len());
        while !self.publishing_stopped && self.published < full_blocks {
            let index = self.published;
            let parent = index.checked_sub(1).map(|previous| self.blocks[previous]);
            let key = &tokens[index * block_size..(index + 1) * block_size];
            if manager.publish(self.adapter.as_ref(), parent, key, self.blocks[index]) {
                self.published += 1;
            } else {
                self.publishing_stopped = true;
            }
        }
        let saved = self
            .reserved_checkpoints
            .iter()
            .take_while(|reserved| reserved.position <= num_computed)
            .count();
        for reserved in self.reserved_checkpoints.drain(..saved) {
            let prefix = &tokens[..reserved.position];
            let adapter = self.adapter.as_ref();
            if manager.attach_checkpoint(adapter, prefix, reserved.checkpoint)
                && reserved.replaces_previous
            {
                let latest = (reserved.position, reserved.checkpoint);
                if let Some((position, checkpoint)) = self.answer_checkpoint.replace(latest) {
                    manager.detach_checkpoint(adapter, &tokens[..position], checkpoint);
                }
            }
        }
    }

    /// Releases every block and every checkpoint not yet named in the cache (a step still in
    /// flight may write one; nothing reads it before a later step's save is named). Under a
    /// cache hint, the published blocks are retained for its duration from now.
    pub fn clear(&mut self) {
        let published = std::mem::take(&mut self.published);
        self.publishing_stopped = false;
        self.answer_checkpoint = None;
        if self.blocks.is_empty() && self.reserved_checkpoints.is_empty() {
            return;
        }
        let mut manager = self.pool.lock();
        if let Some(retention) = self.retention {
            manager.retain_cached(&self.blocks[..published], Instant::now() + retention);
        }
        for reserved in self.reserved_checkpoints.drain(..) {
            manager.free_checkpoint(reserved.checkpoint);
        }
        for block in self.blocks.drain(..) {
            manager.release(block);
        }
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        self.clear();
    }
}
