//! Speculative decoding with the shards' draft model (`--speculative-method draft`): the
//! scheduler asks for a count of drafts, reserves their blocks like listed drafts, counts them
//! under `draft`, and changes no output.

use std::collections::BTreeMap;

use metrics_exporter_prometheus::PrometheusBuilder;

use super::config::SchedulerConfig;
use super::drafting::DraftMethod;
use super::fake_shard::{model, FakeShard};
use super::request::GenerationRequest;
use super::speculation_tests::{expected, request, run_pipelined};
use super::state::SchedulerState;
use super::tests::{config, run_until_idle, submit, tokens_of};
use crate::shard::Step;

const PROMPTS: [&[u32]; 3] = [&[5, 6, 7, 5, 6], &[9, 8, 1, 2, 3, 1, 2], &[4, 4, 4]];

/// Up to 4 model drafts per step, one token per block so a block reservation is exact.
fn drafting(num_blocks: usize) -> SchedulerConfig {
    SchedulerConfig {
        block_size: 1,
        max_drafts: 4,
        draft_method: DraftMethod::Model,
        ..config(num_blocks, 16)
    }
}

/// Runs `PROMPTS` for 13 tokens each; checks each output against the model's alone and that
/// no block stays in use. Returns the steps taken and the shard.
fn run_prompts(config: SchedulerConfig, shard: FakeShard) -> (usize, SchedulerState, FakeShard) {
    let mut shard = shard;
    let mut state = SchedulerState::new(config);
    let mut receivers: Vec<_> = PROMPTS
        .iter()
        .zip(0..)
        .map(|(prompt, id)| submit(&mut state, id, request(prompt, 13)))
        .collect();
    if config.steps_in_flight == 1 {
        run_until_idle(&mut state, &mut shard);
    } else {
        run_pipelined(&mut state, &mut shard);
    }
    for (receiver, prompt) in receivers.iter_mut().zip(PROMPTS) {
        assert_eq!(tokens_of(receiver), expected(model, prompt, 13));
    }
    assert_eq!(state.pool().used(), 0, "every block is free or cached");
    assert!(shard.requests.is_empty(), "the shard still holds requests");
    (shard.step_tokens.len(), state, shard)
}

/// The value of `name{method="<method>"}` in a Prometheus rendering.
fn counter(text: &str, name: &str, method: &str) -> u64 {
    let series = format!("{name}{{method=\"{method}\"}} ");
    let line = text
        .lines()
        .find(|line| line.starts_with(&series))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"));
    line[series.len()..].parse().expect("a counter's value")
}

#[test]
fn model_drafts_generate_the_same_tokens_in_fewer_steps_counted_under_draft() {
    let (plain_steps, _, _) = run_prompts(
        SchedulerConfig {
            max_drafts: 0,
            ..drafting(64)
        },
        FakeShard::new(1),
    );
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let (steps, _, shard) = metrics::with_local_recorder(&recorder, || {
        super::metrics::describe();
        run_prompts(drafting(64), FakeShard::new(1))
    });
    assert!(
        steps * 3 < plain_steps * 2,
        "{steps} steps with model drafts, {plain_steps} without"
    );
    let text = handle.render();
    let proposed = counter(&text, "tandem_speculative_draft_tokens_total", "draft");
    let kept = counter(&text, "tandem_speculative_accepted_tokens_total", "draft");
    assert_eq!(
        proposed, shard.model_drafts as u64,
        "every draft the shard proposed is counted"
    );
    assert!(0 < kept && kept < proposed, "{kept} of {proposed} kept");
    for method in ["ngram", "radix"] {
        assert_eq!(
            counter(&text, "tandem_speculative_draft_tokens_total", method),
            0
        );
    }
}

#[test]
fn model_drafts_with_two_steps_in_flight_change_no_output() {
    let pipelined = SchedulerConfig {
        steps_in_flight: 2,
        ..drafting(64)
    };
    let (_, _, shard) = run_prompts(pipelined, FakeShard::new(1));
    assert!(shard.model_drafts > 0);
}

#[test]
fn refused_model_drafts_hold_their_blocks_only_until_the_request_ends() {
    // One token per block: the fake shard panics unless the step's blocks cover its 1 + k tokens.
    let mut shard = FakeShard::new(1);
    shard.draft_model = Some(|_| 0);
    let (_, _, shard) = run_prompts(drafting(64), shard);
    assert!(shard.model_drafts > 0);
}

#[test]
fn preemption_under_model_drafts_resumes_the_same_tokens_and_leaks_nothing() {
    // Each request needs 18 blocks at its longest; three cannot run together in 24.
    let (_, state, shard) = run_prompts(drafting(24), FakeShard::new(1));
    assert!(state.preemptions() > 0, "no request was preempted");
    assert!(shard.model_drafts > 0);
}

#[test]
fn a_request_cancelled_while_drafting_with_the_model_frees_its_blocks() {
    let mut state = SchedulerState::new(drafting(64));
    let mut shard = FakeShard::new(1);
    let mut kept = submit(&mut state, 0, request(PROMPTS[0], 13));
    let mut cancelled = Some(submit(&mut state, 1, request(PROMPTS[1], 13)));
    let mut cancelled_mid_draft = false;
    while let Some(step) = state.schedule() {
        let drafting_1 = step
            .scheduled
            .iter()
            .any(|s| s.id == 1 && s.num_model_drafts > 0);
        if drafting_1 && cancelled.take().is_some() {
            cancelled_mid_draft = true;
        }
        let answer = shard.step(step);
        state.apply(answer);
    }
    assert!(cancelled_mid_draft, "request 1 never drafted");
    assert_eq!(tokens_of(&mut kept), expected(model, PROMPTS[0], 13));
    assert_eq!(state.pool().used(), 0);
    assert!(shard.requests.is_empty(), "the shard still holds requests");
}

/// The most model drafts each request got in one step, and how many steps carried any.
fn model_drafts_per_request(
    config: SchedulerConfig,
    shard: &mut FakeShard,
    requests: Vec<GenerationRequest>,
) -> (BTreeMap<u64, usize>, usize) {
    let mut state = SchedulerState::new(config);
    let mut receivers: Vec<_> = requests
        .into_iter()
        .zip(0..)
        .map(|(request, id)| (submit(&mut state, id, request.clone()), request))
        .collect();
    let mut most = BTreeMap::new();
    let mut drafted_steps = 0;
    while let Some(step) = state.schedule() {
        drafted_steps += usize::from(carries_model_drafts(&step));
        for scheduled in &step.scheduled {
            assert!(
                scheduled.draft_token_ids.is_empty(),
                "the router listed drafts"
            );
            let entry = most.entry(scheduled.id).or_insert(0);
            *entry = scheduled.num_model_drafts.max(*entry);
        }
        let answer = shard.step(step);
        state.apply(answer);
    }
    let target = shard.model.unwrap_or(model);
    for (receiver, request) in &mut receivers {
        let max_new_tokens = request.stopping.max_new_tokens;
        assert_eq!(
            tokens_of(receiver),
            expected(target, &request.input_ids, max_new_tokens)
        );
    }
    assert_eq!(state.pool().used(), 0);
    (most, drafted_steps)
}

fn carries_model_drafts(step: &Step) -> bool {
    step.scheduled
        .iter()
        .any(|scheduled| scheduled.num_model_drafts > 0)
}

#[test]
fn a_request_gets_at_most_its_own_speculate_in_model_drafts_and_none_with_zero() {
    let requests = [None, Some(0), Some(1)]
        .into_iter()
        .map(|max_drafts| GenerationRequest {
            max_drafts,
            ..request(PROMPTS[0], 13)
        })
        .collect();
    let (most, _) = model_drafts_per_request(drafting(64), &mut FakeShard::new(1), requests);
    assert_eq!(most, BTreeMap::from([(0, 4), (1, 0), (2, 1)]));
}

#[test]
fn a_request_whose_model_drafts_keep_being_refused_drafts_ever_more_rarely() {
    let mut shard = FakeShard::new(1);
    shard.draft_model = Some(|_| 0);
    let requests = vec![request(&[1, 2, 3, 4, 5], 400)];
    let (_, drafted_steps) = model_drafts_per_request(drafting(512), &mut shard, requests);
    // Pauses of 8, 16, 32, 64, then 128 tokens after each refusal.
    assert!(
        (1..=9).contains(&drafted_steps),
        "{drafted_steps} drafted steps"
    );
}

#[test]
fn no_step_asks_for_model_drafts_while_more_requests_run_than_the_drafting_batch() {
    let requests = || PROMPTS.iter().map(|prompt| request(prompt, 12)).collect();
    let batch_of = |max_drafting_batch| SchedulerConfig {
        max_drafting_batch,
        ..drafting(64)
    };
    let (_, drafted) = model_drafts_per_request(batch_of(3), &mut FakeShard::new(1), requests());
    assert!(drafted > 0);
    let (_, drafted) = model_drafts_per_request(batch_of(2), &mut FakeShard::new(1), requests());
    assert_eq!(drafted, 0);
}
