//! Handing a step's answers to the requests that await them, and the drafting pause they set.

use crate::scheduler::error::SchedulerError;
use crate::scheduler::metrics::record_drafts;
use crate::scheduler::request::GenerationEvent;
use crate::scheduler::sequence::{PendingSpan, Sequence};
use crate::shard::Generation;

/// Tokens a request generates without drafts (two steps in flight) after drafts that were all
/// refused, and after its text offered none: drafting costs it every other step, which pays
/// only while drafts are kept. Each refusal in a row doubles the pause, up to 16 times this, so
/// a request whose drafts are rarely kept soon drafts on fewer than one token in 100.
const PAUSE_AFTER_REFUSAL: usize = 8;
const MAX_PAUSE_DOUBLINGS: u32 = 4;
pub(super) const PAUSE_WITHOUT_PROPOSAL: usize = 4;

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
            let doublings = sequence.refused_in_a_row.min(MAX_PAUSE_DOUBLINGS);
            sequence.refused_in_a_row += 1;
            sequence.draft_pause = PAUSE_AFTER_REFUSAL << doublings;
        } else {
            sequence.refused_in_a_row = 0;
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
