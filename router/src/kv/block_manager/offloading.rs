//! The block manager's side of the offload tiers: evicted blocks are saved (see `allocate`),
//! and a prefix hit continues from the device into the tiers, loading host entries into fresh
//! blocks and fetching disk entries for a later step.

use super::BlockManager;
use crate::kv::offload::{
    chain_key, ChainKey, Hit, KvTransfer, OffloadSlots, OffloadTiers, PrefixFetch,
};
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
        let mut tiers = OffloadTiers::new(slots);
        if let Some(log) = self.cache.events() {
            tiers.record_events(log.clone());
        }
        self.offload = Some(tiers);
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
    /// for a later step, which the answer tells.
    pub(super) fn extend_from_offload(
        &mut self,
        adapter: Option<&AdapterKey>,
        tokens: &[u32],
        block_size: usize,
        max_blocks: usize,
        blocks: &mut Vec<u32>,
    ) -> PrefixFetch {
        let chunks: Vec<&[u32]> = tokens.chunks_exact(block_size).take(max_blocks).collect();
        let mut keys = Vec::with_capacity(chunks.len());
        let mut chain: Option<ChainKey> = None;
        for chunk in &chunks {
            let key = chain_key(chain.as_ref(), adapter, chunk);
            keys.push(key);
            chain = Some(key);
        }
        let Some(offload) = self.offload.as_mut() else {
            return PrefixFetch::None;
        };
        let start = blocks.len().min(keys.len());
        let in_host = keys[start..]
            .iter()
            .take_while(|key| offload.hit(key) == Some(Hit::Host))
            .count();
        let host_run = &keys[start..start + in_host];
        // Pinned, the run's entries stay in host memory while the blocks they load into are
        // allocated (which saves evicted blocks there, pushing older entries out).
        for key in host_run {
            offload.pin(key);
        }
        let mut loaded = 0;
        while loaded < in_host
            && self.load_block(adapter, chunks[start + loaded], &host_run[loaded], blocks)
        {
            loaded += 1;
        }
        let Some(offload) = self.offload.as_mut() else {
            return PrefixFetch::None;
        };
        for key in &host_run[loaded..] {
            offload.unpin(key);
        }
        let next = start + loaded;
        if loaded < in_host || next >= keys.len() {
            return PrefixFetch::None;
        }
        self.fetch_run(&keys[next..])
    }

    /// Loads the pinned host entry `key` into a fresh block cached after `blocks`' last one and
    /// appends it; false when no block can be had.
    fn load_block(
        &mut self,
        adapter: Option<&AdapterKey>,
        chunk: &[u32],
        key: &ChainKey,
        blocks: &mut Vec<u32>,
    ) -> bool {
        let Some(block) = self.allocate(1).and_then(|fresh| fresh.first().copied()) else {
            return false;
        };
        if !self
            .cache
            .insert(adapter, blocks.last().copied(), chunk, block)
        {
            self.release(block);
            return false;
        }
        let loaded = self
            .offload
            .as_mut()
            .is_some_and(|offload| offload.load(key, block));
        debug_assert!(loaded, "a pinned entry stays in host memory");
        blocks.push(block);
        true
    }

    /// Fetches the disk entries among `keys` (a prefix's next blocks, in order), as far as the
    /// tiers hold the chain: `Started` when it queued a read, `Pending` when reads are only on
    /// their way, `None` when nothing is to come.
    fn fetch_run(&mut self, keys: &[ChainKey]) -> PrefixFetch {
        let Some(offload) = self.offload.as_mut() else {
            return PrefixFetch::None;
        };
        let mut fetch = PrefixFetch::None;
        for key in keys {
            match offload.hit(key) {
                Some(Hit::Disk) => {
                    if offload.fetch(key) {
                        fetch = PrefixFetch::Started;
                    }
                }
                Some(Hit::Fetching) if fetch == PrefixFetch::None => fetch = PrefixFetch::Pending,
                Some(Hit::Host | Hit::Fetching) => {}
                None => break,
            }
        }
        fetch
    }
}
