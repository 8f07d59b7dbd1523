//! KV cache blocks: the router owns every block id; the shards only store what is written there.

mod block_pool;

pub use block_pool::{BlockPool, BlockTable};
