//! The scheduler's bookkeeping: which requests run, how many tokens each gets, which
//! blocks they use. Pure state, no I/O: `schedule` plans a step, `apply` takes its result.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Instant;

mod admission;
mod chunks;
mod delivery;
mod fairness;

use delivery::{deliver_span, pause_after_fruitless_try};
use fairness::insert_by_arrival;

use super::checkpoints::CheckpointPlan;
use super::config::SchedulerConfig;
use super::drafting::{propose, Drafts};
use super::error::SchedulerError;
use super::fair_share::FairShare;
use super::load::LoadSnapshot;
use super::policy::SchedulingPolicy;
use super::request::GenerationEvent;
use super::sequence::Sequence;
use crate::kv::{self, BlockPool};
use crate::shard::{Compilation, FailedRequest, Generation, ScheduledSpan, Step, StepAnswer};

/// What one step may still take.
struct Budget {
    tokens: usize,
    requests: usize,
}

/// Owned by the scheduler actor; nothing else touches it.
pub(crate) struct SchedulerState {
    config: SchedulerConfig,
    pool: BlockPool,
    /// FCFS queue; preempted requests go back to its front (by urgency under priority, by
    /// arrival under fair).
    waiting: VecDeque<Sequence>,
    /// Admission order: the newest request is last and is preempted first (under fair, the
    /// order of `order_running_by_share`).
    running: Vec<Sequence>,
    /// Each API key's virtual time under `SchedulingPolicy::Fair`.
    fair: FairShare,
    /// Requests the shards still hold but must drop at the next step.
    forget: Vec<u64>,
    /// Steps sent and not yet answered, oldest first; answers arrive in this order.
    in_flight: VecDeque<u64>,
    next_step_id: u64,
    preemptions: u64,
    /// What the shards had compiled at their latest answered step.
    compilation: Option<Compilation>,
}

impl SchedulerState {
    pub fn new(config: SchedulerConfig) -> Self {
        let pool = BlockPool::with_state_checkpoints(
            config.num_blocks,
            config.prefix_caching.then_some(config.block_size),
            config.state_checkpoints.map(|plan| plan.count),
        );
        pool.enable_offload(config.offload);
        Self {
            pool,
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            fair: FairShare::default(),
            forget: Vec::new(),
            in_flight: VecDeque::new(),
            next_step_id: 0,
            preemptions: 0,
            compilation: None,
        }
    }

    /// Most distinct LoRA adapters the running requests may select (0: the shards serve none).
    pub fn max_loras(&self) -> usize {
        self.config.max_loras
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Requests preempted so far.
    #[cfg(test)]
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// The request admission must serve first (cancelled ones are dropped before admission).
    #[cfg(test)]
    pub fn waiting_head(&self) -> Option<u64> {
        self.waiting
            .iter()
            .find(|sequence| !sequence.is_cancelled())
            .map(|sequence| sequence.id)
    }

    pub fn enqueue(&mut self, sequence: Sequence) {
        match self.config.policy {
            SchedulingPolicy::Fcfs => self.waiting.push_back(sequence),
            SchedulingPolicy::Priority => insert_by_urgency(&mut self.waiting, sequence),
            SchedulingPolicy::Fair => self.enqueue_fairly(sequence),
        }
    }

    /// Puts a preempted request back in the queue: at its head (FCFS: it arrived before every
    /// waiting request), or in its place by urgency.
    fn requeue(&mut self, sequence: Sequence) {
        match self.config.policy {
            SchedulingPolicy::Fcfs => self.waiting.push_front(sequence),
            SchedulingPolicy::Priority => insert_by_urgency(&mut self.waiting, sequence),
            SchedulingPolicy::Fair => insert_by_arrival(&mut self.waiting, sequence),
        }
    }

    /// Adds an admitted request to the running ones, which are served in order and preempted
    /// from the back: by admission (FCFS), or by urgency.
    fn add_running(&mut self, sequence: Sequence) {
        match self.config.policy {
            SchedulingPolicy::Fcfs | SchedulingPolicy::Fair => self.running.push(sequence),
            SchedulingPolicy::Priority => {
                let index = self
                    .running
                    .partition_point(|running| running.urgency() <= sequence.urgency());
                self.running.insert(index, sequence);
            }
        }
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty() && self.forget.is_empty()
    }

    pub fn load(&self) -> LoadSnapshot {
        let checkpoints = self.pool.state_checkpoints();
        LoadSnapshot {
            state_checkpoints_cached: checkpoints.named,
            state_checkpoints_total: checkpoints.total,
            queued_requests: self.waiting.len(),
            queued_tokens: self.waiting.iter().map(Sequence::remaining).sum(),
            running_requests: self.running.len(),
            kv_blocks_used: self.pool.used(),
            kv_blocks_total: self.pool.total(),
            kv_blocks_cached: self.pool.cached(),
            compilation: self.compilation,
            tenants: self.busy_tenants().len(),
        }
    }

    /// Requests waiting or running under the adapter `name`.
    pub fn requests_under_adapter(&self, name: &str) -> usize {
        self.running
            .iter()
            .chain(&self.waiting)
            .filter(|sequence| {
                sequence
                    .blocks
                    .adapter()
                    .is_some_and(|key| *key.name == *name)
            })
            .count()
    }

    /// The LoRA adapters running requests and waiting requests select, by name.
    pub fn adapters(&self) -> (BTreeSet<&str>, BTreeSet<&str>) {
        (
            adapter_names(&self.running),
            adapter_names(self.waiting.iter()),
        )
    }

    /// Plans the next step, or `None` when there is nothing to tell the shards.
    ///
    /// Running requests come first (oldest first), each getting its remaining tokens up to
    /// the budget; when blocks run out the newest running request is preempted. Then
    /// waiting requests are admitted in arrival order while budget and blocks allow. No
    /// prompt chunk ends inside an image's span (see `next_chunk`).
    pub fn schedule(&mut self) -> Option<Step> {
        self.drop_cancelled();
        if self.config.policy == SchedulingPolicy::Fair {
            self.order_running_by_share();
            self.free_a_slot_fairly();
        }
        let mut budget = Budget {
            tokens: self.config.max_batch_tokens,
            requests: self.config.max_batch_requests,
        };
        let mut step = Step {
            step_id: self.next_step_id,
            ..Default::default()
        };
        self.schedule_running(&mut budget, &mut step);
        self.admit_waiting(&mut budget, &mut step);
        step.finished = std::mem::take(&mut self.forget);
        step.kv_transfers = self.pool.take_kv_transfers(step.step_id);
        // A step of transfers alone still goes: a request waits for the disk reads it carries.
        if step.scheduled.is_empty() && step.finished.is_empty() && step.kv_transfers.is_empty() {
            return None;
        }
        self.next_step_id += 1;
        self.in_flight.push_back(step.step_id);
        Some(step)
    }

    fn schedule_running(&mut self, budget: &mut Budget, step: &mut Step) {
        let mut index = 0;
        while index < self.running.len() && budget.tokens > 0 && budget.requests > 0 {
            let sequence = &self.running[index];
            let awaits_drafting = sequence.draft_limit(self.server_draft_limit()) > 0
                && sequence.drafts_now()
                && !sequence.pending.is_empty();
            if sequence.remaining() == 0 || awaits_drafting {
                // Its next token depends on a step in flight that may also end it, or the
                // step after that one drafts from it.
                index += 1;
                continue;
            }
            let decodes_behind = self.running[index + 1..]
                .iter()
                .filter(|sequence| sequence.remaining() == 1)
                .count();
            let remaining = self.running[index].remaining();
            // A prompt chunk leaves room for the single tokens of the decodes behind it.
            let share = if remaining > 1 {
                budget.tokens.saturating_sub(decodes_behind).max(1)
            } else {
                budget.tokens
            };
            let Some(num_tokens) = self.next_chunk(&self.running[index], share, budget.tokens)
            else {
                // Its chunk must reach the end of an image's span, which this step has no
                // room for: it takes nothing and holds no new block.
                index += 1;
                continue;
            };
            let drafts = self.drafts_for(index, budget.tokens - num_tokens);
            let num_drafts = drafts.as_ref().map_or(0, Drafts::count);
            let Some(new_blocks) = self.reserve_blocks(index, num_tokens + num_drafts) else {
                // `index` itself was the newest and got preempted; nothing runs after it.
                break;
            };
            let unpaid = self.running[index].take_unpaid(num_tokens);
            let mut scheduled =
                self.running[index].schedule(step.step_id, num_tokens, new_blocks, drafts);
            self.save_state_after(index, &mut scheduled);
            step.scheduled.push(scheduled);
            self.charge(self.running[index].tenant, unpaid + num_drafts);
            budget.tokens -= num_tokens + num_drafts;
            budget.requests -= 1;
            index += 1;
        }
    }

    /// Makes `running[index]`'s span, just scheduled, save its state where it is checkpointed.
    fn save_state_after(&mut self, index: usize, span: &mut ScheduledSpan) {
        if let Some(plan) = self.config.state_checkpoints {
            plan.save_after(&mut self.running[index], span, self.config.block_size);
        }
    }

    /// Drafts for `running[index]`'s next step, within `spare_tokens` of the step's budget. A
    /// request offered none pauses drafting for a few tokens.
    fn drafts_for(&mut self, index: usize, spare_tokens: usize) -> Option<Drafts> {
        let server_limit = self.server_draft_limit();
        let sequence = &mut self.running[index];
        let room = sequence
            .draft_room()
            .min(sequence.draft_limit(server_limit))
            .min(spare_tokens);
        let drafts = propose(
            self.config.draft_method,
            &sequence.cache_keys(),
            room,
            &self.pool,
            sequence.blocks.adapter(),
        );
        if room > 0 && drafts.is_none() {
            pause_after_fruitless_try(sequence, false);
        }
        drafts
    }

    /// Drafts per step the server allows now: none while more requests run than drafting pays for.
    fn server_draft_limit(&self) -> usize {
        if self.running.len() > self.config.max_drafting_batch {
            0
        } else {
            self.config.max_drafts
        }
    }

    /// Grows `running[index]`'s table to cover `num_tokens` more tokens, preempting the
    /// newest running requests as needed. `None` when `running[index]` itself was preempted.
    fn reserve_blocks(&mut self, index: usize, num_tokens: usize) -> Option<Vec<u32>> {
        loop {
            let block_size = self.config.block_size;
            let sequence = &mut self.running[index];
            let missing =
                sequence.blocks_missing_for(sequence.num_computed + num_tokens, block_size);
            if let Some(new_blocks) = sequence.blocks.grow(missing) {
                return Some(new_blocks.to_vec());
            }
            let preempting_itself = index + 1 == self.running.len();
            self.preempt_newest("KV blocks ran out");
            if preempting_itself {
                return None;
            }
        }
    }

    /// Preempts the last running request (the newest; under fair, the most-served key's
    /// latest) for `reason`: it waits again and is recomputed when readmitted.
    fn preempt_newest(&mut self, reason: &'static str) {
        let Some(mut sequence) = self.running.pop() else {
            return;
        };
        tracing::debug!(id = sequence.id, reason, "preempting");
        metrics::counter!("tandem_preemptions_total").increment(1);
        self.preemptions += 1;
        if sequence.known_to_shards {
            self.forget.push(sequence.id);
        }
        sequence.reset_for_recompute();
        self.requeue(sequence);
    }

    fn drop_cancelled(&mut self) {
        let forget = &mut self.forget;
        self.running.retain(|sequence| {
            if !sequence.is_cancelled() {
                return true;
            }
            metrics::counter!("tandem_cancelled_requests_total").increment(1);
            forget.push(sequence.id);
            false
        });
        // Waiting requests hold no shard state (preemption already asked shards to forget).
        self.waiting.retain(|sequence| {
            if !sequence.is_cancelled() {
                return true;
            }
            metrics::counter!("tandem_cancelled_requests_total").increment(1);
            false
        });
    }

    /// Delivers the answer of the oldest step in flight. Requests the shard finished are
    /// dropped (freeing their blocks); the shard has already forgotten them. Answers for a
    /// request that was cancelled or preempted after the step was sent are ignored.
    pub fn apply(&mut self, answer: StepAnswer) {
        let Some(step_id) = self.in_flight.pop_front() else {
            tracing::error!("a step answer arrived with no step in flight");
            return;
        };
        self.compilation = Some(answer.compilation);
        self.pool
            .kv_transfers_answered(step_id, &answer.failed_kv_transfers);
        // Before publishing: a failed request's blocks (non-finite logits may mean non-finite keys and values)
        // never enter the prefix cache.
        self.fail_requests(step_id, answer.failures);
        for chunk in answer.prompt_logprobs {
            if let Some(sequence) = self
                .running
                .iter()
                .find(|s| s.id == chunk.id && s.awaits(step_id))
            {
                sequence.notify(GenerationEvent::PromptLogprobs(chunk.logprobs));
            }
        }
        // A drafted request answers with several generations, in order.
        let mut generations: HashMap<u64, Vec<Generation>> = HashMap::new();
        for generation in answer.generations {
            generations
                .entry(generation.id)
                .or_default()
                .push(generation);
        }
        let mut ended = Vec::new();
        for (index, sequence) in self.running.iter_mut().enumerate() {
            let Some(span) = sequence.take_answered(step_id) else {
                continue;
            };
            let alive = !span.samples
                || deliver_span(
                    sequence,
                    &span,
                    generations.remove(&sequence.id),
                    &mut self.forget,
                );
            // Every token of the span is in the KV cache now: full blocks become shareable.
            let computed = sequence.computed_on_shards();
            let keys = kv::cache_keys(&sequence.tokens, &sequence.images);
            sequence.blocks.publish(&keys, computed);
            sequence.prompt_published = computed >= sequence.prompt_len;
            if !alive {
                ended.push(index);
            }
        }
        for index in ended.into_iter().rev() {
            self.running.remove(index);
        }
        for id in generations.into_keys() {
            tracing::debug!(id, "token for a request that no longer runs");
        }
    }

    /// Ends the requests the shards failed on their own (the shards have already forgotten them).
    fn fail_requests(&mut self, step_id: u64, failures: Vec<FailedRequest>) {
        for failure in failures {
            let Some(index) = self
                .running
                .iter()
                .position(|s| s.id == failure.id && s.awaits(step_id))
            else {
                tracing::debug!(id = failure.id, "failure for a request that no longer runs");
                continue;
            };
            let sequence = self.running.remove(index);
            let failure = failure.failure;
            tracing::debug!(
                id = sequence.id,
                reason = failure.kind.label(),
                "request failed on its own"
            );
            metrics::counter!("tandem_request_step_failures_total", "reason" => failure.kind.label())
                .increment(1);
            sequence.notify(GenerationEvent::Error(SchedulerError::RequestFailed(
                failure,
            )));
        }
    }

    /// After a failed step, every running request fails; waiting requests stay queued.
    pub fn fail_running(&mut self, error: &SchedulerError) {
        for sequence in self.running.drain(..) {
            sequence.notify(GenerationEvent::Error(error.clone()));
        }
        // The shards are reset after a failure, so they hold nothing to forget, and the
        // answers of the other steps in flight are dropped.
        self.forget.clear();
        self.in_flight.clear();
    }

    /// Fails everything (the scheduler is going away).
    pub fn fail_all(&mut self, error: &SchedulerError) {
        self.fail_running(error);
        for sequence in self.waiting.drain(..) {
            sequence.notify(GenerationEvent::Error(error.clone()));
        }
    }

    /// Fails the waiting requests that arrived at or before `cutoff` (their queue time ran out).
    pub fn expire_waiting(&mut self, cutoff: Instant, error: &SchedulerError) {
        self.waiting.retain(|sequence| {
            if sequence.arrived_at > cutoff {
                return true;
            }
            sequence.notify(GenerationEvent::Error(error.clone()));
            false
        });
    }

    /// Fails the waiting requests that never started and arrived before `cutoff` (preempted
    /// ones already stream and wait only for blocks, which running requests free).
    pub fn expire_unstarted(&mut self, cutoff: Instant, error: &SchedulerError) {
        self.waiting.retain(|sequence| {
            if sequence.started || sequence.arrived_at > cutoff {
                return true;
            }
            sequence.notify(GenerationEvent::Error(error.clone()));
            false
        });
    }

    /// Resets the KV pool to the shards' re-allocated cache of `num_blocks` (and
    /// `state_checkpoints`), forgetting every cached prefix; refused (`false`) unless no block
    /// is used.
    pub fn resize_kv_cache(&mut self, num_blocks: usize, state_checkpoints: usize) -> bool {
        let plan = self.config.state_checkpoints.map(|plan| CheckpointPlan {
            count: state_checkpoints,
            ..plan
        });
        if !self.running.is_empty() || !self.pool.resize(num_blocks, plan.map(|plan| plan.count)) {
            return false;
        }
        self.config.state_checkpoints = plan;
        let previous = std::mem::replace(&mut self.config.num_blocks, num_blocks);
        super::metrics::record_cache_config(&self.config, Some(previous));
        true
    }
}

fn adapter_names<'a>(sequences: impl IntoIterator<Item = &'a Sequence>) -> BTreeSet<&'a str> {
    sequences
        .into_iter()
        .filter_map(|sequence| sequence.blocks.adapter().map(|key| &*key.name))
        .collect()
}

/// Inserts `sequence` after every waiting request at least as urgent.
fn insert_by_urgency(waiting: &mut VecDeque<Sequence>, sequence: Sequence) {
    let index = waiting.partition_point(|queued| queued.urgency() <= sequence.urgency());
    waiting.insert(index, sequence);
}
