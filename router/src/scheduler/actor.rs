//! The step loop: owns `SchedulerState`, drives the shards one Step at a time.

use std::time::Instant;

use tokio::sync::{mpsc, watch};

use super::sequence::Sequence;
use super::state::SchedulerState;
use super::{LoadSnapshot, SchedulerError};
use crate::pb;
use crate::shard::ShardFleet;

/// Runs until every handle is gone and no request is left.
pub(crate) async fn run(
    mut state: SchedulerState,
    fleet: ShardFleet,
    mut submissions: mpsc::UnboundedReceiver<Sequence>,
    load: watch::Sender<LoadSnapshot>,
) {
    loop {
        if state.is_idle() {
            match submissions.recv().await {
                Some(sequence) => state.enqueue(sequence),
                None => return,
            }
        }
        while let Ok(sequence) = submissions.try_recv() {
            state.enqueue(sequence);
        }
        match state.schedule() {
            Some(step) => run_step(&mut state, &fleet, step).await,
            // Not idle yet nothing schedulable: wait for news instead of spinning.
            None => match submissions.recv().await {
                Some(sequence) => state.enqueue(sequence),
                None => {
                    state.fail_all(&SchedulerError::ShuttingDown);
                    return;
                }
            },
        }
        publish_load(&state, &load);
    }
}

async fn run_step(state: &mut SchedulerState, fleet: &ShardFleet, step: pb::StepRequest) {
    let batch_tokens: u32 = step
        .scheduled
        .iter()
        .map(|scheduled| scheduled.num_tokens)
        .sum();
    metrics::histogram!("tandem_batch_size").record(step.scheduled.len() as f64);
    metrics::histogram!("tandem_batch_tokens").record(f64::from(batch_tokens));
    let started = Instant::now();
    match fleet.step(step).await {
        Ok(response) => {
            metrics::histogram!("tandem_step_duration_seconds")
                .record(started.elapsed().as_secs_f64());
            metrics::histogram!("tandem_step_forward_seconds")
                .record(f64::from(response.forward_ms) / 1000.0);
            state.apply(response);
        }
        Err(error) => {
            tracing::error!(%error, "step failed; failing its requests and resetting the shards");
            state.fail_running(&SchedulerError::ShardFailed(error.to_string()));
            if let Err(error) = fleet.reset().await {
                tracing::error!(%error, "shard reset failed");
            }
        }
    }
}

fn publish_load(state: &SchedulerState, load: &watch::Sender<LoadSnapshot>) {
    let snapshot = state.load();
    metrics::gauge!("tandem_queue_size").set(snapshot.queued_requests as f64);
    metrics::gauge!("tandem_running_requests").set(snapshot.running_requests as f64);
    metrics::gauge!("tandem_kv_blocks_used").set(snapshot.kv_blocks_used as f64);
    metrics::gauge!("tandem_kv_blocks_total").set(snapshot.kv_blocks_total as f64);
    load.send_replace(snapshot);
}
