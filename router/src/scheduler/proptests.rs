//! Random workloads against the fake shard: arrivals, prompt and output lengths,
//! cancellations, end-of-sequence stops, KV budgets, step budgets, one or two steps in
//! flight (the next step planned before the current one answered), and drafts by every method.
//!
//! Admission policy under test: the queue head is admitted first in any step that admits
//! anything (unless that step preempted, which puts the preempted request at the head),
//! so the head never starves; requests behind it may go in order of cached prefix.

use std::collections::VecDeque;

use proptest::prelude::*;
use tokio::sync::mpsc;

use super::checkpoints::CheckpointPlan;
use super::config::SchedulerConfig;
use super::drafting::DraftMethod;
use super::fake_shard::{expected_output, FakeShard};
use super::policy::SchedulingPolicy;
use super::request::{GenerationEvent, GenerationRequest};
use super::sequence::Sequence;
use super::state::SchedulerState;
use crate::kv::OffloadSlots;
use crate::shard::{SamplingParams, Step, StoppingParams};
use crate::tenant::{KeyId, Tenant};

#[derive(Debug, Clone)]
struct Arrival {
    at_step: usize,
    /// Tokens taken from the workload's shared prefix before `prompt` (prefix-cache traffic).
    shared_prefix_len: usize,
    prompt: Vec<u32>,
    max_new_tokens: u32,
    /// Drop the stream after this many tokens (a disconnect or a stop string).
    cancel_after: Option<usize>,
    /// The shard ends the request with EOS at this many tokens (a stop the router cannot
    /// foresee, unlike the length).
    eos_after: Option<u32>,
    /// The API key it came with, one of three (`None`: no key), for fair scheduling.
    key: Option<u8>,
}

#[derive(Debug, Clone)]
struct Workload {
    config: SchedulerConfig,
    arrivals: Vec<Arrival>,
    /// Disk slots of the offload tiers whose first read fails its checksum.
    torn_disk_slots: Vec<u32>,
}

fn arrival() -> impl Strategy<Value = Arrival> {
    (
        0usize..30,
        0usize..24,
        prop::collection::vec(0u32..50, 1..20),
        1u32..20,
        prop::option::weighted(0.25, 0usize..10),
        prop::option::weighted(0.25, 1u32..10),
        prop::option::weighted(0.8, 0u8..3),
    )
        .prop_map(
            |(at_step, shared_prefix_len, prompt, max_new_tokens, cancel_after, eos_after, key)| {
                Arrival {
                    at_step,
                    shared_prefix_len,
                    prompt,
                    max_new_tokens,
                    cancel_after,
                    eos_after,
                    key,
                }
            },
        )
}

fn workload() -> impl Strategy<Value = Workload> {
    (
        prop::collection::vec(arrival(), 1..24),
        prop::sample::select(vec![1usize, 2, 4, 8]),
        0usize..40,
        1usize..64,
        1usize..8,
        1usize..=2,
        (
            prop::sample::select(vec![0usize, 2, 4]),
            prop::sample::select(DraftMethod::ALL.to_vec()),
        ),
        // A model with recurrent state: (checkpoints, blocks between prompt checkpoints).
        prop::option::weighted(0.3, (0usize..6, 1usize..4)),
        prop::sample::select(vec![SchedulingPolicy::Fcfs, SchedulingPolicy::Fair]),
        // Offload tiers: (host slots, disk slots, torn disk slots).
        prop::option::weighted(
            0.4,
            (1usize..6, 0usize..6, prop::collection::vec(0u32..6, 0..3)),
        ),
    )
        .prop_map(
            |(
                mut arrivals,
                block_size,
                spare_blocks,
                max_batch_tokens,
                max_batch_requests,
                steps_in_flight,
                (max_drafts, draft_method),
                state,
                policy,
                offload,
            )| {
                arrivals.sort_by_key(|arrival| arrival.at_step);
                let shared_prefix: Vec<u32> = (0..24).map(|i| (i * 7 + 3) % 50).collect();
                for arrival in &mut arrivals {
                    let mut prompt = shared_prefix[..arrival.shared_prefix_len].to_vec();
                    prompt.append(&mut arrival.prompt);
                    arrival.prompt = prompt;
                }
                // Every request must fit alone, or submission would reject it.
                let largest = arrivals
                    .iter()
                    .map(|a| (a.prompt.len() + a.max_new_tokens as usize).div_ceil(block_size))
                    .max()
                    .unwrap_or(1);
                Workload {
                    config: SchedulerConfig {
                        block_size,
                        num_blocks: largest + spare_blocks,
                        max_batch_tokens,
                        max_batch_requests,
                        prefix_caching: true,
                        steps_in_flight,
                        // Speculation is refused for a model with recurrent state.
                        max_drafts: if state.is_some() { 0 } else { max_drafts },
                        draft_method,
                        max_drafting_batch: usize::MAX,
                        max_loras: 0,
                        policy,
                        state_checkpoints: state.map(|(count, blocks)| CheckpointPlan {
                            count,
                            interval: blocks * block_size,
                        }),
                        offload: offload.as_ref().map_or_else(
                            OffloadSlots::default,
                            |&(host, disk, _)| OffloadSlots { host, disk },
                        ),
                    },
                    arrivals,
                    torn_disk_slots: offload.map(|(_, _, torn)| torn).unwrap_or_default(),
                }
            },
        )
}

struct Client {
    events: Option<mpsc::UnboundedReceiver<GenerationEvent>>,
    tokens: Vec<u32>,
    finished: bool,
}

impl Client {
    fn drain(&mut self) {
        let Some(events) = self.events.as_mut() else {
            return;
        };
        while let Ok(event) = events.try_recv() {
            match event {
                GenerationEvent::Started { .. } | GenerationEvent::PromptLogprobs(_) => {}
                GenerationEvent::Token(token) => {
                    self.tokens.push(token.id);
                    self.finished |= token.finish.is_some();
                }
                GenerationEvent::Error(error) => panic!("unexpected error: {error}"),
            }
        }
    }
}

fn check_step_limits(config: &SchedulerConfig, step: &Step) -> Result<(), TestCaseError> {
    let tokens: usize = step
        .scheduled
        .iter()
        .map(|s| s.num_tokens + s.draft_token_ids.len() + s.num_model_drafts)
        .sum();
    prop_assert!(
        tokens <= config.max_batch_tokens,
        "{tokens} tokens over a budget of {}",
        config.max_batch_tokens
    );
    prop_assert!(
        step.scheduled.len() <= config.max_batch_requests,
        "too many requests in one step"
    );
    prop_assert!(
        step.scheduled.iter().all(|s| s.num_tokens > 0),
        "a request was scheduled for zero tokens"
    );
    let from_model = config.draft_method == DraftMethod::Model;
    prop_assert!(
        step.scheduled.iter().all(|s| {
            let drafts = s.draft_token_ids.len() + s.num_model_drafts;
            drafts <= config.max_drafts && (s.num_model_drafts > 0) == (from_model && drafts > 0)
        }),
        "drafts beyond --speculate, or not by the configured method"
    );
    Ok(())
}

fn run_workload(workload: &Workload) -> Result<(), TestCaseError> {
    let config = workload.config;
    let mut state = SchedulerState::new(config);
    let mut shard = FakeShard::new(config.block_size);
    shard.keeps_state = config.state_checkpoints.is_some();
    shard.torn_disk_slots = workload.torn_disk_slots.iter().copied().collect();
    let mut clients: Vec<Client> = Vec::new();
    let mut in_flight = VecDeque::new();
    for step_index in 0..100_000usize {
        arrive(workload, step_index, &mut state, &mut shard, &mut clients);
        for (client, arrival) in clients.iter_mut().zip(&workload.arrivals) {
            client.drain();
            if arrival
                .cancel_after
                .is_some_and(|after| client.tokens.len() >= after)
                && !client.finished
            {
                client.events = None;
            }
        }
        if in_flight.len() < config.steps_in_flight {
            let head = state.waiting_head();
            let preemptions_before = state.preemptions();
            if let Some(step) = state.schedule() {
                check_step_limits(&config, &step)?;
                // Under fair scheduling the least-served key goes first, not the queue head.
                let head = head.filter(|_| config.policy != SchedulingPolicy::Fair);
                if let (Some(head), false) = (head, step.new_requests.is_empty()) {
                    let preempted = state.preemptions() > preemptions_before;
                    prop_assert!(
                        preempted || step.new_requests.iter().any(|new| new.id == head),
                        "the queue head {} was passed over",
                        head
                    );
                }
                in_flight.push_back(step);
                continue;
            }
        }
        let Some(step) = in_flight.pop_front() else {
            if clients.len() == workload.arrivals.len() {
                return check_outcome(workload, &state, &shard, &mut clients);
            }
            continue;
        };
        let response = shard.step(step);
        shard.assert_shared_blocks_agree();
        state.apply(response);
    }
    Err(TestCaseError::fail(
        "the scheduler never finished the workload",
    ))
}

/// Enqueues the requests that arrive by `step_index`.
fn arrive(
    workload: &Workload,
    step_index: usize,
    state: &mut SchedulerState,
    shard: &mut FakeShard,
    clients: &mut Vec<Client>,
) {
    while let Some(arrival) = workload
        .arrivals
        .get(clients.len())
        .filter(|a| a.at_step <= step_index)
    {
        let (sender, events) = mpsc::unbounded_channel();
        let request = GenerationRequest {
            input_ids: arrival.prompt.clone(),
            sampling: SamplingParams::default(),
            stopping: StoppingParams {
                max_new_tokens: arrival.max_new_tokens,
                ..StoppingParams::default()
            },
            tenant: arrival.key.map(|key| Tenant::unweighted(KeyId::of(&[key]))),
            ..GenerationRequest::default()
        };
        let id = clients.len() as u64;
        if let Some(eos_after) = arrival.eos_after {
            shard.stop_at.insert(id, eos_after);
        }
        state.enqueue(Sequence::new(id, request, state.pool().new_table(), sender));
        clients.push(Client {
            events: Some(events),
            tokens: Vec::new(),
            finished: false,
        });
    }
}

fn check_outcome(
    workload: &Workload,
    state: &SchedulerState,
    shard: &FakeShard,
    clients: &mut [Client],
) -> Result<(), TestCaseError> {
    prop_assert!(state.is_idle());
    prop_assert_eq!(state.load().kv_blocks_used, 0, "blocks leaked");
    let checkpoints = state.pool().state_checkpoints();
    prop_assert_eq!(
        checkpoints.named + checkpoints.free,
        checkpoints.total,
        "state checkpoints leaked"
    );
    prop_assert!(shard.requests.is_empty(), "the shard still holds requests");
    for (id, (client, arrival)) in clients.iter_mut().zip(&workload.arrivals).enumerate() {
        client.drain();
        let length = arrival.eos_after.map_or(arrival.max_new_tokens, |eos| {
            eos.min(arrival.max_new_tokens)
        });
        let expected = expected_output(&arrival.prompt, length);
        if client.events.is_some() {
            prop_assert!(
                client.finished,
                "request {id} neither finished nor was cancelled"
            );
            prop_assert_eq!(
                &client.tokens,
                &expected,
                "request {} differs from its alone-output",
                id
            );
        } else {
            prop_assert!(
                expected.starts_with(&client.tokens),
                "cancelled request {id} got wrong tokens"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn random_workloads_complete_exactly_without_leaks_or_overtaking(workload in workload()) {
        run_workload(&workload)?;
    }
}
