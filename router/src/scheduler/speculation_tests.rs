//! Speculative decoding in the scheduler: drafts from the request's own tokens, kept by the
//! fake shard where they equal its model's tokens, change no output and leak no block.

use super::fake_shard::FakeShard;
use super::request::{GenerationRequest, StoppingParams};
use super::state::SchedulerState;
use super::tests::{config, run_until_idle, submit, tokens_of};
use super::SchedulerConfig;

/// A model whose text repeats with period 3, so prompt lookup predicts it.
fn periodic(tokens: &[u32]) -> u32 {
    tokens[tokens.len() - 3]
}

fn request(prompt: &[u32], max_new_tokens: u32) -> GenerationRequest {
    GenerationRequest {
        input_ids: prompt.to_vec(),
        stopping: StoppingParams {
            max_new_tokens,
            ..StoppingParams::default()
        },
        ..GenerationRequest::default()
    }
}

fn expected(model: fn(&[u32]) -> u32, prompt: &[u32], max_new_tokens: u32) -> Vec<u32> {
    let mut tokens = prompt.to_vec();
    for _ in 0..max_new_tokens {
        tokens.push(model(&tokens));
    }
    tokens.split_off(prompt.len())
}

/// Outputs of three requests run together, and the steps they took.
fn run(model: fn(&[u32]) -> u32, max_drafts: usize) -> (Vec<Vec<u32>>, usize, SchedulerState) {
    let mut state = SchedulerState::new(SchedulerConfig {
        max_drafts,
        ..config(64, 16)
    });
    let mut shard = FakeShard::new(4);
    shard.model = Some(model);
    let prompts: [&[u32]; 3] = [&[5, 6, 7, 5, 6], &[9, 8, 1, 2, 3, 1, 2], &[4, 4, 4]];
    let mut receivers: Vec<_> = prompts
        .iter()
        .zip(0..)
        .map(|(prompt, id)| submit(&mut state, id, request(prompt, 13)))
        .collect();
    run_until_idle(&mut state, &mut shard);
    shard.assert_shared_blocks_agree();
    let outputs = receivers.iter_mut().map(tokens_of).collect();
    for (prompt, output) in prompts.iter().zip(&outputs) {
        assert_eq!(output, &expected(model, prompt, 13));
    }
    (outputs, shard.step_tokens.len(), state)
}

#[test]
fn kept_drafts_generate_the_same_tokens_in_fewer_steps() {
    let (plain, plain_steps, _) = run(periodic, 0);
    let (drafted, drafted_steps, state) = run(periodic, 4);
    assert_eq!(drafted, plain);
    assert!(
        drafted_steps * 2 < plain_steps,
        "{drafted_steps} steps with drafts, {plain_steps} without"
    );
    assert_eq!(state.pool().used(), 0, "every block is free or cached");
}

#[test]
fn refused_drafts_change_nothing_and_leak_nothing() {
    // The default fake model is a hash: prompt lookup rarely guesses it.
    let (plain, _, _) = run(super::fake_shard::model, 0);
    let (drafted, _, state) = run(super::fake_shard::model, 4);
    assert_eq!(drafted, plain);
    assert_eq!(state.pool().used(), 0);
}

#[test]
fn drafts_never_reach_past_the_last_allowed_token() {
    // 13 new tokens: a decode with 2 left may carry 1 draft, the last token none.
    let (outputs, _, _) = run(periodic, 8);
    assert!(outputs.iter().all(|output| output.len() == 13));
}
