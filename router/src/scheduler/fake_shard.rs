//! A fake shard for scheduler tests: it enforces the Step contract and derives each token
//! from what it reads back through the block table, so a block handed to two live
//! requests, or a wrong `num_computed_tokens`, changes the output or panics. Its draft model
//! guesses the model's tokens, wrongly at some positions.

use std::collections::{HashMap, HashSet};

use super::request::GenerationRequest;
use crate::kv::{KvTransfer, Medium};
use crate::shard::{
    FailedRequest, FinishReason, GeneratedToken, Generation, RequestFailure, RequestFailureKind,
    ScheduledSpan, Step, StepAnswer, StoppingParams,
};

pub(super) struct FakeRequest {
    tokens: Vec<u32>,
    num_computed: usize,
    /// Not yet scheduled: its first step may start after a prefix-cache hit.
    fresh: bool,
    blocks: Vec<u32>,
    generated: u32,
    max_new_tokens: u32,
    /// Its images' spans of positions, `start..end`.
    image_spans: Vec<(usize, usize)>,
}

#[derive(Default)]
pub(super) struct FakeShard {
    block_size: usize,
    /// The fake KV cache: slot -> token written there.
    slots: HashMap<usize, u32>,
    pub requests: HashMap<u64, FakeRequest>,
    pub forgotten: Vec<u64>,
    pub step_tokens: Vec<usize>,
    /// Request id -> generated-token count at which the shard fails that request alone.
    pub fail_after: HashMap<u64, u32>,
    /// Requests the fake ended itself in this step and in the step before (the contract:
    /// a request ended in the step before may be scheduled again, and is skipped).
    ended_now: HashSet<u64>,
    ended_before: HashSet<u64>,
    /// Spans skipped because their request had ended in the step before.
    pub skipped: usize,
    /// Request id -> generated-token count at which the fake ends it with EOS (a stop the
    /// router cannot foresee, unlike the length).
    pub stop_at: HashMap<u64, u32>,
    last_step_id: Option<u64>,
    /// The model every token comes from (`model` unless a test needs predictable text).
    pub model: Option<fn(&[u32]) -> u32>,
    /// What the draft model proposes after a context (`num_model_drafts`); unless set, the
    /// model's own token except at every `DRAFT_MISS_PERIOD`th position.
    pub draft_model: Option<fn(&[u32]) -> u32>,
    /// Drafts the draft model proposed, over every step.
    pub model_drafts: usize,
    /// A model with recurrent state: a request resuming after a cached prefix must restore a
    /// checkpoint holding exactly that prefix.
    pub keeps_state: bool,
    /// State checkpoint -> the tokens whose state it holds.
    checkpoints: HashMap<u32, Vec<u32>>,
    /// Checkpoints restored, over every step.
    pub restores: usize,
    /// The offload tiers: (medium, slot) -> a block's slot contents, by offset.
    tiers: HashMap<(Medium, u32), Vec<Option<u32>>>,
    /// Disk slots whose next read fails its checksum (a torn entry).
    pub torn_disk_slots: HashSet<u32>,
    /// Blocks copied from each medium into another, over every step.
    pub transfers: HashMap<(Medium, Medium), usize>,
}

/// The default draft model guesses wrong where the context's length is a multiple of this.
const DRAFT_MISS_PERIOD: usize = 5;

impl FakeShard {
    pub fn new(block_size: usize) -> Self {
        Self {
            block_size,
            ..Self::default()
        }
    }

    fn slot(&self, request: &FakeRequest, position: usize) -> usize {
        let block = request.blocks[position / self.block_size] as usize;
        block * self.block_size + position % self.block_size
    }

    /// The "model" applied to every token read back from the KV cache.
    fn next_token(&self, request: &FakeRequest) -> u32 {
        let cached: Vec<u32> = (0..request.tokens.len())
            .map(|position| self.slots[&self.slot(request, position)])
            .collect();
        self.model.unwrap_or(model)(&cached)
    }

    /// The draft tokens `scheduled` runs after `request`'s last token: listed, or proposed by
    /// the draft model, never both.
    fn drafts(&mut self, scheduled: &ScheduledSpan, request: &FakeRequest) -> Vec<u32> {
        let count = scheduled.num_model_drafts;
        if count == 0 {
            return scheduled.draft_token_ids.clone();
        }
        assert!(
            scheduled.draft_token_ids.is_empty(),
            "model drafts and listed drafts in one span"
        );
        self.model_drafts += count;
        let target = self.model.unwrap_or(model);
        let mut context = request.tokens.clone();
        for _ in 0..count {
            let guess = match self.draft_model {
                Some(draft_model) => draft_model(&context),
                None if context.len().is_multiple_of(DRAFT_MISS_PERIOD) => target(&context) + 1000,
                None => target(&context),
            };
            context.push(guess);
        }
        context.split_off(request.tokens.len())
    }

    /// Panics if two live requests share a block unless it is a full block both computed
    /// with the same tokens (a shared prefix).
    pub fn assert_shared_blocks_agree(&self) {
        let mut contents: HashMap<u32, &[u32]> = HashMap::new();
        for (id, request) in &self.requests {
            for (index, block) in request.blocks.iter().enumerate() {
                let start = index * self.block_size;
                let end = (start + self.block_size).min(request.num_computed);
                let tokens = &request.tokens[start.min(end)..end];
                if let Some(other) = contents.insert(*block, tokens) {
                    assert!(
                        tokens.len() == self.block_size && other == tokens,
                        "block {block} of request {id} is shared with different contents"
                    );
                }
            }
        }
    }

    /// Runs `transfers` in order; answers the positions of the disk reads that failed.
    fn run_transfers(&mut self, transfers: &[KvTransfer]) -> Vec<usize> {
        let mut failed = Vec::new();
        for (position, transfer) in transfers.iter().enumerate() {
            *self
                .transfers
                .entry((transfer.source, transfer.target))
                .or_default() += 1;
            let contents = match transfer.source {
                Medium::Device => {
                    let first = transfer.source_index as usize * self.block_size;
                    (first..first + self.block_size)
                        .map(|slot| self.slots.get(&slot).copied())
                        .collect()
                }
                Medium::Disk if self.torn_disk_slots.remove(&transfer.source_index) => {
                    failed.push(position);
                    continue;
                }
                medium => self
                    .tiers
                    .get(&(medium, transfer.source_index))
                    .cloned()
                    .expect("a transfer reads a slot something was written to"),
            };
            match transfer.target {
                Medium::Device => {
                    let first = transfer.target_index as usize * self.block_size;
                    for (offset, token) in contents.into_iter().enumerate() {
                        match token {
                            Some(token) => self.slots.insert(first + offset, token),
                            None => self.slots.remove(&(first + offset)),
                        };
                    }
                }
                medium => {
                    self.tiers.insert((medium, transfer.target_index), contents);
                }
            }
        }
        failed
    }

    pub fn step(&mut self, step: Step) -> StepAnswer {
        if let Some(last) = self.last_step_id {
            assert_eq!(step.step_id, last + 1, "steps must run in id order");
        }
        self.last_step_id = Some(step.step_id);
        self.ended_before = std::mem::take(&mut self.ended_now);
        let failed_kv_transfers = self.run_transfers(&step.kv_transfers);
        for id in &step.finished {
            self.requests.remove(id);
            self.forgotten.push(*id);
        }
        for new in step.new_requests {
            let previous = self.requests.insert(
                new.id,
                FakeRequest {
                    tokens: new.token_ids,
                    num_computed: 0,
                    fresh: true,
                    blocks: Vec::new(),
                    generated: u32::try_from(new.num_output_tokens).unwrap(),
                    max_new_tokens: new.stopping.max_new_tokens,
                    image_spans: new
                        .images
                        .iter()
                        .map(|image| (image.offset, image.offset + image.num_tokens))
                        .collect(),
                },
            );
            assert!(previous.is_none(), "request {} registered twice", new.id);
        }
        self.step_tokens
            .push(step.scheduled.iter().map(|s| s.num_tokens).sum());
        let mut response = StepAnswer {
            failed_kv_transfers,
            ..StepAnswer::default()
        };
        // A step's restores read the checkpoints as they stood before its saves.
        let mut saves = Vec::new();
        for scheduled in step.scheduled {
            if let (Some(checkpoint), Some(request)) = (
                scheduled.save_state_checkpoint,
                self.requests.get(&scheduled.id),
            ) {
                let end = scheduled.num_computed_tokens + scheduled.num_tokens;
                saves.push((checkpoint, request.tokens[..end].to_vec()));
            }
            if let Some(request) = self.requests.get(&scheduled.id) {
                assert_no_split_image(&scheduled, request);
            }
            match self.run(&scheduled) {
                Some(Ok(generations)) => response.generations.extend(generations),
                Some(Err(failure)) => response.failures.push(failure),
                None => {}
            }
        }
        self.checkpoints.extend(saves);
        response
    }

    /// A model with recurrent state resumes a new request after a cached prefix only from a
    /// checkpoint holding that very prefix.
    fn restore_state(&mut self, scheduled: &ScheduledSpan, request: &FakeRequest) {
        let resumed = &request.tokens[..scheduled.num_computed_tokens];
        match scheduled.restore_state_checkpoint {
            Some(checkpoint) => {
                assert!(
                    self.keeps_state,
                    "a checkpoint restored without recurrent state"
                );
                assert_eq!(
                    self.checkpoints.get(&checkpoint).map(Vec::as_slice),
                    Some(resumed),
                    "request {} restores checkpoint {checkpoint}, which holds another prefix",
                    scheduled.id
                );
                self.restores += 1;
            }
            None => assert!(
                !self.keeps_state || resumed.is_empty(),
                "request {} resumes after {} tokens without their state",
                scheduled.id,
                resumed.len()
            ),
        }
    }

    fn run(&mut self, scheduled: &ScheduledSpan) -> Option<Result<Vec<Generation>, FailedRequest>> {
        let Some(mut request) = self.requests.remove(&scheduled.id) else {
            assert!(
                self.ended_before.contains(&scheduled.id),
                "scheduled an unknown request"
            );
            self.skipped += 1;
            return None;
        };
        request.blocks.extend(&scheduled.new_block_ids);
        if std::mem::take(&mut request.fresh) {
            // A prefix-cache hit: those tokens must already sit in the given blocks, which the
            // model's read-back checks.
            request.num_computed = scheduled.num_computed_tokens;
            self.restore_state(scheduled, &request);
        }
        assert_eq!(request.num_computed, scheduled.num_computed_tokens);
        let end = request.num_computed + scheduled.num_tokens;
        assert!(end <= request.tokens.len(), "scheduled past the end");
        let drafts = &self.drafts(scheduled, &request);
        assert!(
            request.blocks.len() * self.block_size >= end + drafts.len(),
            "blocks do not cover the step"
        );
        assert!(
            drafts.is_empty() || end == request.tokens.len(),
            "drafts must follow the request's last token"
        );
        for position in request.num_computed..end {
            let slot = self.slot(&request, position);
            self.slots.insert(slot, request.tokens[position]);
        }
        request.num_computed = end;
        if end < request.tokens.len() {
            self.requests.insert(scheduled.id, request);
            return None;
        }
        if self.fail_after.get(&scheduled.id) == Some(&request.generated) {
            // The shard forgets a request it failed, as it does one it finished.
            self.ended_now.insert(scheduled.id);
            return Some(Err(FailedRequest {
                id: scheduled.id,
                failure: RequestFailure {
                    kind: RequestFailureKind::NoValidToken,
                    message: "no token left".into(),
                },
            }));
        }
        let mut generations = Vec::new();
        for offset in 0..=drafts.len() {
            let token = self.next_token(&request);
            // A draft runs at its position: its slot holds it whether or not it is kept.
            if let Some(&draft) = drafts.get(offset) {
                let slot = self.slot(&request, request.tokens.len());
                self.slots.insert(slot, draft);
            }
            let (generation, alive) = self.generate(scheduled.id, &mut request, token);
            generations.push(generation);
            if !alive {
                self.ended_now.insert(scheduled.id);
                return Some(Ok(generations));
            }
            if drafts.get(offset) != Some(&token) {
                break;
            }
            request.num_computed += 1;
        }
        self.requests.insert(scheduled.id, request);
        Some(Ok(generations))
    }

    /// Appends `token`; false when it ends the request.
    fn generate(&self, id: u64, request: &mut FakeRequest, token: u32) -> (Generation, bool) {
        request.tokens.push(token);
        request.generated += 1;
        let stopped = self.stop_at.get(&id) == Some(&request.generated);
        let finish = if stopped {
            Some(FinishReason::Eos)
        } else if request.generated >= request.max_new_tokens {
            Some(FinishReason::Length)
        } else {
            None
        };
        let generation = Generation {
            id,
            token: GeneratedToken {
                id: token,
                logprob: 0.0,
                top_logprobs: Vec::new(),
                finish,
            },
        };
        (generation, finish.is_none())
    }
}

/// The fake model: a hash of the whole sequence.
/// A span's positions attend to each other both ways, so no chunk ends strictly inside one.
fn assert_no_split_image(scheduled: &ScheduledSpan, request: &FakeRequest) {
    let end = scheduled.num_computed_tokens + scheduled.num_tokens;
    if let Some((start, stop)) = request
        .image_spans
        .iter()
        .find(|&&(start, stop)| start < end && end < stop)
    {
        panic!(
            "request {}'s chunk ends at {end}, inside its image span {start}..{stop}",
            scheduled.id
        );
    }
}

pub(super) fn model(tokens: &[u32]) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &token in tokens {
        hash = (hash ^ u64::from(token)).wrapping_mul(0x0100_0000_01b3);
    }
    u32::try_from(hash % 1000).unwrap() + 1
}

/// What the fake model generates for `prompt` alone.
pub(super) fn expected_output(prompt: &[u32], max_new_tokens: u32) -> Vec<u32> {
    let mut tokens = prompt.to_vec();
    for _ in 0..max_new_tokens {
        tokens.push(model(&tokens));
    }
    tokens.split_off(prompt.len())
}

/// A six-token prompt that generates `max_new_tokens` tokens.
pub(super) fn request(max_new_tokens: u32) -> GenerationRequest {
    GenerationRequest {
        input_ids: vec![3, 1, 4, 1, 5, 9],
        stopping: StoppingParams {
            max_new_tokens,
            ..StoppingParams::default()
        },
        ..GenerationRequest::default()
    }
}
