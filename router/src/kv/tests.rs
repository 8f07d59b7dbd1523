//! Block accounting and the prefix cache: unit cases and random operation sequences.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::{AdapterKey, BlockPool, BlockTable};

#[test]
fn grow_is_all_or_nothing() {
    let pool = BlockPool::new(4);
    let mut table = pool.new_table();
    assert_eq!(table.grow(3).map(<[u32]>::len), Some(3));
    assert!(table.grow(2).is_none());
    assert_eq!(table.len(), 3);
    assert_eq!(pool.free(), 1);
}

#[test]
fn dropped_table_frees_its_blocks() {
    let pool = BlockPool::new(8);
    {
        let mut table = pool.new_table();
        table.grow(5);
        assert_eq!(pool.used(), 5);
    }
    assert_eq!(pool.used(), 0);
}

#[test]
fn resize_is_refused_while_a_block_is_in_use() {
    let pool = BlockPool::new(4);
    let mut table = pool.new_table();
    table.grow(1);
    assert!(!pool.resize(8, None));
    assert_eq!(pool.total(), 4);
    table.clear();
    assert!(pool.resize(8, None));
    assert_eq!((pool.total(), pool.free()), (8, 8));
    assert_eq!(table.grow(8).map(<[u32]>::len), Some(8));
}

#[test]
fn tables_never_share_a_block_without_the_cache() {
    let pool = BlockPool::new(6);
    let mut a = pool.new_table();
    let mut b = pool.new_table();
    a.grow(3);
    b.grow(3);
    let all: HashSet<u32> = a.blocks().iter().chain(b.blocks()).copied().collect();
    assert_eq!(all.len(), 6);
    a.clear();
    assert_eq!(pool.free(), 3);
    assert!(a.is_empty());
}

fn filled_table(pool: &BlockPool, tokens: &[u32], block_size: usize) -> (BlockTable, usize) {
    let mut table = pool.new_table();
    let hit = table.adopt_cached_prefix(tokens).tokens;
    let missing = tokens.len().div_ceil(block_size) - table.len();
    table.grow(missing).expect("enough blocks");
    table.publish(tokens, tokens.len());
    (table, hit)
}

fn adapter(id: u32, name: &str) -> Option<AdapterKey> {
    Some(AdapterKey {
        id,
        name: Arc::from(name),
    })
}

/// Like `filled_table`, for a sequence under `adapter`.
fn filled_table_under(
    pool: &BlockPool,
    adapter: Option<AdapterKey>,
    tokens: &[u32],
    block_size: usize,
) -> (BlockTable, usize) {
    let mut table = pool.new_table_under(adapter);
    let hit = table.adopt_cached_prefix(tokens).tokens;
    let missing = tokens.len().div_ceil(block_size) - table.len();
    table.grow(missing).expect("enough blocks");
    table.publish(tokens, tokens.len());
    (table, hit)
}

#[test]
fn a_prefix_computed_under_an_adapter_is_reused_only_under_that_adapter() {
    let pool = BlockPool::with_prefix_cache(32, Some(4));
    let tokens: Vec<u32> = (0..13).collect();
    drop(filled_table_under(&pool, adapter(1, "sql"), &tokens, 4));
    assert_eq!(pool.cached_prefix_tokens(None, &tokens), 0);
    assert_eq!(
        pool.cached_prefix_tokens(adapter(2, "chat").as_ref(), &tokens),
        0
    );
    assert_eq!(
        pool.cached_prefix_tokens(adapter(1, "sql").as_ref(), &tokens),
        12
    );
    let (_, hit) = filled_table_under(&pool, None, &tokens, 4);
    assert_eq!(hit, 0, "the base model computes its own blocks");
    let (_, hit) = filled_table_under(&pool, adapter(2, "chat"), &tokens, 4);
    assert_eq!(hit, 0, "another adapter computes its own blocks");
    let (_, hit) = filled_table_under(&pool, adapter(1, "sql"), &tokens, 4);
    assert_eq!(hit, 12);
    assert_eq!(pool.cached(), 9, "three copies of the three whole blocks");
    assert!(pool
        .cached_continuation(adapter(2, "chat").as_ref(), &tokens[..4], 4)
        .starts_with(&[4, 5, 6, 7]));
    assert!(pool
        .cached_continuation(adapter(3, "other").as_ref(), &tokens[..4], 4)
        .is_empty());
}

#[test]
fn an_adapters_idle_blocks_are_evicted_like_the_base_models() {
    let pool = BlockPool::with_prefix_cache(6, Some(2));
    drop(filled_table_under(
        &pool,
        adapter(1, "sql"),
        &[1, 2, 3, 4, 5, 6],
        2,
    ));
    assert_eq!(pool.cached(), 3);
    let mut table = pool.new_table();
    table
        .grow(6)
        .expect("every idle cached block can be evicted");
    assert_eq!(pool.cached(), 0);
    assert_eq!(
        pool.cached_prefix_tokens(adapter(1, "sql").as_ref(), &[1, 2, 3]),
        0
    );
}

#[test]
fn a_second_request_reuses_the_cached_prefix_and_computes_at_least_its_last_token() {
    let pool = BlockPool::with_prefix_cache(16, Some(4));
    let tokens: Vec<u32> = (0..12).collect();
    let (first, hit) = filled_table(&pool, &tokens, 4);
    assert_eq!(hit, 0);
    let (second, hit) = filled_table(&pool, &tokens, 4);
    // 12 tokens = 3 full blocks, but the last token is always computed: 2 blocks are reused.
    assert_eq!(hit, 8);
    assert_eq!(first.blocks()[..2], second.blocks()[..2]);
    assert_ne!(first.blocks()[2], second.blocks()[2]);
    assert_eq!(pool.used(), 4);
}

#[test]
fn finished_prefixes_stay_cached_until_their_blocks_are_needed() {
    let pool = BlockPool::with_prefix_cache(4, Some(2));
    let prompt: Vec<u32> = vec![7, 7, 8, 8, 9];
    drop(filled_table(&pool, &prompt, 2));
    assert_eq!((pool.used(), pool.cached(), pool.free()), (0, 2, 4));
    let (_again, hit) = filled_table(&pool, &prompt, 2);
    assert_eq!(hit, 4);
    let mut other = pool.new_table();
    assert!(
        other.grow(2).is_none(),
        "held cached blocks must never be evicted"
    );
    drop(_again);
    assert_eq!(other.grow(4).map(<[u32]>::len), Some(4));
    assert_eq!(pool.cached(), 0);
}

#[test]
fn eviction_takes_the_least_recently_used_leaf_first() {
    let pool = BlockPool::with_prefix_cache(6, Some(2));
    drop(filled_table(&pool, &[1, 1, 2, 2, 0], 2));
    drop(filled_table(&pool, &[3, 3, 4, 4, 0], 2));
    drop(filled_table(&pool, &[1, 1, 2, 2, 5], 2)); // touches the first prefix again
    let mut taker = pool.new_table();
    taker
        .grow(4)
        .expect("two free blocks and two evictable ones");
    drop(taker);
    assert_eq!(
        filled_table(&pool, &[3, 3, 4, 4, 0], 2).1,
        0,
        "the older prefix was evicted"
    );
    assert_eq!(
        filled_table(&pool, &[1, 1, 2, 2, 0], 2).1,
        4,
        "the recent prefix survived"
    );
}

#[test]
fn the_cache_proposes_what_an_earlier_sequence_computed_after_the_same_tokens() {
    let pool = BlockPool::with_prefix_cache(16, Some(4));
    let earlier: Vec<u32> = (0..14).collect();
    let _earlier = filled_table(&pool, &earlier, 4);
    // Mid-block: the partial block 8 9 must begin a cached block; the walk goes on below it.
    assert_eq!(
        pool.cached_continuation(None, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 8),
        vec![10, 11]
    );
    assert_eq!(
        pool.cached_continuation(None, &[0, 1, 2, 3, 4], 5),
        vec![5, 6, 7, 8, 9]
    );
    assert_eq!(pool.cached_continuation(None, &[0, 1], 3), vec![2, 3, 4]);
    assert!(pool
        .cached_continuation(None, &[0, 1, 2, 3, 4, 9], 4)
        .is_empty());
    assert!(pool
        .cached_continuation(None, &[5, 1, 2, 3, 4], 4)
        .is_empty());
    assert!(pool.cached_continuation(None, &[0, 1, 2, 3], 0).is_empty());
}

#[test]
fn the_most_recently_used_branch_is_proposed_and_a_pool_without_cache_proposes_nothing() {
    let pool = BlockPool::with_prefix_cache(16, Some(2));
    drop(filled_table(&pool, &[1, 2, 3, 4, 5, 6, 0], 2));
    drop(filled_table(&pool, &[1, 2, 3, 7, 8, 9, 0], 2));
    assert_eq!(pool.cached_continuation(None, &[1, 2, 3], 3), vec![7, 8, 9]);
    drop(filled_table(&pool, &[1, 2, 3, 4, 5, 6, 0], 2));
    assert_eq!(pool.cached_continuation(None, &[1, 2, 3], 3), vec![4, 5, 6]);
    let uncached = BlockPool::new(16);
    drop(filled_table(&uncached, &[1, 2, 3, 4, 5], 2));
    assert!(uncached.cached_continuation(None, &[1, 2], 2).is_empty());
}

#[test]
fn clearing_the_cache_forgets_every_prefix() {
    let pool = BlockPool::with_prefix_cache(8, Some(2));
    drop(filled_table(&pool, &[1, 2, 3, 4, 5], 2));
    pool.clear_prefix_cache();
    assert_eq!((pool.cached(), pool.free()), (0, 8));
    assert_eq!(filled_table(&pool, &[1, 2, 3, 4, 5], 2).1, 0);
}

#[derive(Debug, Clone)]
enum Op {
    /// A sequence's tokens, and the cache hint its blocks are retained for, if any (a zero
    /// retention expires at once).
    Start(Vec<u32>, Option<Duration>),
    Finish(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let retention = prop_oneof![
        Just(None),
        Just(Some(Duration::ZERO)),
        Just(Some(Duration::from_secs(3600))),
    ];
    prop_oneof![
        3 => (prop::collection::vec(0u32..3, 1..14), retention)
            .prop_map(|(tokens, retention)| Op::Start(tokens, retention)),
        2 => (0usize..8).prop_map(Op::Finish),
    ]
}

struct Live {
    tokens: Vec<u32>,
    table: BlockTable,
}

/// The tokens block `index` of `live` holds (the last block may be partial).
fn chunk(live: &Live, index: usize, block_size: usize) -> &[u32] {
    let end = ((index + 1) * block_size).min(live.tokens.len());
    &live.tokens[index * block_size..end]
}

fn check_invariants(
    pool: &BlockPool,
    live: &[Live],
    block_size: usize,
) -> Result<(), TestCaseError> {
    let mut content: HashMap<u32, &[u32]> = HashMap::new();
    for request in live {
        for (index, block) in request.table.blocks().iter().enumerate() {
            let tokens = chunk(request, index, block_size);
            if let Some(other) = content.insert(*block, tokens) {
                // A shared block must be a full cached block with identical contents.
                prop_assert_eq!(
                    other,
                    tokens,
                    "block {} is shared by different contents",
                    block
                );
                prop_assert_eq!(tokens.len(), block_size, "a partial block is shared");
            }
        }
    }
    prop_assert_eq!(pool.used(), content.len(), "held-block accounting is off");
    prop_assert!(pool.used() + pool.free() == pool.total());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn random_prefix_traffic_never_shares_wrong_blocks_or_leaks(
        ops in prop::collection::vec(op(), 1..60),
        total in 4usize..24,
        block_size in 1usize..4,
    ) {
        let pool = BlockPool::with_prefix_cache(total, Some(block_size));
        let mut live: Vec<Live> = Vec::new();
        for op in ops {
            match op {
                Op::Start(tokens, retention) => {
                    let mut table = pool.new_table();
                    table.retain_for(retention);
                    let hit = table.adopt_cached_prefix(&tokens).tokens;
                    prop_assert!(hit < tokens.len() && hit.is_multiple_of(block_size));
                    let missing = tokens.len().div_ceil(block_size) - table.len();
                    if table.grow(missing).is_some() {
                        table.publish(&tokens, tokens.len());
                        live.push(Live { tokens, table });
                    }
                }
                Op::Finish(index) if !live.is_empty() => {
                    live.swap_remove(index % live.len());
                }
                Op::Finish(_) => {}
            }
            check_invariants(&pool, &live, block_size)?;
        }
        live.clear();
        prop_assert_eq!(pool.used(), 0);
        prop_assert_eq!(pool.free(), total);
    }
}
