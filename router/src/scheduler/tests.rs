//! The scheduler's rules, step by step, against the contract-checking fake shard.

use tokio::sync::mpsc;

use super::config::SchedulerConfig;
use super::error::SchedulerError;
use super::fake_shard::{expected_output, FakeShard};
use super::handle::check_capacity;
use super::request::{GenerationEvent, GenerationRequest};
use super::sequence::Sequence;
use super::state::SchedulerState;
use crate::shard::{Compilation, RequestFailureKind, SamplingParams, StoppingParams};

pub(super) fn config(num_blocks: usize, max_batch_tokens: usize) -> SchedulerConfig {
    SchedulerConfig {
        prefix_caching: true,
        steps_in_flight: 1,
        max_drafts: 0,
        draft_method: super::drafting::DraftMethod::Ngram,
        max_drafting_batch: usize::MAX,
        max_loras: 0,
        policy: crate::scheduler::SchedulingPolicy::Fcfs,
        offload: crate::kv::OffloadSlots::default(),
        state_checkpoints: None,
        block_size: 4,
        num_blocks,
        max_batch_tokens,
        max_batch_requests: 8,
    }
}

pub(super) fn request(prompt_len: u32, max_new_tokens: u32) -> GenerationRequest {
    GenerationRequest {
        input_ids: (0..prompt_len).map(|i| (i * 7 + prompt_len) % 50).collect(),
        sampling: SamplingParams::default(),
        stopping: StoppingParams {
            max_new_tokens,
            ..StoppingParams::default()
        },
        ..GenerationRequest::default()
    }
}

/// Queues `request` as sequence `id`, its blocks under the request's adapter.
pub(super) fn submit(
    state: &mut SchedulerState,
    id: u64,
    request: GenerationRequest,
) -> mpsc::UnboundedReceiver<GenerationEvent> {
    let (sender, receiver) = mpsc::unbounded_channel();
    let table = state.pool().new_table_under(request.adapter.clone());
    state.enqueue(Sequence::new(id, request, table, sender));
    receiver
}

pub(super) fn run_until_idle(state: &mut SchedulerState, shard: &mut FakeShard) {
    for _ in 0..10_000 {
        let Some(step) = state.schedule() else {
            return;
        };
        let response = shard.step(step);
        state.apply(response);
    }
    panic!("the scheduler never went idle");
}

/// Runs requests of 6 prompt tokens and 10 new ones until idle; checks that each kept its alone
/// output and that no block leaked. The ids the shard was told to forget (the preempted ones),
/// sorted.
pub(super) fn preempted_ids(
    state: &mut SchedulerState,
    shard: &mut FakeShard,
    receivers: &mut [mpsc::UnboundedReceiver<GenerationEvent>],
) -> Vec<u64> {
    run_until_idle(state, shard);
    for receiver in receivers {
        assert_eq!(tokens_of(receiver), alone_output(6, 10));
    }
    assert_eq!(state.load().kv_blocks_used, 0);
    let mut forgotten = shard.forgotten.clone();
    forgotten.sort_unstable();
    forgotten.dedup();
    forgotten
}

pub(super) fn tokens_of(receiver: &mut mpsc::UnboundedReceiver<GenerationEvent>) -> Vec<u32> {
    let mut tokens = Vec::new();
    while let Ok(event) = receiver.try_recv() {
        match event {
            GenerationEvent::Token(token) => tokens.push(token.id),
            GenerationEvent::Started { .. } | GenerationEvent::PromptLogprobs(_) => {}
            GenerationEvent::Error(error) => panic!("unexpected error: {error}"),
        }
    }
    tokens
}

/// The request's output when it runs alone, which must equal the fake model applied directly.
pub(super) fn alone_output(prompt_len: u32, max_new_tokens: u32) -> Vec<u32> {
    let mut state = SchedulerState::new(config(64, 64));
    let mut shard = FakeShard::new(4);
    let request = request(prompt_len, max_new_tokens);
    let expected = expected_output(&request.input_ids, max_new_tokens);
    let mut receiver = submit(&mut state, 0, request);
    run_until_idle(&mut state, &mut shard);
    let output = tokens_of(&mut receiver);
    assert_eq!(output, expected);
    output
}

#[test]
fn concurrent_requests_complete_and_free_every_block() {
    let mut state = SchedulerState::new(config(64, 32));
    let mut shard = FakeShard::new(4);
    let shapes = [(5, 3), (9, 6), (1, 10), (13, 2)];
    let mut receivers: Vec<_> = shapes
        .iter()
        .enumerate()
        .map(|(id, &(prompt, new))| submit(&mut state, id as u64, request(prompt, new)))
        .collect();
    run_until_idle(&mut state, &mut shard);
    for (receiver, &(prompt, new)) in receivers.iter_mut().zip(&shapes) {
        assert_eq!(tokens_of(receiver), alone_output(prompt, new));
    }
    assert_eq!(state.load().kv_blocks_used, 0);
    assert!(
        shard.requests.is_empty(),
        "the shard still holds finished requests"
    );
}

#[test]
fn long_prompt_is_prefilled_in_chunks_within_the_step_budget() {
    let mut state = SchedulerState::new(config(64, 8));
    let mut shard = FakeShard::new(4);
    let mut receiver = submit(&mut state, 0, request(20, 3));
    run_until_idle(&mut state, &mut shard);
    assert_eq!(shard.step_tokens[..3], [8, 8, 4]);
    assert!(shard.step_tokens.iter().all(|&tokens| tokens <= 8));
    assert_eq!(tokens_of(&mut receiver), alone_output(20, 3));
}

#[test]
fn preempted_requests_resume_with_the_same_tokens() {
    // 8 blocks of 4 tokens; each request needs 4 blocks at its longest, so three cannot run together.
    let mut state = SchedulerState::new(config(8, 64));
    let mut shard = FakeShard::new(4);
    let mut receivers: Vec<_> = (0..3)
        .map(|id| submit(&mut state, id, request(6, 10)))
        .collect();
    run_until_idle(&mut state, &mut shard);
    assert!(!shard.forgotten.is_empty(), "no request was preempted");
    let expected = alone_output(6, 10);
    for receiver in &mut receivers {
        assert_eq!(tokens_of(receiver), expected);
    }
    assert_eq!(state.load().kv_blocks_used, 0);
}

#[test]
fn dropped_stream_cancels_the_request_and_frees_its_blocks_at_the_next_step() {
    let mut state = SchedulerState::new(config(64, 64));
    let mut shard = FakeShard::new(4);
    let receiver = submit(&mut state, 7, request(10, 100));
    let step = state.schedule().unwrap();
    state.apply(shard.step(step));
    assert!(state.load().kv_blocks_used > 0);
    drop(receiver);
    let step = state.schedule().unwrap();
    assert_eq!(step.finished, vec![7]);
    assert!(step.scheduled.is_empty());
    assert_eq!(state.load().kv_blocks_used, 0);
    shard.step(step);
    assert!(shard.requests.is_empty());
    assert!(state.schedule().is_none());
}

#[test]
fn cancelled_waiting_request_never_reaches_the_shards() {
    let mut state = SchedulerState::new(SchedulerConfig {
        max_batch_requests: 1,
        ..config(64, 64)
    });
    let mut shard = FakeShard::new(4);
    let mut first = submit(&mut state, 0, request(4, 3));
    let second = submit(&mut state, 1, request(4, 3));
    let step = state.schedule().unwrap();
    assert_eq!(step.new_requests.len(), 1);
    state.apply(shard.step(step));
    drop(second);
    run_until_idle(&mut state, &mut shard);
    assert_eq!(tokens_of(&mut first), alone_output(4, 3));
    assert!(!shard.forgotten.contains(&1));
    assert!(state.is_idle());
}

#[test]
fn waiting_requests_are_admitted_in_arrival_order() {
    let mut state = SchedulerState::new(SchedulerConfig {
        max_batch_requests: 2,
        ..config(64, 64)
    });
    let _receivers: Vec<_> = (0..4)
        .map(|id| submit(&mut state, id, request(3, 2)))
        .collect();
    let step = state.schedule().unwrap();
    let admitted: Vec<u64> = step.new_requests.iter().map(|new| new.id).collect();
    assert_eq!(admitted, vec![0, 1]);
}

#[test]
fn decodes_keep_running_while_a_long_prompt_is_chunked() {
    let mut state = SchedulerState::new(config(64, 8));
    let mut shard = FakeShard::new(4);
    let mut short = submit(&mut state, 0, request(2, 6));
    let step = state.schedule().unwrap();
    state.apply(shard.step(step));
    let mut long = submit(&mut state, 1, request(30, 2));
    let step = state.schedule().unwrap();
    let decode = step
        .scheduled
        .iter()
        .find(|s| s.id == 0)
        .expect("the decode was starved");
    assert_eq!(decode.num_tokens, 1);
    state.apply(shard.step(step));
    run_until_idle(&mut state, &mut shard);
    assert_eq!(tokens_of(&mut short), alone_output(2, 6));
    assert_eq!(tokens_of(&mut long), alone_output(30, 2));
}

#[test]
fn failed_step_fails_running_requests_only() {
    let mut state = SchedulerState::new(SchedulerConfig {
        max_batch_requests: 1,
        ..config(64, 64)
    });
    let mut running = submit(&mut state, 0, request(4, 3));
    let _waiting = submit(&mut state, 1, request(4, 3));
    assert!(state.schedule().is_some());
    state.fail_running(&SchedulerError::ShardFailed("boom".into()));
    let events: Vec<_> = std::iter::from_fn(|| running.try_recv().ok()).collect();
    assert!(matches!(events.last(), Some(GenerationEvent::Error(_))));
    assert_eq!(state.load().running_requests, 0);
    assert_eq!(state.load().queued_requests, 1);
    assert_eq!(state.load().kv_blocks_used, 0);
}

#[test]
fn a_request_the_shard_fails_alone_ends_with_its_error_and_frees_its_blocks() {
    let mut state = SchedulerState::new(config(64, 32));
    let mut shard = FakeShard::new(4);
    shard.fail_after.insert(1, 3);
    let mut healthy = submit(&mut state, 0, request(5, 8));
    let mut failing = submit(&mut state, 1, request(9, 8));
    run_until_idle(&mut state, &mut shard);
    assert_eq!(tokens_of(&mut healthy), alone_output(5, 8));
    let mut failing_tokens = 0;
    let mut failure = None;
    while let Ok(event) = failing.try_recv() {
        match event {
            GenerationEvent::Token(_) => failing_tokens += 1,
            GenerationEvent::Error(error) => failure = Some(error),
            GenerationEvent::Started { .. } | GenerationEvent::PromptLogprobs(_) => {}
        }
    }
    assert_eq!(failing_tokens, 3);
    assert!(
        matches!(failure, Some(SchedulerError::RequestFailed(ref f)) if f.kind == RequestFailureKind::NoValidToken),
        "got {failure:?}"
    );
    assert_eq!(state.load().kv_blocks_used, 0);
    assert!(state.is_idle());
    assert!(
        !shard.forgotten.contains(&1),
        "the shard already forgot the request it failed; it is not told again"
    );
}

#[test]
fn request_larger_than_the_whole_cache_is_rejected_at_submission() {
    let error = check_capacity(&config(4, 64), &request(10, 10)).unwrap_err();
    assert!(matches!(
        error,
        SchedulerError::ExceedsKvCapacity {
            needed: 5,
            available: 4
        }
    ));
    assert!(check_capacity(&config(5, 64), &request(10, 10)).is_ok());
}

#[test]
fn a_repeated_prompt_starts_after_its_cached_prefix_with_the_same_output() {
    let mut state = SchedulerState::new(config(64, 64));
    let mut shard = FakeShard::new(4);
    let mut first = submit(&mut state, 0, request(18, 4));
    run_until_idle(&mut state, &mut shard);
    let mut second = submit(&mut state, 1, request(18, 4));
    let step = state.schedule().unwrap();
    // 18 prompt tokens: 4 full blocks are cached, the rest (2 tokens) is computed.
    assert_eq!(step.scheduled[0].num_computed_tokens, 16);
    assert_eq!(step.scheduled[0].num_tokens, 2);
    state.apply(shard.step(step));
    run_until_idle(&mut state, &mut shard);
    assert_eq!(tokens_of(&mut second), tokens_of(&mut first));
    assert_eq!(state.load().kv_blocks_used, 0);
}

#[test]
fn behind_the_head_the_longest_cached_prefix_is_admitted_first() {
    let mut state = SchedulerState::new(SchedulerConfig {
        max_batch_requests: 2,
        ..config(64, 64)
    });
    let mut shard = FakeShard::new(4);
    let cached = request(12, 1);
    let _warm = submit(&mut state, 0, cached.clone());
    run_until_idle(&mut state, &mut shard);
    let _head = submit(&mut state, 1, request(5, 1));
    let _cold = submit(&mut state, 2, request(7, 1));
    let _hit = submit(&mut state, 3, cached);
    let step = state.schedule().unwrap();
    let admitted: Vec<u64> = step.new_requests.iter().map(|new| new.id).collect();
    assert_eq!(admitted, vec![1, 3]);
}

fn submit_sibling(
    state: &mut SchedulerState,
    id: u64,
    leader: u64,
    request: GenerationRequest,
) -> mpsc::UnboundedReceiver<GenerationEvent> {
    let (sender, receiver) = mpsc::unbounded_channel();
    let mut sequence = Sequence::new(id, request, state.pool().new_table(), sender);
    sequence.leader = Some(leader);
    state.enqueue(sequence);
    receiver
}

#[test]
fn siblings_wait_for_the_leaders_prompt_then_start_after_its_cached_blocks() {
    let mut state = SchedulerState::new(config(64, 8));
    let mut shard = FakeShard::new(4);
    let mut leader = submit(&mut state, 0, request(18, 3));
    let mut siblings = [
        submit_sibling(&mut state, 1, 0, request(18, 3)),
        submit_sibling(&mut state, 2, 0, request(18, 3)),
    ];
    let _other = submit(&mut state, 3, request(3, 1));
    // 18 prompt tokens at 8 per step: the leader prefills over three steps, alone among
    // the siblings; the gated siblings do not hold back the unrelated request behind them.
    let mut admitted_while_prefilling = Vec::new();
    for _ in 0..3 {
        let step = state.schedule().unwrap();
        admitted_while_prefilling.extend(step.new_requests.iter().map(|new| new.id));
        state.apply(shard.step(step));
    }
    assert!(!admitted_while_prefilling.contains(&1) && !admitted_while_prefilling.contains(&2));
    assert!(admitted_while_prefilling.contains(&3));
    let mut sibling_starts = Vec::new();
    while sibling_starts.len() < 2 {
        let step = state.schedule().unwrap();
        for scheduled in &step.scheduled {
            if step.new_requests.iter().any(|new| new.id == scheduled.id) {
                sibling_starts.push(scheduled.num_computed_tokens);
            }
        }
        state.apply(shard.step(step));
    }
    // The prompt's 4 full blocks are shared; each sibling computes its own partial block.
    assert_eq!(sibling_starts, vec![16, 16]);
    run_until_idle(&mut state, &mut shard);
    let expected = tokens_of(&mut leader);
    for sibling in &mut siblings {
        assert_eq!(tokens_of(sibling), expected);
    }
    assert_eq!(state.load().kv_blocks_used, 0);
}

#[test]
fn the_load_reports_what_the_latest_answered_step_had_compiled() {
    let mut state = SchedulerState::new(config(64, 64));
    let mut shard = FakeShard::new(4);
    let _receiver = submit(&mut state, 1, request(4, 8));
    assert_eq!(state.load().compilation, None);
    let step = state.schedule().unwrap();
    let mut answer = shard.step(step);
    answer.compilation = Compilation {
        decode_rows: 4,
        compiling: true,
    };
    state.apply(answer);
    assert_eq!(
        state.load().compilation,
        Some(Compilation {
            decode_rows: 4,
            compiling: true,
        })
    );
}
