//! KV cache blocks: the router owns every block id; the shards only store what is written
//! there. Full blocks are cached by token prefix so requests sharing a prefix share blocks.

mod block_manager;
mod block_pool;
pub mod events;
mod image_keys;
mod offload;
#[cfg(test)]
mod offload_tests;
mod radix;
#[cfg(test)]
mod retention_tests;
#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use block_manager::CheckpointCounts;
pub use block_pool::{AdoptedPrefix, BlockPool, BlockTable};
pub use image_keys::{cache_keys, is_image_key};
pub use offload::{
    describe_metrics as describe_offload_metrics, KvTransfer, Medium, OffloadSlots, PrefixFetch,
};

/// The LoRA adapter whose weights computed a block. Blocks are shared only between requests under
/// the same adapter, or under none (the base model). `id` never names another adapter while the
/// router runs, even after this one is unloaded.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AdapterKey {
    pub id: u32,
    pub name: Arc<str>,
}
