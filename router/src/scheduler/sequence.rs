//! One request as the scheduler tracks it: its tokens, its progress and its KV blocks.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::time::Instant;

use tokio::sync::mpsc;

use super::drafting::{DraftMethod, Drafts};
use super::request::{GenerationEvent, GenerationRequest};
use crate::images::PromptImage;
use crate::kv::{self, BlockTable};
use crate::shard::{
    Grammar, LogprobOptions, NewRequest, SamplingParams, ScheduledSpan, StoppingParams,
};
use crate::tenant::{KeyId, Tenant};

/// Tokens sent to the shards in a step that has not answered yet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PendingSpan {
    pub step_id: u64,
    /// `num_computed` before this span: what the shards hold once the steps before it ran.
    pub computed_before: usize,
    /// The span reaches the end of the sequence, so its step answers with the next token.
    pub samples: bool,
    /// Draft tokens run after the span (listed, or proposed by the shards' draft model); its
    /// step answers with the drafts the shards kept and one token more.
    pub drafts: usize,
    /// The method that proposed the drafts, if any (the label they are counted under).
    pub drafted_by: Option<DraftMethod>,
}

/// A request between admission and its last token.
///
/// Invariants: `num_computed <= tokens.len() + ` the sampling spans in `pending` (a step
/// may be planned before the one that samples its input has answered); `blocks` covers at
/// least `num_computed` tokens; `pending` is in step order; `known_to_shards` is true
/// exactly while the shards hold state for `id`.
#[derive(Debug)]
pub(crate) struct Sequence {
    pub id: u64,
    pub prompt_len: usize,
    /// The prompt followed by every token generated so far.
    pub tokens: Vec<u32>,
    /// Tokens scheduled so far: computed once every step in `pending` has run.
    pub num_computed: usize,
    pub pending: VecDeque<PendingSpan>,
    pub blocks: BlockTable,
    pub sampling: SamplingParams,
    pub stopping: StoppingParams,
    pub logprobs: LogprobOptions,
    pub grammar: Option<Grammar>,
    pub events: mpsc::UnboundedSender<GenerationEvent>,
    pub known_to_shards: bool,
    pub started: bool,
    /// The sibling whose prompt this one shares (`n` > 1, `best_of` > 1); see the sibling gate.
    pub leader: Option<u64>,
    /// Whether the whole prompt is computed and its full blocks are in the prefix cache.
    pub prompt_published: bool,
    pub arrived_at: Instant,
    /// Tokens to generate without drafts before drafting is tried again (after drafts that were
    /// all refused, or when its text offered none).
    pub draft_pause: usize,
    /// Tries in a row that kept no draft (all refused, or none proposed); each doubles the next
    /// pause.
    pub fruitless_in_a_row: u32,
    /// The request's own bound on drafts per step; `None` leaves the server's.
    pub max_drafts: Option<usize>,
    /// A model with recurrent state: the end of the cached prefix this request shared with
    /// earlier ones when it was admitted, where no checkpoint was yet (see `checkpoints`).
    pub branch_point: Option<usize>,
    /// Lower runs earlier under `SchedulingPolicy::Priority`.
    pub priority: i32,
    /// The API key served, whose share `SchedulingPolicy::Fair` keeps.
    pub tenant: Option<Tenant>,
    /// The prompt's images at their spans of `tokens`.
    pub images: Vec<PromptImage>,
    /// Whether admission already started the offload tiers' disk reads of its prefix: it starts
    /// them once, so entries pushed out again before it starts cannot hold it back.
    pub started_a_fetch: bool,
    /// Whether fair scheduling already preempted a request to free a batch slot for it (once
    /// at most; see `free_a_slot_fairly`).
    pub claimed_a_slot: bool,
    /// Positions (from the first) whose computation its tenant was charged for: recomputing
    /// them after a preemption is the scheduler's doing and is not charged again.
    pub paid_through: usize,
}

impl Sequence {
    pub fn new(
        id: u64,
        request: GenerationRequest,
        mut blocks: BlockTable,
        events: mpsc::UnboundedSender<GenerationEvent>,
    ) -> Self {
        blocks.retain_for(request.cache_retention);
        Self {
            id,
            prompt_len: request.input_ids.len(),
            tokens: request.input_ids,
            num_computed: 0,
            pending: VecDeque::new(),
            blocks,
            sampling: request.sampling,
            stopping: request.stopping,
            logprobs: request.logprobs,
            grammar: request.grammar,
            events,
            known_to_shards: false,
            started: false,
            leader: None,
            prompt_published: false,
            arrived_at: Instant::now(),
            draft_pause: 0,
            fruitless_in_a_row: 0,
            max_drafts: request.max_drafts,
            branch_point: None,
            priority: request.priority,
            tenant: request.tenant,
            images: request.images,
            started_a_fetch: false,
            claimed_a_slot: false,
            paid_through: 0,
        }
    }

    /// `tokens` as the prefix cache keys them (image spans keyed by their images).
    pub fn cache_keys(&self) -> Cow<'_, [u32]> {
        kv::cache_keys(&self.tokens, &self.images)
    }

    /// The key whose virtual time this request advances (`None`: the keyless tenant).
    pub fn tenant_key(&self) -> Option<KeyId> {
        self.tenant.map(|tenant| tenant.key)
    }

    /// The order `SchedulingPolicy::Priority` keeps requests in: lower priority values first,
    /// then arrival (ids grow with arrival).
    pub fn urgency(&self) -> (i32, u64) {
        (self.priority, self.id)
    }

    /// Most drafts per step for it under the server's bound `server_max_drafts`.
    pub fn draft_limit(&self, server_max_drafts: usize) -> usize {
        self.max_drafts
            .map_or(server_max_drafts, |own| own.min(server_max_drafts))
    }

    /// Tokens still to schedule: a prompt's rest, or the one token sampled last step, or
    /// the one a step in flight will sample (none when that token is the last one allowed).
    pub fn remaining(&self) -> usize {
        if self.pending.iter().any(|span| span.drafts > 0) {
            // How many tokens its step returns is known only from its answer.
            return 0;
        }
        let expected = self.pending_samples();
        let generated = self.tokens.len() - self.prompt_len;
        if expected > 0 && generated + expected >= self.stopping.max_new_tokens as usize {
            return 0;
        }
        self.tokens.len() + expected - self.num_computed
    }

    fn pending_samples(&self) -> usize {
        self.pending.iter().filter(|span| span.samples).count()
    }

    /// The next chunk's `wanted` tokens, cut so that it never ends strictly inside an image's
    /// span: a span's positions may attend to each other both ways (Gemma 3), so the shards
    /// compute all of a span not yet computed in one chunk. A chunk that would end inside a
    /// span beginning after it ends where that span begins; one that begins at or inside a span
    /// reaches the span's end if the step has `room` for it, else it takes nothing (`None`).
    pub fn chunk_within_images(&self, wanted: usize, room: usize) -> Option<usize> {
        let start = self.num_computed;
        let end = start + wanted;
        let Some(image) = self
            .images
            .iter()
            .find(|image| image.offset < end && end < image.offset + image.num_tokens)
        else {
            return Some(wanted);
        };
        if image.offset > start {
            return Some(image.offset - start);
        }
        let rest = image.offset + image.num_tokens - start;
        (rest <= room).then_some(rest)
    }

    /// Tokens whose K/V the shards hold once every step answered so far has run.
    pub fn computed_on_shards(&self) -> usize {
        self.pending
            .front()
            .map_or(self.num_computed, |span| span.computed_before)
    }

    /// Whether it decodes with drafts now: it has no prompt logprobs and no pause. The shards
    /// build a drafted position's grammar mask and penalty statistics as if the drafts before it
    /// were the request's tokens. Such a request waits for its token in flight instead of being
    /// scheduled behind it, so its next step can draft.
    pub fn drafts_now(&self) -> bool {
        let generated = self.tokens.len() - self.prompt_len;
        !self.logprobs.prompt_logprobs && generated > 0 && self.draft_pause == 0
    }

    /// How many drafts its next step may carry: none unless it drafts now and its last token is
    /// known; never past its last allowed token.
    pub fn draft_room(&self) -> usize {
        if !self.drafts_now() || !self.pending.is_empty() || self.remaining() != 1 {
            return 0;
        }
        let generated = self.tokens.len() - self.prompt_len;
        (self.stopping.max_new_tokens as usize).saturating_sub(generated + 1)
    }

    /// Counts drafts the shards kept: their keys and values are the request's own now.
    pub fn keep_drafts(&mut self, kept: usize) {
        self.num_computed += kept;
    }

    /// How many of the next `num_tokens` positions its tenant has not paid for yet; from now
    /// on they count as paid.
    pub fn take_unpaid(&mut self, num_tokens: usize) -> usize {
        let end = self.num_computed + num_tokens;
        let unpaid = end.saturating_sub(self.paid_through.max(self.num_computed));
        self.paid_through = self.paid_through.max(end);
        unpaid
    }

    /// Sends the next `num_tokens` tokens in step `step_id`, followed by `drafts`, with the
    /// blocks added for them.
    pub fn schedule(
        &mut self,
        step_id: u64,
        num_tokens: usize,
        new_block_ids: Vec<u32>,
        drafts: Option<Drafts>,
    ) -> ScheduledSpan {
        let end = self.num_computed + num_tokens;
        let samples = end == self.tokens.len() + self.pending_samples();
        let drafted_by = drafts.as_ref().map(Drafts::method);
        let num_drafts = drafts.as_ref().map_or(0, Drafts::count);
        let (draft_token_ids, num_model_drafts) = match drafts {
            Some(Drafts::Tokens { tokens, .. }) => (tokens, 0),
            Some(Drafts::FromModel(count)) => (Vec::new(), count),
            None => (Vec::new(), 0),
        };
        let scheduled = ScheduledSpan {
            id: self.id,
            num_tokens,
            new_block_ids,
            num_computed_tokens: self.num_computed,
            draft_token_ids,
            num_model_drafts,
            restore_state_checkpoint: None,
            save_state_checkpoint: None,
        };
        self.pending.push_back(PendingSpan {
            step_id,
            computed_before: self.num_computed,
            samples,
            drafts: num_drafts,
            drafted_by,
        });
        self.num_computed = end;
        scheduled
    }

    /// The span step `step_id` answers for, if this request had one in it.
    pub fn take_answered(&mut self, step_id: u64) -> Option<PendingSpan> {
        if self.pending.front()?.step_id != step_id {
            return None;
        }
        self.pending.pop_front()
    }

    /// Whether step `step_id` holds this request's oldest span still unanswered.
    pub fn awaits(&self, step_id: u64) -> bool {
        self.pending
            .front()
            .is_some_and(|span| span.step_id == step_id)
    }

    /// Blocks to add so the table covers `num_tokens` tokens.
    pub fn blocks_missing_for(&self, num_tokens: usize, block_size: usize) -> usize {
        num_tokens
            .div_ceil(block_size)
            .saturating_sub(self.blocks.len())
    }

    /// True once the client stopped listening (disconnect, stop string): the request is dead.
    pub fn is_cancelled(&self) -> bool {
        self.events.is_closed()
    }

    /// Frees the KV blocks so the request can later be recomputed from its tokens.
    pub fn reset_for_recompute(&mut self) {
        self.blocks.clear();
        self.num_computed = 0;
        // Answers still on their way belong to the old run; they are ignored.
        self.pending.clear();
        self.known_to_shards = false;
        self.prompt_published = false;
    }

    /// Tells the receiver something; a closed receiver is noticed at the next step.
    pub fn notify(&self, event: GenerationEvent) {
        // A send error means the client is gone, which `is_cancelled` reports next step.
        let _ = self.events.send(event);
    }

    /// The shard's copy of this request: its tokens so far and how many were generated.
    pub fn new_request(&self) -> NewRequest {
        NewRequest {
            id: self.id,
            token_ids: self.tokens.clone(),
            num_output_tokens: self.tokens.len() - self.prompt_len,
            sampling: self.sampling.clone(),
            stopping: self.stopping.clone(),
            logprobs: self.logprobs,
            grammar: self.grammar.clone(),
            lora_adapter: self.blocks.adapter().map(|adapter| adapter.name.clone()),
            images: self.images.clone(),
        }
    }
}
