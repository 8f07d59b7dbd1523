//! `SchedulingPolicy::Priority`: waiting requests are admitted by priority, then arrival, and
//! the least urgent running request is preempted first; FCFS keeps arrival order throughout.
//! Outputs never depend on the order.

use super::config::SchedulerConfig;
use super::fake_shard::FakeShard;
use super::policy::SchedulingPolicy;
use super::request::GenerationRequest;
use super::state::SchedulerState;
use super::tests::{alone_output, config, preempted_ids, request, submit, tokens_of};

fn with_priority(priority: i32, prompt_len: u32, max_new_tokens: u32) -> GenerationRequest {
    GenerationRequest {
        priority,
        ..request(prompt_len, max_new_tokens)
    }
}

fn under(policy: SchedulingPolicy, base: SchedulerConfig) -> SchedulerState {
    SchedulerState::new(SchedulerConfig { policy, ..base })
}

/// The ids in the order their first step was scheduled, one request running at a time; the
/// first request runs before the others arrive with the given priorities.
fn admission_order(policy: SchedulingPolicy, priorities: &[i32]) -> Vec<u64> {
    let base = SchedulerConfig {
        max_batch_requests: 1,
        ..config(64, 64)
    };
    let mut state = under(policy, base);
    let mut shard = FakeShard::new(4);
    let mut receivers = vec![submit(&mut state, 0, with_priority(0, 6, 3))];
    let mut order = Vec::new();
    let first = state.schedule().expect("the first request waits");
    order.extend(first.new_requests.iter().map(|new| new.id));
    state.apply(shard.step(first));
    for (id, &priority) in (1..).zip(priorities) {
        receivers.push(submit(&mut state, id, with_priority(priority, 6, 3)));
    }
    while let Some(step) = state.schedule() {
        order.extend(step.new_requests.iter().map(|new| new.id));
        state.apply(shard.step(step));
    }
    for receiver in &mut receivers {
        assert_eq!(tokens_of(receiver), alone_output(6, 3));
    }
    order
}

#[test]
fn waiting_requests_are_admitted_by_priority_then_arrival() {
    let priorities = [5, -1, 5, 0];
    assert_eq!(
        admission_order(SchedulingPolicy::Priority, &priorities),
        [0, 2, 4, 1, 3]
    );
    assert_eq!(
        admission_order(SchedulingPolicy::Fcfs, &priorities),
        [0, 1, 2, 3, 4]
    );
}

/// The ids the shards were told to forget (preempted), three requests that cannot all hold
/// their blocks at once: 8 blocks of 4 tokens, each needing 4 at its longest.
fn preempted(policy: SchedulingPolicy, priorities: [i32; 3]) -> Vec<u64> {
    let mut state = under(policy, config(8, 64));
    let mut shard = FakeShard::new(4);
    let mut receivers: Vec<_> = (0..3)
        .zip(priorities)
        .map(|(id, priority)| submit(&mut state, id, with_priority(priority, 6, 10)))
        .collect();
    preempted_ids(&mut state, &mut shard, &mut receivers)
}

#[test]
fn the_least_urgent_running_request_is_preempted_first() {
    // The oldest request is the least urgent: under priority it alone gives way.
    assert_eq!(preempted(SchedulingPolicy::Priority, [9, 0, 0]), [0]);
    // FCFS preempts the newest.
    assert_eq!(preempted(SchedulingPolicy::Fcfs, [0, 0, 0]), [2]);
}
