//! Admission: which waiting requests join the next step, and where each one starts.

use std::collections::HashSet;

use super::{Budget, SchedulerState};
use crate::kv::{self, AdoptedPrefix, PrefixFetch};
use crate::scheduler::policy::SchedulingPolicy;
use crate::scheduler::request::GenerationEvent;
use crate::scheduler::sequence::Sequence;
use crate::shard::Step;

/// Waiting requests behind the head that admission considers in one step.
pub(super) const ADMISSION_LOOKAHEAD: usize = 16;

impl SchedulerState {
    /// Admission rule: the queue head (the first waiting request the sibling gate lets
    /// through) always goes first, and when it does not fit nothing
    /// is admitted, so the head cannot starve. Behind it, the next `ADMISSION_LOOKAHEAD`
    /// waiting requests are admitted in order of longest cached prefix (ties: queue order;
    /// under `SchedulingPolicy::Priority`, more urgent priorities first), each that fits the
    /// remaining budget and blocks.
    pub(super) fn admit_waiting(&mut self, budget: &mut Budget, step: &mut Step) {
        if self.config.policy == SchedulingPolicy::Fair {
            self.admit_fairly(budget, step);
            return;
        }
        let Some(head) = self
            .waiting
            .iter()
            .find(|sequence| !self.gated_by_leader(sequence))
        else {
            return;
        };
        let head_id = head.id;
        if !self.try_admit(head_id, budget, step) {
            return;
        }
        let by_priority = self.config.policy == SchedulingPolicy::Priority;
        let mut candidates: Vec<(i32, usize, u64)> = self
            .waiting
            .iter()
            .take(ADMISSION_LOOKAHEAD)
            .map(|sequence| {
                (
                    if by_priority { sequence.priority } else { 0 },
                    self.pool
                        .cached_prefix_tokens(sequence.blocks.adapter(), &sequence.cache_keys()),
                    sequence.id,
                )
            })
            .collect();
        // Stable: equal keys keep queue order.
        candidates.sort_by_key(|&(priority, cached, _)| (priority, std::cmp::Reverse(cached)));
        for (_, _, id) in candidates {
            if budget.tokens == 0 || budget.requests == 0 {
                return;
            }
            self.try_admit(id, budget, step);
        }
    }

    /// Admits waiting request `id` if the step has room for its first chunk (see
    /// `next_chunk`) and its blocks can be had; it starts after its longest cached prefix.
    pub(super) fn try_admit(&mut self, id: u64, budget: &mut Budget, step: &mut Step) -> bool {
        if budget.tokens == 0
            || budget.requests == 0
            || self.running.len() >= self.config.max_batch_requests
        {
            return false;
        }
        let Some(index) = self.waiting.iter().position(|sequence| sequence.id == id) else {
            return false;
        };
        if self.gated_by_leader(&self.waiting[index]) || !self.adapter_fits(&self.waiting[index]) {
            return false;
        }
        let sequence = &mut self.waiting[index];
        // Prompt logprobs are computed by the forward pass, so such a request reuses no cache.
        let adopted = if sequence.logprobs.prompt_logprobs {
            AdoptedPrefix::default()
        } else {
            let keys = kv::cache_keys(&sequence.tokens, &sequence.images);
            sequence.blocks.adopt_cached_prefix(&keys)
        };
        // The rest of its prefix arrives from disk with a step not yet answered. Reads it started
        // itself are waited for once: were they pushed out again before it starts, it goes on
        // without them rather than start them again and again.
        let waits = match adopted.fetch {
            PrefixFetch::None => false,
            PrefixFetch::Pending => true,
            PrefixFetch::Started => !std::mem::replace(&mut sequence.started_a_fetch, true),
        };
        if waits {
            sequence.reset_for_recompute();
            return false;
        }
        let cached = adopted.tokens;
        sequence.num_computed = cached;
        if adopted.uncheckpointed_tokens > 0 {
            sequence.branch_point = Some(cached + adopted.uncheckpointed_tokens);
        }
        let Some(num_tokens) = self.next_chunk(&self.waiting[index], budget.tokens, budget.tokens)
        else {
            // It starts inside an image's span (after a cached prefix ending there) or at one,
            // and the step has no room for the rest of the span. Waiting requests hold no
            // blocks, cached or not.
            self.waiting[index].reset_for_recompute();
            return false;
        };
        let sequence = &mut self.waiting[index];
        let missing = sequence.blocks_missing_for(cached + num_tokens, self.config.block_size);
        if sequence.blocks.grow(missing).is_none() {
            // Waiting requests hold no blocks, cached or not.
            sequence.reset_for_recompute();
            return false;
        }
        let Some(mut sequence) = self.waiting.remove(index) else {
            return false;
        };
        metrics::counter!("tandem_prefix_cache_queries_tokens_total")
            .increment(sequence.tokens.len() as u64);
        metrics::counter!("tandem_prefix_cache_hits_tokens_total").increment(cached as u64);
        metrics::counter!("tandem_prefix_cache_uncheckpointed_tokens_total")
            .increment(adopted.uncheckpointed_tokens as u64);
        step.new_requests.push(sequence.new_request());
        let blocks = sequence.blocks.blocks().to_vec();
        let unpaid = sequence.take_unpaid(num_tokens);
        let mut scheduled = sequence.schedule(step.step_id, num_tokens, blocks, None);
        scheduled.restore_state_checkpoint = adopted.state_checkpoint;
        if let Some(plan) = self.config.state_checkpoints {
            plan.save_after(&mut sequence, &mut scheduled, self.config.block_size);
        }
        step.scheduled.push(scheduled);
        sequence.known_to_shards = true;
        if !sequence.started {
            sequence.started = true;
            metrics::histogram!("tandem_request_queue_duration_seconds")
                .record(sequence.arrived_at.elapsed().as_secs_f64());
            sequence.notify(GenerationEvent::Started {
                cached_tokens: cached,
            });
        }
        budget.tokens -= num_tokens;
        budget.requests -= 1;
        self.charge(sequence.tenant, unpaid);
        self.add_running(sequence);
        true
    }

    /// A request under a LoRA adapter that no running request selects joins only while the
    /// running requests select fewer than `max_loras` adapters: a step never carries more.
    fn adapter_fits(&self, sequence: &Sequence) -> bool {
        let Some(adapter) = sequence.blocks.adapter() else {
            return true;
        };
        let mut selected = HashSet::new();
        for running in &self.running {
            if let Some(other) = running.blocks.adapter() {
                if other.id == adapter.id {
                    return true;
                }
                selected.insert(other.id);
            }
        }
        selected.len() < self.config.max_loras
    }

    /// Sibling gate: a waiting sequence is held back while its leader is waiting or running
    /// with its prompt not yet computed and published, so the shared prompt's full blocks
    /// are computed once and the siblings adopt them from the prefix cache. A leader that
    /// finished or was cancelled holds nobody back.
    pub(super) fn gated_by_leader(&self, sequence: &Sequence) -> bool {
        let Some(leader) = sequence.leader else {
            return false;
        };
        self.waiting.iter().any(|waiting| waiting.id == leader)
            || self
                .running
                .iter()
                .any(|running| running.id == leader && !running.prompt_published)
    }
}
