//! `SchedulingPolicy::Fair`: waiting requests are admitted by their key's virtual time, keys
//! are served tokens in proportion to their weights, an idle key rejoins without banked
//! credit, and preemption takes the most-served key's latest request. Outputs never depend on
//! the order.

use std::num::NonZeroU32;

use tokio::sync::mpsc;

use super::config::SchedulerConfig;
use super::fake_shard::FakeShard;
use super::policy::SchedulingPolicy;
use super::request::{GenerationEvent, GenerationRequest};
use super::state::SchedulerState;
use super::tests::{alone_output, config, preempted_ids, request, submit, tokens_of};
use crate::tenant::{KeyId, Tenant};

fn tenant(name: &str, weight: u32) -> Option<Tenant> {
    Some(Tenant {
        key: KeyId::of(name.as_bytes()),
        weight: NonZeroU32::new(weight).expect("a test weight is positive"),
        name: None,
    })
}

fn from(tenant: Option<Tenant>) -> GenerationRequest {
    GenerationRequest {
        tenant,
        ..request(6, 3)
    }
}

/// One request runs at a time and no prompt is served from the cache, so every request is
/// charged the same 8 tokens (6 prompt, 2 decode).
fn one_at_a_time(policy: SchedulingPolicy) -> SchedulerState {
    SchedulerState::new(SchedulerConfig {
        policy,
        max_batch_requests: 1,
        prefix_caching: false,
        ..config(64, 64)
    })
}

/// A scheduler, its fake shard and the streams of what was submitted, in submission order.
struct Harness {
    state: SchedulerState,
    shard: FakeShard,
    receivers: Vec<mpsc::UnboundedReceiver<GenerationEvent>>,
    admitted: Vec<u64>,
}

impl Harness {
    fn new(policy: SchedulingPolicy) -> Self {
        Self {
            state: one_at_a_time(policy),
            shard: FakeShard::new(4),
            receivers: Vec::new(),
            admitted: Vec::new(),
        }
    }

    /// Submits a request from `tenant`; its id is its submission index.
    fn submit(&mut self, tenant: Option<Tenant>) {
        let id = self.receivers.len() as u64;
        self.receivers
            .push(submit(&mut self.state, id, from(tenant)));
    }

    /// Runs one step; `false` when there was nothing to run.
    fn step(&mut self) -> bool {
        let Some(step) = self.state.schedule() else {
            return false;
        };
        self.admitted
            .extend(step.new_requests.iter().map(|new| new.id));
        let answer = self.shard.step(step);
        self.state.apply(answer);
        true
    }

    /// Runs steps until `count` requests have been admitted in all.
    fn run_until_admitted(&mut self, count: usize) {
        while self.admitted.len() < count {
            assert!(self.step(), "the scheduler went idle");
        }
    }

    /// Runs until idle; every request produced what it produces alone. The admission order.
    fn finish(mut self) -> Vec<u64> {
        while self.step() {}
        for receiver in &mut self.receivers {
            assert_eq!(tokens_of(receiver), alone_output(6, 3));
        }
        self.admitted
    }
}

/// Key A's request 0 runs; A queues ten more, then key B queues one (id 11).
fn flood_then_one(policy: SchedulingPolicy) -> Vec<u64> {
    let (a, b) = (tenant("sk-a", 1), tenant("sk-b", 1));
    let mut harness = Harness::new(policy);
    harness.submit(a);
    assert!(harness.step());
    for _ in 0..10 {
        harness.submit(a);
    }
    harness.submit(b);
    assert_eq!(harness.state.load().tenants, 2);
    harness.finish()
}

#[test]
fn a_keys_request_is_admitted_next_not_after_another_keys_flood() {
    let mut expected: Vec<u64> = vec![0, 11];
    expected.extend(1..=10);
    assert_eq!(flood_then_one(SchedulingPolicy::Fair), expected);
    let arrival: Vec<u64> = (0..=11).collect();
    assert_eq!(flood_then_one(SchedulingPolicy::Fcfs), arrival);
}

#[test]
fn without_keys_fair_admits_in_arrival_order() {
    let mut harness = Harness::new(SchedulingPolicy::Fair);
    harness.submit(None);
    assert!(harness.step());
    for _ in 0..5 {
        harness.submit(None);
    }
    assert_eq!(harness.state.load().tenants, 1);
    assert_eq!(harness.finish(), [0, 1, 2, 3, 4, 5]);
}

/// Requests admitted per key among the first `admissions`, both keys submitting alternately
/// far more than that: (weight 3, weight 1).
fn admitted_per_key(policy: SchedulingPolicy, admissions: usize) -> (usize, usize) {
    let (heavy, light) = (tenant("sk-heavy", 3), tenant("sk-light", 1));
    let mut harness = Harness::new(policy);
    for _ in 0..admissions {
        harness.submit(heavy);
        harness.submit(light);
    }
    harness.run_until_admitted(admissions);
    // Even ids are the heavy key's.
    let first = &harness.admitted[..admissions];
    let heavy_count = first.iter().filter(|&&id| id % 2 == 0).count();
    (heavy_count, admissions - heavy_count)
}

#[test]
fn weights_three_to_one_share_served_tokens_three_to_one() {
    // Every request is charged the same tokens, so admissions count tokens.
    let (heavy, light) = admitted_per_key(SchedulingPolicy::Fair, 40);
    assert!(
        (29..=31).contains(&heavy) && (9..=11).contains(&light),
        "heavy {heavy}, light {light}"
    );
    assert_eq!(admitted_per_key(SchedulingPolicy::Fcfs, 40), (20, 20));
}

#[test]
fn an_idle_key_rejoining_cannot_jump_ahead_by_its_idle_credit() {
    let (busy, idle) = (tenant("sk-busy", 1), tenant("sk-idle", 1));
    let mut harness = Harness::new(SchedulingPolicy::Fair);
    for _ in 0..10 {
        harness.submit(busy);
    }
    // The busy key is served six requests while the other idles.
    harness.run_until_admitted(6);
    assert!(harness.step());
    for _ in 0..3 {
        harness.submit(idle);
    }
    let order = harness.finish();
    // Ids 10 to 12 are the rejoining key's: they take turns with the busy key's.
    assert_eq!(order[6..12], [10, 6, 11, 7, 12, 8]);
}

/// The ids the shards were told to forget (preempted), and the scheduler after: three requests
/// that cannot all hold their blocks at once (8 blocks of 4 tokens, each needing 4 at its
/// longest), the first two from one key and the third from another.
fn two_of_a_then_one_of_b(config: SchedulerConfig) -> (Vec<u64>, SchedulerState) {
    let (a, b) = (tenant("sk-a", 1), tenant("sk-b", 1));
    let mut state = SchedulerState::new(config);
    let mut shard = FakeShard::new(4);
    let mut receivers: Vec<_> = [a, a, b]
        .into_iter()
        .zip(0..)
        .map(|(tenant, id)| {
            let request = GenerationRequest {
                tenant,
                ..request(6, 10)
            };
            submit(&mut state, id, request)
        })
        .collect();
    let preempted = preempted_ids(&mut state, &mut shard, &mut receivers);
    (preempted, state)
}

fn preempted(policy: SchedulingPolicy) -> Vec<u64> {
    two_of_a_then_one_of_b(SchedulerConfig {
        policy,
        ..config(8, 64)
    })
    .0
}

#[test]
fn preemption_takes_the_latest_request_of_the_most_served_key() {
    // Key A runs two requests, so it is served twice B's tokens: its latest gives way.
    assert_eq!(preempted(SchedulingPolicy::Fair), [1]);
    // FCFS preempts the newest, B's.
    assert_eq!(preempted(SchedulingPolicy::Fcfs), [2]);
}

/// Two of key A's requests and one of key B's cannot all hold their blocks, so A's latest is
/// preempted and recomputed. Each key pays once for what its requests needed: 6 prompt tokens
/// and 9 decodes each (no prefix cache), whatever the scheduler recomputed.
#[test]
fn a_preempted_requests_recomputation_is_not_charged_to_its_key_again() {
    let (preempted, state) = two_of_a_then_one_of_b(SchedulerConfig {
        policy: SchedulingPolicy::Fair,
        prefix_caching: false,
        ..config(8, 64)
    });
    assert_eq!(preempted, [1]);
    assert_eq!(state.virtual_time_of(tenant("sk-a", 1)), 30.0);
    assert_eq!(state.virtual_time_of(tenant("sk-b", 1)), 15.0);
}

/// Key A fills both batch slots with long requests, then key B sends one: under fair, B's
/// request runs in the very next step (A's latest gives its slot back and is recomputed
/// later); under fcfs it waits for one of A's to end. Every output is its alone output.
fn steps_until_b_runs(policy: SchedulingPolicy) -> usize {
    let (a, b) = (tenant("sk-a", 1), tenant("sk-b", 1));
    let mut state = SchedulerState::new(SchedulerConfig {
        policy,
        max_batch_requests: 2,
        ..config(64, 64)
    });
    let mut shard = FakeShard::new(4);
    let long = |tenant| GenerationRequest {
        tenant,
        ..request(6, 10)
    };
    let mut receivers = vec![
        submit(&mut state, 0, long(a)),
        submit(&mut state, 1, long(a)),
    ];
    for _ in 0..3 {
        let step = state.schedule().expect("A's requests run");
        let answer = shard.step(step);
        state.apply(answer);
    }
    receivers.push(submit(&mut state, 2, long(b)));
    let mut steps = 0;
    loop {
        steps += 1;
        let step = state.schedule().expect("the requests run until B's has");
        let b_runs = step.scheduled.iter().any(|span| span.id == 2);
        let answer = shard.step(step);
        state.apply(answer);
        if b_runs {
            break;
        }
    }
    let preempted = preempted_ids(&mut state, &mut shard, &mut receivers);
    let expected_preempted: &[u64] = if policy == SchedulingPolicy::Fair {
        &[1]
    } else {
        &[]
    };
    assert_eq!(preempted, expected_preempted);
    steps
}

#[test]
fn a_key_with_nothing_running_takes_a_slot_from_a_key_holding_several() {
    assert_eq!(steps_until_b_runs(SchedulingPolicy::Fair), 1);
    assert!(steps_until_b_runs(SchedulingPolicy::Fcfs) > 5);
}
