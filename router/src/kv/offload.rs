//! The KV offload tiers behind the prefix cache: a block evicted from the KV cache is kept in a
//! bounded host-memory tier, and a host entry pushed out of it in an optional disk tier, each
//! LRU. A later prefix hit in a tier is copied back instead of being recomputed.
//!
//! The router owns the index (which prefix each slot holds); the shards own the bytes and run
//! the copies this index queues, in queue order, before the rest of the step that carries them.
//! Entries are keyed by their prefix's chain key (the adapter and every token up to the block's
//! end), so an entry is only ever loaded under the prefix that computed it.
//!
//! Invariants: every entry is in exactly one place; a host entry is in `host_lru` unless pinned
//! (while a prefix hit loads it), a disk entry in `disk_lru`, and a fetching entry (a disk read in
//! a step not yet answered) in neither, so it is never pushed out while its read is on the way.
//! Each slot is free or owned by one entry. A block loaded back leaves the tiers: it lives in the
//! KV cache again, and is saved anew when evicted again.

use std::collections::{BTreeSet, HashMap};

use super::events::{KvEventLog, TierBlock};

mod contract;
mod series;

pub(crate) use contract::{chain_key, ChainKey, Hit};
pub use contract::{KvTransfer, Medium, OffloadSlots, PrefixFetch};
pub use series::describe_metrics;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Host(u32),
    Disk(u32),
    Fetching { host: u32, disk: u32 },
}

#[derive(Debug)]
struct Entry {
    place: Place,
    last_use: u64,
    /// The block as KV events name it (while events are on).
    event: Option<TierBlock>,
}

/// A fetch queued or sent: its entry and its position in its step's transfers.
#[derive(Debug, Clone, Copy)]
struct SentFetch {
    step_id: Option<u64>,
    position: usize,
    key: ChainKey,
}

#[derive(Debug)]
pub(crate) struct OffloadTiers {
    slots: OffloadSlots,
    entries: HashMap<ChainKey, Entry>,
    free_host: Vec<u32>,
    free_disk: Vec<u32>,
    host_lru: BTreeSet<(u64, ChainKey)>,
    disk_lru: BTreeSet<(u64, ChainKey)>,
    /// Copies for the next step, in the order the shards must run them.
    queued: Vec<KvTransfer>,
    fetches: Vec<SentFetch>,
    clock: u64,
    /// Records blocks entering and leaving each tier for the KV events publisher when set.
    events: Option<KvEventLog>,
}

impl OffloadTiers {
    pub fn new(slots: OffloadSlots) -> Self {
        for (medium, count) in [(Medium::Host, slots.host), (Medium::Disk, slots.disk)] {
            metrics::gauge!("tandem_kv_offload_slots", "medium" => medium.label())
                .set(count as f64);
        }
        Self {
            slots,
            entries: HashMap::new(),
            free_host: fresh_slots(slots.host),
            free_disk: fresh_slots(slots.disk),
            host_lru: BTreeSet::new(),
            disk_lru: BTreeSet::new(),
            queued: Vec::new(),
            fetches: Vec::new(),
            clock: 0,
            events: None,
        }
    }

    /// Records every block entering or leaving a tier from now on into `log`.
    pub fn record_events(&mut self, log: KvEventLog) {
        self.events = Some(log);
    }

    fn stored_event(&self, medium: Medium, block: Option<&TierBlock>) {
        if let (Some(log), Some(block)) = (&self.events, block) {
            log.tier_stored(medium, block);
        }
    }

    fn removed_event(&self, medium: Medium, block: Option<&TierBlock>) {
        if let (Some(log), Some(block)) = (&self.events, block) {
            log.tier_removed(medium, &block.digest);
        }
    }

    pub fn slots(&self) -> OffloadSlots {
        self.slots
    }

    /// Entries in host memory (fetching ones included) and on disk.
    pub fn used(&self) -> OffloadSlots {
        OffloadSlots {
            host: self.slots.host - self.free_host.len(),
            disk: self.slots.disk - self.free_disk.len(),
        }
    }

    pub fn hit(&self, key: &ChainKey) -> Option<Hit> {
        self.entries.get(key).map(|entry| match entry.place {
            Place::Host(_) => Hit::Host,
            Place::Disk(_) => Hit::Disk,
            Place::Fetching { .. } => Hit::Fetching,
        })
    }

    /// Keeps the contents of KV block `block`, about to be reused, as `key`'s entry: a copy
    /// into host memory, unless a tier already holds that prefix (then it is only marked used).
    pub fn save(&mut self, key: ChainKey, block: u32, event: Option<TierBlock>) {
        if self.entries.contains_key(&key) {
            self.touch(&key);
            return;
        }
        let Some(slot) = self.host_slot() else {
            return;
        };
        self.queued.push(KvTransfer {
            source: Medium::Device,
            source_index: block,
            target: Medium::Host,
            target_index: slot,
        });
        self.clock += 1;
        self.host_lru.insert((self.clock, key));
        self.stored_event(Medium::Host, event.as_ref());
        self.entries.insert(
            key,
            Entry {
                place: Place::Host(slot),
                last_use: self.clock,
                event,
            },
        );
        metrics::counter!("tandem_kv_offload_stored_blocks_total", "medium" => Medium::Host.label())
            .increment(1);
    }

    /// Keeps `key`'s host entry from being pushed out until `load` or `unpin`.
    pub fn pin(&mut self, key: &ChainKey) {
        if let Some(entry) = self.entries.get(key) {
            if matches!(entry.place, Place::Host(_)) {
                self.host_lru.remove(&(entry.last_use, *key));
            }
        }
    }

    /// Lets a pinned host entry be pushed out again.
    pub fn unpin(&mut self, key: &ChainKey) {
        if let Some(entry) = self.entries.get(key) {
            if matches!(entry.place, Place::Host(_)) {
                self.host_lru.insert((entry.last_use, *key));
            }
        }
    }

    /// Queues the copy of `key`'s host entry into KV block `block`, which the prefix cache holds
    /// from then on: the entry leaves the tier and its slot is free for the next copy out (each
    /// block lives in one place; evicted again, it is saved again). False (nothing queued)
    /// unless the entry is in host memory.
    pub fn load(&mut self, key: &ChainKey, block: u32) -> bool {
        let Some(&Entry {
            place: Place::Host(slot),
            last_use,
            ..
        }) = self.entries.get(key)
        else {
            return false;
        };
        let entry = self.entries.remove(key);
        self.removed_event(Medium::Host, entry.and_then(|entry| entry.event).as_ref());
        self.host_lru.remove(&(last_use, *key));
        self.free_host.push(slot);
        self.queued.push(KvTransfer {
            source: Medium::Host,
            source_index: slot,
            target: Medium::Device,
            target_index: block,
        });
        metrics::counter!("tandem_kv_offload_loaded_blocks_total", "medium" => Medium::Host.label())
            .increment(1);
        true
    }

    /// Queues the read of `key`'s disk entry into a host slot; it is usable once the step
    /// carrying the read has answered (see `answered`). False unless the entry is on disk.
    pub fn fetch(&mut self, key: &ChainKey) -> bool {
        let Some(Place::Disk(disk)) = self.entries.get(key).map(|entry| entry.place) else {
            return false;
        };
        let last_use = self.entries[key].last_use;
        self.disk_lru.remove(&(last_use, *key));
        let Some(host) = self.host_slot() else {
            self.disk_lru.insert((last_use, *key));
            return false;
        };
        self.fetches.push(SentFetch {
            step_id: None,
            position: self.queued.len(),
            key: *key,
        });
        self.queued.push(KvTransfer {
            source: Medium::Disk,
            source_index: disk,
            target: Medium::Host,
            target_index: host,
        });
        let entry = self
            .entries
            .get_mut(key)
            .expect("invariant: the entry was just read");
        entry.place = Place::Fetching { host, disk };
        metrics::counter!("tandem_kv_offload_loaded_blocks_total", "medium" => Medium::Disk.label())
            .increment(1);
        true
    }

    /// The copies queued since the last call, for step `step_id` to carry.
    pub fn take_transfers(&mut self, step_id: u64) -> Vec<KvTransfer> {
        for fetch in &mut self.fetches {
            fetch.step_id.get_or_insert(step_id);
        }
        let used = self.used();
        for (medium, count) in [(Medium::Host, used.host), (Medium::Disk, used.disk)] {
            metrics::gauge!("tandem_kv_offload_used_slots", "medium" => medium.label())
                .set(count as f64);
        }
        std::mem::take(&mut self.queued)
    }

    /// Step `step_id` answered: its fetches arrived in host memory, except those at the
    /// positions in `failed` (missing or torn on disk), whose entries are dropped.
    pub fn answered(&mut self, step_id: u64, failed: &[usize]) {
        let (done, waiting): (Vec<_>, Vec<_>) = self
            .fetches
            .drain(..)
            .partition(|fetch| fetch.step_id.is_some_and(|id| id <= step_id));
        self.fetches = waiting;
        for fetch in done {
            let Some(entry) = self.entries.get_mut(&fetch.key) else {
                continue;
            };
            let Place::Fetching { host, disk } = entry.place else {
                continue;
            };
            self.free_disk.push(disk);
            if fetch.step_id == Some(step_id) && failed.contains(&fetch.position) {
                let event = self
                    .entries
                    .remove(&fetch.key)
                    .and_then(|entry| entry.event);
                self.free_host.push(host);
                self.removed_event(Medium::Disk, event.as_ref());
                metrics::counter!("tandem_kv_offload_failed_reads_total").increment(1);
            } else {
                entry.place = Place::Host(host);
                let (last_use, event) = (entry.last_use, entry.event.clone());
                self.host_lru.insert((last_use, fetch.key));
                self.removed_event(Medium::Disk, event.as_ref());
                self.stored_event(Medium::Host, event.as_ref());
            }
        }
    }

    fn touch(&mut self, key: &ChainKey) {
        self.clock += 1;
        let clock = self.clock;
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let previous = std::mem::replace(&mut entry.last_use, clock);
        match entry.place {
            Place::Host(_) => {
                self.host_lru.remove(&(previous, *key));
                self.host_lru.insert((clock, *key));
            }
            Place::Disk(_) => {
                self.disk_lru.remove(&(previous, *key));
                self.disk_lru.insert((clock, *key));
            }
            Place::Fetching { .. } => {}
        }
    }

    /// A free host slot, made by moving the least recently used host entry to disk (or
    /// dropping it without a disk tier); `None` when every host slot is being fetched into.
    fn host_slot(&mut self) -> Option<u32> {
        if let Some(slot) = self.free_host.pop() {
            return Some(slot);
        }
        let (last_use, key) = self.host_lru.pop_first()?;
        let Some(Place::Host(slot)) = self.entries.get(&key).map(|entry| entry.place) else {
            unreachable!("invariant: host_lru names host entries");
        };
        let event = self.entries.get(&key).and_then(|entry| entry.event.clone());
        self.removed_event(Medium::Host, event.as_ref());
        match self.disk_slot() {
            Some(disk) => {
                self.queued.push(KvTransfer {
                    source: Medium::Host,
                    source_index: slot,
                    target: Medium::Disk,
                    target_index: disk,
                });
                self.disk_lru.insert((last_use, key));
                if let Some(entry) = self.entries.get_mut(&key) {
                    entry.place = Place::Disk(disk);
                }
                self.stored_event(Medium::Disk, event.as_ref());
                metrics::counter!("tandem_kv_offload_stored_blocks_total", "medium" => Medium::Disk.label())
                    .increment(1);
            }
            None => {
                self.entries.remove(&key);
            }
        }
        Some(slot)
    }

    /// A free disk slot, made by dropping the least recently used disk entry; `None` without
    /// a disk tier.
    fn disk_slot(&mut self) -> Option<u32> {
        if let Some(slot) = self.free_disk.pop() {
            return Some(slot);
        }
        let (_, key) = self.disk_lru.pop_first()?;
        let entry = self.entries.remove(&key);
        match entry {
            Some(Entry {
                place: Place::Disk(slot),
                event,
                ..
            }) => {
                self.removed_event(Medium::Disk, event.as_ref());
                Some(slot)
            }
            _ => unreachable!("invariant: disk_lru names disk entries"),
        }
    }
}

/// Reversed so that `pop` hands out low slots first.
fn fresh_slots(count: usize) -> Vec<u32> {
    let count = u32::try_from(count).unwrap_or(u32::MAX);
    (0..count).rev().collect()
}
