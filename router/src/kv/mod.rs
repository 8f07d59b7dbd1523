//! KV cache blocks: the router owns every block id; the shards only store what is written
//! there. Full blocks are cached by token prefix so requests sharing a prefix share blocks.

mod block_manager;
mod block_pool;
pub mod events;
mod radix;
#[cfg(test)]
mod tests;

pub use block_manager::CheckpointCounts;
pub use block_pool::{AdoptedPrefix, BlockPool, BlockTable};
