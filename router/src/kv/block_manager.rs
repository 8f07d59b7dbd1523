//! Reference-counted KV blocks with a prefix cache: which blocks are free, held, or cached.
//!
//! Every block is in exactly one of three states: free (in `free`), held (reference count
//! above zero; it may also be cached), or idle-cached (count zero, cached, evictable).
//! Allocation takes free blocks first, then evicts idle-cached ones, least recently used first.
//!
//! For a model with recurrent state the manager also owns the state checkpoints: each is
//! free, reserved by one sequence (its step will save into it), or named by a tree node.

use std::time::Instant;

use super::events::KvEventLog;
use super::offload::{OffloadTiers, PrefixFetch};
use super::radix::{Evicted, RadixCache, StatePrefix};
use super::AdapterKey;

mod offloading;

/// Where the state checkpoints are: the rest of `total` is reserved by sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CheckpointCounts {
    pub named: usize,
    pub free: usize,
    pub total: usize,
}

#[derive(Debug)]
pub(crate) struct BlockManager {
    free: Vec<u32>,
    ref_counts: Vec<u32>,
    cache: RadixCache,
    /// Tokens per block when prefix caching is on; `None` turns it off.
    cache_block_size: Option<usize>,
    idle_cached: usize,
    /// Free state checkpoints; `None` for a model without recurrent state, whose prefixes
    /// need none.
    free_checkpoints: Option<Vec<u32>>,
    num_checkpoints: usize,
    /// The offload tiers that keep evicted blocks (see `offloading`); `None`: off.
    offload: Option<OffloadTiers>,
}

impl BlockManager {
    /// `state_checkpoints`: the checkpoints of a model with recurrent state (`None` otherwise).
    pub fn new(
        total: usize,
        cache_block_size: Option<usize>,
        state_checkpoints: Option<usize>,
    ) -> Self {
        Self {
            free: fresh_free_list(total),
            ref_counts: vec![0; total],
            cache: RadixCache::new(),
            cache_block_size,
            idle_cached: 0,
            free_checkpoints: state_checkpoints.map(fresh_free_list),
            num_checkpoints: state_checkpoints.unwrap_or(0),
            offload: None,
        }
    }

    /// Whether cached prefixes are resumed from state checkpoints (a model with recurrent state).
    pub fn keeps_state(&self) -> bool {
        self.free_checkpoints.is_some()
    }

    pub fn checkpoint_counts(&self) -> CheckpointCounts {
        CheckpointCounts {
            named: self.cache.checkpoints(),
            free: self.free_checkpoints.as_ref().map_or(0, Vec::len),
            total: self.num_checkpoints,
        }
    }

    pub fn total(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks an allocation could obtain now (free plus evictable).
    pub fn available(&self) -> usize {
        self.free.len() + self.idle_cached
    }

    /// Blocks held by at least one sequence.
    pub fn used(&self) -> usize {
        self.total() - self.available()
    }

    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// `count` blocks, each held once, or `None` (and nothing changes) when too few are available.
    pub fn allocate(&mut self, count: usize) -> Option<Vec<u32>> {
        if self.available() < count {
            return None;
        }
        let mut blocks = Vec::with_capacity(count);
        let now = Instant::now();
        for _ in 0..count {
            let block = match self.free.pop() {
                Some(block) => block,
                None => {
                    let ref_counts = &self.ref_counts;
                    let Evicted {
                        block,
                        checkpoint,
                        chain,
                        tier_block,
                    } = self
                        .cache
                        .evict_lru(now, |parent| ref_counts[parent as usize] == 0)
                        .expect("invariant: idle cached blocks are evictable");
                    self.idle_cached -= 1;
                    if let Some(offload) = self.offload.as_mut() {
                        offload.save(chain, block, tier_block);
                    }
                    if let Some(checkpoint) = checkpoint {
                        self.free_checkpoint(checkpoint);
                    }
                    metrics::counter!("tandem_prefix_cache_evictions_total").increment(1);
                    block
                }
            };
            self.ref_counts[block as usize] = 1;
            blocks.push(block);
        }
        Some(blocks)
    }

    pub fn retain(&mut self, block: u32) {
        let count = &mut self.ref_counts[block as usize];
        if *count == 0 && self.cache.contains(block) {
            self.idle_cached -= 1;
            self.cache.mark_referenced(block);
        }
        *count += 1;
    }

    pub fn release(&mut self, block: u32) {
        let count = &mut self.ref_counts[block as usize];
        *count -= 1;
        if *count > 0 {
            return;
        }
        if self.cache.contains(block) {
            self.idle_cached += 1;
            self.cache.mark_unreferenced(block);
        } else {
            self.free.push(block);
        }
    }

    /// Held blocks caching the longest whole-block prefix of `tokens` that can be resumed,
    /// leaving at least the last token to compute (its logits are needed); with recurrent
    /// state, the prefix ends at the deepest checkpoint, which it names.
    pub fn acquire_prefix(&mut self, adapter: Option<&AdapterKey>, tokens: &[u32]) -> StatePrefix {
        let Some(block_size) = self.cache_block_size else {
            return StatePrefix::default();
        };
        let max_blocks = reusable_blocks(tokens, block_size);
        let mut prefix = if self.keeps_state() {
            self.cache
                .longest_prefix_with_state(adapter, tokens, block_size, max_blocks)
        } else {
            let blocks = self
                .cache
                .longest_prefix(adapter, tokens, block_size, max_blocks);
            StatePrefix {
                matched_blocks: blocks.len(),
                blocks,
                checkpoint: None,
                fetch: PrefixFetch::None,
            }
        };
        for &block in &prefix.blocks {
            self.retain(block);
        }
        if self.offload.is_some() {
            prefix.fetch = self.extend_from_offload(
                adapter,
                tokens,
                block_size,
                max_blocks,
                &mut prefix.blocks,
            );
            prefix.matched_blocks = prefix.blocks.len();
        }
        prefix
    }

    /// Keeps the cached ones of `blocks` ahead of LRU eviction until `until` (a cache hint).
    pub fn retain_cached(&mut self, blocks: &[u32], until: Instant) {
        for &block in blocks {
            self.cache.retain_until(block, until);
        }
    }

    /// Tokens of `tokens` that `acquire_prefix` would reuse now.
    pub fn cached_prefix_tokens(&self, adapter: Option<&AdapterKey>, tokens: &[u32]) -> usize {
        let Some(block_size) = self.cache_block_size else {
            return 0;
        };
        let max_blocks = reusable_blocks(tokens, block_size);
        let blocks = if self.keeps_state() {
            self.cache
                .peek_prefix_blocks_with_state(adapter, tokens, block_size, max_blocks)
        } else {
            self.cache
                .peek_prefix_blocks(adapter, tokens, block_size, max_blocks)
        };
        blocks * block_size
    }

    /// A checkpoint for a step to save into: a free one, else the least recently used one the
    /// cache names (a restore of it in an earlier step, or earlier in the same step, reads it
    /// before the save overwrites it). `None` without checkpoints.
    pub fn reserve_checkpoint(&mut self) -> Option<u32> {
        let free = self.free_checkpoints.as_mut()?;
        free.pop().or_else(|| self.cache.evict_lru_checkpoint())
    }

    /// Gives back a reserved checkpoint that no node names.
    pub fn free_checkpoint(&mut self, checkpoint: u32) {
        if let Some(free) = self.free_checkpoints.as_mut() {
            free.push(checkpoint);
        }
    }

    /// Names reserved `checkpoint` as holding the state after `prefix` (whole blocks, cached);
    /// frees it when the prefix is not cached or has a checkpoint already. True when named.
    pub fn attach_checkpoint(
        &mut self,
        adapter: Option<&AdapterKey>,
        prefix: &[u32],
        checkpoint: u32,
    ) -> bool {
        let attached = self.cache_block_size.is_some_and(|size| {
            self.cache
                .attach_checkpoint(adapter, prefix, size, checkpoint)
        });
        if !attached {
            self.free_checkpoint(checkpoint);
        }
        attached
    }

    /// Frees `checkpoint` if the node of `prefix` still names it.
    pub fn detach_checkpoint(
        &mut self,
        adapter: Option<&AdapterKey>,
        prefix: &[u32],
        checkpoint: u32,
    ) {
        let detached = self.cache_block_size.is_some_and(|size| {
            self.cache
                .detach_checkpoint(adapter, prefix, size, checkpoint)
        });
        if detached {
            self.free_checkpoint(checkpoint);
        }
    }

    /// Up to `max_tokens` tokens an earlier sequence computed after `tokens`, from the prefix
    /// cache (empty without one).
    pub fn cached_continuation(
        &self,
        adapter: Option<&AdapterKey>,
        tokens: &[u32],
        max_tokens: usize,
    ) -> Vec<u32> {
        match self.cache_block_size {
            Some(block_size) => self
                .cache
                .continuation(adapter, tokens, block_size, max_tokens),
            None => Vec::new(),
        }
    }

    /// Caches `block` as holding `key` after the prefix ending at `parent`; false when it
    /// cannot (caching off, parent not cached, or the same run is cached elsewhere).
    pub fn publish(
        &mut self,
        adapter: Option<&AdapterKey>,
        parent: Option<u32>,
        key: &[u32],
        block: u32,
    ) -> bool {
        self.cache_block_size.is_some() && self.cache.insert(adapter, parent, key, block)
    }

    /// Records the prefix cache's stored, removed and cleared blocks into `log` (and, for a
    /// model with recurrent state, its state checkpoints, each event naming its cache group).
    pub fn record_events(&mut self, log: KvEventLog) {
        let log = if self.keeps_state() {
            log.with_cache_groups()
        } else {
            log
        };
        if let Some(offload) = self.offload.as_mut() {
            offload.record_events(log.clone());
        }
        self.cache.record_events(log);
    }

    pub fn cache_block_size(&self) -> Option<usize> {
        self.cache_block_size
    }

    /// Forgets every cached prefix.
    #[cfg(test)]
    pub fn clear_cache(&mut self) {
        let (blocks, checkpoints) = self.cache.clear();
        for checkpoint in checkpoints {
            self.free_checkpoint(checkpoint);
        }
        for block in blocks {
            if self.ref_counts[block as usize] == 0 {
                self.free.push(block);
            }
        }
        self.idle_cached = 0;
    }

    /// Starts over with `total` free blocks and `state_checkpoints` free checkpoints (for a
    /// model with recurrent state); refused while any block is held.
    pub fn reset(&mut self, total: usize, state_checkpoints: Option<usize>) -> bool {
        if self.used() > 0 {
            return false;
        }
        let events = self.cache.take_events();
        let offload = self.offload.as_ref().map(OffloadTiers::slots);
        *self = Self::new(total, self.cache_block_size, state_checkpoints);
        if let Some(slots) = offload {
            self.enable_offload(slots);
        }
        if let Some(log) = events {
            log.cleared();
            if let Some(offload) = self.offload.as_mut() {
                offload.record_events(log.clone());
            }
            self.cache.record_events(log);
        }
        true
    }
}

/// Whole blocks of `tokens` a cache hit may cover: the last token is always computed.
fn reusable_blocks(tokens: &[u32], block_size: usize) -> usize {
    tokens.len().saturating_sub(1) / block_size
}

/// Reversed so that `pop` hands out low ids first.
fn fresh_free_list(total: usize) -> Vec<u32> {
    let ids = u32::try_from(total).unwrap_or(u32::MAX);
    (0..ids).rev().collect()
}
