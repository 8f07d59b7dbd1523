//! The step loop: owns `SchedulerState`, drives the shards one Step at a time, and rides
//! through shard restarts (see `recovery`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

use super::handle::Command;
use super::recovery::{self, EnginePhase, RecoveryConfig};
use super::state::SchedulerState;
use super::{LoadSnapshot, SchedulerError};
use crate::pb;
use crate::shard::ShardGroup;

/// The only owner of the scheduler's state.
pub(crate) struct Actor {
    pub state: SchedulerState,
    pub shards: Arc<dyn ShardGroup>,
    pub submissions: mpsc::UnboundedReceiver<Command>,
    pub load: watch::Sender<LoadSnapshot>,
    pub phase: watch::Sender<EnginePhase>,
    pub recovery: RecoveryConfig,
}

impl Actor {
    /// Runs until every handle is gone and no request is left.
    pub async fn run(mut self) {
        loop {
            if self.state.is_idle() && !self.wait_for_work().await {
                return;
            }
            while let Ok(command) = self.submissions.try_recv() {
                self.accept(command).await;
            }
            self.expire_unstarted();
            let scheduling = Instant::now();
            match self.state.schedule() {
                Some(step) => {
                    if !self.run_step(step, scheduling.elapsed()).await {
                        self.recover().await;
                    }
                }
                // Not idle yet nothing schedulable: wait for news instead of spinning.
                None => match self.submissions.recv().await {
                    Some(command) => self.accept(command).await,
                    None => {
                        self.state.fail_all(&SchedulerError::ShuttingDown);
                        return;
                    }
                },
            }
            self.publish_load();
        }
    }

    /// Waits for a submission, checking now and then that the idle shards still answer;
    /// `false` once every handle is gone.
    async fn wait_for_work(&mut self) -> bool {
        loop {
            tokio::select! {
                received = self.submissions.recv() => {
                    let Some(command) = received else {
                        return false;
                    };
                    self.accept(command).await;
                    if !self.state.is_idle() {
                        return true;
                    }
                }
                () = tokio::time::sleep(self.recovery.idle_health_interval) => {
                    if let Err(error) = recovery::shards_answer(self.shards.as_ref()).await {
                        tracing::error!(%error, "a shard stopped answering");
                        self.recover().await;
                        if !self.state.is_idle() {
                            return true;
                        }
                    }
                }
            }
        }
    }

    /// Takes one command: a submission joins the queue, a deep probe runs now, between
    /// two steps, so its forward never races a Step on any rank.
    async fn accept(&mut self, command: Command) {
        match command {
            Command::Submit(sequence) => self.state.enqueue(*sequence),
            Command::DeepHealth(reply) => self.probe_deeply(reply).await,
        }
    }

    /// A one-token forward on every rank within the step timeout; cancelled as soon as the
    /// asker stops waiting.
    async fn probe_deeply(&self, mut reply: oneshot::Sender<Result<(), SchedulerError>>) {
        if reply.is_closed() {
            return;
        }
        let timeout = self.recovery.step_timeout;
        let probe = tokio::time::timeout(timeout, self.shards.health(true));
        tokio::select! {
            outcome = probe => {
                let answer = match outcome {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(error)) => Err(SchedulerError::ShardFailed(error.to_string())),
                    Err(_) => Err(SchedulerError::HealthTimeout(timeout.as_secs())),
                };
                let _ = reply.send(answer);
            }
            () = reply.closed() => tracing::debug!("deep health probe abandoned by its caller"),
        }
    }

    /// While recovering, submissions queue and deep probes are answered at once.
    fn accept_while_recovering(&mut self, command: Command) {
        match command {
            Command::Submit(sequence) => self.state.enqueue(*sequence),
            Command::DeepHealth(reply) => {
                let _ = reply.send(Err(SchedulerError::Recovering));
            }
        }
    }

    /// Requests that waited `max_queue_time` without starting fail.
    fn expire_unstarted(&mut self) {
        let max_queue_time = self.recovery.max_queue_time;
        if let Some(cutoff) = Instant::now().checked_sub(max_queue_time) {
            let error = SchedulerError::QueueTimeout(max_queue_time.as_secs());
            self.state.expire_unstarted(cutoff, &error);
        }
    }

    /// Runs one step that took `scheduling` to plan; `false` when it failed (its requests
    /// have then failed too).
    async fn run_step(&mut self, step: pb::StepRequest, scheduling: Duration) -> bool {
        let batch_tokens: u32 = step
            .scheduled
            .iter()
            .map(|scheduled| scheduled.num_tokens)
            .sum();
        super::metrics::record_step_planned(step.scheduled.len(), batch_tokens);
        let started = Instant::now();
        let timeout = self.recovery.step_timeout;
        match recovery::within(timeout, "Step", self.shards.step(step)).await {
            Ok(response) => {
                super::metrics::record_step_done(started.elapsed(), &response);
                let applying = Instant::now();
                self.state.apply(response);
                super::metrics::record_step_scheduling(scheduling + applying.elapsed());
                true
            }
            Err(error) => {
                tracing::error!(%error, "step failed; failing its requests");
                self.state.fail_running(&SchedulerError::ShardFailed(error));
                false
            }
        }
    }

    /// Waits until every rank answers, warms the shards up again and resumes. Meanwhile
    /// new requests are refused and queued ones fail once they waited `max_queue_time`.
    async fn recover(&mut self) {
        let started = Instant::now();
        self.phase.send_replace(EnginePhase::Recovering);
        metrics::counter!("tandem_shard_recoveries_total").increment(1);
        tracing::warn!("recovering: waiting for the model shards to answer again");
        loop {
            while let Ok(command) = self.submissions.try_recv() {
                self.accept_while_recovering(command);
            }
            self.expire_queued(started);
            self.publish_load();
            match recovery::restore(self.shards.as_ref(), &self.recovery).await {
                Ok(num_blocks) if self.adopt_kv_size(num_blocks) => break,
                Ok(_) => {}
                Err(error) => tracing::debug!(%error, "the shards are not back yet"),
            }
            tokio::time::sleep(self.recovery.poll_interval).await;
        }
        self.phase.send_replace(EnginePhase::Serving);
        self.publish_load();
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis(),
            queued = self.state.load().queued_requests,
            "recovered: the shards are warmed up again"
        );
    }

    /// Queued requests fail once they waited `max_queue_time`, counted from the later of
    /// their arrival and the start of the recovery.
    fn expire_queued(&mut self, recovery_started: Instant) {
        let max_queue_time = self.recovery.max_queue_time;
        if recovery_started.elapsed() < max_queue_time {
            return;
        }
        if let Some(cutoff) = Instant::now().checked_sub(max_queue_time) {
            let error = SchedulerError::QueueTimeout(max_queue_time.as_secs());
            self.state.expire_waiting(cutoff, &error);
        }
    }

    /// Takes the restarted shards' block count and forgets every cached prefix (Warmup
    /// re-allocated the shards' cache); `false` if the pool cannot be reset yet.
    fn adopt_kv_size(&mut self, num_blocks: usize) -> bool {
        let current = self.state.pool().total();
        if !self.state.resize_kv_cache(num_blocks) {
            tracing::error!("cannot reset the KV pool while blocks are in use; retrying");
            return false;
        }
        if num_blocks != current {
            tracing::warn!(
                before = current,
                after = num_blocks,
                "the restarted shards have a different KV cache size"
            );
        }
        true
    }

    fn publish_load(&self) {
        let snapshot = self.state.load();
        super::metrics::record_load(&snapshot);
        self.load.send_replace(snapshot);
    }
}
