//! `SchedulingPolicy::Fair` in the step loop: tenants rejoin at the busy floor, running
//! requests are served least-served key first (so preemption takes the most-served key's
//! latest request), and admission serves the key with the lowest virtual time.

use std::cmp::Reverse;
use std::collections::{HashSet, VecDeque};

use super::admission::ADMISSION_LOOKAHEAD;
use super::{Budget, SchedulerState};
use crate::scheduler::fair_share::TenantKey;
use crate::scheduler::policy::SchedulingPolicy;
use crate::scheduler::sequence::Sequence;
use crate::shard::Step;
use crate::tenant::Tenant;

impl SchedulerState {
    /// The tenants with waiting or running requests.
    pub(super) fn busy_tenants(&self) -> HashSet<TenantKey> {
        self.running
            .iter()
            .chain(&self.waiting)
            .map(Sequence::tenant_key)
            .collect()
    }

    /// Queues a new request by arrival; its tenant, if it had nothing waiting or running,
    /// rejoins at the lowest virtual time of the busy tenants.
    pub(super) fn enqueue_fairly(&mut self, sequence: Sequence) {
        let busy = self.busy_tenants();
        let tenant = sequence.tenant_key();
        if !busy.contains(&tenant) {
            let floor = busy
                .into_iter()
                .map(|busy| self.fair.virtual_time(busy))
                .min_by(f64::total_cmp);
            self.fair.rejoin(tenant, floor);
        }
        insert_by_arrival(&mut self.waiting, sequence);
    }

    #[cfg(test)]
    pub fn virtual_time_of(&self, tenant: Option<Tenant>) -> f64 {
        self.fair.virtual_time(tenant.map(|tenant| tenant.key))
    }

    /// Under fair scheduling, advances `tenant`'s virtual time by the `tokens` of the step's
    /// budget its request just took.
    pub(super) fn charge(&mut self, tenant: Option<Tenant>, tokens: usize) {
        if self.config.policy == SchedulingPolicy::Fair {
            self.fair.charge(tenant, tokens);
        }
    }

    /// Orders the running requests by their tenant's virtual time, then arrival: the
    /// least-served key is served first, and the last request (preempted first) is the latest
    /// arrival of the most-served key. The earliest arrival of them all comes first whatever
    /// its key: it is never preempted while others run, so it finishes, and preemption under
    /// memory pressure cannot take turns between keys whose order flips as they are served
    /// (each turn recomputing what the other lost) without any request finishing.
    pub(super) fn order_running_by_share(&mut self) {
        let fair = &self.fair;
        let earliest = self.running.iter().map(|sequence| sequence.id).min();
        self.running.sort_by(|a, b| {
            let (time_a, time_b) = (
                fair.virtual_time(a.tenant_key()),
                fair.virtual_time(b.tenant_key()),
            );
            (Some(b.id) == earliest)
                .cmp(&(Some(a.id) == earliest))
                .then(time_a.total_cmp(&time_b))
                .then(a.id.cmp(&b.id))
        });
    }

    /// With every batch slot taken, a tenant with nothing running that waits while no more
    /// served than the most-served running tenant takes one slot back, if that tenant holds
    /// several:
    /// its latest request (the last running one, see `order_running_by_share`) is preempted and
    /// recomputed later. So one key's burst cannot hold every slot while another key waits
    /// behind it. Slots only go from a tenant holding two or more to one holding none, so the
    /// taker keeps a slot and the giver too: no two tenants take a slot back and forth. Each
    /// waiting request takes a slot back at most once, so when it still cannot start (its
    /// blocks do not fit) the preempted request is not preempted again and again for it.
    pub(super) fn free_a_slot_fairly(&mut self) {
        if self.running.len() < self.config.max_batch_requests {
            return;
        }
        let Some(victim_tenant) = self.running.last().map(Sequence::tenant_key) else {
            return;
        };
        let victims_slots = self
            .running
            .iter()
            .filter(|sequence| sequence.tenant_key() == victim_tenant)
            .count();
        if victims_slots < 2 {
            return;
        }
        let running: HashSet<TenantKey> = self.running.iter().map(Sequence::tenant_key).collect();
        let least_served_idle = self
            .waiting
            .iter()
            .enumerate()
            .filter(|(_, sequence)| !sequence.claimed_a_slot)
            .filter(|(_, sequence)| !running.contains(&sequence.tenant_key()))
            .filter(|(_, sequence)| !self.gated_by_leader(sequence))
            .map(|(index, sequence)| (self.fair.virtual_time(sequence.tenant_key()), index))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let most_served_running = self.fair.virtual_time(victim_tenant);
        if let Some((_, index)) =
            least_served_idle.filter(|&(waiting, _)| waiting <= most_served_running)
        {
            self.waiting[index].claimed_a_slot = true;
            self.preempt_newest("a less served key waits for a batch slot");
        }
    }

    /// Fair admission: the tenant with the lowest virtual time (ties: the earliest waiting
    /// request) goes next, again and again as admission charges it. The first pick of a step
    /// is that tenant's oldest waiting request, and when it does not fit nothing is admitted,
    /// so it cannot starve. Later picks take, among the tenant's next `ADMISSION_LOOKAHEAD`
    /// waiting requests, the longest cached prefix first (ties: arrival); a tenant none of
    /// whose requests fit is passed over for the rest of the step.
    pub(super) fn admit_fairly(&mut self, budget: &mut Budget, step: &mut Step) {
        let mut passed_over = HashSet::new();
        let mut first_pick = true;
        while budget.tokens > 0 && budget.requests > 0 {
            let Some(tenant) = self.least_served_waiting_tenant(&passed_over) else {
                return;
            };
            let mut candidates = self.admissible_of(tenant);
            if first_pick {
                candidates.truncate(1);
            } else {
                candidates.sort_by_key(|&(cached, _)| Reverse(cached));
            }
            let admitted = candidates
                .into_iter()
                .any(|(_, id)| self.try_admit(id, budget, step));
            if !admitted {
                if first_pick {
                    return;
                }
                passed_over.insert(tenant);
            }
            first_pick = false;
        }
    }

    /// The tenant with an admissible waiting request and the lowest virtual time; ties go to
    /// the tenant whose request arrived first.
    fn least_served_waiting_tenant(&self, passed_over: &HashSet<TenantKey>) -> Option<TenantKey> {
        // The queue is in arrival order, so a tenant's first request seen is its oldest.
        self.waiting
            .iter()
            .filter(|sequence| !passed_over.contains(&sequence.tenant_key()))
            .filter(|sequence| !self.gated_by_leader(sequence))
            .min_by(|a, b| {
                let (time_a, time_b) = (
                    self.fair.virtual_time(a.tenant_key()),
                    self.fair.virtual_time(b.tenant_key()),
                );
                time_a.total_cmp(&time_b).then(a.id.cmp(&b.id))
            })
            .map(Sequence::tenant_key)
    }

    /// The next `ADMISSION_LOOKAHEAD` admissible waiting requests of `tenant`, oldest first,
    /// each with its cached prefix length.
    fn admissible_of(&self, tenant: TenantKey) -> Vec<(usize, u64)> {
        self.waiting
            .iter()
            .filter(|sequence| sequence.tenant_key() == tenant && !self.gated_by_leader(sequence))
            .take(ADMISSION_LOOKAHEAD)
            .map(|sequence| {
                let cached = self
                    .pool
                    .cached_prefix_tokens(sequence.blocks.adapter(), &sequence.cache_keys());
                (cached, sequence.id)
            })
            .collect()
    }
}

/// Inserts `sequence` after every waiting request that arrived before it (ids grow with
/// arrival).
pub(super) fn insert_by_arrival(waiting: &mut VecDeque<Sequence>, sequence: Sequence) {
    let index = waiting.partition_point(|queued| queued.id < sequence.id);
    waiting.insert(index, sequence);
}
