//! Where a model with recurrent state checkpoints a sequence's state, so that later
//! requests resume after a cached prefix instead of recomputing it.
//!
//! A checkpoint holds the state after a block-aligned prefix, saved by the step whose span
//! ends exactly there; prompt chunks are cut to end at the positions wanted:
//! - every `interval` tokens of a prompt, so long prompts that diverge late share most of it;
//! - the branch point: the end of the longest cached prefix the request shares with earlier
//!   ones, when no checkpoint covers it yet (a shared system prompt gets one on its second use);
//! - the prompt's last block boundary a request with the same prompt could resume after;
//! - past it, every block boundary of the answer, each replacing the sequence's previous one,
//!   so the next turn of a conversation resumes after all of it but its last partial block.

use super::sequence::Sequence;
use crate::shard::ScheduledSpan;

/// The checkpoints a model with recurrent state keeps, and how often prompts save one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointPlan {
    /// Checkpoints the shards keep (ids `0..count`).
    pub count: usize,
    /// Tokens between checkpoints within a prompt; a multiple of the block size.
    pub interval: usize,
}

/// A checkpoint a span ending at some position saves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CheckpointSave {
    /// An answer checkpoint replaces the sequence's previous one once named.
    pub replaces_previous: bool,
}

impl CheckpointPlan {
    /// Most tokens `sequence`'s next prompt chunk may take so that it stops at the next
    /// position wanted; unlimited when none lies strictly inside what remains.
    pub(crate) fn chunk_limit(&self, sequence: &Sequence, block_size: usize) -> usize {
        let start = sequence.num_computed;
        let total = sequence.tokens.len();
        let next_interval = (start / self.interval + 1) * self.interval;
        [
            Some(next_interval),
            Some(last_resumable(sequence.prompt_len, block_size)),
            Some(last_resumable(total, block_size)),
            sequence.branch_point,
        ]
        .into_iter()
        .flatten()
        .filter(|&position| position > start && position < total)
        .min()
        .map_or(usize::MAX, |position| position - start)
    }

    /// Makes `sequence`'s `span`, just scheduled, save its state into a reserved checkpoint
    /// where one is wanted (none when no checkpoint can be had).
    pub(crate) fn save_after(
        &self,
        sequence: &mut Sequence,
        span: &mut ScheduledSpan,
        block_size: usize,
    ) {
        let end = span.num_computed_tokens + span.num_tokens;
        if let Some(save) = self.save_at(sequence, end, block_size) {
            span.save_state_checkpoint = sequence
                .blocks
                .reserve_checkpoint(end, save.replaces_previous);
        }
    }

    /// Whether `sequence`'s span ending at `end` saves a checkpoint there.
    pub(crate) fn save_at(
        &self,
        sequence: &Sequence,
        end: usize,
        block_size: usize,
    ) -> Option<CheckpointSave> {
        if end == 0 || !end.is_multiple_of(block_size) {
            return None;
        }
        let prompt_anchor = last_resumable(sequence.prompt_len, block_size);
        let wanted = end.is_multiple_of(self.interval)
            || sequence.branch_point == Some(end)
            || end >= prompt_anchor;
        wanted.then_some(CheckpointSave {
            replaces_previous: end > prompt_anchor,
        })
    }
}

/// The deepest block boundary a request of `len` tokens can resume after: its last token is
/// always computed.
fn last_resumable(len: usize, block_size: usize) -> usize {
    len.saturating_sub(1) / block_size * block_size
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;

    use super::*;
    use crate::kv::BlockPool;
    use crate::scheduler::request::GenerationRequest;

    const BLOCK: usize = 4;
    const PLAN: CheckpointPlan = CheckpointPlan {
        count: 8,
        interval: 16,
    };

    fn sequence(prompt_len: usize, computed: usize) -> Sequence {
        let request = GenerationRequest {
            input_ids: (0..prompt_len as u32).collect(),
            ..GenerationRequest::default()
        };
        let (events, _) = mpsc::unbounded_channel();
        let mut sequence = Sequence::new(0, request, BlockPool::new(8).new_table(), events);
        sequence.num_computed = computed;
        sequence
    }

    #[test]
    fn prompt_chunks_stop_at_each_interval_and_at_the_last_resumable_block() {
        let long = sequence(42, 0);
        assert_eq!(PLAN.chunk_limit(&long, BLOCK), 16);
        assert_eq!(PLAN.chunk_limit(&sequence(42, 16), BLOCK), 16);
        // 40 is the last boundary before the prompt's last token.
        assert_eq!(PLAN.chunk_limit(&sequence(42, 32), BLOCK), 8);
        assert_eq!(PLAN.chunk_limit(&sequence(42, 40), BLOCK), usize::MAX);
    }

    #[test]
    fn a_prompt_whose_last_block_is_full_stops_one_block_before_it() {
        assert_eq!(PLAN.chunk_limit(&sequence(12, 0), BLOCK), 8);
        assert_eq!(
            PLAN.save_at(&sequence(12, 0), 8, BLOCK)
                .map(|s| s.replaces_previous),
            Some(false)
        );
        assert_eq!(
            PLAN.save_at(&sequence(12, 8), 12, BLOCK)
                .map(|s| s.replaces_previous),
            Some(true)
        );
    }

    #[test]
    fn the_branch_point_is_a_chunk_end_and_a_checkpoint() {
        let mut shared = sequence(42, 4);
        shared.branch_point = Some(8);
        assert_eq!(PLAN.chunk_limit(&shared, BLOCK), 4);
        assert!(PLAN.save_at(&shared, 8, BLOCK).is_some());
        assert!(PLAN.save_at(&sequence(42, 4), 8, BLOCK).is_none());
    }

    #[test]
    fn answers_save_every_block_boundary_each_replacing_the_last() {
        let answering = sequence(10, 11);
        assert_eq!(PLAN.save_at(&answering, 11, BLOCK), None);
        assert_eq!(
            PLAN.save_at(&answering, 12, BLOCK),
            Some(CheckpointSave {
                replaces_previous: true
            })
        );
        assert_eq!(PLAN.chunk_limit(&answering, BLOCK), usize::MAX);
    }
}
