//! The step loop against a fake shard group that can hang: step timeouts, deep health probes
//! and queue deadlines, on tokio's paused clock.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::backend::Backend;
use super::config::SchedulerConfig;
use super::error::SchedulerError;
use super::fake_shard::{expected_output, request, FakeShard};
use super::recovery::{EnginePhase, RecoveryConfig};
use super::request::GenerationEvent;
use super::sequence::Sequence;
use super::spawn;
use super::state::SchedulerState;
use crate::shard::{KvCacheSize, ShardError, ShardGroup, Step, StepAnswer, WarmupPlan};

const BLOCK_SIZE: usize = 4;
const NUM_BLOCKS: usize = 32;
const STEP_TIMEOUT: Duration = Duration::from_secs(5);

/// Sets its flag when dropped: shows that a pending call was cancelled.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A shard group over one contract-checking `FakeShard` whose chosen step or deep probe
/// never answers.
#[derive(Default)]
struct HangingShards {
    shard: Mutex<Option<FakeShard>>,
    steps: AtomicUsize,
    hang_on_step: Option<usize>,
    hang_deep_health: bool,
    step_in_flight: Arc<AtomicBool>,
    deep_probes: AtomicUsize,
    deep_probe_during_step: AtomicBool,
    resets: AtomicUsize,
    probe_cancelled: Arc<AtomicBool>,
}

impl HangingShards {
    fn new(hang_on_step: Option<usize>, hang_deep_health: bool) -> Arc<Self> {
        Arc::new(Self {
            shard: Mutex::new(Some(FakeShard::new(BLOCK_SIZE))),
            hang_on_step,
            hang_deep_health,
            ..Self::default()
        })
    }
}

#[async_trait::async_trait]
impl ShardGroup for HangingShards {
    async fn step(&self, request: Step) -> Result<StepAnswer, ShardError> {
        let index = self.steps.fetch_add(1, Ordering::SeqCst);
        if self.hang_on_step == Some(index) {
            self.step_in_flight.store(true, Ordering::SeqCst);
            // Cleared when the router gives up on the step and drops this call.
            let _clear = ClearOnDrop(Arc::clone(&self.step_in_flight));
            std::future::pending::<()>().await;
        }
        let mut shard = self.shard.lock().unwrap();
        Ok(shard.as_mut().expect("the shard is up").step(request))
    }

    async fn health(&self, deep: bool) -> Result<(), ShardError> {
        if deep {
            self.deep_probes.fetch_add(1, Ordering::SeqCst);
            if self.step_in_flight.load(Ordering::SeqCst) {
                self.deep_probe_during_step.store(true, Ordering::SeqCst);
            }
            if self.hang_deep_health {
                let _cancelled = DropFlag(Arc::clone(&self.probe_cancelled));
                std::future::pending::<()>().await;
            }
        }
        Ok(())
    }

    async fn reset(&self) -> Result<(), ShardError> {
        self.resets.fetch_add(1, Ordering::SeqCst);
        *self.shard.lock().unwrap() = Some(FakeShard::new(BLOCK_SIZE));
        Ok(())
    }

    async fn warmup(&self, _plan: WarmupPlan) -> Result<KvCacheSize, ShardError> {
        Ok(KvCacheSize {
            num_blocks: NUM_BLOCKS,
            ..KvCacheSize::default()
        })
    }
}

/// Clears its flag when dropped.
struct ClearOnDrop(Arc<AtomicBool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

fn config() -> SchedulerConfig {
    SchedulerConfig {
        block_size: BLOCK_SIZE,
        num_blocks: NUM_BLOCKS,
        max_batch_tokens: 64,
        max_batch_requests: 8,
        prefix_caching: true,
        steps_in_flight: 1,
        max_drafts: 0,
        draft_method: super::drafting::DraftMethod::Ngram,
        max_drafting_batch: usize::MAX,
        max_loras: 0,
        policy: crate::scheduler::SchedulingPolicy::Fcfs,
        offload: crate::kv::OffloadSlots::default(),
        state_checkpoints: None,
    }
}

fn backend(shards: &Arc<HangingShards>) -> Arc<dyn Backend> {
    let recovery =
        RecoveryConfig::new(WarmupPlan::default(), Duration::from_secs(60), STEP_TIMEOUT);
    spawn(
        config(),
        recovery,
        Arc::clone(shards) as Arc<dyn ShardGroup>,
        None,
    )
}

/// The tokens of one request, or the error that ended it.
async fn outcome(
    backend: &Arc<dyn Backend>,
    max_new_tokens: u32,
) -> Result<Vec<u32>, SchedulerError> {
    let mut stream = backend.submit(request(max_new_tokens))?;
    let mut tokens = Vec::new();
    while let Some(event) = stream.events.recv().await {
        match event {
            GenerationEvent::Token(token) => {
                tokens.push(token.id);
                if token.finish.is_some() {
                    return Ok(tokens);
                }
            }
            GenerationEvent::Error(error) => return Err(error),
            GenerationEvent::Started { .. } | GenerationEvent::PromptLogprobs(_) => {}
        }
    }
    panic!("the stream closed without a last token");
}

async fn serving_again(backend: &Arc<dyn Backend>) {
    for _ in 0..1000 {
        if backend.phase() == EnginePhase::Serving {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the scheduler never recovered");
}

#[tokio::test(start_paused = true)]
async fn a_step_with_no_answer_within_the_step_timeout_fails_its_requests_and_recovers() {
    let shards = HangingShards::new(Some(1), false);
    let backend = backend(&shards);
    let started = tokio::time::Instant::now();
    let error = outcome(&backend, 4).await.unwrap_err();
    let SchedulerError::ShardFailed(message) = error else {
        panic!("unexpected {error:?}");
    };
    assert!(message.contains("no answer to Step within 5s"), "{message}");
    assert!(message.contains("--step-timeout"), "{message}");
    assert!(started.elapsed() >= STEP_TIMEOUT);
    serving_again(&backend).await;
    assert_eq!(shards.resets.load(Ordering::SeqCst), 1);
    let expected = expected_output(&request(4).input_ids, 4);
    assert_eq!(outcome(&backend, 4).await.unwrap(), expected);
}

#[tokio::test(start_paused = true)]
async fn a_deep_probe_runs_between_steps_and_never_during_one() {
    let shards = HangingShards::new(Some(0), false);
    let backend = backend(&shards);
    let running = {
        let backend = Arc::clone(&backend);
        tokio::spawn(async move { outcome(&backend, 3).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    // The first step hangs; the probe waits its turn behind it and never runs beside it:
    // it gives up, or is answered by the recovery that follows the step's timeout.
    let probe = backend.deep_health().await;
    assert!(
        matches!(
            probe,
            Err(SchedulerError::HealthTimeout(5) | SchedulerError::Recovering)
        ),
        "{probe:?}"
    );
    assert!(
        running.await.unwrap().is_err(),
        "the hung step failed its request"
    );
    serving_again(&backend).await;
    backend.deep_health().await.unwrap();
    assert!(shards.deep_probes.load(Ordering::SeqCst) >= 1);
    assert!(!shards.deep_probe_during_step.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn a_deep_probe_with_no_answer_is_cancelled_and_the_engine_keeps_serving() {
    let shards = HangingShards::new(None, true);
    let backend = backend(&shards);
    let started = tokio::time::Instant::now();
    let probe = backend.deep_health().await;
    assert!(
        matches!(probe, Err(SchedulerError::HealthTimeout(5))),
        "{probe:?}"
    );
    assert!(started.elapsed() >= STEP_TIMEOUT);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(shards.probe_cancelled.load(Ordering::SeqCst));
    let expected = expected_output(&request(2).input_ids, 2);
    assert_eq!(outcome(&backend, 2).await.unwrap(), expected);
    assert_eq!(backend.phase(), EnginePhase::Serving);
}

#[test]
fn requests_that_never_started_fail_once_their_queue_time_runs_out() {
    let mut state = SchedulerState::new(SchedulerConfig {
        max_batch_requests: 1,
        ..config()
    });
    let mut receivers: Vec<_> = (0..2)
        .map(|id| {
            let (sender, receiver) = mpsc::unbounded_channel();
            state.enqueue(Sequence::new(
                id,
                request(4),
                state.pool().new_table(),
                sender,
            ));
            receiver
        })
        .collect();
    assert_eq!(
        state.schedule().expect("one request runs").scheduled.len(),
        1
    );
    std::thread::sleep(Duration::from_millis(2));
    state.expire_unstarted(Instant::now(), &SchedulerError::QueueTimeout(60));
    assert!(matches!(
        receivers[0].try_recv(),
        Ok(GenerationEvent::Started { .. })
    ));
    assert!(
        receivers[0].try_recv().is_err(),
        "the running request goes on"
    );
    let error = receivers[1].try_recv();
    let Ok(GenerationEvent::Error(error)) = error else {
        panic!("unexpected {error:?}");
    };
    assert_eq!(
        error.to_string(),
        "the request waited 60s in the queue without starting (--max-queue-time); retry later"
    );
    assert_eq!(state.load().queued_requests, 0);
}
