//! The offload tiers' events: a block copied into a tier is stored there, a block leaving it
//! is removed from there, each naming its medium as vLLM's events do (`CPU`, `DISK`).

use std::sync::Arc;

use super::block_hash::{external, BlockHasher};
use super::event_log::{KvEvent, KvEventLog, KvEventQueue, TierBlock};
use super::wire::encode_batch;
use crate::kv::{BlockPool, Medium, OffloadSlots};

const BLOCK_SIZE: usize = 2;

/// Each tier event as (stored?, medium, the block's hash as consumers see it).
fn tier_events(queue: &KvEventQueue) -> Vec<(bool, Medium, u64)> {
    queue
        .lock()
        .drain(..)
        .filter_map(|event| match event {
            KvEvent::TierStored { medium, block } => Some((true, medium, external(&block.digest))),
            KvEvent::TierRemoved { medium, digest } => Some((false, medium, external(&digest))),
            _ => None,
        })
        .collect()
}

#[test]
fn blocks_entering_and_leaving_the_offload_tiers_are_events_of_their_medium() {
    let pool = BlockPool::with_prefix_cache(4, Some(BLOCK_SIZE));
    assert!(pool.enable_offload(OffloadSlots { host: 1, disk: 1 }));
    let queue = KvEventQueue::new(64);
    let hasher = BlockHasher::new("0");
    pool.record_events(KvEventLog::new(hasher.clone(), Arc::clone(&queue)));
    let tokens = [1, 2, 3, 4, 5];
    let mut table = pool.new_table();
    table.grow(3).expect("room");
    table.publish(&tokens, tokens.len());
    drop(table);
    let first = hasher.block(None, &[1, 2], None);
    let second = external(&hasher.block(Some(&first), &[3, 4], None));
    let first = external(&first);
    tier_events(&queue);

    // Every block evicted: the second (a leaf) first, then the first, which pushes the
    // second from the one host slot to disk.
    pool.new_table().grow(4).expect("room by eviction");
    assert_eq!(
        tier_events(&queue),
        [
            (true, Medium::Host, second),
            (false, Medium::Host, second),
            (true, Medium::Disk, second),
            (true, Medium::Host, first),
        ]
    );

    // A hit loads the first block back (it leaves the tier) and fetches the second.
    let mut table = pool.new_table();
    table.adopt_cached_prefix(&tokens);
    pool.take_kv_transfers(0);
    pool.kv_transfers_answered(0, &[]);
    assert_eq!(
        tier_events(&queue),
        [
            (false, Medium::Host, first),
            (false, Medium::Disk, second),
            (true, Medium::Host, second),
        ]
    );
}

#[test]
fn a_tier_event_is_written_as_a_block_event_of_its_medium() {
    let block = TierBlock {
        digest: [7; 32],
        parent: None,
        tokens: vec![1, 2],
        lora: None,
    };
    let stored = encode_batch(
        0.0,
        &[KvEvent::TierStored {
            medium: Medium::Disk,
            block,
        }],
    );
    let removed = encode_batch(
        0.0,
        &[KvEvent::TierRemoved {
            medium: Medium::Host,
            digest: [7; 32],
        }],
    );
    let contains =
        |bytes: &[u8], text: &[u8]| bytes.windows(text.len()).any(|window| window == text);
    assert!(contains(&stored, b"BlockStored") && contains(&stored, b"DISK"));
    assert!(contains(&removed, b"BlockRemoved") && contains(&removed, b"CPU"));
    assert!(!contains(&stored, b"GPU") && !contains(&removed, b"GPU"));
}
