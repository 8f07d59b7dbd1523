//! The scheduler against a fake shard that enforces the Step contract and derives each
//! token from what it reads back through the block table, so a block handed to two live
//! requests, or a wrong `num_computed_tokens`, changes the output or panics.

use std::collections::HashMap;

use tokio::sync::mpsc;

use super::handle::check_capacity;
use super::request::{GenerationEvent, GenerationRequest, SamplingParams, StoppingParams};
use super::sequence::Sequence;
use super::state::SchedulerState;
use super::{SchedulerConfig, SchedulerError};
use crate::pb;

struct FakeRequest {
    tokens: Vec<u32>,
    num_computed: usize,
    blocks: Vec<u32>,
    generated: u32,
    max_new_tokens: u32,
}

#[derive(Default)]
struct FakeShard {
    block_size: usize,
    /// The fake KV cache: slot -> token written there.
    slots: HashMap<usize, u32>,
    requests: HashMap<u64, FakeRequest>,
    forgotten: Vec<u64>,
    step_tokens: Vec<u32>,
}

impl FakeShard {
    fn new(block_size: usize) -> Self {
        Self {
            block_size,
            ..Self::default()
        }
    }

    fn slot(&self, request: &FakeRequest, position: usize) -> usize {
        let block = request.blocks[position / self.block_size] as usize;
        block * self.block_size + position % self.block_size
    }

    /// The "model": a hash of every token read back from the KV cache.
    fn next_token(&self, request: &FakeRequest) -> u32 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for position in 0..request.tokens.len() {
            let token = self.slots[&self.slot(request, position)];
            hash = (hash ^ u64::from(token)).wrapping_mul(0x0100_0000_01b3);
        }
        u32::try_from(hash % 1000).unwrap() + 1
    }

    fn step(&mut self, step: pb::StepRequest) -> pb::StepResponse {
        for id in &step.finished {
            self.requests.remove(id);
            self.forgotten.push(*id);
        }
        for new in step.new_requests {
            let stopping = new.stopping.unwrap();
            let previous = self.requests.insert(
                new.id,
                FakeRequest {
                    tokens: new.token_ids,
                    num_computed: 0,
                    blocks: Vec::new(),
                    generated: new.num_output_tokens,
                    max_new_tokens: stopping.max_new_tokens,
                },
            );
            assert!(previous.is_none(), "request {} registered twice", new.id);
        }
        self.step_tokens
            .push(step.scheduled.iter().map(|s| s.num_tokens).sum());
        let mut generations = Vec::new();
        for scheduled in step.scheduled {
            if let Some(generation) = self.run(&scheduled) {
                generations.push(generation);
            }
        }
        pb::StepResponse {
            generations,
            ..Default::default()
        }
    }

    fn run(&mut self, scheduled: &pb::ScheduledRequest) -> Option<pb::Generation> {
        let mut request = self
            .requests
            .remove(&scheduled.id)
            .expect("scheduled an unknown request");
        request.blocks.extend(&scheduled.new_block_ids);
        assert_eq!(request.num_computed, scheduled.num_computed_tokens as usize);
        let end = request.num_computed + scheduled.num_tokens as usize;
        assert!(end <= request.tokens.len(), "scheduled past the end");
        assert!(
            request.blocks.len() * self.block_size >= end,
            "blocks do not cover the step"
        );
        for position in request.num_computed..end {
            let slot = self.slot(&request, position);
            self.slots.insert(slot, request.tokens[position]);
        }
        request.num_computed = end;
        if end < request.tokens.len() {
            self.requests.insert(scheduled.id, request);
            return None;
        }
        let token = self.next_token(&request);
        request.tokens.push(token);
        request.generated += 1;
        let finished = request.generated >= request.max_new_tokens;
        if !finished {
            self.requests.insert(scheduled.id, request);
        }
        Some(pb::Generation {
            id: scheduled.id,
            token_id: token,
            logprob: 0.0,
            finish_reason: if finished {
                pb::FinishReason::Length as i32
            } else {
                0
            },
        })
    }
}

fn config(num_blocks: usize, max_batch_tokens: usize) -> SchedulerConfig {
    SchedulerConfig {
        block_size: 4,
        num_blocks,
        max_batch_tokens,
        max_batch_requests: 8,
    }
}

fn request(prompt_len: u32, max_new_tokens: u32) -> GenerationRequest {
    GenerationRequest {
        input_ids: (0..prompt_len).map(|i| (i * 7 + prompt_len) % 50).collect(),
        sampling: SamplingParams::default(),
        stopping: StoppingParams {
            max_new_tokens,
            ..StoppingParams::default()
        },
    }
}

fn submit(
    state: &mut SchedulerState,
    id: u64,
    request: GenerationRequest,
) -> mpsc::UnboundedReceiver<GenerationEvent> {
    let (sender, receiver) = mpsc::unbounded_channel();
    state.enqueue(Sequence::new(id, request, state.pool().new_table(), sender));
    receiver
}

fn run_until_idle(state: &mut SchedulerState, shard: &mut FakeShard) {
    for _ in 0..10_000 {
        let Some(step) = state.schedule() else {
            return;
        };
        let response = shard.step(step);
        state.apply(response);
    }
    panic!("the scheduler never went idle");
}

fn tokens_of(receiver: &mut mpsc::UnboundedReceiver<GenerationEvent>) -> Vec<u32> {
    let mut tokens = Vec::new();
    while let Ok(event) = receiver.try_recv() {
        match event {
            GenerationEvent::Token(token) => tokens.push(token.id),
            GenerationEvent::Started => {}
            GenerationEvent::Error(error) => panic!("unexpected error: {error}"),
        }
    }
    tokens
}

fn alone_output(prompt_len: u32, max_new_tokens: u32) -> Vec<u32> {
    let mut state = SchedulerState::new(config(64, 64));
    let mut shard = FakeShard::new(4);
    let mut receiver = submit(&mut state, 0, request(prompt_len, max_new_tokens));
    run_until_idle(&mut state, &mut shard);
    tokens_of(&mut receiver)
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
