//! Every component's configuration, derived here and only here from the one checked
//! `RouterConfig`: the validator's limits, the scheduler's budget, the handlers'
//! configuration and `/info`'s body.

use std::time::{SystemTime, UNIX_EPOCH};

use super::{RouterConfig, TEXT_PAYLOAD_LIMIT};
use crate::http::{HandlerConfig, ServerInfo, VALIDATION_WORKERS};
use crate::scheduler::{CheckpointPlan, SchedulerConfig};
use crate::shard::KvCacheSize;
use crate::tools::ToolFormat;
use crate::validation::{self, SamplingDefaults};

/// The served model as the shards describe it, for `/info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedModel {
    pub architecture: String,
    pub dtype: String,
    pub device: String,
    pub weights_format: String,
    pub weight_bytes: u64,
    /// The shards' draft model (`<architecture>, <N> layers`); `None` when they run none.
    pub draft_model: Option<String>,
    /// The model keeps a recurrent state per sequence beside its KV cache (a hybrid).
    pub recurrent_state: bool,
    pub num_shards: usize,
}

impl RouterConfig {
    /// A model with recurrent state (a hybrid) resumes a prompt after a cached prefix only from
    /// a state checkpoint: prefix reuse is off for such a model when the shards keep none
    /// (`state_checkpoints`); true when this turned it off.
    pub fn fit_prefix_reuse_to_model(
        &mut self,
        recurrent_state: bool,
        state_checkpoints: usize,
    ) -> bool {
        let turned_off = recurrent_state && state_checkpoints == 0 && self.limits.prefix_caching;
        if turned_off {
            self.limits.prefix_caching = false;
        }
        turned_off
    }

    /// A model that reads images takes request bodies big enough for one base64 image of
    /// `--max-image-bytes` beside the text's 2,000,000 bytes, unless `--payload-limit` was
    /// given; the raised limit when it was raised.
    pub fn fit_payload_limit_to_images(&mut self, reads_images: bool) -> Option<usize> {
        if !reads_images || self.api.payload_limit_is_explicit {
            return None;
        }
        let base64_image = self.request_limits.images.max_image_bytes.div_ceil(3) * 4;
        self.api.payload_limit = TEXT_PAYLOAD_LIMIT.saturating_add(base64_image);
        Some(self.api.payload_limit)
    }

    /// The token bounds every request must respect.
    pub fn validation_limits(&self) -> validation::Limits {
        validation::Limits {
            max_input_tokens: self.limits.max_input_tokens,
            max_total_tokens: self.limits.max_total_tokens,
            max_stop_sequences: self.api.max_stop_sequences,
        }
    }

    /// The scheduler's budget over the shards' `kv_cache`, running requests selecting at most
    /// `max_loras` LoRA adapters at once.
    pub fn scheduler_config(&self, kv_cache: &KvCacheSize, max_loras: usize) -> SchedulerConfig {
        let state_checkpoints = (self.limits.prefix_caching && kv_cache.state_checkpoints > 0)
            .then_some(CheckpointPlan {
                count: kv_cache.state_checkpoints,
                interval: self.limits.state_checkpoint_interval,
            });
        SchedulerConfig {
            block_size: self.limits.block_size,
            num_blocks: kv_cache.num_blocks,
            max_batch_tokens: self.limits.max_batch_prefill_tokens,
            max_batch_requests: self.limits.max_batch_size,
            prefix_caching: self.limits.prefix_caching,
            steps_in_flight: if self.limits.async_scheduling { 2 } else { 1 },
            max_drafts: self.limits.speculate,
            draft_method: self.limits.speculative_method,
            max_drafting_batch: self.limits.speculative_disable_by_batch_size,
            state_checkpoints,
            max_loras,
            policy: self.limits.scheduling_policy,
            offload: kv_cache.offload,
        }
    }

    /// What the handlers enforce and apply; OpenAI requests sample with `default_sampling`
    /// where they set nothing, and tool calls are in `tool_format`.
    pub fn handler_config(
        &self,
        default_sampling: SamplingDefaults,
        tool_format: ToolFormat,
    ) -> HandlerConfig {
        HandlerConfig {
            model_id: self.model_id.clone(),
            max_concurrent_requests: self.limits.max_concurrent_requests,
            max_queued_tokens: self.limits.max_queued_tokens,
            max_top_n_tokens: self.api.max_top_n_tokens,
            max_best_of: self.api.max_best_of,
            max_client_batch_size: self.api.max_client_batch_size,
            payload_limit: self.api.payload_limit,
            always_include_usage: self.api.always_include_usage,
            request_limits: self.request_limits,
            default_sampling,
            started_at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_secs()),
            tool_format,
            runtime_lora_updates: self.api.runtime_lora_updates,
        }
    }

    /// `/info`'s body: `model` served with the shards' `kv_cache`, and the limits.
    pub fn server_info(
        &self,
        model: ServedModel,
        kv_cache: KvCacheSize,
        default_sampling: SamplingDefaults,
    ) -> ServerInfo {
        let limits = &self.limits;
        ServerInfo {
            model_id: self.model_id.clone(),
            model_dtype: model.dtype,
            model_device_type: model.device,
            model_architecture: model.architecture,
            model_weights_format: model.weights_format,
            model_weight_bytes: model.weight_bytes,
            model_recurrent_state: model.recurrent_state,
            num_shard: model.num_shards,
            max_concurrent_requests: limits.max_concurrent_requests,
            max_queued_tokens: limits.max_queued_tokens,
            max_input_tokens: limits.max_input_tokens,
            max_total_tokens: limits.max_total_tokens,
            max_batch_prefill_tokens: limits.max_batch_prefill_tokens,
            max_batch_size: limits.max_batch_size,
            max_stop_sequences: self.api.max_stop_sequences,
            max_top_n_tokens: self.api.max_top_n_tokens,
            max_best_of: self.api.max_best_of,
            max_client_batch_size: self.api.max_client_batch_size,
            payload_limit: self.api.payload_limit,
            always_include_usage: self.api.always_include_usage,
            request_limits: self.request_limits,
            connections: self.connections,
            default_sampling,
            validation_workers: VALIDATION_WORKERS,
            block_size: limits.block_size,
            prefix_caching: limits.prefix_caching,
            speculate: limits.speculate,
            speculative_method: limits.speculative_method.label(),
            speculative_model: model.draft_model,
            kv_cache_blocks: kv_cache.num_blocks,
            kv_cache_tokens: kv_cache.num_blocks * limits.block_size,
            kv_cache_bytes_per_token: kv_cache.bytes_per_token(limits.block_size),
            state_checkpoints: kv_cache.state_checkpoints,
            state_checkpoint_bytes: kv_cache.state_checkpoint_bytes,
            compiled_decode_rows: None,
            compiling: None,
            router: "tandem-router",
            version: env!("CARGO_PKG_VERSION"),
        }
    }
}
