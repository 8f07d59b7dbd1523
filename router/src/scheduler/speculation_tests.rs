//! Speculative decoding in the scheduler: drafts from the request's own tokens, kept by the
//! fake shard where they equal its model's tokens, change no output and leak no block.

use std::collections::{BTreeMap, VecDeque};

use super::config::SchedulerConfig;
use super::drafting::DraftMethod;
use super::fake_shard::FakeShard;
use super::request::GenerationRequest;
use super::state::SchedulerState;
use super::tests::{config, run_until_idle, submit, tokens_of};
use crate::shard::{Grammar, SamplingParams, StoppingParams};

/// A model whose text repeats with period 3, so prompt lookup predicts it.
fn periodic(tokens: &[u32]) -> u32 {
    tokens[tokens.len() - 3]
}

pub(super) fn request(prompt: &[u32], max_new_tokens: u32) -> GenerationRequest {
    GenerationRequest {
        input_ids: prompt.to_vec(),
        stopping: StoppingParams {
            max_new_tokens,
            ..StoppingParams::default()
        },
        ..GenerationRequest::default()
    }
}

pub(super) fn expected(model: fn(&[u32]) -> u32, prompt: &[u32], max_new_tokens: u32) -> Vec<u32> {
    let mut tokens = prompt.to_vec();
    for _ in 0..max_new_tokens {
        tokens.push(model(&tokens));
    }
    tokens.split_off(prompt.len())
}

/// Plans up to two steps ahead of the answers, as the step loop does with async scheduling.
pub(super) fn run_pipelined(state: &mut SchedulerState, shard: &mut FakeShard) {
    let mut answers = VecDeque::new();
    for _ in 0..10_000 {
        while answers.len() < 2 {
            let Some(step) = state.schedule() else {
                break;
            };
            answers.push_back(shard.step(step));
        }
        let Some(answer) = answers.pop_front() else {
            return;
        };
        state.apply(answer);
    }
    panic!("the scheduler never went idle");
}

/// Outputs of three requests run together, and the steps they took.
fn run(model: fn(&[u32]) -> u32, max_drafts: usize) -> (Vec<Vec<u32>>, usize, SchedulerState) {
    run_with(model, max_drafts, 1)
}

fn run_with(
    model: fn(&[u32]) -> u32,
    max_drafts: usize,
    steps_in_flight: usize,
) -> (Vec<Vec<u32>>, usize, SchedulerState) {
    let mut state = SchedulerState::new(SchedulerConfig {
        max_drafts,
        steps_in_flight,
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
    if steps_in_flight == 1 {
        run_until_idle(&mut state, &mut shard);
    } else {
        run_pipelined(&mut state, &mut shard);
    }
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

#[test]
fn with_two_steps_in_flight_a_drafting_request_waits_for_its_token_and_still_gains() {
    let (plain, plain_steps, _) = run_with(periodic, 0, 2);
    let (drafted, drafted_steps, state) = run_with(periodic, 4, 2);
    assert_eq!(drafted, plain);
    assert!(
        drafted_steps * 2 < plain_steps,
        "{drafted_steps} steps with drafts, {plain_steps} without"
    );
    assert_eq!(state.pool().used(), 0);
}

#[test]
fn refused_drafts_pause_drafting_and_two_steps_stay_in_flight() {
    let (plain, plain_steps, _) = run_with(super::fake_shard::model, 0, 2);
    let (drafted, drafted_steps, state) = run_with(super::fake_shard::model, 4, 2);
    assert_eq!(drafted, plain);
    // Each refusal or empty proposal costs at most a step before a pause of several tokens.
    assert!(
        drafted_steps <= plain_steps + plain_steps / 2,
        "{drafted_steps} steps with drafts, {plain_steps} without"
    );
    assert_eq!(state.pool().used(), 0);
}

#[test]
fn a_request_drafts_at_most_its_own_speculate_and_none_with_zero() {
    let mut state = SchedulerState::new(SchedulerConfig {
        max_drafts: 4,
        ..config(64, 16)
    });
    let mut shard = FakeShard::new(4);
    shard.model = Some(periodic);
    let prompt = [5, 6, 7, 5, 6];
    let own_limits = [None, Some(0), Some(1)];
    let mut receivers: Vec<_> = own_limits
        .iter()
        .zip(0..)
        .map(|(&max_drafts, id)| {
            let capped = GenerationRequest {
                max_drafts,
                ..request(&prompt, 13)
            };
            submit(&mut state, id, capped)
        })
        .collect();
    let mut most_drafts = BTreeMap::new();
    while let Some(step) = state.schedule() {
        for scheduled in &step.scheduled {
            let most = most_drafts.entry(scheduled.id).or_insert(0);
            *most = scheduled.draft_token_ids.len().max(*most);
        }
        let answer = shard.step(step);
        state.apply(answer);
    }
    assert_eq!(most_drafts, BTreeMap::from([(0, 4), (1, 0), (2, 1)]));
    for receiver in &mut receivers {
        assert_eq!(tokens_of(receiver), expected(periodic, &prompt, 13));
    }
    assert_eq!(state.pool().used(), 0);
}

/// Steps the second of two identical requests, run one after the other, takes with `method`.
fn steps_of_a_repeated_request(method: DraftMethod) -> usize {
    let mut state = SchedulerState::new(SchedulerConfig {
        max_drafts: 4,
        draft_method: method,
        ..config(64, 16)
    });
    let mut shard = FakeShard::new(4);
    // A hash of the context: prompt lookup almost never guesses it; the cache holds it exactly.
    shard.model = Some(super::fake_shard::model);
    let prompt = [3, 1, 4, 1, 5, 9];
    let mut first = submit(&mut state, 0, request(&prompt, 24));
    run_until_idle(&mut state, &mut shard);
    let steps_before = shard.step_tokens.len();
    let mut second = submit(&mut state, 1, request(&prompt, 24));
    run_until_idle(&mut state, &mut shard);
    let expected = expected(super::fake_shard::model, &prompt, 24);
    assert_eq!(tokens_of(&mut first), expected);
    assert_eq!(tokens_of(&mut second), expected);
    assert_eq!(state.pool().used(), 0);
    shard.step_tokens.len() - steps_before
}

#[test]
fn radix_drafts_replay_what_an_earlier_request_computed_after_the_same_context() {
    let looked_up = steps_of_a_repeated_request(DraftMethod::Ngram);
    let cached = steps_of_a_repeated_request(DraftMethod::Radix);
    assert!(
        cached * 2 < looked_up,
        "{cached} steps with radix drafts, {looked_up} with prompt lookup"
    );
}

/// How many steps carry drafts while `model` generates `max_new_tokens` after `prompt` alone.
fn drafted_steps(model: fn(&[u32]) -> u32, prompt: &[u32], max_new_tokens: u32) -> usize {
    drafted_steps_of(model, request(prompt, max_new_tokens))
}

/// How many steps carry drafts while `model` generates `generation` alone.
fn drafted_steps_of(model: fn(&[u32]) -> u32, generation: GenerationRequest) -> usize {
    let mut state = SchedulerState::new(SchedulerConfig {
        max_drafts: 4,
        ..config(256, 16)
    });
    let mut shard = FakeShard::new(4);
    shard.model = Some(model);
    let (prompt, max_new_tokens) = (
        generation.input_ids.clone(),
        generation.stopping.max_new_tokens,
    );
    let mut receiver = submit(&mut state, 0, generation);
    let mut drafted = 0;
    while let Some(step) = state.schedule() {
        drafted += step
            .scheduled
            .iter()
            .filter(|scheduled| !scheduled.draft_token_ids.is_empty())
            .count();
        let answer = shard.step(step);
        state.apply(answer);
    }
    assert_eq!(
        tokens_of(&mut receiver),
        expected(model, &prompt, max_new_tokens)
    );
    drafted
}

/// A hash of the context over 20 tokens: every token soon occurred before, so prompt lookup
/// always proposes, but what followed it before rarely follows it again.
fn small_alphabet_hash(tokens: &[u32]) -> u32 {
    super::fake_shard::model(tokens) % 20 + 1
}

#[test]
fn a_request_whose_drafts_keep_being_refused_drafts_ever_more_rarely() {
    // Pauses of 8, 16, 32, 64, then 128 tokens after each refusal: 7 drafted steps in 400
    // tokens here, where a fixed pause of 8 drafts 52 times.
    let drafted = drafted_steps(small_alphabet_hash, &[1, 2, 3, 4, 5], 400);
    assert!(drafted <= 9, "{drafted} drafted steps");
}

#[test]
fn no_step_drafts_while_more_requests_run_than_the_drafting_batch() {
    let run_three = |max_drafting_batch: usize| {
        let mut state = SchedulerState::new(SchedulerConfig {
            max_drafts: 4,
            max_drafting_batch,
            ..config(64, 16)
        });
        let mut shard = FakeShard::new(4);
        shard.model = Some(periodic);
        let prompts: [&[u32]; 3] = [&[5, 6, 7, 5, 6], &[1, 2, 3, 1, 2], &[4, 8, 4, 8, 4]];
        let mut receivers: Vec<_> = prompts
            .iter()
            .zip(0..)
            .map(|(prompt, id)| submit(&mut state, id, request(prompt, 12)))
            .collect();
        let mut drafts = 0;
        while let Some(step) = state.schedule() {
            drafts += step
                .scheduled
                .iter()
                .map(|scheduled| scheduled.draft_token_ids.len())
                .sum::<usize>();
            let answer = shard.step(step);
            state.apply(answer);
        }
        for (receiver, prompt) in receivers.iter_mut().zip(prompts) {
            assert_eq!(tokens_of(receiver), expected(periodic, prompt, 12));
        }
        drafts
    };
    assert!(run_three(3) > 0);
    assert_eq!(run_three(2), 0);
}

#[test]
fn requests_with_penalties_logit_bias_or_a_grammar_draft_like_any_other() {
    let with_sampling = |edit: fn(&mut SamplingParams)| {
        let mut sampling = SamplingParams::default();
        edit(&mut sampling);
        GenerationRequest {
            sampling,
            ..request(&[5, 6, 7, 5, 6], 13)
        }
    };
    let requests = [
        with_sampling(|s| s.repetition_penalty = 1.3),
        with_sampling(|s| s.frequency_penalty = 0.5),
        with_sampling(|s| s.presence_penalty = 0.5),
        with_sampling(|s| s.logit_bias = vec![(3, 2.0)]),
        GenerationRequest {
            grammar: Some(Grammar::Regex("[0-9]+".to_owned())),
            ..request(&[5, 6, 7, 5, 6], 13)
        },
    ];
    for generation in requests {
        assert!(drafted_steps_of(periodic, generation) > 0);
    }
}
