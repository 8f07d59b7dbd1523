//! Two steps in flight: step N+1 is planned and sent before step N answers, and every
//! request's tokens stay exactly what they are one step at a time.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::backend::Backend;
use super::config::SchedulerConfig;
use super::fake_shard::{expected_output, request, FakeShard};
use super::recovery::RecoveryConfig;
use super::request::GenerationEvent;
use super::sequence::Sequence;
use super::spawn;
use super::state::SchedulerState;
use crate::shard::{KvCacheSize, ShardError, ShardGroup, Step, StepAnswer, WarmupPlan};

const BLOCK_SIZE: usize = 4;

fn config() -> SchedulerConfig {
    SchedulerConfig {
        block_size: BLOCK_SIZE,
        num_blocks: 64,
        max_batch_tokens: 64,
        max_batch_requests: 8,
        prefix_caching: true,
        steps_in_flight: 2,
        max_drafts: 0,
        draft_method: super::drafting::DraftMethod::Ngram,
        max_drafting_batch: usize::MAX,
        max_loras: 0,
        policy: crate::scheduler::SchedulingPolicy::Fcfs,
        offload: crate::kv::OffloadSlots::default(),
        state_checkpoints: None,
    }
}

fn submit(state: &mut SchedulerState, id: u64, max_new_tokens: u32) -> Receiver {
    let (sender, receiver) = mpsc::unbounded_channel();
    let table = state.pool().new_table();
    state.enqueue(Sequence::new(id, request(max_new_tokens), table, sender));
    receiver
}

type Receiver = mpsc::UnboundedReceiver<GenerationEvent>;

fn tokens_of(receiver: &mut Receiver) -> Vec<u32> {
    let mut tokens = Vec::new();
    while let Ok(event) = receiver.try_recv() {
        if let GenerationEvent::Token(token) = event {
            tokens.push(token.id);
        }
    }
    tokens
}

/// Plans up to two steps ahead of the shard's answers until nothing is left; returns every
/// step sent.
fn run_two_in_flight(state: &mut SchedulerState, shard: &mut FakeShard) -> Vec<Step> {
    let mut sent = Vec::new();
    let mut in_flight = VecDeque::new();
    for _ in 0..1000 {
        if in_flight.len() < 2 {
            if let Some(step) = state.schedule() {
                sent.push(step.clone());
                in_flight.push_back(step);
                continue;
            }
        }
        let Some(step) = in_flight.pop_front() else {
            return sent;
        };
        state.apply(shard.step(step));
    }
    panic!("the scheduler never went idle");
}

#[test]
fn a_decode_is_planned_before_the_token_it_runs_is_known() {
    let mut state = SchedulerState::new(config());
    let mut shard = FakeShard::new(BLOCK_SIZE);
    let mut receiver = submit(&mut state, 0, 4);
    let prefill = state.schedule().expect("the prompt runs");
    let decode = state
        .schedule()
        .expect("its first decode is planned at once");
    assert_eq!(decode.scheduled.len(), 1);
    assert_eq!(
        (
            decode.scheduled[0].num_tokens,
            decode.scheduled[0].num_computed_tokens
        ),
        (1, 6)
    );
    state.apply(shard.step(prefill));
    state.apply(shard.step(decode));
    run_two_in_flight(&mut state, &mut shard);
    assert_eq!(
        tokens_of(&mut receiver),
        expected_output(&request(4).input_ids, 4)
    );
    assert_eq!(state.load().kv_blocks_used, 0);
}

#[test]
fn a_request_the_shard_ends_unforeseen_is_skipped_once_and_frees_its_blocks() {
    let mut state = SchedulerState::new(config());
    let mut shard = FakeShard::new(BLOCK_SIZE);
    shard.stop_at.insert(0, 2);
    let mut stopped = submit(&mut state, 0, 16);
    let mut other = submit(&mut state, 1, 5);
    let sent = run_two_in_flight(&mut state, &mut shard);
    assert_eq!(
        tokens_of(&mut stopped),
        expected_output(&request(2).input_ids, 2)
    );
    assert_eq!(
        tokens_of(&mut other),
        expected_output(&request(5).input_ids, 5)
    );
    assert_eq!(
        shard.skipped, 1,
        "the step planned before the stop was known skips it"
    );
    assert!(
        sent.iter().all(|step| step.finished.is_empty()),
        "the shard forgot it alone"
    );
    assert_eq!(state.load().kv_blocks_used, 0);
    assert!(shard.requests.is_empty());
}

#[test]
fn no_step_is_planned_past_the_last_token_a_request_may_have() {
    let mut state = SchedulerState::new(config());
    let mut shard = FakeShard::new(BLOCK_SIZE);
    let mut receiver = submit(&mut state, 0, 1);
    let prefill = state.schedule().expect("the prompt runs");
    assert!(state.schedule().is_none(), "its one token ends it");
    state.apply(shard.step(prefill));
    assert_eq!(tokens_of(&mut receiver).len(), 1);
    assert_eq!(shard.skipped, 0);
}

/// A shard group whose steps take 10 ms each; it counts how many overlap.
struct SlowShards {
    shard: Mutex<FakeShard>,
    running: AtomicUsize,
    most_at_once: AtomicUsize,
}

#[async_trait::async_trait]
impl ShardGroup for SlowShards {
    async fn step(&self, request: Step) -> Result<StepAnswer, ShardError> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_at_once.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let response = self.shard.lock().unwrap().step(request);
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(response)
    }

    async fn health(&self, _deep: bool) -> Result<(), ShardError> {
        Ok(())
    }

    async fn reset(&self) -> Result<(), ShardError> {
        Ok(())
    }

    async fn warmup(&self, _plan: WarmupPlan) -> Result<KvCacheSize, ShardError> {
        Ok(KvCacheSize::default())
    }
}

#[tokio::test(start_paused = true)]
async fn the_step_loop_keeps_two_steps_in_flight_and_outputs_are_unchanged() {
    let shards = Arc::new(SlowShards {
        shard: Mutex::new(FakeShard::new(BLOCK_SIZE)),
        running: AtomicUsize::new(0),
        most_at_once: AtomicUsize::new(0),
    });
    let recovery = RecoveryConfig::new(
        WarmupPlan::default(),
        Duration::from_secs(60),
        Duration::from_secs(5),
    );
    let backend: Arc<dyn Backend> = spawn(
        config(),
        recovery,
        Arc::clone(&shards) as Arc<dyn ShardGroup>,
        None,
    );
    let mut streams: Vec<_> = [6, 9]
        .into_iter()
        .map(|max_new_tokens| {
            (
                max_new_tokens,
                backend.submit(request(max_new_tokens)).unwrap(),
            )
        })
        .collect();
    for (max_new_tokens, stream) in &mut streams {
        let mut tokens = Vec::new();
        while let Some(event) = stream.events.recv().await {
            if let GenerationEvent::Token(token) = event {
                tokens.push(token.id);
                if token.finish.is_some() {
                    break;
                }
            }
        }
        assert_eq!(
            tokens,
            expected_output(&request(*max_new_tokens).input_ids, *max_new_tokens)
        );
    }
    assert_eq!(shards.most_at_once.load(Ordering::SeqCst), 2);
}
