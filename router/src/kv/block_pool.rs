//! The shared handle to the block manager, and RAII block tables: dropping a table
//! releases its blocks (cached ones stay cached until evicted).

use std::sync::{Arc, Mutex, MutexGuard};

use super::block_manager::BlockManager;
use super::events::KvEventLog;

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
        Self {
            inner: Arc::new(Mutex::new(BlockManager::new(total, block_size))),
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

    /// Tokens of `tokens` a new table would reuse from the cache now (a peek: nothing is held).
    pub fn cached_prefix_tokens(&self, tokens: &[u32]) -> usize {
        self.lock().cached_prefix_tokens(tokens)
    }

    /// Up to `max_tokens` tokens that an earlier sequence computed after `tokens`, as the
    /// prefix cache holds them (a peek: nothing is held or marked used).
    pub fn cached_continuation(&self, tokens: &[u32], max_tokens: usize) -> Vec<u32> {
        self.lock().cached_continuation(tokens, max_tokens)
    }

    /// Makes the pool `total` fresh blocks with an empty prefix cache (after the shards
    /// re-allocated their cache). Refused (`false`) while any block is held.
    pub fn resize(&self, total: usize) -> bool {
        self.lock().reset(total)
    }

    /// Records every block the prefix cache stores or removes, and every reset, into `log`.
    pub fn record_events(&self, log: KvEventLog) {
        self.lock().record_events(log);
    }

    /// Forgets every cached prefix.
    #[cfg(test)]
    pub fn clear_prefix_cache(&self) {
        self.lock().clear_cache();
    }

    /// An empty table that draws from this pool.
    pub fn new_table(&self) -> BlockTable {
        BlockTable {
            blocks: Vec::new(),
            published: 0,
            publishing_stopped: false,
            pool: self.clone(),
        }
    }
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
    pool: BlockPool,
}

impl BlockTable {
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
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

    /// Starts an empty table with the cached blocks of `tokens`' longest cached prefix;
    /// returns how many tokens they hold (already computed).
    pub fn adopt_cached_prefix(&mut self, tokens: &[u32]) -> usize {
        debug_assert!(
            self.blocks.is_empty(),
            "only an empty table adopts a prefix"
        );
        let mut manager = self.pool.lock();
        let Some(block_size) = manager.cache_block_size() else {
            return 0;
        };
        self.blocks = manager.acquire_prefix(tokens);
        self.published = self.blocks.len();
        self.blocks.len() * block_size
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
            if manager.publish(parent, key, self.blocks[index]) {
                self.published += 1;
            } else {
                self.publishing_stopped = true;
            }
        }
    }

    /// Releases every block.
    pub fn clear(&mut self) {
        self.published = 0;
        self.publishing_stopped = false;
        if self.blocks.is_empty() {
            return;
        }
        let mut manager = self.pool.lock();
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
