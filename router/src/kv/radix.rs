//! A radix tree over block-sized token runs: which KV blocks hold which token prefixes.
//!
//! Each node is one full block whose key is that block's tokens; a path from the root
//! spells a prefix. Reference counts live in the block manager; this tree only knows
//! which cached nodes are unreferenced leaves, the eviction candidates, ordered LRU.
//!
//! Invariant (kept by the block manager): a referenced node's parent is referenced too,
//! because a sequence that holds a cached block holds the whole path leading to it.
//! Hence every unreferenced cached node can be evicted, leaves first.
//!
//! Blocks computed under a LoRA adapter hang below that adapter's own root, so a prefix is
//! only ever found by requests under the adapter that computed it.
//!
//! A node may also name a state checkpoint (a hybrid model's recurrent state after its
//! prefix; see `state`): the checkpoint lives exactly as long as the node, or less.
//!
//! A node a client asked to keep (a cache hint; see `retention`) is evicted after every
//! other idle leaf until its deadline passes; after that it is an ordinary LRU leaf.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use super::events::{BlockDigest, KvEventLog, TierBlock};
use super::offload::{chain_key, ChainKey};
use super::AdapterKey;

mod retention;
mod state;

pub(crate) use state::StatePrefix;

type NodeId = usize;
/// The base model's root.
const ROOT: NodeId = 0;
/// The block of a root: roots hold none.
const NO_BLOCK: u32 = u32::MAX;

#[derive(Debug)]
struct Node {
    parent: NodeId,
    key: Vec<u32>,
    block: u32,
    children: HashMap<Vec<u32>, NodeId>,
    last_access: u64,
    /// The block's hash in the published chain; zeros while events are off.
    digest: BlockDigest,
    /// The state checkpoint holding the recurrent state after this node's prefix, if any.
    checkpoint: Option<u32>,
    /// The adapter that computed the block (every node below an adapter's root has it).
    adapter: Option<AdapterKey>,
    /// Until when a cache hint keeps the block ahead of LRU eviction, if one does.
    retained_until: Option<Instant>,
    /// The prefix's key in the offload tiers; zeros while offload is off.
    chain: ChainKey,
}

impl Node {
    fn root(adapter: Option<AdapterKey>) -> Self {
        Self {
            parent: ROOT,
            key: Vec::new(),
            block: NO_BLOCK,
            children: HashMap::new(),
            last_access: 0,
            digest: [0; 32],
            checkpoint: None,
            adapter,
            retained_until: None,
            chain: [0; 32],
        }
    }
}

/// What evicting a leaf frees: its block, and its state checkpoint if it had one; `chain`
/// is its prefix's offload key (zeros while offload is off) and `tier_block` the block as
/// KV events name it (while events are on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Evicted {
    pub block: u32,
    pub checkpoint: Option<u32>,
    pub chain: ChainKey,
    pub tier_block: Option<TierBlock>,
}

#[derive(Debug)]
pub(crate) struct RadixCache {
    /// Slot `ROOT` is the root (it holds no block); `None` slots are reusable.
    nodes: Vec<Option<Node>>,
    vacant: Vec<NodeId>,
    /// Each adapter's root by adapter id; made by its first block, kept while the tree lives.
    adapter_roots: HashMap<u32, NodeId>,
    node_of_block: HashMap<u32, NodeId>,
    /// Unreferenced leaves without a retention deadline, by (last access, node): the LRU
    /// eviction order. Invariant: every unreferenced leaf is in exactly one of this set and
    /// `retained_leaves`, as its node's `retained_until` says.
    evictable_leaves: BTreeSet<(u64, NodeId)>,
    /// Unreferenced leaves a cache hint retains, by (deadline, node): evicted only when no
    /// other leaf is, earliest deadline first.
    retained_leaves: BTreeSet<(Instant, NodeId)>,
    /// Nodes holding a state checkpoint by (last access, node): the checkpoints' LRU order.
    checkpointed: BTreeSet<(u64, NodeId)>,
    clock: u64,
    /// Records stored and removed blocks for the KV events publisher when set.
    events: Option<KvEventLog>,
    /// Whether nodes carry their offload chain keys (offload is on).
    chains: bool,
}

impl RadixCache {
    pub fn new() -> Self {
        Self {
            nodes: vec![Some(Node::root(None))],
            vacant: Vec::new(),
            adapter_roots: HashMap::new(),
            node_of_block: HashMap::new(),
            evictable_leaves: BTreeSet::new(),
            retained_leaves: BTreeSet::new(),
            checkpointed: BTreeSet::new(),
            clock: 0,
            events: None,
            chains: false,
        }
    }

    /// Gives every node inserted from now on its offload chain key.
    pub fn keep_chain_keys(&mut self) {
        self.chains = true;
    }

    /// Records every block stored or removed from now on into `log`.
    pub fn record_events(&mut self, log: KvEventLog) {
        self.events = Some(log);
    }

    pub fn events(&self) -> Option<&KvEventLog> {
        self.events.as_ref()
    }

    pub fn take_events(&mut self) -> Option<KvEventLog> {
        self.events.take()
    }

    fn node(&self, id: NodeId) -> &Node {
        self.nodes[id]
            .as_ref()
            .expect("invariant: live node ids point at occupied slots")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes[id]
            .as_mut()
            .expect("invariant: live node ids point at occupied slots")
    }

    /// The root prefixes computed under `adapter` start from, if any is cached.
    fn root(&self, adapter: Option<&AdapterKey>) -> Option<NodeId> {
        match adapter {
            None => Some(ROOT),
            Some(adapter) => self.adapter_roots.get(&adapter.id).copied(),
        }
    }

    fn root_or_insert(&mut self, adapter: Option<&AdapterKey>) -> NodeId {
        if let Some(root) = self.root(adapter) {
            return root;
        }
        let adapter = adapter.expect("invariant: the base model's root always exists");
        let id = self.vacant_slot(Node::root(Some(adapter.clone())));
        self.adapter_roots.insert(adapter.id, id);
        id
    }

    fn is_root(&self, id: NodeId) -> bool {
        self.node(id).block == NO_BLOCK
    }

    fn vacant_slot(&mut self, node: Node) -> NodeId {
        match self.vacant.pop() {
            Some(id) => {
                self.nodes[id] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        }
    }

    pub fn contains(&self, block: u32) -> bool {
        self.node_of_block.contains_key(&block)
    }

    pub fn len(&self) -> usize {
        self.node_of_block.len()
    }

    /// Blocks caching the longest prefix of `tokens` made of whole blocks, at most
    /// `max_blocks` of them; marks them recently used.
    pub fn longest_prefix(
        &mut self,
        adapter: Option<&AdapterKey>,
        tokens: &[u32],
        block_size: usize,
        max_blocks: usize,
    ) -> Vec<u32> {
        self.clock += 1;
        let mut blocks = Vec::new();
        let Some(mut current) = self.root(adapter) else {
            return blocks;
        };
        for chunk in tokens.chunks_exact(block_size).take(max_blocks) {
            let Some(&child) = self.node(current).children.get(chunk) else {
                break;
            };
            self.touch(child);
            blocks.push(self.node(child).block);
            current = child;
        }
        blocks
    }

    /// How many whole blocks of `tokens` are cached (at most `max_blocks`), without marking them used.
    pub fn peek_prefix_blocks(
        &self,
        adapter: Option<&AdapterKey>,
        tokens: &[u32],
        block_size: usize,
        max_blocks: usize,
    ) -> usize {
        let mut matched = 0;
        let Some(mut current) = self.root(adapter) else {
            return matched;
        };
        for chunk in tokens.chunks_exact(block_size).take(max_blocks) {
            let Some(&child) = self.node(current).children.get(chunk) else {
                break;
            };
            matched += 1;
            current = child;
        }
        matched
    }

    /// Up to `max_tokens` tokens that an earlier sequence computed right after `tokens`: the
    /// whole blocks of `tokens` must be cached, its last partial block must begin a cached child,
    /// and the rest follows the most recently used child at each node. Nothing is marked used.
    pub fn continuation(
        &self,
        adapter: Option<&AdapterKey>,
        tokens: &[u32],
        block_size: usize,
        max_tokens: usize,
    ) -> Vec<u32> {
        let whole_blocks = tokens.len() / block_size;
        let Some(mut current) = self.root(adapter) else {
            return Vec::new();
        };
        for chunk in tokens.chunks_exact(block_size) {
            let Some(&child) = self.node(current).children.get(chunk) else {
                return Vec::new();
            };
            current = child;
        }
        let mut start = &tokens[whole_blocks * block_size..];
        let mut proposal = Vec::new();
        while proposal.len() < max_tokens {
            let Some(next) = self.latest_child_starting_with(current, start) else {
                break;
            };
            let key = &self.node(next).key;
            let wanted = max_tokens - proposal.len();
            proposal.extend(key[start.len()..].iter().take(wanted));
            start = &[];
            current = next;
        }
        proposal
    }

    fn latest_child_starting_with(&self, parent: NodeId, start: &[u32]) -> Option<NodeId> {
        self.node(parent)
            .children
            .iter()
            .filter(|(key, _)| key.starts_with(start))
            .max_by_key(|(_, &child)| (self.node(child).last_access, child))
            .map(|(_, &child)| child)
    }

    fn touch(&mut self, id: NodeId) {
        let clock = self.clock;
        let previous = std::mem::replace(&mut self.node_mut(id).last_access, clock);
        if self.evictable_leaves.remove(&(previous, id)) {
            self.evictable_leaves.insert((clock, id));
        }
        if self.checkpointed.remove(&(previous, id)) {
            self.checkpointed.insert((clock, id));
        }
    }

    /// Caches `block` as holding `key`, the run after the prefix ending at `parent_block`
    /// (`None`: at the start of a sequence computed under `adapter`). Returns false when that
    /// prefix is not cached or another block already caches the same run (the caller keeps
    /// its block private).
    pub fn insert(
        &mut self,
        adapter: Option<&AdapterKey>,
        parent_block: Option<u32>,
        key: &[u32],
        block: u32,
    ) -> bool {
        let parent = match parent_block {
            None => self.root_or_insert(adapter),
            Some(parent_block) => match self.node_of_block.get(&parent_block) {
                Some(&parent) => parent,
                None => return false,
            },
        };
        if self.node(parent).children.contains_key(key) || self.contains(block) {
            return false;
        }
        self.clock += 1;
        let adapter = self.node(parent).adapter.clone();
        let digest = match &self.events {
            Some(log) => {
                let parent_digest = (!self.is_root(parent)).then(|| &self.node(parent).digest);
                log.stored(parent_digest, key, adapter.as_ref())
            }
            None => [0; 32],
        };
        let chain = if self.chains {
            let parent_chain = (!self.is_root(parent)).then(|| &self.node(parent).chain);
            chain_key(parent_chain, adapter.as_ref(), key)
        } else {
            [0; 32]
        };
        let node = Node {
            parent,
            key: key.to_vec(),
            block,
            children: HashMap::new(),
            last_access: self.clock,
            digest,
            checkpoint: None,
            adapter,
            retained_until: None,
            chain,
        };
        let id = self.vacant_slot(node);
        self.node_mut(parent).children.insert(key.to_vec(), id);
        self.unqueue_leaf(parent);
        self.node_of_block.insert(block, id);
        true
    }

    /// Records that `block` is no longer referenced: a leaf becomes evictable.
    pub fn mark_unreferenced(&mut self, block: u32) {
        if let Some(&id) = self.node_of_block.get(&block) {
            if self.node(id).children.is_empty() {
                self.queue_leaf(id);
            }
        }
    }

    /// Records that `block` is referenced again: it must not be evicted.
    pub fn mark_referenced(&mut self, block: u32) {
        if let Some(&id) = self.node_of_block.get(&block) {
            self.unqueue_leaf(id);
        }
    }

    /// Removes the least recently used unreferenced leaf, or when every one is retained by a
    /// cache hint still in force at `now`, the one whose retention ends first; returns its
    /// block and checkpoint. `parent_is_free` tells whether a block has no references, to
    /// expose the parent as the next leaf.
    pub fn evict_lru(
        &mut self,
        now: Instant,
        parent_is_free: impl Fn(u32) -> bool,
    ) -> Option<Evicted> {
        self.expire_retention(now);
        let id = match self.evictable_leaves.pop_first() {
            Some((_, id)) => id,
            None => self.retained_leaves.pop_first()?.1,
        };
        let node = self.nodes[id]
            .take()
            .expect("invariant: evictable leaves are live nodes");
        self.checkpointed.remove(&(node.last_access, id));
        self.vacant.push(id);
        self.node_of_block.remove(&node.block);
        if let Some(log) = &self.events {
            if node.checkpoint.is_some() {
                log.state_removed(&node.digest);
            }
            log.removed(&node.digest);
        }
        let tier_block = self.events.is_some().then(|| TierBlock {
            digest: node.digest,
            parent: (!self.is_root(node.parent)).then(|| self.node(node.parent).digest),
            tokens: node.key.clone(),
            lora: node.adapter.clone(),
        });
        let parent = self.node_mut(node.parent);
        parent.children.remove(&node.key);
        let parent_becomes_leaf = parent.children.is_empty();
        let parent_block = parent.block;
        if parent_block != NO_BLOCK && parent_becomes_leaf && parent_is_free(parent_block) {
            self.queue_leaf(node.parent);
        }
        Some(Evicted {
            block: node.block,
            checkpoint: node.checkpoint,
            chain: node.chain,
            tier_block,
        })
    }

    /// Forgets every cached prefix; returns the blocks and the checkpoints.
    #[cfg(test)]
    pub fn clear(&mut self) -> (Vec<u32>, Vec<u32>) {
        let blocks = self.node_of_block.keys().copied().collect();
        let checkpoints = self
            .checkpointed
            .iter()
            .filter_map(|&(_, id)| self.node(id).checkpoint)
            .collect();
        let events = self.events.take();
        let chains = self.chains;
        *self = Self::new();
        self.chains = chains;
        if let Some(log) = events {
            log.cleared();
            self.events = Some(log);
        }
        (blocks, checkpoints)
    }
}
