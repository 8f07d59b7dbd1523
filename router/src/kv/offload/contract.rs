//! What the router and the shards say about the offload tiers: where a block is copied from
//! and to, how many slots each tier has, and the key an entry is found by.

use sha2::{Digest, Sha256};

use crate::kv::AdapterKey;

/// A block's prefix: sha256 over the previous block's key, the adapter and the block's tokens.
pub(crate) type ChainKey = [u8; 32];

/// The chain key of the block holding `tokens` after the prefix whose last block has `parent`
/// (`None`: a sequence's first block), computed under `adapter`.
pub(crate) fn chain_key(
    parent: Option<&ChainKey>,
    adapter: Option<&AdapterKey>,
    tokens: &[u32],
) -> ChainKey {
    let mut hasher = Sha256::new();
    hasher.update(parent.unwrap_or(&[0; 32]));
    hasher.update(
        adapter
            .map_or(u64::MAX, |adapter| u64::from(adapter.id))
            .to_le_bytes(),
    );
    for token in tokens {
        hasher.update(token.to_le_bytes());
    }
    hasher.finalize().into()
}

/// Where a transfer reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Medium {
    Device,
    Host,
    Disk,
}

impl Medium {
    /// The label of metrics and KV events: vLLM's medium names (its device tier is "GPU",
    /// which the KV cache is called on the CPU too).
    pub fn label(self) -> &'static str {
        match self {
            Self::Device => "GPU",
            Self::Host => "CPU",
            Self::Disk => "DISK",
        }
    }
}

/// One block copied from `source` slot `source_index` to `target` slot `target_index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvTransfer {
    pub source: Medium,
    pub source_index: u32,
    pub target: Medium,
    pub target_index: u32,
}

/// Slots of each tier, as the shards allocated them (0: the tier is off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OffloadSlots {
    pub host: usize,
    pub disk: usize,
}

impl OffloadSlots {
    pub fn is_on(self) -> bool {
        self.host > 0
    }
}

/// Whether the blocks that continue a prefix are on their way from the disk tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefixFetch {
    /// No: the prefix ends where the tiers end.
    #[default]
    None,
    /// Their reads were queued just now, for the next step.
    Started,
    /// Their reads are in a step not yet answered (queued by an earlier request or attempt).
    Pending,
}

/// What a tier holds for one prefix block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hit {
    /// In host memory: it can be loaded into a KV block in this step.
    Host,
    /// On disk: it must be fetched into host memory first (one step).
    Disk,
    /// Its fetch is on the way.
    Fetching,
}
