//! Riding through shard restarts: wait until every rank answers again, warm it up, resume.

use std::time::Duration;

use crate::shard::{KvCacheSize, ShardError, ShardGroup, WarmupPlan};

/// A shard that does not answer `Health` within this counts as down.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether the engine takes requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnginePhase {
    /// Warmed up and stepping.
    Serving,
    /// A step failed or a shard stopped answering: running requests have failed, queued
    /// ones wait (up to `max_queue_time`), new ones are refused until the shards are back.
    Recovering,
}

/// How the step loop rides through a shard restart.
#[derive(Debug, Clone)]
pub struct RecoveryConfig {
    /// Sent again to the restarted shards; the same parameters as at start-up.
    pub warmup: WarmupPlan,
    /// How long a request waits in the queue (also for the shards) before it fails.
    pub max_queue_time: Duration,
    /// How long one Step, deep health probe, Reset or Warmup may take before the shard
    /// group counts as dead.
    pub step_timeout: Duration,
    /// How often a recovering scheduler asks the shards whether they are back.
    pub poll_interval: Duration,
    /// How often an idle scheduler checks that the shards still answer.
    pub idle_health_interval: Duration,
}

impl RecoveryConfig {
    /// Polls every 500 ms while recovering and every 2 s while idle.
    pub fn new(warmup: WarmupPlan, max_queue_time: Duration, step_timeout: Duration) -> Self {
        Self {
            warmup,
            max_queue_time,
            step_timeout,
            poll_interval: Duration::from_millis(500),
            idle_health_interval: Duration::from_secs(2),
        }
    }
}

/// `call`'s answer, or an error naming `rpc` once `timeout` passed (the call is then dropped,
/// which cancels it on the shards).
pub(crate) async fn within<T>(
    timeout: Duration,
    rpc: &str,
    call: impl std::future::Future<Output = Result<T, ShardError>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, call).await {
        Ok(answer) => answer.map_err(|error| error.to_string()),
        Err(_) => Err(format!(
            "no answer to {rpc} within {}s (--step-timeout)",
            timeout.as_secs_f32()
        )),
    }
}

/// Every rank answers `Health` in time.
pub(crate) async fn shards_answer(shards: &dyn ShardGroup) -> Result<(), String> {
    match tokio::time::timeout(HEALTH_TIMEOUT, shards.health(false)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no Health answer within {HEALTH_TIMEOUT:?}")),
    }
}

/// Once every rank answers: drop all request state, warm up again, return the cache's size.
pub(crate) async fn restore(
    shards: &dyn ShardGroup,
    config: &RecoveryConfig,
) -> Result<KvCacheSize, String> {
    shards_answer(shards).await?;
    within(config.step_timeout, "Reset", shards.reset()).await?;
    let answer = within(config.step_timeout, "Warmup", shards.warmup(config.warmup)).await?;
    match answer.num_blocks {
        0 => Err("the restarted shards allocated no KV cache blocks".to_owned()),
        _ => Ok(answer),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tokio::sync::mpsc;

    use super::super::config::SchedulerConfig;
    use super::super::error::SchedulerError;
    use super::super::request::{GenerationEvent, GenerationRequest};
    use super::super::sequence::Sequence;
    use super::super::state::SchedulerState;
    use crate::shard::StoppingParams;

    fn state(num_blocks: usize) -> SchedulerState {
        SchedulerState::new(SchedulerConfig {
            block_size: 4,
            num_blocks,
            max_batch_tokens: 64,
            max_batch_requests: 8,
            prefix_caching: true,
            steps_in_flight: 1,
            max_drafts: 0,
            draft_method: super::super::drafting::DraftMethod::Ngram,
            max_drafting_batch: usize::MAX,
            max_loras: 0,
            policy: crate::scheduler::SchedulingPolicy::Fcfs,
            offload: crate::kv::OffloadSlots::default(),
            state_checkpoints: None,
        })
    }

    fn enqueue(state: &mut SchedulerState, id: u64) -> mpsc::UnboundedReceiver<GenerationEvent> {
        let (sender, receiver) = mpsc::unbounded_channel();
        let request = GenerationRequest {
            input_ids: vec![1, 2, 3, 4, 5],
            stopping: StoppingParams {
                max_new_tokens: 4,
                ..StoppingParams::default()
            },
            ..GenerationRequest::default()
        };
        state.enqueue(Sequence::new(id, request, state.pool().new_table(), sender));
        receiver
    }

    #[test]
    fn queued_requests_past_the_cutoff_fail_with_the_queue_timeout() {
        let mut state = state(8);
        let mut old = enqueue(&mut state, 0);
        let cutoff = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        let mut young = enqueue(&mut state, 1);
        state.expire_waiting(cutoff, &SchedulerError::QueueTimeout(60));
        assert!(matches!(
            old.try_recv(),
            Ok(GenerationEvent::Error(SchedulerError::QueueTimeout(60)))
        ));
        assert!(young.try_recv().is_err(), "the younger request still waits");
        assert_eq!(state.load().queued_requests, 1);
    }

    #[test]
    fn the_kv_pool_takes_the_restarted_shards_size_once_nothing_runs() {
        let mut state = state(8);
        let _waiting = enqueue(&mut state, 0);
        let step = state.schedule().expect("the request is admitted");
        assert_eq!(step.scheduled.len(), 1);
        assert!(
            !state.resize_kv_cache(16, 0),
            "a running request holds blocks"
        );
        state.fail_running(&SchedulerError::ShardFailed("rank 0 died".into()));
        assert!(state.resize_kv_cache(16, 0));
        assert_eq!(state.load().kv_blocks_total, 16);
        let _next = enqueue(&mut state, 1);
        assert!(
            state.schedule().is_some(),
            "new requests draw from the resized pool"
        );
    }
}
