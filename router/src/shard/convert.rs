//! The contract's messages (`Info`, `Warmup`, `Step`) to and from the router's own types, so
//! the generated `pb` types stop at the shard module.

use super::sampling::{Grammar, SamplingParams};
use super::step::{NewRequest, ScheduledSpan, Step};
use super::step_answer::{
    Compilation, FailedRequest, FinishReason, GeneratedToken, Generation, PromptLogprobs,
    PromptLogprobsChunk, RequestFailure, RequestFailureKind, ShardTimings, StepAnswer,
    TokenLogprob,
};
use crate::images::PromptImage;
use crate::kv::{KvTransfer, Medium, OffloadSlots};
use crate::pb;

/// What the shards report about the model they serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    pub architecture: String,
    pub dtype: String,
    pub device: String,
    pub attention_backend: String,
    /// How the GEMM weights are stored, by role; empty when the shard did not say.
    pub weights_format: String,
    /// Bytes one rank's weights take; 0 when the shard did not say.
    pub weight_bytes: u64,
    /// Rows of the model's embedding; 0 when the shard did not say.
    pub vocab_size: usize,
    /// Positions the model holds; 0 when the shard did not say.
    pub max_position_embeddings: usize,
    pub eos_token_ids: Vec<u32>,
    /// The shards' draft model (`<architecture>, <N> layers`); `None` when they run none.
    pub draft_model: Option<String>,
    /// The model keeps a recurrent state per sequence beside its KV cache (a hybrid).
    pub recurrent_state: bool,
    /// The LoRA adapters the shards hold, in the order they loaded them.
    pub lora_adapters: Vec<LoraAdapterInfo>,
    /// Most distinct adapters one step may carry (0: the shards serve no adapters).
    pub max_loras: usize,
    /// Highest adapter rank the shards accept.
    pub max_lora_rank: usize,
    /// The vision encoder the shards run on images; `None`: the model takes text only.
    pub vision_encoder: Option<String>,
}

/// One LoRA adapter as the shards describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraAdapterInfo {
    pub name: String,
    pub rank: usize,
    /// The base model's projections it changes (`q_proj`, ..., `down_proj`), sorted.
    pub target_modules: Vec<String>,
}

impl LoraAdapterInfo {
    /// An adapter known only by name (a shard that described nothing more).
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            rank: 0,
            target_modules: Vec::new(),
        }
    }
}

impl From<pb::LoraAdapter> for LoraAdapterInfo {
    fn from(adapter: pb::LoraAdapter) -> Self {
        Self {
            name: adapter.name,
            rank: adapter.rank as usize,
            target_modules: adapter.target_modules,
        }
    }
}

impl From<pb::InfoResponse> for ModelInfo {
    fn from(info: pb::InfoResponse) -> Self {
        Self {
            architecture: info.architecture,
            dtype: info.dtype,
            device: info.device,
            attention_backend: info.attention_backend,
            weights_format: info.weights_format,
            weight_bytes: info.weight_bytes,
            vocab_size: usize::try_from(info.vocab_size).unwrap_or(usize::MAX),
            max_position_embeddings: usize::try_from(info.max_position_embeddings)
                .unwrap_or(usize::MAX),
            eos_token_ids: info.eos_token_ids,
            draft_model: (!info.draft_model.is_empty()).then_some(info.draft_model),
            recurrent_state: info.recurrent_state,
            lora_adapters: info.lora_adapters.into_iter().map(Into::into).collect(),
            max_loras: info.max_loras as usize,
            max_lora_rank: info.max_lora_rank as usize,
            vision_encoder: (!info.vision_encoder.is_empty()).then_some(info.vision_encoder),
        }
    }
}

/// How the shards size their KV cache; sent at start-up and again after every restart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WarmupPlan {
    pub block_size: usize,
    /// Tokens one step may hold (the profiling run's size).
    pub max_batch_tokens: usize,
    /// Requests one step may hold.
    pub max_batch_requests: usize,
    /// Drafts one request may carry in a step (`--speculate`); 0: none.
    pub max_drafts: usize,
    /// Steps carry drafts only while at most this many requests run.
    pub max_drafting_requests: usize,
    /// A model with recurrent state: the most state checkpoints the router may use.
    pub max_state_checkpoints: usize,
}

impl From<WarmupPlan> for pb::WarmupRequest {
    /// Sizes beyond the contract's `u32` saturate.
    fn from(plan: WarmupPlan) -> Self {
        let to_u32 = |value: usize| u32::try_from(value).unwrap_or(u32::MAX);
        Self {
            block_size: to_u32(plan.block_size),
            max_batch_tokens: to_u32(plan.max_batch_tokens),
            max_batch_requests: to_u32(plan.max_batch_requests),
            max_drafts: to_u32(plan.max_drafts),
            max_drafting_requests: to_u32(plan.max_drafting_requests),
            max_state_checkpoints: to_u32(plan.max_state_checkpoints),
        }
    }
}

/// The KV cache the shards allocated (the smallest rank's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvCacheSize {
    pub num_blocks: usize,
    pub bytes: u64,
    /// A model with recurrent state: the state checkpoints the shards keep (0 otherwise).
    pub state_checkpoints: usize,
    pub state_checkpoint_bytes: u64,
    /// The offload tiers' slots (zeros: off) and the bytes each slot holds on one rank.
    pub offload: OffloadSlots,
    pub offload_block_bytes: u64,
}

impl From<pb::WarmupResponse> for KvCacheSize {
    fn from(answer: pb::WarmupResponse) -> Self {
        Self {
            num_blocks: usize::try_from(answer.num_blocks).unwrap_or(usize::MAX),
            bytes: answer.kv_cache_bytes,
            state_checkpoints: usize::try_from(answer.num_state_checkpoints).unwrap_or(usize::MAX),
            state_checkpoint_bytes: answer.state_checkpoint_bytes,
            offload: OffloadSlots {
                host: usize::try_from(answer.num_host_offload_slots).unwrap_or(usize::MAX),
                disk: usize::try_from(answer.num_disk_offload_slots).unwrap_or(usize::MAX),
            },
            offload_block_bytes: answer.offload_block_bytes,
        }
    }
}

impl KvCacheSize {
    /// Bytes one token takes in one rank's cache, all layers together: the rank allocates
    /// `num_blocks` blocks of `block_size` tokens plus the one it keeps for health checks.
    pub fn bytes_per_token(&self, block_size: usize) -> u64 {
        let tokens = (self.num_blocks as u64 + 1) * block_size as u64;
        self.bytes.checked_div(tokens).unwrap_or(0)
    }
}

/// Counts beyond the contract's `u32` saturate.
fn saturating_u32(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

impl From<Step> for pb::StepRequest {
    fn from(step: Step) -> Self {
        Self {
            step_id: step.step_id,
            new_requests: step.new_requests.into_iter().map(Into::into).collect(),
            scheduled: step.scheduled.into_iter().map(Into::into).collect(),
            finished: step.finished,
            kv_transfers: step.kv_transfers.into_iter().map(kv_transfer).collect(),
        }
    }
}

fn kv_transfer(transfer: KvTransfer) -> pb::KvTransfer {
    pb::KvTransfer {
        source: kv_medium(transfer.source).into(),
        source_index: transfer.source_index,
        target: kv_medium(transfer.target).into(),
        target_index: transfer.target_index,
    }
}

fn kv_medium(medium: Medium) -> pb::KvMedium {
    match medium {
        Medium::Device => pb::KvMedium::Device,
        Medium::Host => pb::KvMedium::Host,
        Medium::Disk => pb::KvMedium::Disk,
    }
}

impl From<NewRequest> for pb::NewRequest {
    fn from(request: NewRequest) -> Self {
        Self {
            id: request.id,
            token_ids: request.token_ids,
            num_output_tokens: saturating_u32(request.num_output_tokens),
            sampling: Some(sampling_parameters(&request.sampling)),
            stopping: Some(pb::StoppingCriteria {
                max_new_tokens: request.stopping.max_new_tokens,
                min_new_tokens: request.stopping.min_new_tokens,
                stop_token_ids: request.stopping.stop_token_ids,
            }),
            top_logprobs: request.logprobs.top_logprobs,
            prompt_logprobs: request.logprobs.prompt_logprobs,
            grammar: request.grammar.map(grammar_message),
            lora_adapter: request
                .lora_adapter
                .map_or_else(String::new, |name| name.to_string()),
            images: request.images.into_iter().map(image_input).collect(),
        }
    }
}

fn image_input(image: PromptImage) -> pb::ImageInput {
    pb::ImageInput {
        data: image.data,
        digest: image.digest.to_vec(),
        offset: saturating_u32(image.offset),
        num_tokens: saturating_u32(image.num_tokens),
    }
}

impl From<ScheduledSpan> for pb::ScheduledRequest {
    fn from(span: ScheduledSpan) -> Self {
        Self {
            id: span.id,
            num_tokens: saturating_u32(span.num_tokens),
            new_block_ids: span.new_block_ids,
            num_computed_tokens: saturating_u32(span.num_computed_tokens),
            draft_token_ids: span.draft_token_ids,
            num_model_drafts: saturating_u32(span.num_model_drafts),
            restore_state_checkpoint: span.restore_state_checkpoint,
            save_state_checkpoint: span.save_state_checkpoint,
        }
    }
}

fn grammar_message(grammar: Grammar) -> pb::Grammar {
    let kind = match grammar {
        Grammar::JsonSchema(schema) => pb::grammar::Kind::JsonSchema(schema),
        Grammar::Regex(regex) => pb::grammar::Kind::Regex(regex),
        Grammar::Lark(lark) => pb::grammar::Kind::Lark(lark),
    };
    pb::Grammar { kind: Some(kind) }
}

/// The contract's form: every neutral value becomes the zero that means "disabled".
fn sampling_parameters(sampling: &SamplingParams) -> pb::SamplingParameters {
    let zero_if_one = |value: f32| if value == 1.0 { 0.0 } else { value };
    pb::SamplingParameters {
        temperature: sampling.temperature,
        top_k: sampling.top_k,
        top_p: zero_if_one(sampling.top_p),
        seed: sampling.seed,
        min_p: sampling.min_p,
        typical_p: zero_if_one(sampling.typical_p),
        repetition_penalty: zero_if_one(sampling.repetition_penalty),
        frequency_penalty: sampling.frequency_penalty,
        presence_penalty: sampling.presence_penalty,
        logit_bias: sampling.logit_bias.iter().copied().collect(),
    }
}

impl From<pb::StepResponse> for StepAnswer {
    fn from(response: pb::StepResponse) -> Self {
        Self {
            generations: response.generations.into_iter().map(generation).collect(),
            prompt_logprobs: response
                .prompt_logprobs
                .into_iter()
                .map(|chunk| PromptLogprobsChunk {
                    id: chunk.id,
                    logprobs: prompt_logprobs(chunk),
                })
                .collect(),
            failures: response
                .failures
                .into_iter()
                .map(|failure| FailedRequest {
                    id: failure.id,
                    failure: request_failure(failure),
                })
                .collect(),
            timings: ShardTimings {
                prepare_ms: response.prepare_ms,
                forward_ms: response.forward_ms,
                sampling_ms: response.sampling_ms,
                total_ms: response.shard_total_ms,
                forward_gap_ms: response.forward_gap_ms,
            },
            compilation: response
                .compilation
                .map(|compilation| Compilation {
                    decode_rows: compilation.decode_rows,
                    compiling: compilation.compiling,
                })
                .unwrap_or_default(),
            failed_kv_transfers: response
                .failed_kv_transfers
                .into_iter()
                .filter_map(|position| usize::try_from(position).ok())
                .collect(),
        }
    }
}

fn generation(generation: pb::Generation) -> Generation {
    Generation {
        id: generation.id,
        token: GeneratedToken {
            id: generation.token_id,
            logprob: generation.logprob,
            top_logprobs: token_logprobs(generation.top_logprobs),
            finish: finish_reason(generation.finish_reason),
        },
    }
}

fn token_logprobs(tokens: Vec<pb::TokenLogprob>) -> Vec<TokenLogprob> {
    tokens
        .into_iter()
        .map(|t| TokenLogprob {
            id: t.token_id,
            logprob: t.logprob,
        })
        .collect()
}

fn prompt_logprobs(chunk: pb::PromptLogprobs) -> PromptLogprobs {
    PromptLogprobs {
        first_position: chunk.first_position as usize,
        logprobs: chunk.logprobs,
        top: chunk
            .top
            .into_iter()
            .map(|t| token_logprobs(t.tokens))
            .collect(),
    }
}

fn finish_reason(code: i32) -> Option<FinishReason> {
    match pb::FinishReason::try_from(code) {
        Ok(pb::FinishReason::Length) => Some(FinishReason::Length),
        Ok(pb::FinishReason::Eos) => Some(FinishReason::Eos),
        Ok(pb::FinishReason::StopToken) => Some(FinishReason::StopToken),
        Ok(pb::FinishReason::Unspecified) | Err(_) => None,
    }
}

fn request_failure(failure: pb::RequestFailure) -> RequestFailure {
    let kind = match pb::FailureKind::try_from(failure.kind) {
        Ok(pb::FailureKind::TokenOutOfRange) => RequestFailureKind::TokenOutOfRange,
        Ok(pb::FailureKind::InvalidParameters) => RequestFailureKind::InvalidParameters,
        Ok(pb::FailureKind::Grammar) => RequestFailureKind::Grammar,
        Ok(pb::FailureKind::NoValidToken) => RequestFailureKind::NoValidToken,
        Ok(pb::FailureKind::AdapterUnavailable) => RequestFailureKind::AdapterUnavailable,
        Ok(pb::FailureKind::NonFiniteLogits) | Ok(pb::FailureKind::Unspecified) | Err(_) => {
            RequestFailureKind::Model
        }
    };
    RequestFailure {
        kind,
        message: failure.message,
    }
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
