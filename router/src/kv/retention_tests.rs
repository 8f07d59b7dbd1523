//! Cache hints: a released sequence's blocks under a hint outlive LRU eviction until its
//! deadline, as a bias that memory pressure still overrides.

use std::time::Duration;

use super::{BlockPool, BlockTable};

const BLOCK_SIZE: usize = 2;
const HOUR: Duration = Duration::from_secs(3600);

/// A finished sequence of `tokens` (whole blocks) under `retention`: its blocks are cached and
/// idle.
fn finish(pool: &BlockPool, tokens: &[u32], retention: Option<Duration>) {
    let mut table: BlockTable = pool.new_table();
    table.retain_for(retention);
    table.adopt_cached_prefix(tokens);
    let missing = tokens.len() / BLOCK_SIZE - table.len();
    table.grow(missing).expect("room for the sequence");
    table.publish(tokens, tokens.len());
}

/// Tokens of `prompt` the cache would serve to a request continuing it by one token.
fn cached(pool: &BlockPool, prompt: &[u32]) -> usize {
    let mut query = prompt.to_vec();
    query.push(99);
    pool.cached_prefix_tokens(None, &query)
}

/// Takes `count` blocks and gives them back, evicting that many idle cached ones.
fn press(pool: &BlockPool, count: usize) {
    let mut table = pool.new_table();
    table.grow(count).expect("room by eviction");
}

const OLDER: [u32; 4] = [1, 2, 3, 4];
const NEWER: [u32; 4] = [5, 6, 7, 8];

#[test]
fn a_retained_prefix_outlives_newer_unhinted_ones_under_pressure() {
    let pool = BlockPool::with_prefix_cache(4, Some(BLOCK_SIZE));
    finish(&pool, &OLDER, Some(HOUR));
    finish(&pool, &NEWER, None);
    press(&pool, 2);
    assert_eq!(cached(&pool, &OLDER), 4, "the hinted prefix stays");
    assert_eq!(
        cached(&pool, &NEWER),
        0,
        "the newer, unhinted one went first"
    );
}

#[test]
fn without_a_hint_the_least_recently_used_prefix_goes_first() {
    let pool = BlockPool::with_prefix_cache(4, Some(BLOCK_SIZE));
    finish(&pool, &OLDER, None);
    finish(&pool, &NEWER, None);
    press(&pool, 2);
    assert_eq!((cached(&pool, &OLDER), cached(&pool, &NEWER)), (0, 4));
}

#[test]
fn an_expired_hint_leaves_plain_lru_order() {
    let pool = BlockPool::with_prefix_cache(4, Some(BLOCK_SIZE));
    finish(&pool, &OLDER, Some(Duration::ZERO));
    finish(&pool, &NEWER, None);
    press(&pool, 2);
    assert_eq!((cached(&pool, &OLDER), cached(&pool, &NEWER)), (0, 4));
}

#[test]
fn a_hint_is_never_a_lock_and_the_earliest_deadline_goes_first() {
    let pool = BlockPool::with_prefix_cache(4, Some(BLOCK_SIZE));
    finish(&pool, &OLDER, Some(2 * HOUR));
    finish(&pool, &NEWER, Some(HOUR));
    press(&pool, 2);
    assert_eq!((cached(&pool, &OLDER), cached(&pool, &NEWER)), (4, 0));
    press(&pool, 4);
    assert_eq!(
        cached(&pool, &OLDER),
        0,
        "memory pressure evicts retained blocks too"
    );
    assert_eq!((pool.used(), pool.free()), (0, 4));
}

#[test]
fn a_hit_under_a_hint_renews_the_prefix_it_reused() {
    let pool = BlockPool::with_prefix_cache(4, Some(BLOCK_SIZE));
    finish(&pool, &OLDER, None);
    finish(&pool, &NEWER, None);
    // A later request reusing the older prefix, with a hint, retains it from its own end.
    finish(&pool, &OLDER, Some(HOUR));
    finish(&pool, &NEWER, None);
    press(&pool, 2);
    assert_eq!((cached(&pool, &OLDER), cached(&pool, &NEWER)), (4, 0));
}
