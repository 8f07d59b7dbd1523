//! The offload tiers through the block pool: evicted blocks are saved, a later prefix hit loads
//! them back into fresh blocks, a full host tier moves its oldest entries to disk, and a disk
//! hit is fetched for a later step, unless its read fails.

use std::sync::Arc;

use super::{AdapterKey, BlockPool, KvTransfer, Medium, OffloadSlots, PrefixFetch};

const BLOCK_SIZE: usize = 2;
/// Two whole blocks and one more token, whose logits are needed: both blocks are reusable.
const PROMPT: [u32; 5] = [1, 2, 3, 4, 5];
const OTHER: [u32; 5] = [6, 7, 8, 9, 10];

fn pool(blocks: usize, host: usize, disk: usize) -> BlockPool {
    let pool = BlockPool::with_prefix_cache(blocks, Some(BLOCK_SIZE));
    assert!(pool.enable_offload(OffloadSlots { host, disk }));
    pool
}

/// A finished sequence of `tokens` under `adapter`: its whole blocks are cached and idle.
fn finish(pool: &BlockPool, adapter: Option<AdapterKey>, tokens: &[u32]) {
    let mut table = pool.new_table_under(adapter);
    table.adopt_cached_prefix(tokens);
    let missing = tokens.len().div_ceil(BLOCK_SIZE) - table.len();
    table.grow(missing).expect("room for the sequence");
    table.publish(tokens, tokens.len());
}

/// Takes every block and gives them back, evicting every idle cached one.
fn press(pool: &BlockPool) {
    let mut table = pool.new_table();
    table.grow(pool.total()).expect("room by eviction");
}

fn transfer(source: Medium, source_index: u32, target: Medium, target_index: u32) -> KvTransfer {
    KvTransfer {
        source,
        source_index,
        target,
        target_index,
    }
}

#[test]
fn an_evicted_prefix_is_saved_to_host_and_loaded_back_into_fresh_blocks() {
    let pool = pool(4, 4, 0);
    finish(&pool, None, &PROMPT);
    press(&pool);
    let saved = pool.take_kv_transfers(0);
    // Leaves go first: the second block, then the first.
    assert_eq!(
        saved,
        [
            transfer(Medium::Device, 1, Medium::Host, 0),
            transfer(Medium::Device, 0, Medium::Host, 1),
        ]
    );
    assert_eq!(pool.cached_prefix_tokens(None, &PROMPT), 0);

    let mut table = pool.new_table();
    let adopted = table.adopt_cached_prefix(&PROMPT);
    assert_eq!((adopted.tokens, adopted.fetch), (4, PrefixFetch::None));
    let loaded = pool.take_kv_transfers(1);
    assert_eq!(
        loaded,
        [
            transfer(Medium::Host, 1, Medium::Device, table.blocks()[0]),
            transfer(Medium::Host, 0, Medium::Device, table.blocks()[1]),
        ]
    );
    drop(table);
    assert_eq!(
        pool.cached_prefix_tokens(None, &PROMPT),
        4,
        "loaded blocks are cached again"
    );
    assert_eq!(
        pool.offload_slots().map(|(_, used)| used.host),
        Some(0),
        "loaded entries leave the tier"
    );
    press(&pool);
    assert_eq!(
        pool.take_kv_transfers(2).len(),
        2,
        "evicted again, they are saved again"
    );
}

#[test]
fn the_entries_a_hit_loads_stay_in_a_full_host_tier_while_their_blocks_are_allocated() {
    // Two host slots, both the prompt's; every block to load into must be evicted first, and
    // each eviction saves into host memory.
    let pool = pool(2, 2, 0);
    finish(&pool, None, &PROMPT[..4]);
    press(&pool);
    finish(&pool, None, &OTHER[..4]);
    pool.take_kv_transfers(0);
    let mut table = pool.new_table();
    assert_eq!(table.adopt_cached_prefix(&PROMPT).tokens, 4);
    let copies = pool.take_kv_transfers(1);
    let loads: Vec<_> = copies
        .iter()
        .filter(|t| t.target == Medium::Device)
        .collect();
    assert_eq!(loads.len(), 2, "{copies:?}");
}

#[test]
fn a_full_host_tier_moves_its_oldest_entries_to_disk_and_a_disk_hit_waits_for_its_fetch() {
    let pool = pool(4, 2, 4);
    finish(&pool, None, &PROMPT);
    press(&pool);
    finish(&pool, None, &OTHER);
    press(&pool);
    let moves = pool.take_kv_transfers(0);
    assert_eq!(moves.len(), 6, "{moves:?}");
    assert_eq!(
        moves[2..4],
        [
            transfer(Medium::Host, 0, Medium::Disk, 0),
            transfer(Medium::Device, 1, Medium::Host, 0),
        ],
        "the oldest host entry goes to disk before its slot is reused"
    );

    let mut table = pool.new_table();
    let adopted = table.adopt_cached_prefix(&PROMPT);
    assert_eq!((adopted.tokens, adopted.fetch), (0, PrefixFetch::Started));
    let fetches = pool.take_kv_transfers(1);
    assert!(
        fetches
            .iter()
            .all(|t| (t.source, t.target) == (Medium::Disk, Medium::Host)
                || (t.source, t.target) == (Medium::Host, Medium::Disk)),
        "{fetches:?}"
    );
    table.clear();
    let adopted = table.adopt_cached_prefix(&PROMPT);
    assert_eq!(
        (adopted.tokens, adopted.fetch),
        (0, PrefixFetch::Pending),
        "unusable before the step answers"
    );
    table.clear();
    pool.kv_transfers_answered(1, &[]);
    let adopted = table.adopt_cached_prefix(&PROMPT);
    assert_eq!((adopted.tokens, adopted.fetch), (4, PrefixFetch::None));
}

#[test]
fn a_failed_disk_read_drops_the_entry_and_the_prefix_is_computed() {
    // One host slot: the second block (saved first) moves to disk when the first is saved.
    let pool = pool(4, 1, 4);
    finish(&pool, None, &PROMPT);
    press(&pool);
    pool.take_kv_transfers(0);
    let mut table = pool.new_table();
    let adopted = table.adopt_cached_prefix(&PROMPT);
    assert_eq!((adopted.tokens, adopted.fetch), (2, PrefixFetch::Started));
    table.clear();
    let fetches = pool.take_kv_transfers(1);
    let failed: Vec<usize> = fetches
        .iter()
        .enumerate()
        .filter(|(_, t)| t.source == Medium::Disk)
        .map(|(position, _)| position)
        .collect();
    assert!(!failed.is_empty(), "{fetches:?}");
    pool.kv_transfers_answered(1, &failed);
    let adopted = table.adopt_cached_prefix(&PROMPT);
    assert_eq!(
        (adopted.tokens, adopted.fetch),
        (2, PrefixFetch::None),
        "the torn second block is computed"
    );
}

#[test]
fn an_entry_is_loaded_only_under_the_prefix_and_adapter_that_computed_it() {
    let pool = pool(4, 4, 0);
    finish(&pool, None, &PROMPT);
    press(&pool);
    pool.take_kv_transfers(0);
    let adapter = AdapterKey {
        id: 1,
        name: Arc::from("tuned"),
    };
    let mut table = pool.new_table_under(Some(adapter));
    assert_eq!(table.adopt_cached_prefix(&PROMPT).tokens, 0);
    table.clear();
    // The second block's tokens after another first block.
    let mut table = pool.new_table();
    assert_eq!(table.adopt_cached_prefix(&[9, 9, 3, 4, 5]).tokens, 0);
    assert!(pool.take_kv_transfers(1).is_empty());
}

#[test]
fn a_pool_of_a_model_with_recurrent_state_keeps_no_offload_tiers() {
    let pool = BlockPool::with_state_checkpoints(4, Some(BLOCK_SIZE), Some(2));
    assert!(!pool.enable_offload(OffloadSlots { host: 4, disk: 0 }));
    assert_eq!(pool.offload_slots(), None);
}
