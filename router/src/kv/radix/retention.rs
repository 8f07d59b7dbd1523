//! Cache hints in the radix tree: a client may ask that a prefix outlive LRU eviction for a
//! while (OpenAI's `prompt_cache_retention`, Anthropic's `cache_control` TTL).
//!
//! A hint biases the eviction order and never locks a block: an idle leaf under a hint still
//! in force is evicted only when no other idle leaf remains, the one whose deadline comes
//! first. Once its deadline passes, the leaf goes back to plain LRU order by its last use.

use std::time::Instant;

use super::{NodeId, RadixCache};

impl RadixCache {
    /// Keeps `block`'s node ahead of LRU eviction until `until`, or later if a hint already
    /// does; nothing when the block is not cached.
    pub fn retain_until(&mut self, block: u32, until: Instant) {
        let Some(&id) = self.node_of_block.get(&block) else {
            return;
        };
        let current = self.node(id).retained_until;
        if current.is_some_and(|deadline| deadline >= until) {
            return;
        }
        let queued = self.unqueue_leaf(id);
        self.node_mut(id).retained_until = Some(until);
        if queued {
            self.queue_leaf(id);
        }
    }

    /// Makes `id`, an unreferenced leaf, an eviction candidate in the order its hint says.
    pub(super) fn queue_leaf(&mut self, id: NodeId) {
        let node = self.node(id);
        match node.retained_until {
            Some(until) => self.retained_leaves.insert((until, id)),
            None => self.evictable_leaves.insert((node.last_access, id)),
        };
    }

    /// Withdraws `id` from eviction (referenced again, or no longer a leaf); whether it was a
    /// candidate.
    pub(super) fn unqueue_leaf(&mut self, id: NodeId) -> bool {
        let node = self.node(id);
        match node.retained_until {
            Some(until) => self.retained_leaves.remove(&(until, id)),
            None => self.evictable_leaves.remove(&(node.last_access, id)),
        }
    }

    /// Ends the hint of every idle leaf whose deadline is not after `now`: those leaves are
    /// plain LRU again. (A referenced node's expired hint ends here once it is idle again.)
    pub(super) fn expire_retention(&mut self, now: Instant) {
        while let Some(&(until, id)) = self.retained_leaves.first() {
            if until > now {
                break;
            }
            self.retained_leaves.pop_first();
            let node = self.node_mut(id);
            node.retained_until = None;
            let last_access = node.last_access;
            self.evictable_leaves.insert((last_access, id));
        }
    }
}
