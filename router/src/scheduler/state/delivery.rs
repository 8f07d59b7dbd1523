//! Handing a step's answers to the requests that await them, and the drafting pause they set.

use crate::scheduler::error::SchedulerError;
use crate::scheduler::metrics::record_drafts;
use crate::scheduler::request::GenerationEvent;
use crate::scheduler::sequence::{PendingSpan, Sequence};
use crate::shard::Generation;

/// Tokens a request generates without drafts (two steps in flight) after drafts that were all
/// refused, and after its text offered none: trying to draft costs it a step out of the
/// pipeline, which pays only while drafts are kept. Each fruitless try in a row (all refused, or
/// none proposed) doubles the pause, up to 16 times this, so a request whose drafts are rarely
/// kept, or whose text rarely offers one, soon tries on fewer than one token in 50.
const PAUSE_AFTER_REFUSAL: usize = 8;
const PAUSE_WITHOUT_PROPOSAL: usize = 4;
const MAX_PAUSE_DOUBLINGS: u32 = 4;

/// Pauses drafting after a try that kept no draft: `refused` drafts, or none proposed.
pub(super) fn pause_after_fruitless_try(sequence: &mut Sequence, refused: bool) {
    let base = if refused {
        PAUSE_AFTER_REFUSAL
    } else {
        PAUSE_WITHOUT_PROPOSAL
    };
    let doublings = sequence.fruitless_in_a_row.min(MAX_PAUSE_DOUBLINGS);
    sequence.fruitless_in_a_row += 1;
    sequence.draft_pause = base << doublings;
}

/// Delivers a sampling span's generations: one, or for a drafted span the drafts the shards kept
/// and one more. False when the request ended.
pub(super) fn deliver_span(
    sequence: &mut Sequence,
    span: &PendingSpan,
    answers: Option<Vec<Generation>>,
    forget: &mut Vec<u64>,
) -> bool {
    let Some(answers) = answers.filter(|answers| !answers.is_empty()) else {
        return deliver(sequence, None, forget);
    };
    // Beyond its drafts and one more token the shards cannot have drawn: ignore the excess.
    let kept = (answers.len() - 1).min(span.drafts);
    if let Some(method) = span.drafted_by {
        record_drafts(method, span.drafts, kept);
        if kept == 0 {
            pause_after_fruitless_try(sequence, true);
        } else {
            sequence.fruitless_in_a_row = 0;
            sequence.draft_pause = 0;
        }
    } else {
        sequence.draft_pause = sequence.draft_pause.saturating_sub(1);
    }
    for generation in answers.into_iter().take(kept + 1) {
        if !deliver(sequence, Some(generation), forget) {
            return false;
        }
    }
    sequence.keep_drafts(kept);
    true
}

/// Hands a sampling span's answer to its request; `false` when the request has ended (its
/// last token, or no token at all, which fails it and asks the shards to forget it).
fn deliver(sequence: &mut Sequence, generation: Option<Generation>, forget: &mut Vec<u64>) -> bool {
    let Some(generation) = generation else {
        let error =
            SchedulerError::ShardFailed(format!("no token returned for request {}", sequence.id));
        sequence.notify(GenerationEvent::Error(error));
        forget.push(sequence.id);
        return false;
    };
    let token = generation.token;
    let finish = token.finish;
    sequence.tokens.push(token.id);
    sequence.notify(GenerationEvent::Token(token));
    finish.is_none()
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use crate::scheduler::config::SchedulerConfig;
    use crate::scheduler::fake_shard::FakeShard;
    use crate::scheduler::speculation_tests::{expected, request};
    use crate::scheduler::state::SchedulerState;
    use crate::scheduler::tests::{config, submit, tokens_of};

    /// Text that never repeats: no suffix occurred before, so prompt lookup never proposes.
    fn counting(tokens: &[u32]) -> u32 {
        tokens.last().map_or(1, |last| last + 1)
    }

    /// Times one request generating 400 tokens with two steps in flight had a step in flight and
    /// none planned behind it: it waited for its token to try drafting (or it was ending).
    fn waits_for_new_text(max_drafts: usize) -> usize {
        let mut state = SchedulerState::new(SchedulerConfig {
            max_drafts,
            steps_in_flight: 2,
            ..config(256, 16)
        });
        let mut shard = FakeShard::new(4);
        shard.model = Some(counting);
        let mut receiver = submit(&mut state, 0, request(&[1, 2, 3], 400));
        let mut answers = VecDeque::new();
        let mut waits = 0;
        loop {
            while answers.len() < 2 {
                let Some(step) = state.schedule() else {
                    waits += usize::from(!answers.is_empty());
                    break;
                };
                answers.push_back(shard.step(step));
            }
            let Some(answer) = answers.pop_front() else {
                break;
            };
            state.apply(answer);
        }
        assert_eq!(
            tokens_of(&mut receiver),
            expected(counting, &[1, 2, 3], 400)
        );
        waits
    }

    #[test]
    fn text_that_never_offers_a_draft_is_tried_ever_more_rarely() {
        // Each try waits for the token in flight; pauses of 4, 8, 16, 32, then 64 tokens leave
        // about 9 tries in 400 tokens, where a fixed pause of 4 tries 80 times.
        let plain = waits_for_new_text(0);
        let trying = waits_for_new_text(4);
        assert!(
            trying <= plain + 12,
            "{trying} waits trying to draft, {plain} without"
        );
    }
}
