//! State checkpoints in the radix tree, for models whose layers keep a recurrent state.
//!
//! Such a model resumes after a cached prefix only from a node whose checkpoint holds the
//! state after exactly that prefix: its blocks beyond the deepest checkpoint are recomputed.
//! A checkpoint depends on its node's whole path, which outlives it: a node is evicted
//! only as a leaf, and evicting it frees its checkpoint.

use super::{NodeId, RadixCache};
use crate::kv::offload::PrefixFetch;
use crate::kv::AdapterKey;

/// The longest cached prefix a request with recurrent state can resume after.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct StatePrefix {
    /// Blocks up to and including the deepest node with a checkpoint.
    pub blocks: Vec<u32>,
    /// That node's checkpoint (`None` when no node on the path has one, and `blocks` is empty).
    pub checkpoint: Option<u32>,
    /// Whole blocks of the prefix cached, with a checkpoint or not.
    pub matched_blocks: usize,
    /// Whether the offload tiers are fetching blocks that continue the prefix from disk:
    /// waiting a step for them saves their computation.
    pub fetch: PrefixFetch,
}

impl RadixCache {
    /// The nodes spelling `tokens`' whole blocks from the root, at most `max_blocks` of them,
    /// as far as they are cached.
    fn path(
        &self,
        adapter: Option<&AdapterKey>,
        tokens: &[u32],
        block_size: usize,
        max_blocks: usize,
    ) -> Vec<NodeId> {
        let mut path = Vec::new();
        let Some(mut current) = self.root(adapter) else {
            return path;
        };
        for chunk in tokens.chunks_exact(block_size).take(max_blocks) {
            let Some(&child) = self.node(current).children.get(chunk) else {
                break;
            };
            path.push(child);
            current = child;
        }
        path
    }

    /// The node whose prefix is exactly `prefix` (whole blocks), if cached.
    fn node_at(
        &self,
        adapter: Option<&AdapterKey>,
        prefix: &[u32],
        block_size: usize,
    ) -> Option<NodeId> {
        let whole = prefix.len() / block_size;
        if !prefix.len().is_multiple_of(block_size) || whole == 0 {
            return None;
        }
        let path = self.path(adapter, prefix, block_size, whole);
        (path.len() == whole).then(|| path[whole - 1])
    }

    /// Like `longest_prefix`, but ending at the deepest node with a checkpoint; marks the
    /// blocks it returns (and the checkpoint) recently used.
    pub fn longest_prefix_with_state(
        &mut self,
        adapter: Option<&AdapterKey>,
        tokens: &[u32],
        block_size: usize,
        max_blocks: usize,
    ) -> StatePrefix {
        let path = self.path(adapter, tokens, block_size, max_blocks);
        let usable = path
            .iter()
            .rposition(|&id| self.node(id).checkpoint.is_some())
            .map_or(0, |index| index + 1);
        self.clock += 1;
        for &id in &path[..usable] {
            self.touch(id);
        }
        StatePrefix {
            blocks: path[..usable]
                .iter()
                .map(|&id| self.node(id).block)
                .collect(),
            checkpoint: usable
                .checked_sub(1)
                .and_then(|last| self.node(path[last]).checkpoint),
            matched_blocks: path.len(),
            fetch: PrefixFetch::None,
        }
    }

    /// How many whole blocks of `tokens` (at most `max_blocks`) a request with recurrent state
    /// could resume after now, without marking anything used.
    pub fn peek_prefix_blocks_with_state(
        &self,
        adapter: Option<&AdapterKey>,
        tokens: &[u32],
        block_size: usize,
        max_blocks: usize,
    ) -> usize {
        let path = self.path(adapter, tokens, block_size, max_blocks);
        path.iter()
            .rposition(|&id| self.node(id).checkpoint.is_some())
            .map_or(0, |index| index + 1)
    }

    /// Names `checkpoint` as holding the state after `prefix` (whole blocks). False when that
    /// prefix is not cached or already has a checkpoint: the caller keeps `checkpoint` free.
    pub fn attach_checkpoint(
        &mut self,
        adapter: Option<&AdapterKey>,
        prefix: &[u32],
        block_size: usize,
        checkpoint: u32,
    ) -> bool {
        let Some(id) = self.node_at(adapter, prefix, block_size) else {
            return false;
        };
        let node = self.node_mut(id);
        if node.checkpoint.is_some() {
            return false;
        }
        node.checkpoint = Some(checkpoint);
        let access = node.last_access;
        self.checkpointed.insert((access, id));
        if let Some(log) = &self.events {
            let node = self.node(id);
            let parent = (!self.is_root(node.parent)).then(|| &self.node(node.parent).digest);
            log.state_stored(parent, &node.digest, &node.key, node.adapter.as_ref());
        }
        true
    }

    /// Removes `checkpoint` from the node of `prefix` if that node still names it; true when
    /// it did (the caller frees the checkpoint).
    pub fn detach_checkpoint(
        &mut self,
        adapter: Option<&AdapterKey>,
        prefix: &[u32],
        block_size: usize,
        checkpoint: u32,
    ) -> bool {
        let Some(id) = self.node_at(adapter, prefix, block_size) else {
            return false;
        };
        let node = self.node_mut(id);
        if node.checkpoint != Some(checkpoint) {
            return false;
        }
        node.checkpoint = None;
        let access = node.last_access;
        self.checkpointed.remove(&(access, id));
        self.record_state_removed(id);
        true
    }

    fn record_state_removed(&self, id: NodeId) {
        if let Some(log) = &self.events {
            log.state_removed(&self.node(id).digest);
        }
    }

    /// Takes the least recently used checkpoint off its node (the node's blocks stay cached).
    pub fn evict_lru_checkpoint(&mut self) -> Option<u32> {
        let (_, id) = self.checkpointed.pop_first()?;
        self.record_state_removed(id);
        self.node_mut(id).checkpoint.take()
    }

    /// Checkpoints named by the tree.
    pub fn checkpoints(&self) -> usize {
        self.checkpointed.len()
    }
}
