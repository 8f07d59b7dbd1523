//! The step loop's pacing against shards that run one step at a time, as real shards do: a
//! request arriving early in a step joins the next one, and the shards never wait for a
//! step.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use super::backend::Backend;
use super::config::SchedulerConfig;
use super::fake_shard::{expected_output, request, FakeShard};
use super::recovery::RecoveryConfig;
use super::request::{GenerationEvent, GenerationStream};
use super::spawn;
use crate::shard::{KvCacheSize, ShardError, ShardGroup, Step, StepAnswer, WarmupPlan};

const BLOCK_SIZE: usize = 4;
const STEP: Duration = Duration::from_millis(40);

fn config() -> SchedulerConfig {
    SchedulerConfig {
        steps_in_flight: 2,
        ..super::tests::config(64, 64)
    }
}

/// Runs one step at a time, each `STEP` long, and notes when each started and ended.
struct SerialShards {
    shard: Mutex<FakeShard>,
    spans: std::sync::Mutex<Vec<(Instant, Instant)>>,
}

#[async_trait::async_trait]
impl ShardGroup for SerialShards {
    async fn step(&self, request: Step) -> Result<StepAnswer, ShardError> {
        // tokio's mutex is fair: steps run in the order they were sent.
        let mut shard = self.shard.lock().await;
        let started = Instant::now();
        tokio::time::sleep(STEP).await;
        let answer = shard.step(request);
        self.spans.lock().unwrap().push((started, Instant::now()));
        Ok(answer)
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

async fn next_token(stream: &mut GenerationStream) -> u32 {
    loop {
        match stream.events.recv().await {
            Some(GenerationEvent::Token(token)) => return token.id,
            Some(_) => {}
            None => panic!("the stream ended without a token"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_arriving_early_in_a_step_runs_in_the_next_one_and_the_shards_never_wait() {
    let shards = Arc::new(SerialShards {
        shard: Mutex::new(FakeShard::new(BLOCK_SIZE)),
        spans: std::sync::Mutex::new(Vec::new()),
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
    let long = 30;
    let mut running = backend.submit(request(long)).unwrap();
    let mut tokens = Vec::new();
    for _ in 0..10 {
        tokens.push(next_token(&mut running).await);
    }
    // A step started as the tenth token's step answered; the request comes 5 ms into it.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let arrived = Instant::now();
    let mut late = backend.submit(request(1)).unwrap();
    next_token(&mut late).await;
    let waited = arrived.elapsed();
    assert!(
        waited <= 2 * STEP,
        "the request waited {waited:?}: it missed the step after the running one"
    );
    while tokens.len() < long as usize {
        tokens.push(next_token(&mut running).await);
    }
    assert_eq!(tokens, expected_output(&request(long).input_ids, long));
    let spans = shards.spans.lock().unwrap().clone();
    let idle: Vec<Duration> = spans
        .windows(2)
        .map(|pair| pair[1].0.saturating_duration_since(pair[0].1))
        .collect();
    // The first steps are sent at once while the pacer has no measure of a step yet.
    assert!(
        idle.iter().all(Duration::is_zero),
        "the shards waited for a step: {idle:?}"
    );
}
