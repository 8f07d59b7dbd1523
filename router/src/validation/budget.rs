//! How much tokenization runs at once, counted in the memory it takes. The tokenizer's working
//! memory is many times its input (byte-level BPE keeps per-byte alignments while it merges;
//! an encoding keeps ids, type ids, token strings, offsets and masks per token), and
//! `/tokenize` answers with each token's text and offsets, so a few concurrent multi-megabyte
//! inputs could otherwise take gigabytes: each job reserves its estimated peak from a shared
//! budget, waits while the budget is spent, and holds it until what it built is gone.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Memory reserved for a tokenization job and what it built; returned to the budget on drop.
pub type TokenizationReservation = OwnedSemaphorePermit;

const KIB: usize = 1024;

/// Text longer than one tokenization job may take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the prompt holds {bytes} bytes of text, more than the {max} this server tokenizes at once \
     (two --payload-limit bodies of text)"
)]
pub struct TextTooLarge {
    pub bytes: usize,
    pub max: usize,
}

/// Peak bytes allocated per input byte while text is encoded (the encoding's per-byte
/// alignments and per-token vectors; ~170 measured with one token per byte, the worst case,
/// ~145 with a real BPE vocabulary), and also a bound on what `/tokenize` keeps afterwards
/// until its answer is sent: ids with offsets and ~50 bytes of JSON per token.
/// `router/tests/tokenize_memory.rs` checks the bound.
const PEAK_BYTES_PER_INPUT_BYTE: usize = 200;

/// An upper bound on the bytes tokenizing `input_bytes` of text allocates at its peak.
pub const fn peak_bytes(input_bytes: usize) -> usize {
    input_bytes.saturating_mul(PEAK_BYTES_PER_INPUT_BYTE)
}

/// The memory tokenization jobs may take at once, at most `bytes` (a larger job takes it all).
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

    /// The longest text one job may tokenize: the job's peak fits the whole budget. Longer
    /// texts are refused rather than run beyond it.
    pub fn max_text_bytes(&self) -> usize {
        (self.total_kib as usize * KIB) / PEAK_BYTES_PER_INPUT_BYTE
    }

    /// Refuses text of `input_bytes` longer than `max_text_bytes`.
    pub fn check_text(&self, input_bytes: usize) -> Result<(), TextTooLarge> {
        let max = self.max_text_bytes();
        if input_bytes > max {
            return Err(TextTooLarge {
                bytes: input_bytes,
                max,
            });
        }
        Ok(())
    }

    /// Waits until a job taking `bytes` of memory may run; the budget returns when the permit
    /// drops.
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

    #[test]
    fn text_whose_peak_exceeds_the_whole_budget_is_refused() {
        let budget = TokenizationBudget::new(peak_bytes(4 * KIB));
        assert_eq!(budget.max_text_bytes(), 4 * KIB);
        assert_eq!(budget.check_text(4 * KIB), Ok(()));
        assert_eq!(
            budget.check_text(4 * KIB + 1),
            Err(TextTooLarge {
                bytes: 4 * KIB + 1,
                max: 4 * KIB
            })
        );
    }

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
