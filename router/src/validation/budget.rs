//! How much text is rendered and tokenized at once. The tokenizer's working memory is about a
//! hundred times its input (byte-level BPE keeps per-byte alignments while it merges), so a
//! few concurrent multi-megabyte prompts could otherwise take gigabytes: each job reserves its
//! input's size from a shared budget and waits while the budget is spent.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

const KIB: usize = 1024;

/// The bytes of text being tokenized at once, at most `bytes` (a larger input takes it all).
#[derive(Debug, Clone)]
pub struct TokenizationBudget {
    kib: Arc<Semaphore>,
    total_kib: u32,
}

impl TokenizationBudget {
    pub fn new(bytes: usize) -> Self {
        let total_kib = u32::try_from(bytes.div_ceil(KIB).max(1)).unwrap_or(u32::MAX);
        Self {
            kib: Arc::new(Semaphore::new(total_kib as usize)),
            total_kib,
        }
    }

    /// Waits until `bytes` of text may be tokenized; the budget returns when the permit drops.
    pub async fn reserve(&self, bytes: usize) -> OwnedSemaphorePermit {
        let kib = u32::try_from(bytes.div_ceil(KIB))
            .unwrap_or(u32::MAX)
            .clamp(1, self.total_kib);
        Arc::clone(&self.kib)
            .acquire_many_owned(kib)
            .await
            .expect("invariant: the budget's semaphore is never closed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn inputs_wait_while_the_budget_is_spent_and_large_ones_take_it_all() {
        let budget = TokenizationBudget::new(4 * KIB);
        let first = budget.reserve(3 * KIB).await;
        let small = budget.reserve(100).await;
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), budget.reserve(KIB))
                .await
                .is_err(),
            "nothing is left"
        );
        drop((first, small));
        let huge = budget.reserve(1 << 30).await;
        assert_eq!(huge.num_permits(), 4);
    }
}
