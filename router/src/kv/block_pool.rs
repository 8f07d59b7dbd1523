//! A fixed pool of KV block ids with RAII block tables: dropping a table frees its blocks.

use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Debug)]
struct FreeList {
    free: Vec<u32>,
    total: usize,
}

/// The pool of block ids `0..total`. Cloning shares the same pool.
#[derive(Debug, Clone)]
pub struct BlockPool {
    inner: Arc<Mutex<FreeList>>,
}

impl BlockPool {
    pub fn new(total: usize) -> Self {
        let ids = u32::try_from(total).unwrap_or(u32::MAX);
        // Reversed so that `pop` hands out low ids first.
        let free = (0..ids).rev().collect();
        Self {
            inner: Arc::new(Mutex::new(FreeList { free, total })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, FreeList> {
        // Every critical section leaves the list consistent, so a poisoned lock is still valid.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn total(&self) -> usize {
        self.lock().total
    }

    pub fn free(&self) -> usize {
        self.lock().free.len()
    }

    pub fn used(&self) -> usize {
        let list = self.lock();
        list.total - list.free.len()
    }

    /// An empty table that draws from this pool.
    pub fn new_table(&self) -> BlockTable {
        BlockTable {
            blocks: Vec::new(),
            pool: self.clone(),
        }
    }
}

/// The blocks of one sequence, in order. Invariant: every id in `blocks` is absent from
/// the pool's free list until the table is dropped or cleared.
#[derive(Debug)]
pub struct BlockTable {
    blocks: Vec<u32>,
    pool: BlockPool,
}

impl BlockTable {
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Appends `count` blocks, all or none; returns the new ids, or `None` when the pool
    /// has fewer than `count` free blocks.
    pub fn grow(&mut self, count: usize) -> Option<&[u32]> {
        let mut list = self.pool.lock();
        if list.free.len() < count {
            return None;
        }
        let start = list.free.len() - count;
        let start_in_table = self.blocks.len();
        self.blocks.extend(list.free.drain(start..).rev());
        Some(&self.blocks[start_in_table..])
    }

    /// Returns every block to the pool.
    pub fn clear(&mut self) {
        if self.blocks.is_empty() {
            return;
        }
        let mut list = self.pool.lock();
        list.free.append(&mut self.blocks);
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn tables_never_share_a_block() {
        let pool = BlockPool::new(6);
        let mut a = pool.new_table();
        let mut b = pool.new_table();
        a.grow(3);
        b.grow(3);
        let mut all: Vec<u32> = a.blocks().iter().chain(b.blocks()).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 6);
        a.clear();
        assert_eq!(pool.free(), 3);
        assert!(a.is_empty());
    }
}
