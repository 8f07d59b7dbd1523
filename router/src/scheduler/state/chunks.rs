//! How many tokens a request's next chunk takes: what remains of it within the step's share,
//! ending where its state is checkpointed and never inside an image's span.

use super::SchedulerState;
use crate::scheduler::sequence::Sequence;

impl SchedulerState {
    /// Tokens `sequence`'s next chunk takes when the step offers it `share` tokens and has
    /// `room` for at most that many; `None`: it takes no chunk this step (it must compute the
    /// rest of an image's span at once, and `room` is too small). The rest of a span is never
    /// longer than a step's budget (validation refuses such images), so a request whose chunk
    /// waits gets one in a step with its whole budget free.
    pub(super) fn next_chunk(
        &self,
        sequence: &Sequence,
        share: usize,
        room: usize,
    ) -> Option<usize> {
        let wanted = sequence
            .remaining()
            .min(share)
            .min(self.checkpoint_chunk_limit(sequence));
        sequence.chunk_within_images(wanted, room)
    }

    /// Most tokens `sequence`'s next chunk takes so that it ends where its state is checkpointed.
    fn checkpoint_chunk_limit(&self, sequence: &Sequence) -> usize {
        self.config.state_checkpoints.map_or(usize::MAX, |plan| {
            plan.chunk_limit(sequence, self.config.block_size)
        })
    }
}
