//! The step loop: owns `SchedulerState`, drives the shards with up to
//! `steps_in_flight` Steps sent at once, and rides through shard restarts (see `recovery`).
//!
//! With two Steps in flight the router plans and sends step N+1 while the shards run step N
//! (a request's next token is scheduled before it is known; the shards fill it in), so the
//! router's work and the transport overlap the forward pass. The `StepPacer` sends it late
//! in step N, so requests arriving meanwhile still join it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

use super::error::SchedulerError;
use super::handle::Command;
use super::in_flight::InFlightStep;
use super::load::LoadSnapshot;
use super::pacer::StepPacer;
use super::recovery::{self, EnginePhase, RecoveryConfig};
use super::state::SchedulerState;
use crate::shard::KvCacheSize;
use crate::shard::{ShardGroup, Step};

/// The only owner of the scheduler's state.
pub(crate) struct Actor {
    pub state: SchedulerState,
    pub shards: Arc<dyn ShardGroup>,
    pub submissions: mpsc::UnboundedReceiver<Command>,
    pub load: watch::Sender<LoadSnapshot>,
    pub phase: watch::Sender<EnginePhase>,
    pub recovery: RecoveryConfig,
    /// At least 1; 2 overlaps planning the next step with the current one.
    pub steps_in_flight: usize,
    /// Sent, not yet answered, oldest first.
    pub in_flight: VecDeque<InFlightStep>,
    /// Deep probes waiting for the steps in flight to answer (every rank then sees the
    /// probe at the same point between two steps).
    pub probes: Vec<oneshot::Sender<Result<(), SchedulerError>>>,
    /// Whether the loop has had work since the last step was sent (its forward gap is then
    /// the serving path's, not idle time).
    pub busy: bool,
    /// The shards answered a step since their Warmup: they know which step id comes next,
    /// so a second one may be sent before the first answers.
    pub shards_in_step: bool,
    /// When to send the next step while one runs.
    pub pacer: StepPacer,
}

/// Why holding the next step ended.
enum HoldEnd {
    /// Its time came, or no submission can arrive any more: send it.
    Due,
    /// A request arrived or the running step answered: look again.
    News,
}

impl Actor {
    /// Runs until every handle is gone and no request is left.
    pub async fn run(mut self) {
        loop {
            if self.in_flight.is_empty() && self.state.is_idle() && self.probes.is_empty() {
                self.busy = false;
                if !self.wait_for_work().await {
                    return;
                }
            }
            while let Ok(command) = self.submissions.try_recv() {
                self.accept(command);
            }
            self.expire_unstarted();
            if self.in_flight.is_empty() && !self.probes.is_empty() {
                self.probe_deeply().await;
                continue;
            }
            let depth = if self.shards_in_step {
                self.steps_in_flight
            } else {
                1
            };
            if self.probes.is_empty() && self.in_flight.len() < depth {
                if let Some(until) = self.next_send_time() {
                    if let HoldEnd::News = self.hold(until).await {
                        continue;
                    }
                }
                let scheduling = Instant::now();
                if let Some(step) = self.state.schedule() {
                    self.send(step, scheduling.elapsed());
                    self.publish_load();
                    continue;
                }
            }
            match self.in_flight.pop_front() {
                Some(step) => {
                    if !self.finish(step).await {
                        self.abandon_in_flight().await;
                        self.recover().await;
                    }
                }
                // Not idle yet nothing schedulable: wait for news instead of spinning.
                None => {
                    self.busy = false;
                    match self.submissions.recv().await {
                        Some(command) => self.accept(command),
                        None => {
                            self.state.fail_all(&SchedulerError::ShuttingDown);
                            return;
                        }
                    }
                }
            }
            self.publish_load();
        }
    }

    /// Sends `step`, planned in `scheduling`, to every rank without waiting for its answer.
    fn send(&mut self, step: Step, scheduling: Duration) {
        let shards = Arc::clone(&self.shards);
        let step = InFlightStep::send(
            shards,
            step,
            self.recovery.step_timeout,
            scheduling,
            self.busy,
        );
        self.busy = true;
        self.in_flight.push_back(step);
    }

    /// When to send the next step while one is in flight and not yet answered; `None`: now.
    fn next_send_time(&self) -> Option<tokio::time::Instant> {
        match self.in_flight.front() {
            Some(running) if self.in_flight.len() == 1 && !running.is_settled() => self
                .pacer
                .send_at(running.sent, tokio::time::Instant::now()),
            _ => None,
        }
    }

    /// Waits until `until`, a submission or the running step's answer, whichever comes first.
    async fn hold(&mut self, until: tokio::time::Instant) -> HoldEnd {
        let Some(running) = self.in_flight.front_mut() else {
            return HoldEnd::Due;
        };
        tokio::select! {
            () = tokio::time::sleep_until(until) => HoldEnd::Due,
            () = running.settle() => HoldEnd::News,
            received = self.submissions.recv() => match received {
                Some(command) => {
                    self.accept(command);
                    HoldEnd::News
                }
                None => HoldEnd::Due,
            },
        }
    }

    /// Waits for `step`'s answer and applies it; `false` when it failed (every running
    /// request has then failed too).
    async fn finish(&mut self, step: InFlightStep) -> bool {
        let sent = step.sent;
        match step.answer().await {
            Ok((answer, timings)) => {
                let preparation = timings.planning
                    + Duration::try_from_secs_f32(answer.timings.prepare_ms / 1e3)
                        .unwrap_or_default();
                self.pacer
                    .answered(sent, tokio::time::Instant::now(), preparation);
                let applying = Instant::now();
                super::metrics::record_step_done(&timings, &answer.timings);
                if timings.back_to_back {
                    super::metrics::record_forward_gap(answer.timings.forward_gap_ms);
                }
                self.state.apply(answer);
                super::metrics::record_step_scheduling(timings.planning + applying.elapsed());
                self.shards_in_step = true;
                true
            }
            Err(error) => {
                tracing::error!(%error, "step failed; failing its requests");
                self.state.fail_running(&SchedulerError::ShardFailed(error));
                false
            }
        }
    }

    /// After a failed step: the later steps' answers are waited for (each within the step
    /// timeout) and dropped, so no Step is still on its way when the shards are reset.
    async fn abandon_in_flight(&mut self) {
        while let Some(step) = self.in_flight.pop_front() {
            if let Err(error) = step.answer().await {
                tracing::debug!(%error, "a step sent after the failed one failed too");
            }
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
                    self.accept(command);
                    if !self.state.is_idle() || !self.probes.is_empty() {
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

    /// Takes one command: a submission joins the queue, a deep probe waits until no step is
    /// in flight, so its forward never races a Step on any rank.
    fn accept(&mut self, command: Command) {
        match command {
            Command::Submit(sequence) => self.state.enqueue(*sequence),
            Command::DeepHealth(reply) => self.probes.push(reply),
            Command::CountUnderAdapter(name, reply) => {
                let _ = reply.send(self.state.requests_under_adapter(&name));
            }
        }
    }

    /// A one-token forward on every rank within the step timeout for the waiting probes;
    /// abandoned as soon as every asker stopped waiting.
    async fn probe_deeply(&mut self) {
        let mut replies = std::mem::take(&mut self.probes);
        replies.retain(|reply| !reply.is_closed());
        if replies.is_empty() {
            return;
        }
        let timeout = self.recovery.step_timeout;
        let answer = {
            let probe = tokio::time::timeout(timeout, self.shards.health(true));
            let abandoned =
                futures::future::join_all(replies.iter_mut().map(oneshot::Sender::closed));
            tokio::select! {
                outcome = probe => match outcome {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(error)) => Err(SchedulerError::ShardFailed(error.to_string())),
                    Err(_) => Err(SchedulerError::HealthTimeout(timeout.as_secs())),
                },
                _ = abandoned => {
                    tracing::debug!("deep health probe abandoned by its callers");
                    return;
                }
            }
        };
        for reply in replies {
            let _ = reply.send(answer.clone());
        }
    }

    /// While recovering, submissions queue and deep probes are answered at once.
    fn accept_while_recovering(&mut self, command: Command) {
        match command {
            Command::Submit(sequence) => self.state.enqueue(*sequence),
            Command::DeepHealth(reply) => {
                let _ = reply.send(Err(SchedulerError::Recovering));
            }
            Command::CountUnderAdapter(name, reply) => {
                let _ = reply.send(self.state.requests_under_adapter(&name));
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

    /// Waits until every rank answers, warms the shards up again and resumes. Meanwhile
    /// new requests are refused and queued ones fail once they waited `max_queue_time`.
    async fn recover(&mut self) {
        let started = Instant::now();
        self.shards_in_step = false;
        self.phase.send_replace(EnginePhase::Recovering);
        metrics::counter!("tandem_shard_recoveries_total").increment(1);
        for reply in self.probes.drain(..) {
            let _ = reply.send(Err(SchedulerError::Recovering));
        }
        tracing::warn!("recovering: waiting for the model shards to answer again");
        loop {
            while let Ok(command) = self.submissions.try_recv() {
                self.accept_while_recovering(command);
            }
            self.expire_queued(started);
            self.publish_load();
            match recovery::restore(self.shards.as_ref(), &self.recovery).await {
                Ok(size) if self.adopt_kv_size(size) => break,
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

    /// Takes the restarted shards' block and checkpoint counts and forgets every cached
    /// prefix (Warmup re-allocated the shards' cache); `false` if the pool cannot be reset yet.
    fn adopt_kv_size(&mut self, size: KvCacheSize) -> bool {
        let current = self.state.pool().total();
        let num_blocks = size.num_blocks;
        if !self
            .state
            .resize_kv_cache(num_blocks, size.state_checkpoints)
        {
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
        let max_loras = self.state.max_loras();
        if max_loras > 0 {
            let (running, waiting) = self.state.adapters();
            super::lora_metrics::record_adapters(max_loras, &running, &waiting);
        }
        self.load.send_replace(snapshot);
    }
}
