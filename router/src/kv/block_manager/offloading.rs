//! The block manager's side of the offload tiers: evicted blocks are saved (see `allocate`),
//! and a prefix hit continues from the device into the tiers, loading host entries into fresh
//! blocks and fetching disk entries for a later step.

use super::BlockManager;
use crate::kv::offload::{chain_key, ChainKey, Hit, KvTransfer, OffloadSlots, OffloadTiers};
use crate::kv::AdapterKey;

impl BlockManager {
    /// Keeps evicted blocks in tiers of `slots`; ignored without prefix caching or for a model
    /// with recurrent state (whose prefixes resume from state checkpoints the tiers do not
    /// hold). True when on.
    pub fn enable_offload(&mut self, slots: OffloadSlots) -> bool {
        if !slots.is_on() || self.cache_block_size.is_none() || self.keeps_state() {
            return false;
        }
        self.cache.keep_chain_keys();
        self.offload = Some(OffloadTiers::new(slots));
        true
    }

    /// The tiers' slots in all and in use, when offload is on.
    pub fn offload_slots(&self) -> Option<(OffloadSlots, OffloadSlots)> {
        self.offload
            .as_ref()
            .map(|offload| (offload.slots(), offload.used()))
    }

    /// The copies the next step must run first, tagged as step `step_id`'s.
    pub fn take_kv_transfers(&mut self, step_id: u64) -> Vec<KvTransfer> {
        self.offload
            .as_mut()
            .map(|offload| offload.take_transfers(step_id))
            .unwrap_or_default()
    }

    /// Step `step_id` answered; `failed`: positions of its transfers whose disk reads failed.
    pub fn kv_transfers_answered(&mut self, step_id: u64, failed: &[usize]) {
        if let Some(offload) = self.offload.as_mut() {
            offload.answered(step_id, failed);
        }
    }

    /// Extends `blocks` (held, caching `tokens`' first whole blocks) with the blocks after them
    /// that the host tier holds, each loaded into a fresh block cached as the prefix's next one,
    /// up to `max_blocks` in all. When the chain goes on in the disk tier, its entries are fetched
    /// for a later step and the answer is true: the request should wait for them.
    pub(super) fn extend_from_offload(
        &mut self,
        adapter: Option<&AdapterKey>,
        tokens: &[u32],
        block_size: usize,
        max_blocks: usize,
        blocks: &mut Vec<u32>,
    ) -> bool {
        let chunks: Vec<&[u32]> = tokens.chunks_exact(block_size).take(max_blocks).collect();
        let mut chain: Option<ChainKey> = None;
        for (index, chunk) in chunks.iter().enumerate() {
            let key = chain_key(chain.as_ref(), adapter, chunk);
            chain = Some(key);
            if index < blocks.len() {
                continue;
            }
            match self.offload.as_ref().and_then(|offload| offload.hit(&key)) {
                Some(Hit::Host) => {
                    if !self.load_block(adapter, chunk, &key, blocks) {
                        return false;
                    }
                }
                Some(Hit::Disk | Hit::Fetching) => {
                    self.fetch_run(adapter, &chunks[index..], key);
                    return true;
                }
                None => return false,
            }
        }
        false
    }

    /// Loads the host entry `key` into a fresh block cached after `blocks`' last one and
    /// appends it; false when no block can be had or the entry left host memory meanwhile.
    fn load_block(
        &mut self,
        adapter: Option<&AdapterKey>,
        chunk: &[u32],
        key: &ChainKey,
        blocks: &mut Vec<u32>,
    ) -> bool {
        // Allocating may evict and save other blocks, which may push `key` out of host memory:
        // the load is queued only if it is still there, after those copies.
        let Some(block) = self.allocate(1).and_then(|fresh| fresh.first().copied()) else {
            return false;
        };
        let loaded = self
            .offload
            .as_mut()
            .is_some_and(|offload| offload.load(key, block));
        if !loaded
            || !self
                .cache
                .insert(adapter, blocks.last().copied(), chunk, block)
        {
            self.release(block);
            return false;
        }
        blocks.push(block);
        true
    }

    /// Fetches the disk entries of the run of tier entries starting at `chunks[0]` (whose key
    /// is `first`), as far as the tiers hold the chain.
    fn fetch_run(&mut self, adapter: Option<&AdapterKey>, chunks: &[&[u32]], first: ChainKey) {
        let Some(offload) = self.offload.as_mut() else {
            return;
        };
        let mut key = first;
        for (index, chunk) in chunks.iter().enumerate() {
            if index > 0 {
                key = chain_key(Some(&key), adapter, chunk);
            }
            match offload.hit(&key) {
                Some(Hit::Disk) => {
                    offload.fetch(&key);
                }
                Some(Hit::Host | Hit::Fetching) => {}
                None => return,
            }
        }
    }
}
