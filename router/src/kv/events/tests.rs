//! Event recording: what the prefix cache stores, evicts and clears becomes vLLM-format events
//! whose hashes chain by parent.

use std::collections::HashSet;
use std::sync::Arc;

use super::block_hash::{external, BlockHasher};
use super::event_log::{CacheGroup, KvEvent, KvEventLog, KvEventQueue};
use crate::kv::{AdapterKey, BlockPool};

const BLOCK_SIZE: usize = 2;
const SEED: &str = "0";

fn recording_pool(blocks: usize) -> (BlockPool, Arc<KvEventQueue>) {
    let pool = BlockPool::with_prefix_cache(blocks, Some(BLOCK_SIZE));
    let queue = KvEventQueue::new(64);
    pool.record_events(KvEventLog::new(BlockHasher::new(SEED), Arc::clone(&queue)));
    (pool, queue)
}

/// Computes and caches `tokens` in a table of its own, as the scheduler does after a prefill.
fn cache_prompt(pool: &BlockPool, tokens: &[u32]) {
    let mut table = pool.new_table();
    table.adopt_cached_prefix(tokens);
    let missing = tokens.len().div_ceil(BLOCK_SIZE) - table.len();
    table.grow(missing).expect("the pool has room");
    table.publish(tokens, tokens.len());
}

fn drain(queue: &KvEventQueue) -> Vec<KvEvent> {
    queue.lock().drain(..).collect()
}

/// The hashes consumers compute for the whole blocks of `tokens`.
fn chain(tokens: &[u32]) -> Vec<u64> {
    let hasher = BlockHasher::new(SEED);
    let mut parent = None;
    tokens
        .chunks_exact(BLOCK_SIZE)
        .map(|block| {
            let digest = hasher.block(parent.as_ref(), block, None);
            parent = Some(digest);
            external(&digest)
        })
        .collect()
}

#[test]
fn caching_a_prompt_stores_its_whole_blocks_as_one_chained_event() {
    let (pool, queue) = recording_pool(8);
    cache_prompt(&pool, &[1, 2, 3, 4, 5]);
    assert_eq!(
        drain(&queue),
        [KvEvent::BlockStored {
            lora: None,
            block_hashes: chain(&[1, 2, 3, 4]),
            parent_block_hash: None,
            token_ids: vec![1, 2, 3, 4],
            block_size: BLOCK_SIZE,
            group: None,
        }]
    );
}

#[test]
fn a_shared_prefix_is_stored_once_and_the_rest_chains_from_it() {
    let (pool, queue) = recording_pool(8);
    cache_prompt(&pool, &[1, 2, 3, 4, 9]);
    drain(&queue);
    cache_prompt(&pool, &[1, 2, 3, 4, 7, 8, 9]);
    let [first, second, third] = chain(&[1, 2, 3, 4, 7, 8])[..] else {
        panic!("three whole blocks")
    };
    assert_ne!(chain(&[1, 2, 3, 4])[..], [first, third]);
    assert_eq!(
        drain(&queue),
        [KvEvent::BlockStored {
            lora: None,
            block_hashes: vec![third],
            parent_block_hash: Some(second),
            token_ids: vec![7, 8],
            block_size: BLOCK_SIZE,
            group: None,
        }]
    );
}

#[test]
fn eviction_removes_the_least_recently_used_leaf_first() {
    let (pool, queue) = recording_pool(3);
    cache_prompt(&pool, &[1, 2, 3, 4, 5]);
    drain(&queue);
    let hashes = chain(&[1, 2, 3, 4]);
    let mut table = pool.new_table();
    table
        .grow(3)
        .expect("the two idle cached blocks are evictable");
    assert_eq!(
        drain(&queue),
        [KvEvent::BlockRemoved {
            block_hashes: vec![hashes[1], hashes[0]],
            group: None,
        }]
    );
}

#[test]
fn resetting_the_pool_clears_all_blocks_and_keeps_recording() {
    let (pool, queue) = recording_pool(8);
    cache_prompt(&pool, &[1, 2, 3]);
    drain(&queue);
    assert!(pool.resize(4, None));
    assert_eq!(drain(&queue), [KvEvent::AllBlocksCleared]);
    pool.clear_prefix_cache();
    cache_prompt(&pool, &[1, 2, 3]);
    let events = drain(&queue);
    assert_eq!(events[0], KvEvent::AllBlocksCleared);
    assert!(
        matches!(&events[1], KvEvent::BlockStored { block_hashes, .. } if *block_hashes == chain(&[1, 2]))
    );
}

#[test]
fn stored_minus_removed_is_what_the_cache_holds() {
    let (pool, queue) = recording_pool(6);
    for prompt in [
        &[1, 2, 3, 4, 5][..],
        &[1, 2, 6, 7, 8],
        &[9, 9, 9, 9, 9],
        &[1, 2, 3, 4, 0],
    ] {
        cache_prompt(&pool, prompt);
    }
    let mut held = HashSet::new();
    for event in drain(&queue) {
        match event {
            KvEvent::BlockStored { block_hashes, .. } => held.extend(block_hashes),
            KvEvent::BlockRemoved { block_hashes, .. } => {
                for hash in block_hashes {
                    assert!(held.remove(&hash), "removed a block never stored");
                }
            }
            KvEvent::AllBlocksCleared => held.clear(),
            KvEvent::TierStored { .. } | KvEvent::TierRemoved { .. } => {
                unreachable!("no offload tiers here")
            }
        }
    }
    assert_eq!(held.len(), pool.cached());
}

#[test]
fn a_full_queue_drops_its_oldest_event() {
    let queue = KvEventQueue::new(2);
    queue.push(KvEvent::AllBlocksCleared);
    queue.push(KvEvent::BlockRemoved {
        block_hashes: vec![1],
        group: None,
    });
    queue.push(KvEvent::AllBlocksCleared);
    assert_eq!(
        drain(&queue),
        [
            KvEvent::BlockRemoved {
                block_hashes: vec![1],
                group: None,
            },
            KvEvent::AllBlocksCleared
        ]
    );
}

#[tokio::test]
async fn next_batch_waits_for_an_event_and_takes_all_pending() {
    let queue = KvEventQueue::new(8);
    let waiting = tokio::spawn({
        let queue = Arc::clone(&queue);
        async move { queue.next_batch().await }
    });
    tokio::task::yield_now().await;
    queue.push(KvEvent::AllBlocksCleared);
    assert_eq!(waiting.await.expect("joins"), [KvEvent::AllBlocksCleared]);
}

#[test]
fn a_hybrids_state_checkpoints_are_stored_and_removed_as_their_own_group() {
    let pool = BlockPool::with_state_checkpoints(3, Some(BLOCK_SIZE), Some(1));
    let queue = KvEventQueue::new(64);
    pool.record_events(KvEventLog::new(BlockHasher::new(SEED), Arc::clone(&queue)));
    let tokens = [1, 2, 3, 4, 5];
    let mut table = pool.new_table();
    table.grow(3).expect("the pool has room");
    let checkpoint = table.reserve_checkpoint(4, false);
    assert_eq!(checkpoint, Some(0));
    table.publish(&tokens, tokens.len());
    drop(table);
    let hashes = chain(&[1, 2, 3, 4]);
    assert_eq!(
        drain(&queue),
        [
            KvEvent::BlockStored {
                lora: None,
                block_hashes: hashes.clone(),
                parent_block_hash: None,
                token_ids: vec![1, 2, 3, 4],
                block_size: BLOCK_SIZE,
                group: Some(CacheGroup::Attention),
            },
            KvEvent::BlockStored {
                lora: None,
                block_hashes: vec![hashes[1]],
                parent_block_hash: Some(hashes[0]),
                token_ids: vec![3, 4],
                block_size: BLOCK_SIZE,
                group: Some(CacheGroup::State),
            },
        ]
    );
    // Evicting the checkpointed leaf removes its checkpoint before its block.
    pool.new_table()
        .grow(3)
        .expect("the idle cached blocks are evictable");
    assert_eq!(
        drain(&queue),
        [
            KvEvent::BlockRemoved {
                block_hashes: vec![hashes[1]],
                group: Some(CacheGroup::State),
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![hashes[1], hashes[0]],
                group: Some(CacheGroup::Attention),
            },
        ]
    );
}

#[test]
fn blocks_cached_under_an_adapter_name_it_and_hash_with_it() {
    let (pool, queue) = recording_pool(8);
    let sql = AdapterKey {
        id: 7,
        name: Arc::from("sql"),
    };
    let mut table = pool.new_table_under(Some(sql.clone()));
    table.adopt_cached_prefix(&[1, 2, 3, 4]);
    table.grow(2).expect("the pool has room");
    table.publish(&[1, 2, 3, 4], 4);
    let hasher = BlockHasher::new(SEED);
    let first = hasher.block(None, &[1, 2], Some("sql"));
    let second = hasher.block(Some(&first), &[3, 4], Some("sql"));
    assert_eq!(
        drain(&queue),
        [KvEvent::BlockStored {
            lora: Some(sql),
            block_hashes: vec![external(&first), external(&second)],
            parent_block_hash: None,
            token_ids: vec![1, 2, 3, 4],
            block_size: BLOCK_SIZE,
            group: None,
        }]
    );
}
