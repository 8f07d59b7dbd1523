//! A model with recurrent state: prompt chunks end where the state is checkpointed, and
//! later requests resume after a cached prefix from the checkpoint that holds it (the fake
//! shard refuses any other), so a conversation's next turn and requests sharing a system
//! prompt skip what was computed before.

use super::checkpoints::CheckpointPlan;
use super::config::SchedulerConfig;
use super::fake_shard::{expected_output, FakeShard};
use super::request::GenerationRequest;
use super::state::SchedulerState;
use super::tests::{config, run_until_idle, submit, tokens_of};
use crate::shard::{ScheduledSpan, StoppingParams};

const BLOCK_SIZE: usize = 4;
const INTERVAL: usize = 16;

fn hybrid(checkpoints: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_loras: 0,
        policy: crate::scheduler::SchedulingPolicy::Fcfs,
        state_checkpoints: Some(CheckpointPlan {
            count: checkpoints,
            interval: INTERVAL,
        }),
        ..config(64, 64)
    }
}

fn fake_shard() -> FakeShard {
    let mut shard = FakeShard::new(BLOCK_SIZE);
    shard.keeps_state = true;
    shard
}

fn request(input_ids: Vec<u32>, max_new_tokens: u32) -> GenerationRequest {
    GenerationRequest {
        input_ids,
        stopping: StoppingParams {
            max_new_tokens,
            ..StoppingParams::default()
        },
        ..GenerationRequest::default()
    }
}

/// Runs `input_ids` alone to the end; returns its first span and its output, which must be
/// the fake model's.
fn serve(
    state: &mut SchedulerState,
    shard: &mut FakeShard,
    id: u64,
    input_ids: Vec<u32>,
) -> (ScheduledSpan, Vec<u32>) {
    let expected = expected_output(&input_ids, 6);
    let mut receiver = submit(state, id, request(input_ids, 6));
    let step = state.schedule().expect("the request is admitted");
    let first = step.scheduled[0].clone();
    state.apply(shard.step(step));
    run_until_idle(state, shard);
    let output = tokens_of(&mut receiver);
    assert_eq!(output, expected);
    (first, output)
}

#[test]
fn prompt_chunks_end_where_the_state_is_checkpointed() {
    let mut state = SchedulerState::new(hybrid(8));
    let mut shard = fake_shard();
    let _receiver = submit(&mut state, 0, request((0..42).collect(), 2));
    let mut spans = Vec::new();
    while let Some(step) = state.schedule() {
        spans.extend(step.scheduled.iter().map(|span| {
            let end = span.num_computed_tokens + span.num_tokens;
            (end, span.save_state_checkpoint.is_some())
        }));
        state.apply(shard.step(step));
    }
    // Every 16 prompt tokens, then the last block boundary before the prompt's last token;
    // the answer's first token ends no block.
    assert_eq!(
        spans,
        [(16, true), (32, true), (40, true), (42, false), (43, false)]
    );
}

#[test]
fn the_next_turn_resumes_after_the_whole_answer_but_its_last_partial_block() {
    let mut state = SchedulerState::new(hybrid(8));
    let mut shard = fake_shard();
    let prompt: Vec<u32> = (0..10).collect();
    let (_, answer) = serve(&mut state, &mut shard, 0, prompt.clone());
    let next_turn: Vec<u32> = [prompt, answer, vec![40, 41, 42]].concat();
    let (resumed, _) = serve(&mut state, &mut shard, 1, next_turn);
    // 10 prompt tokens and 6 generated, the last of them sampled but never run: 15 tokens
    // computed, so the answer's last checkpoint is at 12, where the next turn resumes.
    assert_eq!(resumed.num_computed_tokens, 12);
    assert!(resumed.restore_state_checkpoint.is_some());
    assert_eq!(shard.restores, 1);
    let counts = state.pool().state_checkpoints();
    assert_eq!(
        counts.named + counts.free,
        counts.total,
        "no checkpoint leaked"
    );
}

#[test]
fn requests_sharing_only_a_system_prompt_checkpoint_it_at_the_second_and_reuse_it_at_the_third() {
    let mut state = SchedulerState::new(hybrid(8));
    let mut shard = fake_shard();
    let system: Vec<u32> = (100..120).collect();
    let ask = |question: u32| [system.clone(), vec![question; 7]].concat();
    let (first, _) = serve(&mut state, &mut shard, 0, ask(1));
    let (second, _) = serve(&mut state, &mut shard, 1, ask(2));
    let (third, _) = serve(&mut state, &mut shard, 2, ask(3));
    assert_eq!(first.num_computed_tokens, 0);
    // The first request checkpointed its prompt every 16 tokens; the second finds all 20
    // system tokens cached but checkpointed only up to 16, and saves the branch point at 20.
    assert_eq!((second.num_computed_tokens, second.num_tokens), (16, 4));
    assert!(second.save_state_checkpoint.is_some());
    assert_eq!(third.num_computed_tokens, 20);
    assert_eq!(shard.restores, 2);
}

#[test]
fn with_one_checkpoint_the_least_recently_used_is_taken_and_nothing_resumes_from_a_stale_one() {
    let mut state = SchedulerState::new(hybrid(1));
    let mut shard = fake_shard();
    for id in 0..6 {
        let prompt: Vec<u32> = (0..18).map(|i| (i * (id + 3)) % 50).collect();
        serve(&mut state, &mut shard, id.into(), prompt.clone());
        serve(&mut state, &mut shard, (id + 10).into(), prompt);
    }
    let counts = state.pool().state_checkpoints();
    assert_eq!((counts.named + counts.free, counts.total), (1, 1));
}
